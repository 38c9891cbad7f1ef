"""The hack gallery and the catalogue of hack families: every hack passes the naive harness and is
caught by ours, by the check the gallery names -- in this process, or (for the hacks that edit the
harness's own state) only in isolated mode; an honest candidate passes both. Tensors live on the
kernel device (tests/devices.py): on a GPU the same tests run the CUDA-event code paths.

GPU-only cases at the GPU preset are in tests/test_kernelbench_gpu.py."""
import time
from pathlib import Path

import pytest
import torch

import minimax_lab  # noqa: F401  (sets the interpreter before triton kernels are defined)
from tests.support.devices import DEVICE
from minimax_lab import measure
from minimax_lab.kernelbench import catalogue, hacks, harness, integrity, naive

IN_PROCESS = sorted(n for n, h in hacks.GALLERY.items() if not h.needs_isolation)
ISOLATION_ONLY = sorted(n for n, h in hacks.GALLERY.items() if h.needs_isolation)


@pytest.mark.parametrize("name", IN_PROCESS)
def test_hack_fools_naive_and_is_caught_in_process(name):
    c = hacks.compare(name, preset="cpu", n_test=2)
    assert c.naive.passed, c.naive.summary()
    assert not c.ours.passed, c.ours.summary()
    assert c.hack.caught_by in c.ours.caught_by, c.ours.summary()
    assert c.caught and c.fools_naive
    assert integrity.trusted().restore() == []  # compare() undid any patching


@pytest.mark.exclusive
@pytest.mark.parametrize("name", ISOLATION_ONLY)
def test_hack_that_edits_the_harness_passes_in_process_and_is_caught_isolated(name):
    """The documented limit of the in-process mode, and the isolated mode closing it."""
    originals = (torch.allclose, measure.compare_outputs, time.perf_counter, torch.cuda.Event.elapsed_time)
    inside = hacks.compare(name, preset="cpu", n_test=2)
    assert inside.naive.passed, inside.naive.summary()
    assert inside.ours.passed, inside.ours.summary()  # fooled: the harness's own state was edited
    isolated = hacks.compare(name, preset="cpu", n_test=2, isolated=True)
    assert isolated.ours.isolated and isolated.caught, isolated.ours.summary()
    assert hacks.GALLERY[name].caught_isolated in isolated.ours.caught_by
    # compare() undid the forgery here: the originals are back, and the record expects them again
    assert (torch.allclose, measure.compare_outputs, time.perf_counter, torch.cuda.Event.elapsed_time) == originals
    assert integrity.trusted().restore() == []
    assert integrity.trusted().restore() == []


@pytest.mark.exclusive
@pytest.mark.parametrize("name", ["side_stream", "thread_injection", "near_zero_time", "gc_copy_expected"])
def test_isolated_mode_still_catches_in_process_hacks(name):
    """Work left on a side stream or thread is seen by the copy the candidate's process takes on
    its caller's stream at the return; a clock turned back reads out of order inside the call."""
    c = hacks.compare(name, preset="cpu", n_test=1, isolated=True)
    assert c.naive.passed and c.caught, c.ours.summary()


@pytest.mark.exclusive
def test_timer_patch_reports_a_false_speed_up_in_process_only():
    """In-process the patched clock is believed; isolated, the time that scores is this process's:
    the patch claims a tenth of it and changes nothing (the same kernel, honest, in-process:
    within a factor of two, on a shared CPU)."""
    inside = hacks.compare("timer_patch", preset="cpu")
    honest = harness.evaluate(hacks.clock_hack_work, "softmax", preset="cpu", n_test=1, compare_best=False)
    assert inside.ours.passed and honest.passed
    assert inside.ours.timing["ms"] < 0.5 * honest.timing["ms"], (inside.ours.summary(), honest.summary())
    for attempt in range(2):
        isolated = hacks.compare("timer_patch", preset="cpu", isolated=True)
        t = isolated.ours.timing
        assert isolated.caught and t is not None, isolated.ours.summary()
        assert t["worker_ms"] < 0.2 * t["ms"], isolated.ours.summary()  # what the patched clock claimed
        ratio = t["ms"] / honest.timing["ms"]
        assert ratio > 0.5, (isolated.ours.summary(), honest.summary())  # the patched clock was not believed
        # A shared CPU only ever slows a run down: one more try before calling a slow one a failure
        # (a CI run once measured 2.02x).
        if ratio < 2.0:
            break
    assert ratio < 2.0, (isolated.ours.summary(), honest.summary())


