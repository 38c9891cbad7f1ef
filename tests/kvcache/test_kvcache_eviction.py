"""Eviction policies do what their docstrings say: the interface, LRU order, the agent policy's
priorities with aging, and Belady's optimality (checked against brute force)."""
import itertools
import random

import pytest

from minimax_lab.kvcache.eviction import POLICIES, AgentPolicy, BeladyPolicy, LRUPolicy, make_policy
from minimax_lab.kvcache.trace import Request, replay_trace


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_interface(name):
    pol = make_policy(name)
    assert make_policy(pol) is pol
    pol.plan(["a", "b", "c"])
    with pytest.raises(KeyError):
        pol.evict()                                   # empty
    pol.insert("a", 0)
    pol.insert("b", 1)
    assert len(pol) == 2 and "a" in pol and "c" not in pol
    pol.remove("b")
    pol.remove("nope")                                # removing an unknown key is a no-op
    assert len(pol) == 1 and "b" not in pol
    pol.touch("a", 2)
    assert pol.evict() == "a" and len(pol) == 0
    with pytest.raises(KeyError):
        pol.evict()
    with pytest.raises(ValueError, match="policy must be one of"):
        make_policy("fifo")


def test_lru_order():
    pol = LRUPolicy()
    for t, k in enumerate("abc"):
        pol.insert(k, t)
    pol.touch("a", 3)                                 # a is now the most recent
    assert [pol.evict() for _ in range(3)] == ["b", "c", "a"]


def test_agent_priority_with_aging_and_tail_first():
    pol = AgentPolicy()
    pol.insert("root", 0)
    pol.insert("leaf", 1)                             # equal counts: the one touched last goes first
    assert pol.evict() == "leaf"                      # L = 1
    pol.touch("root", 2)                              # count 2 -> priority L + 2 = 3
    pol.insert("new", 3)                              # count 1 -> priority L + 1 = 2
    assert pol.evict() == "new"                       # frequency wins; L = 2
    for t in range(4, 7):
        pol.insert(f"x{t}", t)                        # each: priority L + 1 = 3 (same as root's, later t)
    assert pol.evict() == "x6"                        # ties: the latest touched goes first
    # aging: old popularity fades once L has climbed past it
    pol2 = AgentPolicy()
    pol2.insert("old", 0)
    for t in range(1, 4):
        pol2.touch("old", t)                          # count 4 -> priority 4
    evicted = []
    for t in range(4, 10):                            # one-off blocks, priority L + 1: each victim raises L
        pol2.insert(f"y{t}", t)
        evicted.append(pol2.evict())
    # y4..y7 go first (priorities 1..4; y7 ties with old and is later); then L = 4 and old goes
    assert evicted[:5] == ["y4", "y5", "y6", "y7", "old"]


def test_belady_needs_its_plan():
    pol = BeladyPolicy()
    pol.plan(["a"])
    pol.insert("a", 0)
    with pytest.raises(RuntimeError, match="more accesses than were planned"):
        pol.touch("a", 1)


def _optimal_hits(seq, cap):
    """Most hits any eviction choice achieves (brute force, same model as replay: insert, then evict
    one block -- possibly the new one -- when over capacity)."""
    best = 0

    def go(i, cached, hits):
        nonlocal best
        if hits + (len(seq) - i) <= best:
            return
        if i == len(seq):
            best = max(best, hits)
            return
        k = seq[i]
        if k in cached:
            go(i + 1, cached, hits + 1)
            return
        cached = cached | {k}
        if len(cached) <= cap:
            go(i + 1, cached, hits)
        else:
            for victim in cached:
                go(i + 1, cached - {victim}, hits)

    go(0, frozenset(), 0)
    return best


