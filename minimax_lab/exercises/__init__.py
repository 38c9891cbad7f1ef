"""The workbook's exercises: a stub the learner fills in, a checker that says what is wrong, and a
solution kept apart.

Each chapter has a module ``minimax_lab.exercises.chNN`` that registers its exercises with
:func:`exercise`; its solutions live in ``minimax_lab.exercises.solutions.chNN``, one function per
exercise, named like the stub. In a notebook::

    from minimax_lab import exercises

    def tail_mask(n_cols, block):        # the stub, as the notebook shows it: fill it in
        raise NotImplementedError

    exercises.check("02.1", tail_mask)   # shows what is right or wrong; never raises for a wrong answer

A checker receives the learner's function and returns the list of problems it found (an empty
list: correct). It draws fresh random inputs on each call (ragged sizes, poisoned outputs,
held-out shapes where the exercise has them), so no fixed answer passes. :func:`check` turns an
exception the learner's code raises into a problem ("not written yet" for the untouched stub's
``NotImplementedError``), so a notebook runs top to bottom with every stub untouched.

Only the learner's own work passes: every call the checker makes runs under the exercise's
:class:`~minimax_lab.exercises.guard.Guard`, which refuses the package's own answer in any form
(an alias, a method, another thread or process), changes to what the checker computes with, a
look at the checker's variables, and -- where the learner writes Triton -- a kernel that does not
do the work (:mod:`.provenance`: PyTorch may only allocate, reshape, copy and cast around it).
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import random
import traceback
from typing import Callable

import torch

from minimax_lab import runtime
from minimax_lab.exercises.forbidden import Refused
from minimax_lab.exercises.guard import Guard, guarded
from minimax_lab.exercises.launches import NO_TRITON, NOT_BY_TRITON, LaunchLog, triton_launches

__all__ = ["Exercise", "Guard", "LaunchLog", "NOT_BY_TRITON", "NO_TRITON", "Problems", "Refused", "Verdict",
           "all_exercises", "check", "exercise", "fresh_rng", "get", "on_kernel_device", "run_checker",
           "tensor_problem", "triton_launches", "verdict"]

#: problems a checker reports for one attempt (empty: correct)
Problems = list


def fresh_rng() -> random.Random:
    """A random generator seeded from the OS: every check draws new cases."""
    return random.Random()


def on_kernel_device(t: torch.Tensor) -> torch.Tensor:
    """``t`` on ``runtime.kernel_device()`` with the same strides and offset (a view into a larger
    buffer stays one: the buffer moves with it). ``t`` itself when it is there already. Checkers
    draw their inputs on the CPU (one seed, the same numbers everywhere) and hand the learner these."""
    dev = runtime.kernel_device()
    if t.device == dev:
        return t
    flat = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (t.untyped_storage().nbytes() // t.element_size(),))
    return flat.to(dev).as_strided(t.shape, t.stride(), t.storage_offset())


def tensor_problem(got, call: str, shape: tuple, dtype: torch.dtype | None = None) -> str | None:
    """Why ``got`` (what ``call`` returned) is not a tensor of ``shape`` (and ``dtype``), or None."""
    if not isinstance(got, torch.Tensor):
        return f"{call} returned a {type(got).__name__}, not a tensor"
    if tuple(got.shape) != tuple(shape) or (dtype is not None and got.dtype != dtype):
        want = f"{str(dtype).replace('torch.', '')} tensor" if dtype is not None else "tensor"
        return (f"{call} should be a {want} of shape {tuple(shape)}; got "
                f"{str(got.dtype).replace('torch.', '')} of shape {tuple(got.shape)}")
    return None


@dataclasses.dataclass(frozen=True)
class Exercise:
    """One exercise. ``key`` is ``"<chapter>.<number>"`` (``"02.1"``); ``stub`` is the untouched
    function the notebook shows; ``checker(fn)`` returns the problems it finds in ``fn``."""

    key: str
    title: str
    task: str
    stub: Callable
    checker: Callable[[Callable], Problems]
    writes_triton: bool = False
    answers: tuple = ()
    copies: bool = True
    guarded: bool = True
    kernel_rule: Callable[[object], str | None] | None = None

    @property
    def chapter(self) -> str:
        return self.key.split(".")[0]

    def guard(self) -> Guard | None:
        """The rules every call of the learner's function runs under (:mod:`.guard`), or None for
        an exercise that runs unguarded."""
        if not self.guarded:
            return None
        return Guard({f: answer_problem(f) for f in self.answers}, triton=self.writes_triton, copies=self.copies,
                     stub=self.stub, kernel_rule=self.kernel_rule)

    def solution(self) -> Callable:
        """The solution: ``solutions.ch<chapter>.<stub's name>``."""
        module = importlib.import_module(f"{__name__}.solutions.ch{self.chapter}")
        return getattr(module, self.stub.__name__)


@dataclasses.dataclass
class Verdict:
    """What :func:`check` found: ``passed`` and the problems (empty when passed)."""

    key: str
    title: str
    problems: list[str]

    @property
    def passed(self) -> bool:
        return not self.problems

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        if self.passed:
            return f"[pass] {self.key} {self.title}: correct on every input the checker drew"
        lines = [f"[not yet] {self.key} {self.title}:"] + [f"  - {p}" for p in self.problems]
        return "\n".join(lines)

    def _repr_markdown_(self) -> str:
        if self.passed:
            return f"**✅ {self.key} {self.title}**: correct on every input the checker drew."
        items = "\n".join(f"- {p}" for p in self.problems)
        return f"**❌ {self.key} {self.title}**, not yet:\n\n{items}"


