"""The Triton implementation of :func:`minimax_lab.paged_kv.write.write_kv`: one program per token
and row chunk reads the token's slot, then copies its ``Hkv * D`` values for K and V; for FP8
caches one program per token and group of heads quantizes each head's row in registers, exactly
as ``quantize_fp8(k_new, dims=(-1,))`` does (power-of-two scale, round to nearest even), and
stores it with its scale. The kernels take each tensor's strides as one tuple, K's and V's side by
side (``new_strides``: the new rows' ``(token, head, dim)``; ``cache_strides``: the caches' ``(page,
slot, head, dim)``; ``scale_strides``: the scales' ``(page, slot, head)``); their launch blocks are
:data:`LAUNCH` and :data:`FP8_LAUNCH`."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minimax_lab import configs
from minimax_lab.fp8 import FP8, FP8_MAX
from minimax_lab.triton_blocks import require_dtypes
from minimax_lab.validate import FLOAT_DTYPES, check_triton_inputs


#: The copy kernel's launch: ``BLOCK``, the most values of a token's ``Hkv * D`` row one program
#: copies (fewer when the row is shorter), and warps.
LAUNCH = configs.Launch(op="write_kv", keys=("BLOCK", "num_warps"), interpreter={"BLOCK": 1024, "num_warps": 4})

#: The FP8 kernel's launch: ``BLOCK``, the most values one program quantizes -- whole heads of one
#: token, ``BLOCK // D`` of them (at least one) -- and warps.
FP8_LAUNCH = configs.Launch(op="write_kv_fp8", keys=("BLOCK", "num_warps"), interpreter={"BLOCK": 2048, "num_warps": 4})


@triton.jit
def _cache_offsets(cache_strides, page, off, h, d):
    """The offsets of entries ``(page, off, h, d)`` (broadcast against each other) in the K and V caches."""
    kc, vc = cache_strides
    return (page * kc[0] + off * kc[1] + h * kc[2] + d * kc[3],
            page * vc[0] + off * vc[1] + h * vc[2] + d * vc[3])


@triton.jit
def _write_kv_kernel(KN, VN, KC, VC, SLOTS, new_strides, cache_strides, n_slots,
                     PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, ROW: tl.constexpr, BLOCK: tl.constexpr):
    tok = tl.program_id(0)
    chunk = tl.program_id(1)
    slot = tl.load(SLOTS + tok)
    # negative slot: a padding token, nothing to write; a slot past the pool (only possible with
    # check_values=False) is skipped too, so the kernel never writes outside the cache
    if (slot >= 0) & (slot < n_slots):
        idx = chunk * BLOCK + tl.arange(0, BLOCK)  # flat index into this token's Hkv * D values
        ok = idx < ROW
        h = idx // HEAD_DIM
        d = idx % HEAD_DIM
        k_at, v_at = _cache_offsets(cache_strides, slot // PAGE, slot % PAGE, h, d)
        kn, vn = new_strides
        # the dim strides are 1 for every usual layout (Triton specialises a 1 away)
        k = tl.load(KN + tok.to(tl.int64) * kn[0] + h * kn[1] + d * kn[2], mask=ok)
        v = tl.load(VN + tok.to(tl.int64) * vn[0] + h * vn[1] + d * vn[2], mask=ok)
        tl.store(KC + k_at, k.to(KC.dtype.element_ty), mask=ok)
        tl.store(VC + v_at, v.to(VC.dtype.element_ty), mask=ok)


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
def _write_kv_fp8_kernel(KN, VN, KC, VC, KS, VS, SLOTS, new_strides, cache_strides, scale_strides, n_slots, Hkv,
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
        kn, vn = new_strides
        k = tl.load(KN + tok.to(tl.int64) * kn[0] + h[:, None] * kn[1] + d[None, :] * kn[2], mask=ok, other=0.0)
        v = tl.load(VN + tok.to(tl.int64) * vn[0] + h[:, None] * vn[1] + d[None, :] * vn[2], mask=ok, other=0.0)
        k8, ksc = _quantize_rows(k.to(tl.float32))
        v8, vsc = _quantize_rows(v.to(tl.float32))
        k_at, v_at = _cache_offsets(cache_strides, page, off, h[:, None], d[None, :])
        tl.store(KC + k_at, k8.to(KC.dtype.element_ty), mask=ok)  # on e4m3's grid already: the conversion is exact
        tl.store(VC + v_at, v8.to(VC.dtype.element_ty), mask=ok)
        ks, vs = scale_strides
        tl.store(KS + page * ks[0] + off * ks[1] + h * ks[2], ksc, mask=h_ok)
        tl.store(VS + page * vs[0] + off * vs[1] + h * vs[2], vsc, mask=h_ok)


def write_kv_triton(k_new, v_new, k_cache, v_cache, slot_mapping, *, k_scale=None, v_scale=None) -> None:
    """Grid ``(T, cdiv(Hkv * D, BLOCK))`` (FP8: ``(T, cdiv(Hkv, BLOCK // D))``; ``BLOCK`` from
    :data:`LAUNCH` / :data:`FP8_LAUNCH`); any strides (the caches and scales are written in place).
    bf16 or FP8 tensors on a GPU without them raise :class:`minimax_lab.runtime.UnsupportedOnDevice`."""
    require_dtypes("the KV-cache write kernel", k_new, v_new, k_cache, v_cache)
    T, Hkv, D = k_new.shape
    # a copy kernel: every float dtype is fine; autograd would not see the in-place write
    check_triton_inputs(float_dtypes=FLOAT_DTYPES + (FP8,), k_new=k_new, v_new=v_new, k_cache=k_cache,
                        v_cache=v_cache, k_scale=k_scale, v_scale=v_scale)
    if T == 0:
        return
    fp8 = k_scale is not None
    cfg = configs.launch_config(FP8_LAUNCH if fp8 else LAUNCH)
    slot_mapping = slot_mapping.contiguous()
    if fp8:
        # fp64 rows are rounded to fp32 by torch first (as quantize_fp8 does); narrower ones load as they are
        k_new, v_new = (t.float() if t.dtype == torch.float64 else t for t in (k_new, v_new))
    else:
        # cast the new rows (not the cache) up front: torch rounds to nearest like the reference, while
        # the interpreter's in-kernel fp32 -> bf16 conversion truncates
        k_new, v_new = k_new.to(k_cache.dtype), v_new.to(v_cache.dtype)
    strides = dict(new_strides=(tuple(k_new.stride()), tuple(v_new.stride())),
                   cache_strides=(tuple(k_cache.stride()), tuple(v_cache.stride())),
                   n_slots=k_cache.shape[0] * k_cache.shape[1], PAGE=k_cache.shape[1], HEAD_DIM=D,
                   num_warps=cfg["num_warps"])
    if fp8:
        BLOCK_D = triton.next_power_of_2(D)
        BLOCK_H = min(triton.next_power_of_2(Hkv), max(1, cfg["BLOCK"] // BLOCK_D))
        _write_kv_fp8_kernel[(T, triton.cdiv(Hkv, BLOCK_H))](
            k_new, v_new, k_cache, v_cache, k_scale, v_scale, slot_mapping, **strides,
            scale_strides=(tuple(k_scale.stride()), tuple(v_scale.stride())), Hkv=Hkv, BLOCK_H=BLOCK_H,
            BLOCK_D=BLOCK_D)
    else:
        row = Hkv * D
        BLOCK = min(cfg["BLOCK"], triton.next_power_of_2(row))
        _write_kv_kernel[(T, triton.cdiv(row, BLOCK))](k_new, v_new, k_cache, v_cache, slot_mapping, **strides,
                                                      ROW=row, BLOCK=BLOCK)
