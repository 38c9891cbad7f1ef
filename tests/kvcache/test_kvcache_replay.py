"""Trace replay: the contract's exact numbers on Mooncake's synthetic trace (shipped with the
package, so these run everywhere), policies against LRU and Belady."""
import hashlib

import pytest

from minimax_lab import resources
from minimax_lab.kvcache import Request, find_trace, read_trace, replay_trace, write_trace
from minimax_lab.kvcache.eviction import POLICIES

#: SHA-256 of Mooncake's FAST25-release/traces/synthetic_trace.jsonl (see the NOTICE beside it).
MOONCAKE_SHA256 = "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131"


@pytest.fixture(scope="module")
def reqs():
    return read_trace(find_trace())


def test_trace_ships_unmodified_with_its_attribution(monkeypatch):
    monkeypatch.delenv("MINIMAX_LAB_TRACES", raising=False)
    path = find_trace()
    assert path == resources.assets_dir() / "traces" / "mooncake_synthetic_trace.jsonl"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == MOONCAKE_SHA256
    notice = resources.asset("traces/NOTICE").read_text()
    assert MOONCAKE_SHA256 in notice and "github.com/kvcache-ai/Mooncake" in notice and "Apache" in notice
    assert "Version 2.0, January 2004" in resources.asset("traces/LICENSE-APACHE-2.0").read_text()


def test_find_trace_prefers_the_users_folder(tmp_path, monkeypatch):
    own = write_trace([Request(0, 8, 1, [1, 2])], tmp_path / "mooncake_synthetic_trace.jsonl")
    monkeypatch.setenv("MINIMAX_LAB_TRACES", str(tmp_path))
    assert find_trace() == own
    assert find_trace("not_there.jsonl") is None
    monkeypatch.setenv("MINIMAX_LAB_TRACES", str(tmp_path / "empty"))
    assert find_trace() == resources.assets_dir() / "traces" / "mooncake_synthetic_trace.jsonl"


@pytest.mark.parametrize("cap,want", [(None, 0.651), (50_000_000, 0.651), (10_000_000, 0.577),
                                      (3_000_000, 0.315), (1_000_000, 0.142)])
def test_contract_numbers(reqs, cap, want):
    assert len(reqs) == 3993
    r = replay_trace(reqs, capacity_tokens=cap, policy="lru")
    assert round(r.hit_ratio, 3) == want


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
