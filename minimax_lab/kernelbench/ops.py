"""The three small operators the bench starts from, each as a readable fp32 reference and a
Triton kernel ("the workbook's best" for them).

* ``softmax(x)`` -- row softmax over the last dim of ``x [R, C]``; returns ``[R, C]`` in x's dtype.
* ``rmsnorm_residual(x, residual, weight, eps)`` -- ``h = x + residual``;
  ``y = h / sqrt(mean(h^2) + eps) * weight``; ``x, residual [T, D]``, ``weight [D]``; returns
  ``(y, h)`` (the updated residual stream, as in pre-norm transformer blocks).
* ``rope(x, positions, theta)`` -- rotary embedding (Su et al. 2021, arXiv 2104.09864) on
  ``x [B, S, H, D]`` with ``positions`` int ``[B, S]``; pairs are (i, i + D/2) ("rotate half").

Each takes ``impl="reference" | "torch" | "triton"``; bad input raises ValueError/TypeError.
The Triton kernels accumulate in fp32 whatever the input dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minimax_lab import validate

IMPLS = validate.IMPLS


# --------------------------------------------------------------------------- softmax


def softmax_reference(x: torch.Tensor) -> torch.Tensor:
    """Row softmax, spelled out: subtract the row max (so exp never overflows), exp, normalise."""
    xf = x.to(torch.float64) if x.dtype == torch.float64 else x.float()
    e = torch.exp(xf - xf.max(dim=-1, keepdim=True).values)
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    # One program per row. Pass 1: online max and sum over column blocks; pass 2: write.
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        v = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, v)
        # lanes still at -inf contribute 0; guard the (-inf) - (-inf) = nan case
        s = s * tl.where(m_new == float("-inf"), 0.0, tl.exp(m - m_new)) + tl.where(v == float("-inf"), 0.0, tl.exp(v - m_new))
        m = m_new
    m_row = tl.max(m, axis=0)
    s_row = tl.sum(s * tl.where(m == float("-inf"), 0.0, tl.exp(m - m_row)), axis=0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        v = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        tl.store(y_ptr + row * stride_y + cols, (tl.exp(v - m_row) / s_row).to(y_ptr.dtype.element_ty), mask=cols < n_cols)


def softmax(x: torch.Tensor, *, impl: str = "triton") -> torch.Tensor:
    """Row softmax of ``x [R, C]`` (floating point, C >= 1) in x's dtype."""
    validate.check_choice(impl, "impl", IMPLS)
    validate.check_tensor(x, "x", ndim=2, dtypes=validate.FLOAT_DTYPES)
    if x.shape[1] == 0:
        raise ValueError(f"x must have at least one column, got shape {tuple(x.shape)}")
    if impl == "reference":
        return softmax_reference(x)
    if impl == "torch" or x.dtype == torch.float64:
        return torch.softmax(x.float(), dim=-1).to(x.dtype)
    validate.check_triton_inputs(x=x)  # no backward: refuse autograd rather than detach silently
    x = x.contiguous()
    y = torch.empty_like(x)
    block = min(4096, triton.next_power_of_2(x.shape[1]))
    if x.shape[0]:
        _softmax_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0), BLOCK=block)
    return y


# --------------------------------------------------------------------------- RMSNorm + residual


