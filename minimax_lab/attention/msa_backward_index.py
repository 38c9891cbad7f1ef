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
sqrt(D_idx)`` and ``dk_idx[i*] += dL_j q_idx[t, g] / sqrt(D_idx)``. (On an exact tie inside a
block the Triton kernel gives it all to the lowest token; autograd's ``amax`` splits it evenly.
Both are subgradients of the max; they agree wherever the max is unique.)

``index_distill_loss(q_idx, k_idx, mass, *, block_size, impl="torch") -> scalar``
    ``q_idx [B, S, G, D_idx]``, ``k_idx [B, S, D_idx]`` (one float dtype; fp16, bf16, fp32 -- and
    fp64 -- for ``impl="triton"``, on :func:`minimax_lab.runtime.kernel_device`, whose
    ``block_size`` is a power of two in 16..128), ``mass`` float
    ``[B, S, G, ceil(S / block_size)]`` (no gradient flows into it). Returns the loss in fp32
    (fp64 for fp64 inputs), differentiable w.r.t. ``q_idx`` and ``k_idx``. ``impl``:
    ``"reference"`` and ``"torch"`` -- the dense formula (``[B, S, G, S]`` scores) differentiated
    by autograd; ``"triton"`` -- :class:`IndexDistillLoss`: block max-pool and its gradient in
    Triton (:mod:`.msa_backward_index_triton`), no ``S x S`` tensor in memory, the block-sized
    KL and its closed-form gradient in PyTorch. Raises ``ValueError`` when no token sees two blocks
    (``S <= block_size``) and for bad shapes, dtypes or choices (``TypeError`` for non-tensors).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.autograd.function import once_differentiable

from minimax_lab.attention.msa_backward_index_triton import NEG, block_logits_triton, index_grads_triton
from minimax_lab.validate import (FLOAT_DTYPES, IMPLS, check_choice, check_positive_int, check_power_of_two,
                                  check_same_device, check_tensor, check_triton_inputs)

#: block sizes the Triton kernels take (MSA's own range)
MIN_BLOCK, MAX_BLOCK = 16, 128

__all__ = ["NEG", "IndexDistillLoss", "distill_loss", "index_block_logits", "index_distill_loss", "visible_blocks"]


def index_block_logits(q_idx: torch.Tensor, k_idx: torch.Tensor, block_size: int) -> torch.Tensor:
    """Student logits ``[B, S, G, n_blocks]`` (fp32; fp64 for fp64 inputs) by the dense formula:
    the max-pooled index scores of each block's causally visible tokens, differentiable; blocks a
    query cannot see at all get :data:`NEG`."""
    B, S, G, Didx = q_idx.shape
    nb = math.ceil(S / block_size)
    work = torch.float64 if q_idx.dtype == torch.float64 else torch.float32
    s = torch.einsum("btgd,bjd->btgj", q_idx.to(work), k_idx.to(work)) / math.sqrt(Didx)
    future = torch.ones(S, S, dtype=torch.bool, device=s.device).triu(1)[None, :, None, :]
    s = s.masked_fill(future, float("-inf"))
    s = nn.functional.pad(s, (0, nb * block_size - S), value=float("-inf"))
    s = s.view(B, S, G, nb, block_size).amax(-1)
    return s.masked_fill(torch.isinf(s), NEG)


def visible_blocks(S: int, block_size: int, device=None) -> torch.Tensor:
    """``n_t = t // block_size + 1`` for t in 0..S-1 (int64 ``[S]``)."""
    return torch.arange(S, device=device) // block_size + 1


def _counted_rows(S: int, block_size: int, device) -> torch.Tensor:
    rows = visible_blocks(S, block_size, device) >= 2  # [S]
    if not bool(rows.any()):
        raise ValueError(f"every query sees a single block (S = {S} <= block_size = {block_size})")
    return rows


def distill_loss(mass: torch.Tensor, logits: torch.Tensor, block_size: int) -> torch.Tensor:
    """``KL(P || Q)`` averaged over queries that see at least two blocks. ``mass`` (teacher,
    detached) and ``logits`` (student) ``[B, S, G, n_blocks]``."""
    logq = torch.log_softmax(logits, dim=-1)
    p = mass.detach().to(logq.dtype)
    kl = torch.where(p > 0, p * (torch.log(p.clamp_min(1e-30)) - logq), torch.zeros_like(p)).sum(-1)
    return kl[:, _counted_rows(mass.shape[1], block_size, mass.device)].mean()


def distill_logit_grad(mass: torch.Tensor, logits: torch.Tensor, block_size: int) -> torch.Tensor:
    """``d loss / d logits`` of :func:`distill_loss`, in closed form: ``(sum_i p_i) softmax(L) - p``
    per counted row, divided by the number of rows averaged; 0 on rows not counted and on blocks
    the row cannot see (their logit is the constant :data:`NEG`)."""
    B, S, G, _ = logits.shape
    rows = _counted_rows(S, block_size, logits.device)
    p = mass.detach().to(logits.dtype)
    grad = p.sum(-1, keepdim=True) * torch.softmax(logits, dim=-1) - p
    weight = rows.to(logits.dtype) / (B * int(rows.sum()) * G)
    return torch.where(logits > NEG, grad * weight[None, :, None, None], torch.zeros_like(grad))


class IndexDistillLoss(torch.autograd.Function):
    """``IndexDistillLoss.apply(q_idx, k_idx, mass, block_size) -> loss``: the Triton path of
    :func:`index_distill_loss`. The forward keeps ``arg`` (which token won each block's max) and
    the logits' gradient per unit of loss; the backward scales it and sends it through the max."""

    @staticmethod
    def forward(ctx, q_idx, k_idx, mass, block_size):
        logits, arg = block_logits_triton(q_idx, k_idx, block_size)
        loss = distill_loss(mass, logits, block_size)
        ctx.save_for_backward(q_idx, k_idx, arg, distill_logit_grad(mass, logits, block_size))
        ctx.block_size = block_size
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q_idx, k_idx, arg, dlogits = ctx.saved_tensors
        dq, dk = index_grads_triton(q_idx, k_idx, arg, dlogits * grad, ctx.block_size)
        return dq, dk, None, None


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
    _counted_rows(S, block_size, q_idx.device)
    if impl != "triton":
        return distill_loss(mass, index_block_logits(q_idx, k_idx, block_size), block_size)
    check_power_of_two(block_size, "block_size", minimum=MIN_BLOCK, maximum=MAX_BLOCK)  # the kernels' tile
    check_triton_inputs(float_dtypes=FLOAT_DTYPES, allow_grad=True, q_idx=q_idx, k_idx=k_idx, mass=mass)
    return IndexDistillLoss.apply(q_idx, k_idx, mass, block_size)
