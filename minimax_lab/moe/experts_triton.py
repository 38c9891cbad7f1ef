"""Fused MoE in Triton: two kernels over expert-aligned blocks of routed rows.

After :func:`~minimax_lab.moe.align.align_tokens` every block of ``BLOCK_M`` padded rows
belongs to one expert. Then:

* ``_gate_up_kernel`` -- one program per (block, N-tile of ``f``): gathers the block's rows of
  ``x`` (the token of slot ``s`` is ``s // k``), multiplies them by the expert's gate **and** up
  tiles with two accumulators, and applies SwiGLU in the epilogue, writing
  ``silu(g) * u`` to an intermediate ``[capacity, f]`` in the aligned (padded) row order.
* ``_down_kernel`` -- one program per (block, N-tile of ``d``): the block's intermediate rows
  times the expert's down tile, scaled by each row's routing weight, stored to the row's slot
  ``y[s, :]``. Every slot is written exactly once, so the combine is a deterministic
  ``y.view(T, k, d).sum(1)`` -- a sorted scatter instead of atomics.

Why this is fast at both ends. Decode (``T*k`` small next to ``E``): each used expert gets one
block, and a program streams its weight tile exactly once for all of the block's rows -- the
kernel is a weight-streaming loop that should run near the copy bandwidth. Prefill: blocks of
64-128 rows of one expert make each program an ordinary tensor-core GEMM tile; consecutive
program ids walk the N-tiles of one block, so the gathered rows stay in L2 while the expert's
weights (a few MB) are reused by its next block.

Tiny batches (``T*k <= SLOT_BLOCKS_MAX_SLOTS``, a decode step of a few tokens) skip the
alignment: with ``SLOT_BLOCKS=True`` block ``i`` is routed slot ``i`` alone, its expert read
straight from ``ids``, and the intermediate's rows are the slots. At that size the weights
streamed are the same and one launch fewer is a measurable part of the step.

Configs (``BLOCK_M/N/K``, ``num_warps``, ``num_stages``) are picked by :func:`pick_config` from
the shape's regime (:data:`LAUNCH`, per GPU in :mod:`minimax_lab.configs`), fixed small ones in
the interpreter. The kernels have no backward (inputs that require grad raise under grad mode),
take fp16, bf16 or fp32 (float64 raises), and run bf16 in fp32 under the interpreter (its
bf16 ``tl.dot`` is wrong). Non-contiguous ``x`` or weights are copied on every call.

FP8 weights (e4m3 with per-output-channel scales, :mod:`.experts_reference`) run the same two kernels
with ``FP8=True``: both operands of each ``tl.dot`` are e4m3 (``x`` and the SwiGLU rows are
quantized per row: at decode sizes inside the GEMMs as they are loaded, ``QUANT_X`` / ``QUANT_A``,
at prefill sizes first by ``_quantize_rows_kernel``), the fp32 products are scaled by the row's and
the output channel's scales in the epilogue (no scale, and no conversion but the fp8 one, inside
the K loop), and the SwiGLU rows are stored in bf16 between the GEMMs; they need a GPU with FP8 (:func:`minimax_lab.runtime.supports`: Triton compiles
``float8_e4m3fn`` from sm_89 on) and raise :class:`minimax_lab.runtime.UnsupportedOnDevice`
elsewhere. Triton's interpreter (3.6 and 3.9) multiplies e4m3 operands correctly, but its
fp32 -> e4m3 and fp32 -> bf16 conversions do not round to nearest even, so the kernels round in
fp32 arithmetic first (``_round_to_e4m3``, ``_round_to_bf16``) and every conversion is exact.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from minimax_lab import configs, runtime
from minimax_lab.fp8 import FP8
from minimax_lab.moe.align_torch import Alignment, align_tokens_unchecked
from minimax_lab.moe.align_triton import (TRITON_ALIGN_MAX_SLOTS, align_decode, align_prefill, align_tokens_triton,
                                          prefill_chunk)
from minimax_lab.moe.experts_reference import INTERMEDIATE_DTYPE, check_fp8_weights
from minimax_lab.triton_blocks import interpreter_safe, require_dtypes
from minimax_lab.validate import TRITON_DTYPES, check_triton_inputs


@triton.jit
def _pow2_scale(amax):
    """The smallest power of two ``s`` with ``amax / s <= 448`` (e4m3's largest value), 1 for 0:
    :func:`minimax_lab.fp8.pow2_scale` from ``amax``'s bits, no log2. ``amax = m * 2**e`` with
    ``m`` in [1, 2) and ``448 = 1.75 * 2**8``, so ``s = 2**(e - 8)`` if ``m <= 1.75`` else ``2**(e - 7)``."""
    bits = amax.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127 - 8 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    e = tl.minimum(tl.maximum(e, -126), 127)          # stay a normal fp32 power of two
    return tl.where(amax > 0, ((e + 127) << 23).to(tl.float32, bitcast=True), 1.0)


@triton.jit
def _round_to_e4m3(v):
    """``v`` (``|v| <= 448``) rounded to the nearest e4m3 value, ties to even, as fp32. Done in fp32
    arithmetic so the fp8 conversion after it is exact on every backend (the interpreter's own
    fp32 -> fp8 conversion does not round to nearest even)."""
    bits = v.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)   # below 2**-6 e4m3 is subnormal, spacing 2**-9
    ulp = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)      # 3 mantissa bits
    inv_ulp = ((127 - e + 3) << 23).to(tl.float32, bitcast=True)
    t = tl.abs(v) * inv_ulp                           # exact, <= 16
    t = (t + 12582912.0) - 12582912.0                 # + 1.5 * 2**23 rounds t to an integer, ties to even
    return t * tl.where(bits < 0, -ulp, ulp)          # the sign back from its bit, -0 included (as torch's cast)


@triton.jit
def _round_to_bf16(v):
    """fp32 ``v`` rounded to bf16's 8 significant bits (nearest, ties to even), as fp32: the store
    that follows is then exact on every backend (the interpreter truncates fp32 -> bf16)."""
    bits = v.to(tl.int32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return (bits & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _row_scales(ptrs, row_ok, offs_k, n_cols, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """``(scale, 1 / scale)`` ``[BLOCK_M]`` of the rows at ``ptrs`` (``[BLOCK_M, BLOCK_K]`` pointers to
    their first ``BLOCK_K`` columns, unit stride along a row): the power-of-two scale of each
    row's amax over ``n_cols`` columns (:func:`_pow2_scale`; 1 for a masked or all-zero row)."""
    amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, n_cols, BLOCK_K):
        v = tl.load(ptrs + k0, mask=row_ok[:, None] & (offs_k < n_cols - k0)[None, :], other=0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(v.to(tl.float32)), 1))
    scale = _pow2_scale(amax)
    return scale, 1.0 / scale                       # exact: a power of two


