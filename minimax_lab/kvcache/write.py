"""Write new keys and values into their pages: the step before every decode or prefill kernel.

Contract::

    write_kv(k_new, v_new, k_cache, v_cache, slot_mapping, *, impl="triton", k_scale=None, v_scale=None) -> None

* ``k_new, v_new [T, Hkv, D]`` -- the K/V of ``T`` new tokens (any float dtype; cast to the
  cache's dtype on write);
* ``k_cache, v_cache [num_pages, page_size, Hkv, D]`` -- written **in place**;
* ``slot_mapping int64 [T]`` -- token ``i`` goes to page ``slot // page_size``, offset
  ``slot % page_size`` (``slot = page * page_size + offset``, vLLM's convention). A negative
  slot means "padding, write nothing". Slots must be distinct (two tokens in one slot: which
  one lands is undefined) and below ``num_pages * page_size`` (checked; with
  ``check_values=False`` the Triton kernel skips a slot past the pool instead, so it never
  writes outside the cache).

Any strides (the caches are written in place through their strides, whatever the layout);
``T = 0`` writes nothing. ``impl="triton"`` refuses inputs that require grad (the write is not
recorded by autograd) with a ``ValueError``.

**FP8 caches.** With ``float8_e4m3fn`` caches, ``k_scale, v_scale`` fp32 ``[num_pages,
page_size, Hkv]`` (one scale per token and kv head, written in place too) are required: each
new token's row of each head is quantized on its own, exactly as
``quantize_fp8(k_new, dims=(-1,))`` does it (power-of-two scale, round to nearest even), and lands
with its scale. Per-page scales ``[num_pages, Hkv]`` raise ``ValueError``: a new token cannot
change the scale of the tokens already in its page. ``k_new``/``v_new`` must then be finite
(checked unless ``impl="triton"`` with ``check_values=False``).

The block manager (``minimax_lab.kvcache.blocks``) computes the slots: a sequence of length
``n`` appending one token writes slot ``block_table[n // ps] * ps + n % ps``.

``impl``: ``"reference"`` (a Python loop, one token at a time), ``"torch"`` (one
``index_copy_`` over the flattened pool), ``"triton"`` (one program per token and row chunk:
it reads the token's slot, then copies its ``Hkv * D`` values for K and V; for FP8 caches one
program per token and group of heads quantizes each head's row in registers).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minimax_lab.fp8 import FP8, FP8_MAX, quantize_fp8
from minimax_lab.kvcache.paged import CACHE_DTYPES, check_kv_scales
from minimax_lab.validate import FLOAT_DTYPES, check_choice, check_same_device, check_tensor, check_triton_inputs

IMPLS = ("reference", "torch", "triton")


def _check_write(k_new, v_new, k_cache, v_cache, slot_mapping, impl, check_values, k_scale=None, v_scale=None):
    check_choice(impl, "impl", IMPLS)
    check_tensor(k_cache, "k_cache", ndim=4, dtypes=CACHE_DTYPES)
    P, ps, Hkv, D = k_cache.shape
    check_tensor(v_cache, "v_cache", shape=[P, ps, Hkv, D], dtypes=(k_cache.dtype,))
    fp8 = check_kv_scales(k_cache, v_cache, k_scale, v_scale, per_page=False) is not None
    check_tensor(k_new, "k_new", ndim=3, dtypes=FLOAT_DTYPES)
    T = k_new.shape[0]
    check_tensor(k_new, "k_new", shape=[T, Hkv, D])
    check_tensor(v_new, "v_new", shape=[T, Hkv, D], dtypes=FLOAT_DTYPES)
    check_tensor(slot_mapping, "slot_mapping", shape=[T], dtypes=(torch.int64,))
    check_same_device(k_new=k_new, v_new=v_new, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    if (check_values or impl != "triton") and T and int(slot_mapping.max()) >= P * ps:
        raise ValueError(f"slot_mapping values must be < num_pages * page_size = {P * ps}, "
                         f"got {int(slot_mapping.max())}")
    if fp8 and (check_values or impl != "triton") and T:
        for name, new in (("k_new", k_new), ("v_new", v_new)):
            if not bool(torch.isfinite(new).all()):
                raise ValueError(f"{name} has inf or NaN values; an FP8 cache stores finite values only")
    return T, P, ps, Hkv, D


def write_kv_reference(k_new, v_new, k_cache, v_cache, slot_mapping, *, k_scale=None, v_scale=None) -> None:
    """One token at a time: find its page and offset, copy its rows (FP8: quantize each head's
    row with :func:`minimax_lab.fp8.quantize_fp8`, store it and its scale)."""
    ps = k_cache.shape[1]
    for i, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        for new, cache, scale in ((k_new, k_cache, k_scale), (v_new, v_cache, v_scale)):
            if scale is None:
                cache[slot // ps, slot % ps] = new[i].to(cache.dtype)
            else:
                x8, s = quantize_fp8(new[i], dims=(-1,))  # [Hkv, D] fp8, [Hkv] fp32
                cache[slot // ps, slot % ps] = x8
                scale[slot // ps, slot % ps] = s


def write_kv_torch(k_new, v_new, k_cache, v_cache, slot_mapping, *, k_scale=None, v_scale=None) -> None:
    """Vectorised: view the pool as ``[num_pages * page_size, Hkv, D]`` and ``index_copy_`` (FP8:
    one :func:`minimax_lab.fp8.quantize_fp8` of all new rows, then the rows and their scales)."""
    P, ps, Hkv, D = k_cache.shape
    keep = slot_mapping >= 0
    slots, kn, vn = slot_mapping[keep], k_new[keep], v_new[keep]
    for cache, new, scale in ((k_cache, kn, k_scale), (v_cache, vn, v_scale)):
        if scale is not None:
            new, s = quantize_fp8(new, dims=(-1,), check_values=False)  # finite: checked by write_kv
            _index_write(scale, slots, s)
        _index_write(cache, slots, new.to(cache.dtype))


def _index_write(pool, slots, rows) -> None:
    """``pool[slot // ps, slot % ps] = rows`` for a ``[num_pages, page_size, ...]`` pool."""
    P, ps = pool.shape[:2]
    if pool.dtype == FP8:  # index_copy_ has no float8 kernel: move the bytes through uint8 views
        pool, rows = pool.view(torch.uint8), rows.view(torch.uint8)
    if pool.is_contiguous():
        pool.view(P * ps, *pool.shape[2:]).index_copy_(0, slots, rows)
    else:  # a strided pool: write through advanced indexing instead
        pool[slots // ps, slots % ps] = rows


@triton.jit
def _write_kv_kernel(KN, VN, KC, VC, SLOTS, skn_t, skn_h, skn_d, svn_t, svn_h, svn_d,
                     skc_p, skc_s, skc_h, skc_d, svc_p, svc_s, svc_h, svc_d, n_slots,
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
        k = tl.load(KN + tok.to(tl.int64) * skn_t + h * skn_h + d * skn_d, mask=ok)
        v = tl.load(VN + tok.to(tl.int64) * svn_t + h * svn_h + d * svn_d, mask=ok)
        tl.store(KC + page * skc_p + off * skc_s + h * skc_h + d * skc_d, k.to(KC.dtype.element_ty), mask=ok)
        tl.store(VC + page * svc_p + off * svc_s + h * svc_h + d * svc_d, v.to(VC.dtype.element_ty), mask=ok)


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
def _write_kv_fp8_kernel(KN, VN, KC, VC, KS, VS, SLOTS, skn_t, skn_h, skn_d, svn_t, svn_h, svn_d,
                         skc_p, skc_s, skc_h, skc_d, svc_p, svc_s, svc_h, svc_d, sks_p, sks_s, sks_h,
                         svs_p, svs_s, svs_h, n_slots, Hkv,
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
        k = tl.load(KN + tok.to(tl.int64) * skn_t + h[:, None] * skn_h + d[None, :] * skn_d, mask=ok, other=0.0)
        v = tl.load(VN + tok.to(tl.int64) * svn_t + h[:, None] * svn_h + d[None, :] * svn_d, mask=ok, other=0.0)
        k8, ksc = _quantize_rows(k.to(tl.float32))
        v8, vsc = _quantize_rows(v.to(tl.float32))
        tl.store(KC + page * skc_p + off * skc_s + h[:, None] * skc_h + d[None, :] * skc_d,
                 k8.to(KC.dtype.element_ty), mask=ok)  # on e4m3's grid already: the conversion is exact
        tl.store(VC + page * svc_p + off * svc_s + h[:, None] * svc_h + d[None, :] * svc_d,
                 v8.to(VC.dtype.element_ty), mask=ok)
        tl.store(KS + page * sks_p + off * sks_s + h * sks_h, ksc, mask=h_ok)
        tl.store(VS + page * svs_p + off * svs_s + h * svs_h, vsc, mask=h_ok)


def write_kv_triton(k_new, v_new, k_cache, v_cache, slot_mapping, *, k_scale=None, v_scale=None) -> None:
    """Grid ``(T, cdiv(Hkv * D, BLOCK))`` (FP8: ``(T, cdiv(Hkv, BLOCK_H))``); any strides (the
    caches and scales are written in place)."""
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


def write_kv(k_new, v_new, k_cache, v_cache, slot_mapping, *, impl: str = "triton",
             check_values: bool = True, k_scale: torch.Tensor | None = None,
             v_scale: torch.Tensor | None = None) -> None:
    """Write ``T`` new tokens' K/V into their slots of the paged pools, in place (see module docstring).

    ``check_values=False`` skips, for ``impl="triton"``, the range check on ``slot_mapping`` and
    (FP8) the finiteness check on the new rows (device syncs); the kernel then skips slots past
    the pool. The other impls always check. ``k_scale``/``v_scale``: the per-token scales of
    ``float8_e4m3fn`` caches, written with the rows (required with them, refused without).
    """
    _check_write(k_new, v_new, k_cache, v_cache, slot_mapping, impl, check_values, k_scale, v_scale)
    kw = dict(k_scale=k_scale, v_scale=v_scale)
    if impl == "reference":
        write_kv_reference(k_new, v_new, k_cache, v_cache, slot_mapping, **kw)
    elif impl == "torch":
        write_kv_torch(k_new, v_new, k_cache, v_cache, slot_mapping, **kw)
    else:
        write_kv_triton(k_new, v_new, k_cache, v_cache, slot_mapping, **kw)
