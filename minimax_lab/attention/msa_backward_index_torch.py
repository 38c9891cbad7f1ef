"""The index branch's distillation loss in PyTorch, by blocks of queries: the logits' max-pool and
its gradient written out, the scores never whole.

Same contract as :mod:`.msa_backward_index_reference`. For a chunk of ``chunk`` query tokens it
computes their ``[B, C, G, S]`` scores, max-pools them per block and keeps, beside each block's
logit, the token that attained it (``arg``, the first on a tie: ``torch.max``'s rule). The
loss and its gradient w.r.t. the logits are block-sized (:func:`.msa_backward_index_reference.distill_logit_grad`);
the max hands each block's gradient to its winner, so ``dq_idx`` gathers the winners' keys and
``dk_idx`` scatters ``dL q_idx`` onto them (``index_add_``) -- the two steps the Triton kernels
do without atomics (:mod:`.msa_backward_index_triton`).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from minimax_lab.attention.msa_backward_autograd import IndexDistillLoss
from minimax_lab.attention.msa_backward_index_reference import NEG


def block_logits_torch(q_idx, k_idx, block_size: int, *, chunk: int = 256):
    """``(L, arg)``: the student logits ``[B, S, G, n_blocks]`` (fp32; fp64 for fp64 inputs;
    :data:`NEG` where unseen) and the token attaining each block's max (int32, ``-1`` where unseen),
    ``chunk`` query tokens at a time (memory ~ ``chunk * S`` scores)."""
    B, S, G, Didx = q_idx.shape
    nb = math.ceil(S / block_size)
    work = torch.float64 if q_idx.dtype == torch.float64 else torch.float32
    L = torch.full((B, S, G, nb), NEG, dtype=work, device=q_idx.device)
    arg = torch.full((B, S, G, nb), -1, dtype=torch.int32, device=q_idx.device)
    keys = nn.functional.pad(k_idx.to(work), (0, 0, 0, nb * block_size - S))  # [B, nb * Bk, Didx]
    first = torch.arange(nb, device=q_idx.device) * block_size  # each block's first token
    for c0 in range(0, S, chunk):
        t = torch.arange(c0, min(S, c0 + chunk), device=q_idx.device)
        s = torch.einsum("btgd,bjd->btgj", q_idx[:, t].to(work), keys) / math.sqrt(Didx)
        future = torch.arange(nb * block_size, device=q_idx.device)[None, :] > t[:, None]
        s = s.masked_fill(future[None, :, None, :], float("-inf")).view(B, len(t), G, nb, block_size)
        best, at = s.max(-1)
        seen = (first[None, :] <= t[:, None])[None, :, None, :]  # [1, C, 1, nb]
        L[:, t] = torch.where(seen, best, torch.full_like(best, NEG))
        arg[:, t] = torch.where(seen, first + at, -1).to(torch.int32)
    return L, arg


def index_grads_torch(q_idx, k_idx, arg, dL, block_size: int, *, chunk: int = 256):
    """``(dq_idx, dk_idx)`` in the dtypes of ``q_idx``/``k_idx`` from the logits' gradient ``dL``
    and the winners ``arg`` of :func:`block_logits_torch` (``block_size`` unused: ``arg`` holds
    token ids)."""
    B, S, G, Didx = q_idx.shape
    work = dL.dtype
    dq = torch.zeros(B, S, G, Didx, dtype=work, device=q_idx.device)
    dk = torch.zeros(B, S, Didx, dtype=work, device=q_idx.device)
    for b in range(B):
        kb, qb = k_idx[b].to(work), q_idx[b].to(work)
        for c0 in range(0, S, chunk):
            a, w = arg[b, c0:c0 + chunk].long(), dL[b, c0:c0 + chunk]  # [C, G, nb]
            won = a >= 0
            dq[b, c0:c0 + chunk] = (w[..., None] * kb[a.clamp(min=0)] * won[..., None]).sum(2)
            rows = qb[c0:c0 + chunk, :, None, :].expand(-1, -1, a.shape[-1], -1)  # [C, G, nb, Didx]
            dk[b].index_add_(0, a[won], w[won][:, None] * rows[won])
    scale = 1.0 / math.sqrt(Didx)
    return (dq * scale).to(q_idx.dtype), (dk * scale).to(k_idx.dtype)


def index_distill_loss_torch(q_idx, k_idx, mass, *, block_size: int) -> torch.Tensor:
    """The loss through :class:`.msa_backward_autograd.IndexDistillLoss` with the PyTorch steps."""
    return IndexDistillLoss.apply(q_idx, k_idx, mass, block_size, block_logits_torch, index_grads_torch)
