"""The harness: score a candidate kernel so that being right and fast is the only way to score well.

    report = evaluate(candidate, "softmax")                  # in this process: the quick loop
    report = evaluate("pkg.mod:fn", "softmax", isolate=True)  # in its own process: for untrusted code
    print(report.summary())

A candidate takes the problem's inputs as keyword arguments (see :mod:`.problems`) and returns
the output tensor (or a tuple of them). :func:`evaluate` runs these phases, each a *named check*
(:data:`CHECKS`); every check that fails is listed in ``report.caught_by``:

1. **validation shapes** -- the public shapes, normal inputs, a fresh random seed per call.
2. **value regimes** -- the same shapes with harder values (sharp logits, tiny or large numbers).
3. **fresh inputs** -- called again with new tensors, then with the *same* tensors refilled in
   place: a kernel that memorises its last answer (by shape or by address) is wrong here.
4. **repeat calls agree** -- the same inputs twice must give the same answer.
5. **held-out shapes** -- shapes drawn *now* from ``os.urandom`` (via :mod:`secrets`), one at a
   time, right before the call that uses them. No seed, generator or list of future shapes
   exists anywhere a candidate could look while it runs.
6. **timing** (only if everything above passed) -- at the problem's timing shape. Before every
   timed call the device's cache is flushed (GPU: a write of twice the L2 size), and every other
   call gets inputs refilled in place with fresh values, so no earlier output, no result recorded
   in warm-up and no batch computed ahead can be right (**checked while timed**: every timed
   output is judged like any other). The calls in between repeat the previous inputs: a
   candidate faster on those has seen them before (**fresh-input speed**: in the fastest call of
   each kind and in most of at least three pairs of calls, not in medians that a busy machine
   moves). The time is
   the median over the fresh calls, from CUDA events on the caller's stream (GPU) or the wall
   clock (CPU), stopped when the call returns -- work left on another stream or thread is not
   waited for, it is caught by the stream check below instead. A time the problem's minimum
   traffic (``Problem.traffic``) cannot reach at the device's measured ceilings is impossible
   (**physically possible time**). The problem's **strong peer** (the implementation a user
   would pick instead: ``Problem.strong_peer``), the fp32 reference and the workbook's best are
   timed the same way; the speed-up against the strong peer is the one reported first.

And on every single call, timed or not:

* outputs are judged from a copy taken *on the caller's stream right after the call returns*
  (before any synchronize); if that copy differs from the output after a full synchronize, or a
  thread the candidate started is still running, work escaped the call (**stream-ordered result**;
  isolated, the candidate's process takes that copy and reports, and this process judges its own
  copy, taken when the reply arrives);
* outputs must be plain ``torch.Tensor`` objects (**plain tensors**): a subclass can compute its
  values later, when a check first looks at them (a lazy output);
* freed memory is poisoned with NaN first (``measure.poison_``), so unwritten elements fail;
* outputs must share no memory with the inputs or with earlier outputs (**no aliasing**), the
  inputs must come back unchanged (**inputs untouched**);
* the reference runs only *after* the candidate returned, on a copy of the inputs, so there is
  no expected answer to find; frame walking (``sys._getframe``, traceback and generator frames)
  and garbage-collector scans during the call are caught with audit hooks (**no introspection**);
* **harness integrity** (:mod:`.integrity`): every function, class and module of ``torch``,
  ``torch.Tensor``, ``torch.nn.functional``, ``torch.linalg``, ``math``, ``statistics``,
  ``time``, ``random``, ``numpy``, ``secrets``, ``os``, ``threading``, the builtins, and of the
  workbook's judging modules and problems must be after the call as they were right before it
  (and a candidate's module as it was before the harness imported it), and so must torch's
  global settings (mode stacks, ``aten`` kernels
  registered through ``torch.library``, default dtype, grad mode, threads; on a GPU also TF32
  and SDPA's backends).
  A replacement is named and put back before the reference runs or anything is judged: a
  candidate that swaps a function the reference computes with, one the inputs are drawn with, or
  one the timer's statistic goes through fails here, and the next call finds the originals.

Validation and test (held-out) scores are reported apart; right on validation but wrong on test
is flagged ``overfit``.

**In-process mode** (the default, the notebook's quick loop) runs the candidate in this process.
What it stops: every check above, including any replacement in the namespaces and settings the
integrity check records (found after the call, so that call fails and the next one runs on the
originals). What it cannot stop, because the candidate shares the process: a candidate that edits
the integrity check's own record of the originals (:func:`.integrity.trusted`), the mutable state
the harness keeps (caches, the contents of its lists, dicts and tensors), kernels registered with
the C++ dispatcher directly, or memory written through ``ctypes``. Such a candidate can make a
wrong kernel pass and a slow one look fast. Untrusted code runs isolated.

**Isolated mode** (``isolate=True``, :mod:`.isolate`) runs the candidate in a separate spawned
process (its own CUDA context on a GPU) that receives inputs and returns outputs through shared
memory. This process keeps the clock, the reference, the held-out draws and the judging; whatever
the candidate patches in its own process reaches none of them. The time is this process's wall
clock from sending each call until it holds its own copy of the outputs -- the copy that is
judged -- less the round trip of a trusted stand-in measured the same way before the candidate
was loaded: a patched clock, or work left on another stream or thread, cannot lower it. The
candidate's process copies the outputs on its caller's stream right after the return and waits
for all its work before replying, so the **stream-ordered result** check holds there too. Its own
clock is compared with this one (**clock agrees**): its readings must fall inside this process's
interval around each call, and over the timed calls it may not claim under half the time this
process measured, with most calls missing more than the round trip's resolution from its clock
(:func:`.isolate.clock_disagreement`).
Candidates must be importable there: a ``"package.module:function"`` string or a picklable
callable (see :func:`.isolate.candidate_payload`).

The harness is one module on purpose: the phases, the checks made on every call and the timing
are one procedure whose steps each rely on the one before (timing only after every check passed,
the peers timed on the same refilled inputs), and this docstring is the specification it is read
against.
"""
from __future__ import annotations

