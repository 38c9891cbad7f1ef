"""The Triton implementation of :func:`minimax_lab.paged_kv.decode.paged_decode`: flash-decoding
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
5. **FP8 caches** (e4m3, :func:`_fp8_tile` and :func:`minimax_lab.triton_blocks.fp8_attend_tile`).
   With half the bytes per token, what the bf16 kernel does per byte costs twice as much, so
   the FP8 path keeps everything but the loads out of the inner loop: the dots run in fp16
   (e4m3 -> fp16 is one instruction per pair, e4m3 -> bf16 goes through fp32), each bf16 query
   row moved into fp16's range by an exact power of two that is folded back into the row's
   softmax scale; the key scales multiply score columns (or fold into that scale when one
   scale covers the tile), the value scales P's columns (or the tile's ``P @ V``); each tile is
   converted once for all G query heads of its group. Tiles are gathered by a scalar page id
   when they lie inside one page (``page_size % BLOCK_N == 0``), by one page id per page
   (``GATHER="page"``) or by one per token. The FP8 path has its own launch block
   (:data:`FP8_LAUNCH`, op ``paged_decode_fp8``): half the bytes per tile change the best tile
   width and split count. fp32 queries keep fp32 dots (exact products, ``"ieee"``).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minimax_lab import configs, runtime
from minimax_lab.paged_kv.layout import kv_scale_operands, paged_triton_operands
from minimax_lab.triton_blocks import (LOG2E, dot_precision, finish_rows, fp8_attend_tile, fp8_query,
                                       merge_weights, require_dtypes, softmax_tile_weights)

@triton.jit
def _decode_tile(acc, m_i, l_i, q, k_base, v_base, bt_row, start, offs_n, offs_d, hi,
                 stride_ks, stride_vs, stride_kp, stride_vp, stride_kd, stride_vd, n_pages, qk_scale,
                 PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MASKED: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):
    """One tile of ``BLOCK_N`` tokens of the online softmax, for all G heads of the group at once
    (caches of q's dtype). ``DOT_PRECISION``: ``"ieee"`` for fp32 operands, ``"tf32"`` otherwise
    (ignored by 16-bit dots)."""
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
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [BLOCK_H, BLOCK_N]
    if MASKED:
        qk = tl.where(t_ok[None, :], qk, float("-inf"))
    p, alpha, m_new, l_i = softmax_tile_weights(m_i, l_i, qk, qk_scale)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i


#: how an FP8 tile finds its pages (the ``GATHER`` constexpr of :func:`_fp8_tile`)
GATHER_TOKEN, GATHER_PAGE, GATHER_TILE = 0, 1, 2
GATHER_NAMES = {"token": GATHER_TOKEN, "page": GATHER_PAGE}


def gather_mode(page_size: int, block_n: int, wanted: str = "token") -> int:
    """The gather of an FP8 tile of ``block_n`` tokens (tiles start at multiples of ``block_n``):
    :data:`GATHER_TILE` when every tile lies inside one page (one page id per tile), else
    ``wanted`` -- ``"page"`` (one page id per page of the tile, where whole pages of a power-of-two
    size make up the tile) or ``"token"`` (one per token). Raises ``ValueError`` for another name."""
    if wanted not in GATHER_NAMES:
        raise ValueError(f"GATHER must be one of {sorted(GATHER_NAMES)}, got {wanted!r}")
    if page_size % block_n == 0:
        return GATHER_TILE
    if wanted == "page" and block_n % page_size == 0 and page_size & (page_size - 1) == 0:
        return GATHER_PAGE
    return GATHER_TOKEN


@triton.jit
def _load_kv(k_ptr, v_ptr, mask):
    """The K and V tiles at ``k_ptr``/``v_ptr`` (``mask``: ``None`` for a whole tile, else 0 where False)."""
    if mask is None:
        k = tl.load(k_ptr)
        v = tl.load(v_ptr)
    else:
        k = tl.load(k_ptr, mask=mask, other=0.0)
        v = tl.load(v_ptr, mask=mask, other=0.0)
    return k, v


@triton.jit
def _fp8_tile(k_base, v_base, ks_base, vs_base, bt_row, start, hi, offs_d, n_pages,
              stride_kp, stride_ks, stride_kd, stride_vp, stride_vs, stride_vd,
              stride_kscale_p, stride_kscale_s, stride_vscale_p, stride_vscale_s,
              PAGE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              MASKED: tl.constexpr, GATHER: tl.constexpr, PAGE_SCALES: tl.constexpr, TILE_SCALES: tl.constexpr):
    """Tokens ``[start, start + BLOCK_N)`` of one kv head of an FP8 cache (those ``>= hi`` masked
    when ``MASKED``): ``(k8, v8 [BLOCK_N, BLOCK_D] e4m3, k_scale, v_scale, t_ok [BLOCK_N])``. The
    scales are one scalar each where a single scale covers the tile (``TILE_SCALES``:
    ``GATHER_TILE`` with per-page scales, ``PAGE_SCALES``), else ``[BLOCK_N]`` (a per-page scale
    repeated over its tokens).
    Page ids are clamped into ``[0, n_pages)`` (unchecked tables never read outside the cache)."""
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM
    t_ok = start + offs_n < hi
    if GATHER == 1:  # whole pages: one table load per page, a [pages, PAGE, D] tile seen as [BLOCK_N, D]
        pi = tl.arange(0, BLOCK_N // PAGE)
        si = tl.arange(0, PAGE)
        tok_ok = (start + pi[:, None] * PAGE + si[None, :]) < hi  # [pages, PAGE]
        idx = start // PAGE + pi
        page = tl.load(bt_row + idx, mask=idx * PAGE < hi, other=0)
        page = tl.minimum(tl.maximum(page, 0), n_pages - 1).to(tl.int64)
        if MASKED:
            mask = tok_ok[:, :, None] & d_ok[None, None, :]
        elif BLOCK_D != HEAD_DIM:
            mask = d_ok[None, None, :]
        else:
            mask = None
        k8, v8 = _load_kv(k_base + page[:, None, None] * stride_kp + si[None, :, None] * stride_ks
                          + offs_d[None, None, :] * stride_kd,
                          v_base + page[:, None, None] * stride_vp + si[None, :, None] * stride_vs
                          + offs_d[None, None, :] * stride_vd, mask)
        k8 = tl.reshape(k8, (BLOCK_N, BLOCK_D))
        v8 = tl.reshape(v8, (BLOCK_N, BLOCK_D))
        if PAGE_SCALES:
            ksc = tl.load(ks_base + page * stride_kscale_p, mask=idx * PAGE < hi, other=0.0)
            vsc = tl.load(vs_base + page * stride_vscale_p, mask=idx * PAGE < hi, other=0.0)
            ksc = tl.reshape(tl.broadcast_to(ksc[:, None], (BLOCK_N // PAGE, PAGE)), (BLOCK_N,))
            vsc = tl.reshape(tl.broadcast_to(vsc[:, None], (BLOCK_N // PAGE, PAGE)), (BLOCK_N,))
        else:
            ksc = tl.load(ks_base + page[:, None] * stride_kscale_p + si[None, :] * stride_kscale_s, mask=tok_ok,
                          other=0.0)
            vsc = tl.load(vs_base + page[:, None] * stride_vscale_p + si[None, :] * stride_vscale_s, mask=tok_ok,
                          other=0.0)
            ksc = tl.reshape(ksc, (BLOCK_N,))
            vsc = tl.reshape(vsc, (BLOCK_N,))
    else:
        if GATHER == 2:  # the tile lies in one page: one table load, one row offset per token
            page = tl.load(bt_row + start // PAGE)
            slot = start % PAGE + offs_n
        elif MASKED:  # one table load per token (repeats are served by L1)
            page = tl.load(bt_row + (start + offs_n) // PAGE, mask=t_ok, other=0)
            slot = (start + offs_n) % PAGE
        else:
            page = tl.load(bt_row + (start + offs_n) // PAGE)
            slot = (start + offs_n) % PAGE
        page = tl.minimum(tl.maximum(page, 0), n_pages - 1).to(tl.int64)
        k_rows = k_base + page * stride_kp + slot * stride_ks
        v_rows = v_base + page * stride_vp + slot * stride_vs
        if MASKED:
            mask = t_ok[:, None] & d_ok[None, :]
        elif BLOCK_D != HEAD_DIM:
            mask = d_ok[None, :]
        else:
            mask = None
        k8, v8 = _load_kv(k_rows[:, None] + offs_d[None, :] * stride_kd, v_rows[:, None] + offs_d[None, :] * stride_vd,
                          mask)
        if TILE_SCALES:  # per-page scales, the tile in one page: one scale each
            ksc = tl.load(ks_base + page * stride_kscale_p)
            vsc = tl.load(vs_base + page * stride_vscale_p)
        elif MASKED:
            ksc = tl.load(ks_base + page * stride_kscale_p + slot * stride_kscale_s, mask=t_ok, other=0.0)
            vsc = tl.load(vs_base + page * stride_vscale_p + slot * stride_vscale_s, mask=t_ok, other=0.0)
        else:
            ksc = tl.load(ks_base + page * stride_kscale_p + slot * stride_kscale_s)
            vsc = tl.load(vs_base + page * stride_vscale_p + slot * stride_vscale_s)
    return k8, v8, ksc, vsc, t_ok


def _decode_smem(a) -> int:
    """The query tile and the K/V tiles of one :func:`_paged_decode_kernel` program; FP8 tiles are
    staged in e4m3 and once more in fp16 for the dots."""
    if a.get("FP8"):
        kv16 = configs.tile_bytes((a["BLOCK_N"], a["BLOCK_D"]), itemsize=2)
        return configs.attention_smem(a["BLOCK_H"], a["BLOCK_N"], a["BLOCK_D"], q_itemsize=2,
                                      kv_itemsize=1, num_stages=a["num_stages"]) + 2 * kv16
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

#: The FP8 paged decode's launch (e4m3 caches): the keys of :data:`LAUNCH` plus ``GATHER``
#: (``"token"`` or ``"page"``, see :func:`gather_mode`). A tile of FP8 tokens is half the bytes
#: of a bf16 one, so the candidates reach wider tiles, more stages and more programs per SM (more
#: bytes in flight per SM).
FP8_LAUNCH = configs.Launch(
    op="paged_decode_fp8",
    keys=("BLOCK_N", "num_warps", "num_stages", "programs_per_sm", "GATHER"),
    interpreter={"BLOCK_N": 16, "num_warps": 1, "num_stages": 1, "programs_per_sm": 2, "GATHER": "token"},
    candidates=[dict(BLOCK_N=n, num_warps=w, num_stages=s) for n, w, s in [
        (64, 4, 2), (64, 4, 3), (64, 4, 4), (128, 4, 2), (128, 4, 3), (128, 4, 4), (128, 8, 2), (128, 8, 3),
        (256, 4, 2), (256, 8, 2), (256, 8, 3)]] + [dict(programs_per_sm=p) for p in (1, 3, 4)]
               + [dict(GATHER="page")],
    quick={"BLOCK_N": 128},
    smem={"_paged_decode_kernel": _decode_smem},
)


@triton.jit
def _paged_decode_kernel(Q, K, V, BT, LENS, O, PART_O, PART_LSE, KS, VS,
                         stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_kd,
                         stride_vp, stride_vs, stride_vh, stride_vd, stride_table_b, stride_ob, stride_oh,
                         stride_kscale_p, stride_kscale_s, stride_kscale_h, stride_vscale_p, stride_vscale_s, stride_vscale_h,
                         Hkv, GROUP, qk_scale, NUM_SPLITS, n_pages, max_len,
                         PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, FP8: tl.constexpr,
                         DOT_PRECISION: tl.constexpr, GATHER: tl.constexpr = 0, PAGE_SCALES: tl.constexpr = False,
                         TILE_SCALES: tl.constexpr = False, FP16_DOT: tl.constexpr = False):
    # FP8: e4m3 caches with scales KS/VS (this path's constexprs: GATHER; PAGE_SCALES, per-page
    # scales; TILE_SCALES, one scale per tile; FP16_DOT, 16-bit queries and dots in fp16); without
    # FP8, KS/VS are unused
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
    bt_row = BT + b.to(tl.int64) * stride_table_b

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    if FP8:
        ks_base = KS + hk * stride_kscale_h  # this kv head's scales
        vs_base = VS + hk * stride_vscale_h
        q, row_f = fp8_query(q, qk_scale, FP16_DOT)  # q16 * 2**shift == q; the shift joins row_f
        for start in range(lo, full_hi, BLOCK_N):  # whole tiles: no masks
            k8, v8, ksc, vsc, t_ok = _fp8_tile(k_base, v_base, ks_base, vs_base, bt_row, start, hi, offs_d, n_pages,
                                               stride_kp, stride_ks, stride_kd, stride_vp, stride_vs, stride_vd,
                                               stride_kscale_p, stride_kscale_s, stride_vscale_p, stride_vscale_s,
                                               PAGE, BLOCK_N, HEAD_DIM, BLOCK_D, False, GATHER, PAGE_SCALES,
                                               TILE_SCALES)
            acc, m_i, l_i = fp8_attend_tile(acc, m_i, l_i, q, k8, v8, ksc, vsc, row_f, t_ok[None, :], False,
                                            TILE_SCALES, DOT_PRECISION)
        for start in range(full_hi, hi, BLOCK_N):  # the ragged tail (at most one tile)
            k8, v8, ksc, vsc, t_ok = _fp8_tile(k_base, v_base, ks_base, vs_base, bt_row, start, hi, offs_d, n_pages,
                                               stride_kp, stride_ks, stride_kd, stride_vp, stride_vs, stride_vd,
                                               stride_kscale_p, stride_kscale_s, stride_vscale_p, stride_vscale_s,
                                               PAGE, BLOCK_N, HEAD_DIM, BLOCK_D, True, GATHER, PAGE_SCALES,
                                               TILE_SCALES)
            acc, m_i, l_i = fp8_attend_tile(acc, m_i, l_i, q, k8, v8, ksc, vsc, row_f, t_ok[None, :], True,
                                            TILE_SCALES, DOT_PRECISION)
    else:
        for start in range(lo, full_hi, BLOCK_N):  # whole tiles: no masks
            acc, m_i, l_i = _decode_tile(acc, m_i, l_i, q, k_base, v_base, bt_row, start, offs_n, offs_d, hi,
                                         stride_ks, stride_vs, stride_kp, stride_vp, stride_kd, stride_vd, n_pages,
                                         qk_scale, PAGE, HEAD_DIM, BLOCK_D, False, DOT_PRECISION)
        for start in range(full_hi, hi, BLOCK_N):  # the ragged tail (at most one tile)
            acc, m_i, l_i = _decode_tile(acc, m_i, l_i, q, k_base, v_base, bt_row, start, offs_n, offs_d, hi,
                                         stride_ks, stride_vs, stride_kp, stride_vp, stride_kd, stride_vd, n_pages,
                                         qk_scale, PAGE, HEAD_DIM, BLOCK_D, True, DOT_PRECISION)

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
    override the host heuristic and the launch config (used by the tuning sweep; FP8 caches take
    :data:`FP8_LAUNCH`'s keys). bf16 or FP8 operands on a GPU without them raise
    :class:`minimax_lab.runtime.UnsupportedOnDevice`; an unknown ``GATHER`` raises ``ValueError``."""
    require_dtypes("the paged decode kernel", q, k_cache, v_cache)
    B, Hq, D = q.shape
    _, ps, Hkv, _ = k_cache.shape
    cfg = configs.launch_config(FP8_LAUNCH if k_scale is not None else LAUNCH, config=config)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out_dtype = q.dtype
    fp16_dot = q.dtype in (torch.bfloat16, torch.float16)  # decided before the interpreter's fp32 upcast
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
    fp8_args = {}
    if fp8:
        gather = gather_mode(ps, BLOCK_N, cfg.get("GATHER", "token"))
        page_scales = k_scale.ndim == 2
        fp8_args = dict(GATHER=gather, PAGE_SCALES=page_scales, TILE_SCALES=page_scales and gather == GATHER_TILE,
                        FP16_DOT=fp16_dot)
    _paged_decode_kernel[(B * Hkv, num_splits)](
        q, k_cache, v_cache, block_table, seq_lens, o, part_o, part_lse, ks, vs,
        q.stride(0), q.stride(1), *k_cache.stride(), *v_cache.stride(), block_table.stride(0), o.stride(0), o.stride(1),
        *ks_strides, *vs_strides, Hkv, G, scale * LOG2E, num_splits, k_cache.shape[0], max_context,
        PAGE=ps, HEAD_DIM=D, BLOCK_D=BLOCK_D, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, DIRECT=num_splits == 1, FP8=fp8,
        DOT_PRECISION="ieee" if fp8 and not fp16_dot else dot_precision(q.dtype), **fp8_args,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if num_splits > 1:
        _merge_splits_kernel[(B * Hq,)](part_o, part_lse, o, Hq, o.stride(0), o.stride(1), num_splits,
                                        HEAD_DIM=D, BLOCK_D=BLOCK_D,
                                        BLOCK_S=max(2, triton.next_power_of_2(num_splits)), num_warps=4)
    return o.to(out_dtype)