def rmsnorm_residual_reference(x, residual, weight, eps: float = 1e-6):
    """``h = x + residual``; ``y = h / sqrt(mean(h^2) + eps) * weight`` (Zhang & Sennrich 2019)."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = x.to(acc) + residual.to(acc)
    y = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.to(acc)
    return y.to(x.dtype), h.to(x.dtype)


@triton.jit
def _rmsnorm_residual_kernel(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, n_cols, eps, BLOCK: tl.constexpr):
    # One program per row; the whole row fits one block (BLOCK = next power of two >= D).
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    h = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32) \
        + tl.load(r_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n_cols + cols, (h * inv * w).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(h_ptr + row * n_cols + cols, h.to(h_ptr.dtype.element_ty), mask=mask)


def rmsnorm_residual(x, residual, weight, eps: float = 1e-6, *, impl: str = "triton"):
    """RMSNorm of ``x + residual``: ``x, residual [T, D]``, ``weight [D]`` -> ``(y, h)`` in x's dtype."""
    validate.check_choice(impl, "impl", IMPLS)
    validate.check_tensor(x, "x", ndim=2, dtypes=validate.FLOAT_DTYPES)
    validate.check_tensor(residual, "residual", shape=list(x.shape), dtypes=validate.FLOAT_DTYPES)
    validate.check_tensor(weight, "weight", shape=[x.shape[1]], dtypes=validate.FLOAT_DTYPES)
    validate.check_same_device(x=x, residual=residual, weight=weight)
    if not (isinstance(eps, float) and eps > 0):
        raise ValueError(f"eps must be a positive float, got {eps!r}")
    if impl == "reference":
        return rmsnorm_residual_reference(x, residual, weight, eps)
    if impl == "torch" or x.dtype == torch.float64:
        h = x.float() + residual.float()
        y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        return y.to(x.dtype), h.to(x.dtype)
    validate.check_triton_inputs(x=x, residual=residual, weight=weight)  # no backward: refuse autograd
    x, residual, weight = x.contiguous(), residual.contiguous(), weight.contiguous()
    y, h = torch.empty_like(x), torch.empty_like(x)
    if x.shape[0]:
        _rmsnorm_residual_kernel[(x.shape[0],)](x, residual, weight, y, h, x.shape[1], eps,
                                                BLOCK=triton.next_power_of_2(x.shape[1]))
    return y, h


# --------------------------------------------------------------------------- RoPE


def rope_reference(x, positions, theta: float = 10000.0):
    """Rotate each pair (x[i], x[i + D/2]) by angle ``pos * theta**(-2i/D)``."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, dtype=acc, device=x.device) * 2 / x.shape[-1])
    angle = positions.to(acc)[..., None] * inv_freq  # [B, S, half]
    cos, sin = torch.cos(angle)[:, :, None, :], torch.sin(angle)[:, :, None, :]
    x1, x2 = x[..., :half].to(acc), x[..., half:].to(acc)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


@triton.jit
def _rope_kernel(x_ptr, pos_ptr, y_ptr, n_heads, half, log2_theta, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    # One program per token (b, s): all heads at once, angles computed in registers.
    tok = tl.program_id(0)
    pos = tl.load(pos_ptr + tok).to(tl.float32)
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < n_heads) & (i < half)
    angle = pos * tl.exp2(-(2.0 * i.to(tl.float32) / (2 * half)) * log2_theta)
    c, s = tl.cos(angle), tl.sin(angle)
    base = tok * n_heads * 2 * half + h * 2 * half + i
    x1 = tl.load(x_ptr + base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + base + half, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + base, (x1 * c - x2 * s).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_ptr + base + half, (x2 * c + x1 * s).to(y_ptr.dtype.element_ty), mask=mask)


def rope(x, positions, theta: float = 10000.0, *, impl: str = "triton"):
    """RoPE on ``x [B, S, H, D]`` (D even) at integer ``positions [B, S]``; returns x's shape and dtype."""
    import math

    validate.check_choice(impl, "impl", IMPLS)
    validate.check_tensor(x, "x", ndim=4, dtypes=validate.FLOAT_DTYPES)
    validate.check_tensor(positions, "positions", shape=list(x.shape[:2]), dtypes=validate.INT_DTYPES)
    if x.shape[-1] % 2:
        raise ValueError(f"head_dim must be even for RoPE, got {x.shape[-1]}")
    if impl == "reference":
        return rope_reference(x, positions, theta)
    if impl == "torch" or x.dtype == torch.float64:
        return rope_reference(x.float(), positions, theta).to(x.dtype)
    validate.check_triton_inputs(x=x, positions=positions)  # no backward: refuse autograd
    x, positions = x.contiguous(), positions.contiguous()
    y = torch.empty_like(x)
    B, S, H, D = x.shape
    if B * S:
        _rope_kernel[(B * S,)](x, positions, y, H, D // 2, math.log2(theta),
                               BLOCK_H=triton.next_power_of_2(H), BLOCK_D=triton.next_power_of_2(max(1, D // 2)))
    return y
