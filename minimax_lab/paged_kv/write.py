"""Write new keys and values into their pages: the step before every decode or prefill kernel.

Contract::

    write_kv(k_new, v_new, k_cache, v_cache, slot_mapping, *, impl="torch", k_scale=None, v_scale=None) -> None

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

``impl`` (each a plain function of its own module): ``"reference"``
(:func:`.write_reference.write_kv_reference`, a Python loop, one token at a time), ``"torch"``,
the default (:func:`.write_torch.write_kv_torch`, one ``index_copy_`` over the flattened pool),
``"triton"`` (:func:`.write_triton.write_kv_triton`, one program per token and row chunk: it
reads the token's slot, then copies its ``Hkv * D`` values for K and V; for FP8 caches one
program per token and group of heads quantizes each head's row in registers).
"""
from __future__ import annotations

import torch

from minimax_lab.paged_kv.layout import CACHE_DTYPES, check_kv_scales
from minimax_lab.paged_kv.write_reference import write_kv_reference
from minimax_lab.paged_kv.write_torch import write_kv_torch
from minimax_lab.paged_kv.write_triton import write_kv_triton
from minimax_lab.validate import FLOAT_DTYPES, IMPLS, check_choice, check_same_device, check_tensor



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


def write_kv(k_new, v_new, k_cache, v_cache, slot_mapping, *, impl: str = "torch",
             check_values: bool = True, k_scale: torch.Tensor | None = None,
             v_scale: torch.Tensor | None = None) -> None:
    """Write ``T`` new tokens' K/V into their slots of the paged pools, in place (see module docstring).

    ``impl`` is ``"torch"`` by default (runs everywhere, quickly on a CPU); ``impl="triton"``
    selects the Triton kernel, ``impl="reference"`` the one-token-at-a-time loop.

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
