"""The PyTorch implementations of the kernel bench's three small operators (:mod:`.ops` has
their contracts): fp32 math in a few vectorized torch ops, the result in the input's dtype."""
from __future__ import annotations

import torch

from minimax_lab.kernelbench.ops_reference import rope_reference


def softmax_torch(x: torch.Tensor) -> torch.Tensor:
    """Row softmax of ``x [R, C]`` computed in fp32."""
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def rmsnorm_residual_torch(x, residual, weight, eps: float = 1e-6):
    """``(y, h)`` of :func:`.ops.rmsnorm_residual` computed in fp32."""
    h = x.float() + residual.float()
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype), h.to(x.dtype)


def rope_torch(x, positions, theta: float = 10000.0):
    """RoPE of :func:`.ops.rope` computed in fp32 (the reference's formula)."""
    return rope_reference(x.float(), positions, theta).to(x.dtype)
