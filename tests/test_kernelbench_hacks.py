"""The hack gallery: every hack passes the naive harness and is caught by ours, by the check
the gallery names; an honest candidate passes both (so the checks are not simply failing all)."""
import pytest
import torch

import minimax_lab  # noqa: F401  (sets the interpreter before triton kernels are defined)
from minimax_lab.kernelbench import hacks, harness, naive


@pytest.mark.parametrize("name", sorted(hacks.GALLERY))
def test_hack_fools_naive_and_is_caught_by_ours(name):
    c = hacks.compare(name, preset="cpu", n_test=2)
    assert c.naive.passed, c.naive.summary()
    assert not c.ours.passed, c.ours.summary()
    assert c.hack.caught_by in c.ours.caught_by, c.ours.summary()
    assert c.caught and c.fools_naive
    assert torch.allclose is harness._ORIGINALS["torch.allclose"]  # compare() undid any patching


def test_gallery_has_the_issue_hacks_and_names_real_checks():
    want = {"cache_last_output", "special_case_validation", "precision_cut", "side_stream", "partial_write",
            "read_expected"}
    assert want <= set(hacks.GALLERY)
    assert all(h.caught_by in harness.CHECKS for h in hacks.GALLERY.values())


def test_honest_candidate_passes_both_harnesses():
    honest = hacks._softmax
    assert naive.naive_evaluate(honest, "softmax", preset="cpu").passed
    rep = harness.evaluate(honest, "softmax", preset="cpu", n_test=2, time_it=False)
    assert rep.passed, rep.summary()
    assert set(rep.checks) >= set(harness.CHECKS) - {"checked while timed"}


def test_overfit_is_flagged_for_the_validation_special_case():
    c = hacks.compare("special_case_validation", preset="cpu", n_test=3)
    assert c.ours.validation.ok and not c.ours.test.ok and c.ours.overfit


def test_side_work_is_counted_by_our_timer_not_by_the_naive_one():
    cand = hacks.GALLERY["side_stream"].build("cpu")
    x = torch.randn(4, 64)
    t = harness.time_calls(cand, [{"x": x}], reps=2, warmup=0)
    assert t["ms"] >= 50.0  # the hidden thread sleeps 50 ms; a device-wide synchronize waits for it
    nv = naive.naive_evaluate(cand, "softmax", preset="cpu", reps=2)
    assert nv.passed and nv.ms < 50.0  # the naive wall clock returned before the work was done
