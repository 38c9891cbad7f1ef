"""Solutions of chapter 07's exercises (``minimax_lab.exercises.ch07``)."""
from __future__ import annotations

import json
import math
import struct

import blake3
import torch

from minimax_lab.kvcache.routing import PrefillCost
from minimax_lab.kvcache.cost import LayerShape


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


def pool_prefix(client, keys: list[str]) -> int:
    """One round trip for every key; the prefix ends at the first code that is not exactly 1."""
    if not keys:
        return 0
    try:
        codes = client.batch_is_exist(list(keys))
    except Exception:  # noqa: BLE001 -- a pool that fails serves nothing
        return 0
    n = 0
    for code in codes:
        if code != 1:
            break
        n += 1
    return n


MAGIC = b"MMLKVp01"
TAG_BYTES = 32


def read_block(value: bytes, name: bytes, model: str, dtype: torch.dtype, shape: tuple,
               secret: bytes) -> torch.Tensor | None:
    """Check the frame (magic, lengths), then the tag -- keyed with the pool's secret, so only the
    pool's owner could have written it -- then that the header names exactly this block and format
    and describes its payload, and only then look at the payload."""
    if not isinstance(value, (bytes, bytearray)) or len(value) < 12 + TAG_BYTES or value[:8] != MAGIC:
        return None
    body_end = len(value) - TAG_BYTES
    if blake3.blake3(bytes(value[:body_end]), key=secret).digest() != value[body_end:]:
        return None
    (hlen,) = struct.unpack("<I", value[8:12])
    if 12 + hlen > body_end:
        return None
    try:
        h = json.loads(bytes(value[12:12 + hlen]))
    except ValueError:
        return None
    payload = bytes(value[12 + hlen:body_end])
    expected_bytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if not isinstance(h, dict) or h.get("model") != model or h.get("hash") != name.hex() or \
            h.get("dtype") != str(dtype).replace("torch.", "") or h.get("shape") != list(shape) or \
            h.get("nbytes") != expected_bytes or len(payload) != expected_bytes:
        return None
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(dtype).reshape(shape).clone()


def pick_replica(n_tokens: int, local: list[int], pool: int, queue_s: list[float], cost: PrefillCost) -> int:
    """Each replica's finish time is its queue plus its own plan; the earliest wins (min keeps the first)."""
    def done(r: int) -> float:
        return queue_s[r] + fetch_or_recompute(n_tokens, local[r], pool, cost.shape, cost.link_gbps,
                                               cost.tflops, cost.mfu)[0]
    return min(range(len(local)), key=done)
