"""Isolated mode: the candidate runs in its own process; the clock and the judging stay here.

    report = harness.evaluate("my_pkg.kernels:softmax", "softmax", isolate=True)

:class:`Worker` spawns one process per evaluation (``multiprocessing``'s "spawn": a fresh
interpreter, and on a GPU its own CUDA context) and talks to it over a pipe. Tensors travel
through shared memory (``torch.multiprocessing``: CPU tensors in shared-memory files, CUDA tensors
by IPC handle), so inputs refilled in place here are seen there, and outputs the candidate writes
after it returned are seen here. What runs where:

* **here**: the input draws (held-out shapes included), the reference, every comparison, the
  cache flush before timed calls, and the clock that scores -- this process's wall clock from
  sending a call until it holds its own copy of the outputs (the copy it judges), less the round
  trip;
* **there**: the candidate, and small trusted code loaded before it: a loop that calls it, copies
  its outputs on the caller's stream right after it returns, then waits for everything (every
  stream of the device, the candidate's threads) before replying, and reads its own clock around
  all that. What that loop reports (introspection, tampering, outputs that changed after the
  return, threads still running, tensor subclasses, outputs aliasing inputs, the candidate's own
  clock) can only ever fail a candidate: one that silences the reports still faces every check
  made here.

What the time guarantees: whatever the candidate does in its process -- patch its clocks, leave
work on another stream or thread, answer before its work is done -- the time that scores runs
until this process holds a copy of the outputs, and that copy is what is judged: the values of a
passing output were in memory when the clock stopped, so work left running cannot shorten its
time. A patched clock is also *flagged* (**clock
agrees**), on the machine-wide monotonic clock that ``time.perf_counter`` reads in both processes:
its readings around a call must lie inside this process's interval around that call, and over the
timed calls the candidate's clock may not claim under half the time this process measured (round
trip subtracted) with most calls missing more than the round trip's resolution from its clock
(see :func:`clock_disagreement`).

Before the candidate is loaded, the worker answers :data:`CALIBRATION_CALLS` calls of a trusted
stand-in (fresh outputs of the right shapes, no work) through the very path of a timed call:
their median round trip is the overhead subtracted from every timed call, three times their
spread (p80 - p20) the resolution below which a time is not judged, and the gaps between the two
clocks on those calls are what the candidate's are compared with.

Candidates (:func:`candidate_payload`): a ``"package.module:function"`` string (imported only in
the worker, never here), or a callable :mod:`pickle` can send by reference: a function or a class
instance defined at module level of an importable module, or a ``functools.partial`` of one.
Lambdas, closures and anything defined in ``__main__`` (a notebook, a script) raise ``TypeError``.
The worker ends with ``os._exit``: exit handlers the candidate registered never run.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import statistics
import sys
import threading
import time
import types
from typing import Any

import torch
import torch.multiprocessing  # noqa: F401  (registers the reductions that send tensors through shared memory)

from minimax_lab import measure, runtime
from minimax_lab.kernelbench import integrity
from minimax_lab.kernelbench import problems as _problems
from minimax_lab.kernelbench.calls import (CandidateError, Outcome, as_tuple, bitwise_equal, device_of,
                                           expected_dtype, flush_device_cache, fresh_seed, input_aliases,
                                           library_thread, plain_copy, poison_free_memory, resolve_candidate,
                                           synchronize)

#: trusted stand-in calls timed before the candidate is loaded (the first one only warms up)
CALIBRATION_CALLS = 24
_START_TIMEOUT_S = 600.0  # a fresh process imports torch and triton: slow on a loaded machine
_HELP = ("isolate=True runs the candidate in a fresh process, which must import it: pass "
         "'package.module:function', or a function (or class instance) defined at module level of an "
         "importable module, or a functools.partial of one")


def candidate_payload(candidate) -> tuple[tuple[str, Any], str]:
    """``(payload, name)`` for :class:`Worker` from a ``"module:function"`` string or a picklable
    callable; raises ``TypeError``/``ValueError`` (see the module docstring) -- nothing is imported here."""
    if isinstance(candidate, str):
        parts = candidate.split(":")
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"a candidate path looks like 'package.module:function', got {candidate!r}")
        return ("path", candidate), candidate
    if not callable(candidate):
        raise TypeError(f"candidate must be a callable or a 'module:function' string, got {type(candidate).__name__}")
    name = getattr(candidate, "__name__", type(candidate).__name__)
    module = getattr(candidate, "__module__", None) or type(candidate).__module__
    if module == "__main__":
        raise TypeError(f"{name!r} is defined in __main__ (a notebook or a script), which its process cannot "
                        f"import. {_HELP}")
    try:
        data = pickle.dumps(candidate)
    except Exception as e:  # lambdas, closures, local classes
        raise TypeError(f"{name!r} cannot be sent to its process ({type(e).__name__}: {e}). {_HELP}") from None
    return ("pickle", data), name


@contextlib.contextmanager
def _no_main_module():
    """A spawned process re-imports the parent's ``__main__`` (a script, a notebook runner) unless
    told otherwise; the worker needs nothing from it, so it gets an empty one."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _quantile(sorted_xs: list[float], q: float) -> float:
    return sorted_xs[min(len(sorted_xs) - 1, int(q * (len(sorted_xs) - 1) + 0.5))]


