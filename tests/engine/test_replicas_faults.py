"""A replica's request protocol under timeouts, kills and restarts (no pool: the tiny model alone):
every request carries an id, a late answer is dropped, and every answer equals one process's."""
import random
import time

import pytest

from minimax_lab.engine.replicas import Replica, ReplicaConfig, ReplicaError
from minimax_lab.engine.store_faults import single_process_reference
from tests.support.devices import fresh_seed


@pytest.fixture(scope="module")
def reference():
    return single_process_reference(16)


@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    log = tmp_path_factory.mktemp("replica") / "solo.log"
    r = Replica(ReplicaConfig(None, None, log=str(log)), name="solo", timeout_s=60.0).start()
    try:
        yield r
    finally:
        r.stop()


def _prompt(rng, n):
    return [rng.randrange(4, 141) for _ in range(n)]


def test_a_late_answer_is_dropped_not_returned_to_the_next_call(replica, reference):
    """A request past its deadline raises (naming the deadline as given); the replica still answers
    it later, and that answer is dropped: the next call gets its own."""
    rng = random.Random(fresh_seed())
    slow, quick = _prompt(rng, 1500), _prompt(rng, 20)
    with pytest.raises(ReplicaError, match=r"did not answer generate within 0\.01 s"):
        replica.generate(slow, 300, timeout_s=0.01)
    got = replica.generate(quick, 3)
    assert got["tokens"] == reference(quick, 3)
    assert replica.dropped == 1
    second = _prompt(rng, 33)
    assert replica.generate(second, 4)["tokens"] == reference(second, 4)
    assert replica.dropped == 1


def test_answers_come_back_to_their_own_requests_in_any_order(replica, reference):
    rng = random.Random(fresh_seed())
    prompts = [_prompt(rng, n) for n in (17, 40, 5)]
    ids = [replica.submit("generate", tokens=p, max_new_tokens=3) for p in prompts]
    for i in (2, 0, 1):        # waited for out of order: the earlier answers are kept for their callers
        assert replica.wait(ids[i], "generate")["tokens"] == reference(prompts[i], 3)
    with pytest.raises(ValueError, match="not awaited"):
        replica.wait(ids[0], "generate")


@pytest.mark.parametrize("timeout_s", [0, -1.0, float("nan"), float("inf")])
def test_a_deadline_must_be_a_positive_finite_time(replica, timeout_s):
    with pytest.raises(ValueError, match="timeout_s"):
        replica.generate([5, 6, 7], 2, timeout_s=timeout_s)


def test_a_replica_killed_mid_request_raises_and_its_restart_answers_right(tmp_path, reference):
    rng = random.Random(fresh_seed())
    slow, quick = _prompt(rng, 1200), _prompt(rng, 25)
    r = Replica(ReplicaConfig(None, None, log=str(tmp_path / "victim.log")), name="victim", timeout_s=60.0).start()
    try:
        pid = r.info["pid"]
        rid = r.submit("generate", tokens=slow, max_new_tokens=200)
        time.sleep(0.3)
        r.kill()
        with pytest.raises(ReplicaError, match="died"):
            r.wait(rid, "generate")
        with pytest.raises(ReplicaError, match="not running"):
            r.generate(quick, 3)
        r.restart()
        assert r.alive() and r.info["pid"] != pid
        assert r.generate(quick, 3)["tokens"] == reference(quick, 3)
        rid = r.submit("generate", tokens=slow, max_new_tokens=200)     # restarted mid-request
        r.restart()
        with pytest.raises(ValueError, match="not awaited"):
            r.wait(rid, "generate")
        assert r.generate(quick, 4)["tokens"] == reference(quick, 4)
    finally:
        r.stop()
    assert not r.alive()
