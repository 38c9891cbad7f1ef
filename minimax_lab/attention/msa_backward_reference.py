"""The backward of MSA's sparse attention, the reference: autograd through the dense-mask forward.

The definition the fast backwards are checked against. Given a selection (``int32 [B, S, G,
topk]``, ``-1`` = unused; see :mod:`.msa_reference` for the rules), the forward of
:func:`.msa_reference.msa_attention_reference` is a smooth function of ``q, k, v``: each query
head ``h`` of group ``g = h // (Hq / G)`` takes an exact softmax over the tokens of its group's
selected blocks (causal inside the local block). This file differentiates it with autograd in
the reference's own precision (fp32; fp64 for fp64 inputs, the ground truth of the tests), so
every rule -- GQA, the local block, ragged lengths, rows with no block -- is differentiated by
the same code that defines it.

What the fast versions compute by hand (:mod:`.msa_backward_torch`, :mod:`.msa_backward_triton`),
per query row with ``p = softmax(s)``, ``s = scale * q . k`` over the row's visible keys, the
output ``o = p @ v`` and upstream gradients ``do`` (and ``dlse`` when the log-sum-exp is used)::

    dv   += p^T do                        (summed over every row that sees the key)
    dp    = do . v                        per visible key
    delta = do . o - dlse                 per row
    ds    = p * (dp - delta)
    dq    = scale * ds @ k
    dk   += scale * ds^T q

A row that sees no key (all ``-1``) has output 0 and lse ``-inf``; all its gradients are 0.
"""
from __future__ import annotations

import torch

from minimax_lab.attention.msa_reference import msa_attention_reference
from minimax_lab.validate import accumulate_dtype


def msa_attention_backward_reference(q, k, v, selected, do, *, block_size: int, scale: float | None = None,
                                     dlse=None):
    """``(dq, dk, dv)`` of :func:`.msa_reference.msa_attention_reference` over ``selected``, by autograd.

    ``q [B, S, Hq, D]``, ``k, v [B, S, G, D]``, ``selected int32 [B, S, G, topk]`` (a valid
    selection), ``do`` the gradient of the output (q's shape), ``dlse`` the gradient of the
    log-sum-exp ``[B, Hq, S]`` or None. Computes in :func:`minimax_lab.validate.accumulate_dtype`
    (fp32; fp64 for fp64 inputs); returns gradients in the dtypes of ``q``, ``k``, ``v``.
    Inputs are assumed valid (``msa.py`` checks them)."""
    work = accumulate_dtype(q.dtype)
    leaves = [t.detach().to(work).requires_grad_(True) for t in (q, k, v)]
    with torch.enable_grad():
        o, lse = msa_attention_reference(*leaves, None, None, block_size=block_size, topk=selected.shape[-1],
                                         scale=scale, return_lse=True, selected=selected)
        outputs, grads = [o], [do.to(work)]
        if dlse is not None:
            # an empty row's lse is -inf whatever the inputs: no gradient passes through it
            outputs.append(lse.masked_fill(torch.isinf(lse), 0.0))
            grads.append(dlse.to(work))
        dq, dk, dv = torch.autograd.grad(outputs, leaves, grads)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
