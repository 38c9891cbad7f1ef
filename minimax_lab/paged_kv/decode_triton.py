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
5. **FP8 caches** (e4m3): a kernel of their own, :func:`_paged_decode_fp8_kernel`, built from the
   same prologue and epilogue with :func:`_fp8_tile` and :func:`minimax_lab.triton_blocks.fp8_attend_tile`.
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

The kernels take each cache's strides as one tuple ``(page, slot, head, dim)`` (``kv_strides``: K's
and V's; ``scale_strides``: the scales' ``(page, slot, head)``); Triton specialises a stride of 1
inside a tuple as it does a separate argument. The query and the output share one dense layout
(``row_strides``).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minimax_lab import configs, runtime
from minimax_lab.paged_kv.layout import kv_scale_operands, paged_triton_operands
from minimax_lab.triton_blocks import (LOG2E, dot_precision, finish_rows, fp8_attend_tile, fp8_attend_tile_plain,
                                       fp8_query, merge_weights, require_dtypes, softmax_tile_weights)


@triton.jit
def _kv_ptrs(kv, kv_strides, page, slot, offs_d):
    """Pointers to the K and V entries ``(page, slot, offs_d)`` of one kv head (the three broadcast
    against each other): ``kv`` its (K, V) base pointers, ``kv_strides`` the caches' (page, slot,
    head, dim) strides; the dim strides are 1 for every usual cache (Triton specialises a 1 away)."""
    k_str = kv_strides[0]
    v_str = kv_strides[1]
    return (kv[0] + page * k_str[0] + slot * k_str[1] + offs_d * k_str[3],
            kv[1] + page * v_str[0] + slot * v_str[1] + offs_d * v_str[3])


@triton.jit
def _load_kv(ptrs, mask):
    """The K and V tiles at ``ptrs`` (a pair, :func:`_kv_ptrs`); ``mask``: ``None`` for a whole
    tile, else 0 where False."""
    if mask is None:
        k = tl.load(ptrs[0])
        v = tl.load(ptrs[1])
    else:
        k = tl.load(ptrs[0], mask=mask, other=0.0)
        v = tl.load(ptrs[1], mask=mask, other=0.0)
    return k, v


@triton.jit
def _tile_mask(t_ok, d_ok, MASKED: tl.constexpr, ALL_D: tl.constexpr):
    """The load mask of a K/V tile: ``t_ok & d_ok`` (shapes that broadcast) for a ``MASKED`` tile,
    ``d_ok`` where the padded head dim has columns past the real one (``ALL_D`` False), else ``None``."""
    if MASKED:
        mask = t_ok & d_ok
    elif ALL_D:
        mask = None
    else:
        mask = d_ok
    return mask


