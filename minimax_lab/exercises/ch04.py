"""Exercises of chapter 04 (sparse attention kernels): the attention over selected blocks, then the
two pieces of the KV-outer schedule around its kernel.

* 04.1 sparse attention over the selected blocks, in PyTorch: an exact softmax over their keys,
  causal inside the local block, nothing past the end of a ragged last block;
* 04.2 balanced work for KV-outer: cut each block's list of entries into runs of at most
  ``max_run`` entries, one program each;
* 04.3 the merge of KV-outer's partial outputs, as a Triton kernel: weights ``exp(lse_p - lse)``,
  rows with no partial at all, log-sum-exps large enough to overflow a careless ``exp``;
* 04.9 the backward of one block, in Triton: one KV block's share of ``dq`` and its ``dk``, ``dv``
  from the forward's log-sum-exp -- the step both of MSA's backward kernels repeat.

Each checker draws fresh random sizes on every call and compares with the package's own code
(:func:`minimax_lab.attention.msa_attention`, ``impl="torch"``) or a float64 reference, which an
answer may not call. In 04.3 and 04.9 the learner's kernel must do the work; 04.9's ``lse`` also
counts keys outside the block, so only a kernel that recomputes ``p`` from the saved log-sum-exp
(not a softmax over the block's own keys) gets ``p`` right.
"""
from __future__ import annotations

import math
import random

import torch

from minimax_lab import measure, runtime
from minimax_lab.attention import msa_attention, msa_select
from minimax_lab.attention.msa_backward import sparse_attention as package_sparse_attention
from minimax_lab.exercises import exercise, fresh_rng, on_kernel_device, tensor_problem


def _gen(rng: random.Random) -> torch.Generator:
    return torch.Generator().manual_seed(rng.randrange(2**31))


def _is_tensor(got, name: str, shape: tuple, problems: list[str], dtype: torch.dtype | None = None) -> bool:
    wrong = tensor_problem(got, name, shape, dtype)
    if wrong:
        problems.append(wrong)
    return wrong is None


# --------------------------------------------------------------------------- 04.1 sparse attention


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, selected: torch.Tensor,
                     block_size: int) -> torch.Tensor:
    """Attention over the selected blocks only, for one sequence. ``q [S, Hq, D]``,
    ``k, v [S, G, D]`` (query head ``h`` belongs to group ``h // (Hq // G)``), ``selected int32
    [S, G, topk]`` (block ids, ``-1`` = unused slot). Query ``t``, head ``h`` attends with an exact
    softmax (scale ``1/sqrt(D)``) over the keys ``j`` that lie in one of its group's selected
    blocks and satisfy ``j <= t`` (causal inside the local block; keys past ``S - 1`` do not
    exist). A row that sees no key outputs 0. Return ``[S, Hq, D]`` in q's dtype."""
    raise NotImplementedError  # your code here (gather the blocks, or build a mask: both are fine)


