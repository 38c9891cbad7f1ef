"""The readable references of the kernel bench's three small operators (:mod:`.ops` has their
contracts): what every implementation and candidate is checked against."""
from __future__ import annotations

import torch


def softmax_reference(x: torch.Tensor) -> torch.Tensor:
    """Row softmax, spelled out: subtract the row max (so exp never overflows), exp, normalise."""
    xf = x.to(torch.float64) if x.dtype == torch.float64 else x.float()
    e = torch.exp(xf - xf.max(dim=-1, keepdim=True).values)
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


def rmsnorm_residual_reference(x, residual, weight, eps: float = 1e-6):
    """``h = x + residual``; ``y = h / sqrt(mean(h^2) + eps) * weight`` (Zhang & Sennrich 2019)."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = x.to(acc) + residual.to(acc)
    y = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.to(acc)
    return y.to(x.dtype), h.to(x.dtype)


def rope_reference(x, positions, theta: float = 10000.0):
    """Rotate each pair (x[i], x[i + D/2]) by angle ``pos * theta**(-2i/D)``."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, dtype=acc, device=x.device) * 2 / x.shape[-1])
    angle = positions.to(acc)[..., None] * inv_freq  # [B, S, half]
    cos, sin = torch.cos(angle)[:, :, None, :], torch.sin(angle)[:, :, None, :]
    x1, x2 = x[..., :half].to(acc), x[..., half:].to(acc)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