import dataclasses
import math
import random
import secrets
import statistics
import threading
import time
from typing import Callable

import torch
from tqdm.auto import tqdm

from minimax_lab import measure, runtime
from minimax_lab.kernelbench import integrity
from minimax_lab.kernelbench import isolate as isolate_mode
from minimax_lab.kernelbench import problems as _problems
from minimax_lab.kernelbench.calls import (CandidateError, Outcome, as_tuple, bitwise_equal, clone_inputs,
                                           device_of, expected_dtype, flush_device_cache, fresh_seed,
                                           input_aliases, launch_side_work, overlaps, plain_copy,
                                           poison_free_memory, resolve_candidate, speedup, synchronize,
                                           threads_left)

__all__ = ["CHECKS", "CandidateError", "InProcess", "Report", "Score", "check_calls", "evaluate", "launch_side_work",
           "refuse_shortcut", "resolve_candidate", "synchronize", "time_calls"]

#: check name -> what it demands (in the order they are reported)
CHECKS: dict[str, str] = {
    "validation shapes": "right on every public validation shape (normal inputs, fresh seed each call)",
    "value regimes": "right on harder values: sharp logits, tiny or large magnitudes",
    "fresh inputs": "right when called again with new tensors, and with the same tensors refilled in place",
    "repeat calls agree": "the same inputs twice give the same answer",
    "held-out shapes": "right on shapes drawn at evaluation time from os.urandom, never stored before the call",
    "plain tensors": "outputs are plain torch.Tensor objects, not subclasses that compute their values later",
    "no aliasing": "outputs share no memory with the inputs or with any earlier output",
    "inputs untouched": "the inputs come back unchanged",
    "stream-ordered result": "the output read on the caller's stream right after return equals the output after a "
                             "full synchronize, and no thread the candidate started is still running",
    "no introspection": "no walking of the caller's frames or the garbage collector during the call",
    "harness integrity": "every function, class and module of the namespaces integrity.STANDARD_MODULES and "
                         "STANDARD_CLASSES name (builtins, torch and its functional, linalg, testing and cuda, math, "
                         "statistics, time, random, numpy, secrets, os, threading), the workbook's modules on the "
                         "path of judging and torch's global settings are as they were before the candidate ran (a "
                         "change is named and put back), and no function's code was rewritten",
    "checked while timed": "every timed call gets fresh inputs (refilled in place) and its output is right for them",
    "fresh-input speed": "no faster on inputs it has already seen than on fresh ones (result caches, warm data)",
    "physically possible time": "the time is above the floor that the problem's minimum bytes and FLOPs set at "
                                "the device's measured ceilings",
    "clock agrees": "isolated mode: the candidate's process reads its clock inside the harness's interval around each "
                    "call, and does not claim under half the harness's time for the timed calls with most of them "
                    "missing more than the round trip's resolution from its clock",
}
#: the checks whose failures count against the validation score / the test score
VALIDATION_CHECKS = ("validation shapes", "value regimes", "fresh inputs", "repeat calls agree")
TEST_CHECKS = ("held-out shapes",)

#: a time below this fraction of what the measured ceilings allow for the minimum traffic is impossible
FLOOR_SLACK = 0.25
#: "fresh-input speed" fails when the fastest call on repeated inputs takes less than this fraction of
#: the fastest call on fresh ones, and so does a repeated call against the fresh call before it in at
#: least SEEN_INPUT_PAIRS of the pairs
SEEN_INPUT_RATIO = 0.5
SEEN_INPUT_PAIRS = 0.75
#: ... judged from at least this many (fresh, repeated) pairs of timed calls: one slow call of a busy
#: machine decides fewer
SEEN_INPUT_MIN_PAIRS = 3


def _tolerance(problem, inputs: dict) -> float:
    if problem.tol is not None:
        return problem.tol
    dt = expected_dtype(inputs)
    return measure.tolerance_for(dt) if dt is not None else 0.0


