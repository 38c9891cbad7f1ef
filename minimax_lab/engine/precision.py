"""FP8 for the engine: which kernels have an FP8 path, and what FP8 storage gives back.

The engine stores in FP8 (e4m3) only through the package's one quantizer,
:func:`minimax_lab.fp8.quantize_fp8` (an fp32 power-of-two scale per group, so ``x8 * scale`` is
exact in bf16 and fp32):

* the KV cache: K and V per token and head (scales ``[pages, page_size, Hkv]``, written by
  :func:`minimax_lab.kvcache.write_kv`), MSA's index keys per token (scales ``[pages, page_size]``);
* the routed experts' weights per output channel (:func:`minimax_lab.moe.experts_fp8.quantize_experts`).

:func:`missing_kv` and :func:`missing_experts` name the FP8 entry points this installation lacks
(an empty string when all are there); :class:`~minimax_lab.engine.options.EngineOptions` raises
``NotImplementedError`` with that text. :func:`fake_quantize` is the value a tensor has after a
round trip through FP8 storage: MSA's prefill of a prompt's first chunk reads the chunk's own K/V
and index keys rather than the cache, and with an FP8 cache it reads these, exactly what the cache
holds, so a prompt prefilled whole or in chunks sees the same keys.
"""
from __future__ import annotations

import importlib
import inspect

import torch

from minimax_lab.fp8 import dequantize_fp8, quantize_fp8


def _accepts(module: str, function: str, *params: str) -> bool:
    try:
        fn = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError):
        return False
    try:
        names = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return all(p in names for p in params)


def missing_kv() -> str:
    """The FP8 KV-cache entry points this installation lacks, as one phrase ('' when none)."""
    want = [("minimax_lab.kvcache", "write_kv"), ("minimax_lab.kvcache", "paged_decode"),
            ("minimax_lab.kvcache", "paged_prefill"), ("minimax_lab.attention", "msa_decode_paged")]
    gone = [f"{m}.{f}(..., k_scale=, v_scale=)" for m, f in want if not _accepts(m, f, "k_scale", "v_scale")]
    return ", ".join(gone)


def missing_experts() -> str:
    """The FP8 expert entry points this installation lacks, as one phrase ('' when none)."""
    gone = []
    if not _accepts("minimax_lab.moe.experts_fp8", "quantize_experts", "w_gate_up", "w_down"):
        gone.append("minimax_lab.moe.experts_fp8.quantize_experts(w_gate_up, w_down)")
    if not _accepts("minimax_lab.moe", "moe_experts", "w_gate_up_scale", "w_down_scale"):
        gone.append("minimax_lab.moe.moe_experts(..., w_gate_up_scale=, w_down_scale=)")
    return ", ".join(gone)


def fake_quantize(x: torch.Tensor) -> torch.Tensor:
    """``x`` after FP8 storage with one scale per slice of its last dimension, in ``x``'s dtype
    (the dequantized FP8 value; no host sync, so it may run inside a CUDA graph)."""
    x8, scale = quantize_fp8(x, dims=(-1,), check_values=False)
    return dequantize_fp8(x8, scale, dtype=x.dtype)
