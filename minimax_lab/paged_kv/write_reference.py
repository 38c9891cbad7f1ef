"""The readable reference of :func:`minimax_lab.paged_kv.write.write_kv`: a Python loop, one token
at a time (FP8 caches: each head's row quantized with :func:`minimax_lab.fp8.quantize_fp8`)."""
from __future__ import annotations

from minimax_lab.fp8 import quantize_fp8


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