def _judge(outs: tuple, ref, inputs: dict, tol: float) -> tuple[float, list[str]]:
    exp_dt = expected_dtype(inputs)
    refs = as_tuple(ref)
    bad = [f"output {i} has dtype {str(o.dtype)[6:]}, expected {str(exp_dt)[6:]}"
           for i, (o, r) in enumerate(zip(outs, refs))
           if isinstance(o, torch.Tensor) and r.is_floating_point() and exp_dt is not None and o.dtype != exp_dt]
    err, fails = measure.compare_outputs(outs, refs, tol=tol)
    return (math.inf if bad else err), bad + fails


# --------------------------------------------------------------------------- report

#: the spreads a timed report keeps: the candidate's fresh calls, the strong peer's and the reference's
_SPREADS = ("p20_ms", "p80_ms", "strong_peer_p20_ms", "strong_peer_p80_ms", "reference_p20_ms", "reference_p80_ms")


@dataclasses.dataclass
class Score:
    """Calls judged right out of calls made, in one half (validation or test) of the evaluation."""

    passed: int = 0
    total: int = 0
    max_error: float = 0.0

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.passed == self.total

    def __str__(self) -> str:
        return f"{self.passed}/{self.total} (max err {self.max_error:.1e})"


@dataclasses.dataclass
class Report:
    """What :func:`evaluate` found. ``status``: ``"pass"``, ``"fail"`` or ``"skipped"``;
    ``isolated``: whether the candidate ran in its own process."""

    problem: str
    candidate: str
    status: str
    checks: dict[str, bool] = dataclasses.field(default_factory=dict)
    failures: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    validation: Score = dataclasses.field(default_factory=Score)
    test: Score = dataclasses.field(default_factory=Score)
    timing: dict | None = None
    held_out_shapes: list[dict] = dataclasses.field(default_factory=list)  # revealed after the fact
    message: str = ""
    isolated: bool = False

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def overfit(self) -> bool:
        """Right on every validation call, wrong on some held-out one."""
        return self.validation.ok and self.test.total > 0 and not self.test.ok

    @property
    def caught_by(self) -> list[str]:
        return [c for c in CHECKS if self.checks.get(c) is False]

    def _fail(self, check: str, msg: str) -> None:
        self.checks[check] = False
        self.failures.setdefault(check, [])
        if len(self.failures[check]) < 5:
            self.failures[check].append(msg)

    def _ok(self, check: str) -> None:
        self.checks.setdefault(check, True)

    def _record(self, check: str, failure: str | None) -> None:
        """Fail ``check`` with ``failure``, or count it as passed when there is none."""
        if failure:
            self._fail(check, failure)
        else:
            self._ok(check)

    def summary(self) -> str:
        head = f"{self.status.upper()} {self.candidate} on {self.problem}" + (" (isolated)" if self.isolated else "")
        if self.status == "skipped":
            return f"{head}: {self.message}"
        lines = [f"{head}: validation {self.validation}, test {self.test}" + ("  ** OVERFIT **" if self.overfit else "")]
        for c in self.caught_by:
            lines.append(f"  caught by '{c}': {self.failures[c][0]}")
        if self.timing:
            t = self.timing
            seen = f" (repeated inputs {t['seen_ms']:.4g} ms)" if t.get("seen_ms") is not None else ""
            lines.append(f"  time {t['ms']:.4g} ms{seen} vs {', '.join(_peer_words(t))}; {t['method']}")
            if t.get("strong_peer_error"):
                lines.append(f"  strong peer {t['strong_peer']}: {t['strong_peer_error']}")
            if t.get("below_resolution"):
                lines.append(f"  (isolated: {t['ms']:.4g} ms is within the round trip's resolution of "
                             f"{t['resolution_ms']:.3g} ms: too fast to time this way, not a measured speed)")
        return "\n".join(lines)

    def to_records(self, suite: str = "kernelbench") -> list[dict]:
        """One ``bench`` record (needs a positive timing): ms, shape, checks, and the times of its
        peers -- the strong peer first (``speedup_vs["strong_peer"]``, named in ``strong_peer``),
        then the reference and the workbook's best -- with the p20-p80 spreads of the candidate's,
        the strong peer's and the reference's times (:data:`_SPREADS`)."""
        if not self.timing or not self.timing["ms"] > 0:
            return []
        t = self.timing
        peers = {"strong_peer": t.get("strong_peer_ms"), "reference": t["reference_ms"], "best": t.get("best_ms")}
        peers = {k: v for k, v in peers.items() if v}
        p = _problems.get_problem(self.problem)
        flops, nbytes = p.cost(t["shape"]) if p.cost else (t.get("flops"), t.get("bytes"))
        return [measure.make_record(
            suite, self.problem, self.candidate, t["ms"], shape=t["shape"], dtype=t.get("dtype"),
            flops=flops, bytes_moved=nbytes, peers=peers,
            extra={"status": self.status, "validation": str(self.validation), "test": str(self.test),
                   "overfit": self.overfit, "caught_by": self.caught_by, "seen_ms": t.get("seen_ms"),
                   "floor_ms": t.get("floor_ms"), "isolated": self.isolated,
                   "isolation_overhead_ms": t.get("overhead_ms"), "below_resolution": t.get("below_resolution"),
                   "timing_method": t["method"], "input_sets": t["input_sets"],
                   "strong_peer": t.get("strong_peer"), "strong_peer_note": t.get("strong_peer_note"),
                   "strong_peer_error": t.get("strong_peer_error"),
                   # the p20-p80 spreads of the candidate's, the strong peer's and the reference's times
                   **{k: t[k] for k in _SPREADS if t.get(k) is not None}})]


