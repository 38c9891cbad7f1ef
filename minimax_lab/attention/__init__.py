"""Attention: dense (reference, SDPA, Triton FlashAttention) and MiniMax Sparse Attention.

Public entry points (loaded on first use, so importing this package stays cheap):

* ``attention(q, k, v, *, causal, scale, impl, return_lse)`` -- dense GQA attention
  (``minimax_lab.attention.dense``); ``impl`` is ``"reference" | "torch" | "triton"``.
* ``msa_select(q_idx, k_idx, *, block_size, topk, impl)`` and
  ``msa_attention(q, k, v, q_idx, k_idx, *, block_size, topk, impl)`` -- MiniMax Sparse
  Attention (``minimax_lab.attention.msa``), plus ``msa_decode_paged`` for paged sparse decode.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "attention": "minimax_lab.attention.dense",
    "msa_select": "minimax_lab.attention.msa",
    "msa_attention": "minimax_lab.attention.msa",
    "msa_decode_paged": "minimax_lab.attention.msa",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'minimax_lab.attention' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS))
