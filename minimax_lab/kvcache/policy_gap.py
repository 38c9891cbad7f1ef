"""How much of the LRU -> Belady gap each eviction policy closes, per cache capacity, and how much
cache a policy saves against LRU.

``gap_table(requests, capacities)`` replays the requests (``trace.replay_trace``) with every
policy of ``POLICY_ORDER`` (names, or ``(label, factory)`` pairs for policies built per replay,
such as a learned one) and returns one row per capacity: each policy's hit ratio and its share of
the gap, ``(hit - hit_LRU) / (hit_Belady - hit_LRU)`` (None where the gap is under 0.1% of the
tokens: nothing to close).

``lru_savings(requests, capacities, policy)`` is the measure LPC reports (Yang et al., NeurIPS'25:
"18-47% reductions in required cache sizes for equivalent hit ratios"): for each capacity ``C``,
the smallest capacity at which ``policy`` reaches LRU's hit ratio at ``C`` (replays at a few
fractions of ``C``, interpolated linearly between them), and the share of ``C`` it saves.

``python -m minimax_lab.bench.kvstore_sims policy-gap`` records both.
"""
from __future__ import annotations

from tqdm.auto import tqdm

from minimax_lab.kvcache.trace import _as_requests, replay_trace

POLICY_ORDER = ("lru", "lfu", "s3fifo", "arc", "agent", "chain", "reuse", "adaptive", "conversation", "belady")
#: the fractions of a capacity ``lru_savings`` replays the policy at (besides the capacity itself)
SAVINGS_FRACTIONS = (0.4, 0.6, 0.8)


def _label(policy) -> str:
    return policy if isinstance(policy, str) else policy[0]


def _make(policy):
    return policy if isinstance(policy, str) else policy[1]()


def gap_table(requests, capacities, policies=POLICY_ORDER, *, progress: bool = False) -> list[dict]:
    """Rows ``{capacity_tokens, hit: {policy: ratio}, gap_closed: {policy: share or None}}``;
    ``policies`` must include ``"lru"`` and ``"belady"``."""
    reqs = _as_requests(requests)
    rows = []
    for cap in tqdm(capacities, desc="capacities", disable=not progress):
        hit = {_label(p): replay_trace(reqs, capacity_tokens=cap, policy=_make(p)).hit_ratio for p in policies}
        gap = hit["belady"] - hit["lru"]
        closed = {p: (h - hit["lru"]) / gap if gap > 1e-3 else None for p, h in hit.items()}
        rows.append(dict(capacity_tokens=cap, hit=hit, gap_closed=closed))
    return rows


def capacity_for(hit_target: float, points: list[tuple[int, float]]) -> float | None:
    """The smallest capacity at which the hit ratio, linear between the measured ``(capacity,
    hit)`` points, reaches ``hit_target``; None if no point does."""
    pts = sorted(points)
    if pts[0][1] >= hit_target:
        return float(pts[0][0])
    for (c0, h0), (c1, h1) in zip(pts, pts[1:]):
        if h1 >= hit_target:
            return c0 + (c1 - c0) * (hit_target - h0) / (h1 - h0) if h1 > h0 else float(c1)
    return None


def lru_savings(requests, capacities, policy, *, fractions=SAVINGS_FRACTIONS, hits: dict | None = None,
                block_tokens: int = 512) -> list[dict]:
    """Rows ``{capacity_tokens, lru_hit, policy_hits: {capacity: hit}, needed_tokens, saved}``:
    the cache ``policy`` needs for LRU's hit ratio at each capacity, and ``saved = 1 - needed /
    capacity`` (None: LRU's hit ratio is not reached even at the full capacity). ``hits``
    may hold already measured ``{capacity: (lru hit, policy hit)}``."""
    reqs = _as_requests(requests)
    out = []
    for cap in capacities:
        lru, full = (hits or {}).get(cap) or (replay_trace(reqs, capacity_tokens=cap, policy="lru").hit_ratio,
                                              replay_trace(reqs, capacity_tokens=cap, policy=_make(policy)).hit_ratio)
        points = [(cap, full)]
        for f in fractions:
            c = max(block_tokens, int(cap * f) // block_tokens * block_tokens)
            points.append((c, replay_trace(reqs, capacity_tokens=c, policy=_make(policy)).hit_ratio))
        needed = capacity_for(lru, points)
        out.append(dict(capacity_tokens=cap, lru_hit=lru, policy_hits={c: h for c, h in sorted(points)},
                        needed_tokens=needed, saved=None if needed is None else 1 - needed / cap))
    return out
