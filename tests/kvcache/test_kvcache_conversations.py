"""Eviction that knows conversations: the online statistics learn only from the past, the policy
keeps what is likely to come back, conversations are named as a server would name them, the
generated conversation traces have the distributions they cite, the learned predictor learns, and
the LPC-style cache-savings measure interpolates as it says."""
import math
import statistics

import numpy as np
import pytest

from minimax_lab.kvcache.eviction import ConversationPolicy
from minimax_lab.kvcache.policy_gap import capacity_for, gap_table, lru_savings
from minimax_lab.kvcache.reuse_model import ContinuationModel, ContinuationOracle, auc, features, fit, log_loss, turn_examples
from minimax_lab.kvcache.trace import BlockCache, Request, conversation_ids, replay_trace
from minimax_lab.kvcache.turn_stats import TurnStats, request_class
from minimax_lab.kvcache.workloads import conversation_workload


def test_turn_stats_learn_continuation_survival_and_tail_loss():
    st = TurnStats(prior_weight=1.0)
    for _ in range(100):
        st.new_turn(1)
    for _ in range(20):
        st.new_turn(2)                                # 20 of 100 first turns came back
    assert st.continuation(1) == pytest.approx(20.5 / 101)
    for g in [10.0] * 50 + [1000.0] * 50:
        st.returned(g, 1)
    st._rebuild()
    assert st.survival(1.0) > 0.95 and 0.4 < st.survival(100.0) < 0.6 and st.survival(1e6) < 0.02
    assert st.kept(0) < 0.05 and st.kept(1) > 0.95        # the last block is lost, the rest reused
    # Bayes: an idle conversation becomes less likely to come back
    assert st.return_probability(1, 1.0) > st.return_probability(1, 100.0) > st.return_probability(1, 1e5)
    assert request_class(1, 30, 100) != request_class(2, 30, 100) != request_class(2, 30, 5000)


def _turn(cache, keys, conv, now, out=0):
    hit = cache.prefix(keys)
    cache.serve(keys, conv, now, out)
    return hit


def test_the_policy_keeps_the_conversation_that_comes_back():
    """Conversations of three blocks; many one-shot ones and a few that always return. Once the
    policy has seen that multi-turn conversations return and one-shot ones do not, a returning
    conversation's blocks outlive fresh one-shot traffic that flushes LRU."""
    def run(policy):
        cache = BlockCache(12, policy)
        hits, key, now = 0, 0, 0.0
        for round_ in range(40):
            regular = round_ % 2                        # two regulars alternate, each back every 2 rounds
            base = [("reg", regular, i) for i in range(3)]
            hits += _turn(cache, base + [("reg", regular, "tail", round_)], ("reg", regular), now)
            for _ in range(3):                          # three one-shot conversations of 4 blocks
                key += 1
                _turn(cache, [("one", key, i) for i in range(4)], ("one", key), now + 1)
                now += 1
            now += 1
        return hits
    lru, conv = run("lru"), run(ConversationPolicy())
    assert conv >= lru + 30 and lru <= 6


def test_the_policy_never_reads_the_future():
    """The same past gives the same victims, whatever comes after it."""
    reqs = conversation_workload(200, seed=3).requests
    head = reqs[:150]
    a = replay_trace(head, capacity_tokens=40 * 512, policy=ConversationPolicy())
    b = replay_trace(reqs, capacity_tokens=40 * 512, policy=ConversationPolicy())
    assert b.per_request_hits[:150] == a.per_request_hits


def test_without_request_hooks_it_evicts_the_least_recently_used():
    pol = ConversationPolicy()
    for t, k in enumerate("abc"):
        pol.insert(k, t)
    pol.touch("a", 3)
    assert [pol.evict() for _ in range(3)] == ["b", "c", "a"]


def test_conversations_are_given_or_inferred_from_the_prefix_tree():
    reqs = [Request(0, 1536, 1, [1, 2, 3]), Request(1, 2048, 1, [1, 2, 3, 4]),   # extends the first
            Request(2, 512, 1, [1]),                                          # only a shared root: new
            Request(3, 1024, 1, [9, 10], conversation=77), Request(4, 1536, 1, [1, 2, 5])]
    ids = conversation_ids(reqs)
    assert ids[0] == ids[1] and ids[2] != ids[0] and ids[3] == ("given", 77) and ids[4] == ids[0]
    assert conversation_ids(reqs[:2]) == ids[:2]           # online: a later request changes nothing before it


