"""The harness: score a candidate kernel so that being right and fast is the only way to score well.

    report = evaluate(candidate, "softmax")          # candidate: a callable or "pkg.mod:fn"
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
6. **timing** (only if everything above passed) -- at the problem's timing shape, rotating input
   sets (more bytes than twice the L2 cache when memory allows), CUDA events, and a *full*
   device synchronize that also waits for streams the candidate made itself; the reference and
   the workbook's best implementation are timed the same way. The outputs made inside the timing
   loop are checked too (**checked while timed**).

And on every single call:

* outputs are judged from a copy taken *on the caller's stream right after the call returns*
  (before any synchronize); if that copy differs from the output after a full synchronize, work
  escaped the stream (**stream-ordered result**);
* freed memory is poisoned with NaN first (``bench.poison_``), so unwritten elements fail;
* outputs must share no memory with the inputs or with earlier outputs (**no aliasing**), the
  inputs must come back unchanged (**inputs untouched**);
* the reference runs only *after* the candidate returned, on a copy of the inputs, so there is
  no expected answer to find; frame walking and garbage-collector scans during the call are
  caught with audit hooks (**no introspection**), and the judging functions (``torch.allclose``,
  the harness's own comparisons, ...) are checked for replacement and restored (**harness integrity**).

Validation and test (held-out) scores are reported apart; right on validation but wrong on test
is flagged ``overfit``. An in-process harness cannot stop a determined hostile candidate (it can
patch anything in the interpreter); a bench for untrusted code runs each candidate in a separate
process. This one catches the hacks people and models actually try, and says which check did.
"""
from __future__ import annotations

import dataclasses
import importlib
import math
import os
import random
import secrets
import sys
import sysconfig
import threading
import time
from typing import Any, Callable

import torch

from minimax_lab import bench, runtime
from minimax_lab.kernelbench import problems as _problems

#: check name -> what it demands (in the order they are reported)
CHECKS: dict[str, str] = {
    "validation shapes": "right on every public validation shape (normal inputs, fresh seed each call)",
    "value regimes": "right on harder values: sharp logits, tiny or large magnitudes",
    "fresh inputs": "right when called again with new tensors, and with the same tensors refilled in place",
    "repeat calls agree": "the same inputs twice give the same answer",
    "held-out shapes": "right on shapes drawn at evaluation time from os.urandom, never stored before the call",
    "no aliasing": "outputs share no memory with the inputs or with any earlier output",
    "inputs untouched": "the inputs come back unchanged",
    "stream-ordered result": "the output read on the caller's stream right after return equals the output after a full synchronize",
    "no introspection": "no walking of the caller's frames or the garbage collector during the call",
    "harness integrity": "the functions that judge (torch.allclose, the harness's own comparisons, ...) are unchanged afterwards",
    "checked while timed": "outputs produced inside the timing loop are right too",
}
#: the checks whose failures count against the validation score / the test score
VALIDATION_CHECKS = ("validation shapes", "value regimes", "fresh inputs", "repeat calls agree")
TEST_CHECKS = ("held-out shapes",)


# --------------------------------------------------------------------------- synchronize & side work

_side_work: list[threading.Thread] = []
_side_lock = threading.Lock()


def launch_side_work(fn: Callable[[], Any]) -> threading.Thread:
    """The CPU's stand-in for launching work on a side stream: run ``fn`` in a thread.

    The CPU has no asynchronous device, so a thread plays the side stream and
    :func:`synchronize` plays ``torch.cuda.synchronize()`` (it waits for every such thread).
    """
    t = threading.Thread(target=fn, daemon=True)
    with _side_lock:
        _side_work.append(t)
    t.start()
    return t