@triton.jit
def _quantize_tile(v, inv):
    """A loaded tile's rows divided by their scales (``inv [rows]``, powers of two) and rounded to
    e4m3's grid (fp32 values; the conversion to e4m3 after it is exact)."""
    return _round_to_e4m3(tl.minimum(tl.maximum(v.to(tl.float32) * inv[:, None], -448.0), 448.0))


@triton.jit
def _quantize_rows_kernel(src_ptr, dst_ptr, scale_ptr, row_slot_ptr, n_rows, n_cols, n_slots, stride_src, stride_dst,
                          ROWS: tl.constexpr, BLOCK: tl.constexpr, SKIP_PADDING: tl.constexpr):
    # ROWS rows per program: each row's amax, its power-of-two scale, then the row in e4m3.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    if SKIP_PADDING:        # an alignment's padding rows hold nothing: neither read nor written
        row_ok = row_ok & (tl.load(row_slot_ptr + rows, mask=row_ok, other=n_slots) < n_slots)
    rows = rows.to(tl.int64)
    offs = tl.arange(0, BLOCK)
    src = src_ptr + rows[:, None] * stride_src + offs[None, :]
    amax = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    for c0 in range(0, n_cols, BLOCK):
        ok = row_ok[:, None] & (offs < n_cols - c0)[None, :]
        amax = tl.maximum(amax, tl.abs(tl.load(src + c0, mask=ok, other=0.0).to(tl.float32)))
    scale = _pow2_scale(tl.max(amax, axis=1))
    inv = 1.0 / scale                                 # exact: a power of two
    dst = dst_ptr + rows[:, None] * stride_dst + offs[None, :]
    for c0 in range(0, n_cols, BLOCK):                # second pass re-reads the rows from cache
        ok = row_ok[:, None] & (offs < n_cols - c0)[None, :]
        v = tl.load(src + c0, mask=ok, other=0.0).to(tl.float32)
        q = _round_to_e4m3(tl.minimum(tl.maximum(v * inv[:, None], -448.0), 448.0))
        tl.store(dst + c0, q.to(dst_ptr.dtype.element_ty), mask=ok)
    tl.store(scale_ptr + rows, scale, mask=row_ok)


@triton.jit
def _block_and_tile(pid, num_m, num_n, GROUP_M: tl.constexpr):
    """Program ``pid`` -> (aligned block, N tile). ``GROUP_M == 1``: consecutive programs walk the
    N tiles of one block (its gathered rows stay in L2). ``GROUP_M > 1``: they walk ``GROUP_M``
    blocks down one N tile first, so a weight tile is read by several blocks of its expert while
    it is still in L2 (the grouped order of Triton's matmul tutorial)."""
    if GROUP_M == 1:
        pid_m = pid // num_n
        pid_n = pid % num_n
    else:
        per_group = GROUP_M * num_n
        first_m = pid // per_group * GROUP_M
        size = tl.minimum(num_m - first_m, GROUP_M)       # the last group may be short
        r = pid % per_group
        pid_m = first_m + r % size
        pid_n = r // size
    return pid_m, pid_n


@triton.jit
def _block_rows(pid_m, sorted_ids_ptr, n_slots, BLOCK_M: tl.constexpr, SLOT_BLOCKS: tl.constexpr):
    """Block ``pid_m``'s ``(rows, slots)``: aligned, its ``BLOCK_M`` padded rows and the slot each
    holds (``n_slots`` = padding); with ``SLOT_BLOCKS`` (no alignment, see
    ``SLOT_BLOCKS_MAX_SLOTS``) slot ``pid_m`` alone in the first row, whose row is the slot."""
    if SLOT_BLOCKS:
        slots = tl.where(tl.arange(0, BLOCK_M) == 0, pid_m, n_slots)
        rows = slots
    else:
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        slots = tl.load(sorted_ids_ptr + rows)
    return rows, slots


@triton.jit
def _weight_ptrs(w_ptr, expert, offs_n, offs_k, stride_we, stride_wn, SWAP_AB: tl.constexpr):
    """Pointers to the weight tile of rows ``offs_n`` (output channels) and columns ``offs_k`` of an
    expert's K-contiguous ``[n, m]`` matrix: ``[BLOCK_N, BLOCK_K]`` with ``SWAP_AB`` (the MMA's M
    operand in its natural layout), else the ``[BLOCK_K, BLOCK_N]`` view (the MMA's B)."""
    base = w_ptr + expert * stride_we
    # if/else, not an early return: the compiler types both returns of a constexpr branch alike
    if SWAP_AB:
        ptrs = base + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    else:
        ptrs = base + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    return ptrs


@triton.jit
def _weight_tile(w_ptrs, n_ok, k_ok, SWAP_AB: tl.constexpr):
    """The weight tile at ``w_ptrs`` (:func:`_weight_ptrs`), zero past the matrix's rows and columns."""
    if SWAP_AB:
        mask = n_ok[:, None] & k_ok[None, :]
    else:
        mask = k_ok[:, None] & n_ok[None, :]
    return tl.load(w_ptrs, mask=mask, other=0.0)


@triton.jit
def _tma_tile(w_desc, row, k0, SWAP_AB: tl.constexpr):
    """The weight tile through TMA: the descriptor's ``[BLOCK_N, BLOCK_K]`` box at ``(row, k0)`` of
    the weights seen as 2-D, in the orientation of :func:`_weight_ptrs`. Rows past an expert's own
    reach only output columns the store masks; columns past the matrix come back as zeros."""
    w = w_desc.load([row, k0])
    if not SWAP_AB:
        w = tl.trans(w)
    return w


