"""Prefill over a cached prefix: new tokens attend causally to the prefix already in the paged
cache and to themselves -- the kernel behind prefix caching (a cache hit skips the prefix's
compute; only the new suffix runs).

Contract::

    paged_prefill(q, k_cache, v_cache, block_table, seq_lens, *, q_lens=None, scale=None, impl="triton",
                  k_scale=None, v_scale=None) -> o

* ``q [B, S, Hq, D]`` -- queries of up to ``S`` new tokens per sequence;
* ``k_cache, v_cache [num_pages, page_size, Hkv, D]``, ``block_table int32 [B, max_pages]``
  (-1 unused) -- the shared paged layout (see :mod:`.decode`). The new tokens' K/V are
  **already written** (:func:`minimax_lab.kvcache.write.write_kv`), so
* ``seq_lens int32 [B]`` counts every cached token, prefix *and* new ones;
* ``q_lens int32 [B]`` (optional, default ``S`` for all) -- how many of the ``S`` rows of
  sequence ``b`` are real; ``q_lens[b] <= min(S, seq_lens[b])``;
* ``k_scale, v_scale`` -- only with ``float8_e4m3fn`` caches, either layout of :mod:`.paged`
  (per token and kv head, or per page and kv head); q keeps its dtype.

New token ``i < q_lens[b]`` sits at position ``p = seq_lens[b] - q_lens[b] + i`` and attends to
cached tokens ``0..p``. Rows ``i >= q_lens[b]`` (padding) come back as zeros. Returns
``o [B, S, Hq, D]`` in q's dtype (empty for ``B = 0`` or ``S = 0``); any strides. Bad input raises
``TypeError``/``ValueError`` as for :func:`minimax_lab.kvcache.decode.paged_decode` (the checks of
:mod:`.paged`), plus ``q_lens`` out of range.

``impl``: ``"reference"`` (per sequence, gather + fp32 masked softmax), ``"torch"`` (gather
every page + SDPA with a causal-offset mask), ``"triton"``: one program per (sequence, kv
head, tile of ``BLOCK_M`` new tokens), the tile's ``BLOCK_M x G`` (token, query head) rows
packed into one M dimension so each K/V tile is read once per GQA group. Key tiles every row
can see (the prefix up to the tile's first token) run unmasked -- the same tile step as the
decode kernel -- and only the tiles that cross the causal diagonal apply the mask. FP8 tiles are
upcast to q's dtype and scaled as in the decode kernel (:func:`.decode._decode_tile`).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minimax_lab import configs
from minimax_lab.kvcache.decode import LOG2E, _decode_tile
from minimax_lab.kvcache.paged import (check_paged_layout, dequantize_kv, gather_pages, gather_sequence,
                                       kv_scale_operands, paged_triton_operands)
from minimax_lab.sdpa import sdpa
from minimax_lab.validate import (FLOAT_DTYPES, accumulate_dtype, check_choice, check_same_device, check_scale,
                                  check_tensor)

IMPLS = ("reference", "torch", "triton")
#: built-in GPU default (the H200's, see :mod:`minimax_lab.configs`); the interpreter's config
GPU_CONFIG = configs.builtin("paged_prefill")
INTERPRETER_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 1, "num_stages": 1}


def _check_prefill(q, k_cache, v_cache, block_table, seq_lens, q_lens, scale, impl, check_values, k_scale=None,
                   v_scale=None):
    check_choice(impl, "impl", IMPLS)
    check_tensor(q, "q", ndim=4, dtypes=FLOAT_DTYPES)
    B, S, Hq, D = q.shape
    check_values = check_values or impl != "triton"  # reference/torch read lengths back anyway: always checked
    P, ps, Hkv, Dk, max_pages = check_paged_layout(k_cache, v_cache, block_table, seq_lens, batch=B,
                                                   check_values=check_values, k_scale=k_scale, v_scale=v_scale)
    if Dk != D:
        raise ValueError(f"q has head_dim {D} but k_cache has {Dk}")
    if Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of kv heads ({Hkv})")
    check_same_device(q=q, k_cache=k_cache)
    if q_lens is not None:
        check_tensor(q_lens, "q_lens", shape=[B], dtypes=(torch.int32,))
        check_same_device(q=q, q_lens=q_lens)
    if check_values and B:
        ql = q_lens if q_lens is not None else torch.full_like(seq_lens, S)
        if bool(((ql < 0) | (ql > S) | (ql > seq_lens)).any()):
            raise ValueError(f"q_lens must lie in [0, min(S = {S}, seq_lens[b])] (the new tokens are part of the "
                             f"cached seq_lens), got q_lens {ql.tolist()[:8]} with seq_lens {seq_lens.tolist()[:8]}")
    check_scale(scale)


def paged_prefill_reference(q, k_cache, v_cache, block_table, seq_lens, *, q_lens=None, scale=None, k_scale=None,
                            v_scale=None):
    """Per sequence: gather its cached tokens, fp32 scores (fp64 for fp64 inputs), causal mask with
    the prefix offset. FP8 caches are dequantized first (exactly, to fp32)."""
    k_cache, v_cache = dequantize_kv(k_cache, k_scale), dequantize_kv(v_cache, v_scale)
    B, S, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    work = accumulate_dtype(q.dtype)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.zeros(B, S, Hq, D, dtype=work, device=q.device)
    for b in range(B):
        L = int(seq_lens[b])
        n = S if q_lens is None else int(q_lens[b])
        if n == 0:
            continue
        k = gather_sequence(k_cache, block_table, b, L).to(work).repeat_interleave(Hq // Hkv, dim=1)  # [L, Hq, D]
        v = gather_sequence(v_cache, block_table, b, L).to(work).repeat_interleave(Hq // Hkv, dim=1)
        s = torch.einsum("ihd,jhd->hij", q[b, :n].to(work), k) * scale  # [Hq, n, L]
        pos = torch.arange(L - n, L, device=q.device)
        s = s.masked_fill(torch.arange(L, device=q.device)[None, None, :] > pos[None, :, None], float("-inf"))
        out[b, :n] = torch.einsum("hij,jhd->ihd", torch.softmax(s, dim=-1), v)
    return out.to(q.dtype)


def paged_prefill_torch(q, k_cache, v_cache, block_table, seq_lens, *, q_lens=None, scale=None, k_scale=None,
                        v_scale=None):
    """Gather all pages into a contiguous copy (FP8 pages dequantized to q's dtype as they are
    gathered), then SDPA with a boolean causal-offset mask."""
    B, S, Hq, D = q.shape
    _, ps, Hkv, _ = k_cache.shape
    L = int(seq_lens.max()) if B else 0
    if L == 0:
        return torch.zeros_like(q)
    n_pages = (L + ps - 1) // ps
    pages = block_table[:, :n_pages].long().clamp_min(0)
    k = gather_pages(k_cache, k_scale, pages, q.dtype).reshape(B, n_pages * ps, Hkv, D)[:, :L].transpose(1, 2)
    v = gather_pages(v_cache, v_scale, pages, q.dtype).reshape(B, n_pages * ps, Hkv, D)[:, :L].transpose(1, 2)
    ql = q_lens.long() if q_lens is not None else torch.full((B,), S, device=q.device, dtype=torch.long)
    rows = torch.arange(S, device=q.device)
    pos = seq_lens.long()[:, None] - ql[:, None] + rows[None, :]  # [B, S] position of each new token
    mask = torch.arange(L, device=q.device)[None, None, :] <= pos[:, :, None]  # [B, S, L]
    real = rows[None, :] < ql[:, None]
    mask = mask | ~real[:, :, None]  # padding rows: let them see everything (no NaN), zeroed below
    o = sdpa(q.transpose(1, 2).to(k.dtype), k, v, attn_mask=mask[:, None],
                                                         scale=scale, enable_gqa=Hq != Hkv)
    o = o.transpose(1, 2).to(q.dtype)  # q cast to the cache's dtype and back, as in paged_decode
    return torch.where(real[:, :, None, None], o, torch.zeros_like(o))


@triton.jit
def _prefill_masked_tile(acc, m_i, l_i, q, k_base, v_base, bt_row, start, offs_n, offs_d, L, row_pos, sks, svs,
                         skp, svp, skd, svd, n_pages, qk_scale, ks_base, vs_base, kscp, kscs, vscp, vscs,
                         PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, FP8: tl.constexpr):
    """A key tile crossing the causal diagonal: row r sees key t only if t <= row_pos[r] (< L).
    FP8 tiles: upcast, key scales on the scores' columns, value scales on P's (as in ``_decode_tile``)."""
    t = start + offs_n
    t_ok = t < L
    page = tl.load(bt_row + t // PAGE, mask=t_ok, other=0)
    page = tl.minimum(tl.maximum(page, 0), n_pages - 1)  # bounds guard, as in _decode_tile
    slot = t % PAGE
    kv_mask = t_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(k_base + page.to(tl.int64)[:, None] * skp + slot[:, None] * sks + offs_d[None, :] * skd,
                mask=kv_mask, other=0.0)
    v = tl.load(v_base + page.to(tl.int64)[:, None] * svp + slot[:, None] * svs + offs_d[None, :] * svd,
                mask=kv_mask, other=0.0)
    if FP8:  # exact upcast of e4m3; one scale per token (per-page scales: token stride 0)
        k = k.to(q.dtype)
        v = v.to(q.dtype)
        ksc = tl.load(ks_base + page.to(tl.int64) * kscp + slot * kscs, mask=t_ok, other=0.0)
        vsc = tl.load(vs_base + page.to(tl.int64) * vscp + slot * vscs, mask=t_ok, other=0.0)
    qk = tl.dot(q, tl.trans(k))
    if FP8:  # each key's scale multiplies its column of the scores
        qk = qk * ksc[None, :]
    qk = qk * qk_scale
    qk = tl.where(t[None, :] <= row_pos[:, None], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # padding rows see nothing yet: no NaN
    p = tl.math.exp2(qk - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    if FP8:  # each value's scale multiplies its column of P (after l_i took the unscaled p)
        p = p * vsc[None, :]
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


@triton.jit
def _paged_prefill_kernel(Q, K, V, BT, LENS, QLENS, O, KS, VS,
                          sqb, sqs, sqh, skp, sks, skh, skd, svp, svs, svh, svd, sbt, sob, sos, soh,
                          kscp, kscs, ksch, vscp, vscs, vsch,
                          S, Hkv, GROUP, qk_scale, n_pages, max_len,
                          PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_G: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_QLENS: tl.constexpr, FP8: tl.constexpr):
    pid = tl.program_id(0)
    tile = tl.program_id(1)
    b = pid // Hkv
    hk = pid % Hkv
    # bounds guard (unchecked inputs): 0 <= n_new <= L <= max_len keeps every table read in the row
    L = tl.minimum(tl.maximum(tl.load(LENS + b), 0), max_len)
    n_new = tl.load(QLENS + b) if HAS_QLENS else S
    n_new = tl.minimum(tl.maximum(n_new, 0), tl.minimum(L, S))
    prefix = L - n_new
    # rows = (new token, query head of the group) pairs, BLOCK_M tokens x BLOCK_G heads
    offs_r = tl.arange(0, BLOCK_M * BLOCK_G)
    tok = tile * BLOCK_M + offs_r // BLOCK_G
    g = offs_r % BLOCK_G
    heads = hk * GROUP + g
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    real = (tok < n_new) & (g < GROUP)
    row_pos = tl.where(real, prefix + tok, -1)  # padding rows see no key
    q_mask = real[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q + b.to(tl.int64) * sqb + tok[:, None] * sqs + heads[:, None] * sqh + offs_d[None, :],
                mask=q_mask, other=0.0)
    k_base = K + hk * skh
    v_base = V + hk * svh
    ks_base = KS + hk * ksch  # this kv head's scales (unused without FP8)
    vs_base = VS + hk * vsch
    bt_row = BT + b.to(tl.int64) * sbt

    m_i = tl.full([BLOCK_M * BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M * BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_M * BLOCK_G, BLOCK_D], tl.float32)
    first = tl.minimum(tile * BLOCK_M, n_new)  # first new token of this tile (clamped)
    # keys [0, prefix + first) are visible to every real row of the tile: unmasked tiles
    full_end = (prefix + first) // BLOCK_N * BLOCK_N
    if tile * BLOCK_M < n_new:
        for start in range(0, full_end, BLOCK_N):
            acc, m_i, l_i = _decode_tile(acc, m_i, l_i, q, k_base, v_base, bt_row, start, offs_n, offs_d, L,
                                         sks, svs, skp, svp, skd, svd, n_pages, qk_scale, ks_base, vs_base, kscp,
                                         kscs, vscp, vscs, PAGE, HEAD_DIM, BLOCK_D, False, FP8)
        end = tl.minimum(prefix + tile * BLOCK_M + BLOCK_M, L)
        for start in range(full_end, end, BLOCK_N):  # the diagonal and the tile's own new tokens
            acc, m_i, l_i = _prefill_masked_tile(acc, m_i, l_i, q, k_base, v_base, bt_row, start, offs_n, offs_d, L,
                                                 row_pos, sks, svs, skp, svp, skd, svd, n_pages, qk_scale, ks_base,
                                                 vs_base, kscp, kscs, vscp, vscs, PAGE, HEAD_DIM, FP8)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    out = tl.where(real[:, None], out, 0.0)
    o_mask = (tok < S)[:, None] & (g < GROUP)[:, None] & (offs_d[None, :] < HEAD_DIM)
    tl.store(O + b.to(tl.int64) * sob + tok[:, None] * sos + heads[:, None] * soh + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=o_mask)


def paged_prefill_triton(q, k_cache, v_cache, block_table, seq_lens, *, q_lens=None, scale=None, config=None,
                         k_scale=None, v_scale=None):
    """The Triton kernel (module docstring); ``config`` overrides ``BLOCK_M``/``BLOCK_N``/warps/stages."""
    B, S, Hq, D = q.shape
    _, ps, Hkv, _ = k_cache.shape
    cfg = configs.launch_config("paged_prefill", interpreter=INTERPRETER_CONFIG, config=config)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out_dtype = q.dtype
    q, k_cache, v_cache, block_table, seq_lens, q_lens = paged_triton_operands(q, k_cache, v_cache, block_table,
                                                                               seq_lens, q_lens)
    ks, vs, ks_strides, vs_strides, fp8 = kv_scale_operands(k_cache, k_scale, v_scale)
    o = torch.empty(B, S, Hq, D, dtype=q.dtype, device=q.device)
    if B * S == 0:
        return o.to(out_dtype)
    G = Hq // Hkv
    BLOCK_G = triton.next_power_of_2(G)
    BLOCK_M = max(cfg["BLOCK_M"], triton.next_power_of_2(max(1, 16 // BLOCK_G)))  # >= 16 rows for tl.dot
    grid = (B * Hkv, triton.cdiv(S, BLOCK_M))
    _paged_prefill_kernel[grid](
        q, k_cache, v_cache, block_table, seq_lens, q_lens if q_lens is not None else seq_lens, o, ks, vs,
        q.stride(0), q.stride(1), q.stride(2), *k_cache.stride(), *v_cache.stride(), block_table.stride(0),
        o.stride(0), o.stride(1), o.stride(2), *ks_strides, *vs_strides, S, Hkv, G, scale * LOG2E, k_cache.shape[0], block_table.shape[1] * ps,
        PAGE=ps, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)), BLOCK_G=BLOCK_G, BLOCK_M=BLOCK_M,
        BLOCK_N=cfg["BLOCK_N"], HAS_QLENS=q_lens is not None, FP8=fp8, num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"])
    return o.to(out_dtype)


def paged_prefill(q, k_cache, v_cache, block_table, seq_lens, *, q_lens=None, scale: float | None = None,
                  impl: str = "triton", config: dict | None = None, check_values: bool = True,
                  k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Prefill of new tokens over their cached prefix, through the block table (module docstring).

    ``check_values=False`` skips, for ``impl="triton"``, the checks that read lengths and page ids
    back to the host; the kernel then clamps them (unspecified output, never a read outside the
    cache; see :mod:`.paged`). The reference and torch impls always check. ``k_scale``/``v_scale``:
    the scales of ``float8_e4m3fn`` caches (required with them, refused without).
    """
    _check_prefill(q, k_cache, v_cache, block_table, seq_lens, q_lens, scale, impl, check_values, k_scale, v_scale)
    kw = dict(q_lens=q_lens, scale=scale, k_scale=k_scale, v_scale=v_scale)
    if impl == "reference":
        return paged_prefill_reference(q, k_cache, v_cache, block_table, seq_lens, **kw)
    if impl == "torch":
        return paged_prefill_torch(q, k_cache, v_cache, block_table, seq_lens, **kw)
    return paged_prefill_triton(q, k_cache, v_cache, block_table, seq_lens, config=config, **kw)
