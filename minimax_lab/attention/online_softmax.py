"""The online-softmax recurrence in plain PyTorch: FlashAttention's loop, readable.

A teaching module for notebook 02 (FlashAttention in Triton), not an ``impl`` of
:func:`minimax_lab.attention.dense.attention`: it shows the loop step by step (and the state after
every tile, for plots), in fp32, at notebook sizes.

Softmax needs the row's maximum and sum over *all* keys, which seems to force materializing
the whole score row. Milakov & Gimelshein (2018, arXiv 1805.02867) showed the row can be
consumed in pieces while carrying three things per query row: the running max ``m``, the running
sum ``l = sum(exp(s - m))``, and the unnormalized output ``acc = sum(exp(s - m) * v)``. When a new
tile raises the max from ``m`` to ``m'``, everything accumulated so far is rescaled by
``exp(m - m')``. FlashAttention (Dao et al. 2022, arXiv 2205.14135) runs exactly this per tile on
the GPU; :mod:`minimax_lab.attention.dense_triton` is the Triton version of :func:`online_attention`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from minimax_lab.attention.dense_reference import check_attention_inputs
from minimax_lab.validate import check_positive_int


@dataclass
class SoftmaxState:
    """Per-row state after some key tiles: max ``m`` [..., S], sum ``l`` [..., S], ``acc`` [..., S, D]."""

    m: torch.Tensor
    l: torch.Tensor  # noqa: E741 - the paper's name
    acc: torch.Tensor

    @classmethod
    def empty(cls, rows_shape, d: int, device=None) -> "SoftmaxState":
        return cls(torch.full(rows_shape, -math.inf, device=device), torch.zeros(rows_shape, device=device),
                   torch.zeros(*rows_shape, d, device=device))

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(output = acc / l, lse = m + log l); rows that saw no key give 0 and -inf."""
        empty = self.l == 0
        out = self.acc / torch.where(empty, 1.0, self.l)[..., None]
        lse = torch.where(empty, -math.inf, self.m + torch.log(torch.where(empty, 1.0, self.l)))
        return out, lse


def online_step(state: SoftmaxState, scores: torch.Tensor, v_tile: torch.Tensor) -> SoftmaxState:
    """Fold one tile of scaled scores ``[..., S, N]`` (-inf = masked) and values ``[..., N, D]`` in."""
    m_new = torch.maximum(state.m, scores.amax(dim=-1))
    m_safe = torch.where(torch.isinf(m_new), 0.0, m_new)  # a row with no key yet: avoid -inf - -inf
    p = torch.exp(scores - m_safe[..., None])
    alpha = torch.exp(state.m - m_safe)  # how much the old max overstated: rescale the past
    return SoftmaxState(m_new, state.l * alpha + p.sum(-1), state.acc * alpha[..., None] + p @ v_tile)


def online_attention(q, k, v, *, causal: bool = True, scale: float | None = None, block_n: int = 64,
                     return_states: bool = False):
    """Attention by streaming key/value tiles of ``block_n`` through :func:`online_step`, in fp32.

    Same contract as the dense reference (``[B, S, H, D]``, GQA, bottom-right causal). Returns
    ``(o [B,S,Hq,D], lse [B,Hq,S])``, plus the list of states after each tile when
    ``return_states`` (for plots of the running max and sum).
    """
    B, S, Skv, Hq, Hkv, D = check_attention_inputs(q, k, v, scale=scale)
    check_positive_int(block_n, "block_n")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    qf = q.float().transpose(1, 2)                                                # [B, Hq, S, D]
    kf = k.float().transpose(1, 2).repeat_interleave(Hq // Hkv, 1)
    vf = v.float().transpose(1, 2).repeat_interleave(Hq // Hkv, 1)
    state, states = SoftmaxState.empty((B, Hq, S), D, q.device), []
    rows = torch.arange(S, device=q.device)[:, None]
    for n0 in range(0, Skv, block_n):
        scores = qf @ kf[:, :, n0:n0 + block_n].transpose(-1, -2) * scale
        if causal:
            cols = torch.arange(n0, min(n0 + block_n, Skv), device=q.device)[None, :]
            scores = scores.masked_fill(cols > rows + (Skv - S), -math.inf)
        state = online_step(state, scores, vf[:, :, n0:n0 + block_n])
        if return_states:
            states.append(state)
    out, lse = state.finish()
    out = out.transpose(1, 2).to(q.dtype)
    return (out, lse, states) if return_states else (out, lse)
