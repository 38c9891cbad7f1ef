"""FP8 for the engine: what FP8 storage gives back.

The engine stores in FP8 (e4m3) only through the package's one quantizer,
:func:`minimax_lab.fp8.quantize_fp8` (an fp32 power-of-two scale per group, so ``x8 * scale`` is
exact in bf16 and fp32):

* the KV cache: K and V per token and head (scales ``[pages, page_size, Hkv]``, written by
  :func:`minimax_lab.paged_kv.write_kv`), MSA's index keys per token (scales ``[pages, page_size]``);
* the routed experts' weights per output channel (:func:`minimax_lab.moe.experts.quantize_experts`).

:func:`fake_quantize` is the value a tensor has after a
round trip through FP8 storage: MSA's prefill of a prompt's first chunk reads the chunk's own K/V
and index keys rather than the cache, and with an FP8 cache it reads these, exactly what the cache
holds, so a prompt prefilled whole or in chunks sees the same keys.
"""
from __future__ import annotations

import torch

from minimax_lab.fp8 import dequantize_fp8, quantize_fp8


def fake_quantize(x: torch.Tensor) -> torch.Tensor:
    """``x`` after FP8 storage with one scale per slice of its last dimension, in ``x``'s dtype
    (the dequantized FP8 value; no host sync, so it may run inside a CUDA graph)."""
    x8, scale = quantize_fp8(x, dims=(-1,), check_values=False)
    return dequantize_fp8(x8, scale, dtype=x.dtype)
