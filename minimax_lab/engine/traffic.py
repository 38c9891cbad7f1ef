"""What a decode step must read and compute: the bytes and FLOPs behind chapter 00's roofline.

A decode step of ``batch`` sequences, each with ``context`` tokens in the cache, reads (at least,
once each):

* **weights** -- every layer's attention projections, norms and router, the experts the batch's
  tokens are routed to (with ``top_k`` of ``E`` experts per token, a batch touches on average
  ``E * (1 - (1 - top_k / E) ** batch)`` distinct experts per layer if routing is uniform), one
  embedding row per token, and the whole output head;
* **KV** -- a dense layer every cached token of every sequence (K and V of each kv head); an MSA
  layer every index key (the index scores cover the whole context), then K and V of the ``topk``
  blocks each kv group selects.

FP8 (``kv_dtype`` / ``expert_dtype``) stores one byte per value plus an fp32 scale per token and
head (KV), per token (index keys) or per output channel (experts).

FLOPs count multiply-adds twice: the activated weights' matrix products, and attention's scores
and weighted sums over what it reads. With a step's measured time, ``bytes / time`` against the
copy ceiling says how far the step is from what memory allows.

A prompt's FLOPs (:func:`prefill_flops`) split the same way: per token (the activated weights, and
MSA's attention over its ``topk`` blocks), and per causal query-key pair (the dense layers'
attention, and MSA's index scores, which cover every pair).
"""
from __future__ import annotations

import math

import torch

from minimax_lab.engine.config import M3Config

SCALE_BYTES = 4   # an fp32 scale


def _elt(cfg: M3Config) -> int:
    return torch.empty((), dtype=cfg.torch_dtype).element_size()


def experts_touched(cfg: M3Config, batch: int) -> float:
    """Expected distinct experts a batch of ``batch`` tokens reads per layer under uniform routing."""
    E, k = cfg.n_experts, cfg.top_k
    return E * (1 - (1 - k / E) ** batch)


def decode_step_bytes(cfg: M3Config, *, batch: int, context: int, kv_dtype: str | None = None,
                      expert_dtype: str | None = None) -> dict:
    """Bytes one decode step of ``batch`` sequences at ``context`` cached tokens reads (module
    docstring): ``{"weights", "kv", "total", "per_token"}``."""
    if batch < 1 or context < 1:
        raise ValueError(f"batch and context must be >= 1, got batch={batch}, context={context}")
    elt = _elt(cfg)
    d, D, G, Hq, Di = cfg.d_model, cfg.head_dim, cfg.n_kv_heads, cfg.n_heads, cfg.d_idx
    n_sparse = len(cfg.sparse_layers)
    attn = cfg.n_layers * (d * cfg.qkv_width + Hq * D * d + 3 * d + 2 * D) + n_sparse * d * (G * Di + Di)
    router = cfg.n_layers * d * cfg.n_experts
    per_expert = (3 * d * cfg.d_expert) * (1 if expert_dtype else elt)
    if expert_dtype:
        per_expert += SCALE_BYTES * (2 * cfg.d_expert + d)
    experts = cfg.n_layers * experts_touched(cfg, batch) * per_expert
    weights = (attn + router) * elt + experts + (batch * d + cfg.vocab_size * d + d) * elt
    kv_elt = 1 if kv_dtype else elt
    kv_scale = SCALE_BYTES if kv_dtype else 0
    per_token_kv = 2 * G * (D * kv_elt + kv_scale)                   # K and V of every kv head
    dense = len(cfg.dense_layers) * batch * context * per_token_kv
    blocks = min(cfg.topk, math.ceil(context / cfg.block_size))
    selected = batch * G * blocks * cfg.block_size * 2 * (D * kv_elt + kv_scale)
    index = batch * context * (Di * kv_elt + kv_scale)
    kv = dense + n_sparse * (index + selected)
    total = weights + kv
    return {"weights": weights, "kv": kv, "total": total, "per_token": total / batch}


def decode_step_flops(cfg: M3Config, *, batch: int, context: int) -> float:
    """FLOPs of one decode step (module docstring)."""
    d, D, G, Hq, Di = cfg.d_model, cfg.head_dim, cfg.n_kv_heads, cfg.n_heads, cfg.d_idx
    n_sparse = len(cfg.sparse_layers)
    proj = cfg.n_layers * (d * cfg.qkv_width + Hq * D * d + d * cfg.n_experts) + n_sparse * d * (G * Di + Di)
    moe = cfg.n_layers * cfg.top_k * 3 * d * cfg.d_expert
    matmuls = 2 * batch * (proj + moe + cfg.vocab_size * d)
    dense = len(cfg.dense_layers) * 4 * batch * Hq * context * D
    picked = min(cfg.topk, math.ceil(context / cfg.block_size)) * cfg.block_size
    sparse = n_sparse * batch * (2 * G * context * Di + 4 * Hq * picked * D)
    return float(matmuls + dense + sparse)


def prefill_flops(cfg: M3Config, *, tokens: int, pairs: int) -> dict:
    """FLOPs of computing ``tokens`` prompt tokens whose causal attention covers ``pairs`` query-key
    pairs (module docstring): ``{"per_token", "per_pair", "total"}``. Raises ``ValueError`` for
    negative counts."""
    if tokens < 0 or pairs < 0:
        raise ValueError(f"tokens and pairs must be >= 0, got tokens={tokens}, pairs={pairs}")
    d, D, G, Hq, Di = cfg.d_model, cfg.head_dim, cfg.n_kv_heads, cfg.n_heads, cfg.d_idx
    n_sparse = len(cfg.sparse_layers)
    proj = cfg.n_layers * (d * cfg.qkv_width + Hq * D * d + d * cfg.n_experts) + n_sparse * d * (G * Di + Di)
    moe = cfg.n_layers * cfg.top_k * 3 * d * cfg.d_expert
    per_token = 2 * (proj + moe) + n_sparse * 4 * Hq * cfg.topk * cfg.block_size * D
    per_pair = len(cfg.dense_layers) * 4 * Hq * D + n_sparse * 2 * G * Di
    return {"per_token": float(per_token), "per_pair": float(per_pair),
            "total": float(per_token * tokens + per_pair * pairs)}
