"""The autograd wiring of MSA's backward: the sparse attention's ``torch.autograd.Function`` (any
forward impl paired with any backward impl), and the index branch's loss's.

:class:`SparseAttention` runs a forward impl over a fixed selection (``reference``, ``torch`` or
``triton``), saves what the backward needs -- ``q, k, v``, the output ``o``, the log-sum-exp
``lse [B, Hq, S]`` and the selection -- and differentiates with a backward impl of
:mod:`.msa_backward_reference`, :mod:`.msa_backward_torch` or :mod:`.msa_backward_triton`.
Gradients reach ``q``, ``k``, ``v`` from both outputs (``o`` and ``lse``); the selection is an
integer tensor, marked non-differentiable. Inputs are assumed checked (by
:func:`minimax_lab.attention.msa.msa_attention` or :func:`.msa_backward.sparse_attention`).

:class:`IndexDistillLoss` is the index branch's distillation loss (:mod:`.msa_backward_index`)
from two steps an impl supplies: the block logits with the token that won each block's max, and
the gradient sent back through those winners to ``q_idx`` and ``k_idx``.
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from minimax_lab.attention.msa_backward_index_reference import distill_logit_grad, distill_loss
from minimax_lab.attention.msa_backward_reference import msa_attention_backward_reference
from minimax_lab.attention.msa_backward_torch import msa_attention_backward_torch
from minimax_lab.attention.msa_backward_triton import msa_attention_backward_triton
from minimax_lab.attention.msa_reference import msa_attention_reference
from minimax_lab.attention.msa_torch import msa_attention_torch
from minimax_lab.attention.msa_triton_prefill import msa_attention_triton


def forward_with_lse(impl: str, q, k, v, selected, *, block_size: int, scale, schedule: str = "auto"):
    """``(o, lse)`` of the ``impl`` forward over ``selected`` (no index tensors needed)."""
    if q.shape[0] * q.shape[1] == 0:
        B, S, Hq, _ = q.shape
        return torch.zeros_like(q), torch.full((B, Hq, S), float("-inf"), dtype=torch.float32, device=q.device)
    kw = dict(block_size=block_size, topk=selected.shape[-1], scale=scale, return_lse=True, selected=selected)
    if impl == "reference":
        return msa_attention_reference(q, k, v, None, None, **kw)
    if impl == "torch":
        return msa_attention_torch(q, k, v, None, None, **kw)
    return msa_attention_triton(q, k, v, None, None, schedule=schedule, **kw)


def backward_of(impl: str, q, k, v, o, lse, do, selected, *, block_size: int, scale, dlse=None):
    """``(dq, dk, dv)`` by the ``impl`` backward (``o`` and ``lse`` unused by the reference)."""
    if q.shape[0] * q.shape[1] == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    if impl == "reference":
        return msa_attention_backward_reference(q, k, v, selected, do, block_size=block_size, scale=scale, dlse=dlse)
    if impl == "torch":
        return msa_attention_backward_torch(q, k, v, o, lse, do, selected, block_size=block_size, scale=scale,
                                            dlse=dlse)
    return msa_attention_backward_triton(q, k, v, o, lse, do, selected, block_size=block_size, scale=scale, dlse=dlse)


class SparseAttention(torch.autograd.Function):
    """``SparseAttention.apply(q, k, v, selected, block_size, scale, forward_impl, backward_impl,
    schedule) -> (o, lse)``; see the module docstring."""

    @staticmethod
    def forward(ctx, q, k, v, selected, block_size, scale, forward_impl, backward_impl, schedule):
        o, lse = forward_with_lse(forward_impl, q, k, v, selected, block_size=block_size, scale=scale,
                                  schedule=schedule)
        ctx.save_for_backward(q, k, v, o, lse, selected)
        ctx.block_size, ctx.scale, ctx.backward_impl = block_size, scale, backward_impl
        ctx.set_materialize_grads(False)  # an unused output passes None: no zero tensor to read
        return o, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, do, dlse):
        q, k, v, o, lse, selected = ctx.saved_tensors
        if do is None:  # only lse was used
            do = torch.zeros_like(o)
        dq, dk, dv = backward_of(ctx.backward_impl, q, k, v, o, lse, do, selected, block_size=ctx.block_size,
                                 scale=ctx.scale, dlse=dlse)
        return dq, dk, dv, None, None, None, None, None, None


class IndexDistillLoss(torch.autograd.Function):
    """``IndexDistillLoss.apply(q_idx, k_idx, mass, block_size, logits_fn, grads_fn) -> loss``:
    ``logits_fn(q_idx, k_idx, block_size) -> (L, arg)`` gives the student logits and each block's
    winning token; the forward keeps ``arg`` and the logits' gradient per unit of loss
    (:func:`.msa_backward_index_reference.distill_logit_grad`); the backward scales it and sends it
    through the winners, ``grads_fn(q_idx, k_idx, arg, dL, block_size) -> (dq_idx, dk_idx)``. The
    teacher ``mass`` gets no gradient."""

    @staticmethod
    def forward(ctx, q_idx, k_idx, mass, block_size, logits_fn, grads_fn):
        logits, arg = logits_fn(q_idx, k_idx, block_size)
        loss = distill_loss(mass, logits, block_size)
        ctx.save_for_backward(q_idx, k_idx, arg, distill_logit_grad(mass, logits, block_size))
        ctx.block_size, ctx.grads_fn = block_size, grads_fn
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q_idx, k_idx, arg, dlogits = ctx.saved_tensors
        dq, dk = ctx.grads_fn(q_idx, k_idx, arg, dlogits * grad, ctx.block_size)
        return dq, dk, None, None, None, None
