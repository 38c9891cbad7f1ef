"""The kernel bench at the GPU preset, on a CUDA GPU (skipped elsewhere): timing hacks behave
differently under CUDA events than under a wall clock, and the isolated mode moves CUDA tensors
between processes by IPC handle -- these run those code paths at real sizes.

Run with ``-s`` to see the measured times (printed for the record)."""
import pytest

import minimax_lab  # noqa: F401
from devices import ON_GPU
from minimax_lab.kernelbench import hacks, harness

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU running compiled Triton "
                                                                    "kernels; this run has none")]

TIMING_HACKS = ["side_stream", "thread_injection", "lazy_output", "lazy_after_checks", "replay_by_pointer",
                "batch_and_skip", "warm_cache", "near_zero_time"]


@pytest.mark.parametrize("name", TIMING_HACKS)
def test_timing_hacks_are_caught_under_cuda_events(name):
    c = hacks.compare(name, preset="gpu", n_test=1)
    print(f"{name}: naive {c.naive.summary()} | ours {c.ours.summary()}")
    assert c.naive.passed, c.naive.summary()
    assert c.caught, c.ours.summary()


@pytest.mark.parametrize("name", sorted(n for n, h in hacks.GALLERY.items() if h.needs_isolation))
def test_isolation_only_hacks_on_the_gpu(name):
    """Events patched in-process fool the in-process timer; isolated (its own CUDA context, CUDA
    IPC tensors), the clock and the judging are out of reach."""
    inside = hacks.compare(name, preset="gpu", n_test=1)
    assert inside.naive.passed and inside.ours.passed, inside.ours.summary()
    isolated = hacks.compare(name, preset="gpu", n_test=1, isolated=True)
    print(f"{name}: in-process {inside.ours.summary()} | isolated {isolated.ours.summary()}")
    assert isolated.caught, isolated.ours.summary()


def test_honest_kernel_scores_the_same_in_both_modes_on_the_gpu():
    """An honest kernel of ~1 ms (the workbook's Triton softmax plus a spin, so the time is well
    above the round trip's noise) at the GPU timing shape: same checks, times within a factor of
    two (isolated: a wall clock around the round trip, less the round trip measured before the
    candidate was loaded; in-process: CUDA events). Prints both and the round trip, for the record."""
    cand = "minimax_lab.kernelbench.hacks:slow_softmax"
    inside = harness.evaluate(cand, "softmax", preset="gpu", n_test=2, compare_best=False)
    isolated = harness.evaluate(cand, "softmax", preset="gpu", n_test=2, compare_best=False, isolate=True)
    t_in, t_iso = inside.timing, isolated.timing
    print(f"in-process {t_in['ms']:.4f} ms, isolated {t_iso['ms']:.4f} ms, round trip {t_iso['overhead_ms']:.4f} ms "
          f"(resolution {t_iso['resolution_ms']:.4f} ms)")
    assert inside.passed and isolated.passed, (inside.summary(), isolated.summary())
    assert (inside.validation.passed, inside.test.passed) == (isolated.validation.passed, isolated.test.passed)
    assert 0.5 < t_iso["ms"] / t_in["ms"] < 2.0, (inside.summary(), isolated.summary())
