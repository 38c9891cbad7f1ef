"""One call of a candidate kernel: what the harness (:mod:`.harness`) and the candidate's own
process (:mod:`.isolate`) both need to make it and to look at what came back.

* :func:`resolve_candidate` -- a callable from a callable or a ``"package.module:function"`` path;
* :func:`launch_side_work` / :func:`synchronize` -- the CPU's stand-ins for a side stream and for
  ``torch.cuda.synchronize()``; :func:`threads_left` -- the candidate's threads still running;
* :class:`Outcome` -- one call as an invoker ran it;
* small tensor helpers: copies that are plain tensors, bitwise equality, memory overlap, the
  expected output dtype, NaN poison for freed memory, the GPU cache flush.
"""
from __future__ import annotations

import dataclasses
import importlib
import math
import secrets
import threading
from typing import Any, Callable

import torch

from minimax_lab import measure, runtime


class CandidateError(RuntimeError):
    """An isolated candidate failed in its own process: it raised (the message names the
    exception), its process exited, or a call took longer than the timeout."""


def resolve_candidate(candidate) -> tuple[Callable, str]:
    """``(callable, name)`` from a callable or a ``"package.module:function"`` string; raises
    ``TypeError`` for anything else and ``ValueError`` for a path that names no callable."""
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


def library_file(filename: str) -> bool:
    """A file of an installed library (torch, triton), not the candidate's."""
    return "site-packages" in filename or "dist-packages" in filename


def library_thread(t: threading.Thread) -> bool:
    """A thread whose code lives in an installed library (torch, triton): not the candidate's."""
    target = getattr(t, "_target", None) or type(t).run
    code = getattr(target, "__code__", None) or getattr(getattr(target, "__func__", None), "__code__", None)
    return code is not None and library_file(code.co_filename)


def threads_left(before: set) -> list[str]:
    """Names of the threads started since ``before`` (a set of threads) that are still running."""
    return [t.name for t in threading.enumerate() if t not in before and t.is_alive() and not library_thread(t)]


# --------------------------------------------------------------------------- one call


@dataclasses.dataclass
class Outcome:
    """One call of a candidate, as run by an invoker (in this process or in the worker)."""

    out: Any = None
    crash: BaseException | None = None
    elapsed: Callable[[], float] | None = None  # ms of the call, readable after settle()
    log: list = dataclasses.field(default_factory=list)  # (kind, what) from the audit hook
    subclass_outputs: list | None = None  # reported by the worker (isolated mode)
    input_aliases: list | None = None  # reported by the worker (isolated mode)
    worker_ms: float | None = None  # the candidate's own process's clock (isolated mode)
    threads_before: set = dataclasses.field(default_factory=set)
    # isolated mode: the outputs as this process copied them (the clock stopped after the copy), and
    # what the worker reported: outputs that changed after the return, threads running then, judges
    # replaced there, and why its clock's readings do not fit this process's interval around the call
    snapshot: tuple | None = None
    late_outputs: list = dataclasses.field(default_factory=list)
    threads_running: list = dataclasses.field(default_factory=list)
    tampered: list = dataclasses.field(default_factory=list)
    clock_problem: str | None = None


def fresh_seed() -> int:
    """A seed drawn from ``os.urandom`` (through :mod:`secrets`): nothing in the process predicts it."""
    return secrets.randbits(62)


# --------------------------------------------------------------------------- small tensor helpers


def as_tuple(x) -> tuple:
    """A candidate's or a reference's outputs as a tuple (one tensor -> a 1-tuple)."""
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def clone_inputs(inputs: dict) -> dict:
    """A copy of the inputs with every tensor cloned (detached)."""
    return {k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def plain_copy(o):
    """A copy of an output as a plain tensor (a subclass's values are computed by the copy)."""
    if not isinstance(o, torch.Tensor):
        return o
    c = o.detach().clone()
    return c if type(c) is torch.Tensor else c.as_subclass(torch.Tensor)


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits (so NaN == NaN; works for every dtype, fp8 included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.detach().reshape(-1).view(torch.uint8), b.detach().reshape(-1).view(torch.uint8))


def _span(t: torch.Tensor) -> tuple[str, int, int] | None:
    s = t.untyped_storage()
    return (str(t.device), s.data_ptr(), s.data_ptr() + s.nbytes()) if s.nbytes() else None


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the storages of two tensors share any byte."""
    sa, sb = _span(a), _span(b)
    return bool(sa and sb and sa[0] == sb[0] and sa[1] < sb[2] and sb[1] < sa[2])


def input_aliases(outs, inputs: dict) -> list[str]:
    """Names of the inputs some output shares memory with."""
    tensors = [o for o in outs if isinstance(o, torch.Tensor)]
    return [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and any(overlaps(o, v) for o in tensors)]


def device_of(inputs: dict) -> torch.device:
    """The device of the first tensor among the inputs (the CPU when there is none)."""
    return next((v.device for v in inputs.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))


def poison_free_memory(example: dict) -> None:
    """Fill recently freed memory with NaN so a candidate's ``torch.empty`` starts out poisoned
    (GPU: the caching allocator's blocks; CPU: best effort, malloc often hands the block back)."""
    dev = device_of(example)
    nbytes = max(1 << 16, 2 * measure.nbytes(example))
    if dev.type == "cuda":
        measure.poison_allocator(dev, min(nbytes, 2 << 30))
    else:
        junk = measure.poison_(torch.empty(min(nbytes, 64 << 20) // 4, dtype=torch.float32))
        del junk


_FLUSH: dict[str, torch.Tensor] = {}


def flush_device_cache(inputs: dict) -> None:
    """GPU: overwrite twice the L2 cache, so the next call finds none of its inputs cached (the CPU
    runs Triton's interpreter, whose speed says nothing about caches: nothing to do there)."""
    dev = device_of(inputs)
    if dev.type != "cuda":
        return
    key = str(dev)
    if key not in _FLUSH:
        _FLUSH[key] = torch.empty(2 * runtime.l2_cache_bytes(), dtype=torch.uint8, device=dev)
    _FLUSH[key].zero_()


def expected_dtype(inputs: dict) -> torch.dtype | None:
    """Float outputs must come back in the dtype of the first floating input (returning a lower
    precision than asked would also loosen the tolerance)."""
    return next((v.dtype for v in inputs.values() if isinstance(v, torch.Tensor) and v.is_floating_point()
                 and v.dtype.itemsize >= 2), None)


def speedup(peer_ms: float | None, ms: float) -> float | None:
    """``peer_ms / ms`` (None without a peer time); infinite for a time at or below zero (the
    impossible-time check says why), NaN for a NaN time."""
    if peer_ms is None:
        return None
    if math.isnan(ms):
        return math.nan
    return peer_ms / ms if ms > 0 else math.inf
