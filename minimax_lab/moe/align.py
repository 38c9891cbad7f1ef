"""Token alignment: lay the routed (token, slot) pairs out expert by expert, padded to blocks.

A fused MoE kernel wants every block of ``block_m`` rows to belong to **one** expert, so a
program can load that expert's weight tile once and multiply it by all of the block's rows.
:func:`align_tokens` turns the router's ids ``[T, k]`` into that layout, entirely with
device-side tensor ops (no ``.item()``, no host synchronisation):

* ``sorted_ids`` int32 ``[capacity]`` -- for each padded row, the *flat slot* ``t * k + j`` it
  holds (token ``t = slot // k``), grouped by expert in ascending expert order and, inside an
  expert, in ascending slot order; padding rows hold the sentinel ``T * k``.
* ``block_expert`` int32 ``[capacity // block_m]`` -- the expert of each block, ``-1`` for
  blocks past the end (the grid is sized by an upper bound, so unused blocks just exit).
* ``num_rows`` int32 ``[1]`` -- rows actually used (sum over experts of the count rounded up).

``capacity`` is the upper bound ``block_m * (floor(T*k / block_m) + min(E, T*k))``: each
non-empty expert wastes fewer than ``block_m`` rows, and at most ``min(E, T*k)`` experts are
non-empty. (The same idea as vLLM's ``moe_align_block_size``; written here from scratch.)

Implementations, same result element for element:

* PyTorch (:mod:`.align_torch`): :func:`align_tokens_unchecked`, a chain of ~25 small torch ops
  (sort-based; any size, any device). It is also the reference: short enough to read, and the
  Triton versions are tested against it. :class:`Alignment` and :func:`capacity_for` live there
  too (every implementation builds them) and are imported here.
* Triton (:mod:`.align_triton`), for decode-sized batches (``T*k <= TRITON_ALIGN_MAX_SLOTS =
  4096``): one single-program kernel launch, :func:`align_tokens_triton` (a chunked one-hot scan)
  or :func:`align_decode` (one sort) -- at T=64 the torch chain costs a few hundred microseconds
  of *CPU launch time*, more than the GPU needs to stream all expert weights, so decode needs the
  one-launch version. For prefill-sized batches, :func:`align_prefill`: three launches of many
  programs (per-chunk histograms, one program for the offsets, per-chunk sort and scatter), used
  on the GPU in place of the torch chain. The fused experts (:mod:`.experts_triton`) call these
  directly.

:func:`align_tokens` checks its inputs (``TypeError``/``ValueError``) and runs the PyTorch one.
The Triton ones are called directly (all three are imported here): like
:func:`align_tokens_unchecked` they skip the range check, and they need ``ids`` on
:func:`minimax_lab.runtime.kernel_device` and ``T*k <= 4096`` (else ``ValueError``).
"""
from __future__ import annotations

import torch

from minimax_lab.moe.align_torch import Alignment, align_tokens_unchecked, capacity_for
from minimax_lab.moe.align_triton import TRITON_ALIGN_MAX_SLOTS, align_decode, align_prefill, align_tokens_triton
from minimax_lab.validate import INT_DTYPES, check_positive_int, check_tensor

__all__ = ["Alignment", "TRITON_ALIGN_MAX_SLOTS", "align_decode", "align_prefill", "align_tokens",
           "align_tokens_triton", "align_tokens_unchecked", "capacity_for"]


def align_tokens(ids: torch.Tensor, n_experts: int, block_m: int) -> Alignment:
    """Group routed slots by expert and pad each expert's group to a multiple of ``block_m``.

    ``ids`` ``[T, k]`` integer expert ids in ``[0, n_experts)``. Raises ``ValueError`` for ids
    out of range (this check synchronises once; call :func:`align_tokens_unchecked` on hot paths).
    """
    check_tensor(ids, "ids", ndim=2, dtypes=INT_DTYPES)
    check_positive_int(n_experts, "n_experts")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n_experts):
        raise ValueError(f"ids must lie in [0, {n_experts}), got values in [{int(ids.min())}, {int(ids.max())}]")
    return align_tokens_unchecked(ids, n_experts, block_m)