# --------------------------------------------------------------------------- running the candidate


class _WallClock:
    method = "wall clock per call, stopped at return (CPU: Triton's interpreter, not a speed)"

    def start(self):
        return time.perf_counter()

    def stop(self, t0) -> Callable[[], float]:
        t1 = time.perf_counter()
        return lambda: (t1 - t0) * 1e3


class _CudaEvents:
    method = "CUDA events per call on the caller's stream, cache flushed before each call"

    def start(self):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def stop(self, e0) -> Callable[[], float]:
        e1 = torch.cuda.Event(enable_timing=True)
        e1.record()
        return lambda: e0.elapsed_time(e1)  # read after the synchronize that follows every call


def _clock_for(inputs: dict):
    return _CudaEvents() if device_of(inputs).type == "cuda" else _WallClock()


class InProcess:
    """Runs the candidate in this process: the quick loop (see the module docstring for its limits)."""

    isolated = False
    resolution_ms = 0.0  # nothing stands between the clock and the call
    method_note = ""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.snapshot = integrity.trusted()
        self.settings = integrity.Settings.capture()

    def run(self, inputs: dict, *, timed: bool = False) -> Outcome:
        """One call; whatever it replaced is put back as soon as it returns, before the harness
        runs any more of its own code (``Outcome.tampered`` names it)."""
        poison_free_memory(inputs)
        clock = _clock_for(inputs) if timed else None
        res = Outcome(threads_before=set(threading.enumerate()))
        integrity.accept_all(self.snapshot, self.settings)  # the state right before the call is the one to keep
        integrity.start_watch(res.log)
        try:
            t0 = clock.start() if clock else None
            res.out = self.fn(**inputs)
            res.elapsed = clock.stop(t0) if clock else None
        except Exception as e:  # a crash is a wrong answer, not a harness error
            res.crash = e
        finally:
            integrity.stop_watch()
            res.tampered = integrity.restore_all(self.snapshot, self.settings)
        return res

    def settle(self, res: Outcome) -> tuple[list[str], list[str]]:
        """Wait for everything, then ``(what the call replaced -- put back --, its threads still
        running)``; anything replaced since (by threads it left running) is put back too."""
        synchronize()
        late = integrity.restore_all(self.snapshot, self.settings)
        return res.tampered + late, threads_left(res.threads_before)

    def prepare_timing(self, sets: list[dict]) -> None:
        pass

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- evaluate


def _draw_held_out(problem, preset: str) -> dict:
    """One held-out shape from a generator seeded by os.urandom; the generator dies here."""
    return dict(problem.draw_test_shape(random.Random(secrets.randbits(128)), preset))


class _Session:
    """The per-evaluation state: the report being filled, and the outputs kept alive so later
    outputs can be checked for aliasing them. Holds nothing about future shapes."""

    def __init__(self, invoker, problem, report, keep: int):
        self.invoker, self.problem, self.report, self.keep = invoker, problem, report, keep
        self.earlier: list[torch.Tensor] = []

    def call(self, inputs: dict, check: str, where: str, *, timed: bool = False):
        """Run the candidate once on ``inputs`` and judge it; returns ``(outputs, correct, ms, worker_ms)``
        (the times only for ``timed`` calls)."""
        rep = self.report
        snap = clone_inputs(inputs)
        res = self.invoker.run(inputs, timed=timed)
        outs = as_tuple(res.out)
        seen = res.snapshot if res.snapshot is not None else tuple(
            plain_copy(o) for o in outs)  # on the caller's stream, right after return
        tampered, running = self.invoker.settle(res)
        if res.clock_problem is not None or res.worker_ms is not None:
            rep._record("clock agrees", res.clock_problem and f"{where}: {res.clock_problem}")
        tampered = list(tampered) + [w for k, w in res.log if k == "integrity"]
        spied = [w for k, w in res.log if k == "introspection"]
        rep._record("harness integrity", tampered and f"{where}: candidate replaced {', '.join(tampered)} (restored)")
        rep._record("no introspection", spied and f"{where}: {spied[0]}" + (f" (+{len(spied) - 1} more)"
                                                                           if len(spied) > 1 else ""))
        if res.crash is not None:
            what = (f"{res.crash} (in its process)" if isinstance(res.crash, CandidateError)
                    else f"{type(res.crash).__name__}: {res.crash}")
            rep._fail(check, f"{where}: raised {what}")
            return None, False, None, None
        subclass = res.subclass_outputs if res.subclass_outputs is not None else [
            f"{i} ({type(o).__name__})" for i, o in enumerate(outs)
            if isinstance(o, torch.Tensor) and type(o) is not torch.Tensor]
        rep._record("plain tensors", subclass and f"{where}: output {', '.join(subclass)} is a tensor subclass "
                                                  "(its values can be computed when first read, not in the call)")
        late = sorted(set(res.late_outputs) | {i for i, (a, b) in enumerate(zip(seen, outs))
                                               if isinstance(a, torch.Tensor) and not bitwise_equal(a, b)})
        stream_msg = None
        if late:
            stream_msg = (f"{where}: output {late} changed after the call returned "
                          "(work the caller's stream never waited for)")
        elif running:
            stream_msg = f"{where}: thread(s) {running} still running after the call returned"
        rep._record("stream-ordered result", stream_msg)
        touched = [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and not bitwise_equal(v, snap[k])]
        rep._record("inputs untouched", touched and f"{where}: the candidate wrote into {touched}")
        tensors = [o for o in outs if isinstance(o, torch.Tensor)]
        alias = [f"input {k!r}" for k in (res.input_aliases if res.input_aliases is not None
                                          else input_aliases(outs, inputs))]
        alias += ["an earlier output" for e in self.earlier for o in tensors if overlaps(o, e)][:1]
        rep._record("no aliasing", alias and f"{where}: output shares memory with {alias[0]}")
        self.earlier = (self.earlier + tensors)[-self.keep:]
        ref = self.problem.reference(**measure.upcast(snap, torch.float32))
        err, fails = _judge(seen, ref, inputs, _tolerance(self.problem, inputs))
        rep._record(check, fails and f"{where}: {fails[0]}")
        score = rep.test if check in TEST_CHECKS else rep.validation if check in VALIDATION_CHECKS else None
        if score is not None:
            score.total += 1
            score.passed += not fails
            score.max_error = max(score.max_error, err)
        ms = res.elapsed() if (timed and res.elapsed is not None) else None
        return seen, not fails, ms, res.worker_ms


