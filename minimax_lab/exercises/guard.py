"""One call of a learner's function, watched: what an answer may not do to be counted as the
learner's own work.

:func:`guarded` wraps the learner's function so that every call the checker makes runs inside a
:class:`Guard`. A call is refused (:class:`~minimax_lab.exercises.forbidden.Refused`, which the
verdict shows as the exercise's problem) when it

* calls the package's own answer to the exercise or the checker's reference, in any form and from
  any thread (:mod:`.forbidden`: the functions the exercise lists as ``answers``);
* hands work to another process (starts one, or submits to a pool, a pipe or a queue);
* looks into the call stack or the garbage collector (where the checker's expected answer
  lives), or rewrites a function's code (:func:`minimax_lab.kernelbench.integrity.start_watch`);
* changes how the checker computes: replaces a function of torch, of the standard library or of
  the workbook (the checker's modules included), registers a kernel for one of torch's operators
  with ``torch.library``, or leaves a torch setting changed (:mod:`minimax_lab.kernelbench.integrity`:
  everything it changed is put back and named);
* for an exercise where the learner writes Triton: launches no kernel, launches one of the
  package's kernels, or hands a kernel something PyTorch computed (:mod:`.provenance`,
  :mod:`.launches`). A call that returns a result no launch wrote, or whose kernels were never
  handed one of its inputs, is noted in ``Guard.deferred``: the verdict shows it when the checker
  found the numbers right (a kernel that wrote only part of the result is better told which
  numbers are wrong).

A guard inside a guard does nothing (the outer one watches). Exercise 08.3, which asks for a hack
that the kernel bench's own harness must catch, runs unguarded.
"""
from __future__ import annotations

import contextlib
import gc
import inspect
import sys
from typing import Callable

from minimax_lab.exercises.forbidden import HANDOFF_PROBLEM, Refused, launching, refused_calls
from minimax_lab.exercises.launches import NO_TRITON, poisoned_empty, tensors_in, triton_launches
from minimax_lab.exercises.provenance import Provenance
from minimax_lab.kernelbench import integrity

#: audit events of a new process (``multiprocessing``'s spawn raises none: :mod:`.forbidden` refuses
#: ``Process.start`` itself)
PROCESS_EVENTS = frozenset({"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
                            "os.startfile", "subprocess.Popen"})
#: the workbook's packages that kernelbench's integrity record does not cover: their modules and
#: classes are watched here (the checkers compute their references with them)
EXTRA_PACKAGES = ("minimax_lab.exercises", "minimax_lab.engine", "minimax_lab.model", "minimax_lab.data")

_state = {"active": None}   # the Guard watching a call now (one at a time)


def _process_hook(event: str, args) -> None:
    guard = _state["active"]
    if guard is None or event not in PROCESS_EVENTS or launching():
        return
    problem = HANDOFF_PROBLEM.format(name=event)
    guard.noted.append(problem)
    raise Refused(problem)


sys.addaudithook(_process_hook)  # idle unless a guard is watching


def _extra_namespaces() -> list[integrity.Namespace]:
    """The modules of :data:`EXTRA_PACKAGES` loaded now and the classes they define, recorded."""
    found = []
    for name in sorted(sys.modules):
        module = sys.modules[name]
        if not any(name == p or name.startswith(p + ".") for p in EXTRA_PACKAGES) or module is None:
            continue
        found.append(integrity.Namespace(name, module, vars(module), "module", True))
        for value in list(vars(module).values()):
            if isinstance(value, type) and value.__module__ == name and "<locals>" not in value.__qualname__:
                found.append(integrity.Namespace(f"{name}.{value.__qualname__}", value,
                                                 gc.get_referents(vars(value))[0], "class"))
    for ns in found:
        ns.trust()
    return found


class _Outcome:
    result = None
    raised: BaseException | None = None


