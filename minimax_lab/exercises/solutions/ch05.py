"""Solutions of chapter 05's exercises (Mixture of Experts). Try each one first: the checker says
what is wrong."""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from minimax_lab.moe import capacity_for


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
    dest = pad_start[e] + torch.arange(n, device=flat.device) - start[e]       # row = group start + rank inside the expert
    sorted_ids = torch.full((int(padded.sum()),), n, dtype=torch.int32, device=flat.device)
    sorted_ids[dest] = order.to(torch.int32)
    block_expert = torch.repeat_interleave(torch.arange(n_experts, device=flat.device), padded // block_m).to(torch.int32)
    return sorted_ids, block_expert


@triton.jit
def _align_kernel(ids_ptr, sorted_ids_ptr, block_expert_ptr, num_rows_ptr, n_slots, n_experts, n_blocks,
                  BLOCK_M: tl.constexpr, N_POW2: tl.constexpr, E_POW2: tl.constexpr, B_CHUNK: tl.constexpr):
    s = tl.arange(0, N_POW2)                                    # one lane per slot
    e = tl.arange(0, E_POW2)                                    # one column per expert
    ids = tl.load(ids_ptr + s, mask=s < n_slots, other=-1)      # lanes past the end match no expert
    onehot = (ids[:, None] == e[None, :]).to(tl.int32)          # [slots, experts]
    counts = tl.sum(onehot, axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_end = tl.cumsum(padded, axis=0)
    pad_start = pad_end - padded
    rank = tl.cumsum(onehot, axis=0) - 1                        # the new part: rank inside the expert, slot order
    row = tl.sum(onehot * (pad_start[None, :] + rank), axis=1)  # only the slot's own expert column is non-zero
    tl.store(sorted_ids_ptr + row, s, mask=s < n_slots)
    tl.store(num_rows_ptr, tl.sum(padded, axis=0))
    for b0 in range(0, n_blocks, B_CHUNK):                      # owner of a block: experts that end at or before it
        b = b0 + tl.arange(0, B_CHUNK)
        owner = tl.sum((pad_end[None, :] <= (b * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + b, tl.where(owner < n_experts, owner, -1), mask=b < n_blocks)


def align_in_triton(ids: torch.Tensor, n_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = ids.numel()
    capacity = capacity_for(n, n_experts, block_m)
    sorted_ids = torch.full((capacity,), n, dtype=torch.int32, device=ids.device)   # the sentinel everywhere first
    block_expert = torch.empty(capacity // block_m, dtype=torch.int32, device=ids.device)
    num_rows = torch.empty(1, dtype=torch.int32, device=ids.device)
    _align_kernel[(1,)](ids.reshape(-1).contiguous(), sorted_ids, block_expert, num_rows, n, n_experts,
                        capacity // block_m, BLOCK_M=block_m, N_POW2=max(16, triton.next_power_of_2(n)),
                        E_POW2=max(16, triton.next_power_of_2(n_experts)), B_CHUNK=64)
    return sorted_ids, block_expert, num_rows


def align_in_triton_torch(ids: torch.Tensor, n_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same numbers in PyTorch, no kernel of one's own: exercise 05.5's checker refuses it."""
    n = ids.numel()
    capacity = capacity_for(n, n_experts, block_m)
    rows, experts = align_slots(ids, n_experts, block_m)
    sorted_ids = torch.full((capacity,), n, dtype=torch.int32, device=ids.device)
    sorted_ids[:rows.numel()] = rows.to(ids.device)
    block_expert = torch.full((capacity // block_m,), -1, dtype=torch.int32, device=ids.device)
    block_expert[:experts.numel()] = experts.to(ids.device)
    return sorted_ids, block_expert, torch.tensor([rows.numel()], dtype=torch.int32, device=ids.device)
