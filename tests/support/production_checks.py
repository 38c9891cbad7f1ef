"""Checks of the Triton kernels at production shapes, against fp32 references that stay cheap there.

The interpreter never runs what a GPU compiles (TMA descriptors, wgmma, software pipelining,
autotuned block shapes): the ``gpu`` tests that run these checks at production shapes, in bf16
(the GPU's compute dtype, bf16 tolerances), are the only check of the compiled paths.

A full fp32 reference of MSA or dense attention at 16k tokens and 64 heads would materialize
``S x S`` scores per head; these references compute only **sampled query rows** (the first and
last rows, rows on both sides of block edges, random ones), straight from the contracts'
definitions, and the kernels' outputs are compared on those rows. Paged decode and the MoE
experts are cheap enough to check whole.

Each ``check_*`` function builds random inputs on :data:`devices.DEVICE`, runs the kernel (a
parameter, so a test can hand it a deliberately broken one and see the check fail), runs the
reference and asserts; it returns the errors it measured. Each operator's ``test_*_production.py``
runs them at production shapes on a GPU, and ``tests/core/test_production_checks.py`` at tiny
shapes on any device (the interpreter on the CPU), which proves the checks themselves pass right
kernels and catch wrong ones.

Selections are compared tie-tolerantly: the kernel's chosen blocks must score (by the fp32
reference) what the reference's chosen blocks score, slot by slot, within ``eps`` -- two blocks
whose scores differ by less than the kernels' accumulation error may legitimately swap.
"""
from __future__ import annotations

import math

import torch
from tests.support.devices import DEVICE, fresh_seed, relative_error, tol

from minimax_lab.attention import msa_attention, msa_select
from minimax_lab.attention.dense_triton import flash_attention
from minimax_lab.attention.msa_reference import select_from_scores_reference
from minimax_lab.attention.msa_triton_prefill import msa_attention_triton

#: Score difference under which two blocks count as tied (index scores are O(1); fp32 sums of
#: 128 exact bf16 products differ between summation orders by ~1e-5).
SELECTION_EPS = 1e-3


# --------------------------------------------------------------------------- kernels under test


def msa_select_triton(Bk, topk):
    """The MSA index kernel as ``fn(q_idx, k_idx) -> selected``."""
    return lambda q_idx, k_idx: msa_select(q_idx, k_idx, block_size=Bk, topk=topk, impl="triton")


def msa_schedules(Bk, topk, *, chunk_bytes=None):
    """The MSA prefill kernels given a selection: ``{name: fn(q, k, v, q_idx, k_idx, sel) -> (o, lse)}``."""
    kw = dict(block_size=Bk, topk=topk, return_lse=True)
    fns = {s: (lambda s: lambda q, k, v, qi, ki, sel: msa_attention(q, k, v, qi, ki, impl="triton", schedule=s,
                                                                    selected=sel, **kw))(s)
           for s in ("kv", "query")}
    # end to end: the kernel selects for itself (deterministic: the same blocks as `sel`)
    fns["end_to_end"] = lambda q, k, v, qi, ki, sel: msa_attention(q, k, v, qi, ki, impl="triton", **kw)
    if chunk_bytes:  # KV-outer with its partial results in several query chunks
        fns["kv_chunked"] = lambda q, k, v, qi, ki, sel: msa_attention_triton(
            q, k, v, qi, ki, selected=sel, partial_budget_bytes=chunk_bytes, **kw)
    return fns


def flash(config=None):
    """Causal FlashAttention (``config`` None: autotuned) as ``fn(q, k, v) -> (o, lse)``."""
    return lambda q, k, v: flash_attention(q, k, v, causal=True, return_lse=True, config=config)


# --------------------------------------------------------------------------- inputs


def device_generator(seed: int) -> torch.Generator:
    """A generator on :data:`DEVICE`: GPU-size inputs are drawn there, not on the CPU (seconds saved)."""
    return torch.Generator(device=DEVICE).manual_seed(int(seed))


