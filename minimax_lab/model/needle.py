"""Needle retrieval on long multi-image documents: one answer query's attention under a mode's pattern.

The document (:func:`minimax_lab.data.needle.needle_document`, re-exported here)::

    <bos> <img>*16 <img>*16 ... <img>*16 what colour is the triangle ?

``n_images`` images, one of them (the *needle*, at a random place) holds the asked shape exactly
once; the other images (the *haystack*) never contain that shape. So the question has one answer
in the whole document and answering it is pure content retrieval: find the one triangle among
``16 * n_images`` patches.

:func:`answer_probs` gives the attention probabilities of the answer row (the final "?") under a
mode's pattern: dense causal, or only the blocks a selection holds (the modes of
:func:`minimax_lab.model.msa_indexer.run_layers`: ``"dense"``, ``"msa"``, ``"window"``, ``"oracle"``).
"""
from __future__ import annotations

import math

import torch

from minimax_lab.data.needle import needle_batch, needle_document
from minimax_lab.data.shapes import COLOURS
from minimax_lab.model.msa_indexer import MODES

__all__ = ["CHANCE", "MODES", "answer_probs", "needle_batch", "needle_document"]

#: a guesser that names one of the four colours is right this often
CHANCE = 1 / len(COLOURS)


def answer_probs(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, selected: torch.Tensor | None,
                 block_size: int) -> torch.Tensor:
    """The attention probabilities of one query row per sequence, under a mode's pattern: ``q
    [N, S, Hq, D]``, ``k [N, S, G, D]``, ``pos`` int ``[N]`` (the row of each sequence),
    ``selected`` int ``[N, S, G, topk]`` (None: dense causal). Returns fp32 ``[N, Hq, S]``: the
    softmax of ``q . k / sqrt(D)`` over the keys ``j <= pos`` that lie in a selected block of the
    head's group (the same numbers as the full probability matrix's row, renormalized over the
    selected keys)."""
    N, S, Hq, D = q.shape
    G = k.shape[2]
    rows = torch.arange(N, device=q.device)
    qa = q[rows, pos].float()                                              # [N, Hq, D]
    kk = k.float().repeat_interleave(Hq // G, dim=2)                      # [N, S, Hq, D]
    s = torch.einsum("nhd,nshd->nhs", qa, kk) / math.sqrt(D)
    keys = torch.arange(S, device=q.device)
    allowed = (keys[None, :] <= pos[:, None])[:, None, :]                 # [N, 1, S] causal
    if selected is not None:
        blocks = selected[rows, pos].long()                               # [N, G, topk]
        in_sel = (blocks[..., None] == (keys // block_size)).any(-2)      # [N, G, S]
        allowed = allowed & in_sel.repeat_interleave(Hq // G, dim=1)
    return s.masked_fill(~allowed, float("-inf")).softmax(-1)
