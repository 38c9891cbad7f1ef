"""Token alignment in Triton: the layout of :mod:`minimax_lab.moe.align` in one kernel launch
for decode-sized batches (``T*k <= TRITON_ALIGN_MAX_SLOTS``), in three for prefill-sized ones.

* :func:`align_tokens_triton` -- ``_align_kernel``: one program walks the slots in chunks, a
  ``[chunk, E]`` one-hot matrix and its running column sums giving each slot its rank inside its
  expert;
* :func:`align_decode` -- ``_align_sort_kernel``: one program sorts all slots at once (keys
  ``expert * 4096 + slot``), no loop over slots;
* :func:`align_prefill` -- many programs: per-chunk histograms (``_chunk_counts_kernel``), one
  program for the per-chunk row offsets (``_chunk_offsets_kernel``), then per chunk the decode
  kernel's sort and a scatter (``_chunk_scatter_kernel``).

They share the sentinel padding rows (``_store_padding``) and the expert of each block
(``_store_block_experts``), and return exactly what
:func:`~minimax_lab.moe.align_torch.align_tokens_unchecked` returns. Like it they skip the ids
range check; ``ids`` must be on :func:`minimax_lab.runtime.kernel_device`.
"""
from __future__ import annotations

import torch

import triton
import triton.language as tl

from minimax_lab import configs
from minimax_lab.moe.align_torch import Alignment, capacity_for
from minimax_lab.validate import check_positive_int, check_triton_inputs

#: Largest ``T*k`` the one-program Triton alignment handles (it loops over slots serially).
TRITON_ALIGN_MAX_SLOTS = 4096


#: :func:`align_prefill`'s offsets kernel holds a [chunks, E] tile in one program: at most this many
#: elements; a chunk (one program's sort) of at most ``ALIGN_PREFILL_MAX_CHUNK`` slots.
ALIGN_PREFILL_MAX_TILE = 1 << 14
ALIGN_PREFILL_MAX_CHUNK = 1 << 14

#: The alignment kernels' launch: their warps (one value for all of them; they make no ``tl.dot``,
#: so they hold no shared-memory tiles to estimate).
LAUNCH = configs.Launch(op="moe_align", keys=("num_warps",), interpreter={"num_warps": 8})


def _warps() -> int:
    return configs.launch_config(LAUNCH)["num_warps"]


@triton.jit
def _store_padding(sorted_ids_ptr, n_slots, first_row, end_row, CHUNK: tl.constexpr):
    """Rows ``[first_row, end_row)`` get the sentinel ``n_slots`` (real slots are scattered over it afterwards)."""
    for r0 in range(first_row, end_row, CHUNK):
        r = r0 + tl.arange(0, CHUNK)
        tl.store(sorted_ids_ptr + r, tl.zeros((CHUNK,), dtype=tl.int32) + n_slots, mask=r < end_row)


