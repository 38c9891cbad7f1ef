"""Token alignment in Triton: the layout of :mod:`minimax_lab.moe.align` in one kernel launch,
for decode-sized batches (``T*k <= TRITON_ALIGN_MAX_SLOTS``).

* :func:`align_tokens_triton` -- ``_align_kernel``: one program walks the slots in chunks, a
  ``[chunk, E]`` one-hot matrix and its running column sums giving each slot its rank inside its
  expert;
* :func:`align_decode` -- ``_align_sort_kernel``: one program sorts all slots at once (keys
  ``expert * 4096 + slot``), no loop over slots.

Both share ``_store_padding_and_block_experts`` (sentinel padding rows, the expert of each block)
and return exactly what :func:`~minimax_lab.moe.align_torch.align_tokens_unchecked` returns. Like
it they skip the ids range check; ``ids`` must be on :func:`minimax_lab.runtime.kernel_device`.
"""
from __future__ import annotations

import torch

import triton
import triton.language as tl

from minimax_lab.moe.align_torch import Alignment, capacity_for
from minimax_lab.validate import check_positive_int, check_triton_inputs

#: Largest ``T*k`` the one-program Triton alignment handles (it loops over slots serially).
TRITON_ALIGN_MAX_SLOTS = 4096


@triton.jit
def _store_padding_and_block_experts(sorted_ids_ptr, block_expert_ptr, pad_end, n_slots, capacity, n_blocks,
                                     BLOCK_M: tl.constexpr, E_POW2: tl.constexpr, CHUNK: tl.constexpr):
    """Both alignment kernels: every padded row gets the sentinel ``n_slots`` (real slots are
    scattered over it afterwards), every block the expert whose padded rows it lies in (-1 past
    the used rows). ``pad_end [E_POW2]`` = cumulative padded row counts."""
    for r0 in range(0, capacity, CHUNK):           # padding rows hold the sentinel n_slots
        r = r0 + tl.arange(0, CHUNK)
        tl.store(sorted_ids_ptr + r, tl.zeros((CHUNK,), dtype=tl.int32) + n_slots, mask=r < capacity)
    for b0 in range(0, n_blocks, CHUNK):           # expert of a block = #experts ending at or before it
        b = b0 + tl.arange(0, CHUNK)
        ex = tl.sum((pad_end[None, :] <= (b * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        ex = tl.where(ex < E_POW2, ex, -1)
        tl.store(block_expert_ptr + b, ex, mask=b < n_blocks)


@triton.jit
def _align_kernel(ids_ptr, sorted_ids_ptr, block_expert_ptr, num_rows_ptr, counts_ptr,
                  n_slots, capacity, n_blocks,
                  BLOCK_M: tl.constexpr, E_POW2: tl.constexpr, CHUNK: tl.constexpr):
    # One program does everything: E_POW2 lanes hold per-expert counters, slots are visited in
    # chunks; a [CHUNK, E_POW2] one-hot matrix and its running column sums give each slot its
    # rank inside its expert, in slot order (the same order the stable sort gives).
    e_offs = tl.arange(0, E_POW2)
    counts = tl.zeros((E_POW2,), dtype=tl.int32)
    for c0 in range(0, n_slots, CHUNK):
        s = c0 + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + s, mask=s < n_slots, other=-1).to(tl.int32)
        counts += tl.sum((ids[:, None] == e_offs[None, :]).to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_end = tl.cumsum(padded, axis=0)
    pad_start = pad_end - padded
    tl.store(counts_ptr + e_offs, counts)
    tl.store(num_rows_ptr, tl.sum(padded, axis=0))
    _store_padding_and_block_experts(sorted_ids_ptr, block_expert_ptr, pad_end, n_slots, capacity, n_blocks,
                                     BLOCK_M, E_POW2, CHUNK)
    tl.debug_barrier()                             # sentinel stores land before the scatter below
    fill = tl.zeros((E_POW2,), dtype=tl.int32)
    for c0 in range(0, n_slots, CHUNK):
        s = c0 + tl.arange(0, CHUNK)
        ok = s < n_slots
        ids = tl.load(ids_ptr + s, mask=ok, other=-1).to(tl.int32)
        onehot = (ids[:, None] == e_offs[None, :]).to(tl.int32)
        rank = tl.cumsum(onehot, axis=0) - 1 + (pad_start + fill)[None, :]
        dest = tl.sum(onehot * rank, axis=1)
        tl.store(sorted_ids_ptr + dest, s, mask=ok)
        fill += tl.sum(onehot, axis=0)


def _kernel_buffers(ids: torch.Tensor, n_experts: int, block_m: int):
    """Outputs of the one-launch alignment kernels: ``(sorted_ids, block_expert, num_rows,
    counts, capacity, E rounded up to a power of two, chunk of slots per scan step)``."""
    n = ids.numel()
    dev = ids.device
    cap = capacity_for(n, n_experts, block_m)
    e_pow2 = triton.next_power_of_2(n_experts)
    sorted_ids = torch.empty(cap, dtype=torch.int32, device=dev)
    block_expert = torch.empty(cap // block_m, dtype=torch.int32, device=dev)
    num_rows = torch.empty(1, dtype=torch.int32, device=dev)
    counts = torch.empty(e_pow2, dtype=torch.int32, device=dev)
    return sorted_ids, block_expert, num_rows, counts, cap, e_pow2, max(16, min(1024, 16384 // e_pow2))


def align_tokens_triton(ids: torch.Tensor, n_experts: int, block_m: int) -> Alignment:
    """:func:`align_tokens_unchecked` in one kernel launch (``T*k <= TRITON_ALIGN_MAX_SLOTS``).

    Experts beyond ``n_experts`` (up to the next power of two) are never hit, so blocks past
    the used rows get -1 exactly as in the torch version; the ids range is not checked.
    ``ids`` must be on :func:`minimax_lab.runtime.kernel_device` (else ``ValueError``).
    """
    check_triton_inputs(ids=ids)
    check_positive_int(block_m, "block_m")
    n = ids.numel()
    if n > TRITON_ALIGN_MAX_SLOTS:
        raise ValueError(f"align_tokens_triton handles T*k <= {TRITON_ALIGN_MAX_SLOTS}, got {n}")
    sorted_ids, block_expert, num_rows, counts, cap, e_pow2, chunk = _kernel_buffers(ids, n_experts, block_m)
    _align_kernel[(1,)](ids.reshape(-1), sorted_ids, block_expert, num_rows, counts, n, cap, cap // block_m,
                        BLOCK_M=block_m, E_POW2=e_pow2, CHUNK=chunk, num_warps=8)
    return Alignment(sorted_ids, block_expert, num_rows, counts[:n_experts], block_m, n)


@triton.jit
def _align_sort_kernel(ids_ptr, sorted_ids_ptr, block_expert_ptr, num_rows_ptr, counts_ptr, shift_ptr,
                       n_slots, capacity, n_blocks,
                       BLOCK_M: tl.constexpr, E_POW2: tl.constexpr, N_POW2: tl.constexpr,
                       CHUNK: tl.constexpr):
    # One program, no loop over slots: sort the keys expert * 4096 + slot (unique, so the order is
    # the stable sort's: experts ascending, slots ascending inside an expert), then sorted
    # position p of an expert-e slot goes to padded row p + (pad_start[e] - start[e]).
    s = tl.arange(0, N_POW2)
    ok = s < n_slots
    ids = tl.load(ids_ptr + s, mask=ok, other=0).to(tl.int32)
    e_offs = tl.arange(0, E_POW2)
    counts = tl.histogram(ids, E_POW2) - tl.where(e_offs == 0, N_POW2 - n_slots, 0)   # padding lanes hit bin 0
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_end = tl.cumsum(padded, axis=0)
    tl.store(counts_ptr + e_offs, counts)
    tl.store(num_rows_ptr, tl.sum(padded, axis=0))
    tl.store(shift_ptr + e_offs, (pad_end - padded) - (tl.cumsum(counts, axis=0) - counts))
    _store_padding_and_block_experts(sorted_ids_ptr, block_expert_ptr, pad_end, n_slots, capacity, n_blocks,
                                     BLOCK_M, E_POW2, CHUNK)
    keys = tl.sort(tl.where(ok, ids * 4096 + s, E_POW2 * 4096 + s))
    expert = keys // 4096
    slot = keys % 4096
    tl.debug_barrier()                             # shift and sentinel stores land before the reads below
    sh = tl.load(shift_ptr + expert, mask=ok, other=0)
    tl.store(sorted_ids_ptr + s + sh, slot, mask=ok)


def align_decode(ids: torch.Tensor, n_experts: int, block_m: int) -> Alignment:
    """:func:`~minimax_lab.moe.align.align_tokens_unchecked` (the same layout, element for element)
    in one launch that sorts all ``T*k <= 4096`` slots at once. ``align_tokens_triton`` walks the
    slots in chunks with a ``[chunk, E]`` one-hot scan per chunk, which grows with ``T*k``: on the
    H200 it was most of the gap between the two GEMM kernels' time and the whole forward at T=256
    (``results/notes_moe.md``). ``ids`` must be on :func:`minimax_lab.runtime.kernel_device`
    (else ``ValueError``)."""
    check_triton_inputs(ids=ids)
    n = ids.numel()
    if n > TRITON_ALIGN_MAX_SLOTS:
        raise ValueError(f"align_decode handles T*k <= {TRITON_ALIGN_MAX_SLOTS}, got {n}")
    sorted_ids, block_expert, num_rows, counts, cap, e_pow2, chunk = _kernel_buffers(ids, n_experts, block_m)
    shift = torch.empty(e_pow2, dtype=torch.int32, device=ids.device)
    _align_sort_kernel[(1,)](ids.reshape(-1), sorted_ids, block_expert, num_rows, counts, shift, n, cap, cap // block_m,
                             BLOCK_M=block_m, E_POW2=e_pow2, N_POW2=max(16, triton.next_power_of_2(n)),
                             CHUNK=chunk, num_warps=8)
    return Alignment(sorted_ids, block_expert, num_rows, counts[:n_experts], block_m, n)
