"""The pool simulation and the eviction-gap table: the contracts of their docstrings on small traces."""
import pytest

from minimax_lab.kvcache.policy_gap import gap_table
from minimax_lab.kvcache.pool_sim import MODES, MOONCAKE_PUBLISHED, mooncake_comparison, simulate_pool
from minimax_lab.kvcache.routing import PrefillCost
from minimax_lab.kvcache.cost import LLAMA3_70B
from minimax_lab.kvcache.trace import Request

COST = PrefillCost(LLAMA3_70B, link_gbps=100.0, tflops=2496.0)


def _sessions(n_sessions=5, turns=5, blocks=4):
    """Multi-turn sessions interleaved: turn k of a session extends turn k-1 by ``blocks`` blocks."""
    reqs, nxt = [], 0
    ids = {s: [] for s in range(n_sessions)}
    for k in range(turns):
        for s in range(n_sessions):
            ids[s] = ids[s] + list(range(nxt, nxt + blocks))
            nxt += blocks
            reqs.append(Request(1000 * (k * n_sessions + s), 512 * len(ids[s]), 10, list(ids[s])))
    return reqs


@pytest.mark.parametrize("replicas", [1, 3])
def test_a_pool_never_recomputes_more_than_own_caches(replicas):
    reqs = _sessions()
    res = {m: simulate_pool(reqs, replicas=replicas, mode=m, cost=COST, capacity_tokens=40 * 512) for m in MODES}
    # round-robin sends each request to the same replica in both modes, so the caches are the same:
    # the pool only adds what other replicas hold
    assert res["pool_rr"].local_hit_tokens == res["isolated_rr"].local_hit_tokens
    assert res["pool_rr"].recomputed_tokens <= res["isolated_rr"].recomputed_tokens
    for r in res.values():
        assert r.input_tokens == sum(q.input_length for q in reqs)
        assert r.local_hit_tokens + r.fetched_tokens + r.recomputed_tokens == r.input_tokens
        assert 0 <= r.hit_ratio <= 1 and r.ttft_p50_s <= r.ttft_p90_s and r.ttft_mean_s > 0
        assert r.compute_s_mean > 0 and r.load > 0
    if replicas == 3:   # round-robin scatters sessions: only the pool gives them back their prefixes
        assert res["pool_rr"].fetched_tokens > 0
        assert res["isolated_rr"].hit_ratio < res["pool_rr"].hit_ratio


def test_the_pool_is_the_replicas_memory_and_nothing_more():
    """Two replicas of one block each, round-robin: a block every replica has evicted is recomputed,
    a block another replica still holds is fetched."""
    ids = [[1], [2], [3], [1], [1]]          # r0 [1]; r1 [2]; r0 [3] evicts 1; r1 [1] misses; r0 [1] fetches
    reqs = [Request(1000 * i, 512, 1, h) for i, h in enumerate(ids)]
    pool = simulate_pool(reqs, replicas=2, mode="pool_rr", cost=COST, capacity_tokens=512)
    own = simulate_pool(reqs, replicas=2, mode="isolated_rr", cost=COST, capacity_tokens=512)
    assert (pool.fetched_tokens, pool.recomputed_tokens, pool.local_hit_tokens) == (512, 4 * 512, 0)
    assert (own.fetched_tokens, own.recomputed_tokens) == (0, 5 * 512)
    with pytest.raises(TypeError):
        simulate_pool(reqs, replicas=2, mode="pool_rr", capacity_tokens=512, pool_capacity_tokens=1024)


def test_one_replica_is_the_same_in_every_mode():
    reqs = _sessions()
    rows = [simulate_pool(reqs, replicas=1, mode=m, cost=COST, capacity_tokens=None) for m in MODES]
    assert len({(r.recomputed_tokens, round(r.ttft_mean_s, 9)) for r in rows}) == 1


def test_the_comparison_with_mooncake_is_computed_from_the_record():
    def row(mode, n, hit, compute, recomputed):
        return dict(mode=mode, replicas=n, hit_ratio=hit, compute_s_mean=compute, recomputed_tokens=recomputed)
    doc = dict(capacity_tokens=3_000_000, ceiling_hit_ratio=0.5,
               rows=[row("isolated_rr", 1, 0.2, 1.0, 80), row("isolated_aware", 10, 0.25, 2.0, 75),
                     row("pool_priced", 10, 0.4, 1.5, 60)])
    c = mooncake_comparison(doc)
    assert c["sim_hit_gain"] == pytest.approx(1.6) and c["sim_prefill_time_ratio"] == pytest.approx(0.75)
    assert c["sim_recomputed_ratio"] == pytest.approx(0.8) and c["sim_one_cache_share_of_max"] == pytest.approx(0.4)
    assert c["paper"] is MOONCAKE_PUBLISHED and c["baseline_vs_paper"] == pytest.approx(0.25 / 0.26)
    with pytest.raises(ValueError, match="isolated_aware"):
        mooncake_comparison(dict(doc, rows=doc["rows"][:1]))


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="mode"):
        simulate_pool([], replicas=1, mode="magic", capacity_tokens=None)
    with pytest.raises(ValueError):
        simulate_pool([], replicas=0, mode="pool_rr", capacity_tokens=None)
    with pytest.raises(ValueError):
        simulate_pool([], replicas=1, mode="pool_rr", capacity_tokens=100)


def test_gap_table_closes_all_of_belady_and_none_of_lru():
    rows = gap_table(_sessions(), (8 * 512, 30 * 512))
    for r in rows:
        if r["gap_closed"]["belady"] is not None:
            assert r["gap_closed"]["belady"] == 1 and r["gap_closed"]["lru"] == 0
        assert set(r["hit"]) >= {"lru", "lfu", "s3fifo", "arc", "agent", "chain", "reuse", "adaptive", "belady"}