def test_generated_conversations_follow_their_sources():
    wl = conversation_workload(3000, seed=5)
    reqs = wl.requests
    assert all(r.conversation is not None for r in reqs) and wl.sessions == [r.conversation for r in reqs]
    assert all(a.timestamp <= b.timestamp for a, b in zip(reqs, reqs[1:]))
    turns = {}
    for r in reqs:
        turns[r.conversation] = turns.get(r.conversation, 0) + 1
    started = len(turns)
    assert 0.45 < sum(v == 1 for v in turns.values()) / started < 0.75          # many single-turn chats
    assert 1.4 < statistics.mean(turns.values()) < 2.2                         # ~2 turns (cut at the end)
    last, gaps = {}, []
    for r in reqs:
        if r.conversation in last:
            gaps.append((r.timestamp - last[r.conversation]) / 1e3)
        last[r.conversation] = r.timestamp
    assert sum(g < 600 for g in gaps) / len(gaps) > 0.78        # most reuse within 10 min (longer ones cut)
    assert max(gaps) > 600
    # a turn extends its conversation: the previous request's full blocks are its prefix
    prev = {}
    for r in reqs:
        p = prev.get(r.conversation)
        if p is not None:
            full = p.input_length // 512
            assert r.hash_ids[:full] == p.hash_ids[:full]
        prev[r.conversation] = r
    again = conversation_workload(3000, seed=5).requests
    assert [r.to_json() for r in again] == [r.to_json() for r in reqs]


def test_the_learned_predictor_learns_and_generalises():
    rng = np.random.default_rng(0)
    X = np.stack([features(int(k), int(b), int(o)) for k, b, o in
                  zip(rng.integers(1, 6, 4000), rng.integers(1, 200, 4000), rng.integers(1, 2000, 4000))])
    logit = 2.5 * (X[:, 1] > 0) - 1.5 * X[:, 4] / 7 + 0.3
    y = (rng.random(4000) < 1 / (1 + np.exp(-logit))).astype(float)
    model = fit(X[:3000], y[:3000])
    truth = ContinuationModel(np.array([2.8, 0, -2.5, 0, -1.5 / 7, 0, 0]), np.ones(7))   # the logit above
    best = auc(truth, X[3000:], y[3000:])
    assert best > 0.65 and auc(model, X[3000:], y[3000:]) > best - 0.02
    assert log_loss(model, X[3000:], y[3000:]) < log_loss(fit(X[:3000, :1], y[:3000]), X[3000:, :1], y[3000:])
    assert 0 < model(None, 3, 10, 100) < 1
    with pytest.raises(ValueError, match="need X"):
        fit(np.zeros((0, 7)), np.zeros(0))
    # on a generated trace: labels are "another turn later in the trace"
    Xt, yt = turn_examples(conversation_workload(500, seed=1).requests)
    assert set(np.unique(yt)) == {0.0, 1.0} and Xt.shape == (len(yt), 7)


def test_knowing_whether_conversations_continue_is_a_bound_the_policy_can_use():
    reqs = conversation_workload(800, seed=4).requests
    oracle = ContinuationOracle(reqs)
    rows = gap_table(reqs, [30 * 512], ["lru", ("knows_whether", lambda: ConversationPolicy(continuation=oracle)),
                                        "conversation", "belady"])
    hit = rows[0]["hit"]
    assert hit["lru"] <= hit["knows_whether"] <= hit["belady"] and hit["conversation"] <= hit["belady"]


def test_capacity_for_interpolates_and_savings_follow():
    pts = [(100, 0.1), (200, 0.3), (400, 0.5)]
    assert capacity_for(0.2, pts) == pytest.approx(150) and capacity_for(0.05, pts) == 100
    assert capacity_for(0.6, pts) is None and capacity_for(0.5, pts) == pytest.approx(400)
    reqs = conversation_workload(500, seed=2).requests
    rows = lru_savings(reqs, [20 * 512], "lru", fractions=(0.5,))
    assert rows[0]["saved"] == pytest.approx(0.0) and rows[0]["needed_tokens"] == pytest.approx(20 * 512)
    assert math.isfinite(lru_savings(reqs, [20 * 512], "belady", fractions=(0.5,))[0]["saved"])