def clock_disagreement(timed: list[tuple[float, float]], calibration: list[tuple[float, float]],
                       resolution_ms: float) -> str | None:
    """The statistical half of **clock agrees**: why the candidate's clock disagrees with this
    process's over the timed calls, or None.

    ``timed`` and ``calibration`` hold one ``(harness_ms, claimed_ms)`` pair per call: this
    process's time for the call (round trip subtracted) and the time the candidate's process read
    on its own clock for it; ``calibration`` are the trusted stand-in's calls. Per call, the gap
    ``harness_ms - claimed_ms`` is the part of the round trip that the candidate's clock did not
    see; an honest clock leaves the gaps the stand-in's did. The clock disagrees when both

    * the lower quartile of the timed calls' gaps exceeds the stand-in's median gap by more than
      ``resolution_ms`` (three times the p20-p80 spread of the stand-in's round trips): at least
      three calls in four left that much more off the candidate's clock -- jitter of the round
      trip does that to a few calls, not to most, and a clock that drops a share of each call
      does it to all of them, however much their durations vary; and
    * the candidate's median claim is under half of this process's median time,

    so neither round-trip jitter nor a round trip somewhat slower than the stand-in's is taken for
    a tampered clock. Returns None with fewer than 4 timed or 3 calibration calls."""
    if len(timed) < 4 or len(calibration) < 3:
        return None
    gaps = sorted(h - c for h, c in timed)
    base = statistics.median(h - c for h, c in calibration)
    excess = _quantile(gaps, 0.25) - base
    measured = statistics.median(h for h, _ in timed)
    claimed = statistics.median(c for _, c in timed)
    if excess > resolution_ms and claimed < 0.5 * measured:
        return (f"the candidate's process timed its calls at {claimed:.4g} ms (median), this process at "
                f"{measured:.4g} ms (round trip subtracted): on three in four of the {len(gaps)} timed calls, at "
                f"least {excess:.3g} ms more escaped its clock than the trusted stand-in's round trip left out, "
                f"beyond the round trip's resolution of {resolution_ms:.3g} ms -- its clock was tampered with")
    return None


class _StandIn:
    """The trusted stand-in timed before the candidate is loaded: fresh outputs of the right shapes,
    no work."""

    def __init__(self, specs):
        self.specs = specs

    def __call__(self, **inputs):
        dev = device_of(inputs)
        outs = tuple(torch.empty(shape, dtype=dtype, device=dev) for shape, dtype in self.specs)
        return outs if len(outs) > 1 else outs[0]


