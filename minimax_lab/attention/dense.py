"""Dense (full or causal) grouped-query attention: the public entry point, its checks and the impl switch.

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
* ``impl``: ``"reference"`` (materialized fp32 scores -- fp64 for fp64 inputs, :mod:`.dense_reference`),
  ``"torch"`` (``torch.nn.functional.scaled_dot_product_attention``, :mod:`.dense_torch`; differentiable),
  ``"triton"`` (the FlashAttention-2 kernel in :mod:`.dense_triton`: fp16, bf16 or fp32 on
  :func:`minimax_lab.runtime.kernel_device`; forward only, so inputs that require grad raise
  ``ValueError`` under grad mode instead of returning a detached output).

Raises ``TypeError``/``ValueError`` (from :mod:`minimax_lab.validate`) on bad input, including a
non-finite ``scale``. The input check is
:func:`minimax_lab.attention.dense_reference.check_attention_inputs`, which every implementation runs too.
"""
from __future__ import annotations

import math

from minimax_lab.attention.dense_reference import attention_reference, check_attention_inputs
from minimax_lab.attention.dense_torch import attention_torch
from minimax_lab.attention.dense_triton import flash_attention
from minimax_lab.validate import IMPLS, check_choice



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
        return flash_attention(q, k, v, causal=causal, scale=scale, return_lse=return_lse)
    return attention_torch(q, k, v, causal=causal, scale=scale, return_lse=return_lse)