def test_gallery_has_the_issue_hacks_and_names_real_checks():
    want = {"cache_last_output", "special_case_validation", "precision_cut", "side_stream", "partial_write",
            "read_expected"}
    assert want <= set(hacks.GALLERY)
    for h in hacks.GALLERY.values():
        assert h.caught_by is None or h.caught_by in harness.CHECKS, h.name
        assert h.caught_isolated is None or h.caught_isolated in harness.CHECKS, h.name
        assert h.expected_check(isolated=True) is not None, h.name
        assert h.sources and all(s.url.startswith("https://") for s in h.sources), h.name
        assert "Published in:" in (h.build.__doc__ or ""), h.name  # the citation is in the docstring


def test_catalogue_covers_every_family_and_every_hack():
    used = set()
    for f in catalogue.FAMILIES:
        assert f.mode in catalogue.MODES and f.sources, f.name
        if f.mode in ("in-process", "isolated"):
            assert f.gallery, f"{f.name}: a hack family without a gallery entry"
            for name in f.gallery:
                h = hacks.GALLERY[name]
                assert h.needs_isolation == (f.mode == "isolated"), (f.name, name)
            assert all(c in harness.CHECKS for c in f.checks()), f.name
        else:
            assert not f.gallery, f.name
        used.update(f.gallery)
    assert used == set(hacks.GALLERY), set(hacks.GALLERY) ^ used


def test_hacks_md_is_the_rendered_catalogue():
    path = Path(catalogue.__file__).with_name("HACKS.md")
    assert path.read_text() == catalogue.HEADER + catalogue.markdown(), \
        "HACKS.md is stale: python -m minimax_lab.kernelbench.catalogue > minimax_lab/kernelbench/HACKS.md"


def test_honest_candidate_passes_both_harnesses():
    honest = hacks.honest_softmax
    assert naive.naive_evaluate(honest, "softmax", preset="cpu").passed
    rep = harness.evaluate(honest, "softmax", preset="cpu", n_test=2, time_it=False)
    assert rep.passed, rep.summary()
    ran = set(harness.CHECKS) - {"checked while timed", "fresh-input speed", "physically possible time",
                                 "clock agrees"}
    assert set(rep.checks) >= ran


def test_overfit_is_flagged_for_the_validation_special_case():
    c = hacks.compare("special_case_validation", preset="cpu", n_test=3)
    assert c.ours.validation.ok and not c.ours.test.ok and c.ours.overfit


def test_side_work_is_caught_by_ours_and_timed_fast_by_the_naive_wall_clock():
    cand = hacks.GALLERY["side_stream"].build("cpu")
    nv = naive.naive_evaluate(cand, "softmax", preset="cpu", reps=2)
    assert nv.passed and nv.ms < 50.0  # the naive wall clock returned before the hidden work was done
    rep = harness.evaluate(cand, "softmax", preset="cpu", n_test=1, time_it=False)
    assert "stream-ordered result" in rep.caught_by


def test_gallery_candidate_is_picklable_and_builds_lazily():
    import pickle

    c = pickle.loads(pickle.dumps(hacks.GalleryCandidate("precision_cut", "cpu")))
    x = torch.randn(3, 7, device=DEVICE)
    assert c.__name__ == "precision_cut" and torch.allclose(c(x=x), torch.softmax(x, -1), atol=1e-3)
    with pytest.raises(ValueError, match="unknown hack"):
        hacks.GalleryCandidate("nope", "cpu")


def test_gc_scan_survives_dead_weak_proxies():
    """gc.get_objects() yields weak proxies whose referent is gone (seen on the H200: the scan raised
    ReferenceError there); the hack must skip them, or it never gets to fool the naive harness."""
    import gc
    import weakref

    class Thing:
        pass

    keep = []
    t = Thing()
    proxy = weakref.proxy(t)
    keep.append(proxy)  # the proxy stays reachable ...
    del t               # ... its object does not
    gc.collect()
    x = torch.randn(3, 5)
    out = hacks.GALLERY["gc_copy_expected"].build("cpu")(x)  # must not raise ReferenceError
    assert out.shape == x.shape and keep
