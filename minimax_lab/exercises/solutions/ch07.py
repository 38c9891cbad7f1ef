"""Solutions of chapter 07's exercises (``minimax_lab.exercises.ch07``)."""
from __future__ import annotations

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