class Guard:
    """The rules of one exercise (see the module docstring). ``answers`` maps the functions the
    answer may not call to the message that says so (``{name}`` is the function's qualified name);
    ``triton``: the learner writes a Triton kernel; ``copies``: PyTorch may copy and cast around
    it (False where the copy is the exercise); ``stub``: the exercise's stub, whose signature names
    the inputs in messages; ``kernel_rule``: why a launched kernel is refused, or None
    (:class:`~minimax_lab.exercises.launches.LaunchLog`)."""

    def __init__(self, answers: dict[Callable, str], *, triton: bool = False, copies: bool = True,
                 stub: Callable | None = None, kernel_rule: Callable[[object], str | None] | None = None):
        self.answers, self.triton, self.copies, self.kernel_rule = answers, triton, copies, kernel_rule
        self.signature = inspect.signature(stub) if stub is not None else None
        self.snapshot = integrity.Snapshot.capture()
        self.settings = integrity.Settings.capture()
        self.extra = _extra_namespaces()
        self.noted: list[str] = []
        self.deferred: list[str] = []

    def _inputs(self, args, kwargs) -> dict:
        """The call's arguments by the stub's parameter names (``argN`` where it has none)."""
        named = {f"arg{i}": a for i, a in enumerate(args)} | dict(kwargs)
        if self.signature is not None:
            with contextlib.suppress(TypeError):
                named = dict(self.signature.bind(*args, **kwargs).arguments)
        return named

    def call(self, fn: Callable, *args, **kwargs):
        """``fn(*args, **kwargs)`` under the rules; raises :class:`Refused` for a broken one."""
        with self.watching(args, kwargs) as outcome:
            outcome.result = fn(*args, **kwargs)
        return outcome.result

    @contextlib.contextmanager
    def watching(self, args: tuple = (), kwargs: dict | None = None):
        """The block is one call of the learner's code, with inputs ``args`` and ``kwargs``; set
        the yielded object's ``result`` to what it returned. Raises :class:`Refused` for a broken
        rule, else lets the block's own exception through."""
        outcome = _Outcome()
        if _state["active"] is not None:
            yield outcome
            return
        self.noted, watched = [], []
        provenance = None
        if self.triton:
            tensors = {}
            for name, value in self._inputs(args, kwargs or {}).items():
                found = tensors_in(value)
                tensors.update({name if len(found) == 1 else f"{name}[{i}]": t for i, t in enumerate(found)})
            provenance = Provenance(tensors, copies=self.copies)
        with contextlib.ExitStack() as stack:
            stack.enter_context(refused_calls(self.answers, self.noted))
            if provenance is not None:
                stack.enter_context(poisoned_empty())
                stack.enter_context(provenance.threads())
                launched = stack.enter_context(triton_launches(provenance, kernel_rule=self.kernel_rule))
            integrity.accept_all(self.snapshot, self.settings)
            _state["active"] = self
            try:
                with provenance.mode() if provenance is not None else contextlib.nullcontext():
                    integrity.start_watch(watched)
                    try:
                        yield outcome
                    except BaseException as e:  # noqa: BLE001 -- judged below, then raised again
                        outcome.raised = e
                    finally:
                        integrity.stop_watch()
            finally:
                _state["active"] = None
                tampered = integrity.restore_all(self.snapshot, self.settings)
                for ns in self.extra:
                    tampered += ns.restore()
        if provenance is not None:
            provenance.close()
        if isinstance(outcome.raised, Refused) and not self.noted:
            self.noted.append(outcome.raised.problem)
        problem = next(iter(self.noted), None) or self._tampering(tampered) or self._spying(watched)
        if problem is None and provenance is not None:
            problem = launched.refusal   # a refused launch, even one whose Refused the answer caught
            if problem is None and outcome.raised is None:
                if launched.count == 0:
                    problem = NO_TRITON
                else:
                    self._defer(launched.problem(outcome.result) or self._unread(provenance))
        if problem is not None:
            raise Refused(problem)
        if outcome.raised is not None:
            raise outcome.raised

    def _defer(self, problem: str | None) -> None:
        """A problem the verdict shows only when the checker found the numbers right: a kernel that
        wrote part of the result is better told which numbers are wrong."""
        if problem is not None:
            self.deferred.append(problem)

    @staticmethod
    def _tampering(changed: list[str]) -> str | None:
        if not changed:
            return None
        shown = ", ".join(changed[:3]) + (f" (+{len(changed) - 3} more)" if len(changed) > 3 else "")
        return (f"your function changed {shown}: an answer must leave torch, the standard library and the workbook "
                f"as it found them (the checker computes its reference with them); it was put back")

    @staticmethod
    def _spying(events: list) -> str | None:
        for kind, what in events:
            if kind == "integrity":
                return f"your function {what}: an answer must not rewrite code"
            return (f"your function looked into the call stack or the garbage collector ({what}): the answer must "
                    f"come from the inputs, not from the checker's variables")
        return None

    @staticmethod
    def _unread(provenance: Provenance) -> str | None:
        unread = provenance.unread_inputs()
        if not unread:
            return None
        them = "them" if len(unread) > 1 else "it"
        return (f"your kernels were never handed {', '.join(unread)} (nor a copy): the kernel computes from its "
                f"inputs, so pass {them} to the kernel and read {them} there")


def guarded(fn: Callable, guard: Guard | None) -> Callable:
    """``fn``, each call run by ``guard`` (``fn`` itself when there is none). A broken rule raises
    :class:`Refused` from the call; the problems the checker's numbers should speak to first are
    kept in ``guard.deferred``."""
    if guard is None:
        return fn

    def call(*args, **kwargs):
        return guard.call(fn, *args, **kwargs)
    call.__name__ = getattr(fn, "__name__", "answer")
    call.guard = guard   # for a checker that drives the learner's object itself (Guard.watching)
    return call


