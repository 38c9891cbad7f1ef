"""How close two MSA selections are, for checks where exact equality is the wrong question: FP8
index scores and near-tied blocks may swap blocks whose scores are equal within rounding.

* :func:`selection_score_gap` -- how far a selection's worst pick scores below the exact cutoff;
* :func:`selection_overlap` -- the share of rows selecting the same set, and of blocks both keep.
"""
from __future__ import annotations

import torch

from minimax_lab.attention.msa_torch import block_scores_torch, select_from_scores

#: FP8 tensor cores add a dot's products with fewer bits than fp32 (about 14 on Hopper: DeepSeek-V3
#: technical report, arXiv 2412.19437, section 3.3.2), so blocks
#: whose fp32 scores nearly tie may swap; a selection counts as right when every block it ranked
#: scores within this share of the row's largest |score| of the exact cutoff (measured on the
#: H200 at S = 4173: 2.2e-4; a wrong pick is off by ~0.1 or more)
FP8_TIE_TOLERANCE = 2e-3


def selection_score_gap(sel, q_idx, k_idx, block_size: int, topk: int) -> float:
    """How far ``sel`` (``int32 [B, S, G, topk]``) is from the exact selection on the fp32 scores of
    ``q_idx``/``k_idx`` (dequantized FP8 tensors are fine): the largest, over rows, of (the exact
    selection's lowest ranked score - the score of a block ``sel`` ranked instead) / the row's
    largest finite |score|. 0 when the sets are equal (or differ only among exact ties); ``inf``
    when a row selects a block it cannot see or a different number of blocks."""
    scores = block_scores_torch(q_idx, k_idx, block_size)  # [B, S, G, nb] fp32, -inf where unseen
    ref = select_from_scores(scores, torch.arange(q_idx.shape[1], device=scores.device)[None, :, None],
                             block_size, topk).long()
    got = sel.long()
    if not torch.equal((got >= 0).sum(-1), (ref >= 0).sum(-1)) or bool((got >= scores.shape[-1]).any()):
        return float("inf")
    local = (torch.arange(q_idx.shape[1], device=scores.device) // block_size)[None, :, None, None]
    s_ref = scores.gather(-1, ref.clamp(min=0)).masked_fill((ref < 0) | (ref == local), float("inf"))
    cutoff = s_ref.amin(-1, keepdim=True)  # the exact selection's lowest ranked score (inf: none ranked)
    s_got = scores.gather(-1, got.clamp(min=0))
    extra = (got >= 0) & ~(got[..., :, None] == ref[..., None, :]).any(-1)
    if bool((extra & ~torch.isfinite(s_got)).any()):
        return float("inf")
    fin = torch.isfinite(scores)
    row_scale = scores.masked_fill(~fin, 0).abs().amax(-1, keepdim=True).clamp(min=1e-30)
    gap = ((cutoff - s_got) / row_scale).masked_fill(~extra, 0.0)
    return float(gap.max()) if gap.numel() else 0.0


def selection_overlap(sel_a, sel_b) -> tuple[float, float]:
    """``(share of rows selecting the same set, share of selected blocks both keep)``."""
    a, b = sel_a.sort(dim=-1).values, sel_b.sort(dim=-1).values
    rows = float((a == b).all(-1).float().mean())
    hits = (a[..., :, None] == b[..., None, :]) & (a[..., :, None] >= 0)
    kept = float(hits.any(-1).sum()) / max(1, int((a >= 0).sum()))
    return rows, kept