def _sparse_inputs(seed: int, sizes: tuple) -> dict:
    S, Bk, Hq, G, D, topk = sizes
    g = torch.Generator().manual_seed(seed)
    sel = msa_select(torch.randn(1, S, G, 8, generator=g), torch.randn(1, S, 8, generator=g),
                     block_size=Bk, topk=topk, impl="torch")[0]
    drop = torch.rand(sel.shape, generator=g) < 0.2  # some unused slots, some rows with no block at all
    drop[: S // 4] = False
    drop[-1, 0, :] = True  # the last query of group 0 sees nothing
    sel = torch.where(drop, -1, sel).to(torch.int32)
    return {"q": torch.randn(S, Hq, D, generator=g), "k": torch.randn(S, G, D, generator=g),
            "v": torch.randn(S, G, D, generator=g), "selected": sel, "block_size": Bk}


def _sparse_reference(q, k, v, selected, block_size):
    S, G = k.shape[0], k.shape[1]
    zeros_q, zeros_k = q.new_zeros(1, S, G, 1), q.new_zeros(1, S, 1)  # the index branch is not used
    return msa_attention(q[None], k[None], v[None], zeros_q, zeros_k, block_size=block_size,
                         topk=selected.shape[-1], impl="torch", selected=selected[None])[0]


@exercise("04.1", "sparse attention over the selected blocks",
          "Attend over the keys of the selected blocks only, causal inside the local block.", sparse_attention,
          answers=(msa_attention, package_sparse_attention, _sparse_reference))
def _check_sparse_attention(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    for _ in range(3):
        Hq = rng.choice([2, 4, 6])
        G = rng.choice([g for g in (1, 2) if Hq % g == 0])
        sizes = (rng.randint(20, 150), rng.choice([16, 32]), Hq, G, rng.choice([8, 16]), rng.choice([2, 3, 4]))
        res = measure.check(fn, _sparse_reference, lambda seed: _sparse_inputs(seed, sizes), trials=2,
                            seed=rng.randrange(2**30), tol=1e-5, name="sparse_attention")
        if not res.passed:
            S, Bk, Hq, G, D, topk = sizes
            problems.append(f"S={S}, block_size={Bk}, Hq={Hq}, G={G}, D={D}, topk={topk}: "
                            + "; ".join(res.failures[:2]) + " (compared with msa_attention(impl='torch'))")
            break
    return problems


# --------------------------------------------------------------------------- 04.2 balanced runs


def split_runs(counts: torch.Tensor, max_run: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Balance KV-outer's work. ``counts`` int ``[n_lists]``: the length of each KV block's list of
    entries; the lists lie one after another in one entries array, in order. Cut every list into
    runs of at most ``max_run`` entries (the last run of a list may be shorter), one program each.
    Return three int32 tensors of equal length, one element per run, ordered by list and then by
    position: ``list_id`` (the run's list), ``start`` (its first entry's index in the entries
    array) and ``length`` (``1 .. max_run``). An empty list gets no run."""
    raise NotImplementedError  # your code here (no Python loop over the lists needed)


def _runs_reference(counts: list[int], max_run: int) -> tuple[list[int], list[int], list[int]]:
    list_id, start, length, at = [], [], [], 0
    for i, c in enumerate(counts):
        for off in range(0, c, max_run):
            list_id.append(i)
            start.append(at + off)
            length.append(min(max_run, c - off))
        at += c
    return list_id, start, length


def _runs_diagnosis(counts, max_run, got, want) -> str:
    """The first list whose runs differ, in the learner's terms."""
    for i, c in enumerate(counts):
        g = [(s, n) for lid, s, n in zip(*got) if lid == i]
        w = [(s, n) for lid, s, n in zip(*want) if lid == i]
        if g != w:
            if c == 0:
                return f"list {i} is empty and should get no run; you gave {g}"
            short = lambda runs: str(runs[:6])[:-1] + (", ...]" if len(runs) > 6 else "]")  # noqa: E731
            return (f"list {i} ({c} entries, starting at entry {w[0][0]}) should be cut into runs (start, length) "
                    f"{short(w)}; you gave {short(g)}")
    return "the runs are not ordered by list, then by start"


@exercise("04.2", "balanced runs for KV-outer",
          "Cut each block's list of entries into runs of at most max_run entries: list, start and length "
          "of every run.", split_runs, answers=(_runs_reference,))
def _check_split_runs(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    cases = [([rng.choice([0, 0, 1, 2, 3, 7, 8, 9, 16, 33]) for _ in range(rng.randint(1, 30))], rng.choice([1, 4, 8]))
             for _ in range(4)]
    cases += [([8, 0, 16, 3], 8), ([0, 0], 4), ([5], 16)]  # exact multiples, only empty lists, one short list
    for counts, max_run in cases:
        want = _runs_reference(counts, max_run)
        got = fn(torch.tensor(counts, dtype=torch.int32), max_run)
        name = f"split_runs(counts={counts}, max_run={max_run})"
        if not (isinstance(got, (tuple, list)) and len(got) == 3):
            return [f"{name} should return three tensors (list_id, start, length); got {type(got).__name__}"]
        shapes = {tuple(t.shape) if isinstance(t, torch.Tensor) else None for t in got}
        if len(shapes) != 1 or None in shapes or len(next(iter(shapes))) != 1:
            return [f"{name} should return three 1-D tensors of equal length (one element per run); got "
                    f"{[tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in got]}"]
        if any(t.dtype != torch.int32 for t in got):
            return [f"{name} should return int32 tensors; got {[str(t.dtype) for t in got]}"]
        got = tuple(t.tolist() for t in got)
        if got != want:
            problems.append(f"{name}: {_runs_diagnosis(counts, max_run, got, want)}")
            break
    return problems


# --------------------------------------------------------------------------- 04.3 the merge, in Triton


def merge_partials(po: torch.Tensor, plse: torch.Tensor) -> torch.Tensor:
    """KV-outer's merge, computed by a Triton kernel. ``po`` fp32 ``[R, topk, D]``: each row's
    partial outputs, each normalized over one block; ``plse`` fp32 ``[R, topk]``: their
    log-sum-exps (natural log; ``-inf``: the slot holds nothing). Return fp32 ``[R, D]``

        out[r] = sum over slots s of exp(plse[r, s] - lse[r]) * po[r, s],  lse[r] = logsumexp_s plse[r, s]

    and 0 for a row whose slots all hold nothing. ``R`` and ``topk`` can be any size; ``D`` is a
    power of two."""
    raise NotImplementedError  # your code here: launch a kernel like the one above, one program per tile of rows


def _merge_inputs(g: torch.Generator, R: int, topk: int, D: int, offset: float) -> tuple[torch.Tensor, torch.Tensor]:
    po = torch.randn(R, topk, D, generator=g)
    plse = torch.randn(R, topk, generator=g) * 3 + offset
    plse = plse.masked_fill(torch.rand(R, topk, generator=g) < 0.25, float("-inf"))  # empty slots
    plse[R // 2] = float("-inf")                                                     # a row with nothing
    return po, plse


def _merge_reference(po, plse):
    lse = torch.logsumexp(plse.double(), -1, keepdim=True)
    w = torch.exp(plse.double() - lse.nan_to_num(neginf=0.0)).nan_to_num(0.0)
    return (w[..., None] * po.double()).sum(1)


def _merge_diagnosis(got, want, po, plse, offset) -> str:
    empty = torch.isneginf(plse).all(-1)
    bad_rows = ~torch.isclose(got, want, rtol=1e-4, atol=1e-5).all(-1)
    r = int(bad_rows.nonzero()[0])
    if empty[r]:
        return (f"row {r} has no partial (every slot's lse is -inf) and should be 0; got {got[r, :3].tolist()}...: "
                f"its weights are all exp(-inf) = 0, so normalizing divides 0 by 0, and its max is -inf, so "
                f"lse - max is -inf - -inf = NaN; guard such rows (a max of 0, a sum of 1)")
    if not torch.isfinite(got[r]).all():
        return (f"row {r} overflows to inf/NaN with log-sum-exps near {offset:g}: exp of a large lse does not fit "
                f"fp32, so subtract the row's largest lse before exp")
    full = torch.isfinite(plse)
    mean = (po.double() * full[..., None]).sum(1) / full.sum(-1, keepdim=True).clamp_min(1)
    if torch.allclose(got[r], mean[r], atol=1e-4):
        return f"row {r} is the plain mean of its partials: weight each by exp(lse_p - lse) instead"
    return (f"row {r} differs from the merge by up to {(got[r] - want[r]).abs().max():.2e}: the weights "
            f"exp(plse - lse) of a row must sum to 1, empty slots weigh 0")


@exercise("04.3", "the merge of partial outputs, in Triton",
          "Write a Triton kernel that merges each row's partial outputs with weights exp(lse_p - lse).",
          merge_partials, writes_triton=True, answers=(_merge_reference,))
def _check_merge_partials(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    cases = [(rng.randint(2, 120), rng.choice([1, 3, 5, 6, 16]), rng.choice([16, 32, 64]), 0.0) for _ in range(3)]
    cases += [(rng.randint(2, 50), 7, 16, 95.0)]  # exp(95) overflows fp32
    for R, topk, D, offset in cases:
        po, plse = _merge_inputs(_gen(rng), R, topk, D, offset)
        want = _merge_reference(po, plse)
        got = fn(on_kernel_device(po.clone()), on_kernel_device(plse.clone()))
        name = f"merge_partials(R={R}, topk={topk}, D={D}{', lse near %g' % offset if offset else ''})"
        if not _is_tensor(got, name, want.shape, problems):
            break
        got = got.detach().double().cpu()
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=False):
            problems.append(f"{name}: {_merge_diagnosis(got, want, po, plse, offset)}")
            break
    return problems


# --------------------------------------------------------------------------- 04.9 the backward of one block


def block_backward(q, k, v, do, lse, delta, q_pos, k_pos, scale):
    """One key block's share of the attention backward, computed by a ``@triton.jit`` kernel that
    you write above this function and launch here (one program is enough).

    ``q``, ``do`` ``[M, D]``: query rows and the output's gradient; ``k``, ``v`` ``[N, D]``: the
    block's keys and values; ``lse``, ``delta`` ``[M]`` fp32: each row's log-sum-exp from the
    forward and ``sum(do * o)``; ``q_pos [M]``, ``k_pos [N]`` int32 positions (row ``i`` sees key
    ``j`` when ``k_pos[j] <= q_pos[i]``); ``scale`` the softmax scale. All on
    ``runtime.kernel_device()``, fp32, ``M, N <= 64``, ``D <= 64`` (pad to powers of two >= 16
    inside the kernel and mask the padding).

    Return ``(dq [M, D], dk [N, D], dv [N, D])``::

        p  = exp(scale * q @ k.T - lse[:, None])    on visible pairs, 0 elsewhere
        dv = p.T @ do
        ds = p * (do @ v.T - delta[:, None])
        dq = scale * ds @ k
        dk = scale * ds.T @ q
    """
    raise NotImplementedError  # your code here: the kernel above, its launch here


def _case(g: torch.Generator, M: int, N: int, D: int) -> dict:
    """Inputs of one call: a query tile at positions ``t0 ..``, a key block that overlaps it (the
    local block: causal) or lies before it, ``lse`` the log-sum-exp over these keys plus others
    (every row sees at least one key of the block)."""
    q, k, v, do = (torch.randn(n, D, generator=g, dtype=torch.float64) for n in (M, N, N, M))
    start = int(torch.randint(0, 40, (1,), generator=g))
    local = bool(torch.randint(0, 2, (1,), generator=g))
    k_pos = torch.arange(start, start + N)
    q_pos = start + (torch.randint(0, N, (M,), generator=g) if local else N + torch.randint(0, 30, (M,), generator=g))
    scale = 1.0 / math.sqrt(D)
    s = (q @ k.T) * scale
    seen = k_pos[None, :] <= q_pos[:, None]
    here = torch.logsumexp(s.masked_fill(~seen, -math.inf), -1)
    # the row's mass in its other blocks, as large as this block's (e^-2..e^2 times it): p must come
    # from the saved lse, a softmax over this block's own keys is off by a factor of 1.1 to 8
    elsewhere = here + torch.empty(M, dtype=torch.float64).uniform_(-2, 2, generator=g)
    lse = torch.logaddexp(here, elsewhere)
    delta = torch.randn(M, generator=g, dtype=torch.float64)
    return dict(q=q, k=k, v=v, do=do, lse=lse, delta=delta, q_pos=q_pos.to(torch.int32), k_pos=k_pos.to(torch.int32),
                scale=scale)


def block_backward_formulas(q, k, v, do, lse, delta, q_pos, k_pos, scale):
    """The answer, in PyTorch (float64 for the checker)."""
    seen = k_pos[None, :].long() <= q_pos[:, None].long()
    p = torch.exp((q @ k.T) * scale - lse[:, None]).masked_fill(~seen, 0.0)
    ds = p * (do @ v.T - delta[:, None])
    return scale * ds @ k, scale * ds.T @ q, p.T @ do


_HINTS = {
    "dv": "dv = p.T @ do needs only p: check p = exp(scale * q.k - lse) on visible keys and 0 where "
          "k_pos > q_pos (the causal mask) or past the N real keys -- recomputed from the saved lse, which "
          "also counts the row's keys in other blocks (a softmax over this block's keys alone is not p)",
    "dq": "dq = scale * ds @ k with ds = p * (dp - delta), dp = do @ v.T: check the subtraction of "
          "delta per row and the factor scale",
    "dk": "dk = scale * ds.T @ q sums over the query rows: check the transpose, the factor scale, and "
          "that padded rows (past M) contribute 0",
}


@exercise("04.9", "the backward of one block", "Write the Triton kernel for one key block's share of the "
          "attention backward: recompute p from the log-sum-exp, then dv, ds, dq and dk.", block_backward,
          writes_triton=True, answers=(block_backward_formulas,))
def _check_block_backward(fn) -> list[str]:
    bound = 1e-4 if runtime.is_interpreter() else 1e-2  # a GPU's fp32 tl.dot runs in TF32 by default
    rng = fresh_rng()
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    for trial in range(3):
        M, N, D = rng.randint(1, 40), rng.choice([16, 32, rng.randint(2, 32)]), rng.choice([8, 16, 32, 48])
        case = _case(g, M, N, D)
        want = block_backward_formulas(**case)
        args = {n: on_kernel_device(t.float() if t.is_floating_point() else t) if isinstance(t, torch.Tensor)
                else t for n, t in case.items()}
        got = fn(**args)
        call = f"block_backward(M={M} rows, N={N} keys, D={D})"
        if not (isinstance(got, (tuple, list)) and len(got) == 3):
            return [f"{call} should return three tensors (dq, dk, dv), got {type(got).__name__}"]
        problems = []
        for name, a, w in zip(("dq", "dk", "dv"), got, want):
            wrong = tensor_problem(a, f"{call}: {name}", tuple(w.shape))
            if wrong:
                problems.append(wrong)
                continue
            err = ((a.detach().cpu().double() - w).norm() / w.norm().clamp_min(1e-12)).item()
            if not err < bound:  # NaN fails too
                problems.append(f"{call}: {name} is off by a relative error of {err:.3g} (tolerance {bound:g}); "
                                + _HINTS[name])
        if problems:
            return problems if trial == 0 else [f"(trial {trial + 1}, the earlier ones passed)"] + problems
    return []
