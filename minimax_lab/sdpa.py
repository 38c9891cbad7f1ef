"""PyTorch's ``scaled_dot_product_attention``, called so its CUDA kernels can read the inputs.

Its memory-efficient CUDA kernel reads 16-byte vectors after checking strides and head size but
not the data pointer itself, so a view with a storage offset (``buf[1:].view(...)``, a slice of
a larger cache) makes it fault with ``CUDA error: misaligned address`` -- which poisons the
process's CUDA context for every later call (pytorch/pytorch#183484, seen on torch 2.11 here).
:func:`sdpa` copies only such misaligned tensors (a rare layout) and passes everything else
through untouched.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

#: the widest vector PyTorch's attention kernels load (bytes)
VECTOR_BYTES = 16


def aligned(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when its data pointer is 16-byte aligned (or it is not on a GPU), else a
    contiguous copy (fresh allocations are aligned)."""
    if x.device.type != "cuda" or x.data_ptr() % VECTOR_BYTES == 0:
        return x
    return x.contiguous() if not x.is_contiguous() else x.clone()


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, **kwargs)`` with misaligned inputs (and an
    ``attn_mask``) copied first; same shapes, dtypes and semantics."""
    if "attn_mask" in kwargs and isinstance(kwargs["attn_mask"], torch.Tensor):
        kwargs["attn_mask"] = aligned(kwargs["attn_mask"])
    return F.scaled_dot_product_attention(aligned(q), aligned(k), aligned(v), **kwargs)