class Worker:
    """The harness's side of one isolated candidate (the invoker :func:`.harness.evaluate` uses
    with ``isolate=True``): starts its process, calibrates the round trip, loads the candidate.
    Raises ``ValueError`` when its process cannot load the candidate."""

    isolated = True

    def __init__(self, payload, problem, preset: str, *, timeout_s: float = 600.0):
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self._keys: dict[int, int] = {}  # id(inputs dict) -> its key in the worker
        self._kept: list[dict] = []  # the loaded dicts, kept alive so their ids stay theirs
        self._dead: str | None = None
        self.load_tampered: list[str] = []  # what importing the candidate replaced in its process
        self.overhead_ms = 0.0  # the stand-in's median round trip, once calibrated
        self.shared_clock: bool | None = None  # both processes read one clock (None: not known yet)
        self.calibration: list[tuple[float, float]] = []  # the stand-in's (harness ms, its own ms) per call
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        device_index = torch.cuda.current_device() if runtime.DEVICE == "cuda" else None
        self._proc = ctx.Process(target=_worker_main, args=(child, device_index), daemon=True,
                                 name="kernelbench-candidate")
        with _no_main_module():
            self._proc.start()
        child.close()
        try:
            self._expect("ready", timeout=_START_TIMEOUT_S)
            self.resolution_ms = self._calibrate(problem, preset)
            reply = self._request(("load", payload))
            if reply[0] != "loaded":
                raise ValueError(f"the candidate's process could not load it: {reply[1]}")
            self.load_tampered = list(reply[1]) if len(reply) > 1 else []  # what importing it replaced there
        except BaseException:
            self.close()
            raise
        other_clock = "" if self.shared_clock else "; the candidate's process reads another clock: times compared only"
        self.method_note = (f"wall clock of the harness's process from sending each call to holding its copy of "
                            f"the outputs, round trip ({self.overhead_ms:.3g} ms) subtracted"
                            f"{'; cache flushed before each call' if runtime.DEVICE == 'cuda' else ''}{other_clock}")

    # ------------------------------------------------------------------ pipe

    def _send(self, msg) -> None:
        if self._dead:
            raise CandidateError(self._dead)
        try:
            self._conn.send(msg)
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            raise self._gone() from None

    def _recv(self, timeout: float | None = None):
        timeout = self.timeout_s if timeout is None else timeout
        try:
            if not self._conn.poll(timeout):
                self._dead = f"no answer within {timeout:g} s; its process was ended"
                self._proc.kill()
                raise CandidateError(self._dead)
            return self._conn.recv()
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            raise self._gone() from None

    def _gone(self) -> CandidateError:
        self._proc.join(timeout=5)
        self._dead = f"its process exited (exit code {self._proc.exitcode})"
        return CandidateError(self._dead)

    def _request(self, msg, timeout: float | None = None):
        self._send(msg)
        return self._recv(timeout)

    def _expect(self, kind: str, timeout: float | None = None):
        reply = self._recv(timeout)
        if reply[0] != kind:
            raise RuntimeError(f"the candidate's process answered {reply[0]!r}, expected {kind!r}: {reply[1:]}")
        return reply

    def _load(self, inputs: dict) -> int:
        key = len(self._kept)
        self._request(("inputs", key, inputs))
        self._kept.append(inputs)
        self._keys[id(inputs)] = key
        return key

    # ------------------------------------------------------------------ calibration

    def _calibrate(self, problem, preset: str) -> float:
        """Time the trusted stand-in at the timing shape through the path of a timed call (cache
        flushed, outputs copied here, the last few kept alive as the session keeps them); sets
        :attr:`overhead_ms`, :attr:`calibration` and :attr:`shared_clock`, returns the resolution."""
        shape = problem.timing_shape(preset)
        inputs = problem.make_inputs(shape, fresh_seed(), "normal")
        ref = as_tuple(problem.reference(**measure.upcast(inputs, torch.float32)))
        dt = expected_dtype(inputs)
        specs = [(tuple(r.shape), dt if (r.is_floating_point() and dt is not None) else r.dtype) for r in ref]
        self._request(("stand_in", specs))
        self._load(inputs)
        kept: list = []  # alive as the session keeps earlier outputs (their shared memory stays mapped)
        samples, nested = [], True
        for i in range(CALIBRATION_CALLS + 1):
            flush_device_cache(inputs)
            res = self.run(inputs, timed=True)
            if res.crash is not None:
                raise RuntimeError(f"the trusted stand-in failed in the candidate's process: {res.crash}")
            kept = (kept + list(as_tuple(res.out)))[-8:]
            self.settle(res)
            if i:  # the first call only warms up
                samples.append((res.elapsed(), res.worker_ms))
                nested = nested and res.clock_problem is None
        self.shared_clock = nested
        round_trips = sorted(h for h, _ in samples)
        self.overhead_ms = statistics.median(round_trips)
        self.calibration = [(h - self.overhead_ms, c) for h, c in samples]
        return 3 * (_quantile(round_trips, 0.8) - _quantile(round_trips, 0.2))

    # ------------------------------------------------------------------ the invoker interface

    def prepare_timing(self, sets: list[dict]) -> None:
        """Send the timing sets once; timed calls then name them, and refills here are seen there."""
        for s in sets:
            if id(s) not in self._keys:
                self._load(s)

    def run(self, inputs: dict, *, timed: bool = False) -> Outcome:
        """One call: the clock runs from the send until this process holds its copy of the outputs
        (``Outcome.snapshot``, the copy that is judged). Every call also checks that the readings of
        the candidate's clock lie inside that interval (``Outcome.clock_problem``)."""
        key = self._keys.get(id(inputs))
        msg = ("call", key, None if key is not None else inputs)
        res = Outcome()
        cuda = runtime.DEVICE == "cuda"
        if cuda:
            torch.cuda.synchronize()  # refills and flushes made here are done before the call
        try:
            t0 = time.perf_counter()
            self._send(msg)
            reply = self._recv()
            if reply[0] == "ok":
                res.snapshot = tuple(plain_copy(o) for o in as_tuple(reply[1]))
                if cuda:
                    torch.cuda.synchronize()  # the copy is complete: only now has this process the outputs
            t1 = time.perf_counter()
        except CandidateError as e:
            res.crash = e
            return res
        flags = reply[-1]
        if reply[0] == "raised":
            res.crash = CandidateError(reply[1])
        else:
            res.out, (w0, w1) = reply[1], reply[2]
            res.worker_ms = (w1 - w0) * 1e3
            if not (t0 <= w0 <= w1 <= t1) and self.shared_clock is not False:
                res.clock_problem = (f"the candidate's process read its clock at +{(w0 - t0) * 1e3:.4g} ms and then at "
                                     f"+{(w1 - t0) * 1e3:.4g} ms after this process sent the call, whose outputs this "
                                     f"process held at +{(t1 - t0) * 1e3:.4g} ms: not in order inside the call on "
                                     "the one machine-wide monotonic clock both read, so its clock was tampered with")
            if timed:
                ms = (t1 - t0) * 1e3 - self.overhead_ms
                res.elapsed = lambda: ms
        res.log = flags["log"]
        res.subclass_outputs = flags["subclass"]
        res.input_aliases = flags["aliases"]
        res.late_outputs = flags["late"]
        res.threads_running = flags["running"]
        res.tampered = flags["tampered"]
        return res

    def settle(self, res: Outcome) -> tuple[list[str], list[str]]:
        """``(judges replaced there, threads that were still running)`` as the worker reported them
        with the call (it synchronized everything before it replied); frees the shared memory both
        processes have let go of."""
        if not self._dead:
            with contextlib.suppress(CandidateError):
                self._request(("settle",))
        if runtime.DEVICE == "cuda":
            torch.cuda.ipc_collect()  # free the inputs sent there that it has let go of
        return list(res.tampered), list(res.threads_running)

    def clock_disagreement(self, timed: list[tuple[float, float]], resolution_ms: float) -> str | None:
        """:func:`clock_disagreement` of the timed calls' ``(harness ms, candidate's ms)`` against
        the stand-in's."""
        return clock_disagreement(timed, self.calibration, resolution_ms)

    def close(self) -> None:
        """End the worker (politely, then by force) and forget the inputs it was sent."""
        if self._proc.is_alive() and not self._dead:
            with contextlib.suppress(Exception):
                self._send(("stop",))
                self._recv(timeout=30)
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=30)
        self._conn.close()
        self._kept.clear()
        self._keys.clear()


