"""Attention: dense (reference, SDPA, Triton FlashAttention) and MiniMax Sparse Attention.

Public entry points:

* ``attention(q, k, v, *, causal, scale, impl, return_lse)`` -- dense GQA attention
  (``minimax_lab.attention.dense``); ``impl`` is ``"reference" | "torch" | "triton"``.
* ``msa_select(q_idx, k_idx, *, block_size, topk, impl)`` and
  ``msa_attention(q, k, v, q_idx, k_idx, *, block_size, topk, impl)`` -- MiniMax Sparse
  Attention (``minimax_lab.attention.msa``), plus ``msa_decode_paged`` for paged sparse decode.
"""
from __future__ import annotations

from minimax_lab.attention.dense import attention
from minimax_lab.attention.msa import MSA_SHAPE, MSA_SHAPE_CPU, msa_attention, msa_decode_paged, msa_select

__all__ = ["attention", "MSA_SHAPE", "MSA_SHAPE_CPU", "msa_attention", "msa_decode_paged", "msa_select"]
