"""Token alignment in PyTorch: :func:`align_tokens_unchecked`, the layout of
:mod:`minimax_lab.moe.align` (see there) as a chain of ~25 small device-side torch ops -- a stable
sort of the flat slots by expert, per-expert counts rounded up to ``block_m``, and a scatter of
each slot to its padded row. No ``.item()``, no host synchronisation; any size, any device.

It is the operator's reference as well (there is no separate fp32 one: the layout is integer
bookkeeping). :class:`Alignment` (the result) and :func:`capacity_for` (the rows it reserves) are
defined here because every implementation builds them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minimax_lab.validate import check_positive_int


@dataclass
class Alignment:
    """The expert-grouped, block-padded layout of one batch of routed slots."""

    sorted_ids: torch.Tensor    # int32 [capacity]: flat slot per padded row, sentinel T*k for padding
    block_expert: torch.Tensor  # int32 [capacity // block_m]: expert per block, -1 if unused
    num_rows: torch.Tensor      # int32 [1]: padded rows in use
    counts: torch.Tensor        # int [E]: slots per expert
    block_m: int
    n_slots: int                # T * k

    @property
    def capacity(self) -> int:
        return self.sorted_ids.numel()


def capacity_for(n_slots: int, n_experts: int, block_m: int) -> int:
    """Upper bound on the padded rows :func:`align_tokens` can need (see the module doc)."""
    return block_m * (n_slots // block_m + min(n_experts, n_slots))


def align_tokens_unchecked(ids: torch.Tensor, n_experts: int, block_m: int) -> Alignment:
    """:func:`align_tokens` without the range check (no host synchronisation at all)."""
    check_positive_int(block_m, "block_m")
    dev = ids.device
    flat = ids.reshape(-1).long()
    n = flat.numel()
    counts = torch.zeros(n_experts, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)                       # end row of each expert's padded group
    pad_start = pad_end - padded
    start = torch.cumsum(counts, 0) - counts                # start of each expert in the sorted order
    order = torch.sort(flat, stable=True).indices           # slots in expert order, slot order inside
    sorted_expert = flat[order]
    rank = torch.arange(n, device=dev) - start[sorted_expert]
    dest = pad_start[sorted_expert] + rank
    cap = capacity_for(n, n_experts, block_m)
    sorted_ids = torch.full((cap,), n, dtype=torch.int32, device=dev)
    sorted_ids[dest] = order.to(torch.int32)
    block_first_row = torch.arange(0, cap, block_m, device=dev)
    block_expert = torch.searchsorted(pad_end, block_first_row, right=True)
    block_expert = torch.where(block_expert < n_experts, block_expert, -1).to(torch.int32)
    num_rows = pad_end[-1:].to(torch.int32)
    return Alignment(sorted_ids, block_expert, num_rows, counts, block_m, n)