@triton.jit
def _mma(acc, rows, w, SWAP_AB: tl.constexpr, MMA: tl.constexpr):
    """``acc`` plus one K tile's product of the gathered rows ``[BLOCK_M, BLOCK_K]`` and a weight
    tile: with ``SWAP_AB`` ``w @ rows^T`` into ``[BLOCK_N, BLOCK_M]`` (the weight tile as the MMA's
    M: 64-256 rows are wgmma-sized even for a 16-row block), else ``rows @ w`` into
    ``[BLOCK_M, BLOCK_N]``. ``MMA``: ``"chain"`` -- the MMA accumulates into ``acc``;
    ``"promote"`` -- each e4m3 tile's product is added to the fp32 ``acc`` outside the MMA
    (Hopper's fp8 MMA accumulates with reduced precision; as DeepSeek-V3, arXiv 2412.19437
    3.3.2); ``"fp16"`` -- e4m3 operands converted to fp16 first (exact: a GPU without fp8 MMA)."""
    if MMA == "fp16":
        rows = rows.to(tl.float16)
        w = w.to(tl.float16)
    if SWAP_AB:
        a, b = w, tl.trans(rows)
    else:
        a, b = rows, w
    if MMA == "promote":
        acc = acc + tl.dot(a, b)
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _scale_products(acc, row_scale, channel_scale, SWAP_AB: tl.constexpr):
    """An accumulator of e4m3 products (:func:`_mma`) times each row's scale and each output
    channel's: ``x8 . w8 -> x . w``."""
    if SWAP_AB:
        acc = acc * channel_scale[:, None] * row_scale[None, :]
    else:
        acc = acc * row_scale[:, None] * channel_scale[None, :]
    return acc


def _gate_up_smem(a) -> int:
    """The gathered rows and the gate and up weight tiles of one :func:`_gate_up_kernel` program."""
    x = configs.tile_bytes((a["BLOCK_M"], a["BLOCK_K"]), itemsize=a["x_ptr"].element_size())
    w = configs.tile_bytes((a["BLOCK_N"], a["BLOCK_K"]), itemsize=a["w_ptr"].element_size())
    return configs.pipelined(a["num_stages"], x, w, w)


def _down_smem(a) -> int:
    """The SwiGLU rows and the down weight tile of one :func:`_down_kernel` program."""
    rows = configs.tile_bytes((a["BLOCK_M"], a["BLOCK_K"]), itemsize=a["a_ptr"].element_size())
    w = configs.tile_bytes((a["BLOCK_N"], a["BLOCK_K"]), itemsize=a["w_ptr"].element_size())
    return configs.pipelined(a["num_stages"], rows, w)


def _moe_cfg(bm, bn, bk, w, s, dbn=None, dbk=None, dw=None, ds=None, *, swap=False):
    """A candidate of the tuner: the gate/up kernel's tiles, warps and stages, the down kernel's
    tiles (default: the same) and optionally its warps and stages."""
    c = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "num_stages": s,
         "DOWN_BLOCK_N": dbn or bn, "DOWN_BLOCK_K": dbk or bk, "SWAP_AB": swap, "DOWN_SWAP_AB": swap}
    if dw:
        c["DOWN_num_warps"] = dw
    if ds:
        c["DOWN_num_stages"] = ds
    return c


#: the shape regimes the experts are configured for (:func:`regime`)
REGIMES = ("decode", "decode_wide", "prefill")
_MOE_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "SWAP_AB", "DOWN_BLOCK_N",
             "DOWN_BLOCK_K", "DOWN_num_warps", "DOWN_num_stages", "DOWN_SWAP_AB", "GROUP_M", "USE_TMA",
             "DOWN_GROUP_M", "DOWN_USE_TMA")
#: Interpreter configs: small, so CPU tests stay fast and ragged d/f exercise the masks.
_MOE_INTERPRETER = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4, "num_stages": 1,
                    "DOWN_BLOCK_N": 16, "DOWN_BLOCK_K": 16}
_MOE_DECODE_CANDIDATES = [
    _moe_cfg(16, 128, 128, 4, 3), _moe_cfg(32, 128, 128, 4, 3), _moe_cfg(16, 64, 256, 4, 3),
    _moe_cfg(16, 128, 128, 4, 3, swap=True), _moe_cfg(16, 64, 128, 4, 4, swap=True),
    _moe_cfg(16, 64, 256, 4, 2, swap=True), _moe_cfg(32, 128, 128, 4, 3, swap=True),
    _moe_cfg(32, 64, 128, 4, 4, swap=True), _moe_cfg(32, 128, 128, 4, 2, swap=True),
    _moe_cfg(64, 128, 128, 4, 2, swap=True),
    # narrower weight tiles: at T=1 the 8 used experts give too few programs to fill the SMs
    _moe_cfg(16, 32, 128, 4, 4, 64, 128, swap=True), _moe_cfg(16, 32, 64, 4, 5, 128, 64, swap=True),
    _moe_cfg(16, 64, 64, 4, 5, 64, 128, swap=True), _moe_cfg(16, 64, 128, 4, 3, 64, 128, swap=True)]

