"""The Triton implementation of :func:`minimax_lab.kvcache.decode.paged_decode`: flash-decoding
(Dao et al. 2023, https://crfm.stanford.edu/2023/10/12/flashdecoding.html) on vLLM's paged
layout (Kwon et al. 2023, arXiv 2309.06180), with its launch configs and split heuristic.

1. **GQA packing.** One program owns one ``(sequence, kv head)`` and *all* ``G = Hq / Hkv``
   query heads of that group as the M dimension of its tiles, so each K/V byte is read from
   memory once for the whole group (not G times) and the scores are a small ``tl.dot``.
2. **Split-K.** With few sequences (B=8) there are only ``B * Hkv`` = 64 such programs, fewer
   than the GPU's SMs, so the context is cut into ``num_splits`` pieces, one program each; each
   writes a partial output (normalised) and its log-sum-exp. ``num_splits`` is chosen on the host
   from ``B * Hkv`` against the SM count (:func:`choose_num_splits`) -- no device sync.
3. **Second pass.** A tiny kernel merges the splits: ``o = sum_s w_s o_s`` with
   ``w_s = exp(lse_s - max lse) / sum(...)``. With one split the first pass writes ``o``
   directly and the second is skipped.
4. **Pages.** Each tile is ``BLOCK_N`` tokens; every token looks its page up in the block
   table (``t // page_size``), so one code path serves page sizes 16-128 whether a tile spans
   several pages or lies inside one.
5. **FP8 caches.** The e4m3 tiles are loaded (half of bf16's bytes) and upcast to q's dtype
   (exact); each key's scale multiplies its column of the scores after the dot, each value's
   scale multiplies P's column before ``P @ V`` (see :func:`_decode_tile`). A per-page scale
   is a per-token one with token stride 0: one kernel for both layouts.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minimax_lab import configs, runtime
from minimax_lab.kvcache.paged import kv_scale_operands, paged_triton_operands
from minimax_lab.triton_blocks import (LOG2E, dot_precision, finish_rows, merge_weights, require_dtypes,
                                       softmax_tile_weights)

@triton.jit
def _decode_tile(acc, m_i, l_i, q, k_base, v_base, bt_row, start, offs_n, offs_d, hi,
                 stride_ks, stride_vs, stride_kp, stride_vp, stride_kd, stride_vd, n_pages, qk_scale, ks_base, vs_base,
                 stride_kscale_p, stride_kscale_s, stride_vscale_p, stride_vscale_s, PAGE: tl.constexpr,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MASKED: tl.constexpr, FP8: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):
    """One tile of ``BLOCK_N`` tokens of the online softmax, for all G heads of the group at once.
    With ``FP8`` the caches are e4m3 and ``ks_base``/``vs_base`` point at this kv head's scales
    (page strides ``stride_k/vscale_p``, token strides ``stride_k/vscale_s``: 0 for per-page
    scales). ``DOT_PRECISION``:
    ``"ieee"`` for fp32 operands (TF32's 10-bit mantissa moves large scores by whole logits when
    keys span many binades, as FP8 scales let them), ``"tf32"`` otherwise (ignored by 16-bit dots)."""
    t = start + offs_n
    if MASKED:
        t_ok = t < hi
        page = tl.load(bt_row + t // PAGE, mask=t_ok, other=0)
    else:
        page = tl.load(bt_row + t // PAGE)  # the page of each token (repeats are served by L1)
    # bounds guard: an unchecked table (check_values=False) never sends a load outside the cache
    page = tl.minimum(tl.maximum(page, 0), n_pages - 1)
    slot = t % PAGE
    # stride_kd/stride_vd: the head_dim strides, 1 for every usual cache (Triton specialises a 1 away)
    k_off = page.to(tl.int64)[:, None] * stride_kp + slot[:, None] * stride_ks + offs_d[None, :] * stride_kd
    v_off = page.to(tl.int64)[:, None] * stride_vp + slot[:, None] * stride_vs + offs_d[None, :] * stride_vd
    if MASKED:
        kv_mask = t_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
        k = tl.load(k_base + k_off, mask=kv_mask, other=0.0)
        v = tl.load(v_base + v_off, mask=kv_mask, other=0.0)
    elif BLOCK_D != HEAD_DIM:
        k = tl.load(k_base + k_off, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        v = tl.load(v_base + v_off, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    else:
        k = tl.load(k_base + k_off)
        v = tl.load(v_base + v_off)
    if FP8:
        # e4m3 -> q's dtype is exact (3 mantissa bits, exponents within fp16/bf16's range): the
        # dots see the stored fp8 values, and memory traffic is half of a bf16 cache's
        k = k.to(q.dtype)
        v = v.to(q.dtype)
        if MASKED:
            ksc = tl.load(ks_base + page.to(tl.int64) * stride_kscale_p + slot * stride_kscale_s, mask=t_ok, other=0.0)
            vsc = tl.load(vs_base + page.to(tl.int64) * stride_vscale_p + slot * stride_vscale_s, mask=t_ok, other=0.0)
        else:
            ksc = tl.load(ks_base + page.to(tl.int64) * stride_kscale_p + slot * stride_kscale_s)
            vsc = tl.load(vs_base + page.to(tl.int64) * stride_vscale_p + slot * stride_vscale_s)
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [BLOCK_H, BLOCK_N]
    if FP8:  # q . (k8 * s) = (q . k8) * s: one scale per key, i.e. per column of the scores
        qk = qk * ksc[None, :]
    if MASKED:
        qk = tl.where(t_ok[None, :], qk, float("-inf"))
    p, alpha, m_new, l_i = softmax_tile_weights(m_i, l_i, qk, qk_scale)
    if FP8:
        # sum_t p_t (v8_t * s_t) = sum_t (p_t * s_t) v8_t: the value scales go on P's columns, a
        # [BLOCK_H, BLOCK_N] tile D/G times smaller than the V tile they would otherwise multiply
        # (l_i above keeps the unscaled p). The scale is a power of two: exact unless p * s falls
        # below fp16's normal range (|v| < ~2**-6 with fp16 queries); bf16 has fp32's exponents.
        p = p * vsc[None, :]
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i


def _decode_smem(a) -> int:
    """The query tile and the K/V tiles of one :func:`_paged_decode_kernel` program."""
    return configs.attention_smem(a["BLOCK_H"], a["BLOCK_N"], a["BLOCK_D"], q_itemsize=a["Q"].element_size(),
                                  kv_itemsize=a["K"].element_size(), num_stages=a["num_stages"])


#: The paged decode's launch: tokens per tile, warps, pipeline stages, and the split heuristic's
#: programs per SM (:func:`choose_num_splits`); the tuner's candidates are changes of the current config.
LAUNCH = configs.Launch(
    op="paged_decode",
    keys=("BLOCK_N", "num_warps", "num_stages", "programs_per_sm"),
    interpreter={"BLOCK_N": 16, "num_warps": 1, "num_stages": 1, "programs_per_sm": 2},
    candidates=[dict(BLOCK_N=n, num_warps=w, num_stages=s) for n, w, s in [
        (32, 4, 2), (32, 4, 3), (32, 4, 4), (64, 4, 2), (64, 4, 3), (64, 4, 4), (64, 8, 2), (64, 8, 3),
        (128, 4, 2), (128, 4, 3), (128, 8, 2), (128, 8, 3)]] + [dict(programs_per_sm=p) for p in (1, 3, 4)],
    quick={"num_warps": 2},
    smem={"_paged_decode_kernel": _decode_smem},
)
INTERPRETER_CONFIG = LAUNCH.interpreter  # the name the bench suites import


@triton.jit
def _paged_decode_kernel(Q, K, V, BT, LENS, O, PART_O, PART_LSE, KS, VS,
                         stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_kd,
                         stride_vp, stride_vs, stride_vh, stride_vd, stride_table_b, stride_ob, stride_oh,
                         stride_kscale_p, stride_kscale_s, stride_kscale_h, stride_vscale_p, stride_vscale_s, stride_vscale_h,
                         Hkv, GROUP, qk_scale, NUM_SPLITS, n_pages, max_len,
                         PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, FP8: tl.constexpr,
                         DOT_PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // Hkv
    hk = pid % Hkv
    L = tl.minimum(tl.maximum(tl.load(LENS + b), 0), max_len)  # bounds guard: block-table reads stay in the row
    # This split's tokens [lo, hi): equal pieces, each a multiple of BLOCK_N long.
    per_split = tl.cdiv(tl.cdiv(L, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * per_split
    hi = tl.minimum(lo + per_split, L)
    full_hi = lo + tl.maximum(hi - lo, 0) // BLOCK_N * BLOCK_N

    offs_h = tl.arange(0, BLOCK_H)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    heads = hk * GROUP + offs_h  # the G query heads of kv head hk, padded to BLOCK_H rows
    h_ok = offs_h < GROUP
    q_mask = h_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=q_mask, other=0.0)
    k_base = K + hk * stride_kh
    v_base = V + hk * stride_vh
    ks_base = KS + hk * stride_kscale_h  # this kv head's scales (unused without FP8)
    vs_base = VS + hk * stride_vscale_h
    bt_row = BT + b.to(tl.int64) * stride_table_b

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for start in range(lo, full_hi, BLOCK_N):  # whole tiles: no masks
        acc, m_i, l_i = _decode_tile(acc, m_i, l_i, q, k_base, v_base, bt_row, start, offs_n, offs_d, hi,
                                     stride_ks, stride_vs, stride_kp, stride_vp, stride_kd, stride_vd, n_pages, qk_scale,
                                     ks_base, vs_base, stride_kscale_p, stride_kscale_s, stride_vscale_p, stride_vscale_s,
                                     PAGE, HEAD_DIM, BLOCK_D, False, FP8, DOT_PRECISION)
    for start in range(full_hi, hi, BLOCK_N):  # the ragged tail (at most one tile)
        acc, m_i, l_i = _decode_tile(acc, m_i, l_i, q, k_base, v_base, bt_row, start, offs_n, offs_d, hi,
                                     stride_ks, stride_vs, stride_kp, stride_vp, stride_kd, stride_vd, n_pages, qk_scale,
                                     ks_base, vs_base, stride_kscale_p, stride_kscale_s, stride_vscale_p, stride_vscale_s,
                                     PAGE, HEAD_DIM, BLOCK_D, True, FP8, DOT_PRECISION)

    out, lse = finish_rows(acc, m_i, l_i)  # no token in this split (or an empty sequence): 0, -inf
    if DIRECT:  # one split: this program's result is final
        o_ptrs = O + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=q_mask)
    else:
        # partials: PART_O [B, Hq, NUM_SPLITS, BLOCK_D] fp32, PART_LSE [B, Hq, NUM_SPLITS] (log2 domain)
        row = (b.to(tl.int64) * (Hkv * GROUP) + heads) * NUM_SPLITS + split
        tl.store(PART_O + row[:, None] * BLOCK_D + offs_d[None, :], out, mask=h_ok[:, None])
        tl.store(PART_LSE + row, lse, mask=h_ok)


@triton.jit
def _merge_splits_kernel(PART_O, PART_LSE, O, Hq, stride_ob, stride_oh, NUM_SPLITS,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    """Second pass: one program per (sequence, query head) merges its splits by their lse."""
    row = tl.program_id(0)  # = b * Hq + h
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < NUM_SPLITS
    lse = tl.load(PART_LSE + row.to(tl.int64) * NUM_SPLITS + offs_s, mask=s_ok, other=float("-inf"))
    m, total = merge_weights(lse)  # all splits empty: weights 0, output 0
    w = tl.math.exp2(lse - m)
    part = tl.load(PART_O + (row.to(tl.int64) * NUM_SPLITS + offs_s[:, None]) * BLOCK_D + offs_d[None, :],
                   mask=s_ok[:, None], other=0.0)
    out = tl.sum(part * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    b = row // Hq
    h = row % Hq
    tl.store(O + b.to(tl.int64) * stride_ob + h * stride_oh + offs_d, out.to(O.dtype.element_ty),
             mask=offs_d < HEAD_DIM)


def sm_count() -> int:
    """Streaming multiprocessors of this device (:func:`minimax_lab.runtime.capabilities`; the
    CPU entry's stand-in under the interpreter)."""
    return runtime.capabilities().sm_count


def choose_num_splits(batch: int, kv_heads: int, max_context: int, *, sms: int, block_n: int,
                      programs_per_sm: int = 2, min_tokens_per_split: int = 512, max_splits: int = 64) -> int:
    """How many pieces to cut each sequence's context into.

    ``batch * kv_heads`` programs exist before splitting; ``sms * programs_per_sm`` can run at
    once. Take the fewest splits whose programs fill at least one such wave and keep the last
    wave >= 85% full (so no SM idles through a long tail), never making a split shorter than
    ``min_tokens_per_split`` tokens (each split costs a partial write and a merge).
    """
    base = max(1, batch * kv_heads)
    slots = max(1, sms * programs_per_sm)
    limit = max(1, min(max_splits, max_context // max(min_tokens_per_split, block_n)))
    best, best_eff = 1, 0.0
    for s in range(1, limit + 1):
        n = base * s
        eff = n / (math.ceil(n / slots) * slots)
        if n >= slots and eff >= 0.85:
            return s
        if eff > best_eff + 1e-9:
            best, best_eff = s, eff
    return best if base * best >= slots or limit == 1 else limit


def paged_decode_triton(q, k_cache, v_cache, block_table, seq_lens, *, scale=None, num_splits=None, config=None,
                        k_scale=None, v_scale=None):
    """The Triton flash-decoding kernel (see the module docstring); ``num_splits``/``config``
    override the host heuristic and the launch config (used by the tuning sweep). bf16 or FP8
    operands on a GPU without them raise :class:`minimax_lab.runtime.UnsupportedOnDevice`."""
    require_dtypes("the paged decode kernel", q, k_cache, v_cache)
    B, Hq, D = q.shape
    _, ps, Hkv, _ = k_cache.shape
    cfg = configs.launch_config(LAUNCH, config=config)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out_dtype = q.dtype
    q, k_cache, v_cache, block_table, seq_lens = paged_triton_operands(q, k_cache, v_cache, block_table, seq_lens)
    ks, vs, ks_strides, vs_strides, fp8 = kv_scale_operands(k_cache, k_scale, v_scale)
    o = torch.empty(B, Hq, D, dtype=q.dtype, device=q.device)
    if B == 0:
        return o.to(out_dtype)
    G = Hq // Hkv
    BLOCK_N = cfg["BLOCK_N"]
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BLOCK_H = max(16, triton.next_power_of_2(G))  # tl.dot needs M >= 16
    max_context = block_table.shape[1] * ps
    if num_splits is None:
        num_splits = choose_num_splits(B, Hkv, max_context, sms=sm_count(), block_n=BLOCK_N,
                                       programs_per_sm=cfg["programs_per_sm"])
    num_splits = max(1, int(num_splits))
    if num_splits > 1:
        part_o = torch.empty(B, Hq, num_splits, BLOCK_D, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(B, Hq, num_splits, dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = o  # unused
    _paged_decode_kernel[(B * Hkv, num_splits)](
        q, k_cache, v_cache, block_table, seq_lens, o, part_o, part_lse, ks, vs,
        q.stride(0), q.stride(1), *k_cache.stride(), *v_cache.stride(), block_table.stride(0), o.stride(0), o.stride(1),
        *ks_strides, *vs_strides, Hkv, G, scale * LOG2E, num_splits, k_cache.shape[0], max_context,
        PAGE=ps, HEAD_DIM=D, BLOCK_D=BLOCK_D, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, DIRECT=num_splits == 1, FP8=fp8,
        DOT_PRECISION=dot_precision(q.dtype), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if num_splits > 1:
        _merge_splits_kernel[(B * Hq,)](part_o, part_lse, o, Hq, o.stride(0), o.stride(1), num_splits,
                                        HEAD_DIM=D, BLOCK_D=BLOCK_D,
                                        BLOCK_S=max(2, triton.next_power_of_2(num_splits)), num_warps=4)
    return o.to(out_dtype)
