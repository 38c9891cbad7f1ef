"""Solution of chapter 04's backward exercise (04.9), and the same step in plain PyTorch. Try it
first: the checker says what is wrong."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _block_backward_kernel(Q, K, V, dO, LSE, Delta, QPos, KPos, dQ, dK, dV, M, N, D, scale,
                           BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    rows, cols, d = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, BD)
    rmask, cmask, dmask = rows < M, cols < N, d < D
    q = tl.load(Q + rows[:, None] * D + d[None, :], mask=rmask[:, None] & dmask[None, :], other=0.0)
    do = tl.load(dO + rows[:, None] * D + d[None, :], mask=rmask[:, None] & dmask[None, :], other=0.0)
    k = tl.load(K + cols[:, None] * D + d[None, :], mask=cmask[:, None] & dmask[None, :], other=0.0)
    v = tl.load(V + cols[:, None] * D + d[None, :], mask=cmask[:, None] & dmask[None, :], other=0.0)
    lse = tl.load(LSE + rows, mask=rmask, other=0.0)
    delta = tl.load(Delta + rows, mask=rmask, other=0.0)
    qp = tl.load(QPos + rows, mask=rmask, other=-1)
    kp = tl.load(KPos + cols, mask=cmask, other=2**30)
    visible = rmask[:, None] & cmask[None, :] & (kp[None, :] <= qp[:, None])
    p = tl.where(visible, tl.exp(tl.dot(q, tl.trans(k)) * scale - lse[:, None]), 0.0)  # the forward's softmax
    dv = tl.dot(tl.trans(p), do)
    ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
    dq = tl.dot(ds, k) * scale
    dk = tl.dot(tl.trans(ds), q) * scale
    tl.store(dQ + rows[:, None] * D + d[None, :], dq, mask=rmask[:, None] & dmask[None, :])
    tl.store(dK + cols[:, None] * D + d[None, :], dk, mask=cmask[:, None] & dmask[None, :])
    tl.store(dV + cols[:, None] * D + d[None, :], dv, mask=cmask[:, None] & dmask[None, :])


def block_backward(q, k, v, do, lse, delta, q_pos, k_pos, scale):
    q, k, v, do = (x.contiguous() for x in (q, k, v, do))
    (M, D), N = q.shape, k.shape[0]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    pad = lambda n: max(16, triton.next_power_of_2(n))  # noqa: E731 - tl.dot wants >= 16 per side
    _block_backward_kernel[(1,)](q, k, v, do, lse.contiguous(), delta.contiguous(), q_pos.contiguous(),
                                 k_pos.contiguous(), dq, dk, dv, M, N, D, scale, BM=pad(M), BN=pad(N), BD=pad(D))
    return dq, dk, dv


def block_backward_torch(q, k, v, do, lse, delta, q_pos, k_pos, scale):
    """The same step in PyTorch: what the kernel computes, without the tiles."""
    seen = k_pos[None, :].long() <= q_pos[:, None].long()
    p = torch.exp((q @ k.T) * scale - lse[:, None]).masked_fill(~seen, 0.0)
    ds = p * (do @ v.T - delta[:, None])
    return scale * ds @ k, scale * ds.T @ q, p.T @ do