@triton.jit
def _store_block_experts(block_expert_ptr, pad_end, n_blocks, BLOCK_M: tl.constexpr, E_POW2: tl.constexpr,
                         CHUNK: tl.constexpr):
    """Every block gets the expert whose padded rows it lies in (-1 past the used rows).
    ``pad_end [E_POW2]`` = cumulative padded row counts."""
    for b0 in range(0, n_blocks, CHUNK):           # expert of a block = #experts ending at or before it
        b = b0 + tl.arange(0, CHUNK)
        ex = tl.sum((pad_end[None, :] <= (b * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        ex = tl.where(ex < E_POW2, ex, -1)
        tl.store(block_expert_ptr + b, ex, mask=b < n_blocks)


@triton.jit
def _store_padding_and_block_experts(sorted_ids_ptr, block_expert_ptr, pad_end, n_slots, capacity, n_blocks,
                                     BLOCK_M: tl.constexpr, E_POW2: tl.constexpr, CHUNK: tl.constexpr):
    """The one-program alignment kernels: the sentinel in every padded row, then the block experts."""
    _store_padding(sorted_ids_ptr, n_slots, 0, capacity, CHUNK)
    _store_block_experts(block_expert_ptr, pad_end, n_blocks, BLOCK_M, E_POW2, CHUNK)


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
                        BLOCK_M=block_m, E_POW2=e_pow2, CHUNK=chunk, num_warps=_warps())
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
    slots in chunks with a ``[chunk, E]`` one-hot scan per chunk, which grows with ``T*k`` (and at
    a few hundred tokens costs as much as the GEMMs). ``ids`` must be on
    :func:`minimax_lab.runtime.kernel_device` (else ``ValueError``)."""
    check_triton_inputs(ids=ids)
    n = ids.numel()
    if n > TRITON_ALIGN_MAX_SLOTS:
        raise ValueError(f"align_decode handles T*k <= {TRITON_ALIGN_MAX_SLOTS}, got {n}")
    sorted_ids, block_expert, num_rows, counts, cap, e_pow2, chunk = _kernel_buffers(ids, n_experts, block_m)
    shift = torch.empty(e_pow2, dtype=torch.int32, device=ids.device)
    _align_sort_kernel[(1,)](ids.reshape(-1), sorted_ids, block_expert, num_rows, counts, shift, n, cap, cap // block_m,
                             BLOCK_M=block_m, E_POW2=e_pow2, N_POW2=max(16, triton.next_power_of_2(n)),
                             CHUNK=chunk, num_warps=_warps())
    return Alignment(sorted_ids, block_expert, num_rows, counts[:n_experts], block_m, n)


@triton.jit
def _chunk_counts_kernel(ids_ptr, counts_ptr, sorted_ids_ptr, n_slots, capacity, rows_per_prog,
                         E_POW2: tl.constexpr, CHUNK: tl.constexpr):
    # Program p: the expert histogram of slots [p*CHUNK, (p+1)*CHUNK) into counts[p, :], and the
    # sentinel into its share of the padded rows (the scatter launch writes the real slots later).
    p = tl.program_id(0)
    s = p * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(ids_ptr + s, mask=s < n_slots, other=0).to(tl.int32)
    missing = tl.maximum(p * CHUNK + CHUNK - n_slots, 0)          # lanes past the end hit bin 0
    e_offs = tl.arange(0, E_POW2)
    counts = tl.histogram(ids, E_POW2) - tl.where(e_offs == 0, missing, 0)
    tl.store(counts_ptr + p * E_POW2 + e_offs, counts)
    first = p * rows_per_prog
    _store_padding(sorted_ids_ptr, n_slots, first, tl.minimum(first + rows_per_prog, capacity), CHUNK)


@triton.jit
def _chunk_offsets_kernel(chunk_counts_ptr, shift_ptr, block_expert_ptr, num_rows_ptr, counts_ptr, n_chunks, n_blocks,
                          BLOCK_M: tl.constexpr, E_POW2: tl.constexpr, P_POW2: tl.constexpr,
                          BLOCKS_CHUNK: tl.constexpr):
    # One program over the [chunks, experts] counts: expert e's padded group starts at
    # pad_start[e]; inside it, chunk p's slots follow those of chunks before p (slot order). A
    # chunk's sorted position i of an expert-e slot (i counts from its chunk's start of e) then
    # goes to row i + shift[p, e], shift = pad_start[e] + (e's slots in earlier chunks) - (the
    # chunk's slots of experts below e).
    p = tl.arange(0, P_POW2)
    e = tl.arange(0, E_POW2)
    c = tl.load(chunk_counts_ptr + p[:, None] * E_POW2 + e[None, :], mask=(p < n_chunks)[:, None], other=0)
    counts = tl.sum(c, axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_end = tl.cumsum(padded, axis=0)
    earlier_chunks = tl.cumsum(c, axis=0) - c
    lower_experts = tl.cumsum(c, axis=1) - c
    shift = (pad_end - padded)[None, :] + earlier_chunks - lower_experts
    tl.store(shift_ptr + p[:, None] * E_POW2 + e[None, :], shift, mask=(p < n_chunks)[:, None])
    tl.store(counts_ptr + e, counts)
    tl.store(num_rows_ptr, tl.sum(padded, axis=0))
    _store_block_experts(block_expert_ptr, pad_end, n_blocks, BLOCK_M, E_POW2, BLOCKS_CHUNK)


@triton.jit
def _chunk_scatter_kernel(ids_ptr, shift_ptr, sorted_ids_ptr, n_slots, E_POW2: tl.constexpr, CHUNK: tl.constexpr):
    # Program p sorts its chunk's keys expert * CHUNK + local slot (unique: experts ascending, slots
    # ascending inside one, as the stable sort), then scatters each slot to its padded row.
    p = tl.program_id(0)
    local = tl.arange(0, CHUNK)
    ok = p * CHUNK + local < n_slots
    ids = tl.load(ids_ptr + p * CHUNK + local, mask=ok, other=0).to(tl.int32)
    keys = tl.sort(tl.where(ok, ids * CHUNK + local, E_POW2 * CHUNK + local))
    expert = keys // CHUNK
    real = expert < E_POW2
    sh = tl.load(shift_ptr + p * E_POW2 + expert, mask=real, other=0)
    tl.store(sorted_ids_ptr + local + sh, p * CHUNK + keys % CHUNK, mask=real)


def prefill_chunk(n_slots: int, n_experts: int) -> int | None:
    """The chunk (slots per program, a power of two >= 4096) :func:`align_prefill` uses for
    ``n_slots`` routed slots over ``n_experts``, or ``None`` when no chunk within the limits fits
    (then the torch alignment does it)."""
    per_chunk = max(1, ALIGN_PREFILL_MAX_TILE // triton.next_power_of_2(n_experts))
    chunk = max(4096, triton.next_power_of_2(triton.cdiv(max(n_slots, 1), per_chunk)))
    return chunk if chunk <= ALIGN_PREFILL_MAX_CHUNK and per_chunk >= 2 else None


def align_prefill(ids: torch.Tensor, n_experts: int, block_m: int, *, chunk: int | None = None) -> Alignment:
    """:func:`~minimax_lab.moe.align.align_tokens_unchecked` (the same layout, element for element)
    in three launches of many programs, for prefill-sized batches: per chunk of ``chunk`` slots an
    expert histogram (and the sentinel in a share of the padded rows), one program turning the
    ``[chunks, E]`` histograms into per-chunk row offsets and the block experts, then per chunk
    one sort and a scatter. The torch chain it replaces is ~25 launches, among them a sort of all
    slots. ``chunk`` (a power of two >= 16) defaults to :func:`prefill_chunk`; ``ValueError`` when
    the ``[chunks, E]`` tile would exceed ``ALIGN_PREFILL_MAX_TILE`` elements or ``ids`` is not
    on :func:`minimax_lab.runtime.kernel_device`."""
    check_triton_inputs(ids=ids)
    check_positive_int(block_m, "block_m")
    n = ids.numel()
    chunk = prefill_chunk(n, n_experts) if chunk is None else chunk
    if chunk is None:
        raise ValueError(f"align_prefill: {n} slots over {n_experts} experts exceed its limits; "
                         "use the torch alignment")
    if chunk < 16 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two >= 16, got {chunk}")
    sorted_ids, block_expert, num_rows, counts, cap, e_pow2, blocks_chunk = _kernel_buffers(ids, n_experts, block_m)
    n_chunks = max(1, triton.cdiv(n, chunk))
    p_pow2 = max(2, triton.next_power_of_2(n_chunks))
    if p_pow2 * e_pow2 > ALIGN_PREFILL_MAX_TILE:
        raise ValueError(f"align_prefill: {n_chunks} chunks x {e_pow2} experts exceed the offsets kernel's "
                         f"{ALIGN_PREFILL_MAX_TILE} elements; use a larger chunk")
    chunk_counts = torch.empty(n_chunks, e_pow2, dtype=torch.int32, device=ids.device)
    shift = torch.empty(n_chunks, e_pow2, dtype=torch.int32, device=ids.device)
    flat = ids.reshape(-1)
    warps = _warps()
    _chunk_counts_kernel[(n_chunks,)](flat, chunk_counts, sorted_ids, n, cap, triton.cdiv(cap, n_chunks),
                                      E_POW2=e_pow2, CHUNK=chunk, num_warps=warps)
    _chunk_offsets_kernel[(1,)](chunk_counts, shift, block_expert, num_rows, counts, n_chunks, cap // block_m,
                                BLOCK_M=block_m, E_POW2=e_pow2, P_POW2=p_pow2, BLOCKS_CHUNK=blocks_chunk,
                                num_warps=warps)
    _chunk_scatter_kernel[(n_chunks,)](flat, shift, sorted_ids, n, E_POW2=e_pow2, CHUNK=chunk, num_warps=warps)
    return Alignment(sorted_ids, block_expert, num_rows, counts[:n_experts], block_m, n)