def answer_problem(target) -> str:
    """What a call of ``target`` (a function the answer may not call) is told: the checker's own
    reference, or the package's own answer."""
    module = getattr(target, "__module__", "") or ""
    whose = "the checker's own reference" if module.startswith(__name__) else "the package's own answer"
    return (f"your answer called {{name}}, {whose}: this exercise asks you to write that logic yourself (it is how "
            f"the checker knows the right result)")


_REGISTRY: dict[str, Exercise] = {}


def exercise(key: str, title: str, task: str, stub: Callable, *, writes_triton: bool = False, answers: tuple = (),
             copies: bool = True, guarded: bool = True,
             kernel_rule: Callable[[object], str | None] | None = None) -> Callable[[Callable], Callable]:
    """Decorator for a chapter module's checker: registers ``Exercise(key, title, task, stub, checker)``.

    Every call the checker makes of the learner's function runs under the exercise's
    :class:`~minimax_lab.exercises.guard.Guard`: ``answers`` lists the functions (or classes) that
    compute the exercise's answer -- the package's and the checker's own references -- which the
    answer may not call in any form. ``writes_triton``: the learner writes a Triton kernel, which
    must do the work (:mod:`.provenance`, :mod:`.launches`); ``copies``: PyTorch may copy and cast
    around it (False where the copy is the exercise). ``guarded=False``: no guard (an exercise
    whose answer is meant to tamper, judged by a harness that watches for it). ``kernel_rule(kernel)``:
    why a kernel the answer launches is refused, or None (an exercise that asks for one way of
    writing it).

    Raises ValueError for a key that is not ``"NN.M"`` or is registered twice."""
    chapter, _, number = key.partition(".")
    if not (len(chapter) == 2 and chapter.isdigit() and number.isdigit()):
        raise ValueError(f"exercise key must look like '02.1', got {key!r}")
    if key in _REGISTRY:
        raise ValueError(f"exercise {key!r} is registered twice")

    def register(checker: Callable[[Callable], Problems]) -> Callable[[Callable], Problems]:
        _REGISTRY[key] = Exercise(key, title, task, stub, checker, writes_triton, tuple(answers), copies, guarded,
                                  kernel_rule)
        return checker
    return register


def _load_chapters() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("ch"):
            importlib.import_module(f"{__name__}.{info.name}")


def all_exercises(chapter: str | None = None) -> list[Exercise]:
    """Every registered exercise (of ``chapter``, e.g. ``"02"``), in key order."""
    _load_chapters()
    found = [e for e in _REGISTRY.values() if chapter is None or e.chapter == chapter]
    return sorted(found, key=lambda e: (e.chapter, int(e.key.split(".")[1])))


def get(key: str) -> Exercise:
    """The exercise ``key``; KeyError naming the ones that exist."""
    _load_chapters()
    if key not in _REGISTRY:
        raise KeyError(f"no exercise {key!r}; there are {sorted(_REGISTRY)}")
    return _REGISTRY[key]


def run_checker(ex: Exercise, fn: Callable) -> list[str]:
    """``ex.checker(fn)``, with an exception from the learner's code turned into a problem."""
    try:
        return list(ex.checker(fn))
    except Refused as e:  # the answer broke a rule of the exercise: the guard says which
        return [e.problem]
    except NotImplementedError:
        return ["not written yet: the stub still raises NotImplementedError"]
    except Exception as e:  # the learner's code failed: say where, briefly
        frames = traceback.extract_tb(e.__traceback__)
        where = next((f"line {f.lineno} of {f.name}" for f in reversed(frames)
                      if "minimax_lab" not in f.filename and "site-packages" not in f.filename), "")
        return [f"raised {type(e).__name__}: {e}" + (f" (in {where})" if where else "")]


def verdict(key: str, fn: Callable) -> Verdict:
    """The checker's verdict on the learner's ``fn`` for exercise ``key``, without showing it.

    Never raises for a wrong or unfinished answer. Raises KeyError for an unknown key and
    TypeError when ``fn`` is not callable."""
    ex = get(key)
    if not callable(fn):
        raise TypeError(f"exercise {key} checks a function; got {type(fn).__name__}")
    guard = ex.guard()
    problems = run_checker(ex, guarded(fn, guard))
    if not problems and guard is not None and guard.deferred:  # right numbers, not written by the learner's kernel
        problems = guard.deferred[:1]
    return Verdict(key, ex.title, problems)


def check(key: str, fn: Callable) -> None:
    """Check the learner's ``fn`` for exercise ``key`` and show the verdict (what is right, or each
    problem found). Same errors as :func:`verdict`; a wrong answer is shown, never raised."""
    _show(verdict(key, fn))


def _show(verdict: Verdict) -> None:
    """Rendered Markdown inside a Jupyter kernel, plain text elsewhere."""
    try:  # deferred: IPython is optional (the GPU image runs notebooks without it)
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(Markdown(verdict._repr_markdown_()))
    else:
        print(verdict)
