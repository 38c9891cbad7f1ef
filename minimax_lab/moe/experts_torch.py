"""Vectorised expert layer: sort the routed slots by expert, then two grouped GEMMs.

1. flatten the ``T * k`` routed slots, sort them by expert (stable), gather their rows of ``x``;
2. ``torch._grouped_mm`` (one launch for all experts, each multiplying its contiguous run of
   rows) with ``w_gate_up``, SwiGLU, ``torch._grouped_mm`` with ``w_down``;
3. scale each row by its routing weight and scatter-add it back to its token (``index_add_``).

``torch._grouped_mm`` exists from torch 2.8 (bf16 on Hopper GPUs; fp32 on the CPU, forward
only -- its CPU backward fails on the transposed weight views). Where it is missing, where
autograd needs a backward on the CPU, or where ``d``/``f`` break its 16-byte alignment rule on
the GPU, step 2 uses a **padded batched matmul** instead: rows scattered into an
``[E, max_count, d]`` buffer (zeros elsewhere) and ``torch.bmm`` -- differentiable everywhere,
at the price of one host sync for ``max_count`` and the padding FLOPs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _sort_by_expert(ids: torch.Tensor, n_experts: int):
    flat = ids.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices          # slot indices, expert-major
    counts = torch.zeros(n_experts, dtype=torch.long, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))
    return flat, order, counts


def can_use_grouped_mm(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> bool:
    """Whether :func:`experts_grouped_mm` can run on these inputs here."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or w_gate_up.requires_grad or w_down.requires_grad)
    if x.device.type == "cpu":
        return not needs_grad and x.dtype == torch.float32
    d, f = w_down.shape[1], w_down.shape[2]
    return x.dtype == torch.bfloat16 and d % 8 == 0 and f % 8 == 0


def experts_grouped_mm(x, w_gate_up, w_down, weights, ids) -> torch.Tensor:
    """Sorted tokens through ``torch._grouped_mm``; gather and scatter-add included. ``[T, d]``."""
    T, k = ids.shape
    E, f = w_down.shape[0], w_down.shape[2]
    flat, order, counts = _sort_by_expert(ids, E)
    tok = order // k
    xs = x[tok]
    offs = torch.cumsum(counts, 0).to(torch.int32)
    h = torch._grouped_mm(xs, w_gate_up.transpose(1, 2), offs=offs)
    a = F.silu(h[:, :f]) * h[:, f:]
    y = torch._grouped_mm(a, w_down.transpose(1, 2), offs=offs)
    y = y * weights.reshape(-1)[order].to(y.dtype)[:, None]
    out = torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device)
    return out.index_add_(0, tok, y.float()).to(x.dtype)


def experts_padded_bmm(x, w_gate_up, w_down, weights, ids) -> torch.Tensor:
    """Sorted tokens scattered into ``[E, max_count, d]`` and ``torch.bmm``; differentiable. ``[T, d]``."""
    T, k = ids.shape
    E, d, f = w_down.shape
    flat, order, counts = _sort_by_expert(ids, E)
    tok = order // k
    expert = flat[order]
    start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(flat.numel(), device=x.device) - start[expert]
    cap = int(counts.max()) if flat.numel() else 0          # the one host sync of this path
    xp = x.new_zeros(E, max(cap, 1), d)
    xp = xp.index_put((expert, rank), x[tok])
    h = torch.bmm(xp, w_gate_up.transpose(1, 2))
    a = F.silu(h[..., :f]) * h[..., f:]
    yp = torch.bmm(a, w_down.transpose(1, 2))
    y = yp[expert, rank] * weights.reshape(-1)[order].to(x.dtype)[:, None]
    out = torch.zeros(T, d, dtype=torch.float32, device=x.device)
    return out.index_add(0, tok, y.float()).to(x.dtype)


def experts_torch(x, w_gate_up, w_down, weights, ids) -> torch.Tensor:
    """Grouped GEMM where possible, padded batched matmul otherwise (see the module doc)."""
    if can_use_grouped_mm(x, w_gate_up, w_down):
        return experts_grouped_mm(x, w_gate_up, w_down, weights, ids)
    return experts_padded_bmm(x, w_gate_up, w_down, weights, ids)
