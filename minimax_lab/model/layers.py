"""The model's parts: RMSNorm, rotary position embedding (RoPE), patch embedding, SwiGLU FFN,
and the materialized attention probabilities used for plots.

RoPE follows Su et al. 2021 (RoFormer, arXiv:2104.09864), "rotate half" pairing of dims
``i`` and ``i + D/2``. SwiGLU follows Shazeer 2020 (arXiv:2002.05202).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """``x / rms(x) * weight`` over the last dim (Zhang & Sennrich 2019), computed in fp32."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope_cos_sin(positions: torch.Tensor, head_dim: int, base: float = 10000.0):
    """positions ``[B, S]`` int -> cos, sin ``[B, S, 1, head_dim/2]`` fp32."""
    inv = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    ang = positions.float()[..., None] * inv
    return ang.cos()[:, :, None], ang.sin()[:, :, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, S, H, D]`` by the angles in cos/sin ``[B, S, 1, D/2]``; keeps x's dtype."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class PatchEmbed(nn.Module):
    """Cut ``[N, 3, H, W]`` images into ``p x p`` patches (row-major), project each to ``d_model``
    and add a learned 2-D position (row embedding + column embedding). Returns ``[N, P, d_model]``."""

    def __init__(self, image_size: int, patch_size: int, d_model: int):
        super().__init__()
        self.image_size, self.patch_size = image_size, patch_size
        self.grid = image_size // patch_size
        self.proj = nn.Linear(3 * patch_size * patch_size, d_model)
        self.row = nn.Embedding(self.grid, d_model)
        self.col = nn.Embedding(self.grid, d_model)

    def forward(self, images):
        N, C, H, W = images.shape
        p, g = self.patch_size, self.grid
        patches = images.reshape(N, C, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(N, g * g, C * p * p)
        rc = torch.arange(g, device=images.device)
        pos = (self.row(rc)[:, None] + self.col(rc)[None, :]).reshape(g * g, -1)
        return self.proj(patches) + pos


class SwiGLU(nn.Module):
    """Dense FFN: ``down(silu(gate(x)) * up(x))``, ``[..., d_model] -> [..., d_model]``."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def attention_probs(q: torch.Tensor, k: torch.Tensor, *, causal: bool = True, scale: float | None = None) -> torch.Tensor:
    """Materialized softmax probabilities for plots: q ``[B,S,Hq,D]``, k ``[B,S,Hkv,D]`` ->
    ``[B, Hq, S, S]`` fp32 (query head h uses kv head ``h // (Hq // Hkv)``)."""
    Hq, Hkv, D = q.shape[2], k.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    kk = k.float().repeat_interleave(Hq // Hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kk) * scale
    if causal:
        S = q.shape[1]
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s.softmax(-1)
