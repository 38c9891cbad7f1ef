"""Calls a learner's answer may not make: the package's own answer to the exercise, the checker's
reference, and handing the work to another process.

While :func:`refused_calls` is active, the code of every listed function is swapped for a
tripwire. The function object stays the same one, so every way of reaching it lands on the
tripwire: the name the package gives it, an alias taken in an earlier cell, a method reached
through an object, a call from any thread (also one started long before), and a call in a child
process forked meanwhile. The tripwire notes the call and raises :class:`Refused`, which derives
from ``BaseException`` so that an ``except Exception`` around the call does not hide it; a child
process has no way to note it here, and the exception it raises travels back with the result.

Handing work to another process goes through :data:`HANDOFFS` (starting a process, submitting to
a pool, sending through a pipe or a queue): those are refused too. A function whose code cannot
be swapped (one written in C) cannot be listed: :func:`functions_of` raises ``TypeError``.

What this cannot see: a copy of a function's code made before the block (``types.FunctionType``
of its ``__code__``, or its source pasted into a cell -- that is writing the answer out by hand),
and a process started before the block that is sent work by raw ``os.write`` on a pipe.
"""
from __future__ import annotations

import concurrent.futures.process
import contextlib
import dataclasses
import multiprocessing.connection
import multiprocessing.pool
import multiprocessing.process
import multiprocessing.queues
import os
import threading
import types
from typing import Callable, Iterable


class Refused(BaseException):
    """An answer broke a rule of its exercise; ``problem`` says which, in the learner's terms."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem


#: how work leaves this process: every way of starting a process or handing a pool, a pipe or a
#: queue an object (what a pool created in an earlier cell would be given)
HANDOFFS = (multiprocessing.process.BaseProcess.start, concurrent.futures.process.ProcessPoolExecutor.submit,
            multiprocessing.pool.Pool.apply_async, multiprocessing.pool.Pool._map_async,
            multiprocessing.pool.Pool.imap, multiprocessing.pool.Pool.imap_unordered,
            multiprocessing.connection._ConnectionBase.send, multiprocessing.connection._ConnectionBase.send_bytes,
            multiprocessing.queues.Queue.put, multiprocessing.queues.SimpleQueue.put)

HANDOFF_PROBLEM = ("your function handed work to another process ({name}): the checker sees only this process, "
                   "so the exercise's work must be done by your code, here")


def _tripwire_codes() -> dict[int, types.CodeType]:
    """Code objects of a tripwire with 0..3 free variables: a swapped code must close over as
    many cells as the function it replaces (a method that calls ``super()`` has one)."""
    def free0(*args, __tripwire__, **kwargs):
        return __tripwire__(args, kwargs)

    a = b = c = None

    def free1(*args, __tripwire__, **kwargs):
        _ = a
        return __tripwire__(args, kwargs)

    def free2(*args, __tripwire__, **kwargs):
        _ = a, b
        return __tripwire__(args, kwargs)

    def free3(*args, __tripwire__, **kwargs):
        _ = a, b, c
        return __tripwire__(args, kwargs)

    return {len(f.__code__.co_freevars): f.__code__ for f in (free0, free1, free2, free3)}


_TRIPWIRES = _tripwire_codes()


def functions_of(target) -> list[types.FunctionType]:
    """The Python functions behind ``target``: a function, a method (bound or not, static or
    class), a wrapper (``functools.wraps``, ``lru_cache``: the wrapper and what it wraps), or a
    class (every function defined in its body). ``TypeError`` for anything else."""
    if isinstance(target, type):
        found = []
        for value in vars(target).values():
            if isinstance(value, (types.FunctionType, staticmethod, classmethod)):
                found += functions_of(value)
        return found
    inner = getattr(target, "__func__", None)
    if inner is not None:
        return functions_of(inner)
    found = [target] if isinstance(target, types.FunctionType) else []
    wrapped = getattr(target, "__wrapped__", None)
    if wrapped is not None:
        found += functions_of(wrapped)
    if not found:
        raise TypeError(f"cannot refuse calls of {target!r}: not a Python function, method or class")
    return found


def qualified_name(f: types.FunctionType) -> str:
    return f"{f.__module__}.{f.__qualname__}"


@dataclasses.dataclass
class _Swap:
    function: types.FunctionType
    code: types.CodeType
    defaults: tuple | None
    kwdefaults: dict | None

    def original(self) -> types.FunctionType:
        """A function running the original code (for a call made inside a kernel launch). Made
        before the call it serves: setting ``__kwdefaults__`` is an event the introspection watch
        reports."""
        f = types.FunctionType(self.code, self.function.__globals__, self.function.__name__, self.defaults,
                               self.function.__closure__)
        f.__kwdefaults__ = self.kwdefaults
        return f

    def restore(self) -> None:
        self.function.__code__ = self.code
        self.function.__defaults__ = self.defaults
        self.function.__kwdefaults__ = self.kwdefaults


_local = threading.local()


@contextlib.contextmanager
def inside_launch():
    """Marks a Triton launch in this thread: what Triton itself does there (compiling a kernel
    starts a compiler process; the interpreter copies tensors) is not the learner's doing, so
    tripwires run the original code and the watches look away."""
    before = getattr(_local, "launching", False)
    _local.launching = True
    try:
        yield
    finally:
        _local.launching = before


def launching() -> bool:
    """True inside :func:`inside_launch` in this thread."""
    return getattr(_local, "launching", False)


@contextlib.contextmanager
def refused_calls(answers: dict[Callable, str], noted: list[str]):
    """Inside the block, a call of any function behind a key of ``answers`` (see
    :func:`functions_of`), or of :data:`HANDOFFS`, from any thread, raises :class:`Refused` with
    its message (``{name}`` is replaced by the function's qualified name), after adding the
    message to ``noted``."""
    owner = os.getpid()
    messages = {f: message for target, message in answers.items() for f in functions_of(target)}
    messages.update({f: HANDOFF_PROBLEM for target in HANDOFFS for f in functions_of(target)})
    swaps = []

    def tripwire(swap: _Swap, message: str):
        original = swap.original()

        def trip(args, kwargs):
            if launching():
                return original(*args, **kwargs)
            problem = message.format(name=qualified_name(swap.function))
            if os.getpid() == owner:
                noted.append(problem)
            raise Refused(problem)
        return trip

    try:
        for f, message in messages.items():
            swap = _Swap(f, f.__code__, f.__defaults__, f.__kwdefaults__)
            code = _TRIPWIRES.get(len(f.__code__.co_freevars))
            if code is None:
                raise TypeError(f"cannot refuse calls of {qualified_name(f)}: it closes over "
                                f"{len(f.__code__.co_freevars)} variables")
            f.__code__, f.__defaults__ = code, None
            f.__kwdefaults__ = {"__tripwire__": tripwire(swap, message)}
            swaps.append(swap)
        yield
    finally:
        for swap in reversed(swaps):
            swap.restore()


def listed(answers: Iterable) -> list[str]:
    """The qualified names of the functions behind ``answers`` (for messages and tests)."""
    return [qualified_name(f) for target in answers for f in functions_of(target)]
