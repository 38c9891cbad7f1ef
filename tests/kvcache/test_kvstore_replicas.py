"""Replicas in separate processes sharing a real Mooncake pool: reuse, routing, prefill -> decode
and faults, every answer equal to one process with no pool (items 2, 3 and 6 of the
distributed-store issue)."""
import random
import time

import pytest

from minimax_lab.engine.slice import PagedEngine
from minimax_lab.engine.replicas import PoolRouter, ReplicaError, page_names, prefill_decode, start_replicas
from minimax_lab.kvcache.routing import PrefillCost, choose_replica
from minimax_lab.engine.store_faults import FAULTS, fault_drill
from minimax_lab.kvcache.cost import MINIMAX_M2
from minimax_lab.model.config import tiny_model_shape
from minimax_lab.model.train import load_pretrained
from tests.support.devices import fresh_seed

PAGE = 16


@pytest.fixture(scope="module")
def replicas(mooncake):
    reps = start_replicas(mooncake, 2, page_size=PAGE, timeout_s=2.0, retry_s=0.3)
    try:
        yield reps
    finally:
        for r in reps:
            r.stop()


@pytest.fixture(scope="module")
def reference():
    model, _ = load_pretrained()
    eng = PagedEngine(model, num_pages=512, page_size=PAGE)
    n = iter(range(10**9))
    return lambda tokens, k: eng.generate(("ref", next(n)), tokens, k)


def _prompt(rng, n):
    return [rng.randrange(4, 141) for _ in range(n)]


def test_replica_b_fetches_what_replica_a_computed(replicas, reference):
    rng = random.Random(fresh_seed())
    base = _prompt(rng, 5 * PAGE + 3)
    longer = base + _prompt(rng, 19)
    a = replicas[0].generate(base, 5)
    b = replicas[1].generate(longer, 5)
    assert a["tokens"] == reference(base, 5) and b["tokens"] == reference(longer, 5)
    assert a["computed"] == len(base) and a["fetched"] == 0
    assert b["fetched"] == 5 * PAGE and b["computed"] == len(longer) - 5 * PAGE   # only the rest


def test_router_sends_to_the_cheaper_of_fetch_and_go(replicas, reference):
    rng = random.Random(fresh_seed())
    for r in replicas:
        r.call("clear_cache")
    base = _prompt(rng, 8 * PAGE)
    replicas[0].generate(base, 2)                 # replica 0 holds it; the pool too
    probe = replicas[1].call("probe", tokens=base + [5])
    assert probe == dict(local=0, pool=8 * PAGE)
    fast_link = PoolRouter(replicas, PrefillCost(tiny_model_shape(), link_gbps=1e3, tflops=1e-3))
    r, plan = fast_link.route(base + [7, 8])
    assert plan["local"][0] == 8 * PAGE and plan["pool"] == 8 * PAGE
    assert r == 0 and plan["fetch"] == 0           # go there: nothing to move
    fast_link.queue_s = [10.0, 0.0]                 # replica 0 is busy: fetch here
    r, plan = fast_link.route(base + [7, 8])
    assert r == 1 and plan["fetch"] == 8 * PAGE and plan["compute"] == 2
    slow_link = PoolRouter(replicas, PrefillCost(tiny_model_shape(), link_gbps=1e-9, tflops=1e3), queue_s=[10.0, 0.0])
    r, plan = slow_link.route(base + [7, 8])
    assert r == 1 and plan["fetch"] == 0           # a link slower than recomputing is not used
    out = fast_link.generate(base + [9], 3)
    assert out["tokens"] == reference(base + [9], 3)


def test_choose_replica_prices_with_break_even():
    cost = PrefillCost(MINIMAX_M2, link_gbps=10.0, tflops=989.0)
    assert choose_replica(32768, [0, 30000], 30000, [0.0, 0.0], cost)[0] == 1          # go there
    r, sec, fetch, comp = choose_replica(32768, [0, 30000], 30000, [0.0, 5.0], cost)   # fetch here
    assert (r, fetch, comp) == (0, 30000, 2768)
    with pytest.raises(ValueError):
        choose_replica(10, [0], 0, [0.0, 0.0], cost)
    with pytest.raises(ValueError):
        PrefillCost(MINIMAX_M2, link_gbps=0, tflops=1.0)


def test_prefill_hands_the_prompt_to_decode(replicas, reference):
    rng = random.Random(fresh_seed())
    for n in (4 * PAGE, 4 * PAGE + 7):           # the last page full, and partial
        prompt = _prompt(rng, n)
        out = prefill_decode(replicas[0], replicas[1], prompt, 6)
        assert out["tokens"] == reference(prompt, 6)
        assert out["prefill"]["computed"] == n
        assert out["decode"]["computed"] == 0 and out["decode"]["fetched"] == n


def test_page_names_match_the_engine():
    toks = list(range(40))
    assert len(page_names(toks, 16)) == 2 and page_names(toks, 16)[0] == page_names(toks[:16], 16)[0]


def test_faults_lose_nothing(mooncake, replicas, reference):
    rows = fault_drill(mooncake, replicas, reference, trials=1, seed=fresh_seed())
    assert [r.fault for r in rows] == list(FAULTS)
    for r in rows:
        assert r.ok, r
    by = {r.fault: r for r in rows}
    assert by["master_killed"].recomputed > 0 and by["master_unreachable"].recomputed > 0
    assert by["corrupted_value"].recomputed > 0 and by["corrupted_value"].fetched > 0   # up to the damage
    assert by["concurrent_same_block"].fetched > 0
    st = replicas[1].call("stats")["remote"]
    assert st["timeouts"] + st["errors"] >= 2 and st["rejected"] >= 1, (st, rows)
    assert mooncake.alive()


def test_timeouts_kills_and_restarts_never_give_another_requests_answer(replicas, reference):
    """With the pool: a request past its deadline, a replica killed mid-request and restarted --
    every answer is its own request's, equal to one process's, and the restarted replica fetches
    what the other published."""
    rng = random.Random(fresh_seed())
    a, b = replicas
    slow, base = _prompt(rng, 1200), _prompt(rng, 4 * PAGE)
    with pytest.raises(ReplicaError, match=r"within 0\.02 s"):
        a.generate(slow, 200, timeout_s=0.02)
    dropped = a.dropped
    assert a.generate(base, 4)["tokens"] == reference(base, 4)     # queued behind the abandoned one
    assert a.dropped == dropped + 1
    rid = b.submit("generate", tokens=base + [7, 8], max_new_tokens=200)
    time.sleep(0.2)
    b.kill()
    with pytest.raises(ReplicaError, match="died"):
        b.wait(rid, "generate")
    b.restart()
    longer = base + _prompt(rng, 9)
    got = b.generate(longer, 4)
    assert got["tokens"] == reference(longer, 4) and got["fetched"] == 4 * PAGE
    rid = a.submit("generate", tokens=slow, max_new_tokens=100)      # restarted mid-request
    a.restart()
    with pytest.raises(ValueError, match="not awaited"):
        a.wait(rid, "generate")
    assert a.generate(longer, 3)["tokens"] == reference(longer, 3)
