"""Solutions of chapter 07's exercises (``minimax_lab.exercises.ch07``)."""
from __future__ import annotations

import hashlib
import json

import torch

from minimax_lab.kvcache.routing import PrefillCost
from minimax_lab.kvcache.tiers import LayerShape


def fetch_or_recompute(n_tokens: int, local: int, pool: int, shape: LayerShape, link_gbps: float,
                       tflops: float, mfu: float = 0.5) -> tuple[float, int, int]:
    """Only the pool's part beyond the local prefix is worth moving; move it if its bytes travel
    faster than its FLOPs compute, then compute from wherever the prefix ends."""
    local, pool = min(local, n_tokens), min(pool, n_tokens)
    rate = tflops * 1e12 * mfu
    fetch = 0
    if pool > local:
        t_fetch = (pool - local) * shape.kv_bytes_per_token() / (link_gbps * 1e9)
        if t_fetch < shape.prefill_flops(local, pool) / rate:
            fetch = pool - local
    start = local + fetch
    seconds = fetch * shape.kv_bytes_per_token() / (link_gbps * 1e9) + shape.prefill_flops(start, n_tokens) / rate
    return seconds, fetch, n_tokens - start


def block_key(name: bytes, model: str, dtype: torch.dtype, block_shape: tuple) -> str:
    """Hash the format (model, dtype, shape) into a short tag and put it beside the name: equal
    parts, equal key; any part changed, another key (up to a 64-bit hash collision of the format)."""
    fmt = json.dumps([model, str(dtype), [int(d) for d in block_shape]])
    return f"kv-{hashlib.blake2b(fmt.encode(), digest_size=8).hexdigest()}-{name.hex()}"


def pick_replica(n_tokens: int, local: list[int], pool: int, queue_s: list[float], cost: PrefillCost) -> int:
    """Each replica's finish time is its queue plus its own plan; the earliest wins (min keeps the first)."""
    return min(range(len(local)), key=lambda r: queue_s[r] + cost.plan(n_tokens, local[r], pool)[0])