#: The experts' launch, per regime (:func:`regime`). Decode (few rows per expert): 16- or 32-row
#: blocks, so each used expert's weights are streamed once by one block; an expert whose rows
#: overflow a block is streamed once per block, which is why ``decode_wide`` (8-32 rows per
#: expert on average) takes 32-row blocks. ``SWAP_AB`` puts the weight tile in the MMA's M
#: (wgmma instead of mma.sync). Prefill: full tensor-core tiles, on Hopper with the weight tiles
#: loaded through TMA (``USE_TMA``) and optionally the grouped launch order (``GROUP_M``).
#: ``SLOT_BLOCKS_MAX`` overrides :data:`SLOT_BLOCKS_MAX_SLOTS`.
LAUNCH = configs.Launch(
    op="moe_experts",
    keys=_MOE_KEYS + ("SLOT_BLOCKS_MAX",),
    interpreter=_MOE_INTERPRETER,
    regimes=REGIMES,
    candidates={
        "decode": _MOE_DECODE_CANDIDATES,
        "decode_wide": _MOE_DECODE_CANDIDATES,
        "prefill": [
            _moe_cfg(128, 64, 64, 8, 3, 128, 64), _moe_cfg(128, 128, 64, 8, 3), _moe_cfg(128, 128, 64, 8, 4),
            _moe_cfg(128, 64, 64, 8, 4, 128, 64),
            {**_moe_cfg(128, 64, 64, 8, 3, 128, 64), "USE_TMA": True}, {**_moe_cfg(128, 128, 64, 8, 3), "USE_TMA": True},
            {**_moe_cfg(128, 128, 64, 8, 4), "USE_TMA": True}, {**_moe_cfg(128, 64, 64, 8, 3, 128, 64), "GROUP_M": 8},
            {**_moe_cfg(128, 128, 64, 8, 3), "USE_TMA": True, "GROUP_M": 8},
            {**_moe_cfg(128, 64, 64, 8, 3, 256, 64), "USE_TMA": True}, {**_moe_cfg(128, 128, 32, 8, 4), "USE_TMA": True},
            {**_moe_cfg(64, 128, 64, 4, 4), "USE_TMA": True}],
    },
    quick={"BLOCK_K": 32},
    smem={"_gate_up_kernel": _gate_up_smem, "_down_kernel": _down_smem},
)
#: The FP8 experts' launch (e4m3 weights and activations), per regime: a 1-byte K tile of 256
#: streams what a 2-byte one of 128 does; decode swaps A and B in both kernels so every fp8 MMA
#: has a weight tile of >= 64 rows as its M (wgmma). ``FP32_PROMOTE`` adds each K tile's fp8
#: product into the fp32 accumulator outside the MMA (Hopper's fp8 MMA accumulates in reduced
#: precision); ``False`` chains the MMAs instead. ``FP8_UPCAST`` multiplies in fp16 instead.
#: ``FUSE_QUANT`` quantizes x and the SwiGLU rows inside the GEMMs (default: up to
#: :data:`FUSE_QUANT_MAX_SLOTS` routed slots), ``SLOT_BLOCKS_MAX``
#: as for the bf16 experts.
FP8_LAUNCH = configs.Launch(
    op="moe_experts_fp8",
    keys=_MOE_KEYS + ("FP32_PROMOTE", "FP8_UPCAST", "FUSE_QUANT", "SLOT_BLOCKS_MAX"),
    interpreter=_MOE_INTERPRETER,
    regimes=REGIMES,
    smem={"_gate_up_kernel": _gate_up_smem, "_down_kernel": _down_smem},
)


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, w_desc, out_ptr, sorted_ids_ptr, block_expert_ptr, xs_ptr, ws_ptr,
                    n_slots, top_k, d, f, num_m,
                    stride_xt, stride_we, stride_wn, stride_om, stride_se,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr,
                    FP8: tl.constexpr, MMA: tl.constexpr = "chain", GROUP_M: tl.constexpr = 1,
                    USE_TMA: tl.constexpr = False, SLOT_BLOCKS: tl.constexpr = False, QUANT_X: tl.constexpr = False):
    # FP8: e4m3 weights with per-channel scales ws_ptr, and e4m3 rows of x with per-token scales
    # xs_ptr -- or, with QUANT_X, x in its own dtype, quantized per token here as quantize_rows_fp8
    # does (the amax in a first pass over d, then each K tile as it loads): decode then needs no
    # launch of its own for it. MMA: how the K loop sums its products (_mma).
    # SLOT_BLOCKS: no alignment (tiny batches, see SLOT_BLOCKS_MAX_SLOTS): block i is routed slot i
    # alone, block_expert_ptr points at the flat ids, and the output row is the slot.
    # w_desc: with USE_TMA a TMA descriptor of the weights seen as 2-D [E * 2f, d] (box
    # [BLOCK_N, BLOCK_K]), else unused.
    pid_m, pid_n = _block_and_tile(tl.program_id(0), num_m, tl.cdiv(f, BLOCK_N), GROUP_M)
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert < 0:          # block past the last expert's padded rows: nothing to do
        return
    rows, slots = _block_rows(pid_m, sorted_ids_ptr, n_slots, BLOCK_M, SLOT_BLOCKS)
    valid = slots < n_slots
    tok = (slots // top_k).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < f
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + tok[:, None] * stride_xt + offs_k[None, :]
    if SWAP_AB:
        # decode: the weight tile is the MMA's M operand ([BLOCK_N, BLOCK_K], its natural
        # K-contiguous layout) and the gathered rows are N (x^T, [BLOCK_K, BLOCK_M]), so the
        # accumulator is [BLOCK_N, BLOCK_M]: M = 64-256 is wgmma-sized even for 16 rows.
        acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros_like(acc_g)  # gate and up: two accumulators over the same rows of x
    wg_ptrs = _weight_ptrs(w_ptr, expert, offs_n, offs_k, stride_we, stride_wn, SWAP_AB)
    wu_ptrs = wg_ptrs + f * stride_wn
    w_row = (expert * 2 * f + pid_n * BLOCK_N).to(tl.int32)     # the gate tile's first row, TMA view
    if QUANT_X:
        x_scale, x_inv = _row_scales(x_ptrs, valid, offs_k, d, BLOCK_M, BLOCK_K)
    for k0 in range(0, d, BLOCK_K):
        k_ok = offs_k < d - k0
        xa = tl.load(x_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
        if QUANT_X:
            xa = _quantize_tile(xa, x_inv).to(w_ptr.dtype.element_ty)
        if USE_TMA:         # one bulk copy per tile into swizzled shared memory, no pointer math
            wg = _tma_tile(w_desc, w_row, k0, SWAP_AB)
            wu = _tma_tile(w_desc, w_row + f, k0, SWAP_AB)
        else:
            wg = _weight_tile(wg_ptrs, n_ok, k_ok, SWAP_AB)
            wu = _weight_tile(wu_ptrs, n_ok, k_ok, SWAP_AB)
        acc_g = _mma(acc_g, xa, wg, SWAP_AB, MMA)
        acc_u = _mma(acc_u, xa, wu, SWAP_AB, MMA)
        x_ptrs += BLOCK_K
        wg_ptrs += BLOCK_K
        wu_ptrs += BLOCK_K
    if FP8:                 # the token's scale times the output channel's
        if QUANT_X:
            xs = x_scale
        else:
            xs = tl.load(xs_ptr + tok, mask=valid, other=0.0)
        acc_g = _scale_products(acc_g, xs, tl.load(ws_ptr + expert * stride_se + offs_n, mask=n_ok, other=0.0),
                                SWAP_AB)
        acc_u = _scale_products(acc_u, xs, tl.load(ws_ptr + expert * stride_se + f + offs_n, mask=n_ok, other=0.0),
                                SWAP_AB)
    h = acc_g * tl.sigmoid(acc_g) * acc_u       # SwiGLU epilogue, in fp32
    if SWAP_AB:
        h = tl.trans(h)
    if FP8:
        h = _round_to_bf16(h)                    # the FP8 path's intermediate is bf16 (experts_fp8, step 3)
    o_ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(o_ptrs, h.to(out_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


@triton.jit
def _down_kernel(a_ptr, w_ptr, w_desc, y_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, as_ptr, ws_ptr,
                 n_slots, d, f, num_m,
                 stride_am, stride_we, stride_wn, stride_ys, stride_se,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr,
                 FP8: tl.constexpr, MMA: tl.constexpr = "chain", GROUP_M: tl.constexpr = 1,
                 USE_TMA: tl.constexpr = False, SLOT_BLOCKS: tl.constexpr = False, QUANT_A: tl.constexpr = False):
    # FP8 and MMA as in _gate_up_kernel, the rows' scales in as_ptr -- or, with QUANT_A, the bf16
    # SwiGLU rows quantized per row here as QUANT_X does there. w_desc: with USE_TMA a TMA
    # descriptor of the weights seen as 2-D [E * d, f]. SLOT_BLOCKS: as in _gate_up_kernel.
    pid_m, pid_n = _block_and_tile(tl.program_id(0), num_m, tl.cdiv(d, BLOCK_N), GROUP_M)
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return
    rows, slots = _block_rows(pid_m, sorted_ids_ptr, n_slots, BLOCK_M, SLOT_BLOCKS)
    valid = slots < n_slots
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < d
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    if SWAP_AB:     # [BLOCK_N, BLOCK_K] weight tile as M, a^T as N (see _gate_up_kernel)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    w_ptrs = _weight_ptrs(w_ptr, expert, offs_n, offs_k, stride_we, stride_wn, SWAP_AB)
    w_row = (expert * d + pid_n * BLOCK_N).to(tl.int32)         # the tile's first row, TMA view
    if QUANT_A:
        a_scale, a_inv = _row_scales(a_ptrs, valid, offs_k, f, BLOCK_M, BLOCK_K)
    for k0 in range(0, f, BLOCK_K):
        k_ok = offs_k < f - k0
        a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
        if QUANT_A:
            a = _quantize_tile(a, a_inv).to(w_ptr.dtype.element_ty)
        if USE_TMA:
            w = _tma_tile(w_desc, w_row, k0, SWAP_AB)
        else:
            w = _weight_tile(w_ptrs, n_ok, k_ok, SWAP_AB)
        acc = _mma(acc, a, w, SWAP_AB, MMA)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if FP8:                 # the routed row's scale times the output channel's
        if QUANT_A:
            sa = a_scale
        else:
            sa = tl.load(as_ptr + rows, mask=valid, other=0.0)
        acc = _scale_products(acc, sa, tl.load(ws_ptr + expert * stride_se + offs_n, mask=n_ok, other=0.0), SWAP_AB)
    if SWAP_AB:
        acc = tl.trans(acc)
    rw = tl.load(weights_ptr + slots, mask=valid, other=0.0).to(tl.float32)
    acc = acc * rw[:, None]                      # routing weight applied before the combine
    y_ptrs = y_ptr + slots[:, None].to(tl.int64) * stride_ys + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


def regime(n_slots: int, n_experts: int) -> str:
    """``"decode"`` (<= 8 routed rows per expert on average), ``"decode_wide"`` (<= 32) or ``"prefill"``."""
    rows_per_expert = n_slots / max(1, n_experts)
    return "decode" if rows_per_expert <= 8 else "decode_wide" if rows_per_expert <= 32 else "prefill"


#: routed slots (T * k) up to which the FP8 experts quantize x and the SwiGLU rows inside their two
#: GEMMs (``FUSE_QUANT``): the launches it saves outweigh the rows each program re-reads only at the
#: smallest batches (measured: ``results/notes_moe.md``)
FUSE_QUANT_MAX_SLOTS = 16
#: routed slots (T * k) up to which :func:`experts_triton` skips the alignment: block i is slot i
#: alone and its expert is ids[i], read straight from the router (``SLOT_BLOCKS`` in both
#: kernels). A block then holds one row instead of up to BLOCK_M, and two slots on the same expert
#: read its weights twice -- never within one token (top-k experts are distinct); one launch fewer
#: is worth more at that size. A config's ``SLOT_BLOCKS_MAX`` overrides it (0 = always align).
#: FP8 weights likewise (:func:`experts_triton_fp8`).
SLOT_BLOCKS_MAX_SLOTS = 32
#: decode-size alignment: ``"sort"`` (:func:`align_decode`) or ``"chunked"`` (``align_tokens_triton``)
DECODE_ALIGN = "sort"
#: prefill-size alignment on a GPU: ``"triton"`` (:func:`align_prefill`) or ``"torch"`` (the op chain)
PREFILL_ALIGN = "triton"


def pick_config(n_slots: int, n_experts: int, d: int, f: int, itemsize: int = 2, *, fp8: bool = False) -> dict:
    """The launch config for a shape: interpreter config on the CPU, else this GPU's config for
    the :func:`regime` (op "moe_experts", or "moe_experts_fp8" for FP8 weights).

    The GPU configs are sized for 2-byte operands (bf16/fp16); with 4-byte (fp32) operands every
    shared-memory tile doubles, so their K depth is halved (fp32 is the correctness path, not the
    tuned one)."""
    cfg = configs.launch_config(FP8_LAUNCH if fp8 else LAUNCH, key=regime(n_slots, n_experts))
    if itemsize > 2 and not configs.interpreting():
        for key in ("BLOCK_K", "DOWN_BLOCK_K"):
            if key in cfg:
                cfg[key] = max(16, cfg[key] * 2 // itemsize)
    return cfg


def fp8_mma_supported(device: torch.device) -> bool:
    """Whether ``tl.dot`` takes two e4m3 operands here (:func:`minimax_lab.runtime.supports`:
    the interpreter, or a GPU with FP8); ``device`` is the kernel device of the inputs."""
    return runtime.supports("fp8")


def _align(ids, n_experts: int, bm: int) -> Alignment:
    """The alignment for ``bm``-row blocks: a Triton kernel where one handles the size (decode
    sizes: one launch; prefill sizes on a GPU: three), else the torch chain. A failing kernel
    raises: there is no silent fallback."""
    n = ids.numel()
    if n <= TRITON_ALIGN_MAX_SLOTS:     # decode sizes: one launch instead of ~25 (see align.py)
        return (align_decode if DECODE_ALIGN == "sort" else align_tokens_triton)(ids.contiguous(), n_experts, bm)
    # prefill sizes on a GPU: three launches (the interpreter's sort of a 4096-slot chunk takes
    # seconds, so CPU runs keep the torch chain)
    if PREFILL_ALIGN == "triton" and not runtime.is_interpreter() and prefill_chunk(n, n_experts):
        return align_prefill(ids.contiguous(), n_experts, bm)
    return align_tokens_unchecked(ids, n_experts, bm)


def experts_triton(x, w_gate_up, w_down, weights, ids, *, config: dict | None = None,
                   alignment: Alignment | None = None, w_gate_up_scale: torch.Tensor | None = None,
                   w_down_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The fused MoE forward; returns ``[T, d]`` in ``x``'s dtype. Inputs as in :func:`moe_experts`.

    ``config`` overrides :func:`pick_config` key by key (keys ``BLOCK_M, BLOCK_N, BLOCK_K,
    num_warps, num_stages, SWAP_AB`` and optionally ``DOWN_BLOCK_N, DOWN_BLOCK_K``,
    ``DOWN_num_warps``, ``DOWN_num_stages``, ``DOWN_SWAP_AB`` for the down kernel); keys it
    leaves out keep the regime's values. ``GROUP_M`` (launch order: blocks walked per weight tile,
    1 by default) and ``USE_TMA`` (weight tiles through TMA descriptors where
    :func:`weight_tma_ok`; off by default) apply to both kernels unless ``DOWN_GROUP_M`` /
    ``DOWN_USE_TMA`` set the down kernel's. Without ``alignment``, ``T * k <= SLOT_BLOCKS_MAX``
    (default :data:`SLOT_BLOCKS_MAX_SLOTS`) runs without one (one slot per block).

    FP8 weights (``float8_e4m3fn`` with ``w_gate_up_scale [E, 2f]`` and ``w_down_scale [E, d]``)
    take :func:`experts_triton_fp8`'s path: ``x`` and the SwiGLU rows are quantized per row by
    a small kernel each, and both GEMMs multiply e4m3 by e4m3 into fp32. FP8 weights on a GPU
    without FP8, and bf16 inputs on one without bf16, raise
    :class:`minimax_lab.runtime.UnsupportedOnDevice`.
    """
    fp8 = check_fp8_weights(w_gate_up, w_down, w_gate_up_scale, w_down_scale)
    require_dtypes("the fused experts", x, w_gate_up, w_down)
    # before any launch: a tensor off the kernel device must not reach (and disable) the alignment kernel
    check_triton_inputs(float_dtypes=TRITON_DTYPES + ((FP8,) if fp8 else ()), x=x, w_gate_up=w_gate_up,
                        w_down=w_down, weights=weights, ids=ids, w_gate_up_scale=w_gate_up_scale,
                        w_down_scale=w_down_scale)
    if fp8:
        return experts_triton_fp8(x, w_gate_up, w_gate_up_scale, w_down, w_down_scale, weights, ids,
                                  config=config, alignment=alignment)
    out_dtype = x.dtype
    x, w_gate_up, w_down, weights = interpreter_safe(x, w_gate_up, w_down, weights)  # bf16 tl.dot is wrong there
    T, k = ids.shape
    E, d, f = w_down.shape
    n_slots = T * k
    cfg = configs.merge(LAUNCH, pick_config(n_slots, E, d, f, x.element_size()), config)
    slot_blocks = alignment is None and n_slots <= cfg.get("SLOT_BLOCKS_MAX", SLOT_BLOCKS_MAX_SLOTS)
    if slot_blocks:  # tiny batches: each slot a block of its own, no alignment launch
        sorted_ids = block_expert = ids.reshape(-1).contiguous()
    else:
        bm = cfg["BLOCK_M"]
        al = alignment if alignment is not None else _align(ids, E, bm)
        if al.block_m != bm:
            raise ValueError(f"alignment was built for block_m={al.block_m}, config wants BLOCK_M={bm}")
        sorted_ids, block_expert = al.sorted_ids, al.block_expert
    inter = launch_gate_up(x.contiguous(), w_gate_up.contiguous(), sorted_ids, block_expert, k, cfg,
                           slot_blocks=slot_blocks)
    y = launch_down(inter, w_down.contiguous(), sorted_ids, block_expert, weights.reshape(-1).contiguous(), cfg,
                    slot_blocks=slot_blocks)
    return y.view(T, k, d).sum(dim=1).to(out_dtype)


def experts_triton_fp8(x, w13, s13, w2, s2, weights, ids, *, config: dict | None = None,
                       alignment: Alignment | None = None) -> torch.Tensor:
    """FP8 experts (:mod:`.experts_reference`'s definition), no host sync. The smallest batches (up to
    :data:`FUSE_QUANT_MAX_SLOTS` routed slots, ``FUSE_QUANT``) quantize inside the GEMMs: the gate/up
    kernel quantizes its rows of ``x`` per token, the down kernel the bf16 SwiGLU rows per row --
    two launches and the ``k``-sum, as the bf16 experts, plus the alignment when
    ``T * k > SLOT_BLOCKS_MAX`` (up to it each slot is a block of its own, :data:`SLOT_BLOCKS_MAX_SLOTS`).
    Larger batches (``FUSE_QUANT=False``): ``x`` per token to e4m3 (:func:`quantize_rows_fp8`), the
    alignment, the gate/up GEMM (SwiGLU rows stored in bf16), those rows per row to e4m3, the down
    GEMM -- each program of a prefill GEMM would otherwise re-read its rows once per N tile. Inputs
    checked by :func:`experts_triton`. ``config`` as there, plus ``FP32_PROMOTE``, ``FP8_UPCAST``
    (multiply in fp16 instead of fp8) and ``FUSE_QUANT``, see :data:`FP8_LAUNCH`."""
    T, k = ids.shape
    E, d, f = w2.shape
    n_slots = T * k
    cfg = configs.merge(FP8_LAUNCH, pick_config(n_slots, E, d, f, 1, fp8=True), config)
    fuse = bool(cfg.get("FUSE_QUANT", n_slots <= FUSE_QUANT_MAX_SLOTS))
    slot_blocks = alignment is None and n_slots <= cfg.get("SLOT_BLOCKS_MAX", SLOT_BLOCKS_MAX_SLOTS)
    if slot_blocks:  # tiny batches: each slot a block of its own, no alignment launch
        sorted_ids = block_expert = ids.reshape(-1).contiguous()
        capacity = n_slots
    else:
        bm = cfg["BLOCK_M"]
        al = alignment if alignment is not None else _align(ids, E, bm)
        if al.block_m != bm:
            raise ValueError(f"alignment was built for block_m={al.block_m}, config wants BLOCK_M={bm}")
        sorted_ids, block_expert, capacity = al.sorted_ids, al.block_expert, al.capacity
    inter = torch.empty(capacity, f, dtype=INTERMEDIATE_DTYPE, device=x.device)
    # bf16 rows of y would be truncated by the interpreter's conversion: it gets fp32 there
    y_dtype = torch.float32 if runtime.is_interpreter() and x.dtype == torch.bfloat16 else x.dtype
    y = torch.empty(n_slots, d, dtype=y_dtype, device=x.device)
    w_flat = weights.reshape(-1).contiguous()
    if fuse:
        xc = x if x.stride(-1) == 1 else x.contiguous()
        launch_gate_up(xc, w13.contiguous(), sorted_ids, block_expert, k, cfg, out=inter, w_scale=s13.contiguous(),
                       quantize_x=True, slot_blocks=slot_blocks)
        launch_down(inter, w2.contiguous(), sorted_ids, block_expert, w_flat, cfg, out=y, w_scale=s2.contiguous(),
                    quantize_rows=True, slot_blocks=slot_blocks)
    else:
        x8, xs = quantize_rows_fp8(x)
        launch_gate_up(x8, w13.contiguous(), sorted_ids, block_expert, k, cfg, out=inter, x_scale=xs,
                       w_scale=s13.contiguous(), slot_blocks=slot_blocks)
        a8, a_scale = quantize_rows_fp8(inter, row_slots=None if slot_blocks else sorted_ids, n_slots=n_slots)
        launch_down(a8, w2.contiguous(), sorted_ids, block_expert, w_flat, cfg, out=y, a_scale=a_scale,
                    w_scale=s2.contiguous(), slot_blocks=slot_blocks)
    return y.view(T, k, d).sum(dim=1).to(x.dtype)


def quantize_rows_fp8(t: torch.Tensor, *, row_slots: torch.Tensor | None = None,
                      n_slots: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``t [n, m]`` (fp16/bf16/fp32, unit stride along ``m``) -> ``(t8 float8_e4m3fn [n, m],
    scale fp32 [n])`` in one launch, one program per row: the values and power-of-two scales of
    :func:`minimax_lab.fp8.quantize_fp8` (``dims=(-1,)``; the scale from the exact rule "smallest
    power of two with amax / scale <= 448", which ``quantize_fp8``'s log2 may miss by one binade
    when amax / 448 is within a rounding of a power of two). With ``row_slots [n]`` (an
    alignment's ``sorted_ids``) rows whose slot is ``>= n_slots`` are padding and are skipped
    (their outputs stay unwritten). Raises :class:`minimax_lab.runtime.UnsupportedOnDevice` on a
    GPU without FP8."""
    check_triton_inputs(t=t)
    runtime.require("fp8", "the FP8 row quantization kernel")
    n, m = t.shape
    if t.stride(1) != 1:
        t = t.contiguous()
    t8 = torch.empty(n, m, dtype=FP8, device=t.device)
    scale = torch.empty(n, dtype=torch.float32, device=t.device)
    if n == 0:
        return t8, scale
    block = min(256 if runtime.is_interpreter() else 2048, triton.next_power_of_2(max(m, 16)))
    rows = 16 if runtime.is_interpreter() else max(1, 4096 // block)   # ~4096 elements per program
    _quantize_rows_kernel[(triton.cdiv(n, rows),)](t, t8, scale, row_slots if row_slots is not None else scale,
                                                   n, m, n_slots, t.stride(0), t8.stride(0), ROWS=rows, BLOCK=block,
                                                   SKIP_PADDING=row_slots is not None, num_warps=4)
    return t8, scale


def _fp8_flags(cfg: dict, weights: torch.Tensor) -> dict:
    """The kernels' FP8 constexprs for ``weights`` under ``cfg``: ``FP8`` (e4m3 weights: the products
    are scaled) and ``MMA``, how the K loop sums its products (:func:`_mma`): ``"fp16"`` with
    ``FP8_UPCAST``, ``"promote"`` with ``FP32_PROMOTE`` (the default), else ``"chain"``."""
    fp8 = weights.dtype == FP8
    if fp8 and cfg.get("FP8_UPCAST", False):
        return {"FP8": True, "MMA": "fp16"}
    return {"FP8": fp8, "MMA": "promote" if fp8 and cfg.get("FP32_PROMOTE", True) else "chain"}


def _scales(scales: tuple, fp8: bool, dummy: torch.Tensor, names: tuple[str, str]):
    if fp8 and any(s is None for s in scales):
        raise ValueError(f"fp8 operands need {names[0]} and {names[1]}")
    if not fp8 and any(s is not None for s in scales):
        raise ValueError(f"{names[0]} / {names[1]} are for fp8 operands only")
    return tuple(dummy if s is None else s for s in scales)


def _operand_scales(in_kernel: bool, flag: str, scale, w_scale, fp8: bool, dummy: torch.Tensor, names: tuple):
    """The scale operands of a GEMM launch: ``(activation scale, weight scale)``. ``in_kernel``
    (``flag`` names it): the kernel quantizes the activations itself, only ``w_scale`` is needed
    (and stands in for the unused one); fp8 weights only."""
    if not in_kernel:
        return _scales((scale, w_scale), fp8, dummy, names)
    if not fp8:
        raise ValueError(f"{flag} is for fp8 weights only")
    ws = _scales((w_scale, w_scale), True, dummy, (names[1], names[1]))[1]
    return ws, ws


def weight_tma_ok(w: torch.Tensor) -> bool:
    """Can the contiguous expert weights ``w [E, n, m]`` (on the kernel device) be read as one
    2-D ``[E * n, m]`` TMA descriptor? Needs TMA (:func:`minimax_lab.runtime.supports`), a
    16-byte aligned base and rows of a multiple of 16 bytes."""
    if not runtime.supports("tma"):
        return False
    return w.is_contiguous() and w.data_ptr() % 16 == 0 and (w.shape[-1] * w.element_size()) % 16 == 0


def _weight_operand(w: torch.Tensor, block_n: int, block_k: int, use_tma: bool):
    """``w`` itself, or with ``use_tma`` its ``[E * n, m]`` TMA descriptor with box ``[block_n, block_k]``."""
    if not use_tma:
        return w
    E, n, m = w.shape
    return TensorDescriptor(w, [E * n, m], [m, 1], [block_n, block_k])


def _launch_order(cfg: dict, prefix: str, w: torch.Tensor) -> dict:
    """The kernel's ``GROUP_M`` and ``USE_TMA`` for this launch (``USE_TMA`` only where
    :func:`weight_tma_ok`)."""
    return {"GROUP_M": int(cfg.get(prefix + "GROUP_M", cfg.get("GROUP_M", 1))),
            "USE_TMA": bool(cfg.get(prefix + "USE_TMA", cfg.get("USE_TMA", False))) and weight_tma_ok(w)}


def launch_gate_up(x, w_gate_up, sorted_ids, block_expert, top_k: int, cfg: dict,
                   out: torch.Tensor | None = None, *, x_scale: torch.Tensor | None = None,
                   w_scale: torch.Tensor | None = None, slot_blocks: bool = False,
                   quantize_x: bool = False) -> torch.Tensor:
    """``_gate_up_kernel`` over an alignment (contiguous inputs): the ``[capacity, f]`` SwiGLU rows
    (padding rows are left unwritten), into ``out`` if given. FP8 weights (``w_gate_up`` in e4m3)
    need ``w_scale [E, 2f]`` and either ``x`` in e4m3 with ``x_scale [T]``, or ``quantize_x``: ``x``
    in its own dtype, quantized per token in the kernel; their rows are bf16.
    ``slot_blocks``: no alignment -- ``sorted_ids`` and ``block_expert`` are both the flat ids
    ``[T * k]``, each slot is a block of its own, and the result is ``[T * k, f]`` by slot."""
    T, d = x.shape
    f = w_gate_up.shape[1] // 2
    n_blocks = block_expert.numel()
    flags = _fp8_flags(cfg, w_gate_up)
    xs, ws = _operand_scales(quantize_x, "quantize_x", x_scale, w_scale, flags["FP8"], x, ("x_scale", "w_scale"))
    out_dtype = torch.bfloat16 if flags["FP8"] else x.dtype
    inter = torch.empty(sorted_ids.numel(), f, dtype=out_dtype, device=x.device) if out is None else out
    grid = (n_blocks * triton.cdiv(f, cfg["BLOCK_N"]),)
    order = _launch_order(cfg, "", w_gate_up)
    w_desc = _weight_operand(w_gate_up, cfg["BLOCK_N"], cfg["BLOCK_K"], order["USE_TMA"])
    _gate_up_kernel[grid](x, w_gate_up, w_desc, inter, sorted_ids, block_expert, xs, ws, T * top_k, top_k, d, f,
                          n_blocks, x.stride(0), w_gate_up.stride(0), w_gate_up.stride(1), inter.stride(0),
                          ws.stride(0) if flags["FP8"] else 0,
                          BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                          SWAP_AB=bool(cfg.get("SWAP_AB", False)), SLOT_BLOCKS=slot_blocks, QUANT_X=quantize_x,
                          **flags, **order, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return inter


def launch_down(inter, w_down, sorted_ids, block_expert, w_flat, cfg: dict,
                out: torch.Tensor | None = None, *, a_scale: torch.Tensor | None = None,
                w_scale: torch.Tensor | None = None, slot_blocks: bool = False,
                quantize_rows: bool = False) -> torch.Tensor:
    """``_down_kernel``: ``[n_slots, d]`` rows, each scaled by its routing weight (``w_flat``),
    into ``out`` if given. FP8 weights need ``w_scale [E, d]``, ``out`` (its dtype is the caller's
    choice) and either ``inter`` in e4m3 with ``a_scale [capacity]`` (per padded row), or
    ``quantize_rows``: ``inter`` the bf16 SwiGLU rows, quantized per row in the kernel.
    ``slot_blocks``: as in :func:`launch_gate_up` (``inter`` rows by slot)."""
    n_slots = w_flat.numel()
    E, d, f = w_down.shape
    flags = _fp8_flags(cfg, w_down)
    sa, sw = _operand_scales(quantize_rows, "quantize_rows", a_scale, w_scale, flags["FP8"], inter,
                             ("a_scale", "w_scale"))
    if out is None and flags["FP8"]:
        raise ValueError("launch_down with fp8 operands needs out= (the output dtype)")
    y = torch.empty(n_slots, d, dtype=inter.dtype, device=inter.device) if out is None else out
    dbn, dbk = cfg.get("DOWN_BLOCK_N", cfg["BLOCK_N"]), cfg.get("DOWN_BLOCK_K", cfg["BLOCK_K"])
    grid = (block_expert.numel() * triton.cdiv(d, dbn),)
    order = _launch_order(cfg, "DOWN_", w_down)
    w_desc = _weight_operand(w_down, dbn, dbk, order["USE_TMA"])
    _down_kernel[grid](inter, w_down, w_desc, y, sorted_ids, block_expert, w_flat, sa, sw, n_slots, d, f,
                       block_expert.numel(), inter.stride(0), w_down.stride(0), w_down.stride(1), y.stride(0),
                       sw.stride(0) if flags["FP8"] else 0,
                       BLOCK_M=cfg["BLOCK_M"], BLOCK_N=dbn, BLOCK_K=dbk,
                       SWAP_AB=bool(cfg.get("DOWN_SWAP_AB", cfg.get("SWAP_AB", False))), SLOT_BLOCKS=slot_blocks,
                       QUANT_A=quantize_rows, **flags, **order,
                       num_warps=cfg.get("DOWN_num_warps", cfg["num_warps"]),
                       num_stages=cfg.get("DOWN_num_stages", cfg["num_stages"]))
    return y
