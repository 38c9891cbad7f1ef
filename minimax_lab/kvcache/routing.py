"""Routing requests over several replicas, each with its own prefix cache.

* ``"round_robin"`` -- request ``i`` goes to replica ``i % R``: perfectly balanced, blind to caches.
* ``"cache_aware"`` -- among the replicas that would stay within ``load_bound`` times the mean
  load after taking the request (load = input tokens routed so far; the mean counts this request
  too), the one holding the request's longest cached prefix (ties: the least loaded); when none
  would, the least-loaded replica. The bound keeps one hot prefix from piling all traffic onto
  one replica -- the trade-off SGLang's cache-aware router and Mooncake's Conductor make.

Each replica's cache is the same block cache as ``trace.replay_trace`` (``capacity_tokens`` per
replica, an eviction policy from ``eviction``); a hit follows the same contract.

**With a shared pool** (a remote tier every replica reads and writes), a request's prefix can be
had three ways: from the replica's own cache (free), fetched from the pool (its bytes over the
link) or recomputed (its prefill FLOPs). ``cost.PrefillCost`` prices them with the model of
``cost.break_even`` -- KV bytes per token over the link's bandwidth against the FLOPs of the
exact span -- and ``choose_replica`` picks the replica where *queue + prefill* is smallest: "go
there" (the replica holding the prefix) against "fetch here" (a less loaded one fetching it).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from minimax_lab.kvcache.cost import PrefillCost
from minimax_lab.kvcache.trace import BlockCache, _as_requests, check_cache_size
from minimax_lab.validate import check_choice, check_positive_int


def choose_replica(n_tokens: int, local: list[int], pool: int, queue_s: list[float],
                   cost: PrefillCost) -> tuple[int, float, int, int]:
    """The replica where a prompt of ``n_tokens`` starts soonest and prefills fastest:
    argmin over ``r`` of ``queue_s[r] + cost.plan(n_tokens, local[r], pool)``. Returns
    ``(replica, its prefill seconds, tokens fetched, tokens computed)``; ties go to the lower index."""
    if len(local) != len(queue_s) or not local:
        raise ValueError(f"one local prefix and one queue per replica, got {len(local)} and {len(queue_s)}")
    best = None
    for r, (loc, q) in enumerate(zip(local, queue_s)):
        sec, fetch, comp = cost.plan(n_tokens, loc, pool)
        if best is None or q + sec < best[0]:
            best = (q + sec, r, sec, fetch, comp)
    return best[1], best[2], best[3], best[4]

ROUTERS = ("round_robin", "cache_aware")


class _Replica(BlockCache):
    """One replica's cache (the replay contract's ``BlockCache``) and the input tokens routed to it."""

    def __init__(self, cap_blocks, policy):
        super().__init__(cap_blocks, policy)
        self.load = 0


@dataclass
class RoutingResult:
    router: str
    replicas: int
    hit_ratio: float
    loads: list = field(default_factory=list)      # input tokens routed to each replica

    @property
    def imbalance(self) -> float:
        """max load / mean load (1.0 = perfectly balanced)."""
        mean = sum(self.loads) / len(self.loads)
        return max(self.loads) / mean if mean else 1.0


def route_trace(trace, *, replicas: int, router: str = "cache_aware", capacity_tokens: int | None = None,
                policy="lru", block_tokens: int = 512, load_bound: float = 1.25) -> RoutingResult:
    """Route every request of ``trace`` to one of ``replicas`` caches; hit ratio over all input tokens.

    Raises ``ValueError``/``TypeError`` for a bad argument or request (as ``replay_trace`` does),
    ``load_bound < 1`` and the offline ``"belady"`` policy."""
    check_positive_int(replicas, "replicas")
    check_choice(router, "router", ROUTERS)
    if isinstance(load_bound, bool) or not isinstance(load_bound, (int, float)):
        raise TypeError(f"load_bound must be a number, got {type(load_bound).__name__}")
    if not load_bound >= 1.0:
        raise ValueError(f"load_bound must be >= 1, got {load_bound}")
    if policy == "belady":
        raise ValueError("Belady needs each replica's future, which depends on the routing; use an online policy")
    cap = check_cache_size(capacity_tokens, block_tokens)
    reps = [_Replica(cap, policy) for _ in range(replicas)]
    hit = total = 0
    for i, r in enumerate(_as_requests(trace)):
        if router == "round_robin":
            rep = reps[i % replicas]
            n = rep.prefix(r.hash_ids)
        else:
            mean = (sum(x.load for x in reps) + r.input_length) / replicas
            pref = [x.prefix(r.hash_ids) for x in reps]
            ok = [j for j, x in enumerate(reps) if x.load + r.input_length <= load_bound * mean] or \
                 [min(range(replicas), key=lambda j: reps[j].load)]
            best = max(ok, key=lambda j: (pref[j], -reps[j].load))
            rep, n = reps[best], pref[best]
        hit += min(n * block_tokens, r.input_length)
        total += r.input_length
        rep.load += r.input_length
        rep.serve(r.hash_ids)
    return RoutingResult(router, replicas, hit / total if total else 0.0, [x.load for x in reps])


def routing_sweep(trace, replica_counts=(1, 2, 4, 8), **kw) -> list[RoutingResult]:
    """``route_trace`` for both routers at each replica count."""
    reqs = _as_requests(trace)
    return [route_trace(reqs, replicas=n, router=rt, **kw) for n in replica_counts for rt in ROUTERS]
