"""How much of the LRU -> Belady gap each eviction policy closes, per cache capacity.

``gap_table(requests, capacities)`` replays the requests (``trace.replay_trace``) with every
policy of ``POLICY_ORDER`` and returns one row per capacity: each policy's hit ratio and its share
of the gap, ``(hit - hit_LRU) / (hit_Belady - hit_LRU)`` (None where the gap is under 0.1% of the
tokens: nothing to close). ``python -m minimax_lab.bench.kvstore_sims policy-gap`` records it for
Mooncake's synthetic trace and the generated agent workload.
"""
from __future__ import annotations


from tqdm.auto import tqdm

from minimax_lab.kvcache.trace import _as_requests, replay_trace

POLICY_ORDER = ("lru", "lfu", "s3fifo", "arc", "agent", "chain", "reuse", "adaptive", "belady")


def gap_table(requests, capacities, policies=POLICY_ORDER, *, progress: bool = False) -> list[dict]:
    """Rows ``{capacity_tokens, hit: {policy: ratio}, gap_closed: {policy: share or None}}``."""
    reqs = _as_requests(requests)
    rows = []
    for cap in tqdm(capacities, desc="capacities", disable=not progress):
        hit = {p: replay_trace(reqs, capacity_tokens=cap, policy=p).hit_ratio for p in policies}
        gap = hit.get("belady", 0.0) - hit.get("lru", 0.0)
        closed = {p: (h - hit["lru"]) / gap if gap > 1e-3 else None for p, h in hit.items()}
        rows.append(dict(capacity_tokens=cap, hit=hit, gap_closed=closed))
    return rows
