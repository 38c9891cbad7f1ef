"""The PyTorch implementation of :func:`minimax_lab.paged_kv.write.write_kv`: one ``index_copy_``
over the flattened pool (FP8 caches: one :func:`minimax_lab.fp8.quantize_fp8` of all new rows)."""
from __future__ import annotations

import torch

from minimax_lab.fp8 import FP8, quantize_fp8


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
