"""Trace replay: the contract's exact numbers on Mooncake's synthetic trace, policies against LRU and Belady."""
import pytest

from minimax_lab.kvcache import Request, find_trace, read_trace, replay_trace
from minimax_lab.kvcache.eviction import POLICIES

TRACE = find_trace()
needs_trace = pytest.mark.skipif(TRACE is None, reason="Mooncake synthetic trace not found (../shared/traces)")


@pytest.fixture(scope="module")
def reqs():
    return read_trace(TRACE)


@needs_trace
@pytest.mark.parametrize("cap,want", [(None, 0.651), (50_000_000, 0.651), (10_000_000, 0.577),
                                      (3_000_000, 0.315), (1_000_000, 0.142)])
def test_contract_numbers(reqs, cap, want):
    assert len(reqs) == 3993
    r = replay_trace(reqs, capacity_tokens=cap, policy="lru")
    assert round(r.hit_ratio, 3) == want


@needs_trace
def test_agent_policy_beats_lru_and_belady_bounds_all(reqs):
    cap = 3_000_000
    got = {p: replay_trace(reqs, capacity_tokens=cap, policy=p).hit_ratio for p in POLICIES}
    assert got["agent"] > 0.315 and got["agent"] > got["lru"]
    assert all(got["belady"] >= v for v in got.values())


def test_replay_by_hand():
    # 2 blocks of 4 tokens capacity; a: [1,2], b: [1,3] hits 1 block, c: [1,2] hits 1 (2 was evicted by LRU)
    trace = [Request(0, 8, 1, [1, 2]), Request(1, 6, 1, [1, 3]), Request(2, 7, 1, [1, 2])]
    r = replay_trace(trace, capacity_tokens=8, policy="lru", block_tokens=4)
    assert r.per_request_hits == [0, 4, 4] and r.input_tokens == 21 and r.evictions == 2
    r = replay_trace(trace, capacity_tokens=None, policy="lru", block_tokens=4)
    assert r.per_request_hits == [0, 4, 7]   # capped at input_length
    r = replay_trace(trace, capacity_tokens=8, policy="belady", block_tokens=4)
    assert r.per_request_hits == [0, 4, 7]   # Belady keeps 1 and 2 -- 3 is never used again
    with pytest.raises(ValueError):
        replay_trace(trace, capacity_tokens=3, policy="lru", block_tokens=4)
    with pytest.raises(ValueError):
        replay_trace(trace, capacity_tokens=8, policy="nope", block_tokens=4)


def test_belady_at_least_others_on_random_traces():
    import random
    rng = random.Random(0)
    for trial in range(20):
        trace, roots = [], [[rng.randrange(10**6) for _ in range(rng.randint(1, 6))] for _ in range(5)]
        for i in range(60):
            base = list(rng.choice(roots))
            base += [rng.randrange(10**6) for _ in range(rng.randint(0, 4))]
            trace.append(Request(i, 4 * len(base), 1, base))
        cap = 4 * rng.randint(2, 12)
        got = {p: replay_trace(trace, capacity_tokens=cap, policy=p, block_tokens=4).hit_ratio for p in POLICIES}
        assert got["belady"] >= max(got.values()) - 1e-12, (trial, got)
