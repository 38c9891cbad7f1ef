"""Dense (full or causal) grouped-query attention: one contract, three implementations.

``attention(q, k, v, *, causal=True, scale=None, impl="torch", return_lse=False)``

* q ``[B, S, Hq, D]``; k, v ``[B, Skv, Hkv, D]``; same float dtype and device; ``Hq`` a multiple
  of ``Hkv`` (query head ``h`` uses kv head ``h // (Hq // Hkv)``; no K/V copy in "triton").
* ``scale`` defaults to ``1 / sqrt(D)``.
* ``causal``: with ``S != Skv`` the queries are the **last** ``S`` positions (bottom-right
  aligned): query ``i`` sees keys ``j <= i + Skv - S``. Rows that see no key give zeros (lse -inf).
* Returns o ``[B, S, Hq, D]`` in q's dtype; with ``return_lse`` also ``lse [B, Hq, S]`` fp32,
  the natural-log log-sum-exp of each row's scaled scores.
* Any strides: non-contiguous views give the same answer as contiguous copies.
* Empty inputs: ``B = 0`` or ``S = 0`` give an empty o; ``Skv = 0`` gives zeros (lse -inf).
* ``impl``: ``"reference"`` (materialized fp32 scores -- fp64 for fp64 inputs, :mod:`.reference`),
  ``"torch"`` (``torch.nn.functional.scaled_dot_product_attention``; differentiable),
  ``"triton"`` (the FlashAttention-style kernel in :mod:`.flash`: fp16, bf16 or fp32 on
  :func:`minimax_lab.runtime.kernel_device`; forward only, so inputs that require grad raise
  ``ValueError`` under grad mode instead of returning a detached output).

Raises ``TypeError``/``ValueError`` (from :mod:`minimax_lab.validate`) on bad input, including a
non-finite ``scale``.
"""
from __future__ import annotations

import math

import torch

from minimax_lab.attention.reference import attention_reference, causal_mask, check_attention_inputs
from minimax_lab.sdpa import sdpa
from minimax_lab.validate import check_choice

IMPLS = ("reference", "torch", "triton")


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


def attention(q, k, v, *, causal: bool = True, scale: float | None = None, impl: str = "torch",
              return_lse: bool = False):
    """Dense GQA attention; see the module docstring for the full contract."""
    check_choice(impl, "impl", IMPLS)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    _, _, _, _, _, D = check_attention_inputs(q, k, v, scale=scale)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if impl == "reference":
        out = attention_reference(q, k, v, causal=causal, scale=scale, return_lse=return_lse)
        if return_lse:
            return out[0], out[1].float()
        return out
    if impl == "triton":
        from minimax_lab.attention.flash import flash_attention

        return flash_attention(q, k, v, causal=causal, scale=scale, return_lse=return_lse)
    out = _sdpa(q, k, v, causal=causal, scale=scale)
    if return_lse:
        return out, _lse_torch(q, k, causal=causal, scale=scale)
    return out
