"""Isolated mode: the candidate runs in its own process; the clock and the judging stay here.

    report = harness.evaluate("my_pkg.kernels:softmax", "softmax", isolate=True)

:class:`Worker` spawns one process per evaluation (``multiprocessing``'s "spawn": a fresh
interpreter, and on a GPU its own CUDA context) and talks to it over a pipe. Tensors travel
through shared memory (``torch.multiprocessing``: CPU tensors in shared-memory files, CUDA tensors
by IPC handle), so inputs refilled in place here are seen there, and outputs the candidate writes
after it returned are seen here. What runs where:

* **here**: the input draws (held-out shapes included), the reference, every comparison, the
  cache flush before timed calls, and the clock -- this process's wall clock around each call,
  less the round trip;
* **there**: the candidate, and small trusted code loaded before it: a loop that calls it, waits
  for its caller's stream (GPU) and replies, reads its own clock around the call, and on request
  synchronizes everything. What that loop reports (introspection, tampering, threads still
  running, tensor subclasses, outputs aliasing inputs, the candidate's own clock) can only ever
  fail a candidate: one that silences the reports still faces every check made here.

Before the candidate is loaded, the worker answers :data:`CALIBRATION_CALLS` calls of a trusted
stand-in that returns outputs of the right shapes at the timing shape: their median round trip is
the overhead subtracted from every timed call, three times their spread (p80 - p20) the
resolution below which a time is not judged.

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

from minimax_lab import bench, runtime
from minimax_lab.kernelbench import harness
from minimax_lab.kernelbench.harness import CandidateError

#: trusted stand-in calls timed before the candidate is loaded (the first one only warms up)
CALIBRATION_CALLS = 12
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


class Worker:
    """The harness's side of one isolated candidate (the invoker :func:`.harness.evaluate` uses
    with ``isolate=True``): starts its process, calibrates the round trip, loads the candidate."""

    isolated = True

    def __init__(self, payload, problem, preset: str, *, timeout_s: float = 600.0):
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self._keys: dict[int, int] = {}  # id(inputs dict) -> its key in the worker
        self._kept: list[dict] = []  # the loaded dicts, kept alive so their ids stay theirs
        self._dead: str | None = None
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
            self.overhead_ms, self.resolution_ms = self._calibrate(problem, preset)
            reply = self._request(("load", payload))
            if reply[0] != "loaded":
                raise ValueError(f"the candidate's process could not load it: {reply[1]}")
        except BaseException:
            self.close()
            raise
        self.method_note = (f"wall clock of the harness's process around each call in the candidate's process, "
                            f"round trip ({self.overhead_ms:.3g} ms) subtracted; cache flushed before each call")

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

    def _calibrate(self, problem, preset: str) -> tuple[float, float]:
        """Median and resolution (ms) of the round trip of a trusted stand-in at the timing shape."""
        shape = problem.timing_shape(preset)
        inputs = problem.make_inputs(shape, harness._fresh_seed(), "normal")
        ref = harness._as_tuple(problem.reference(**bench._upcast(inputs, torch.float32)))
        dt = harness._expected_dtype(inputs)
        specs = [(tuple(r.shape), dt if (r.is_floating_point() and dt is not None) else r.dtype) for r in ref]
        key = self._load(inputs)
        times = []
        for i in range(CALIBRATION_CALLS + 1):
            harness.flush_device_cache(inputs)
            if runtime.DEVICE == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            self._send(("calibrate", key, specs))
            self._expect("ok")
            if i:
                times.append((time.perf_counter() - t0) * 1e3)
        times.sort()
        return statistics.median(times), 3 * (_quantile(times, 0.8) - _quantile(times, 0.2))

    # ------------------------------------------------------------------ the invoker interface

    def prepare_timing(self, sets: list[dict]) -> None:
        """Send the timing sets once; timed calls then name them, and refills here are seen there."""
        for s in sets:
            if id(s) not in self._keys:
                self._load(s)

    def run(self, inputs: dict, *, timed: bool = False) -> harness.Outcome:
        key = self._keys.get(id(inputs))
        msg = ("call", key, None if key is not None else inputs)
        res = harness.Outcome()
        if runtime.DEVICE == "cuda":
            torch.cuda.synchronize()  # refills and flushes made here are done before the call
        try:
            t0 = time.perf_counter()
            self._send(msg)
            reply = self._recv()
            t1 = time.perf_counter()
        except CandidateError as e:
            res.crash = e
            return res
        if reply[0] == "raised":
            res.crash = CandidateError(reply[1])
            flags = reply[2]
        else:
            _, res.out, res.worker_ms, flags = reply
            if timed:
                ms = (t1 - t0) * 1e3 - self.overhead_ms
                res.elapsed = lambda: ms
        res.log = flags["log"]
        res.subclass_outputs = flags["subclass"]
        res.input_aliases = flags["aliases"]
        return res

    def settle(self, res: harness.Outcome) -> tuple[list[str], list[str]]:
        """Ask the worker to synchronize everything and wait for the candidate's threads; returns
        ``(judges replaced there, threads that were still running)``."""
        if self._dead:
            return [], []
        try:
            reply = self._request(("settle",))
        except CandidateError:
            return [], []
        if runtime.DEVICE == "cuda":
            torch.cuda.ipc_collect()  # free the inputs sent there that it has let go of
        return reply[1], reply[2]

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
    """Entry point of the candidate's process: trusted code first (this module and the harness
    are imported before the candidate), then the loop of :class:`_Loop`."""
    if runtime.DEVICE == "cuda" and device_index is not None:
        torch.cuda.set_device(device_index)
    try:
        conn.send(("ready", os.getpid()))
        _Loop(conn).serve()
    finally:
        os._exit(0)  # the candidate's exit handlers never run


class _Loop:
    """Calls the candidate on request and reports; see the module docstring."""

    def __init__(self, conn):
        self.conn = conn
        self.fn = None
        self.inputs: dict[int, dict] = {}
        self.before: set = set()

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
                                {"log": [], "subclass": None, "aliases": None}))

    def _inputs(self, key: int, inputs: dict):
        self.inputs[key] = inputs
        return ("loaded",)

    def _load(self, payload):
        kind, data = payload
        try:
            self.fn = harness.resolve_candidate(data)[0] if kind == "path" else pickle.loads(data)
        except Exception as e:
            return ("error", f"{type(e).__name__}: {e}")
        return ("loaded",)

    def _calibrate(self, key: int, specs):
        """The trusted stand-in: fresh outputs of the right shapes, no work (the memory poisoning
        before a candidate's call is done here too, so that it is part of the round trip)."""
        dev = harness._device_of(self.inputs[key])
        harness._poison_free_memory(self.inputs[key])
        outs = tuple(torch.empty(shape, dtype=dtype, device=dev) for shape, dtype in specs)
        if dev.type == "cuda":
            torch.cuda.current_stream().synchronize()
        return ("ok", outs, 0.0, {"log": [], "subclass": [], "aliases": []})

    def _call(self, key: int | None, inputs: dict | None):
        inputs = self.inputs[key] if key is not None else inputs
        dev = harness._device_of(inputs)
        harness._poison_free_memory(inputs)
        self.before = set(threading.enumerate())
        log: list = []
        harness._watch_log = log
        crash = out = None
        t0 = time.perf_counter()  # the candidate's own clock: "clock agrees" compares it with the harness's
        try:
            out = self.fn(**inputs)
            if dev.type == "cuda":
                torch.cuda.current_stream().synchronize()  # the caller's stream: what the contract waits for
        except Exception as e:
            crash = e
        worker_ms = (time.perf_counter() - t0) * 1e3
        harness._watch_log = None
        if crash is not None:
            return ("raised", f"{type(crash).__name__}: {crash}", {"log": log, "subclass": None, "aliases": None})
        outs = harness._as_tuple(out)
        subclass = [f"{i} ({type(o).__name__})" for i, o in enumerate(outs)
                    if isinstance(o, torch.Tensor) and type(o) is not torch.Tensor]
        plain = tuple(o.as_subclass(torch.Tensor) if isinstance(o, torch.Tensor) and type(o) is not torch.Tensor
                      else o for o in outs)
        flags = {"log": log, "subclass": subclass, "aliases": harness._input_aliases(plain, inputs)}
        return ("ok", plain if isinstance(out, (tuple, list)) else plain[0], worker_ms, flags)

    def _settle(self):
        late = [t for t in threading.enumerate()
                if t not in self.before and t.is_alive() and not harness._library_thread(t)]
        deadline = time.monotonic() + 10
        for t in late:  # let late writes land, so the harness sees the output change after the reply
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        harness.synchronize()  # after the joins: work those threads launched is waited for too
        tampered = harness.restore_tampering()
        if runtime.DEVICE == "cuda":
            torch.cuda.ipc_collect()
        return ("settled", tampered, [t.name for t in late])