def _refill_in_place(inputs: dict, fresh: dict) -> None:
    """Copy ``fresh``'s values into ``inputs``' own tensors (same addresses, new contents).

    Float tensors always get new values: copied when the shapes match, else filled from the fresh
    tensor's values in order (same distribution; repeated if it has fewer, e.g. a KV pool of
    another size). Index tensors are only refilled when every tensor's shape matches (they must
    stay valid for the others)."""
    tensors = [k for k, v in inputs.items() if isinstance(v, torch.Tensor)]
    all_match = all(isinstance(fresh[k], torch.Tensor) and fresh[k].shape == inputs[k].shape
                    and fresh[k].dtype == inputs[k].dtype for k in tensors)
    with torch.no_grad():
        for k in tensors:
            dst, src = inputs[k], fresh[k]
            if not isinstance(src, torch.Tensor) or src.dtype != dst.dtype or dst.numel() == 0:
                continue
            if src.shape == dst.shape and (all_match or dst.is_floating_point()):
                dst.copy_(src)
            elif dst.is_floating_point() and src.numel():
                flat = src.reshape(-1)
                if flat.numel() < dst.numel():
                    flat = flat.repeat(math.ceil(dst.numel() / flat.numel()))
                dst.copy_(flat[:dst.numel()].reshape(dst.shape))


def check_calls(problem, preset: str = "auto", n_test: int = 4) -> int:
    """How many times :func:`evaluate` calls a candidate before timing it (the harness is public
    code: a candidate can count too, which is why the timing loop's outputs are checked as well)."""
    problem = _problems.get_problem(problem)
    return len(problem.validation_shapes(preset)) * len(problem.regimes) + 5 + n_test


def evaluate(candidate, problem, *, preset: str = "auto", n_test: int = 4, time_it: bool = True,
             reps: int | None = None, progress: bool = False, name: str | None = None,
             compare_best: bool = True, compare_peer: bool = True, isolate: bool = False,
             timeout_s: float = 600.0) -> Report:
    """Score ``candidate`` (callable or ``"module:function"``) on ``problem`` (name or Problem).

    ``n_test`` held-out shapes are drawn now (see the module docstring); ``time_it`` times a
    candidate that passed every check against the problem's strong peer, the reference and the
    workbook's best. ``name`` labels the candidate in the report; ``compare_best=False`` skips
    timing the workbook's best (when the candidate *is* it), ``compare_peer=False`` the strong
    peer. ``isolate=True`` runs the candidate in its own process (see :mod:`.isolate` for what it
    accepts; a call that takes longer than ``timeout_s`` ends that process and counts as a crash).
    Returns a :class:`Report`; an unavailable problem gives ``status="skipped"`` with the reason.
    Raises ``TypeError``/``ValueError`` for a candidate that cannot be resolved (or, isolated, one
    its process cannot load), an unknown problem or a bad ``n_test``.
    """
    snapshot = integrity.trusted()
    if isolate:
        payload, default_name = isolate_mode.candidate_payload(candidate)  # never imported here
        fn, imported = None, []
    else:
        settings = integrity.Settings.capture()
        snapshot.accept()
        fn, default_name = resolve_candidate(candidate)  # a "module:function" is imported now
        imported = integrity.restore_all(snapshot, settings)  # a kernel registered on import too
    name = name or default_name
    problem = _problems.get_problem(problem)
    preset = runtime.resolve_preset(preset)
    if not (isinstance(n_test, int) and n_test >= 0):
        raise ValueError(f"n_test must be a non-negative int, got {n_test!r}")
    report = Report(problem.name, name, "fail", isolated=isolate)
    missing = problem.available()
    if missing is not None:
        report.status, report.message = "skipped", missing
        return report
    invoker = isolate_mode.Worker(payload, problem, preset, timeout_s=timeout_s) if isolate else InProcess(fn)
    imported += getattr(invoker, "load_tampered", [])
    report._record("harness integrity", imported and f"importing the candidate replaced {', '.join(imported)} "
                                                     "(restored)")
    try:
        _run_phases(invoker, problem, preset, report, n_test, progress, name)
        if not report.caught_by and time_it:
            report.timing = _time_against_peers(_Session(invoker, problem, report, keep=8), problem, preset,
                                                reps, compare_best, compare_peer)
    finally:
        invoker.close()
    report.status = "pass" if not report.caught_by else "fail"
    return report