def synchronize() -> None:
    """Wait for *all* device work: every CUDA stream (device-wide), and on the CPU every
    :func:`launch_side_work` thread."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    while True:
        with _side_lock:
            pending = list(_side_work)
            _side_work.clear()
        if not pending:
            return
        for t in pending:
            t.join()


# --------------------------------------------------------------------------- candidates


def resolve_candidate(candidate) -> tuple[Callable, str]:
    """``(callable, name)`` from a callable or a ``"package.module:function"`` string."""
    if callable(candidate):
        return candidate, getattr(candidate, "__name__", type(candidate).__name__)
    if isinstance(candidate, str):
        if candidate.count(":") != 1:
            raise ValueError(f"a candidate path looks like 'package.module:function', got {candidate!r}")
        mod, attr = candidate.split(":")
        fn = getattr(importlib.import_module(mod), attr, None)
        if not callable(fn):
            raise ValueError(f"{candidate!r}: module {mod!r} has no callable {attr!r}")
        return fn, candidate
    raise TypeError(f"candidate must be a callable or a 'module:function' string, got {type(candidate).__name__}")


# --------------------------------------------------------------------------- introspection watch

_SPY_EVENTS = frozenset({"sys._getframe", "sys._current_frames", "gc.get_objects", "gc.get_referrers",
                         "gc.get_referents", "sys.settrace", "sys.setprofile"})
_STDLIB = (os.path.realpath(sysconfig.get_paths()["stdlib"]),)
_watch_state = threading.local()
_watch_log: list[str] | None = None  # set only while a candidate runs


def _library_file(filename: str) -> bool:
    return "site-packages" in filename or "dist-packages" in filename


def _audit_hook(event: str, args) -> None:
    log = _watch_log
    if log is None or event not in _SPY_EVENTS or getattr(_watch_state, "busy", False):
        return
    _watch_state.busy = True
    try:
        f = sys._getframe(1)
        while f is not None and os.path.realpath(f.f_code.co_filename).startswith(_STDLIB):
            f = f.f_back  # inspect.stack(), logging, ... : blame whoever called them
        where = f"{f.f_code.co_filename}:{f.f_lineno}" if f is not None else "?"
        if f is None or not _library_file(f.f_code.co_filename):  # torch/triton internals are not the candidate
            log.append(f"{event} from {where}")
    finally:
        _watch_state.busy = False


sys.addaudithook(_audit_hook)  # audit hooks cannot be removed; this one is idle unless a call is watched


# --------------------------------------------------------------------------- integrity


def _judges() -> dict[str, tuple[Any, str]]:
    """The objects the harness (and the naive harness) judge with: name -> (owner, attribute)."""
    return {
        "torch.allclose": (torch, "allclose"), "torch.equal": (torch, "equal"),
        "torch.isfinite": (torch, "isfinite"), "torch.linalg.vector_norm": (torch.linalg, "vector_norm"),
        "torch.testing.assert_close": (torch.testing, "assert_close"),
        "torch.Tensor.clone": (torch.Tensor, "clone"), "torch.Tensor.to": (torch.Tensor, "to"),
        "torch.cuda.synchronize": (torch.cuda, "synchronize"), "time.perf_counter": (time, "perf_counter"),
        "bench.relative_error": (bench, "relative_error"), "bench.compare_outputs": (bench, "compare_outputs"),
        "bench.poison_": (bench, "poison_"), "secrets.randbits": (secrets, "randbits"),
        "secrets.choice": (secrets, "choice"), "os.urandom": (os, "urandom"), "random.Random": (random, "Random"),
        **{f"harness.{f}": (sys.modules[__name__], f) for f in ("_judge", "_draw_held_out",
                                                                "_bitwise_equal", "_overlaps", "synchronize")},
    }




def _fields(p) -> tuple:
    return tuple(getattr(p, f.name) for f in dataclasses.fields(p))




def restore_tampering() -> list[str]:
    """Put back every judging function a candidate replaced; returns the names restored."""
    restored = []
    for name, (owner, attr) in _judges().items():
        if getattr(owner, attr) is not _ORIGINALS[name]:
            setattr(owner, attr, _ORIGINALS[name])
            restored.append(name)
    for name, fields in _PROBLEM_FIELDS.items():
        p = _problems.PROBLEMS.get(name)
        if p is None or any(a is not b for a, b in zip(_fields(p), fields)):
            restored.append(f"problems.PROBLEMS[{name!r}]")
            if p is None:
                continue
            for f, v in zip(dataclasses.fields(p), fields):
                object.__setattr__(p, f.name, v)
    return restored


# --------------------------------------------------------------------------- small tensor helpers


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _clone_inputs(inputs: dict) -> dict:
    return {k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits (so NaN == NaN; works for every dtype, fp8 included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.detach().reshape(-1).view(torch.uint8), b.detach().reshape(-1).view(torch.uint8))


def _span(t: torch.Tensor) -> tuple[str, int, int] | None:
    s = t.untyped_storage()
    return (str(t.device), s.data_ptr(), s.data_ptr() + s.nbytes()) if s.nbytes() else None


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    sa, sb = _span(a), _span(b)
    return bool(sa and sb and sa[0] == sb[0] and sa[1] < sb[2] and sb[1] < sa[2])


def _poison_free_memory(example: dict) -> None:
    """Fill recently freed memory with NaN so a candidate's ``torch.empty`` starts out poisoned
    (GPU: the caching allocator's blocks; CPU: best effort, malloc often hands the block back)."""
    dev = next((v.device for v in example.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))
    nbytes = max(1 << 16, 2 * bench._nbytes(example))
    if dev.type == "cuda":
        bench._poison_allocator(dev, min(nbytes, 2 << 30))
    else:
        junk = bench.poison_(torch.empty(min(nbytes, 64 << 20) // 4, dtype=torch.float32))
        del junk


def _expected_dtype(inputs: dict) -> torch.dtype | None:
    """Float outputs must come back in the dtype of the first floating input (returning a lower
    precision than asked would also loosen the tolerance)."""
    return next((v.dtype for v in inputs.values() if isinstance(v, torch.Tensor) and v.is_floating_point()
                 and v.dtype.itemsize >= 2), None)


def _tolerance(problem, inputs: dict) -> float:
    if problem.tol is not None:
        return problem.tol
    dt = _expected_dtype(inputs)
    return bench.tolerance_for(dt) if dt is not None else 0.0


def _judge(outs: tuple, ref, inputs: dict, tol: float) -> tuple[float, list[str]]:
    exp_dt = _expected_dtype(inputs)
    refs = _as_tuple(ref)
    bad = [f"output {i} has dtype {str(o.dtype)[6:]}, expected {str(exp_dt)[6:]}"
           for i, (o, r) in enumerate(zip(outs, refs))
           if isinstance(o, torch.Tensor) and r.is_floating_point() and exp_dt is not None and o.dtype != exp_dt]
    err, fails = bench.compare_outputs(outs, refs, tol=tol)
    return (math.inf if bad else err), bad + fails


# --------------------------------------------------------------------------- report


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
    """What :func:`evaluate` found. ``status``: ``"pass"``, ``"fail"`` or ``"skipped"``."""

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

    def summary(self) -> str:
        head = f"{self.status.upper()} {self.candidate} on {self.problem}"
        if self.status == "skipped":
            return f"{head}: {self.message}"
        lines = [f"{head}: validation {self.validation}, test {self.test}" + ("  ** OVERFIT **" if self.overfit else "")]
        for c in self.caught_by:
            lines.append(f"  caught by '{c}': {self.failures[c][0]}")
        if self.timing:
            t = self.timing
            best = f", best {t['best_ms']:.4g} ms ({t['speedup_vs_best']:.2f}x)" if t.get("best_ms") else ""
            lines.append(f"  time {t['ms']:.4g} ms vs reference {t['reference_ms']:.4g} ms "
                         f"({t['speedup_vs_reference']:.2f}x){best}; {t['method']}")
        return "\n".join(lines)

    def to_records(self, suite: str = "kernelbench") -> list[dict]:
        """One ``bench`` record (needs a timing): ms, shape, peers (reference, best), checks."""
        if not self.timing:
            return []
        t = self.timing
        peers = {"reference": t["reference_ms"]}
        if t.get("best_ms"):
            peers["best"] = t["best_ms"]
        p = _problems.get_problem(self.problem)
        flops, nbytes = p.cost(t["shape"]) if p.cost else (None, None)
        return [bench.make_record(
            suite, self.problem, self.candidate, t["ms"], shape=t["shape"], dtype=t.get("dtype"),
            flops=flops, bytes_moved=nbytes, peers=peers,
            extra={"status": self.status, "validation": str(self.validation), "test": str(self.test),
                   "overfit": self.overfit, "caught_by": self.caught_by, "event_median_ms": t["event_median_ms"],
                   "timing_method": t["method"], "input_sets": t["input_sets"]})]


# --------------------------------------------------------------------------- evaluate


def _draw_held_out(problem, preset: str) -> dict:
    """One held-out shape from a generator seeded by os.urandom; the generator dies here."""
    return dict(problem.draw_test_shape(random.Random(secrets.randbits(128)), preset))


def _fresh_seed() -> int:
    return secrets.randbits(62)


class _Session:
    """The per-evaluation state: the report being filled, and the outputs kept alive so later
    outputs can be checked for aliasing them. Holds nothing about future shapes."""

    def __init__(self, fn, problem, report, keep: int):
        self.fn, self.problem, self.report, self.keep = fn, problem, report, keep
        self.earlier: list[torch.Tensor] = []

    def call(self, inputs: dict, check: str, where: str):
        """Run the candidate once on ``inputs`` and judge it; returns (outputs, correct)."""
        global _watch_log
        rep = self.report
        snap = _clone_inputs(inputs)
        _poison_free_memory(inputs)
        log: list[str] = []
        _watch_log = log
        crash = None
        try:
            out = self.fn(**inputs)
        except Exception as e:  # a crash is a wrong answer, not a harness error
            crash, out = e, None
        finally:
            _watch_log = None
        outs = _as_tuple(out)
        seen = tuple(o.detach().clone() if isinstance(o, torch.Tensor) else o for o in outs)  # caller's stream, now
        synchronize()
        tampered = restore_tampering()
        if tampered:
            rep._fail("harness integrity", f"{where}: candidate replaced {', '.join(tampered)} (restored)")
        else:
            rep._ok("harness integrity")
        if log:
            rep._fail("no introspection", f"{where}: {log[0]}" + (f" (+{len(log) - 1} more)" if len(log) > 1 else ""))
        else:
            rep._ok("no introspection")
        if crash is not None:
            rep._fail(check, f"{where}: raised {type(crash).__name__}: {crash}")
            return None, False
        late = [i for i, (a, b) in enumerate(zip(seen, outs)) if isinstance(a, torch.Tensor) and not _bitwise_equal(a, b)]
        if late:
            rep._fail("stream-ordered result", f"{where}: output {late} changed after the call returned "
                                               "(work the caller's stream never waited for)")
        else:
            rep._ok("stream-ordered result")
        touched = [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and not _bitwise_equal(v, snap[k])]
        if touched:
            rep._fail("inputs untouched", f"{where}: the candidate wrote into {touched}")
        else:
            rep._ok("inputs untouched")
        tensors = [o for o in outs if isinstance(o, torch.Tensor)]
        alias = [f"input {k!r}" for k, v in inputs.items() if isinstance(v, torch.Tensor)
                 for o in tensors if _overlaps(o, v)]
        alias += ["an earlier output" for e in self.earlier for o in tensors if _overlaps(o, e)][:1]
        if alias:
            rep._fail("no aliasing", f"{where}: output shares memory with {alias[0]}")
        else:
            rep._ok("no aliasing")
        self.earlier = (self.earlier + tensors)[-self.keep:]
        ref = self.problem.reference(**bench._upcast(snap, torch.float32))
        err, fails = _judge(seen, ref, inputs, _tolerance(self.problem, inputs))
        if fails:
            rep._fail(check, f"{where}: {fails[0]}")
        else:
            rep._ok(check)
        score = rep.test if check in TEST_CHECKS else rep.validation if check in VALIDATION_CHECKS else None
        if score is not None:
            score.total += 1
            score.passed += not fails
            score.max_error = max(score.max_error, err)
        return seen, not fails


def _refill_in_place(inputs: dict, fresh: dict) -> None:
    """Copy ``fresh``'s values into ``inputs``' own tensors (same addresses, new contents).
    Index tensors are only refilled when every tensor's shape matches (they must stay valid)."""
    tensors = [k for k, v in inputs.items() if isinstance(v, torch.Tensor)]
    all_match = all(isinstance(fresh[k], torch.Tensor) and fresh[k].shape == inputs[k].shape
                    and fresh[k].dtype == inputs[k].dtype for k in tensors)
    with torch.no_grad():
        for k in tensors:
            same = fresh[k].shape == inputs[k].shape and fresh[k].dtype == inputs[k].dtype
            if same and (all_match or inputs[k].is_floating_point()):
                inputs[k].copy_(fresh[k])


def check_calls(problem, preset: str = "auto", n_test: int = 4) -> int:
    """How many times :func:`evaluate` calls a candidate before timing it (the harness is public
    code: a candidate can count too, which is why the timing loop's outputs are checked as well)."""
    problem = _problems.get_problem(problem)
    return len(problem.validation_shapes(preset)) * len(problem.regimes) + 5 + n_test


def evaluate(candidate, problem, *, preset: str = "auto", n_test: int = 4, time_it: bool = True,
             reps: int | None = None, progress: bool = False, name: str | None = None,
             compare_best: bool = True) -> Report:
    """Score ``candidate`` (callable or ``"module:function"``) on ``problem`` (name or Problem).

    ``n_test`` held-out shapes are drawn now (see the module docstring); ``time_it`` times a
    candidate that passed every check against the reference and the workbook's best.
    ``name`` labels the candidate in the report; ``compare_best=False`` skips timing the
    workbook's best (when the candidate *is* it).
    Returns a :class:`Report`; an unavailable problem gives ``status="skipped"`` with the reason.
    """
    fn, default_name = resolve_candidate(candidate)
    name = name or default_name
    problem = _problems.get_problem(problem)
    preset = runtime.resolve_preset(preset)
    if not (isinstance(n_test, int) and n_test >= 0):
        raise ValueError(f"n_test must be a non-negative int, got {n_test!r}")
    report = Report(problem.name, name, "fail")
    missing = problem.available()
    if missing is not None:
        report.status, report.message = "skipped", missing
        return report
    restore_tampering()
    sess = _Session(fn, problem, report, keep=8)
    val_shapes = problem.validation_shapes(preset)
    steps = len(val_shapes) * len(problem.regimes) + 4 + n_test
    bar = _progress(steps, f"{problem.name}: {name}", progress)

    def make(shape, regime="normal"):
        return problem.make_inputs(shape, _fresh_seed(), regime)

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
    first, ok1 = sess.call(inputs, "repeat calls agree", f"repeat 1 at {shape}")
    second, ok2 = sess.call(inputs, "repeat calls agree", f"repeat 2 at {shape}")
    if first is not None and second is not None and ok1 and ok2:
        diff, fails = bench.compare_outputs(second, first, tol=_tolerance(problem, inputs))
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
    del inputs, first, second
    sess.earlier.clear()
    if not report.caught_by and time_it:
        report.timing = _time_against_peers(fn, problem, preset, report, reps, compare_best)
    report.status = "pass" if not report.caught_by else "fail"
    return report


class _NoBar:
    def update(self, n=1):
        pass

    def close(self):
        pass


def _progress(total: int, desc: str, on: bool):
    if not on:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        return _NoBar()
    return tqdm(total=total, desc=desc, leave=False)


# --------------------------------------------------------------------------- timing


def _input_sets(problem, shape: dict, on_gpu: bool) -> list[dict]:
    """Enough fresh input sets that one pass over them reads more than twice the L2 cache
    (at most 16 on a GPU, 8 GiB in all; 2 on the CPU, where the interpreter is slow anyway)."""
    first = problem.make_inputs(shape, _fresh_seed(), "normal")
    per_set = max(1, bench._nbytes(first))
    if on_gpu:
        want = min(16, max(2, math.ceil(2 * runtime.l2_cache_bytes() / per_set)), max(1, (8 << 30) // per_set))
    else:
        want = 2
    return [first] + [problem.make_inputs(shape, _fresh_seed(), "normal") for _ in range(want - 1)]


def time_calls(fn: Callable, sets: list[dict], *, reps: int, warmup: int) -> dict:
    """Time ``fn`` over rotating ``sets``.

    Returns ``ms`` (mean per call of a loop of ``reps`` calls closed by a *device-wide*
    synchronize, so work on any stream counts), ``event_median_ms`` (median of per-call CUDA
    events on the caller's stream; wall clock on the CPU), and ``outputs`` (the last output made
    for each set, for checking)."""
    on_gpu = any(isinstance(v, torch.Tensor) and v.is_cuda for v in sets[0].values())
    outs: list = [None] * len(sets)
    for i in range(warmup):
        fn(**sets[i % len(sets)])
    synchronize()
    per_call = []
    if on_gpu:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            starts[i].record()
            fn(**sets[i % len(sets)])
            ends[i].record()
        synchronize()
        per_call = [a.elapsed_time(b) for a, b in zip(starts, ends)]
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for i in range(reps):
            outs[i % len(sets)] = fn(**sets[i % len(sets)])
        synchronize()  # every stream, not just the caller's
        end.record()
        end.synchronize()
        loop_ms = begin.elapsed_time(end) / reps
    else:
        t_loop = time.perf_counter()
        for i in range(reps):
            t0 = time.perf_counter()
            outs[i % len(sets)] = fn(**sets[i % len(sets)])
            synchronize()
            per_call.append((time.perf_counter() - t0) * 1e3)
        loop_ms = (time.perf_counter() - t_loop) * 1e3 / reps
    per_call.sort()
    return {"ms": loop_ms, "event_median_ms": per_call[len(per_call) // 2], "outputs": outs,
            "method": ("CUDA events around a loop closed by a device-wide synchronize" if on_gpu
                       else "wall clock with synchronize (CPU: interpreter, not a speed)")}


def _time_against_peers(fn, problem, preset, report: Report, reps: int | None, compare_best: bool = True) -> dict:
    shape = dict(problem.timing_shape(preset))
    sets = _input_sets(problem, shape, runtime.DEVICE == "cuda" and not runtime.is_interpreter())
    on_gpu = any(isinstance(v, torch.Tensor) and v.is_cuda for v in sets[0].values())
    reps = reps or (30 if on_gpu else 3)
    warmup = 3 if on_gpu else 1
    global _watch_log
    log: list[str] = []
    _watch_log = log
    try:
        mine = time_calls(fn, sets, reps=reps, warmup=warmup)
    finally:
        _watch_log = None
    if log:
        report._fail("no introspection", f"while timed: {log[0]}")
    tampered = restore_tampering()
    if tampered:
        report._fail("harness integrity", f"while timed: candidate replaced {', '.join(tampered)}")
    # checked while timed: every output the timing loop kept must be right for its own set
    tol = _tolerance(problem, sets[0])
    outs = [o for o in mine.pop("outputs")]
    bad = []
    for j, (s, o) in enumerate(zip(sets, outs)):
        if o is None:
            continue
        _, fails = _judge(_as_tuple(o), problem.reference(**bench._upcast(s, torch.float32)), s, tol)
        if fails:
            bad.append(f"set {j}: {fails[0]}")
        others = [t for k, p in enumerate(outs) if k != j and p is not None for t in _as_tuple(p)
                  if isinstance(t, torch.Tensor)]
        if any(_overlaps(a, b) for a in _as_tuple(o) if isinstance(a, torch.Tensor) for b in others):
            bad.append(f"set {j}: output shares memory with another set's output")
    if bad:
        report._fail("checked while timed", bad[0])
    else:
        report._ok("checked while timed")
    del outs
    ref = time_calls(problem.reference, sets, reps=max(2, reps // 3) if not on_gpu else reps, warmup=warmup)
    ref.pop("outputs")
    best_fn = problem.best() if compare_best else None
    best = None
    if best_fn is not None:
        best = time_calls(best_fn, sets, reps=reps, warmup=warmup)
        best.pop("outputs")
    dtype = _expected_dtype(sets[0])
    return {"shape": shape, "dtype": str(dtype).replace("torch.", "") if dtype else None,
            "ms": mine["ms"], "event_median_ms": mine["event_median_ms"], "reference_ms": ref["ms"],
            "best_ms": best["ms"] if best else None,
            "speedup_vs_reference": ref["ms"] / mine["ms"],
            "speedup_vs_best": (best["ms"] / mine["ms"]) if best else None,
            "method": mine["method"], "input_sets": len(sets), "reps": reps}


# captured last, once everything above exists: what restore_tampering() puts back
_ORIGINALS = {name: getattr(owner, attr) for name, (owner, attr) in _judges().items()}
_PROBLEM_FIELDS = {name: _fields(p) for name, p in _problems.PROBLEMS.items()}
