"""Vectorised expert layer: sort the routed slots by expert, then two grouped GEMMs.

1. flatten the ``T * k`` routed slots, sort them by expert (stable), gather their rows of ``x``;
2. ``torch._grouped_mm`` (one launch for all experts, each multiplying its contiguous run of
   rows) with ``w_gate_up``, SwiGLU, ``torch._grouped_mm`` with ``w_down``;
3. scale each row by its routing weight and scatter-add it back to its token (``index_add_``).

``torch._grouped_mm`` exists from torch 2.8 (bf16 on Hopper GPUs; fp32 on the CPU, forward
only -- its CPU backward fails on the transposed weight views). Where it is missing, where
autograd needs a backward on the CPU, or where ``d``/``f`` or the weights' strides break its
16-byte layout rule (:func:`can_use_grouped_mm`), step 2 uses a **padded batched matmul** instead: rows scattered into an
``[E, max_count, d]`` buffer (zeros elsewhere) and ``torch.bmm`` -- differentiable everywhere,
at the price of one host sync for ``max_count`` and the padding FLOPs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from minimax_lab.validate import accumulate_dtype


def _sort_by_expert(ids: torch.Tensor, n_experts: int):
    flat = ids.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices          # slot indices, expert-major
    counts = torch.zeros(n_experts, dtype=torch.long, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))
    return flat, order, counts


def _aligned_for_grouped_mm(t: torch.Tensor) -> bool:
    """``torch._grouped_mm``'s layout rule for one operand (checked on the CPU and the GPU alike):
    unit stride in one of the last two dims, every other stride and the base address a multiple
    of 16 bytes."""
    rows, cols = t.stride()[-2:]
    if cols == 1:
        lead = rows
    elif rows == 1:
        lead = cols
    else:
        return False
    return all(s * t.element_size() % 16 == 0 for s in (*t.stride()[:-2], lead)) and t.data_ptr() % 16 == 0


def can_use_grouped_mm(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> bool:
    """Whether :func:`experts_grouped_mm` can run on these inputs here: the op exists, the dtype
    and device suit it (fp32 forward on the CPU, bf16 on the GPU), and every operand meets its
    16-byte layout rule -- the gathered rows ``[n, d]`` and SwiGLU rows ``[n, f]`` (so ``d`` and
    ``f`` times the element size are multiples of 16 bytes) and both weights as transposed views."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or w_gate_up.requires_grad or w_down.requires_grad)
    if x.device.type == "cpu":
        if needs_grad or x.dtype != torch.float32:
            return False
    elif x.dtype != torch.bfloat16:
        return False
    d, f = w_down.shape[1], w_down.shape[2]
    rows_ok = (d * x.element_size()) % 16 == 0 and (f * x.element_size()) % 16 == 0
    return rows_ok and all(_aligned_for_grouped_mm(w.transpose(1, 2)) for w in (w_gate_up, w_down))


def grouped_linear(rows: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``rows [n, K]`` sorted by expert (``counts[e]`` consecutive rows for expert ``e``) times
    each expert's ``w[e] [N, K]`` transposed: ``[n, N]`` in ``rows``' dtype. ``torch._grouped_mm``
    where :func:`can_use_grouped_mm`'s rules hold for these operands, else the padded batched
    matmul of :func:`experts_padded_bmm` (one host sync)."""
    E, N, K = w.shape
    ok = hasattr(torch, "_grouped_mm") and not (torch.is_grad_enabled() and (rows.requires_grad or w.requires_grad))
    ok = ok and rows.dtype == (torch.float32 if rows.device.type == "cpu" else torch.bfloat16) and w.dtype == rows.dtype
    if ok and _aligned_for_grouped_mm(rows) and _aligned_for_grouped_mm(w.transpose(1, 2)) and (
            N * rows.element_size()) % 16 == 0:
        return torch._grouped_mm(rows, w.transpose(1, 2), offs=torch.cumsum(counts, 0).to(torch.int32))
    n = rows.shape[0]
    expert = torch.repeat_interleave(torch.arange(E, device=rows.device), counts, output_size=n)
    rank = torch.arange(n, device=rows.device) - (torch.cumsum(counts, 0) - counts)[expert]
    cap = int(counts.max()) if n else 0                    # the one host sync of this path
    padded = rows.new_zeros(E, max(cap, 1), K).index_put((expert, rank), rows)
    return torch.bmm(padded, w.transpose(1, 2))[expert, rank]


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
    out = torch.zeros(T, x.shape[1], dtype=accumulate_dtype(x.dtype), device=x.device)
    return out.index_add_(0, tok, y.to(out.dtype)).to(x.dtype)


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
    out = torch.zeros(T, d, dtype=accumulate_dtype(x.dtype), device=x.device)
    return out.index_add(0, tok, y.to(out.dtype)).to(x.dtype)


def experts_torch(x, w_gate_up, w_down, weights, ids) -> torch.Tensor:
    """Grouped GEMM where possible, padded batched matmul otherwise (see the module doc)."""
    if can_use_grouped_mm(x, w_gate_up, w_down):
        return experts_grouped_mm(x, w_gate_up, w_down, weights, ids)
    return experts_padded_bmm(x, w_gate_up, w_down, weights, ids)
