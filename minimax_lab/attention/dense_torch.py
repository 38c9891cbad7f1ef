"""Dense attention in PyTorch: ``torch.nn.functional.scaled_dot_product_attention`` on the contract's layout.

The ``impl="torch"`` implementation of :func:`minimax_lab.attention.dense.attention` (which checks
the inputs and resolves ``scale`` before calling :func:`attention_torch`). SDPA reads the
``[B, S, H, D]`` tensors through transposed views (no copy) and handles GQA itself; the
bottom-right-aligned causal rule is mapped onto SDPA's ``is_causal`` or an explicit mask, and
rows that see no key give zeros. SDPA does not return the log-sum-exp, so :func:`_lse_torch`
computes it separately, in query chunks. Differentiable.
"""
from __future__ import annotations

import torch

from minimax_lab.attention.dense_reference import causal_mask
from minimax_lab.sdpa import sdpa


def _sdpa(q, k, v, *, causal: bool, scale: float):
    """SDPA on the contract's layout: transposed views, GQA via ``enable_gqa``."""
    S, Skv, Hq, Hkv = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # [B, H, S, D] views, no copy
    gqa = {"enable_gqa": True} if Hq != Hkv else {}
    if not causal or S == 1 and Skv >= 1:  # one query at the end sees every key
        return sdpa(qt, kt, vt, scale=scale, **gqa).transpose(1, 2)
    if S == Skv:
        return sdpa(qt, kt, vt, is_causal=True, scale=scale, **gqa).transpose(1, 2)
    if S > Skv:
        # The first S - Skv queries see nothing (zeros); the last Skv are an aligned causal block.
        out = torch.zeros_like(q)
        if Skv > 0:
            out[:, S - Skv:] = _sdpa(q[:, S - Skv:], k, v, causal=True, scale=scale)
        return out
    mask = causal_mask(S, Skv, q.device)  # S < Skv: bottom-right aligned boolean mask
    return sdpa(qt, kt, vt, attn_mask=mask, scale=scale, **gqa).transpose(1, 2)


def _lse_torch(q, k, *, causal: bool, scale: float, rows_per_chunk: int = 1024) -> torch.Tensor:
    """Row log-sum-exp ``[B, Hq, S]`` fp32, computed in query chunks so memory stays bounded."""
    B, S, Hq, _ = q.shape
    Skv, Hkv = k.shape[1], k.shape[2]
    kt = k.transpose(1, 2).float().repeat_interleave(Hq // Hkv, dim=1)  # [B, Hq, Skv, D]
    out = torch.empty(B, Hq, S, dtype=torch.float32, device=q.device)
    for s0 in range(0, S, rows_per_chunk):
        qc = q[:, s0:s0 + rows_per_chunk].transpose(1, 2).float()
        scores = (qc @ kt.transpose(-1, -2)) * scale
        if causal:
            i = torch.arange(s0, s0 + qc.shape[2], device=q.device)[:, None]
            j = torch.arange(Skv, device=q.device)[None, :]
            scores = scores.masked_fill(j > i + (Skv - S), float("-inf"))
        out[:, :, s0:s0 + qc.shape[2]] = torch.logsumexp(scores, dim=-1)
    return out


def attention_torch(q, k, v, *, causal: bool, scale: float, return_lse: bool = False):
    """SDPA attention on checked inputs with a resolved ``scale``: o ``[B, S, Hq, D]`` in q's dtype,
    and with ``return_lse`` also lse ``[B, Hq, S]`` fp32."""
    out = _sdpa(q, k, v, causal=causal, scale=scale)
    if return_lse:
        return out, _lse_torch(q, k, causal=causal, scale=scale)
    return out
