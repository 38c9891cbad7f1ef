"""The Triton implementation of :func:`minimax_lab.paged_kv.prefill.paged_prefill`: one program
per (sequence, kv head, tile of ``BLOCK_M`` new tokens), the tile's ``BLOCK_M x G`` (token, query
head) rows packed into one M dimension so each K/V tile is read once per GQA group. Key tiles
every row can see (the prefix up to the tile's first token) run unmasked -- the same tile step
as the decode kernel (:func:`.decode_triton._attend_keys`) -- and only the tiles that cross the
causal diagonal apply the mask.

FP8 caches (e4m3) have a launch block of their own (:data:`FP8_LAUNCH`, op ``paged_prefill_fp8``)
whose ``TILE_STEP`` picks one of three ways through them:

* ``"fp16"`` -- :func:`_paged_prefill_fp8_kernel` with the decode kernel's FP8 tile step
  (:func:`minimax_lab.triton_blocks.fp8_attend_tile`): tiles converted to fp16, each bf16 query
  row moved into fp16's range, P normalised per row against the tile's own max;
* ``"q_dtype"`` -- the same kernel with the plain step
  (:func:`minimax_lab.triton_blocks.fp8_attend_tile_plain`): tiles converted to the query's
  dtype, key scales on the score columns, value scales on P's columns, the plain online softmax;
* ``"dequantize"`` -- the pages the batch reads dequantized into a scratch cache of the query's
  dtype (:func:`dequantize_pages`: one more read of the FP8 bytes and one write of the scratch),
  then the kernel of unquantized caches, :func:`_paged_prefill_kernel`, on it.

All three compute on the stored values ``cache * scale``; the kernels take the caches' strides as
tuples, as the decode kernels do (:mod:`.decode_triton`).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minimax_lab import configs
from minimax_lab.paged_kv.decode_triton import (_attend_fp8_keys, _attend_keys, _no_keys_yet, cache_operands,
                                                fp8_operands)
from minimax_lab.paged_kv.layout import kv_scale_operands, paged_triton_operands
from minimax_lab.triton_blocks import LOG2E, dot_precision, finish_rows, fp8_query, require_dtypes

#: fp32 registers per thread the packed rows' accumulator may take: a tile's ``BLOCK_M`` tokens
#: shrink for large GQA groups until ``rows * BLOCK_D <= ACC_REGISTERS * 32 * num_warps`` (at
#: head_dim 128: 32 rows per warp), so one config serves 32/8 heads (4 rows a token) and 64/4 (16);
#: twice as many rows spill thousands of bytes per thread (compiled for sm_90, ``ptxas -v``)
ACC_REGISTERS = 128

#: the FP8 prefill's tile steps (module docstring): the kernel's ``TILE_STEP`` constexpr, ``None``
#: for the path that dequantizes first
TILE_STEPS = {"fp16": 0, "q_dtype": 1, "dequantize": None}


def _prefill_smem(a, *, kv_itemsize: int | None = None, staged16: bool = False) -> int:
    """Shared memory of one prefill program (:func:`_paged_prefill_kernel`; the FP8 kernel with
    ``kv_itemsize=1, staged16=True``), as Triton 3.6 and 3.9 lay it out for sm_90 (measured on the
    compiled kernels): the packed query tile, the K and V tiles once (``num_stages=1``) or twice
    (any ``num_stages >= 2``: the pipeliner double-buffers these gathered tiles) and, for e4m3
    tiles, one more tile in 16 bits for the dots."""
    rows = a["BLOCK_M"] * a["BLOCK_G"]
    q = configs.tile_bytes((rows, a["BLOCK_D"]), itemsize=a["Q"].element_size())
    kv = 2 * configs.tile_bytes((a["BLOCK_N"], a["BLOCK_D"]), itemsize=kv_itemsize or a["K"].element_size())
    staged = configs.tile_bytes((a["BLOCK_N"], a["BLOCK_D"]), itemsize=2) if staged16 else 0
    return q + (2 if a["num_stages"] >= 2 else 1) * kv + staged


_TILES = [(16, 64, 4, 3), (16, 64, 4, 2), (16, 128, 4, 2), (32, 64, 8, 3), (32, 64, 8, 2), (32, 128, 8, 2),
          (32, 64, 4, 2), (64, 64, 8, 2)]

#: The paged prefill's launch: new tokens per tile, keys per tile, warps, pipeline stages.
LAUNCH = configs.Launch(
    op="paged_prefill",
    keys=("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"),
    interpreter={"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 1, "num_stages": 1},
    candidates=[dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=st) for m, n, w, st in _TILES],
    quick={"num_warps": 2},
    smem={"_paged_prefill_kernel": _prefill_smem},
)

#: The FP8 paged prefill's launch: the keys of :data:`LAUNCH` plus ``TILE_STEP`` (one of
#: :data:`TILE_STEPS`, module docstring); ``"dequantize"`` runs :func:`_paged_prefill_kernel` with
#: the tile shape, warps and stages of this block.
FP8_LAUNCH = configs.Launch(
    op="paged_prefill_fp8",
    keys=("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "TILE_STEP"),
    interpreter={"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 1, "num_stages": 1, "TILE_STEP": "fp16"},
    candidates=[dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=st) for m, n, w, st in
                _TILES + [(64, 128, 8, 3)]] + [dict(TILE_STEP=step) for step in TILE_STEPS],
    quick={"TILE_STEP": "dequantize"},
    smem={"_paged_prefill_fp8_kernel": lambda a: _prefill_smem(a, kv_itemsize=1, staged16=True)},
)


@triton.jit
def _prefill_program(Q, LENS, QLENS, row_strides, S, Hkv, GROUP, max_len,
                     HAS_QLENS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_G: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """What one prefill program owns: ``(b, hk, tok, heads, h_ok, row_pos, q, full, end, L)``.

    Sequence ``b``'s kv head ``hk`` and tile ``program_id(1)`` of its new tokens: rows = (new token
    ``tok``, query head ``heads`` of the group) pairs, ``BLOCK_M`` tokens x ``BLOCK_G`` heads (real
    heads where ``h_ok``), ``q`` their queries; ``row_pos`` each row's position in the sequence,
    ``-1`` for padding rows (they see no key). Keys ``[0, full)`` are visible to every real row (whole
    tiles, unmasked), keys ``[full, end)`` cross the diagonal; ``L`` the sequence's length. A tile
    without new tokens gets ``full = end = 0``."""
    b = tl.program_id(0) // Hkv
    hk = tl.program_id(0) % Hkv
    tile = tl.program_id(1)
    # bounds guard (unchecked inputs): 0 <= n_new <= L <= max_len keeps every table read in the row
    L = tl.minimum(tl.maximum(tl.load(LENS + b), 0), max_len)
    n_new = tl.load(QLENS + b) if HAS_QLENS else S
    n_new = tl.minimum(tl.maximum(n_new, 0), tl.minimum(L, S))
    prefix = L - n_new
    offs_r = tl.arange(0, BLOCK_M * BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    tok = tile * BLOCK_M + offs_r // BLOCK_G
    g = offs_r % BLOCK_G
    heads = hk * GROUP + g
    h_ok = g < GROUP
    real = (tok < n_new) & h_ok
    row_pos = tl.where(real, prefix + tok, -1)
    q_rows = Q + b.to(tl.int64) * row_strides[0] + tok[:, None] * row_strides[1] + heads[:, None] * row_strides[2]
    q = tl.load(q_rows + offs_d[None, :], mask=real[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    busy = tile * BLOCK_M < n_new
    full = tl.where(busy, (prefix + tile * BLOCK_M) // BLOCK_N * BLOCK_N, 0)
    end = tl.where(busy, tl.minimum(prefix + tile * BLOCK_M + BLOCK_M, L), 0)
    return b, hk, tok, heads, h_ok, row_pos, q, full, end, L


@triton.jit
def _prefill_store(acc, m_i, l_i, O, row_strides, b, tok, heads, h_ok, row_pos, S,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """The program's normalised rows into ``O`` (the query's layout); padding rows as zeros."""
    out, _ = finish_rows(acc, m_i, l_i)
    out = tl.where(row_pos[:, None] >= 0, out, 0.0)
    offs_d = tl.arange(0, BLOCK_D)
    o_rows = O + b.to(tl.int64) * row_strides[0] + tok[:, None] * row_strides[1] + heads[:, None] * row_strides[2]
    tl.store(o_rows + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=(tok < S)[:, None] & h_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _paged_prefill_kernel(Q, K, V, BT, LENS, QLENS, O, row_strides, kv_strides, stride_table_b,
                          S, Hkv, GROUP, qk_scale, n_pages, max_len,
                          PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_G: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_QLENS: tl.constexpr,
                          DOT_PRECISION: tl.constexpr):
    # grid: (B * Hkv, cdiv(S, BLOCK_M)); caches of q's dtype
    b, hk, tok, heads, h_ok, row_pos, q, full, end, L = _prefill_program(
        Q, LENS, QLENS, row_strides, S, Hkv, GROUP, max_len, HAS_QLENS, HEAD_DIM, BLOCK_D, BLOCK_G, BLOCK_M, BLOCK_N)
    kv = (K + hk * kv_strides[0][2], V + hk * kv_strides[1][2])  # this kv head's K and V
    acc, m_i, l_i = _no_keys_yet(BLOCK_M * BLOCK_G, BLOCK_D)
    acc, m_i, l_i = _attend_keys(acc, m_i, l_i, q, kv, kv_strides, BT + b.to(tl.int64) * stride_table_b, 0, full, end,
                                 L, row_pos, n_pages, qk_scale, PAGE, HEAD_DIM, BLOCK_N, BLOCK_D, DOT_PRECISION)
    _prefill_store(acc, m_i, l_i, O, row_strides, b, tok, heads, h_ok, row_pos, S, HEAD_DIM, BLOCK_D)


@triton.jit
def _paged_prefill_fp8_kernel(Q, K, V, KS, VS, BT, LENS, QLENS, O, row_strides, kv_strides, scale_strides,
                              stride_table_b, S, Hkv, GROUP, qk_scale, n_pages, max_len,
                              PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                              BLOCK_G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              HAS_QLENS: tl.constexpr, GATHER: tl.constexpr, PAGE_SCALES: tl.constexpr,
                              FP16_DOT: tl.constexpr, TILE_STEP: tl.constexpr):
    # :func:`_paged_prefill_kernel` on e4m3 caches with fp32 scales KS/VS; TILE_STEP 0 ("fp16") or
    # 1 ("q_dtype"), see the module docstring; GATHER, PAGE_SCALES, FP16_DOT as in the decode kernel
    b, hk, tok, heads, h_ok, row_pos, q, full, end, L = _prefill_program(
        Q, LENS, QLENS, row_strides, S, Hkv, GROUP, max_len, HAS_QLENS, HEAD_DIM, BLOCK_D, BLOCK_G, BLOCK_M, BLOCK_N)
    kv = (K + hk * kv_strides[0][2], V + hk * kv_strides[1][2])
    scales = (KS + hk * scale_strides[0][2], VS + hk * scale_strides[1][2])  # this kv head's scales
    if TILE_STEP == 0:
        q, row_f = fp8_query(q, qk_scale, FP16_DOT)  # each packed row moved into fp16's range
    else:
        row_f = qk_scale
    acc, m_i, l_i = _no_keys_yet(BLOCK_M * BLOCK_G, BLOCK_D)
    acc, m_i, l_i = _attend_fp8_keys(acc, m_i, l_i, q, row_f, kv, kv_strides, scales, scale_strides,
                                     BT + b.to(tl.int64) * stride_table_b, 0, full, end, L, row_pos, n_pages, PAGE,
                                     BLOCK_N, HEAD_DIM, BLOCK_D, GATHER, PAGE_SCALES, TILE_STEP)
    _prefill_store(acc, m_i, l_i, O, row_strides, b, tok, heads, h_ok, row_pos, S, HEAD_DIM, BLOCK_D)


@triton.jit
def _dequantize_values(X, XS, OUT, x_strides, s_strides, page, slot, h, d, ok, out):
    """``X[page, slot, h, d] * XS[page, slot, h]`` (e4m3 values, fp32 scales) into ``OUT + out``."""
    x8 = tl.load(X + page * x_strides[0] + slot * x_strides[1] + h * x_strides[2] + d * x_strides[3], mask=ok,
                 other=0.0)
    sc = tl.load(XS + page * s_strides[0] + slot * s_strides[1] + h * s_strides[2], mask=ok, other=0.0)
    tl.store(OUT + out, (x8.to(tl.float32) * sc).to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def _dequantize_pages_kernel(K, V, KS, VS, BT, LENS, OUT_K, OUT_V, kv_strides, scale_strides, stride_table_b,
                             max_pages, n_pages, max_len,
                             PAGE: tl.constexpr, ROW: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    # one program per (block-table entry, chunk of BLOCK values of its page): entry (b, j) lands
    # in scratch page b * max_pages + j, only its tokens below the sequence's length
    entry = tl.program_id(0)
    b = entry // max_pages
    j = entry % max_pages
    L = tl.minimum(tl.maximum(tl.load(LENS + b), 0), max_len)
    if j * PAGE < L:
        page = tl.load(BT + b.to(tl.int64) * stride_table_b + j)
        page = tl.minimum(tl.maximum(page, 0), n_pages - 1).to(tl.int64)  # bounds guard, as in the kernels
        idx = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # flat index into the page's [PAGE, Hkv, D]
        slot = idx // ROW
        h = idx % ROW // HEAD_DIM
        d = idx % HEAD_DIM
        ok = (idx < PAGE * ROW) & (j * PAGE + slot < L)
        out = entry.to(tl.int64) * (PAGE * ROW) + idx
        _dequantize_values(K, KS, OUT_K, kv_strides[0], scale_strides[0], page, slot, h, d, ok, out)
        _dequantize_values(V, VS, OUT_V, kv_strides[1], scale_strides[1], page, slot, h, d, ok, out)


def dequantize_pages(k_cache, v_cache, k_scale, v_scale, block_table, seq_lens,
                     dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(k, v, table)``: the pages an FP8 cache's sequences reach (entry ``j`` of row ``b`` while
    ``j * page_size < seq_lens[b]``) dequantized to ``dtype`` into a scratch cache ``[B * max_pages,
    page_size, Hkv, D]``, and the int32 table ``[B, max_pages]`` that reads it (entry ``(b, j)`` ->
    page ``b * max_pages + j``). The tokens past each sequence's length stay unwritten: no kernel
    reads them. The values are ``cache * scale`` (exact in bf16 and fp32). Takes the kernels'
    operands (checked, unit-stride table and lengths)."""
    B, max_pages = block_table.shape
    P, ps, Hkv, D = k_cache.shape
    k = torch.empty(B * max_pages, ps, Hkv, D, dtype=dtype, device=k_cache.device)
    v = torch.empty_like(k)
    table = torch.arange(B * max_pages, dtype=torch.int32, device=k_cache.device).view(B, max_pages)
    if B * max_pages == 0:
        return k, v, table
    ks, vs, ks_strides, vs_strides, _ = kv_scale_operands(k_cache, k_scale, v_scale)
    BLOCK = min(4096, triton.next_power_of_2(ps * Hkv * D))
    _dequantize_pages_kernel[(B * max_pages, triton.cdiv(ps * Hkv * D, BLOCK))](
        k_cache, v_cache, ks, vs, block_table, seq_lens, k, v, (tuple(k_cache.stride()), tuple(v_cache.stride())),
        (ks_strides, vs_strides), block_table.stride(0), max_pages, P, max_pages * ps,
        PAGE=ps, ROW=Hkv * D, HEAD_DIM=D, BLOCK=BLOCK, num_warps=4)
    return k, v, table


