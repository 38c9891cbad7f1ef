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
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import pkgutil
import random
import traceback
from typing import Callable

import torch
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

#: problems a checker reports for one attempt (empty: correct)
Problems = list


def fresh_rng() -> random.Random:
    """A random generator seeded from the OS: every check draws new cases."""
    return random.Random()


def tensor_problem(got, call: str, shape: tuple, dtype: torch.dtype | None = None) -> str | None:
    """Why ``got`` (what ``call`` returned) is not a tensor of ``shape`` (and ``dtype``), or None."""
    if not isinstance(got, torch.Tensor):
        return f"{call} returned a {type(got).__name__}, not a tensor"
    if tuple(got.shape) != tuple(shape) or (dtype is not None and got.dtype != dtype):
        want = f"{str(dtype).replace('torch.', '')} tensor" if dtype is not None else "tensor"
        return (f"{call} should be a {want} of shape {tuple(shape)}; got "
                f"{str(got.dtype).replace('torch.', '')} of shape {tuple(got.shape)}")
    return None


#: what a Triton exercise's checker says when the learner's answer launched no Triton kernel
NO_TRITON = ("no Triton kernel ran: this exercise is about writing one -- define it with @triton.jit and "
             "launch it as kernel[grid](...) inside your function (a PyTorch expression computes the same "
             "numbers, but it is not the exercise)")


#: what a Triton exercise's checker says when a kernel ran but the result came from elsewhere
NOT_BY_TRITON = ("a Triton kernel ran, but the result you returned is not what it wrote: the kernel must "
                 "store the output itself (tl.store into the tensor you return), not hand the work to PyTorch "
                 "around a kernel that does something else")


def _storage_key(t: torch.Tensor) -> tuple:
    return t.device.type, t.device.index, t.untyped_storage().data_ptr()


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """All the bytes of ``t``'s storage, as a uint8 tensor sharing it."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal element for element (NaN equal to NaN)."""
    if a.shape != b.shape:
        return False
    if a.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        a, b = a.float(), b.float()
    same = a == b
    if a.is_floating_point():
        same |= torch.isnan(a) & torch.isnan(b)
    return bool(same.all())


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _poison(t: torch.Tensor) -> torch.Tensor:
    """Fill an uninitialised tensor with NaN (floats) or a sentinel (ints); dtypes that cannot be
    filled are left as they are."""
    try:
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype == torch.bool:
            t.fill_(True)
        else:
            t.fill_(-12345 if t.dtype.is_signed else 123)
    except (RuntimeError, TypeError):
        pass
    return t


@contextlib.contextmanager
def _poisoned_empty():
    """``torch.empty``, ``empty_like``, ``empty_strided`` and ``Tensor.new_empty`` hand out poisoned
    tensors inside the block (their contents are unspecified, so any filling is allowed)."""
    owners = [(torch, "empty"), (torch, "empty_like"), (torch, "empty_strided"), (torch.Tensor, "new_empty")]
    saved = [(owner, name, getattr(owner, name)) for owner, name in owners]

    def poisoning(original):
        def allocate(*args, **kwargs):
            return _poison(original(*args, **kwargs))
        return allocate

    for owner, name, original in saved:
        setattr(owner, name, poisoning(original))
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


