"""Replicas in separate processes sharing a real Mooncake pool: reuse, routing, prefill -> decode
and faults, every answer equal to one process with no pool (items 2, 3 and 6 of the
distributed-store issue); and a state machine that drives them through timeouts, kills and
restarts of replicas and of the pool's master (``MINIMAX_LAB_LONG_FUZZ=1``: more programs)."""
import os
import random
import time

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from minimax_lab.engine.slice import PagedEngine
from minimax_lab.engine.replicas import PoolRouter, ReplicaError, page_names, prefill_decode, start_replicas
from minimax_lab.kvcache.routing import PrefillCost, choose_replica
from minimax_lab.engine.store_faults import FAULTS, fault_drill, wait_pool_ready
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


#: shared beginnings of the machine's prompts (3, 4 and 2 full pages and a bit)
BASES = [_prompt(random.Random(90 + i), n) for i, n in enumerate((3 * PAGE + 5, 4 * PAGE, 2 * PAGE + 9))]
specs = st.tuples(st.integers(0, len(BASES) - 1), st.sampled_from([0, 5, 19]))
which = st.integers(0, 1)
LONG_FUZZ = os.environ.get("MINIMAX_LAB_LONG_FUZZ") == "1"


class ReplicaMachine(RuleBasedStateMachine):
    """Two replicas sharing the pool, driven through requests, deadlines that pass, replicas killed
    or restarted in the middle of a request, a killed and restarted master, damaged pool values:
    every answer that comes back must equal one process's (``reference``), and a failure must be
    the documented ``ReplicaError`` (died, did not answer) -- never another request's answer.
    ``server``, ``replicas`` and ``reference`` are set by the test (its fixtures)."""

    server = replicas = reference = None
    restarts_per_program = 1

    def _may_restart(self) -> bool:
        """A replica is restarted only while the master is up: one started without it runs without
        the pool until its next restart (and its client's setup waits out its timeout first)."""
        return self.restarts < self.restarts_per_program and not self.master_down

    def __init__(self):
        super().__init__()
        self.master_down = False
        self.restarts = 0

    def _check(self, got, prompt, n):
        assert got["tokens"] == self.reference(prompt, n), "an answer differs from one process's"

    def _prompt(self, spec):
        base, extra = spec
        return BASES[base] + _prompt(random.Random(base * 100 + extra), extra)

    @rule(i=which, spec=specs, n=st.integers(1, 4))
    def generate(self, i, spec, n):
        prompt = self._prompt(spec)
        self._check(self.replicas[i].generate(prompt, n), prompt, n)

    @rule(i=which, spec=specs, n=st.integers(1, 12), timeout_s=st.sampled_from([0.001, 0.05, 0.5]))
    def generate_in_time(self, i, spec, n, timeout_s):
        prompt = self._prompt(spec)
        try:
            got = self.replicas[i].generate(prompt, n, timeout_s=timeout_s)
        except ReplicaError as e:
            assert "did not answer" in str(e) and f"within {timeout_s:g} s" in str(e), e
        else:
            self._check(got, prompt, n)

    @precondition(_may_restart)
    @rule(i=which, spec=specs, delay_s=st.sampled_from([0.0, 0.05, 0.3]))
    def kill_mid_request(self, i, spec, delay_s):
        r, prompt = self.replicas[i], self._prompt(spec)
        rid = r.submit("generate", tokens=prompt, max_new_tokens=40)
        time.sleep(delay_s)
        r.kill()
        try:
            got = r.wait(rid, "generate")             # it may have answered before it was killed
        except ReplicaError as e:
            assert "died" in str(e), e
        else:
            self._check(got, prompt, 40)
        with pytest.raises(ReplicaError, match="not running"):
            r.generate(prompt, 1)
        r.restart()
        self.restarts += 1

    @precondition(_may_restart)
    @rule(i=which, spec=specs)
    def restart_mid_request(self, i, spec):
        r = self.replicas[i]
        rid = r.submit("generate", tokens=self._prompt(spec), max_new_tokens=40)
        r.restart()
        self.restarts += 1
        with pytest.raises(ValueError, match="not awaited"):
            r.wait(rid, "generate")

    @precondition(lambda self: not self.master_down)
    @rule()
    def kill_master(self):
        self.server.kill_master()
        self.master_down = True

    @precondition(lambda self: self.master_down)
    @rule()
    def restart_master(self):
        self.server.restart_master()
        self.master_down = False

    @precondition(lambda self: not self.master_down)
    @rule(i=which, spec=specs, page=st.integers(0, 3))
    def damage_a_pool_value(self, i, spec, page):
        prompt = self._prompt(spec)
        self.replicas[i].call("tamper", tokens=prompt, page=min(page, len(prompt) // PAGE - 1))

    @rule(i=which)
    def clear_cache(self, i):
        self.replicas[i].call("clear_cache")

    @rule(first=which, spec=specs, n=st.integers(1, 4))
    def prefill_then_decode(self, first, spec, n):
        prompt = self._prompt(spec)
        out = prefill_decode(self.replicas[first], self.replicas[1 - first], prompt, n)
        assert out["tokens"] == self.reference(prompt, n), "an answer differs from one process's"

    def teardown(self):
        if self.master_down:
            self.server.restart_master()
        for r in self.replicas:
            assert r.alive(), f"{r.name} was left dead"
            r.call("clear_cache")


def test_replicas_and_the_pool_survive_random_faults(mooncake, replicas, reference):
    machine = type("Machine", (ReplicaMachine,), dict(server=mooncake, replicas=replicas,
                                                      reference=staticmethod(reference)))
    run_state_machine_as_test(machine, settings=settings(
        max_examples=40 if LONG_FUZZ else 5, stateful_step_count=12 if LONG_FUZZ else 8, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
    assert mooncake.alive() and all(r.alive() for r in replicas)
    assert wait_pool_ready(replicas, timeout_s=60.0), "the pool does not take puts after the master came back"
