"""Solutions of chapter 05's exercises (Mixture of Experts). Try each one first: the checker says
what is wrong."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def route_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, k, dim=-1)            # sorted, largest first
    return weights / weights.sum(dim=-1, keepdim=True), ids


def expert_swiglu(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    f = w_down.shape[1]
    h = x @ w_gate_up.t()                                  # [n, 2f]: gate columns, then up columns
    return (F.silu(h[:, :f]) * h[:, f:]) @ w_down.t()


def combine_slots(y: torch.Tensor, sorted_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    T, k = weights.shape
    real = sorted_ids < T * k                              # drop the padding rows (sentinel T*k)
    slots = sorted_ids[real].long()
    w = weights.reshape(-1)[slots].to(y.dtype)             # each row's routing weight
    out = torch.zeros(T, y.shape[1], dtype=y.dtype, device=y.device)
    return out.index_add_(0, slots // k, y[real] * w[:, None])   # token of slot s is s // k


def align_slots(ids: torch.Tensor, n_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    flat = ids.reshape(-1).long()
    n = flat.numel()
    order = torch.sort(flat, stable=True).indices          # slots by expert, slot order inside
    counts = torch.bincount(flat, minlength=n_experts)
    padded = (counts + block_m - 1) // block_m * block_m   # each group rounded up to whole blocks
    pad_start = torch.cumsum(padded, 0) - padded
    start = torch.cumsum(counts, 0) - counts
    e = flat[order]
    dest = pad_start[e] + torch.arange(n) - start[e]       # row = group start + rank inside the expert
    sorted_ids = torch.full((int(padded.sum()),), n, dtype=torch.int32)
    sorted_ids[dest] = order.to(torch.int32)
    block_expert = torch.repeat_interleave(torch.arange(n_experts), padded // block_m).to(torch.int32)
    return sorted_ids, block_expert
