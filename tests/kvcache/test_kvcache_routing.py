"""Routing over replicas: cache-aware routing finds more hits than round-robin and respects its load bound."""
import pytest

from minimax_lab.kvcache.routing import route_trace, routing_sweep
from minimax_lab.kvcache.trace import Request


def _sessions(n_sessions=6, turns=12):
    # each session grows its own prefix; sessions interleave
    reqs, ctx = [], {s: [s * 1000 + i for i in range(4)] for s in range(n_sessions)}
    for k in range(turns):
        for s in range(n_sessions):
            ctx[s] = ctx[s] + [s * 1000 + 100 + k]
            reqs.append(Request(k, 512 * len(ctx[s]), 1, list(ctx[s])))
    return reqs


def test_cache_aware_beats_round_robin():
    reqs = _sessions()
    one = route_trace(reqs, replicas=1, router="round_robin")
    rr = route_trace(reqs, replicas=4, router="round_robin")
    ca = route_trace(reqs, replicas=4, router="cache_aware", load_bound=1.5)
    assert ca.hit_ratio > rr.hit_ratio
    assert ca.hit_ratio <= one.hit_ratio + 1e-12       # one shared unbounded cache is the best case
    assert sum(ca.loads) == sum(rr.loads) == sum(r.input_length for r in reqs)
    assert ca.imbalance <= 1.5 + 0.5                    # bound holds up to one request's size


def test_load_bound_one_is_balanced_and_errors():
    reqs = _sessions()
    tight = route_trace(reqs, replicas=3, router="cache_aware", load_bound=1.0)
    assert tight.imbalance < 1.3
    with pytest.raises(ValueError):
        route_trace(reqs, replicas=2, router="nope")
    with pytest.raises(ValueError):
        route_trace(reqs, replicas=2, load_bound=0.5)
    res = routing_sweep(reqs, replica_counts=(1, 2))
    assert len(res) == 4


def test_cache_aware_rule_by_hand():
    """The longest cached prefix among the replicas that stay within the bound (not merely the
    least loaded of them); when none would, the least loaded."""
    trace = [Request(0, 300, 1, [1, 2, 3]),     # none would stay within 1.5 x mean: least loaded, replica 0
             Request(1, 100, 1, [1, 2, 9]),     # replica 0 would pass the bound; 1 and 2 tie: replica 1
             Request(2, 50, 1, [1, 2, 3, 4])]   # 0 has 3 blocks but would pass the bound; 1 has 2 blocks
    r = route_trace(trace, replicas=3, router="cache_aware", load_bound=1.5, block_tokens=4)
    assert r.loads == [300, 150, 0]
    assert r.hit_ratio == pytest.approx(8 / 450)  # request 2 hits blocks 1, 2 on replica 1


def test_round_robin_by_hand():
    trace = [Request(i, 10 * (i + 1), 1, [i]) for i in range(5)]
    r = route_trace(trace, replicas=2, router="round_robin", block_tokens=4)
    assert r.loads == [10 + 30 + 50, 20 + 40] and r.imbalance == pytest.approx(90 / 75)
