"""The kernel bench at the GPU preset, on a CUDA GPU (skipped elsewhere): timing hacks behave
differently under CUDA events than under a wall clock, and the isolated mode moves CUDA tensors
between processes by IPC handle, in another CUDA context -- these run those code paths at real
sizes. The hacks that need a time (timer_patch, near_zero_time, ...) spin ~20 ms per call
(``hacks.SLOW_SPIN_CYCLES``), far above the isolated round trip's jitter (1-3 ms on the H200).

Run with ``-s`` to see the measured times (printed for the record)."""
import pytest
import torch

import minimax_lab  # noqa: F401
from minimax_lab import measure
from tests.support.devices import ON_GPU
from minimax_lab.kernelbench import hacks, harness, problems

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU running compiled Triton "
                                                                    "kernels; this run has none")]

TIMING_HACKS = ["side_stream", "thread_injection", "lazy_output", "lazy_after_checks", "replay_by_pointer",
                "batch_and_skip", "warm_cache", "near_zero_time"]


def _times(rep) -> str:
    t = rep.timing or {}
    keys = ("ms", "worker_ms", "overhead_ms", "resolution_ms")
    return ", ".join(f"{k} {t[k]:.4f}" for k in keys if t.get(k) is not None)


@pytest.mark.parametrize("name", TIMING_HACKS)
def test_timing_hacks_are_caught_under_cuda_events(name):
    c = hacks.compare(name, preset="gpu", n_test=1)
    print(f"{name}: naive {c.naive.summary()} | ours {c.ours.summary()}")
    assert c.naive.passed, c.naive.summary()
    assert c.caught, c.ours.summary()


@pytest.mark.exclusive  # isolated-mode timing: no other process may share the GPU
@pytest.mark.parametrize("name", ["side_stream", "thread_injection", "near_zero_time"])
def test_isolated_mode_catches_escaped_work_and_clocks_turned_back_on_the_gpu(name):
    """Isolated, in its own CUDA context: the candidate's process copies the outputs on its caller's
    stream before it synchronizes the device (side stream, thread), and its clock's readings must
    fall, in order, inside the harness's interval around each call (near_zero_time)."""
    c = hacks.compare(name, preset="gpu", n_test=1, isolated=True)
    print(f"{name}: isolated {c.ours.summary()}")
    assert c.naive.passed and c.caught, c.ours.summary()


@pytest.mark.exclusive  # isolated-mode timing: no other process may share the GPU
@pytest.mark.parametrize("name", sorted(n for n, h in hacks.GALLERY.items() if h.needs_isolation))
def test_isolation_only_hacks_on_the_gpu(name):
    """Events patched in-process fool the in-process timer; isolated (its own CUDA context, CUDA
    IPC tensors), the clock and the judging are out of reach, and the patched clock is flagged."""
    inside = hacks.compare(name, preset="gpu", n_test=1)
    assert inside.naive.passed and inside.ours.passed, inside.ours.summary()
    isolated = hacks.compare(name, preset="gpu", n_test=1, isolated=True)
    print(f"{name}: in-process {inside.ours.summary()} | isolated {isolated.ours.summary()} [{_times(isolated.ours)}]")
    assert isolated.caught, isolated.ours.summary()


@pytest.mark.exclusive  # isolated-mode timing: no other process may share the GPU
def test_a_patched_clock_cannot_change_the_isolated_score_on_the_gpu():
    """What isolated mode guarantees about time: the timer patch claims a tenth of each call on its
    own clock, and its isolated score is the same kernel's honest isolated score (within 25%)."""
    patched = hacks.compare("timer_patch", preset="gpu", n_test=1, isolated=True).ours
    honest = harness.evaluate("minimax_lab.kernelbench.hacks:slow_softmax", "softmax", preset="gpu", n_test=1,
                              compare_best=False, isolate=True)
    print(f"timer_patch isolated [{_times(patched)}] | honest isolated [{_times(honest)}]")
    assert honest.passed, honest.summary()
    assert patched.timing is not None and "clock agrees" in patched.caught_by, patched.summary()
    assert patched.timing["worker_ms"] < 0.2 * patched.timing["ms"], patched.summary()
    assert 0.8 < patched.timing["ms"] / honest.timing["ms"] < 1.25, (patched.summary(), honest.summary())


@pytest.mark.exclusive  # isolated-mode timing: no other process may share the GPU
def test_honest_kernel_scores_the_same_in_both_modes_on_the_gpu():
    """An honest kernel of ~20 ms (the workbook's Triton softmax plus a spin, so the time is well
    above the round trip's noise) at the GPU timing shape: same checks, 'clock agrees' included,
    times within 25% (isolated: a wall clock from sending the call to holding a copy of the
    outputs, less the round trip of a stand-in measured the same way; in-process: CUDA events).
    Prints both and the round trip, for the record."""
    cand = "minimax_lab.kernelbench.hacks:slow_softmax"
    inside = harness.evaluate(cand, "softmax", preset="gpu", n_test=2, compare_best=False)
    isolated = harness.evaluate(cand, "softmax", preset="gpu", n_test=2, compare_best=False, isolate=True)
    t_in, t_iso = inside.timing, isolated.timing
    print(f"in-process {t_in['ms']:.4f} ms | isolated [{_times(isolated)}]")
    assert inside.passed and isolated.passed, (inside.summary(), isolated.summary())
    assert isolated.checks.get("clock agrees") is True
    assert (inside.validation.passed, inside.test.passed) == (isolated.validation.passed, isolated.test.passed)
    assert 0.8 < t_iso["ms"] / t_in["ms"] < 1.25, (inside.summary(), isolated.summary())


@pytest.mark.exclusive  # isolated-mode timing: no other process may share the GPU
def test_fast_honest_kernel_passes_isolated_on_the_gpu():
    """The workbook's Triton softmax (~0.1 ms at 8192 x 8192, under the round trip): isolated, no
    check -- 'clock agrees' above all -- takes the round trip's jitter for a tampered clock."""
    rep = harness.evaluate("minimax_lab.kernelbench.ops:softmax", "softmax", preset="gpu", n_test=2,
                           compare_best=False, isolate=True)
    print(f"ops.softmax isolated [{_times(rep)}]")
    assert rep.passed and rep.checks.get("clock agrees") is True, rep.summary()


@pytest.mark.parametrize("name", sorted(n for n, p in problems.PROBLEMS.items() if p.strong_peer().same_contract))
def test_strong_peers_compute_the_contract_at_gpu_sizes(name):
    """Each strong peer at its problem's GPU timing shape (bf16, the CUDA kernels it dispatches to:
    fused softmax and RMSNorm, FlashAttention's variable-length kernel through nested tensors,
    torch._scaled_grouped_mm), judged against the reference as the harness judges it."""
    p = problems.get_problem(name)
    peer = p.strong_peer()
    inputs = p.make_inputs(p.timing_shape("gpu"), 7, "normal")
    got = peer.run(**peer.prepare(inputs))
    ref = p.reference(**measure.upcast(inputs, torch.float32))
    tol = harness._tolerance(p, inputs)
    err, fails = measure.compare_outputs(got, ref, tol=tol)
    print(f"{name}: {peer.name}: rel err {err:.2e} (tol {tol:.0e})")
    assert not fails, fails
