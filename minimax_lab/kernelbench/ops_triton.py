"""The Triton kernels of the kernel bench's three small operators ("the workbook's best" for
them; :mod:`.ops` has their contracts). Each launcher refuses inputs that require grad (there is
no backward) and accumulates in fp32 whatever the input dtype."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minimax_lab import validate
from minimax_lab.triton_blocks import require_dtypes


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
        # lanes still at -inf contribute 0: the differences are guarded before exp, so no -inf - -inf
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(tl.where(m == float("-inf"), float("-inf"), m - m_safe)) \
            + tl.exp(tl.where(v == float("-inf"), float("-inf"), v - m_safe))
        m = m_new
    m_row = tl.max(m, axis=0)
    s_row = tl.sum(s * tl.exp(tl.where(m == float("-inf"), float("-inf"), m - m_row)), axis=0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        v = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        tl.store(y_ptr + row * stride_y + cols, (tl.exp(v - m_row) / s_row).to(y_ptr.dtype.element_ty), mask=cols < n_cols)


def softmax_triton(x: torch.Tensor) -> torch.Tensor:
    """Row softmax of ``x [R, C]`` (float16/bfloat16/float32, C >= 1), one program per row."""
    validate.check_triton_inputs(x=x)  # no backward: refuse autograd rather than detach silently
    require_dtypes("the softmax kernel", x)
    x = x.contiguous()
    y = torch.empty_like(x)
    block = min(4096, triton.next_power_of_2(x.shape[1]))
    if x.shape[0]:
        _softmax_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0), BLOCK=block)
    return y


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


def rmsnorm_residual_triton(x, residual, weight, eps: float = 1e-6):
    """``(y, h)`` of :func:`.ops.rmsnorm_residual`, one program per row."""
    validate.check_triton_inputs(x=x, residual=residual, weight=weight)  # no backward: refuse autograd
    require_dtypes("the RMSNorm kernel", x, residual, weight)
    x, residual, weight = x.contiguous(), residual.contiguous(), weight.contiguous()
    y, h = torch.empty_like(x), torch.empty_like(x)
    if x.shape[0]:
        _rmsnorm_residual_kernel[(x.shape[0],)](x, residual, weight, y, h, x.shape[1], eps,
                                                BLOCK=triton.next_power_of_2(x.shape[1]))
    return y, h


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


def rope_triton(x, positions, theta: float = 10000.0):
    """RoPE of :func:`.ops.rope`, one program per token (all heads at once)."""
    validate.check_triton_inputs(x=x, positions=positions)  # no backward: refuse autograd
    require_dtypes("the RoPE kernel", x)
    x, positions = x.contiguous(), positions.contiguous()
    y = torch.empty_like(x)
    B, S, H, D = x.shape
    if B * S:
        _rope_kernel[(B * S,)](x, positions, y, H, D // 2, math.log2(theta),
                               BLOCK_H=triton.next_power_of_2(H), BLOCK_D=triton.next_power_of_2(max(1, D // 2)))
    return y
