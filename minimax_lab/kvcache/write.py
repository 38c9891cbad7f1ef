"""Write new keys and values into their pages: the step before every decode or prefill kernel.

Contract::

    write_kv(k_new, v_new, k_cache, v_cache, slot_mapping, *, impl="triton") -> None

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

The block manager (``minimax_lab.kvcache.blocks``) computes the slots: a sequence of length
``n`` appending one token writes slot ``block_table[n // ps] * ps + n % ps``.

``impl``: ``"reference"`` (a Python loop, one token at a time), ``"torch"`` (one
``index_copy_`` over the flattened pool), ``"triton"`` (one program per token and row chunk:
it reads the token's slot, then copies its ``Hkv * D`` values for K and V).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minimax_lab.validate import FLOAT_DTYPES, check_choice, check_same_device, check_tensor, check_triton_inputs

IMPLS = ("reference", "torch", "triton")


def _check_write(k_new, v_new, k_cache, v_cache, slot_mapping, impl, check_values):
    check_choice(impl, "impl", IMPLS)
    check_tensor(k_cache, "k_cache", ndim=4, dtypes=FLOAT_DTYPES)
    P, ps, Hkv, D = k_cache.shape
    check_tensor(v_cache, "v_cache", shape=[P, ps, Hkv, D], dtypes=(k_cache.dtype,))
    check_tensor(k_new, "k_new", ndim=3, dtypes=FLOAT_DTYPES)
    T = k_new.shape[0]
    check_tensor(k_new, "k_new", shape=[T, Hkv, D])
    check_tensor(v_new, "v_new", shape=[T, Hkv, D], dtypes=FLOAT_DTYPES)
    check_tensor(slot_mapping, "slot_mapping", shape=[T], dtypes=(torch.int64,))
    check_same_device(k_new=k_new, v_new=v_new, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    if (check_values or impl != "triton") and T and int(slot_mapping.max()) >= P * ps:
        raise ValueError(f"slot_mapping values must be < num_pages * page_size = {P * ps}, "
                         f"got {int(slot_mapping.max())}")
    return T, P, ps, Hkv, D


def write_kv_reference(k_new, v_new, k_cache, v_cache, slot_mapping) -> None:
    """One token at a time: find its page and offset, copy its rows."""
    ps = k_cache.shape[1]
    for i, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        k_cache[slot // ps, slot % ps] = k_new[i].to(k_cache.dtype)
        v_cache[slot // ps, slot % ps] = v_new[i].to(v_cache.dtype)


def write_kv_torch(k_new, v_new, k_cache, v_cache, slot_mapping) -> None:
    """Vectorised: view the pool as ``[num_pages * page_size, Hkv, D]`` and ``index_copy_``."""
    P, ps, Hkv, D = k_cache.shape
    keep = slot_mapping >= 0
    slots, kn, vn = slot_mapping[keep], k_new[keep], v_new[keep]
    for cache, new in ((k_cache, kn), (v_cache, vn)):
        flat = cache.view(P * ps, Hkv, D) if cache.is_contiguous() else None
        if flat is not None:
            flat.index_copy_(0, slots, new.to(cache.dtype))
        else:  # a strided pool: write through advanced indexing instead
            cache[slots // ps, slots % ps] = new.to(cache.dtype)


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


def write_kv_triton(k_new, v_new, k_cache, v_cache, slot_mapping) -> None:
    """Grid ``(T, cdiv(Hkv * D, BLOCK))``; any strides (the caches are written in place)."""
    T, Hkv, D = k_new.shape
    # a copy kernel: every float dtype is fine; autograd would not see the in-place write
    check_triton_inputs(float_dtypes=FLOAT_DTYPES, k_new=k_new, v_new=v_new, k_cache=k_cache, v_cache=v_cache)
    if T == 0:
        return
    # cast the new rows (not the cache) up front: torch rounds to nearest like the reference, while
    # the interpreter's in-kernel fp32 -> bf16 conversion truncates
    k_new, v_new = k_new.to(k_cache.dtype), v_new.to(v_cache.dtype)
    slot_mapping = slot_mapping.contiguous()
    row = Hkv * D
    BLOCK = min(1024, triton.next_power_of_2(row))
    _write_kv_kernel[(T, triton.cdiv(row, BLOCK))](
        k_new, v_new, k_cache, v_cache, slot_mapping, *k_new.stride(), *v_new.stride(),
        *k_cache.stride(), *v_cache.stride(), k_cache.shape[0] * k_cache.shape[1],
        PAGE=k_cache.shape[1], HEAD_DIM=D, ROW=row, BLOCK=BLOCK, num_warps=4)


def write_kv(k_new, v_new, k_cache, v_cache, slot_mapping, *, impl: str = "triton",
             check_values: bool = True) -> None:
    """Write ``T`` new tokens' K/V into their slots of the paged pools, in place (see module docstring).

    ``check_values=False`` skips, for ``impl="triton"``, the range check on ``slot_mapping`` (a
    device sync); the kernel then skips slots past the pool. The other impls always check.
    """
    _check_write(k_new, v_new, k_cache, v_cache, slot_mapping, impl, check_values)
    if impl == "reference":
        write_kv_reference(k_new, v_new, k_cache, v_cache, slot_mapping)
    elif impl == "torch":
        write_kv_torch(k_new, v_new, k_cache, v_cache, slot_mapping)
    else:
        write_kv_triton(k_new, v_new, k_cache, v_cache, slot_mapping)