def test_belady_is_optimal_for_block_hits():
    """With one block per request a prefix hit is a block hit: Belady's hits equal the brute-force
    optimum on random short traces, and no other policy does better."""
    rng = random.Random(0)
    for trial in range(60):
        seq = [rng.randrange(5) for _ in range(rng.randint(3, 11))]
        cap = rng.randint(1, 3)
        trace = [Request(i, 4, 1, [k]) for i, k in enumerate(seq)]
        got = {p: replay_trace(trace, capacity_tokens=4 * cap, policy=p, block_tokens=4).hit_tokens // 4
               for p in POLICIES}
        assert got["belady"] == _optimal_hits(seq, cap) >= max(got.values()), (trial, seq, cap, got)


def test_brute_force_is_right_by_hand():
    assert _optimal_hits([1, 2, 1, 2], 1) == 1        # keep 1 or keep 2: one hit either way
    assert _optimal_hits([1, 2, 3, 1, 2, 3], 2) == 2
    assert _optimal_hits(list(itertools.chain([1, 2] * 3)), 2) == 4


@pytest.mark.parametrize("name", ["lfu", "s3fifo", "arc", "chain", "reuse", "adaptive"])
def test_new_policies_only_evict_what_they_hold(name):
    rng = random.Random(7)
    pol, held = make_policy(name), set()
    for t in range(3000):
        op = rng.random()
        k = rng.randrange(60)
        if op < 0.5 and k not in held:
            pol.insert(k, t)
            held.add(k)
        elif op < 0.7 and k in held:
            pol.touch(k, t)
        elif op < 0.8:
            pol.remove(k)
            held.discard(k)
        elif held:
            v = pol.evict()
            assert v in held
            held.discard(v)
        assert len(pol) == len(held) and all(h in pol for h in held)


def test_chain_keeps_the_root_of_a_chain_longer_than_the_cache():
    chain = list(range(40))
    reqs = [Request(i, 40 * 16, 1, chain) for i in range(5)]
    lru = replay_trace(reqs, capacity_tokens=10 * 16, policy="lru", block_tokens=16)
    ch = replay_trace(reqs, capacity_tokens=10 * 16, policy="chain", block_tokens=16)
    assert lru.hit_tokens == 0                        # LRU: the scan flushes the chain's start
    assert ch.per_request_hits[1:] == [10 * 16] * 4   # chain: the first 10 blocks stay


def test_chain_ages_by_request_and_demotes_a_new_last_block():
    pol = make_policy("chain")
    pol.begin_request()
    for t, k in enumerate(["r", "a", "tail1"]):
        pol.insert(k, t)
    pol.end_request(["r", "a", "tail1"])
    assert pol.evict() == "tail1"                     # a request's new last block goes first
    pol.begin_request()
    pol.touch("r", 3)
    pol.insert("b", 4)
    pol.end_request(["r", "b"])                       # "b" is new and last: first to go
    assert pol.evict() == "b"
    assert pol.evict() == "a"                         # then the older request's block


def test_reuse_predicts_the_next_use_from_the_last_gap():
    pol = make_policy("reuse")
    for r in range(1, 4):                             # "hot" every request, "slow" in request 1 only
        pol.begin_request()
        pol.touch("hot", r) if "hot" in pol else pol.insert("hot", r)
        if r == 1:
            pol.insert("slow", r)
        pol.end_request(["hot"])
    assert pol.evict() == "slow"                      # seen once: predicted farther than "hot"
    pol.begin_request()
    pol.insert("tail", 9)
    pol.end_request(["hot", "tail"])                  # a request's new last block goes first
    assert pol.evict() == "tail"


def test_adaptive_follows_the_expert_whose_shadow_hits_more():
    reqs = [Request(i, 30 * 16, 1, list(range(30))) for i in range(6)]     # one chain, longer than the cache
    res = replay_trace(reqs, capacity_tokens=10 * 16, policy="adaptive", block_tokens=16)
    assert res.per_request_hits[1:] == [10 * 16] * 5  # both experts keep the chain's start
    pol = make_policy("adaptive")
    replay_trace(reqs, capacity_tokens=10 * 16, policy=pol, block_tokens=16)
    assert pol.shadows is not None and all(s.cap == 10 for s in pol.shadows) and max(pol.scores) > 0
