"""Exercises of chapter 02 (FlashAttention in Triton): the three pieces of bookkeeping every tile
of the kernel does, then a small Triton kernel that puts two of them together.

* 02.1 the tail mask: which columns of the last key tile exist;
* 02.2 the causal tile skip: which key tiles a query tile visits, and which of them need a mask;
* 02.3 the online-softmax rescale: one tile update of the running max, sum and output;
* 02.4 a Triton kernel: softmax over long rows, tile by tile, with the running max and sum;
* 02.5 a Triton kernel: the 40-line FlashAttention forward that also writes the log-sum-exp.

Each checker draws fresh random sizes on every call and compares with the package's own code
(:func:`minimax_lab.attention.dense_triton.tile_schedule`,
:func:`minimax_lab.attention.online_softmax.online_step`, the fp32 reference attention) or with
``torch.softmax``; an answer may not call that code. In 02.4 and 02.5 the learner's kernel must do
the work, and the inputs need the running max and sum: a row's maximum lies in a later tile, large
enough that ``exp`` overflows without subtracting it, and 02.4 has rows longer than the largest tile
Triton allows, so a kernel that takes the row in one tile cannot run.
"""
from __future__ import annotations

import math

import torch

from minimax_lab import measure, runtime
from minimax_lab.attention.dense import attention
from minimax_lab.attention.dense_triton import tile_schedule
from minimax_lab.attention.online_softmax import SoftmaxState, online_step
from minimax_lab.exercises import exercise, fresh_rng, on_kernel_device, tensor_problem


# --------------------------------------------------------------------------- 02.1 the tail mask


def tail_mask(start_n: int, block_n: int, n_keys: int) -> torch.Tensor:
    """The key tile that starts at column ``start_n`` covers the columns
    ``start_n, start_n + 1, ..., start_n + block_n - 1``, but only the columns below ``n_keys``
    exist. Return a bool tensor of shape ``(block_n,)``: True where the column exists (the kernel
    loads it and lets it into the softmax), False past the end."""
    raise NotImplementedError  # your code here (one line, like the kernel's `cols < Skv`)


@exercise("02.1", "the tail mask", "Mark which columns of a key tile exist, so the last tile of a ragged "
          "row neither reads past the end nor lets padding into the softmax.", tail_mask)
