"""The harness: the workbook's kernels pass it, open problems can be scored, and each check fails
the candidates it is there to fail (CPU, Triton interpreter, tiny shapes)."""
import dataclasses

import pytest
import torch
from hypothesis import given, settings, strategies as st

import minimax_lab  # noqa: F401
from minimax_lab.kernelbench import harness, ops, problems

REAL = [n for n, p in problems.PROBLEMS.items() if not p.open]


@pytest.mark.parametrize("name", REAL)
def test_workbook_kernels_pass(name):
    p = problems.get_problem(name)
    if p.available() is not None:
        pytest.skip(p.available())
    best = p.best()
    assert best is not None, f"{name} has no workbook implementation to score"
    rep = harness.evaluate(best, p, preset="cpu", n_test=2, time_it=False)
    assert rep.passed, rep.summary()
    assert rep.validation.ok and rep.test.total == 2 and not rep.overfit


@pytest.mark.parametrize("name", [n for n, p in problems.PROBLEMS.items() if p.open])
def test_open_problems_can_be_scored(name):
    p = problems.get_problem(name)
    assert p.best() is None
    assert harness.evaluate(p.reference, p, preset="cpu", n_test=1, time_it=False).passed

    def slightly_wrong(**inputs):  # the reference, off by 5% on every float output (tolerances are <= 2%)
        return tuple(o * 1.05 if o.is_floating_point() else o for o in harness._as_tuple(p.reference(**inputs)))
    rep = harness.evaluate(slightly_wrong, p, preset="cpu", n_test=1, time_it=False)
    assert not rep.passed and "validation shapes" in rep.caught_by


def test_timing_report_and_records():
    rep = harness.evaluate("minimax_lab.kernelbench.ops:softmax", "softmax", preset="cpu", n_test=1, reps=2)
    assert rep.passed, rep.summary()
    t = rep.timing
    assert t["ms"] > 0 and t["reference_ms"] > 0 and t["best_ms"] > 0 and t["input_sets"] >= 2
    assert rep.checks["checked while timed"]
    (rec,) = rep.to_records()
    assert rec["suite"] == "kernelbench" and rec["case"] == "softmax" and set(rec["peers_ms"]) == {"reference", "best"}


def test_candidate_resolution_errors():
    with pytest.raises(TypeError):
        harness.evaluate(42, "softmax", preset="cpu")
    with pytest.raises(ValueError, match="module:function"):
        harness.evaluate("minimax_lab.kernelbench.ops.softmax", "softmax", preset="cpu")
    with pytest.raises(ValueError, match="no callable"):
        harness.evaluate("minimax_lab.kernelbench.ops:nope", "softmax", preset="cpu")
    with pytest.raises(ValueError, match="unknown problem"):
        harness.evaluate(ops.softmax, "nope", preset="cpu")
    with pytest.raises(ValueError, match="n_test"):
        harness.evaluate(ops.softmax, "softmax", preset="cpu", n_test=-1)


def test_unavailable_problem_is_skipped_with_its_reason():
    p = dataclasses.replace(problems.SOFTMAX, available=lambda: "not built yet: testing")
    rep = harness.evaluate(ops.softmax, p, preset="cpu")
    assert rep.status == "skipped" and "not built yet" in rep.summary()


def test_crash_wrong_dtype_and_unwritten_elements_fail():
    def crashes(x):
        raise RuntimeError("boom")

    def wrong_dtype(x):
        return torch.softmax(x.double(), -1)

    def misses_last_column(x):
        y = torch.empty_like(x)
        y[:, :-1] = torch.softmax(x, -1)[:, :-1]
        return y
    for cand in (crashes, wrong_dtype, misses_last_column):
        rep = harness.evaluate(cand, "softmax", preset="cpu", n_test=1, time_it=False)
        assert not rep.passed and "validation shapes" in rep.caught_by, rep.summary()
    assert "raised RuntimeError" in harness.evaluate(crashes, "softmax", preset="cpu", n_test=1).summary()


def test_integer_outputs_must_match_exactly():
    p = problems.MOE_ALIGN

    def swaps_two(topk_ids, n_experts):
        order, counts = p.reference(topk_ids, n_experts)
        return order.flip(0) if order.numel() > 1 else order + 1, counts
    assert not harness.evaluate(swaps_two, p, preset="cpu", n_test=1, time_it=False).passed


@settings(max_examples=8, deadline=None)
@given(delta=st.one_of(st.floats(0.0, 4e-4), st.floats(3e-3, 0.5)))
def test_tolerance_boundary(delta):
    """A softmax off by a relative factor delta passes exactly when delta is under the fp32 tolerance."""
    def scaled(x):
        return torch.softmax(x, -1) * (1 + delta)
    rep = harness.evaluate(scaled, "softmax", preset="cpu", n_test=1, time_it=False)
    assert rep.passed == (delta < 1e-3), rep.summary()


def test_outputs_of_one_call_checked_against_inputs_of_that_call():
    """A candidate that returns the right answer for the *previous* input fails fresh inputs."""
    last = {}

    def one_behind(x):
        prev = last.get(tuple(x.shape))
        last[tuple(x.shape)] = x.clone()
        return torch.softmax(prev if prev is not None else x, -1)
    rep = harness.evaluate(one_behind, "softmax", preset="cpu", n_test=1, time_it=False)
    assert "fresh inputs" in rep.caught_by


def test_check_calls_counts_the_calls_before_timing():
    calls = []

    def counting(x):
        calls.append(tuple(x.shape))
        return torch.softmax(x, -1)
    harness.evaluate(counting, "softmax", preset="cpu", n_test=2, time_it=False)
    assert len(calls) == harness.check_calls("softmax", "cpu", n_test=2)
