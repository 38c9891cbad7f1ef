"""Dense attention the slow, obvious way: materialize every score in fp32.

This is the ground truth every faster implementation in the workbook is checked against.
It builds the full ``[B, Hq, S, Skv]`` score matrix, so its memory grows as ``S * Skv``;
use it at sizes where that fits. It also holds :func:`check_attention_inputs`, the contract check
that the entry point :func:`minimax_lab.attention.dense.attention` and every implementation run
(here, so that the implementations need not import the entry point that imports them).

Conventions (the dense-attention contract, see :func:`minimax_lab.attention.dense.attention`):

* q ``[B, S, Hq, D]``, k and v ``[B, Skv, Hkv, D]``; ``Hq`` a multiple of ``Hkv`` (grouped-query
  attention: query head ``h`` reads kv head ``h // (Hq // Hkv)``).
* ``causal``: query ``i`` (of ``S``) sees keys ``j <= i + (Skv - S)`` -- the queries are the
  *last* ``S`` positions (bottom-right aligned), which is what decoding and chunked prefill need.
* A query row that sees no key at all (causal with ``S > Skv``) gets output 0 and lse ``-inf``.
"""
from __future__ import annotations

import math

import torch

from minimax_lab.validate import FLOAT_DTYPES, accumulate_dtype, check_same_device, check_scale, check_tensor


def check_attention_inputs(q, k, v, *, scale=None) -> tuple[int, int, int, int, int, int]:
    """Validate the dense-attention contract; returns ``(B, S, Skv, Hq, Hkv, D)``.

    Raises ``TypeError`` for non-tensors or a non-number ``scale``, ``ValueError`` for wrong
    ranks, mismatched shapes/dtypes/devices, or ``Hq`` not a multiple of ``Hkv``.
    """
    check_tensor(q, "q", ndim=4, dtypes=FLOAT_DTYPES)
    B, S, Hq, D = q.shape
    check_tensor(k, "k", ndim=4, dtypes=(q.dtype,))
    Skv, Hkv = k.shape[1], k.shape[2]
    check_tensor(k, "k", shape=(B, None, None, D))
    check_tensor(v, "v", shape=(B, Skv, Hkv, D), dtypes=(q.dtype,))
    check_same_device(q=q, k=k, v=v)
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"q heads ({Hq}) must be a positive multiple of k/v heads ({Hkv})")
    if D < 1:
        raise ValueError(f"head_dim must be >= 1, got {D}")
    check_scale(scale)
    return B, S, Skv, Hq, Hkv, D


def causal_mask(S: int, Skv: int, device=None) -> torch.Tensor:
    """Bool ``[S, Skv]``, True where query ``i`` may see key ``j`` (``j <= i + Skv - S``)."""
    i = torch.arange(S, device=device)[:, None]
    j = torch.arange(Skv, device=device)[None, :]
    return j <= i + (Skv - S)


def attention_reference(q, k, v, *, causal: bool = True, scale: float | None = None, return_lse: bool = False):
    """Materialized-score attention in fp32 (or fp64 for fp64 inputs).

    Returns o ``[B, S, Hq, D]`` in q's dtype, and with ``return_lse`` also the natural-log
    log-sum-exp of each row's scaled scores, ``[B, Hq, S]`` fp32 (fp64 for fp64 inputs).
    """
    B, S, Skv, Hq, Hkv, D = check_attention_inputs(q, k, v, scale=scale)
    work = accumulate_dtype(q.dtype)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    group = Hq // Hkv
    qf = q.to(work).permute(0, 2, 1, 3)                                  # [B, Hq, S, D]
    kf = k.to(work).permute(0, 2, 1, 3).repeat_interleave(group, dim=1)  # [B, Hq, Skv, D]
    vf = v.to(work).permute(0, 2, 1, 3).repeat_interleave(group, dim=1)
    scores = (qf @ kf.transpose(-1, -2)) * scale                          # [B, Hq, S, Skv]
    if causal:
        scores = scores.masked_fill(~causal_mask(S, Skv, q.device), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)                                 # -inf on empty rows
    # exp(score - lse) is the softmax; rows with no visible key would be exp(-inf - -inf) = NaN.
    probs = torch.exp(scores - lse.masked_fill(torch.isinf(lse), 0.0)[..., None])
    out = (probs @ vf).permute(0, 2, 1, 3).to(q.dtype)                   # [B, S, Hq, D]
    if return_lse:
        return out, lse
    return out