@triton.jit
def _decode_tile(acc, m_i, l_i, q, kv, kv_strides, bt_row, start, hi, last, n_pages, qk_scale,
                 PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Tokens ``[start, start + BLOCK_N)`` through the online softmax, for every row of ``q`` (the G
    heads of a group, or a prefill's packed rows) at once; caches of q's dtype. A ``MASKED`` tile
    loads no token ``>= hi`` and row ``r`` sees only keys ``<= last[r]``. ``DOT_PRECISION``:
    ``"ieee"`` for fp32 operands, ``"tf32"`` otherwise (ignored by 16-bit dots)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    t = start + offs_n
    if MASKED:
        t_ok = t < hi
        page = tl.load(bt_row + t // PAGE, mask=t_ok, other=0)
    else:
        page = tl.load(bt_row + t // PAGE)  # the page of each token (repeats are served by L1)
    # bounds guard: an unchecked table (check_values=False) never sends a load outside the cache
    page = tl.minimum(tl.maximum(page, 0), n_pages - 1)
    slot = t % PAGE
    ptrs = _kv_ptrs(kv, kv_strides, page.to(tl.int64)[:, None], slot[:, None], offs_d[None, :])
    k, v = _load_kv(ptrs, _tile_mask((t < hi)[:, None], offs_d[None, :] < HEAD_DIM, MASKED, BLOCK_D == HEAD_DIM))
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [rows, BLOCK_N]
    if MASKED:
        qk = tl.where(t[None, :] <= last[:, None], qk, float("-inf"))
    p, alpha, m_new, l_i = softmax_tile_weights(m_i, l_i, qk, qk_scale)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _attend_keys(acc, m_i, l_i, q, kv, kv_strides, bt_row, lo, full, end, hi, last, n_pages, qk_scale,
                 PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):
    """Keys ``[lo, end)`` of one kv head through :func:`_decode_tile`: whole tiles every row sees up
    to ``full`` without masks, then the masked ones (tokens ``< hi``, row ``r`` keys ``<= last[r]``)."""
    for start in range(lo, full, BLOCK_N):
        acc, m_i, l_i = _decode_tile(acc, m_i, l_i, q, kv, kv_strides, bt_row, start, hi, last, n_pages, qk_scale,
                                     PAGE, HEAD_DIM, BLOCK_N, BLOCK_D, False, DOT_PRECISION)
    for start in range(full, end, BLOCK_N):
        acc, m_i, l_i = _decode_tile(acc, m_i, l_i, q, kv, kv_strides, bt_row, start, hi, last, n_pages, qk_scale,
                                     PAGE, HEAD_DIM, BLOCK_N, BLOCK_D, True, DOT_PRECISION)
    return acc, m_i, l_i


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
def _fp8_tile(kv, kv_strides, scales, scale_strides, bt_row, start, hi, n_pages,
              PAGE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              MASKED: tl.constexpr, GATHER: tl.constexpr, PAGE_SCALES: tl.constexpr):
    """Tokens ``[start, start + BLOCK_N)`` of one kv head of an FP8 cache (those ``>= hi`` masked
    when ``MASKED``): ``(k8, v8 [BLOCK_N, BLOCK_D] e4m3, k_scale, v_scale)``; ``scales`` are this
    head's (K, V) scale pointers, ``scale_strides`` their (page, slot, head) strides. The scales
    are one scalar each where a single scale covers the tile (``GATHER == 2`` with per-page scales,
    ``PAGE_SCALES``), else ``[BLOCK_N]`` (a per-page scale repeated over its tokens).
    Page ids are clamped into ``[0, n_pages)`` (unchecked tables never read outside the cache)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    ks_str = scale_strides[0]
    vs_str = scale_strides[1]
    if GATHER == 1:  # whole pages: one table load per page, a [pages, PAGE, D] tile seen as [BLOCK_N, D]
        pi = tl.arange(0, BLOCK_N // PAGE)
        si = tl.arange(0, PAGE)
        tok_ok = (start + pi[:, None] * PAGE + si[None, :]) < hi  # [pages, PAGE]
        idx = start // PAGE + pi
        page = tl.load(bt_row + idx, mask=idx * PAGE < hi, other=0)
        page = tl.minimum(tl.maximum(page, 0), n_pages - 1).to(tl.int64)
        ptrs = _kv_ptrs(kv, kv_strides, page[:, None, None], si[None, :, None], offs_d[None, None, :])
        k8, v8 = _load_kv(ptrs, _tile_mask(tok_ok[:, :, None], d_ok[None, None, :], MASKED, BLOCK_D == HEAD_DIM))
        k8 = tl.reshape(k8, (BLOCK_N, BLOCK_D))
        v8 = tl.reshape(v8, (BLOCK_N, BLOCK_D))
        if PAGE_SCALES:
            ksc = tl.load(scales[0] + page * ks_str[0], mask=idx * PAGE < hi, other=0.0)
            vsc = tl.load(scales[1] + page * vs_str[0], mask=idx * PAGE < hi, other=0.0)
            ksc = tl.reshape(tl.broadcast_to(ksc[:, None], (BLOCK_N // PAGE, PAGE)), (BLOCK_N,))
            vsc = tl.reshape(tl.broadcast_to(vsc[:, None], (BLOCK_N // PAGE, PAGE)), (BLOCK_N,))
        else:
            ksc = tl.load(scales[0] + page[:, None] * ks_str[0] + si[None, :] * ks_str[1], mask=tok_ok, other=0.0)
            vsc = tl.load(scales[1] + page[:, None] * vs_str[0] + si[None, :] * vs_str[1], mask=tok_ok, other=0.0)
            ksc = tl.reshape(ksc, (BLOCK_N,))
            vsc = tl.reshape(vsc, (BLOCK_N,))
    else:
        t_ok = start + offs_n < hi
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
        ptrs = _kv_ptrs(kv, kv_strides, page[:, None] if GATHER != 2 else page, slot[:, None], offs_d[None, :])
        k8, v8 = _load_kv(ptrs, _tile_mask(t_ok[:, None], d_ok[None, :], MASKED, BLOCK_D == HEAD_DIM))
        if PAGE_SCALES and GATHER == 2:  # per-page scales, the tile in one page: one scale each
            ksc = tl.load(scales[0] + page * ks_str[0])
            vsc = tl.load(scales[1] + page * vs_str[0])
        elif MASKED:
            ksc = tl.load(scales[0] + page * ks_str[0] + slot * ks_str[1], mask=t_ok, other=0.0)
            vsc = tl.load(scales[1] + page * vs_str[0] + slot * vs_str[1], mask=t_ok, other=0.0)
        else:
            ksc = tl.load(scales[0] + page * ks_str[0] + slot * ks_str[1])
            vsc = tl.load(scales[1] + page * vs_str[0] + slot * vs_str[1])
    return k8, v8, ksc, vsc


@triton.jit
def _fp8_step(acc, m_i, l_i, q, row_f, kv, kv_strides, scales, scale_strides, bt_row, start, hi, last, n_pages,
              PAGE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              MASKED: tl.constexpr, GATHER: tl.constexpr, PAGE_SCALES: tl.constexpr, TILE_STEP: tl.constexpr):
    """One FP8 tile (:func:`_fp8_tile`) through the online softmax; ``MASKED``: row ``r`` sees keys
    ``<= last[r]``. ``TILE_STEP`` 0: :func:`minimax_lab.triton_blocks.fp8_attend_tile` (``q`` and
    ``row_f`` from :func:`minimax_lab.triton_blocks.fp8_query`); 1:
    :func:`minimax_lab.triton_blocks.fp8_attend_tile_plain` (``q`` as loaded, ``row_f`` the softmax
    scale). fp32 queries take fp32 products (``"ieee"``; 16-bit dots ignore it)."""
    k8, v8, ksc, vsc = _fp8_tile(kv, kv_strides, scales, scale_strides, bt_row, start, hi, n_pages, PAGE, BLOCK_N,
                                 HEAD_DIM, BLOCK_D, MASKED, GATHER, PAGE_SCALES)
    visible = (start + tl.arange(0, BLOCK_N))[None, :] <= last[:, None]
    if TILE_STEP == 0:
        acc, m_i, l_i = fp8_attend_tile(acc, m_i, l_i, q, k8, v8, ksc, vsc, row_f, visible, MASKED,
                                        PAGE_SCALES and GATHER == 2, "ieee")
    else:
        acc, m_i, l_i = fp8_attend_tile_plain(acc, m_i, l_i, q, k8, v8, ksc, vsc, row_f, visible, MASKED,
                                              PAGE_SCALES and GATHER == 2, "ieee")
    return acc, m_i, l_i


@triton.jit
def _attend_fp8_keys(acc, m_i, l_i, q, row_f, kv, kv_strides, scales, scale_strides, bt_row, lo, full, end, hi, last,
                     n_pages, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_D: tl.constexpr, GATHER: tl.constexpr, PAGE_SCALES: tl.constexpr,
                     TILE_STEP: tl.constexpr):
    """:func:`_attend_keys` for an FP8 cache, tile by tile through :func:`_fp8_step`."""
    for start in range(lo, full, BLOCK_N):
        acc, m_i, l_i = _fp8_step(acc, m_i, l_i, q, row_f, kv, kv_strides, scales, scale_strides, bt_row, start, hi,
                                  last, n_pages, PAGE, BLOCK_N, HEAD_DIM, BLOCK_D, False, GATHER, PAGE_SCALES,
                                  TILE_STEP)
    for start in range(full, end, BLOCK_N):
        acc, m_i, l_i = _fp8_step(acc, m_i, l_i, q, row_f, kv, kv_strides, scales, scale_strides, bt_row, start, hi,
                                  last, n_pages, PAGE, BLOCK_N, HEAD_DIM, BLOCK_D, True, GATHER, PAGE_SCALES,
                                  TILE_STEP)
    return acc, m_i, l_i


def _decode_smem(a) -> int:
    """The query tile and the K/V tiles of one :func:`_paged_decode_kernel` program."""
    return configs.attention_smem(a["BLOCK_H"], a["BLOCK_N"], a["BLOCK_D"], q_itemsize=a["Q"].element_size(),
                                  kv_itemsize=a["K"].element_size(), num_stages=a["num_stages"])


def _decode_fp8_smem(a) -> int:
    """The query tile and the K/V tiles of one :func:`_paged_decode_fp8_kernel` program: e4m3
    tiles, staged once more in fp16 for the dots."""
    kv16 = configs.tile_bytes((a["BLOCK_N"], a["BLOCK_D"]), itemsize=2)
    return configs.attention_smem(a["BLOCK_H"], a["BLOCK_N"], a["BLOCK_D"], q_itemsize=2, kv_itemsize=1,
                                  num_stages=a["num_stages"]) + 2 * kv16


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
    smem={"_paged_decode_fp8_kernel": _decode_fp8_smem},
)


@triton.jit
def _no_keys_yet(ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """The online softmax's state before any key: ``(acc [ROWS, BLOCK_D] = 0, m = -inf, l = 0)``."""
    return (tl.zeros([ROWS, BLOCK_D], tl.float32), tl.full([ROWS], float("-inf"), tl.float32),
            tl.zeros([ROWS], tl.float32))


@triton.jit
def _decode_program(Q, LENS, row_strides, NUM_SPLITS, max_len, Hkv, GROUP,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr):
    """What one decode program owns: ``(b, hk, heads, h_ok, q, lo, full, hi, last)`` -- sequence
    ``b``'s kv head ``hk`` with the G query heads of its group (``heads`` [BLOCK_H], real where
    ``h_ok``; ``q [BLOCK_H, BLOCK_D]``, zeros past G) and this split's tokens ``[lo, hi)``: equal
    pieces, each a multiple of ``BLOCK_N`` long, whole tiles up to ``full``; every row sees the
    keys ``<= last = hi - 1``."""
    b = tl.program_id(0) // Hkv
    hk = tl.program_id(0) % Hkv
    L = tl.minimum(tl.maximum(tl.load(LENS + b), 0), max_len)  # bounds guard: block-table reads stay in the row
    per_split = tl.cdiv(tl.cdiv(L, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = tl.program_id(1) * per_split
    hi = tl.minimum(lo + per_split, L)
    full = lo + tl.maximum(hi - lo, 0) // BLOCK_N * BLOCK_N
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    heads = hk * GROUP + offs_h  # the G query heads of kv head hk, padded to BLOCK_H rows
    h_ok = offs_h < GROUP
    q = tl.load(Q + b.to(tl.int64) * row_strides[0] + heads[:, None] * row_strides[1] + offs_d[None, :],
                mask=h_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    last = tl.zeros([BLOCK_H], tl.int32) + (hi - 1)
    return b, hk, heads, h_ok, q, lo, full, hi, last


@triton.jit
def _decode_store(acc, m_i, l_i, O, PART_O, PART_LSE, row_strides, b, heads, h_ok, Hkv, GROUP, NUM_SPLITS,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, DIRECT: tl.constexpr):
    """The end of a decode program: its normalised rows into ``O`` (``DIRECT``: one split, the
    result is final), else into the partials ``PART_O [B, Hq, NUM_SPLITS, BLOCK_D]`` fp32 with
    their log-sum-exp ``PART_LSE [B, Hq, NUM_SPLITS]`` (log2 domain) for :func:`_merge_splits_kernel`."""
    out, lse = finish_rows(acc, m_i, l_i)  # no token in this split (or an empty sequence): 0, -inf
    offs_d = tl.arange(0, BLOCK_D)
    if DIRECT:
        o_ptrs = O + b.to(tl.int64) * row_strides[0] + heads[:, None] * row_strides[1] + offs_d[None, :]
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=h_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
    else:
        row = (b.to(tl.int64) * (Hkv * GROUP) + heads) * NUM_SPLITS + tl.program_id(1)
        tl.store(PART_O + row[:, None] * BLOCK_D + offs_d[None, :], out, mask=h_ok[:, None])
        tl.store(PART_LSE + row, lse, mask=h_ok)


@triton.jit
def _paged_decode_kernel(Q, K, V, BT, LENS, O, PART_O, PART_LSE, row_strides, kv_strides, stride_table_b,
                         Hkv, GROUP, qk_scale, NUM_SPLITS, n_pages, max_len,
                         PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
                         BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # one program: sequence b, kv head hk, one split of its context (grid: B * Hkv, NUM_SPLITS)
    b, hk, heads, h_ok, q, lo, full, hi, last = _decode_program(Q, LENS, row_strides, NUM_SPLITS, max_len, Hkv, GROUP,
                                                                HEAD_DIM, BLOCK_D, BLOCK_H, BLOCK_N)
    kv = (K + hk * kv_strides[0][2], V + hk * kv_strides[1][2])  # this kv head's K and V
    acc, m_i, l_i = _no_keys_yet(BLOCK_H, BLOCK_D)
    acc, m_i, l_i = _attend_keys(acc, m_i, l_i, q, kv, kv_strides, BT + b.to(tl.int64) * stride_table_b, lo, full, hi,
                                 hi, last, n_pages, qk_scale, PAGE, HEAD_DIM, BLOCK_N, BLOCK_D, DOT_PRECISION)
    _decode_store(acc, m_i, l_i, O, PART_O, PART_LSE, row_strides, b, heads, h_ok, Hkv, GROUP, NUM_SPLITS, HEAD_DIM,
                  BLOCK_D, DIRECT)


@triton.jit
def _paged_decode_fp8_kernel(Q, K, V, KS, VS, BT, LENS, O, PART_O, PART_LSE, row_strides, kv_strides, scale_strides,
                             stride_table_b, Hkv, GROUP, qk_scale, NUM_SPLITS, n_pages, max_len,
                             PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                             BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT: tl.constexpr,
                             GATHER: tl.constexpr, PAGE_SCALES: tl.constexpr, FP16_DOT: tl.constexpr):
    # :func:`_paged_decode_kernel` on e4m3 caches with fp32 scales KS/VS (PAGE_SCALES: per page);
    # FP16_DOT: 16-bit queries, dots in fp16 (module docstring, point 5)
    b, hk, heads, h_ok, q, lo, full, hi, last = _decode_program(Q, LENS, row_strides, NUM_SPLITS, max_len, Hkv, GROUP,
                                                                HEAD_DIM, BLOCK_D, BLOCK_H, BLOCK_N)
    kv = (K + hk * kv_strides[0][2], V + hk * kv_strides[1][2])
    scales = (KS + hk * scale_strides[0][2], VS + hk * scale_strides[1][2])  # this kv head's scales
    q, row_f = fp8_query(q, qk_scale, FP16_DOT)  # q16 * 2**shift == q; the shift joins row_f
    acc, m_i, l_i = _no_keys_yet(BLOCK_H, BLOCK_D)
    acc, m_i, l_i = _attend_fp8_keys(acc, m_i, l_i, q, row_f, kv, kv_strides, scales, scale_strides,
                                     BT + b.to(tl.int64) * stride_table_b, lo, full, hi, hi, last, n_pages, PAGE,
                                     BLOCK_N, HEAD_DIM, BLOCK_D, GATHER, PAGE_SCALES, 0)
    _decode_store(acc, m_i, l_i, O, PART_O, PART_LSE, row_strides, b, heads, h_ok, Hkv, GROUP, NUM_SPLITS, HEAD_DIM,
                  BLOCK_D, DIRECT)


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


def cache_operands(k_cache, v_cache) -> dict:
    """The cache arguments every paged kernel takes by name: ``K``, ``V`` and ``kv_strides``."""
    return dict(K=k_cache, V=v_cache, kv_strides=(tuple(k_cache.stride()), tuple(v_cache.stride())))


def fp8_operands(k_cache, k_scale, v_scale, block_n: int, gather: str = "token") -> dict:
    """The further arguments of an FP8 paged kernel by name: the scales ``KS``, ``VS`` (per-page
    ones as per-token views, :func:`minimax_lab.paged_kv.layout.token_scales`), ``scale_strides``,
    and the constexprs ``GATHER`` (:func:`gather_mode`) and ``PAGE_SCALES``."""
    ks, vs, ks_strides, vs_strides, _ = kv_scale_operands(k_cache, k_scale, v_scale)
    return dict(KS=ks, VS=vs, scale_strides=(ks_strides, vs_strides),
                GATHER=gather_mode(k_cache.shape[1], block_n, gather), PAGE_SCALES=k_scale.ndim == 2)


def paged_decode_triton(q, k_cache, v_cache, block_table, seq_lens, *, scale=None, num_splits=None, config=None,
                        k_scale=None, v_scale=None):
    """The Triton flash-decoding kernel (see the module docstring); ``num_splits``/``config``
    override the host heuristic and the launch config (used by the tuning sweep; FP8 caches take
    :data:`FP8_LAUNCH`'s keys). bf16 or FP8 operands on a GPU without them raise
    :class:`minimax_lab.runtime.UnsupportedOnDevice`; an unknown ``GATHER`` raises ``ValueError``."""
    require_dtypes("the paged decode kernel", q, k_cache, v_cache)
    B, Hq, D = q.shape
    _, ps, Hkv, _ = k_cache.shape
    fp8 = k_scale is not None
    cfg = configs.launch_config(FP8_LAUNCH if fp8 else LAUNCH, config=config)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out_dtype = q.dtype
    fp16_dot = q.dtype in (torch.bfloat16, torch.float16)  # decided before the interpreter's fp32 upcast
    q, k_cache, v_cache, block_table, seq_lens = paged_triton_operands(q, k_cache, v_cache, block_table, seq_lens)
    o = torch.empty(B, Hq, D, dtype=q.dtype, device=q.device)
    if B == 0:
        return o.to(out_dtype)
    G = Hq // Hkv
    BLOCK_N = cfg["BLOCK_N"]
    BLOCK_D = max(16, triton.next_power_of_2(D))
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
    args = dict(Q=q, **cache_operands(k_cache, v_cache), BT=block_table, LENS=seq_lens, O=o, PART_O=part_o,
                PART_LSE=part_lse, row_strides=q.stride()[:2], stride_table_b=block_table.stride(0), Hkv=Hkv,
                GROUP=G, qk_scale=scale * LOG2E, NUM_SPLITS=num_splits, n_pages=k_cache.shape[0],
                max_len=max_context, PAGE=ps, HEAD_DIM=D, BLOCK_D=BLOCK_D,
                BLOCK_H=max(16, triton.next_power_of_2(G)),  # tl.dot needs M >= 16
                BLOCK_N=BLOCK_N, DIRECT=num_splits == 1, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if fp8:
        _paged_decode_fp8_kernel[(B * Hkv, num_splits)](
            **args, **fp8_operands(k_cache, k_scale, v_scale, BLOCK_N, cfg["GATHER"]), FP16_DOT=fp16_dot)
    else:
        _paged_decode_kernel[(B * Hkv, num_splits)](**args, DOT_PRECISION=dot_precision(q.dtype))
    if num_splits > 1:
        _merge_splits_kernel[(B * Hq,)](part_o, part_lse, o, Hq, o.stride(0), o.stride(1), num_splits,
                                        HEAD_DIM=D, BLOCK_D=BLOCK_D,
                                        BLOCK_S=max(2, triton.next_power_of_2(num_splits)), num_warps=4)
    return o.to(out_dtype)