# --------------------------------------------------------------------------- the candidate's process


def _worker_main(conn, device_index: int | None) -> None:
    """Entry point of the candidate's process: trusted code first (this module, the problems and
    the integrity record of both, taken before the candidate is loaded), then the loop of :class:`_Loop`."""
    if runtime.DEVICE == "cuda" and device_index is not None:
        torch.cuda.set_device(device_index)
    integrity.trusted(_problems.PROBLEMS)
    try:
        conn.send(("ready", os.getpid()))
        _Loop(conn).serve()
    finally:
        os._exit(0)  # the candidate's exit handlers never run


_NO_FLAGS = {"log": [], "subclass": None, "aliases": None, "late": [], "running": [], "tampered": []}


class _Loop:
    """Calls the candidate on request and reports; see the module docstring."""

    def __init__(self, conn):
        self.conn = conn
        self.fn = None
        self.inputs: dict[int, dict] = {}
        self.snapshot = integrity.trusted()
        self.settings = integrity.Settings.capture()

    def serve(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                return
            op = msg[0]
            if op == "stop":
                self.conn.send(("bye",))
                return
            reply = getattr(self, f"_{op}")(*msg[1:])
            try:
                self.conn.send(reply)
            except Exception as e:  # an output that cannot be sent is the candidate's failure
                self.conn.send(("raised", f"its output could not be sent back ({type(e).__name__}: {e})",
                                dict(_NO_FLAGS)))

    def _inputs(self, key: int, inputs: dict):
        self.inputs[key] = inputs
        return ("loaded",)

    def _stand_in(self, specs):
        self.fn = _StandIn(specs)
        return ("loaded",)

    def _load(self, payload):
        kind, data = payload
        integrity.accept_all(self.snapshot, self.settings)
        try:
            self.fn = resolve_candidate(data)[0] if kind == "path" else pickle.loads(data)
        except Exception as e:
            return ("error", f"{type(e).__name__}: {e}")
        return ("loaded", integrity.restore_all(self.snapshot, self.settings))  # a kernel registered on import too

    def _call(self, key: int | None, inputs: dict | None):
        """Call the candidate; copy its outputs on the caller's stream right after it returns (before
        anything waits for other streams or threads), then wait for everything it started, so that
        its reply -- and the harness's clock -- come after all its work. Its own clock (the one it
        could patch) is read around all of it."""
        inputs = self.inputs[key] if key is not None else inputs
        poison_free_memory(inputs)
        before = set(threading.enumerate())
        log: list = []
        integrity.accept_all(self.snapshot, self.settings)
        integrity.start_watch(log)
        crash = out = None
        at_return: tuple = ()
        t0 = time.perf_counter()  # the candidate's own clock: "clock agrees" compares it with the harness's
        try:
            out = self.fn(**inputs)
            integrity.stop_watch()
            # the copy the in-process mode takes: on the caller's stream, nothing waited for yet
            at_return = tuple(plain_copy(o) for o in as_tuple(out))
        except Exception as e:
            crash = e
        integrity.stop_watch()
        synchronize()  # every stream of the device (and the CPU's side-work threads)
        running = [t for t in threading.enumerate()
                   if t not in before and t.is_alive() and not library_thread(t)]
        deadline = time.monotonic() + 10
        for t in running:  # their work belongs to this call: wait for it (up to 10 s)
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        synchronize()  # work those threads launched
        t1 = time.perf_counter()
        flags = {**_NO_FLAGS, "log": log, "running": [t.name for t in running],
                 "tampered": integrity.restore_all(self.snapshot, self.settings)}
        if crash is not None:
            return ("raised", f"{type(crash).__name__}: {crash}", flags)
        outs = as_tuple(out)
        flags["late"] = [i for i, (a, b) in enumerate(zip(at_return, outs))
                         if isinstance(a, torch.Tensor) and not bitwise_equal(a, b)]
        flags["subclass"] = [f"{i} ({type(o).__name__})" for i, o in enumerate(outs)
                             if isinstance(o, torch.Tensor) and type(o) is not torch.Tensor]
        plain = tuple(o.as_subclass(torch.Tensor) if isinstance(o, torch.Tensor) and type(o) is not torch.Tensor
                      else o for o in outs)
        flags["aliases"] = input_aliases(plain, inputs)
        return ("ok", plain if isinstance(out, (tuple, list)) else plain[0], (t0, t1), flags)

    def _settle(self):
        if runtime.DEVICE == "cuda":
            torch.cuda.ipc_collect()  # free the outputs sent to the harness that it has let go of
        return ("settled",)
