"""The three small operators the bench starts from, each with a readable fp32 reference
(:mod:`.ops_reference`), a PyTorch implementation (:mod:`.ops_torch`) and a Triton kernel
(:mod:`.ops_triton`, "the workbook's best" for them):

* ``softmax(x)`` -- row softmax over the last dim of ``x [R, C]``; returns ``[R, C]`` in x's dtype.
* ``rmsnorm_residual(x, residual, weight, eps)`` -- ``h = x + residual``;
  ``y = h / sqrt(mean(h^2) + eps) * weight``; ``x, residual [T, D]``, ``weight [D]``; returns
  ``(y, h)`` (the updated residual stream, as in pre-norm transformer blocks).
* ``rope(x, positions, theta)`` -- rotary embedding (Su et al. 2021, arXiv 2104.09864) on
  ``x [B, S, H, D]`` with ``positions`` int ``[B, S]``; pairs are (i, i + D/2) ("rotate half").

Each takes ``impl="reference" | "torch" | "triton"`` (default ``"torch"``; float64 inputs take
the PyTorch path under ``"triton"``); bad input raises ValueError/TypeError, and the Triton
kernels refuse inputs that require grad.
"""
from __future__ import annotations

import torch

from minimax_lab import validate
from minimax_lab.kernelbench.ops_reference import rmsnorm_residual_reference, rope_reference, softmax_reference
from minimax_lab.kernelbench.ops_torch import rmsnorm_residual_torch, rope_torch, softmax_torch
from minimax_lab.kernelbench.ops_triton import rmsnorm_residual_triton, rope_triton, softmax_triton

IMPLS = validate.IMPLS


def softmax(x: torch.Tensor, *, impl: str = "torch") -> torch.Tensor:
    """Row softmax of ``x [R, C]`` (floating point, C >= 1) in x's dtype."""
    validate.check_choice(impl, "impl", IMPLS)
    validate.check_tensor(x, "x", ndim=2, dtypes=validate.FLOAT_DTYPES)
    if x.shape[1] == 0:
        raise ValueError(f"x must have at least one column, got shape {tuple(x.shape)}")
    if impl == "reference":
        return softmax_reference(x)
    if impl == "torch" or x.dtype == torch.float64:
        return softmax_torch(x)
    return softmax_triton(x)


def rmsnorm_residual(x, residual, weight, eps: float = 1e-6, *, impl: str = "torch"):
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
        return rmsnorm_residual_torch(x, residual, weight, eps)
    return rmsnorm_residual_triton(x, residual, weight, eps)


def rope(x, positions, theta: float = 10000.0, *, impl: str = "torch"):
    """RoPE on ``x [B, S, H, D]`` (D even) at integer ``positions [B, S]``; returns x's shape and dtype."""
    validate.check_choice(impl, "impl", IMPLS)
    validate.check_tensor(x, "x", ndim=4, dtypes=validate.FLOAT_DTYPES)
    validate.check_tensor(positions, "positions", shape=list(x.shape[:2]), dtypes=validate.INT_DTYPES)
    if x.shape[-1] % 2:
        raise ValueError(f"head_dim must be even for RoPE, got {x.shape[-1]}")
    if impl == "reference":
        return rope_reference(x, positions, theta)
    if impl == "torch" or x.dtype == torch.float64:
        return rope_torch(x, positions, theta)
    return rope_triton(x, positions, theta)
