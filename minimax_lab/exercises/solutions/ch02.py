"""Solutions of chapter 02's exercises (FlashAttention in Triton). Try each one first: the checker
says what is wrong."""
from __future__ import annotations

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
