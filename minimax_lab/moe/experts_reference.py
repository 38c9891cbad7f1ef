"""The obviously-right expert layer: a Python loop over experts, in fp32.

SwiGLU experts (Shazeer, arXiv 2002.05202): expert ``e`` maps a row ``x`` to
``W_down[e] @ (silu(W_gate[e] @ x) * (W_up[e] @ x))``. The MoE output of token ``t`` is the
routing-weighted sum over its ``k`` chosen experts: ``sum_j weights[t, j] * expert_{ids[t, j]}(x_t)``.

Weight layout shared by every implementation (``nn.Linear``'s ``[out, in]`` per expert):
``w_gate_up`` ``[E, 2f, d]`` -- rows ``0..f-1`` are the gate projection, rows ``f..2f-1`` the up
projection -- and ``w_down`` ``[E, d, f]``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from minimax_lab.validate import accumulate_dtype


def swiglu_expert(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """One expert on rows ``x`` ``[n, d]`` with its ``w_gate_up`` ``[2f, d]``, ``w_down`` ``[d, f]``."""
    f = w_down.shape[1]
    h = x @ w_gate_up.t()
    return (F.silu(h[:, :f]) * h[:, f:]) @ w_down.t()


def experts_reference(x, w_gate_up, w_down, weights, ids) -> torch.Tensor:
    """Loop over experts in fp32 (fp64 for fp64 inputs); returns ``[T, d]`` in ``x``'s dtype.
    Inputs as in :func:`moe_experts`."""
    work = accumulate_dtype(x.dtype)
    xf = x.to(work)
    out = torch.zeros(x.shape[0], x.shape[1], dtype=work, device=x.device)
    for e in range(w_gate_up.shape[0]):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        y = swiglu_expert(xf[tok], w_gate_up[e].to(work), w_down[e].to(work))
        out.index_add_(0, tok, y * weights[tok, slot].to(work)[:, None])
    return out.to(x.dtype)


def experts_loop(x, w_gate_up, w_down, weights, ids) -> torch.Tensor:
    """The same loop in the inputs' own dtype: the "per-expert loop" peer of the benchmark.

    Each expert's ``nonzero`` synchronises with the GPU once -- the cost a naive port pays.
    """
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for e in range(w_gate_up.shape[0]):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        y = swiglu_expert(x[tok], w_gate_up[e], w_down[e])
        out.index_add_(0, tok, (y * weights[tok, slot].to(y.dtype)[:, None]).float())
    return out.to(x.dtype)