def paged_prefill_triton(q, k_cache, v_cache, block_table, seq_lens, *, q_lens=None, scale=None, config=None,
                         k_scale=None, v_scale=None):
    """The Triton kernels (module docstring); ``config`` overrides ``BLOCK_M``/``BLOCK_N``/warps/
    stages (FP8 caches: :data:`FP8_LAUNCH`'s keys, ``TILE_STEP`` too; another value raises
    ``ValueError``). bf16 or FP8 operands on a GPU without them raise
    :class:`minimax_lab.runtime.UnsupportedOnDevice`."""
    require_dtypes("the paged prefill kernel", q, k_cache, v_cache)
    B, S, Hq, D = q.shape
    _, ps, Hkv, _ = k_cache.shape
    fp8 = k_scale is not None
    cfg = configs.launch_config(FP8_LAUNCH if fp8 else LAUNCH, config=config)
    step = TILE_STEPS[_tile_step(cfg)] if fp8 else None
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out_dtype = q.dtype
    fp16_dot = q.dtype in (torch.bfloat16, torch.float16)  # decided before the interpreter's fp32 upcast
    q, k_cache, v_cache, block_table, seq_lens, q_lens = paged_triton_operands(q, k_cache, v_cache, block_table,
                                                                               seq_lens, q_lens)
    o = torch.empty(B, S, Hq, D, dtype=q.dtype, device=q.device)
    if B * S == 0:
        return o.to(out_dtype)
    if fp8 and step is None:  # "dequantize": the unquantized kernel on a scratch of q's dtype
        # (fp16 queries get an fp32 scratch: a stored value may lie past fp16's range)
        scratch = torch.float32 if q.dtype == torch.float16 else q.dtype
        k_cache, v_cache, block_table = dequantize_pages(k_cache, v_cache, k_scale, v_scale, block_table, seq_lens,
                                                         scratch)
        q, fp8 = q.to(scratch), False
    G = Hq // Hkv
    BLOCK_G = triton.next_power_of_2(G)
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BLOCK_M = tile_tokens(cfg["BLOCK_M"], BLOCK_G, num_warps=cfg["num_warps"], block_d=BLOCK_D)
    args = dict(Q=q, **cache_operands(k_cache, v_cache), BT=block_table, LENS=seq_lens,
                QLENS=q_lens if q_lens is not None else seq_lens, O=o,
                row_strides=q.stride()[:3],  # q is dense [B, S, Hq, D], as o: one layout
                stride_table_b=block_table.stride(0), S=S, Hkv=Hkv, GROUP=G, qk_scale=scale * LOG2E,
                n_pages=k_cache.shape[0], max_len=block_table.shape[1] * ps, PAGE=ps, HEAD_DIM=D,
                BLOCK_D=BLOCK_D, BLOCK_G=BLOCK_G, BLOCK_M=BLOCK_M, BLOCK_N=cfg["BLOCK_N"],
                HAS_QLENS=q_lens is not None, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    grid = (B * Hkv, triton.cdiv(S, BLOCK_M))
    if fp8:
        _paged_prefill_fp8_kernel[grid](**args, **fp8_operands(k_cache, k_scale, v_scale, cfg["BLOCK_N"]),
                                        FP16_DOT=fp16_dot, TILE_STEP=step)
    else:
        _paged_prefill_kernel[grid](**args, DOT_PRECISION=dot_precision(q.dtype))
    return o.to(out_dtype)


def tile_tokens(block_m: int, block_g: int, *, num_warps: int, block_d: int) -> int:
    """New tokens per tile for a config's ``BLOCK_M``, ``block_g`` query heads per kv head and
    ``block_d`` (padded to powers of two): ``block_m``, fewer when the packed rows' fp32
    accumulator would pass :data:`ACC_REGISTERS` per thread of ``num_warps`` warps, and at least
    16 rows (``tl.dot``'s smallest M)."""
    max_rows = ACC_REGISTERS * 32 * num_warps // block_d
    return max(min(block_m, max(1, max_rows // block_g)), triton.next_power_of_2(max(1, 16 // block_g)))


def _tile_step(cfg: dict) -> str:
    """``cfg``'s ``TILE_STEP``; raises ``ValueError`` naming the allowed ones."""
    step = cfg["TILE_STEP"]
    if step not in TILE_STEPS:
        raise ValueError(f"TILE_STEP must be one of {sorted(TILE_STEPS)}, got {step!r}")
    return step
