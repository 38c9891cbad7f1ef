"""Solutions of chapter 02's exercises (FlashAttention in Triton). Try each one first: the checker
says what is wrong."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


def tail_mask(start_n: int, block_n: int, n_keys: int) -> torch.Tensor:
    return torch.arange(start_n, start_n + block_n) < n_keys


def kv_tiles(m: int, block_m: int, block_n: int, S: int, Skv: int) -> tuple[list[int], list[int]]:
    off = Skv - S                                       # row i sees keys j <= i + off
    first_row, last_row = m * block_m, min((m + 1) * block_m, S) - 1
    full_end = max(min(first_row + off + 1, Skv), 0)    # keys every row sees (the first row sees fewest)
    end = max(min(last_row + off + 1, Skv), 0)          # keys some row sees (the last row sees most)
    n_full = full_end // block_n                        # whole tiles inside full_end: no mask needed
    n_any = -(-end // block_n)                          # tiles holding at least one visible key
    return list(range(n_full)), list(range(n_full, n_any))


def online_update(m, l, acc, s, v):  # noqa: E741 - the paper's names
    m_new = torch.maximum(m, s.amax(dim=-1))
    m_safe = torch.where(torch.isinf(m_new), 0.0, m_new)  # a row with no key yet: avoid -inf - (-inf)
    p = torch.exp(s - m_safe[:, None])
    alpha = torch.exp(m - m_safe)                          # < 1 when the max grew: rescale the past
    return m_new, l * alpha + p.sum(-1), acc * alpha[:, None] + p @ v


@triton.jit
def _softmax_rows_kernel(X, Y, C, stride_x, stride_y, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_N)
    x_row = X + row.to(tl.int64) * stride_x
    # The first tile starts the running max and sum (it holds column 0, so its max is finite).
    x = tl.load(x_row + offs, mask=offs < C, other=float("-inf"))
    m_i = tl.max(x, 0)
    l_i = tl.sum(tl.exp(x - m_i), 0)
    for start in range(BLOCK_N, C, BLOCK_N):
        cols = start + offs
        x = tl.load(x_row + cols, mask=cols < C, other=float("-inf"))
        m_new = tl.maximum(m_i, tl.max(x, 0))
        l_i = l_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(x - m_new), 0)
        m_i = m_new
    for start in range(0, C, BLOCK_N):
        cols = start + offs
        x = tl.load(x_row + cols, mask=cols < C, other=float("-inf"))
        tl.store(Y + row.to(tl.int64) * stride_y + cols, tl.exp(x - m_i) / l_i, mask=cols < C)


def softmax_rows(x: torch.Tensor, block_n: int = 16) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    R, C = x.shape
    _softmax_rows_kernel[(R,)](x, y, C, x.stride(0), y.stride(0), BLOCK_N=block_n)
    return y


def softmax_rows_torch(x: torch.Tensor, block_n: int = 16) -> torch.Tensor:
    """The same numbers without a kernel: the checker of 02.4 must refuse it."""
    return torch.softmax(x, dim=-1)


@triton.jit
def _flash_lse_kernel(Q, K, V, O, LSE, S, Skv, H, GROUP, qk_scale,
                      stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_ob, stride_os, stride_oh,
                      D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    hk = h // GROUP
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                mask=offs_m[:, None] < S, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    end = Skv
    if CAUSAL:
        end = tl.minimum(Skv, (start_m + 1) * BLOCK_M + Skv - S)
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + offs_n
        kv = b * stride_kb + hk * stride_kh + cols[:, None] * stride_ks + offs_d[None, :]
        k = tl.load(K + kv, mask=cols[:, None] < Skv, other=0.0)
        v = tl.load(V + kv, mask=cols[:, None] < Skv, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        visible = cols[None, :] < Skv
        if CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + Skv - S)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :],
             (acc / l_i[:, None]).to(O.dtype.element_ty), mask=offs_m[:, None] < S)
    tl.store(LSE + bh * S + offs_m, m_i + tl.log(l_i), mask=offs_m < S)   # the denominator, in natural log


def flash_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    B, S, Hq, D = q.shape
    Skv, Hkv = k.shape[1], k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty(B, Hq, S, device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(S, 16), B * Hq)
    _flash_lse_kernel[grid](q, k, v, o, lse, S, Skv, Hq, Hq // Hkv, 1 / math.sqrt(D),
                            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                            o.stride(0), o.stride(1), o.stride(2), D=D, BLOCK_M=16, BLOCK_N=16, CAUSAL=causal)
    return o, lse


def flash_with_lse_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True):
    """The same numbers without a kernel: the checker of 02.5 must refuse it."""
    B, S, Hq, D = q.shape
    kk, vv = (t.repeat_interleave(Hq // k.shape[2], dim=2) for t in (k, v))
    s = torch.einsum("bshd,bthd->bhst", q, kk) / math.sqrt(D)
    if causal:
        s = s.masked_fill(torch.ones(S, k.shape[1], dtype=torch.bool, device=q.device).tril(k.shape[1] - S).logical_not(), -math.inf)
    return torch.einsum("bhst,bthd->bshd", torch.softmax(s, -1), vv), torch.logsumexp(s, -1)
