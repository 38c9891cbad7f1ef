"""FP8 index tensors for MSA. In decode the index branch reads every page's keys at every step, so
storing them in FP8 (e4m3) halves the bytes of the part of decode that is bandwidth-bound; in
prefill the index scores are an ``S^2`` GEMM, and FP8 queries and keys run it on the FP8 tensor
cores (twice bf16's rate on Hopper; MSA's own indexer is FP8).

Each token's key ``k_idx [D_idx]`` is stored as ``k8 = k_idx / scale`` in ``float8_e4m3fn`` with
one fp32 power-of-two ``scale`` per token (:func:`minimax_lab.fp8.quantize_fp8`), so ``k8 * scale``
is exact in bf16 and fp32 and the kernel may apply it after the dot product (``(q . k8) * scale``)
without changing a bit: every implementation ranks the same dequantized keys. What FP8 loses is the rounding of each key to
e4m3's 3 mantissa bits (a relative error up to 2**-4); how often that changes a selection is
measured by the ``msa`` bench (``selection_rows_equal`` of its ``fp8 index`` records).

    k8, scale = quantize_index_keys(k_idx_cache)      # [P, ps, D_idx] fp8, [P, ps] fp32
    msa_decode_paged(..., k8, k_idx_scale=scale, impl="triton")

Prefill quantizes the queries too, one power-of-two scale per (token, group) row:

    q8, q_scale = quantize_index_keys(q_idx)           # [B, S, G, D_idx] fp8, [B, S, G] fp32
    k8, k_scale = quantize_index_keys(k_idx)           # [B, S, D_idx] fp8, [B, S] fp32
    msa_select(q8, k8, q_idx_scale=q_scale, k_idx_scale=k_scale, impl="triton")
"""
from __future__ import annotations

import torch

from minimax_lab.fp8 import check_fp8_scale, check_scales_given, dequantize_fp8, quantize_fp8


def quantize_index_keys(k_idx_cache: torch.Tensor, *, check_values: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k8 float8_e4m3fn [..., D_idx], scale fp32 [...])`` with a power-of-two scale per vector
    (per token's key, or per (token, group) query row): ``k8.float() * scale[..., None]`` is the
    stored vector. All-zero vectors get scale 1. Raises TypeError for a non-tensor, ValueError
    for a non-float one or (unless ``check_values=False``: no device-to-host read) inf/NaN values."""
    return quantize_fp8(k_idx_cache, dims=(-1,), check_values=check_values)


def dequantize_index_keys(k8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``k8 * scale`` in ``dtype`` (exact for bf16, fp16 within range, fp32)."""
    return dequantize_fp8(k8, scale, dtype=dtype)


def check_fp8_index(k_idx_cache: torch.Tensor, k_idx_scale) -> bool:
    """Whether the index keys are FP8 (then ``k_idx_scale`` must be fp32 ``k_idx_cache.shape[:2]``
    on its device); a scale given for non-FP8 keys raises too. Raises TypeError/ValueError."""
    if not check_scales_given(k_idx_cache, "k_idx_cache", "index keys", {"k_idx_scale": k_idx_scale},
                              expect="k_idx_scale (fp32 [num_pages, page_size]); make both with quantize_index_keys"):
        return False
    check_fp8_scale(k_idx_cache, k_idx_scale, "k_idx_scale")
    return True


def check_fp8_index_pair(q_idx: torch.Tensor, k_idx: torch.Tensor, q_idx_scale, k_idx_scale) -> bool:
    """Prefill's index tensors (already of one dtype): whether they are FP8, in which case both
    scales must be given, fp32, shaped like their tensor without the last dimension and on its
    device; scales given for non-FP8 tensors raise too. Raises TypeError/ValueError."""
    if not check_scales_given(q_idx, "q_idx", "index tensors", {"q_idx_scale": q_idx_scale, "k_idx_scale": k_idx_scale},
                              expect="q_idx_scale (fp32 [B, S, G]) and k_idx_scale (fp32 [B, S]); make both with "
                                     "quantize_index_keys"):
        return False
    check_fp8_scale(q_idx, q_idx_scale, "q_idx_scale")
    check_fp8_scale(k_idx, k_idx_scale, "k_idx_scale")
    return True
