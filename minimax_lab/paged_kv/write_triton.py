"""The Triton implementation of :func:`minimax_lab.paged_kv.write.write_kv`: one program per token
and row chunk reads the token's slot, then copies its ``Hkv * D`` values for K and V; for FP8
caches one program per token and group of heads quantizes each head's row in registers, exactly
as ``quantize_fp8(k_new, dims=(-1,))`` does (power-of-two scale, round to nearest even), and
stores it with its scale."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minimax_lab.fp8 import FP8, FP8_MAX
from minimax_lab.triton_blocks import require_dtypes
from minimax_lab.validate import FLOAT_DTYPES, check_triton_inputs


@triton.jit
def _write_kv_kernel(KN, VN, KC, VC, SLOTS,
                     stride_knew_t, stride_knew_h, stride_knew_d, stride_vnew_t, stride_vnew_h, stride_vnew_d,
                     stride_kcache_p, stride_kcache_s, stride_kcache_h, stride_kcache_d,
                     stride_vcache_p, stride_vcache_s, stride_vcache_h, stride_vcache_d, n_slots,
                     PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, ROW: tl.constexpr, BLOCK: tl.constexpr):
    tok = tl.program_id(0)
    chunk = tl.program_id(1)
    slot = tl.load(SLOTS + tok)
    # negative slot: a padding token, nothing to write; a slot past the pool (only possible with
    # check_values=False) is skipped too, so the kernel never writes outside the cache
    if (slot >= 0) & (slot < n_slots):
        page = slot // PAGE
        off = slot % PAGE
        idx = chunk * BLOCK + tl.arange(0, BLOCK)  # flat index into this token's Hkv * D values
        ok = idx < ROW
        h = idx // HEAD_DIM
        d = idx % HEAD_DIM
        # the *_d strides are 1 for every usual layout (Triton specialises a 1 away)
        k = tl.load(KN + tok.to(tl.int64) * stride_knew_t + h * stride_knew_h + d * stride_knew_d, mask=ok)
        v = tl.load(VN + tok.to(tl.int64) * stride_vnew_t + h * stride_vnew_h + d * stride_vnew_d, mask=ok)
        tl.store(KC + page * stride_kcache_p + off * stride_kcache_s + h * stride_kcache_h + d * stride_kcache_d,
                 k.to(KC.dtype.element_ty), mask=ok)
        tl.store(VC + page * stride_vcache_p + off * stride_vcache_s + h * stride_vcache_h + d * stride_vcache_d,
                 v.to(VC.dtype.element_ty), mask=ok)


@triton.jit
def _quantize_rows(x):
    """Each row of ``x`` (fp32 ``[R, C]``) as ``quantize_fp8(x, dims=(-1,))`` stores it: ``(x / s``
    rounded to nearest even on e4m3's grid, fp32; ``s`` ``[R]``), ``s`` the smallest power of two
    with ``amax / s <= 448`` (1 for an all-zero row)."""
    amax = tl.max(tl.abs(x), 1)
    # s = 2**ceil(log2(amax / 448)) from amax's bits, exact (a log2 on the GPU is approximate):
    # amax = m * 2**E with m in [1, 2) and 448 = 1.75 * 2**8, so the exponent is E - 8, plus 1 when m > 1.75
    bits = amax.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127 - 8 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    e = tl.minimum(tl.maximum(e, -126), 126)  # s and 1/s stay normal fp32 (amax < 2**-118 only: not the minimum)
    scale = tl.where(amax > 0, ((e + 127) << 23).to(tl.float32, bitcast=True), 1.0)
    inv = tl.where(amax > 0, ((127 - e) << 23).to(tl.float32, bitcast=True), 1.0)
    y = tl.minimum(tl.maximum(x * inv[:, None], -FP8_MAX_C), FP8_MAX_C)  # a power of two: exact
    # Round to nearest even on e4m3's grid in fp32, not by the fp32 -> fp8 conversion: Triton's
    # interpreter rounds that one differently from torch. The grid step is 2**(E - 3) at |y| in
    # [2**E, 2**(E+1)), 2**-9 below 2**-6 (subnormals); adding then subtracting c = 1.5 * 2**(step
    # exponent + 23) makes fp32's own round-to-nearest-even round |y| to that step.
    ay = tl.abs(y)
    step = tl.maximum(((ay.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6) - 3
    c = (((step + 150) << 23) | 0x400000).to(tl.float32, bitcast=True)
    r = (ay + c) - c
    return tl.where(y < 0, -r, r), scale


FP8_MAX_C = tl.constexpr(FP8_MAX)


@triton.jit
def _write_kv_fp8_kernel(KN, VN, KC, VC, KS, VS, SLOTS,
                         stride_knew_t, stride_knew_h, stride_knew_d, stride_vnew_t, stride_vnew_h, stride_vnew_d,
                         stride_kcache_p, stride_kcache_s, stride_kcache_h, stride_kcache_d,
                         stride_vcache_p, stride_vcache_s, stride_vcache_h, stride_vcache_d,
                         stride_kscale_p, stride_kscale_s, stride_kscale_h,
                         stride_vscale_p, stride_vscale_s, stride_vscale_h,
                         n_slots, Hkv,
                         PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    tok = tl.program_id(0)
    hb = tl.program_id(1)
    slot = tl.load(SLOTS + tok)
    if (slot >= 0) & (slot < n_slots):  # padding and (unchecked) slots past the pool: nothing written
        page = slot // PAGE
        off = slot % PAGE
        h = hb * BLOCK_H + tl.arange(0, BLOCK_H)  # whole heads: each row's scale needs all its D values
        d = tl.arange(0, BLOCK_D)
        h_ok = h < Hkv
        ok = h_ok[:, None] & (d[None, :] < HEAD_DIM)
        k = tl.load(KN + tok.to(tl.int64) * stride_knew_t + h[:, None] * stride_knew_h + d[None, :] * stride_knew_d,
                    mask=ok, other=0.0)
        v = tl.load(VN + tok.to(tl.int64) * stride_vnew_t + h[:, None] * stride_vnew_h + d[None, :] * stride_vnew_d,
                    mask=ok, other=0.0)
        k8, ksc = _quantize_rows(k.to(tl.float32))
        v8, vsc = _quantize_rows(v.to(tl.float32))
        k_at = (page * stride_kcache_p + off * stride_kcache_s + h[:, None] * stride_kcache_h
                + d[None, :] * stride_kcache_d)
        v_at = (page * stride_vcache_p + off * stride_vcache_s + h[:, None] * stride_vcache_h
                + d[None, :] * stride_vcache_d)
        tl.store(KC + k_at, k8.to(KC.dtype.element_ty), mask=ok)  # on e4m3's grid already: the conversion is exact
        tl.store(VC + v_at, v8.to(VC.dtype.element_ty), mask=ok)
        tl.store(KS + page * stride_kscale_p + off * stride_kscale_s + h * stride_kscale_h, ksc, mask=h_ok)
        tl.store(VS + page * stride_vscale_p + off * stride_vscale_s + h * stride_vscale_h, vsc, mask=h_ok)


def write_kv_triton(k_new, v_new, k_cache, v_cache, slot_mapping, *, k_scale=None, v_scale=None) -> None:
    """Grid ``(T, cdiv(Hkv * D, BLOCK))`` (FP8: ``(T, cdiv(Hkv, BLOCK_H))``); any strides (the
    caches and scales are written in place). bf16 or FP8 tensors on a GPU without them raise
    :class:`minimax_lab.runtime.UnsupportedOnDevice`."""
    require_dtypes("the KV-cache write kernel", k_new, v_new, k_cache, v_cache)
    T, Hkv, D = k_new.shape
    # a copy kernel: every float dtype is fine; autograd would not see the in-place write
    check_triton_inputs(float_dtypes=FLOAT_DTYPES + (FP8,), k_new=k_new, v_new=v_new, k_cache=k_cache,
                        v_cache=v_cache, k_scale=k_scale, v_scale=v_scale)
    if T == 0:
        return
    slot_mapping = slot_mapping.contiguous()
    if k_scale is not None:
        # fp64 rows are rounded to fp32 by torch first (as quantize_fp8 does); narrower ones load as they are
        k_new, v_new = (t.float() if t.dtype == torch.float64 else t for t in (k_new, v_new))
        BLOCK_D = triton.next_power_of_2(D)
        BLOCK_H = min(triton.next_power_of_2(Hkv), max(1, 2048 // BLOCK_D))
        _write_kv_fp8_kernel[(T, triton.cdiv(Hkv, BLOCK_H))](
            k_new, v_new, k_cache, v_cache, k_scale, v_scale, slot_mapping, *k_new.stride(), *v_new.stride(),
            *k_cache.stride(), *v_cache.stride(), *k_scale.stride(), *v_scale.stride(),
            k_cache.shape[0] * k_cache.shape[1], Hkv, PAGE=k_cache.shape[1], HEAD_DIM=D, BLOCK_H=BLOCK_H,
            BLOCK_D=BLOCK_D, num_warps=4)
        return
    # cast the new rows (not the cache) up front: torch rounds to nearest like the reference, while
    # the interpreter's in-kernel fp32 -> bf16 conversion truncates
    k_new, v_new = k_new.to(k_cache.dtype), v_new.to(v_cache.dtype)
    row = Hkv * D
    BLOCK = min(1024, triton.next_power_of_2(row))
    _write_kv_kernel[(T, triton.cdiv(row, BLOCK))](
        k_new, v_new, k_cache, v_cache, slot_mapping, *k_new.stride(), *v_new.stride(),
        *k_cache.stride(), *v_cache.stride(), k_cache.shape[0] * k_cache.shape[1],
        PAGE=k_cache.shape[1], HEAD_DIM=D, ROW=row, BLOCK=BLOCK, num_warps=4)
