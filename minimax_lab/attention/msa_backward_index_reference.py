"""The index branch's distillation loss, the reference: the dense formula, differentiated by autograd.

The definition the other impls (:mod:`.msa_backward_index_torch`, :mod:`.msa_backward_index_triton`)
are checked against; the contract is :mod:`.msa_backward_index`. It builds the ``[B, S, G, S]``
index scores, max-pools them per block (:func:`index_block_logits`), and takes the KL of the
teacher's block mass to their softmax (:func:`distill_loss`). Its gradient is autograd's, and
:func:`distill_logit_grad` writes the part up to the logits in closed form for the fast impls.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

#: the student logit of a block the query cannot see: finite, so a log-softmax stays NaN-free
NEG = -1e9


def index_block_logits(q_idx: torch.Tensor, k_idx: torch.Tensor, block_size: int) -> torch.Tensor:
    """Student logits ``[B, S, G, n_blocks]`` (fp32; fp64 for fp64 inputs): the max-pooled index
    scores ``q_idx . k_idx / sqrt(D_idx)`` of each block's causally visible tokens, differentiable;
    blocks a query cannot see at all get :data:`NEG`."""
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


def counted_rows(S: int, block_size: int, device=None) -> torch.Tensor:
    """The tokens whose rows the loss averages (they see at least two blocks), bool ``[S]``;
    raises ``ValueError`` when there is none (``S <= block_size``)."""
    rows = visible_blocks(S, block_size, device) >= 2
    if not bool(rows.any()):
        raise ValueError(f"every query sees a single block (S = {S} <= block_size = {block_size})")
    return rows


def distill_loss(mass: torch.Tensor, logits: torch.Tensor, block_size: int) -> torch.Tensor:
    """``KL(P || Q)`` averaged over queries that see at least two blocks. ``mass`` (teacher,
    detached) and ``logits`` (student) ``[B, S, G, n_blocks]``."""
    logq = torch.log_softmax(logits, dim=-1)
    p = mass.detach().to(logq.dtype)
    kl = torch.where(p > 0, p * (torch.log(p.clamp_min(1e-30)) - logq), torch.zeros_like(p)).sum(-1)
    return kl[:, counted_rows(mass.shape[1], block_size, mass.device)].mean()


def distill_logit_grad(mass: torch.Tensor, logits: torch.Tensor, block_size: int) -> torch.Tensor:
    """``d loss / d logits`` of :func:`distill_loss`, in closed form: ``(sum_i p_i) softmax(L) - p``
    per counted row, divided by the number of rows averaged; 0 on rows not counted and on blocks
    the row cannot see (their logit is the constant :data:`NEG`)."""
    B, S, G, _ = logits.shape
    rows = counted_rows(S, block_size, logits.device)
    p = mass.detach().to(logits.dtype)
    grad = p.sum(-1, keepdim=True) * torch.softmax(logits, dim=-1) - p
    weight = rows.to(logits.dtype) / (B * int(rows.sum()) * G)
    return torch.where(logits > NEG, grad * weight[None, :, None, None], torch.zeros_like(grad))


def index_distill_loss_reference(q_idx, k_idx, mass, *, block_size: int) -> torch.Tensor:
    """The loss by the dense formula (``[B, S, G, S]`` scores), differentiable by autograd."""
    return distill_loss(mass, index_block_logits(q_idx, k_idx, block_size), block_size)