def _run_phases(invoker, problem, preset: str, report: Report, n_test: int, progress: bool, name: str) -> None:
    """The checking phases 1-5 of the module docstring."""
    sess = _Session(invoker, problem, report, keep=8)
    val_shapes = problem.validation_shapes(preset)
    steps = len(val_shapes) * len(problem.regimes) + 4 + n_test
    bar = tqdm(total=steps, desc=f"{problem.name}: {name}", leave=False, disable=not progress)

    def make(shape, regime="normal"):
        return problem.make_inputs(shape, fresh_seed(), regime)

    for shape in val_shapes:
        sess.call(make(shape), "validation shapes", f"validation {shape}")
        bar.update()
        for regime in problem.regimes[1:]:
            sess.call(make(shape, regime), "value regimes", f"{regime} values at {shape}")
            bar.update()
    shape = val_shapes[0]
    sess.call(make(shape), "fresh inputs", f"first call at {shape}")
    inputs = make(shape)
    sess.call(inputs, "fresh inputs", f"new tensors at {shape}")
    _refill_in_place(inputs, make(shape))
    sess.call(inputs, "fresh inputs", f"same tensors refilled in place at {shape}")
    bar.update(3)
    first, ok1, _, _ = sess.call(inputs, "repeat calls agree", f"repeat 1 at {shape}")
    second, ok2, _, _ = sess.call(inputs, "repeat calls agree", f"repeat 2 at {shape}")
    if first is not None and second is not None and ok1 and ok2:
        diff, fails = measure.compare_outputs(second, first, tol=_tolerance(problem, inputs))
        if fails:
            report._fail("repeat calls agree", f"two calls on the same inputs differ: {fails[0]}")
    bar.update()
    for i in range(n_test):
        regime = "normal" if i == 0 else secrets.choice(problem.regimes)  # one plain draw at least
        held_out = _draw_held_out(problem, preset)
        report.held_out_shapes.append(dict(held_out))
        sess.call(make(held_out, regime), "held-out shapes", f"held-out #{i} {held_out} ({regime})")
        bar.update()
    bar.close()


# --------------------------------------------------------------------------- timing


def _timed_slots(sets: list[dict], reps: int, refill: Callable[[dict], None] | None,
                 prepare: Callable[[dict], dict] | None = None):
    """``(arguments, fresh)`` for each timed call: even calls get fresh values (``refill`` in
    place), odd calls repeat the inputs of the call before; ``prepare(inputs)`` (untimed) turns the
    inputs into the arguments (a peer's own layout); the device cache is flushed after that, before
    every call.

    Odd calls refill a scratch copy instead, so the same work precedes both kinds of call: a refill
    before the fresh calls only would be a difference between the two that is not the candidate's."""
    scratch = [clone_inputs(s) for s in sets] if refill is not None else []
    for k in range(reps):
        i = (k // 2) % len(sets)
        inputs = sets[i]
        fresh = k % 2 == 0
        if refill is not None:
            refill(inputs if fresh else scratch[i])
        args = prepare(inputs) if prepare is not None else inputs
        flush_device_cache(inputs)
        if runtime.DEVICE == "cuda":
            torch.cuda.synchronize()  # the refill, the layout and the flush are done before the clock starts
        yield args, fresh


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _spread(xs: list[float]) -> dict:
    """``p20_ms`` and ``p80_ms`` of the times ``xs`` (nearest rank, as :func:`minimax_lab.measure.time_fn`
    reports them), or nothing for no times."""
    if not xs:
        return {}
    s = sorted(xs)
    pick = lambda q: s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]  # noqa: E731
    return {"p20_ms": pick(0.2), "p80_ms": pick(0.8)}


