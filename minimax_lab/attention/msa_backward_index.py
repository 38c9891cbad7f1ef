"""How MSA's index branch learns: its distillation loss, with a gradient for ``q_idx`` and ``k_idx``.

The selection (top-k) is integer and passes no gradient. The index branch learns from a teacher
instead (the MSA contract of :mod:`.msa`; DeepSeek-V3.2-Exp's lightning indexer trains the same
way): the main branch's attention mass per key block, detached.

* **student** -- logits ``L[b, t, g, j]``: the max over block ``j``'s causally visible tokens
  ``i <= t`` of ``q_idx[b, t, g] . k_idx[b, i] / sqrt(D_idx)`` (the block score the selection
  ranks), :data:`NEG` for a block the query cannot see; its distribution ``Q = softmax_j(L)``.
* **teacher** -- ``mass [B, S, G, n_blocks]``, each row a distribution over blocks (rows sum to 1;
  e.g. :func:`minimax_lab.model.msa_indexer.block_mass` of the attention probabilities).
* **loss** -- ``KL(P || Q) = sum_j p_j (log p_j - log q_j)`` (terms with ``p_j = 0`` are 0),
  averaged over the rows ``(b, t, g)`` whose token sees at least two blocks (``t >= block_size``).

Gradient: ``dL_j = (sum_i p_i) q_j - p_j`` per row (over the number of rows averaged); the max
hands it to the token that attained it, ``i* = arg``: ``dq_idx[t, g] += dL_j k_idx[i*] /
sqrt(D_idx)`` and ``dk_idx[i*] += dL_j q_idx[t, g] / sqrt(D_idx)``. On an exact tie inside a
block the torch and Triton impls give it all to the lowest token; the reference's autograd
(``amax``) splits it evenly. Both are subgradients of the max; they agree wherever it is unique.

``index_distill_loss(q_idx, k_idx, mass, *, block_size, impl="torch") -> scalar``
    ``q_idx [B, S, G, D_idx]``, ``k_idx [B, S, D_idx]`` (one float dtype; fp16, bf16, fp32 -- and
    fp64 -- for ``impl="triton"``, on :func:`minimax_lab.runtime.kernel_device`, whose
    ``block_size`` is a power of two in 16..128), ``mass`` float
    ``[B, S, G, ceil(S / block_size)]`` (no gradient flows into it), ``B >= 1``. Returns the loss
    in fp32 (fp64 for fp64 inputs), differentiable w.r.t. ``q_idx`` and ``k_idx``. ``impl``:
    ``"reference"`` -- the dense formula (``[B, S, G, S]`` scores) differentiated by autograd
    (:mod:`.msa_backward_index_reference`); ``"torch"`` -- the block max-pool by query chunks and its
    gradient by gather and ``index_add_`` (:mod:`.msa_backward_index_torch`); ``"triton"`` -- the
    same two steps as kernels, no ``S x S`` tensor in memory (:mod:`.msa_backward_index_triton`).
    Raises ``ValueError`` when no token sees two blocks (``S <= block_size``) and for bad shapes,
    dtypes or choices (``TypeError`` for non-tensors).
"""
from __future__ import annotations

import math

import torch

from minimax_lab.attention.msa_backward_index_reference import (NEG, counted_rows, distill_loss, index_block_logits,
                                                                index_distill_loss_reference, visible_blocks)
from minimax_lab.attention.msa_backward_index_torch import index_distill_loss_torch
from minimax_lab.attention.msa_backward_index_triton import index_distill_loss_triton
from minimax_lab.validate import (FLOAT_DTYPES, IMPLS, check_choice, check_positive_int, check_power_of_two,
                                  check_same_device, check_tensor, check_triton_inputs)

#: block sizes the Triton kernels take (MSA's own range)
MIN_BLOCK, MAX_BLOCK = 16, 128

__all__ = ["NEG", "distill_loss", "index_block_logits", "index_distill_loss", "visible_blocks"]


def index_distill_loss(q_idx, k_idx, mass, *, block_size: int, impl: str = "torch") -> torch.Tensor:
    """The indexer's distillation loss; see the module docstring."""
    check_choice(impl, "impl", IMPLS)
    check_positive_int(block_size, "block_size")
    check_tensor(q_idx, "q_idx", ndim=4, dtypes=FLOAT_DTYPES)
    B, S, G, Didx = q_idx.shape
    if G < 1 or Didx < 1:
        raise ValueError(f"q_idx [B, S, G, D_idx] needs at least one group and D_idx >= 1, got {list(q_idx.shape)}")
    check_tensor(k_idx, "k_idx", shape=[B, S, Didx], dtypes=(q_idx.dtype,))
    check_tensor(mass, "mass", shape=[B, S, G, math.ceil(S / block_size)], dtypes=FLOAT_DTYPES)
    check_same_device(q_idx=q_idx, k_idx=k_idx, mass=mass)
    if B == 0:
        raise ValueError("index_distill_loss averages over sequences: it needs B >= 1")
    counted_rows(S, block_size, q_idx.device)
    if impl == "reference":
        return index_distill_loss_reference(q_idx, k_idx, mass, block_size=block_size)
    if impl == "torch":
        return index_distill_loss_torch(q_idx, k_idx, mass, block_size=block_size)
    check_power_of_two(block_size, "block_size", minimum=MIN_BLOCK, maximum=MAX_BLOCK)  # the kernels' tile
    check_triton_inputs(float_dtypes=FLOAT_DTYPES, allow_grad=True, q_idx=q_idx, k_idx=k_idx, mass=mass)
    return index_distill_loss_triton(q_idx, k_idx, mass, block_size=block_size)
