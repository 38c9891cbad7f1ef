"""The strong peer of every problem: the implementation a user would pick instead of writing a kernel.
Each one that computes the problem's contract passes the harness itself (validation, value regimes,
held-out shapes); the harness times it beside every candidate and reports that ratio first; a peer
that is wrong or raises is reported, never fatal."""
import dataclasses
import time

import pytest
import torch

import minimax_lab  # noqa: F401
from minimax_lab.kernelbench import harness, problem_ops, problems

SAME_CONTRACT = sorted(n for n, p in problems.PROBLEMS.items() if p.strong_peer().same_contract)


class AsCandidate:
    """A peer called the way a candidate is: problem inputs in, its own layout prepared inside."""

    def __init__(self, peer):
        self.peer, self.__name__ = peer, peer.name

    def __call__(self, **inputs):
        return self.peer.run(**self.peer.prepare(inputs))


def test_every_problem_names_its_strong_peer():
    for name, p in problems.PROBLEMS.items():
        peer = p.strong_peer()
        assert isinstance(peer, problems.Peer) and peer.name and peer.note, name
        assert peer.run is not p.reference or name == "moe_align", f"{name}: the fp32 reference is no strong peer"


@pytest.mark.parametrize("name", SAME_CONTRACT)
def test_a_strong_peer_computes_the_problems_contract(name):
    p = problems.get_problem(name)
    rep = harness.evaluate(AsCandidate(p.strong_peer()), p, preset="cpu", n_test=2, time_it=False)
    assert rep.passed, rep.summary()


def test_the_sparse_backwards_peer_is_timed_not_judged():
    """msa_backward's peer is dense causal attention: more work than the sparse contract, a
    different answer -- the baseline a sparse kernel must beat, so it is timed and not judged."""
    p = problems.MSA_BACKWARD
    peer = p.strong_peer()
    assert not peer.same_contract
    inputs = p.make_inputs(p.validation_shapes("cpu")[0], 1, "normal")
    grads = peer.run(**peer.prepare(inputs))
    assert [g.shape for g in grads] == [inputs[k].shape for k in ("q", "k", "v")]
    rep = harness.evaluate(p.reference, p, preset="cpu", n_test=1, reps=2, compare_best=False)
    assert rep.passed and rep.timing["strong_peer_ms"] > 0 and not rep.timing.get("strong_peer_error"), rep.summary()


def test_paged_decode_peer_reads_each_sequence_once_without_padding():
    p = problems.PAGED_DECODE
    inputs = p.make_inputs(p.validation_shapes("cpu")[0], 3, "normal")
    layout = p.strong_peer().prepare(inputs)
    assert layout["k"].values().shape[0] == int(inputs["seq_lens"].sum())  # exactly the tokens, back to back


def _timed(problem, **kw):
    return harness.evaluate(problems.SOFTMAX.strong_peer().run, problem, preset="cpu", n_test=1, reps=2,
                            compare_best=False, **kw)


def test_a_wrong_or_failing_peer_is_reported_not_fatal():
    wrong = dataclasses.replace(problems.SOFTMAX, strong_peer=lambda: problems.Peer("zeros", torch.zeros_like))
    rep = _timed(wrong)
    assert rep.passed and rep.timing["strong_peer_ms"] is None, rep.summary()
    assert "wrong on the timing inputs" in rep.timing["strong_peer_error"] and "strong peer zeros" in rep.summary()
    (rec,) = rep.to_records()
    assert "strong_peer" not in rec["speedup_vs"] and rec["strong_peer_error"]

    def raises(x):
        raise RuntimeError("no such kernel here")
    broken = dataclasses.replace(problems.SOFTMAX, strong_peer=lambda: problems.Peer("broken", raises))
    rep = _timed(broken)
    assert rep.passed and "RuntimeError: no such kernel here" in rep.timing["strong_peer_error"]


def test_the_report_and_the_record_put_the_strong_peer_first():
    rep = _timed(problems.SOFTMAX)
    t = rep.timing
    line = rep.summary().splitlines()[1]
    assert line.index("strong peer") < line.index("reference"), line
    (rec,) = rep.to_records()
    assert list(rec["speedup_vs"])[0] == "strong_peer"
    assert rec["speedup_vs"]["strong_peer"] == pytest.approx(t["strong_peer_ms"] / t["ms"], abs=1e-3)  # 3 decimals
    assert _timed(problems.SOFTMAX, compare_peer=False).timing.get("strong_peer_ms") is None


@pytest.mark.exclusive
def test_a_peers_layout_is_prepared_outside_its_time():
    """A peer whose setup (a contiguous cache, a cos/sin table) takes 50 ms is not charged for it."""
    slow_setup = problems.Peer("fast, slow setup", problem_ops.softmax_peer,
                               prepare=lambda inputs: time.sleep(0.05) or dict(inputs))
    rep = _timed(dataclasses.replace(problems.SOFTMAX, strong_peer=lambda: slow_setup))
    assert rep.timing["strong_peer_ms"] < 25, rep.summary()