class LaunchLog:
    """What Triton launched inside :func:`triton_launches`: how many kernels, and what each one
    wrote (the bytes of every tensor argument a launch changed, as that launch left them)."""

    def __init__(self):
        self.count = 0
        self.results: list = []
        self._after: dict[tuple, torch.Tensor] = {}
        self._written: list[torch.Tensor] = []   # each tensor argument a launch changed, as it left it

    def __getitem__(self, name: str):
        if name != "count":
            raise KeyError(name)
        return self.count

    def _launch(self, original, kernel, args, kwargs):
        tensors = _tensors(list(args) + list(kwargs.values()))
        before = {_storage_key(t): _storage_bytes(t).clone() for t in tensors}
        out = original(kernel, *args, **kwargs)
        self.count += 1
        for t in tensors:
            k = _storage_key(t)
            after = _storage_bytes(t)
            changed = not torch.equal(after, before[k])
            # bytes a kernel stored that happen to equal what was there (the allocator handed back
            # memory an earlier launch filled with the same result) still count as written by it
            rewritten = k in self._after and torch.equal(after, self._after[k])
            if changed or rewritten:
                self._after[k] = after.clone()
                self._written.append(self._view(self._after[k], t))
        return out

    @staticmethod
    def _view(snap: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``t``'s elements as the storage bytes ``snap`` hold them."""
        return torch.empty(0, dtype=t.dtype, device=t.device).set_(snap.untyped_storage(), t.storage_offset(),
                                                                   t.size(), t.stride())

    def watch(self, fn: Callable) -> Callable:
        """``fn``, keeping every result it returns in :attr:`results`. While it runs, the tensors it
        allocates uninitialised (``torch.empty`` and kin) start poisoned, so a kernel's output
        always differs from what the memory held before (freed memory may hold the very result)."""
        def call(*args, **kwargs):
            with _poisoned_empty():
                result = fn(*args, **kwargs)
            self.results.append(result)
            return result
        return call

    def wrote(self, t: torch.Tensor) -> bool:
        """Whether ``t`` holds exactly what a Triton launch of this block wrote: into ``t``'s own
        storage, or into a tensor of which ``t`` is an exact reshape or dtype conversion."""
        if t.numel() == 0:   # nothing to write
            return True
        snap = self._after.get(_storage_key(t))
        if snap is not None and _same(self._view(snap, t), t):
            return True
        return any(w.numel() == t.numel() and _same(w.reshape(t.shape).to(t.dtype), t) for w in self._written)

    def problem(self, *outputs) -> str | None:
        """``NO_TRITON`` when no kernel ran, ``NOT_BY_TRITON`` when a tensor among ``outputs`` (and
        among :attr:`results` when ``outputs`` is empty) is not what a launch wrote, else None.
        :func:`verdict` asks it of every Triton exercise whose checker found the numbers right."""
        if self.count == 0:
            return NO_TRITON
        found = _tensors(list(outputs) if outputs else self.results)
        return NOT_BY_TRITON if any(not self.wrote(t) for t in found) else None


@contextlib.contextmanager
def triton_launches():
    """Watch the Triton kernel launches made inside the block, compiled or interpreted::

        with triton_launches() as launched:
            out = learners_fn(x)
        problem = launched.problem(out)   # no kernel ran, or out is not what a kernel wrote

    ``launched["count"]`` is the number of launches."""
    log = LaunchLog()
    originals = [(cls, cls.run) for cls in (JITFunction, InterpretedFunction)]

    def watching(original):
        def run(self, *args, **kwargs):
            return log._launch(original, self, args, kwargs)
        return run

    for cls, original in originals:
        cls.run = watching(original)
    try:
        yield log
    finally:
        for cls, original in originals:
            cls.run = original


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

    @property
    def chapter(self) -> str:
        return self.key.split(".")[0]

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


_REGISTRY: dict[str, Exercise] = {}


def exercise(key: str, title: str, task: str, stub: Callable, *,
             writes_triton: bool = False) -> Callable[[Callable], Callable]:
    """Decorator for a chapter module's checker: registers ``Exercise(key, title, task, stub, checker)``.
    ``writes_triton``: the learner writes a Triton kernel, and the checker refuses an answer that
    launches none (:func:`triton_launches`).

    Raises ValueError for a key that is not ``"NN.M"`` or is registered twice."""
    chapter, _, number = key.partition(".")
    if not (len(chapter) == 2 and chapter.isdigit() and number.isdigit()):
        raise ValueError(f"exercise key must look like '02.1', got {key!r}")
    if key in _REGISTRY:
        raise ValueError(f"exercise {key!r} is registered twice")

    def register(checker: Callable[[Callable], Problems]) -> Callable[[Callable], Problems]:
        _REGISTRY[key] = Exercise(key, title, task, stub, checker, writes_triton)
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
    if not ex.writes_triton:
        return Verdict(key, ex.title, run_checker(ex, fn))
    with triton_launches() as launched:
        problems = run_checker(ex, launched.watch(fn))
    if not problems and launched.problem():  # right numbers, but not the ones a kernel of the learner wrote
        problems = [launched.problem()]
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
