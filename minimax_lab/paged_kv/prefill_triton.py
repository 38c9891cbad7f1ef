"""The Triton implementation of :func:`minimax_lab.paged_kv.prefill.paged_prefill`: one program
per (sequence, kv head, tile of ``BLOCK_M`` new tokens), the tile's ``BLOCK_M x G`` (token, query
head) rows packed into one M dimension so each K/V tile is read once per GQA group. Key tiles
every row can see (the prefix up to the tile's first token) run unmasked -- the same tile step
as the decode kernel -- and only the tiles that cross the causal diagonal apply the mask. FP8
tiles are upcast to q's dtype and scaled as in the decode kernel
(:func:`.decode_triton._decode_tile`).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minimax_lab import configs
from minimax_lab.paged_kv.decode_triton import GATHER_TILE, _decode_tile, _fp8_tile, gather_mode
from minimax_lab.paged_kv.layout import kv_scale_operands, paged_triton_operands
from minimax_lab.triton_blocks import (LOG2E, dot_precision, finish_rows, fp8_attend_tile, fp8_query, require_dtypes,
                                       softmax_tile_weights)

@triton.jit
def _prefill_masked_tile(acc, m_i, l_i, q, k_base, v_base, bt_row, start, offs_n, offs_d, L, row_pos,
                         stride_ks, stride_vs, stride_kp, stride_vp, stride_kd, stride_vd, n_pages, qk_scale,
                         PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """A key tile crossing the causal diagonal: row r sees key t only if t <= row_pos[r] (< L)."""
    t = start + offs_n
    t_ok = t < L
    page = tl.load(bt_row + t // PAGE, mask=t_ok, other=0)
    page = tl.minimum(tl.maximum(page, 0), n_pages - 1)  # bounds guard, as in _decode_tile
    slot = t % PAGE
    kv_mask = t_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(k_base + page.to(tl.int64)[:, None] * stride_kp + slot[:, None] * stride_ks + offs_d[None, :] * stride_kd,
                mask=kv_mask, other=0.0)
    v = tl.load(v_base + page.to(tl.int64)[:, None] * stride_vp + slot[:, None] * stride_vs + offs_d[None, :] * stride_vd,
                mask=kv_mask, other=0.0)
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    qk = tl.where(t[None, :] <= row_pos[:, None], qk, float("-inf"))  # padding rows see nothing
    p, alpha, m_new, l_i = softmax_tile_weights(m_i, l_i, qk, qk_scale)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i


def _prefill_smem(a) -> int:
    """The packed query tile and the K/V tiles of one :func:`_paged_prefill_kernel` program."""
    rows = a["BLOCK_M"] * a["BLOCK_G"]
    if a.get("FP8"):  # e4m3 tiles, staged once more in fp16 for the dots
        kv16 = configs.tile_bytes((a["BLOCK_N"], a["BLOCK_D"]), itemsize=2)
        return configs.attention_smem(rows, a["BLOCK_N"], a["BLOCK_D"], q_itemsize=2, kv_itemsize=1,
                                      num_stages=a["num_stages"]) + 2 * kv16
    return configs.attention_smem(rows, a["BLOCK_N"], a["BLOCK_D"], q_itemsize=a["Q"].element_size(),
                                  kv_itemsize=a["K"].element_size(), num_stages=a["num_stages"])


#: The paged prefill's launch: new tokens per tile, keys per tile, warps, pipeline stages.
LAUNCH = configs.Launch(
    op="paged_prefill",
    keys=("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"),
    interpreter={"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 1, "num_stages": 1},
    candidates=[dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=st) for m, n, w, st in [
        (16, 64, 4, 3), (16, 64, 4, 2), (16, 128, 4, 2), (32, 64, 8, 3), (32, 64, 8, 2), (32, 128, 8, 2),
        (32, 64, 4, 2), (64, 64, 8, 2)]],
    quick={"num_warps": 2},
    smem={"_paged_prefill_kernel": _prefill_smem},
)
INTERPRETER_CONFIG = LAUNCH.interpreter  # the name the bench suites import


@triton.jit
def _paged_prefill_kernel(Q, K, V, BT, LENS, QLENS, O, KS, VS,
                          stride_qb, stride_qs, stride_qh, stride_kp, stride_ks, stride_kh, stride_kd,
                          stride_vp, stride_vs, stride_vh, stride_vd, stride_table_b, stride_ob, stride_os, stride_oh,
                          stride_kscale_p, stride_kscale_s, stride_kscale_h,
                          stride_vscale_p, stride_vscale_s, stride_vscale_h,
                          S, Hkv, GROUP, qk_scale, n_pages, max_len,
                          PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_G: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_QLENS: tl.constexpr, FP8: tl.constexpr,
                          DOT_PRECISION: tl.constexpr, GATHER: tl.constexpr = 0, PAGE_SCALES: tl.constexpr = False,
                          TILE_SCALES: tl.constexpr = False, FP16_DOT: tl.constexpr = False):
    # FP8: e4m3 caches, as in the decode kernel (GATHER, PAGE_SCALES, TILE_SCALES, FP16_DOT there)
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
    q_rows = Q + b.to(tl.int64) * stride_qb + tok[:, None] * stride_qs + heads[:, None] * stride_qh
    q = tl.load(q_rows + offs_d[None, :], mask=q_mask, other=0.0)
    k_base = K + hk * stride_kh
    v_base = V + hk * stride_vh
    bt_row = BT + b.to(tl.int64) * stride_table_b

    m_i = tl.full([BLOCK_M * BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M * BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_M * BLOCK_G, BLOCK_D], tl.float32)
    first = tl.minimum(tile * BLOCK_M, n_new)  # first new token of this tile (clamped)
    # keys [0, prefix + first) are visible to every real row of the tile: unmasked tiles
    full_end = (prefix + first) // BLOCK_N * BLOCK_N
    end = tl.minimum(prefix + tile * BLOCK_M + BLOCK_M, L)
    if FP8:  # (outside the runtime branch below: q changes its type)
        ks_base = KS + hk * stride_kscale_h  # this kv head's scales
        vs_base = VS + hk * stride_vscale_h
        q, row_f = fp8_query(q, qk_scale, FP16_DOT)  # each packed row moved into fp16's range
    if tile * BLOCK_M < n_new:
        if FP8:
            for start in range(0, full_end, BLOCK_N):
                k8, v8, ksc, vsc, t_ok = _fp8_tile(k_base, v_base, ks_base, vs_base, bt_row, start, L, offs_d,
                                                   n_pages, stride_kp, stride_ks, stride_kd, stride_vp, stride_vs,
                                                   stride_vd, stride_kscale_p, stride_kscale_s, stride_vscale_p,
                                                   stride_vscale_s, PAGE, BLOCK_N, HEAD_DIM, BLOCK_D, False, GATHER,
                                                   PAGE_SCALES, TILE_SCALES)
                acc, m_i, l_i = fp8_attend_tile(acc, m_i, l_i, q, k8, v8, ksc, vsc, row_f, t_ok[None, :], False,
                                                TILE_SCALES, DOT_PRECISION)
            for start in range(full_end, end, BLOCK_N):  # the diagonal and the tile's own new tokens
                k8, v8, ksc, vsc, t_ok = _fp8_tile(k_base, v_base, ks_base, vs_base, bt_row, start, L, offs_d,
                                                   n_pages, stride_kp, stride_ks, stride_kd, stride_vp, stride_vs,
                                                   stride_vd, stride_kscale_p, stride_kscale_s, stride_vscale_p,
                                                   stride_vscale_s, PAGE, BLOCK_N, HEAD_DIM, BLOCK_D, True, GATHER,
                                                   PAGE_SCALES, TILE_SCALES)
                visible = (start + offs_n)[None, :] <= row_pos[:, None]  # padding rows see nothing
                acc, m_i, l_i = fp8_attend_tile(acc, m_i, l_i, q, k8, v8, ksc, vsc, row_f, visible, True,
                                                TILE_SCALES, DOT_PRECISION)
        else:
            for start in range(0, full_end, BLOCK_N):
                acc, m_i, l_i = _decode_tile(acc, m_i, l_i, q, k_base, v_base, bt_row, start, offs_n, offs_d, L,
                                             stride_ks, stride_vs, stride_kp, stride_vp, stride_kd, stride_vd, n_pages,
                                             qk_scale, PAGE, HEAD_DIM, BLOCK_D, False, DOT_PRECISION)
            for start in range(full_end, end, BLOCK_N):  # the diagonal and the tile's own new tokens
                acc, m_i, l_i = _prefill_masked_tile(acc, m_i, l_i, q, k_base, v_base, bt_row, start, offs_n, offs_d,
                                                     L, row_pos, stride_ks, stride_vs, stride_kp, stride_vp, stride_kd,
                                                     stride_vd, n_pages, qk_scale, PAGE, HEAD_DIM, DOT_PRECISION)
    out, _ = finish_rows(acc, m_i, l_i)
    out = tl.where(real[:, None], out, 0.0)
    o_mask = (tok < S)[:, None] & (g < GROUP)[:, None] & (offs_d[None, :] < HEAD_DIM)
    o_rows = O + b.to(tl.int64) * stride_ob + tok[:, None] * stride_os + heads[:, None] * stride_oh
    tl.store(o_rows + offs_d[None, :], out.to(O.dtype.element_ty), mask=o_mask)


def paged_prefill_triton(q, k_cache, v_cache, block_table, seq_lens, *, q_lens=None, scale=None, config=None,
                         k_scale=None, v_scale=None):
    """The Triton kernel (module docstring); ``config`` overrides ``BLOCK_M``/``BLOCK_N``/warps/stages.
    bf16 or FP8 operands on a GPU without them raise :class:`minimax_lab.runtime.UnsupportedOnDevice`."""
    require_dtypes("the paged prefill kernel", q, k_cache, v_cache)
    B, S, Hq, D = q.shape
    _, ps, Hkv, _ = k_cache.shape
    cfg = configs.launch_config(LAUNCH, config=config)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out_dtype = q.dtype
    fp16_dot = q.dtype in (torch.bfloat16, torch.float16)  # decided before the interpreter's fp32 upcast
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
    fp8_args = {}
    if fp8:
        gather = gather_mode(ps, cfg["BLOCK_N"])
        page_scales = k_scale.ndim == 2
        fp8_args = dict(GATHER=gather, PAGE_SCALES=page_scales, TILE_SCALES=page_scales and gather == GATHER_TILE,
                        FP16_DOT=fp16_dot)
    _paged_prefill_kernel[grid](
        q, k_cache, v_cache, block_table, seq_lens, q_lens if q_lens is not None else seq_lens, o, ks, vs,
        q.stride(0), q.stride(1), q.stride(2), *k_cache.stride(), *v_cache.stride(), block_table.stride(0),
        o.stride(0), o.stride(1), o.stride(2), *ks_strides, *vs_strides, S, Hkv, G, scale * LOG2E, k_cache.shape[0],
        block_table.shape[1] * ps,
        PAGE=ps, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)), BLOCK_G=BLOCK_G, BLOCK_M=BLOCK_M,
        BLOCK_N=cfg["BLOCK_N"], HAS_QLENS=q_lens is not None, FP8=fp8,
        DOT_PRECISION="ieee" if fp8 and not fp16_dot else dot_precision(q.dtype), **fp8_args,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"])
    return o.to(out_dtype)