def _check_tail_mask(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    cases = []
    for _ in range(6):
        block = rng.choice([8, 16, 32, 64])
        n_keys = rng.randint(1, 5 * block)
        last = (n_keys - 1) // block * block
        cases += [(last, block, n_keys), (rng.randrange(0, last + 1, block), block, n_keys)]
    cases += [(0, 16, 16), (32, 16, 40), (48, 16, 40)]  # a full tile, a ragged tail, a tile past the end
    for start_n, block, n_keys in cases:
        got = fn(start_n, block, n_keys)
        want = torch.arange(start_n, start_n + block) < n_keys
        wrong = tensor_problem(got, f"tail_mask({start_n}, {block}, {n_keys})", (block,), torch.bool)
        if wrong:
            problems.append(wrong)
            break
        if not torch.equal(got.cpu(), want):
            problems.append(f"tail_mask({start_n}, {block}, {n_keys}): expected {int(want.sum())} True "
                            f"(columns {start_n}..{min(start_n + block, n_keys) - 1}), got {got.int().tolist()}")
            if len(problems) >= 3:
                break
    return problems


# --------------------------------------------------------------------------- 02.2 the causal tile skip


def kv_tiles(m: int, block_m: int, block_n: int, S: int, Skv: int) -> tuple[list[int], list[int]]:
    """Causal attention, aligned to the end of the keys: query row ``i`` (of ``S``) sees the keys
    ``j <= i + (Skv - S)`` (of ``Skv``). Query tile ``m`` holds the rows
    ``m*block_m .. min((m+1)*block_m, S) - 1``; key tile ``n`` the keys ``n*block_n .. (n+1)*block_n - 1``.

    Return ``(unmasked, masked)``: the indices of the key tiles the query tile must visit,
    split in two sorted lists. ``unmasked``: every row of the query tile sees every key of the
    tile, and all of its keys exist (< ``Skv``), so the kernel can skip the masking.
    ``masked``: some row sees some key of the tile, but not all rows see all of it (the diagonal,
    or the ragged last tile). Tiles no row sees are in neither list: the kernel never loads them."""
    raise NotImplementedError  # your code here


@exercise("02.2", "the causal tile skip", "List the key tiles a query tile visits: those it can run "
          "without a mask, those on the diagonal or the tail that need one; skip the rest.", kv_tiles,
          answers=(tile_schedule,))
def _check_kv_tiles(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    shapes = [(64, 64, 16, 16), (40, 40, 16, 16), (20, 50, 8, 16), (50, 20, 16, 8)]
    for _ in range(6):
        block_m, block_n = rng.choice([8, 16, 32]), rng.choice([8, 16, 32])
        S = rng.randint(1, 6 * block_m)
        shapes.append((S, rng.choice([S, rng.randint(1, 6 * block_n)]), block_m, block_n))
    for S, Skv, block_m, block_n in shapes:
        grid = tile_schedule(S, Skv, block_m, block_n, causal=True)  # the kernel's own loop bounds
        for m in range(grid.shape[0]):
            want = ([int(n) for n in (grid[m] == 1).nonzero()[0]], [int(n) for n in (grid[m] == 2).nonzero()[0]])
            got = fn(m, block_m, block_n, S, Skv)
            try:
                got = (sorted(int(n) for n in got[0]), sorted(int(n) for n in got[1]))
            except (TypeError, IndexError, ValueError):
                return [f"kv_tiles should return two lists of tile indices, got {got!r}"]
            if got != want:
                problems.append(f"kv_tiles(m={m}, block_m={block_m}, block_n={block_n}, S={S}, Skv={Skv}): "
                                f"expected unmasked {want[0]}, masked {want[1]}; got unmasked {got[0]}, masked {got[1]}")
                break
        if len(problems) >= 3:
            break
    return problems


# --------------------------------------------------------------------------- 02.3 the online-softmax rescale


def online_update(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor,  # noqa: E741 - the paper's names
                  s: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one key tile into the online-softmax state of ``R`` query rows.

    ``m [R]``: the running max of the scores seen so far (``-inf`` for a row that has seen no key);
    ``l [R]``: the running sum of ``exp(score - m)``; ``acc [R, D]``: the running sum of
    ``exp(score - m) * v``. ``s [R, N]``: this tile's scores, already scaled, ``-inf`` where masked;
    ``v [N, D]``: this tile's values. Return the new ``(m, l, acc)``; a row that has still seen
    no key keeps ``m = -inf``, ``l = 0``, ``acc = 0`` (and no NaN)."""
    raise NotImplementedError  # your code here


def _fresh_state(g: torch.Generator, R: int, D: int, n_tiles: int):
    """A state built by the package's online_step from a prefix of low scores, then a tile of high
    ones (the max grows: the past must be rescaled), with some rows masked throughout."""
    empty_rows = torch.rand(R, generator=g) < 0.2
    empty_rows[0] = True
    state = SoftmaxState.empty((R,), D)
    for t in range(n_tiles):
        N = int(torch.randint(3, 12, (1,), generator=g))
        s = torch.randn(R, N, generator=g) * 3 + 4 * t  # later tiles score higher: the max keeps growing
        s = s.masked_fill(torch.rand(R, N, generator=g) < 0.3, -math.inf)
        s[empty_rows] = -math.inf
        state = online_step(state, s, torch.randn(N, D, generator=g))
    N = int(torch.randint(3, 12, (1,), generator=g))
    s = torch.randn(R, N, generator=g) * 3 + 4 * n_tiles + 6
    s = s.masked_fill(torch.rand(R, N, generator=g) < 0.3, -math.inf)
    s[empty_rows] = -math.inf
    s[1] = -math.inf  # a row that has seen keys, and none in this tile
    return state, s, torch.randn(N, D, generator=g)


@exercise("02.3", "the online-softmax rescale", "Update the running max, sum and output for one new key "
          "tile, rescaling what was accumulated when the max grows.", online_update, answers=(online_step,))
def _check_online_update(fn) -> list[str]:
    problems = []
    seed = fresh_rng().randrange(2**31)
    for trial in range(3):
        g = torch.Generator().manual_seed(seed + trial)
        R, D = int(torch.randint(4, 10, (1,), generator=g)), int(torch.randint(2, 9, (1,), generator=g))
        state, s, v = _fresh_state(g, R, D, n_tiles=trial + 1)
        want = online_step(state, s, v)
        got = fn(state.m.clone(), state.l.clone(), state.acc.clone(), s.clone(), v.clone())
        if not (isinstance(got, (tuple, list)) and len(got) == 3 and all(isinstance(t, torch.Tensor) for t in got)):
            return [f"online_update should return three tensors (m, l, acc), got {type(got).__name__}"]
        for name, a, b in zip(("m", "l", "acc"), got, (want.m, want.l, want.acc)):
            if tuple(a.shape) != tuple(b.shape):
                problems.append(f"{name} should have shape {tuple(b.shape)}, got {tuple(a.shape)}")
            elif torch.isnan(a).any():
                rows = sorted({int(i) for i in torch.isnan(a).nonzero()[:, 0]})
                problems.append(f"{name} has NaN in rows {rows}: a row whose max is still -inf computes "
                                f"exp(-inf - (-inf)); substitute 0 for that max before subtracting")
            elif not torch.allclose(a.float(), b, rtol=1e-5, atol=1e-6):  # equal infinities are close
                err = (a.float() - b).abs().nan_to_num(nan=math.inf).max().item()
                hint = (" (after the max grows, l and acc must be multiplied by exp(m_old - m_new))"
                        if name != "m" else "")
                problems.append(f"{name} differs from the expected update by up to {err:.3g} "
                                f"(rtol 1e-5){hint}")
        if problems:
            problems.insert(0, f"trial {trial} ({R} rows, {s.shape[1]} keys in the tile, D={D}):")
            break
    return problems


# --------------------------------------------------------------------------- 02.4 a Triton kernel


def softmax_rows(x: torch.Tensor, block_n: int = 16) -> torch.Tensor:
    """Softmax over each row of ``x [R, C]`` (fp32, on ``runtime.kernel_device()``), computed by a
    ``@triton.jit`` kernel that you write above this function and launch here, one program per row.

    The row is longer than one tile: walk it ``block_n`` columns at a time (mask the ragged tail),
    carrying the running max ``m`` and the running sum ``l = sum(exp(x - m))``, rescaled by
    ``exp(m_old - m_new)`` whenever the max grows. A second walk writes ``exp(x - m) / l``.
    The values can be large (hundreds): exponentiating without subtracting the max overflows."""
    raise NotImplementedError  # your code here


#: Triton's largest tile (``TRITON_MAX_TENSOR_NUMEL``): a row longer than this cannot be one tile
MAX_TILE = 2**20


def _softmax_inputs(g: torch.Generator, rows: int, cols: int) -> torch.Tensor:
    """Rows whose maximum grows along the row; in every other row a spike of a few hundred in the
    last tile, where ``exp`` overflows fp32 (beyond ~88) unless the running max is subtracted."""
    ramp = torch.linspace(0, 1, cols) * torch.empty(rows, 1).uniform_(5, 60, generator=g)
    x = torch.randn(rows, cols, generator=g) * 3 + ramp
    for r in range(0, rows, 2):
        x[r, int(torch.randint(max(cols - 16, 0), cols, (1,), generator=g))] = float(
            torch.empty(()).uniform_(150, 400, generator=g))
    return x


def _softmax_hint(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor) -> str:
    bad = ~torch.isfinite(got)
    if bad.any():
        r = int(bad.any(1).nonzero()[0])
        return (f"row {r} holds NaN or inf (its largest value is {float(x[r].max()):.4g}): exp overflowed -- "
                f"subtract the running max before exp")
    sums = got.sum(1)
    r = int((sums - 1).abs().argmax())
    if abs(float(sums[r]) - 1) > 1e-3:
        return (f"row {r} sums to {float(sums[r]):.4g}, not 1: when the max grows from m_old to m_new, the running "
                f"sum must be rescaled, l = l * exp(m_old - m_new) + sum(exp(x - m_new))")
    r = int((got - want).abs().amax(1).argmax())
    return f"row {r} differs most (by {float((got[r] - want[r]).abs().max()):.3g})"


@exercise("02.4", "an online softmax in Triton", "Write a Triton kernel that computes a numerically safe "
          "softmax of long rows in tiles, with the running max and sum.", softmax_rows, writes_triton=True)
def _check_softmax_rows(fn) -> list[str]:
    rng = fresh_rng()
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    long_cols = MAX_TILE + rng.randint(1, 5000)
    cases = [(rng.randint(3, 8), rng.choice([rng.randint(40, 130), 16 * rng.randint(3, 6)]), 16),
             (rng.randint(3, 8), rng.randint(40, 130), rng.choice([16, 32])),
             (1, long_cols, 16384)]
    for rows, cols, block_n in cases:
        x = _softmax_inputs(g, rows, cols)
        call = f"softmax_rows(x [{rows}, {cols:,}], block_n={block_n})"
        try:
            got = fn(on_kernel_device(x), block_n)
        except Exception as e:   # noqa: BLE001 -- a tile larger than Triton allows, told in the learner's terms
            if "exceeds triton maximum tensor numel" not in str(e):
                raise
            return [f"{call}: a row of {cols:,} columns is longer than the largest tile Triton allows ({MAX_TILE:,} "
                    f"elements), so it cannot be one tile: walk it block_n = {block_n} columns at a time, carrying "
                    f"the running max and sum"]
        wrong = tensor_problem(got, call, tuple(x.shape), torch.float32)
        if wrong:
            return [wrong]
        want = torch.softmax(x.double(), dim=-1)
        got = got.detach().double().cpu()
        err = measure.relative_error(got, want)
        if not err <= 1e-4:
            return [f"{call}: differs from torch.softmax (relative error {err:.3g}, tolerance 1e-4): "
                    + _softmax_hint(got, want, x)]
    return []


# --------------------------------------------------------------------------- 02.5 FlashAttention with its lse


def flash_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention on the dense contract (``q [B, S, Hq, D]``, ``k, v [B, Skv, Hkv, D]``, fp32 on
    ``runtime.kernel_device()``, ``S <= Skv``, causal queries aligned to the end of the keys), computed
    by a ``@triton.jit`` kernel that you write above this function and launch here: start from
    section 3's ``flash_fwd_v0``. Return ``(o, lse)``: ``o`` shaped like ``q``, and ``lse [B, Hq, S]``
    (fp32), the natural log of each row's softmax denominator, ``log(sum_j exp(s_ij))`` over the keys
    ``j`` that row ``i`` sees, with ``s_ij = q_i . k_j / sqrt(D)``. The running max ``m`` and sum ``l``
    the kernel carries give it in one line. ``q`` may be a non-contiguous view; ``k`` and ``v`` share
    one layout."""
    raise NotImplementedError  # your code here


def _attention_inputs(rng, g: torch.Generator, hot: bool) -> dict:
    """Fresh ragged inputs: S and Skv not multiples of 16, GQA, sometimes S < Skv, sometimes views
    whose heads and positions are swapped in memory (``[B, H, S, D]`` storage seen as ``[B, S, H, D]``).
    ``hot``: at least 70 keys, and one key in the last third scores 150-300 with every query (a
    shared direction in q and that key): the rows that see it find their maximum in a late tile,
    and ``exp`` of such a score overflows fp32 unless the running max is subtracted. On the CPU,
    returned on the CPU (the checker moves them to the kernel device)."""
    B, D = rng.choice([1, 2]), rng.choice([16, 32])
    Hq, Hkv = rng.choice([(2, 1), (4, 2), (2, 2)])
    S = rng.randint(5, 40) | 1
    Skv = rng.choice([S, S + rng.randint(1, 25)])
    if hot:
        Skv = max(Skv, rng.randint(70, 110))
        S = min(S, Skv)
    heads_first = {"q": rng.random() < 0.5, "kv": rng.random() < 0.5}
    q = torch.randn(B, S, Hq, D, generator=g)
    k, v = torch.randn(B, Skv, Hkv, D, generator=g), torch.randn(B, Skv, Hkv, D, generator=g)
    if hot:
        u = torch.nn.functional.normalize(torch.randn(D, generator=g), dim=0)
        a = 4.0
        q += a * u
        for b in range(B):
            for h in range(Hkv):
                j = int(torch.randint(2 * Skv // 3, Skv, (1,), generator=g))
                k[b, j, h] += float(torch.empty(()).uniform_(150, 300, generator=g)) * math.sqrt(D) / a * u

    def laid_out(t, first):   # the same values, heads and positions swapped in memory
        return t.transpose(1, 2).contiguous().transpose(1, 2) if first else t
    return {"q": laid_out(q, heads_first["q"]), "k": laid_out(k, heads_first["kv"]), "v": laid_out(v, heads_first["kv"]),
            "causal": rng.random() < 0.7}


def _row_max(q, k, causal: bool) -> torch.Tensor:
    """The largest scaled score each query row sees, ``[B, Hq, S]`` (what ``m`` ends as)."""
    B, S, Hq, D = q.shape
    Skv, Hkv = k.shape[1], k.shape[2]
    kk = k.float().repeat_interleave(Hq // Hkv, dim=2)
    s = torch.einsum("bshd,bthd->bhst", q.float(), kk) / math.sqrt(D)
    if causal:
        hidden = torch.arange(Skv)[None, :] > torch.arange(S)[:, None] + (Skv - S)
        s = s.masked_fill(hidden.to(s.device), -math.inf)
    return s.amax(-1)


@exercise("02.5", "FlashAttention with its log-sum-exp", "Extend the 40-line FlashAttention kernel so that it "
          "also writes each row's log-sum-exp, which a backward pass and a split-KV merge read.", flash_with_lse,
          writes_triton=True, answers=(attention, _row_max))
def _check_flash_with_lse(fn) -> list[str]:
    rng = fresh_rng()
    # fp32 tl.dot runs on TF32 tensor cores on a GPU (10 mantissa bits); the interpreter computes in fp32
    tol = 5e-3 if runtime.kernel_device().type == "cuda" else 1e-4
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    for hot in (False, True, rng.random() < 0.5):
        inp = _attention_inputs(rng, g, hot)
        q, k, v, causal = inp["q"], inp["k"], inp["v"], inp["causal"]
        (B, S, Hq, D), Skv, Hkv = q.shape, k.shape[1], k.shape[2]
        call = (f"flash_with_lse(q [{B}, {S}, {Hq}, {D}], k/v [{B}, {Skv}, {Hkv}, {D}], causal={causal}"
                f"{', q a strided view' if not q.is_contiguous() else ''}"
                f"{', one late key scoring in the hundreds' if hot else ''})")
        got = fn(on_kernel_device(q), on_kernel_device(k), on_kernel_device(v), causal)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            return [f"{call} should return a pair (o, lse), got {type(got).__name__}"]
        o, lse = got
        want_o, want_lse = attention(q, k, v, causal=causal, impl="reference", return_lse=True)
        wrong = tensor_problem(o, f"{call}[0] (o)", tuple(q.shape)) or tensor_problem(lse, f"{call}[1] (lse)", (B, Hq, S))
        if wrong:
            return [wrong + ("" if tuple(lse.shape) == (B, Hq, S) else " (lse is [B, Hq, S]: one number per head and row)")]
        err_o = measure.relative_error(o.float().cpu(), want_o.float().cpu())
        if not err_o <= tol:
            why = ("NaN or inf: exp overflowed -- subtract the running max m before exp, and rescale l and acc by "
                   "exp(m_old - m_new) when it grows" if not torch.isfinite(o).all() else
                   "section 3's flash_fwd_v0 computes o correctly: keep its loop, the rescaling of l and acc included")
            return [f"{call}: o differs from the reference (relative error {err_o:.3g}, tolerance {tol:g}); {why}"]
        lse, want_lse = lse.float().cpu(), want_lse.float().cpu()
        if not torch.allclose(lse, want_lse, rtol=tol, atol=tol):
            m = _row_max(q, k, causal).cpu()
            if torch.allclose(lse, m, rtol=tol, atol=tol):
                hint = "that is the running max m alone: the denominator also needs log(l)"
            elif torch.allclose(lse, want_lse - m, rtol=tol, atol=tol):
                hint = "that is log(l) alone: l sums exp(s - m), so add the max m back"
            elif torch.allclose(lse * math.log(2), want_lse, rtol=tol, atol=tol):
                hint = "that is the base-2 logarithm (exp2 with log2(e) folded into the scale): multiply by ln 2"
            else:
                hint = "lse = m + log(l) after the last tile, with the scores scaled by 1/sqrt(D)"
            err = (lse - want_lse).abs().max().item()
            return [f"{call}: lse differs from the reference by up to {err:.3g}: {hint}"]
    return []