def time_calls(fn: Callable, sets: list[dict], *, reps: int, warmup: int,
               refill: Callable[[dict], None] | None = None, prepare: Callable[[dict], dict] | None = None) -> dict:
    """Time trusted code ``fn`` (a reference, a peer, the workbook's best) the way candidates are
    timed, without the checks: ``reps`` calls over ``sets``, each alone (cache flushed, everything
    synchronized in between), even calls after ``refill(inputs)`` (if given), odd calls on the
    same inputs again; ``fn(**prepare(inputs))`` where ``prepare`` (untimed) is given. Returns
    ``ms`` (median over the fresh calls) with their ``p20_ms`` and ``p80_ms``, ``seen_ms`` (median
    over the repeated ones, None for ``reps < 2``) and ``method``."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    for i in range(warmup):
        s = sets[i % len(sets)]
        fn(**(prepare(s) if prepare is not None else s))
    synchronize()
    fresh, seen = [], []
    clock = _clock_for(sets[0])
    for args, is_fresh in _timed_slots(sets, reps, refill, prepare):
        t0 = clock.start()
        fn(**args)
        elapsed = clock.stop(t0)
        synchronize()
        (fresh if is_fresh else seen).append(elapsed())
    return {"ms": _median(fresh), **_spread(fresh), "seen_ms": _median(seen), "method": clock.method}


def _floor_ms(flops: float | None, nbytes: float | None, cold: bool) -> float | None:
    """:data:`FLOOR_SLACK` x the time the device's measured ceilings need for ``flops`` and (when
    the data comes from memory, not a cache) ``nbytes``; None without a traffic model."""
    if flops is None and nbytes is None:
        return None
    c = measure.ceilings()
    t = (flops or 0.0) / (c.gemm_tflops * 1e12)
    if cold and nbytes:
        t = max(t, nbytes / (c.copy_gbps * 1e9))
    return FLOOR_SLACK * t * 1e3


def _noise_ms(on_gpu: bool) -> float:
    """Differences below this are timing noise, not evidence (per-call times, medians)."""
    return 0.005 if on_gpu else 0.05


def refuse_shortcut(problem, shape: dict) -> None:
    """Raise ``ValueError`` when ``problem``'s implementation takes a path that is not its kernel
    at ``shape`` (``Problem.shortcut``): timing it there would not time the kernel."""
    reason = problem.shortcut(shape)
    if reason is not None:
        raise ValueError(f"{problem.name}: the timing shape {shape} takes a shortcut ({reason}); "
                         "timing it would not time the kernel")


def _time_candidate(sess: _Session, problem, shape: dict, sets: list[dict], refill, reps: int, warmup: int,
                    on_gpu: bool) -> dict:
    """Time the candidate through the session, so every timed call is judged too; fills the
    timing checks of the report."""
    rep, inv = sess.report, sess.invoker
    inv.prepare_timing(sets)
    for i in range(warmup):
        sess.call(sets[i % len(sets)], "checked while timed", f"warm-up call {i}")
    for s in sets:  # the warm-up saw these values: timed calls get new ones
        refill(s)
    fresh_ms, seen_ms, worker_ms, both, pairs = [], [], [], [], []
    last_fresh = None
    for k, (inputs, fresh) in enumerate(_timed_slots(sets, reps, refill)):
        _, _, ms, wms = sess.call(inputs, "checked while timed",
                                  f"timed call {k} ({'fresh' if fresh else 'repeated'} inputs)", timed=True)
        if ms is not None:
            (fresh_ms if fresh else seen_ms).append(ms)
            if not fresh and last_fresh is not None:
                pairs.append((last_fresh, ms))
        last_fresh = ms if fresh else None
        if wms is not None and fresh:
            worker_ms.append(wms)
        if ms is not None and wms is not None:
            both.append((ms, wms))
    ms, seen = _median(fresh_ms), _median(seen_ms)
    out = {"ms": ms, **_spread(fresh_ms), "seen_ms": seen, "method": (inv.method_note or _clock_for(sets[0]).method)}
    if ms is None:  # every timed call crashed: already failed above
        return out
    resolution = max(inv.resolution_ms, _noise_ms(on_gpu))
    flops, nbytes = problem.traffic(**sets[0]) if problem.traffic else (None, None)
    floor = _floor_ms(flops, nbytes, cold=on_gpu)
    out.update(flops=flops, bytes=nbytes, floor_ms=floor, resolution_ms=resolution)
    impossible = ms <= 0 or (floor is not None and ms < floor)
    resolvable = not inv.isolated or ms > resolution  # isolated: below the round trip's noise, say nothing
    rep._record("physically possible time", impossible and resolvable and (
        f"{ms:.4g} ms per call, below the floor of {floor or 0:.3g} ms that {flops or 0:.3g} FLOPs and "
        f"{nbytes or 0:.3g} bytes need at {FLOOR_SLACK:g}x the device's measured ceilings"))
    # not the medians: on a shared machine, other work that slows a few calls moves a median of a
    # handful of calls far. A cache that answers repeated inputs is fast on every repeat, so it shows
    # in (almost) every pair of calls and in the fastest call of each kind; a busy machine, which only
    # ever adds time, rarely does both
    def faster(seen_t, fresh_t):
        return seen_t < SEEN_INPUT_RATIO * fresh_t and fresh_t - seen_t > resolution
    fastest_fresh, fastest_seen = min(fresh_ms), (min(seen_ms) if seen_ms else None)
    pairs_faster = sum(faster(s, f) for f, s in pairs)
    faster_seen = (fastest_seen is not None and len(pairs) >= SEEN_INPUT_MIN_PAIRS
                   and faster(fastest_seen, fastest_fresh) and pairs_faster >= SEEN_INPUT_PAIRS * len(pairs))
    rep._record("fresh-input speed", faster_seen and (
        f"{fastest_seen:.4g} ms on inputs it had just seen vs {fastest_fresh:.4g} ms on fresh ones (the "
        f"fastest calls); repeated inputs ran in under {SEEN_INPUT_RATIO:g}x the fresh call before in "
        f"{pairs_faster} of {len(pairs)} pairs"))
    if inv.isolated:
        # a time within the round trip's resolution of zero (even below it) says only "fast": the
        # report and the record say so instead of showing the difference as a speed
        out.update(worker_ms=_median(worker_ms), overhead_ms=inv.overhead_ms, below_resolution=ms <= resolution)
        rep._record("clock agrees", inv.clock_disagreement(both, resolution))
    return out


def _time_strong_peer(peer, problem, sets: list[dict], reps: int, warmup: int, refill) -> dict:
    """The strong peer's time, after one call checked against the reference (a peer that computes
    the problem's contract must get it right, or it is no peer); ``strong_peer_error`` says why
    there is no time."""
    out = {"strong_peer": peer.name, "strong_peer_note": peer.note, "strong_peer_ms": None}
    try:
        if peer.same_contract:
            got = peer.run(**peer.prepare(sets[0]))
            synchronize()
            ref = problem.reference(**measure.upcast(sets[0], torch.float32))
            _, fails = _judge(as_tuple(got), ref, sets[0], _tolerance(problem, sets[0]))
            if fails:
                return {**out, "strong_peer_error": f"wrong on the timing inputs: {fails[0]}"}
        t = time_calls(peer.run, sets, reps=reps, warmup=warmup, refill=refill, prepare=peer.prepare)
    except Exception as e:  # noqa: BLE001 - a peer that does not run here is reported, not fatal
        return {**out, "strong_peer_error": f"raised {type(e).__name__}: {e}"}
    return {**out, "strong_peer_ms": t["ms"], "strong_peer_p20_ms": t.get("p20_ms"),
            "strong_peer_p80_ms": t.get("p80_ms")}


def _time_against_peers(sess: _Session, problem, preset, reps: int | None, compare_best: bool = True,
                        compare_peer: bool = True) -> dict:
    shape = dict(problem.timing_shape(preset))
    refuse_shortcut(problem, shape)
    on_gpu = runtime.DEVICE == "cuda" and not runtime.is_interpreter()
    reps = reps or (30 if on_gpu else 6)
    warmup = 3 if on_gpu else 1

    def refill(inputs):
        _refill_in_place(inputs, problem.make_inputs(shape, fresh_seed(), "normal"))

    sets = [problem.make_inputs(shape, fresh_seed(), "normal") for _ in range(2)]
    mine = _time_candidate(sess, problem, shape, sets, refill, reps, warmup, on_gpu)
    sess.earlier.clear()
    if mine["ms"] is None:
        mine["ms"] = math.nan
    peer = problem.strong_peer() if compare_peer else None
    strong = _time_strong_peer(peer, problem, sets, reps, warmup, refill) if peer is not None else {}
    ref_reps = reps if on_gpu else max(2, reps // 3)
    ref = time_calls(problem.reference, sets, reps=ref_reps, warmup=warmup, refill=refill)
    best_fn = problem.best() if compare_best else None
    best = time_calls(best_fn, sets, reps=reps, warmup=warmup, refill=refill) if best_fn is not None else None
    dtype = expected_dtype(sets[0])
    return {**mine, **strong, "shape": shape, "dtype": str(dtype).replace("torch.", "") if dtype else None,
            "speedup_vs_strong_peer": speedup(strong.get("strong_peer_ms"), mine["ms"]),
            "reference_ms": ref["ms"], "reference_p20_ms": ref.get("p20_ms"), "reference_p80_ms": ref.get("p80_ms"),
            "best_ms": best["ms"] if best else None,
            "speedup_vs_reference": speedup(ref["ms"], mine["ms"]),
            "speedup_vs_best": speedup(best["ms"], mine["ms"]) if best else None,
            "input_sets": len(sets), "reps": reps}


def _peer_words(t: dict) -> list[str]:
    """``'<peer> 0.1 ms (1.3x)'`` for the strong peer, the reference and the best, in that order."""
    out = []
    for label, key in ((f"strong peer {t.get('strong_peer')}", "strong_peer"), ("reference", "reference"),
                       ("best", "best")):
        ms, ratio = t.get(f"{key}_ms"), t.get(f"speedup_vs_{key}")
        if ms:
            out.append(f"{label} {ms:.4g} ms ({ratio:.2f}x)")
    return out


# the record every call is checked against: taken once everything the judging reaches is imported
integrity.trusted(_problems.PROBLEMS)