def rand(*shape: int, gen: torch.Generator, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """``scale * N(0, 1)`` of ``shape`` on :data:`DEVICE` in ``dtype``."""
    x = torch.randn(*shape, generator=gen, device=DEVICE, dtype=torch.float32)
    return (x * scale).to(dtype) if scale != 1.0 else x.to(dtype)


def sample_rows(S: int, n: int, *, block_size: int, seed: int) -> torch.Tensor:
    """Up to ``n`` sorted distinct query rows of ``[0, S)``: row 0, the last row, both sides of
    the first, second and last block edges, and random rows. int64 on :data:`DEVICE`."""
    edges = [block_size - 1, block_size, 2 * block_size - 1, 2 * block_size,
             (S - 1) // block_size * block_size - 1, (S - 1) // block_size * block_size]
    rows = {r for r in [0, S - 1, *edges] if 0 <= r < S}
    for r in torch.randperm(S, generator=torch.Generator().manual_seed(int(seed))).tolist():
        if len(rows) >= n:
            break
        rows.add(r)
    return torch.tensor(sorted(rows), dtype=torch.int64, device=DEVICE)


def random_page_table(lengths, page: int, *, spare: int, seed: int):
    """Pages of each sequence drawn at random from a shuffled pool: ``(block_table int32
    [B, max_pages] with -1 unused, seq_lens int32 [B], num_pages)`` on :data:`DEVICE`."""
    n_pages = [-(-L // page) for L in lengths]
    P = sum(n_pages) + spare
    perm = torch.randperm(P, generator=torch.Generator().manual_seed(int(seed)))
    table = torch.full((len(lengths), max(n_pages) + 1), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(n_pages):
        table[b, :n] = perm[used:used + n].to(torch.int32)
        used += n
    return table.to(DEVICE), torch.tensor(lengths, dtype=torch.int32, device=DEVICE), P


def unpage(cache: torch.Tensor, block_table: torch.Tensor, b: int, length: int) -> torch.Tensor:
    """Tokens ``0 .. length-1`` of sequence ``b`` of a paged ``cache [P, page, ...]``: ``[length, ...]``."""
    page = cache.shape[1]
    t = torch.arange(length, device=cache.device)
    return cache[block_table[b].long()[t // page], t % page]


# --------------------------------------------------------------------------- references on rows


def dense_rows_reference(q, k, v, rows, *, scale=None):
    """Causal GQA attention (bottom-right aligned) of the query ``rows`` only, fp32:
    ``(o [B, R, Hq, D], lse [B, Hq, R])`` -- the contract of :func:`minimax_lab.attention.attention`."""
    B, S, Hq, D = q.shape
    Skv, Hkv = k.shape[1], k.shape[2]
    G, R = Hq // Hkv, rows.numel()
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    qr = q[:, rows].float().view(B, R, Hkv, G, D)
    s = torch.einsum("brhgd,bshd->bhgrs", qr, k.float()) * scale
    hidden = torch.arange(Skv, device=q.device)[None, :] > rows[:, None] + (Skv - S)  # [R, Skv]
    s = s.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                                              # [B, Hkv, G, R]
    o = torch.einsum("bhgrs,bshd->brhgd", torch.exp(s - lse[..., None]), v.float())
    return o.reshape(B, R, Hq, D), lse.reshape(B, Hq, R)


def block_scores_rows(q_idx_rows, k_idx, positions, block_size: int) -> torch.Tensor:
    """MSA block scores of some queries, fp32 ``[B, R, G, n_blocks]``: max over each block's
    visible keys (``key <= position``) of ``q_idx . k_idx / sqrt(D_idx)``; ``-inf`` if none."""
    B, R, G, Didx = q_idx_rows.shape
    L = k_idx.shape[1]
    nb = -(-L // block_size)
    s = torch.einsum("brgd,bld->brgl", q_idx_rows.float(), k_idx.float()) / math.sqrt(Didx)
    s = s.masked_fill(torch.arange(L, device=s.device)[None, :] > positions[:, None, None], float("-inf"))
    s = torch.nn.functional.pad(s, (0, nb * block_size - L), value=float("-inf"))
    return s.view(B, R, G, nb, block_size).amax(-1)


def msa_rows_reference(q_rows, k, v, sel_rows, positions, *, block_size: int, scale=None):
    """MSA attention of some queries over their selected blocks, fp32, from the contract: query
    head ``h`` of group ``g`` attends with an exact softmax to the keys ``j <= position`` of the
    blocks ``sel_rows[b, r, g]``. ``q_rows [B, R, Hq, D]``, ``k, v [B, L, G, D]``,
    ``sel_rows int [B, R, G, topk]`` (-1 unused), ``positions [R]``. Returns
    ``(o [B, R, Hq, D], lse [B, Hq, R])``."""
    B, R, Hq, D = q_rows.shape
    L, G = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    sel = sel_rows.long()
    key = (sel[..., None] * block_size + torch.arange(block_size, device=sel.device)).flatten(-2)  # [B,R,G,K]
    ok = (sel[..., None] >= 0).expand(*sel.shape, block_size).flatten(-2) & (key <= positions[None, :, None, None])
    ok &= key < L
    key = key.clamp(0, L - 1)
    b_i = torch.arange(B, device=sel.device)[:, None, None, None]
    g_i = torch.arange(G, device=sel.device)[None, None, :, None]
    kg, vg = k[b_i, key, g_i].float(), v[b_i, key, g_i].float()                      # [B, R, G, K, D]
    qh = q_rows.float().view(B, R, G, Hq // G, D)
    s = torch.einsum("brghd,brgkd->brghk", qh, kg) * scale
    s = s.masked_fill(~ok[:, :, :, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                                                # [B, R, G, hpg]
    o = torch.einsum("brghk,brgkd->brghd", torch.exp(s - lse[..., None]), vg)
    return o.reshape(B, R, Hq, D), lse.reshape(B, R, Hq).permute(0, 2, 1)


def assert_selection_matches(sel, ref_sel, scores, *, topk: int, positions, block_size: int,
                             eps: float = SELECTION_EPS) -> int:
    """A kernel's selection ``sel`` against the reference's ``ref_sel`` (both int ``[B, R, G, topk]``)
    for the queries at ``positions [R]`` with reference block ``scores [B, R, G, n_blocks]``.

    Rows that see at most ``topk`` blocks must match exactly; the others must end with the local
    block, pick ``topk - 1`` distinct earlier blocks, and score slot by slot what the reference's
    picks score, within ``eps`` (near-ties may swap). Returns how many rows differ at all.
    """
    sel, ref_sel = sel.long(), ref_sel.long()
    assert sel.shape == ref_sel.shape, (sel.shape, ref_sel.shape)
    local = (positions // block_size)[None, :, None].expand(sel.shape[:-1])
    sparse = local + 1 > topk
    exact = (sel == ref_sel).all(-1)
    assert bool((exact | sparse).all()), f"{int((~exact & ~sparse).sum())} rows with <= topk blocks differ"
    if not bool(sparse.any()):
        return int((~exact).sum())
    s, r, loc = sel[sparse], ref_sel[sparse], local[sparse]
    assert bool((s[:, -1] == loc).all()), "a sparse row does not end with its local block"
    early = s[:, :-1]
    assert bool(((early >= 0) & (early < loc[:, None])).all()), "a picked block is not an earlier block"
    srt = early.sort(-1).values
    assert bool((srt[:, 1:] != srt[:, :-1]).all()), "a block is picked twice"
    sc = scores[sparse]
    got, want = sc.gather(-1, early), sc.gather(-1, r[:, :-1])
    gap = float((got - want).abs().max())
    assert gap <= eps, f"picked blocks score up to {gap:.3g} off the best ones (eps {eps})"
    return int((~exact).sum())


# --------------------------------------------------------------------------- the checks


def _seed(seed):
    return fresh_seed() if seed is None else int(seed)


def check_dense_prefill(*, B, S, Hq, Hkv, D, dtype, n_rows, attention, seed=None) -> dict:
    """``attention(q, k, v) -> (o, lse)`` (causal) on random ``[B, S, H, D]`` inputs against
    :func:`dense_rows_reference` on sampled rows. Asserts; returns the errors."""
    seed = _seed(seed)
    g = device_generator(seed)
    q, k, v = rand(B, S, Hq, D, gen=g, dtype=dtype), rand(B, S, Hkv, D, gen=g, dtype=dtype), \
        rand(B, S, Hkv, D, gen=g, dtype=dtype)
    o, lse = attention(q, k, v)
    assert o.shape == q.shape and o.dtype == dtype and lse.shape == (B, Hq, S)
    rows = sample_rows(S, n_rows, block_size=128, seed=seed)
    ro, rl = dense_rows_reference(q, k, v, rows)
    err = {"o": relative_error(o[:, rows], ro), "lse": relative_error(lse[:, :, rows], rl)}
    bound = tol(dtype)
    assert err["o"] < bound and err["lse"] < bound, (err, bound, f"seed {seed}")
    assert bool(torch.isfinite(o).all()), f"non-finite output (seed {seed})"
    return err


def check_msa_prefill(*, B, S, Hq, G, D, Didx, Bk, topk, dtype, n_rows, select, attend, seed=None) -> dict:
    """MSA prefill: ``select(q_idx, k_idx) -> sel`` against the reference rule on sampled rows
    (tie-tolerant), then each ``attend[name](q, k, v, q_idx, k_idx, sel) -> (o, lse)`` against
    :func:`msa_rows_reference` with that selection. Asserts; returns the errors."""
    seed = _seed(seed)
    g = device_generator(seed)
    q, k, v = rand(B, S, Hq, D, gen=g, dtype=dtype), rand(B, S, G, D, gen=g, dtype=dtype), \
        rand(B, S, G, D, gen=g, dtype=dtype)
    q_idx, k_idx = rand(B, S, G, Didx, gen=g, dtype=dtype), rand(B, S, Didx, gen=g, dtype=dtype)
    sel = select(q_idx, k_idx)
    assert sel.shape == (B, S, G, topk) and sel.dtype == torch.int32
    rows = sample_rows(S, n_rows, block_size=Bk, seed=seed)
    scores = block_scores_rows(q_idx[:, rows], k_idx, rows, Bk)
    ref_sel = select_from_scores_reference(scores, rows[None, :, None], Bk, topk)
    err = {"selection_rows_differing": assert_selection_matches(sel[:, rows], ref_sel, scores, topk=topk,
                                                                positions=rows, block_size=Bk)}
    ro, rl = msa_rows_reference(q[:, rows], k, v, sel[:, rows], rows, block_size=Bk)
    bound = tol(dtype)
    for name, fn in attend.items():
        o, lse = fn(q, k, v, q_idx, k_idx, sel)
        assert o.shape == q.shape and o.dtype == dtype and lse.shape == (B, Hq, S)
        err[name] = {"o": relative_error(o[:, rows], ro), "lse": relative_error(lse[:, :, rows], rl)}
        assert err[name]["o"] < bound and err[name]["lse"] < bound, (name, err[name], bound, f"seed {seed}")
        assert bool(torch.isfinite(o).all()), f"{name}: non-finite output (seed {seed})"
    return err


def check_moe(*, T, E, k, d, f, dtype, experts, seed=None) -> float:
    """``experts(x, w_gate_up, w_down, weights, ids) -> [T, d]`` on softmax-routed random tokens
    against the fp32 reference loop over experts, every token. Asserts; returns the error."""
    from minimax_lab.moe import moe_experts, route_softmax
    seed = _seed(seed)
    g = device_generator(seed)
    x = rand(T, d, gen=g, dtype=dtype)
    wgu, wd = rand(E, 2 * f, d, gen=g, dtype=dtype, scale=d ** -0.5), rand(E, d, f, gen=g, dtype=dtype, scale=f ** -0.5)
    w, ids = route_softmax(rand(T, E, gen=g, dtype=torch.float32), k)
    w = w.to(dtype)
    y = experts(x, wgu, wd, w, ids)
    want = moe_experts(x, wgu, wd, w, ids, impl="reference")
    err = relative_error(y, want)
    assert y.shape == (T, d) and y.dtype == dtype
    assert err < tol(dtype), (err, tol(dtype), f"seed {seed}")
    return err


def check_paged_decode(*, lengths, Hq, Hkv, D, page, dtype, decode, seed=None) -> float:
    """``decode(q, k_cache, v_cache, block_table, seq_lens) -> [B, Hq, D]`` on pages scattered at
    random over the pool against an fp32 softmax over each sequence's unpaged tokens."""
    seed = _seed(seed)
    g = device_generator(seed)
    bt, lens, P = random_page_table(lengths, page, spare=3, seed=seed)
    kc, vc = rand(P, page, Hkv, D, gen=g, dtype=dtype), rand(P, page, Hkv, D, gen=g, dtype=dtype)
    q = rand(len(lengths), Hq, D, gen=g, dtype=dtype)
    o = decode(q, kc, vc, bt, lens)
    assert o.shape == q.shape and o.dtype == dtype
    ref = torch.zeros(q.shape, dtype=torch.float32, device=DEVICE)
    for b, L in enumerate(lengths):
        if L:
            ks, vs = unpage(kc, bt, b, L).float(), unpage(vc, bt, b, L).float()        # [L, Hkv, D]
            qh = q[b].float().view(Hkv, Hq // Hkv, D)
            p = torch.softmax(torch.einsum("hgd,lhd->hgl", qh, ks) / math.sqrt(D), dim=-1)
            ref[b] = torch.einsum("hgl,lhd->hgd", p, vs).reshape(Hq, D)
    err = relative_error(o, ref)
    assert err < tol(dtype), (err, tol(dtype), f"seed {seed}")
    return err


def check_msa_decode(*, lengths, T, Hq, G, D, Didx, page, topk, dtype, decode, seed=None) -> dict:
    """``decode(q, k_cache, v_cache, block_table, seq_lens, q_idx, k_idx_cache) -> (o, selected)``
    for the last ``T`` tokens of each sequence: the selection against the reference rule
    (tie-tolerant), the output against :func:`msa_rows_reference` with that selection."""
    seed = _seed(seed)
    g = device_generator(seed)
    B = len(lengths)
    bt, lens, P = random_page_table(lengths, page, spare=3, seed=seed)
    kc, vc = rand(P, page, G, D, gen=g, dtype=dtype), rand(P, page, G, D, gen=g, dtype=dtype)
    kic = rand(P, page, Didx, gen=g, dtype=dtype)
    q, q_idx = rand(B, T, Hq, D, gen=g, dtype=dtype), rand(B, T, G, Didx, gen=g, dtype=dtype)
    o, sel = decode(q, kc, vc, bt, lens, q_idx, kic)
    assert o.shape == q.shape and o.dtype == dtype and sel.shape == (B, T, G, topk)
    err = {"selection_rows_differing": 0, "o": 0.0}
    for b, L in enumerate(lengths):
        pos = torch.arange(L - T, L, device=DEVICE)
        ki = unpage(kic, bt, b, L)[None]
        scores = block_scores_rows(q_idx[b:b + 1], ki, pos, page)
        ref_sel = select_from_scores_reference(scores, pos[None, :, None], page, topk)
        err["selection_rows_differing"] += assert_selection_matches(sel[b:b + 1], ref_sel, scores, topk=topk,
                                                                    positions=pos, block_size=page)
        ro, _ = msa_rows_reference(q[b:b + 1], unpage(kc, bt, b, L)[None], unpage(vc, bt, b, L)[None],
                                   sel[b:b + 1], pos, block_size=page)
        err["o"] = max(err["o"], relative_error(o[b:b + 1], ro))
    assert err["o"] < tol(dtype), (err, tol(dtype), f"seed {seed}")
    return err


def check_paged_prefill(*, prefix_lens, S, Hq, Hkv, D, page, dtype, prefill, seed=None) -> float:
    """``prefill(q, k_cache, v_cache, block_table, seq_lens, q_lens) -> [B, S, Hq, D]``: ``S``
    new tokens (ragged ``q_lens``: S, 1, ...) after each cached prefix, against
    :func:`dense_rows_reference` on the unpaged sequence (every new row; padding rows zero)."""
    seed = _seed(seed)
    g = device_generator(seed)
    B = len(prefix_lens)
    q_lens = [S, 1, *[(S // 2 + 7 * b) % S + 1 for b in range(2, B)]][:B]
    lengths = [p + n for p, n in zip(prefix_lens, q_lens)]
    bt, lens, P = random_page_table(lengths, page, spare=3, seed=seed)
    kc, vc = rand(P, page, Hkv, D, gen=g, dtype=dtype), rand(P, page, Hkv, D, gen=g, dtype=dtype)
    q = rand(B, S, Hq, D, gen=g, dtype=dtype)
    ql = torch.tensor(q_lens, dtype=torch.int32, device=DEVICE)
    o = prefill(q, kc, vc, bt, lens, ql)
    assert o.shape == q.shape and o.dtype == dtype
    worst = 0.0
    for b, (L, n) in enumerate(zip(lengths, q_lens)):
        rows = torch.arange(n, device=DEVICE)
        ro, _ = dense_rows_reference(q[b:b + 1, :n], unpage(kc, bt, b, L)[None], unpage(vc, bt, b, L)[None], rows)
        worst = max(worst, relative_error(o[b:b + 1, :n], ro))
        assert bool((o[b, n:] == 0).all()), f"padding rows of sequence {b} are not zero"
    assert worst < tol(dtype), (worst, tol(dtype), f"seed {seed}")
    return worst


def check_write_kv(*, T, pages, page, Hkv, D, dtype, write, seed=None) -> int:
    """``write(k_new, v_new, k_cache, v_cache, slots)`` in place, ``T`` distinct random slots
    (one padding slot ``-1``): every written row lands exactly, every other row is untouched."""
    seed = _seed(seed)
    g = device_generator(seed)
    kc, vc = rand(pages, page, Hkv, D, gen=g, dtype=dtype), rand(pages, page, Hkv, D, gen=g, dtype=dtype)
    k0, v0 = kc.clone(), vc.clone()
    slots = torch.randperm(pages * page, generator=torch.Generator().manual_seed(seed))[:T].to(DEVICE)
    slots[T // 2] = -1
    kn, vn = rand(T, Hkv, D, gen=g, dtype=dtype), rand(T, Hkv, D, gen=g, dtype=dtype)
    write(kn, vn, kc, vc, slots)
    real = slots >= 0
    flat_k, flat_v = kc.view(-1, Hkv, D), vc.view(-1, Hkv, D)
    assert torch.equal(flat_k[slots[real]], kn[real]) and torch.equal(flat_v[slots[real]], vn[real])
    untouched = torch.ones(pages * page, dtype=torch.bool, device=DEVICE)
    untouched[slots[real]] = False
    assert torch.equal(flat_k[untouched], k0.view(-1, Hkv, D)[untouched])
    assert torch.equal(flat_v[untouched], v0.view(-1, Hkv, D)[untouched])
    return int(real.sum())
