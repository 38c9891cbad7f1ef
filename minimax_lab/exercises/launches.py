"""What Triton launched while a learner's function ran: how many kernels, which ones, what each
wrote -- and, with a :class:`~minimax_lab.exercises.provenance.Provenance`, whether each launch
was handed only what the exercise allows.

:func:`triton_launches` wraps ``JITFunction.run`` and ``InterpretedFunction.run`` (every launch,
compiled or interpreted, from any thread) for the duration of a block. A launch is refused
(:class:`~minimax_lab.exercises.forbidden.Refused`, before it runs) when its kernel is one of the
package's own (defined in ``minimax_lab`` outside ``minimax_lab.exercises.solutions``), when an
argument is a raw pointer rather than a tensor, or when its provenance refuses one of its tensors.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from minimax_lab.exercises.forbidden import Refused, inside_launch
from minimax_lab.exercises.provenance import Provenance, storage_bytes, storage_key

#: what a Triton exercise's checker says when the learner's answer launched no Triton kernel
NO_TRITON = ("no Triton kernel ran: this exercise is about writing one -- define it with @triton.jit and "
             "launch it as kernel[grid](...) inside your function (a PyTorch expression computes the same "
             "numbers, but it is not the exercise)")

#: what a Triton exercise's checker says when a kernel ran but the result came from elsewhere
NOT_BY_TRITON = ("a Triton kernel ran, but the result you returned is not what it wrote: the kernel must "
                 "store the output itself (tl.store into the tensor you return), not hand the work to PyTorch "
                 "around a kernel that does something else")


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


def tensors_in(value) -> list[torch.Tensor]:
    """The tensors in ``value`` (a tensor, or lists, tuples and dicts of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
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
def poisoned_empty():
    """``torch.empty``, ``empty_like``, ``empty_strided`` and ``Tensor.new_empty`` hand out poisoned
    tensors inside the block (their contents are unspecified, so any filling is allowed): a kernel's
    output then always differs from what the memory held before (freed memory may hold the very
    result)."""
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


def kernel_name(kernel) -> tuple[str, str]:
    """``(module, qualified name)`` of the Python function a launched kernel was made from."""
    fn = getattr(kernel, "fn", kernel)
    return getattr(fn, "__module__", "?") or "?", getattr(fn, "__qualname__", type(kernel).__name__)


def package_kernel(module: str) -> bool:
    """A kernel of the package itself (the exercises' solutions are the learner's to read)."""
    return module.split(".")[0] == "minimax_lab" and not module.startswith("minimax_lab.exercises.solutions")


class LaunchLog:
    """What Triton launched inside :func:`triton_launches`: how many kernels (``count``), what each
    one wrote (the bytes of every tensor argument a launch changed, as that launch left them), and
    the first launch refused (``refusal``). ``allow_package_kernels``: count the package's own
    kernels too (to count what a package call launches) instead of refusing them. ``kernel_rule``:
    ``kernel_rule(kernel)`` returns why a launched kernel is refused (None: accepted), for an
    exercise that asks for one way of writing it."""

    def __init__(self, provenance: Provenance | None = None, *, allow_package_kernels: bool = False,
                 kernel_rule: Callable[[object], str | None] | None = None):
        self.count = 0
        self.refusal: str | None = None
        self.provenance = provenance
        self.allow_package_kernels = allow_package_kernels
        self.kernel_rule = kernel_rule
        self._after: dict[tuple, torch.Tensor] = {}
        self._written: list[torch.Tensor] = []   # each tensor argument a launch changed, as it left it

    def __getitem__(self, name: str):
        if name != "count":
            raise KeyError(name)
        return self.count

    def _refused(self, kernel, name: str, args, kwargs) -> str | None:
        module, _ = kernel_name(kernel)
        if package_kernel(module) and not self.allow_package_kernels:
            return (f"you launched {module}.{name}, a kernel of the package: this exercise is to write the kernel "
                    f"yourself (@triton.jit in your notebook) and launch it")
        if self.kernel_rule is not None:
            problem = self.kernel_rule(kernel)
            if problem is not None:
                return problem
        arg_names = list(getattr(kernel, "arg_names", []))
        labelled = [(arg_names[i] if i < len(arg_names) else i, a) for i, a in enumerate(args)]
        labelled += [(k, v) for k, v in kwargs.items() if k not in ("grid", "warmup")]
        for label, value in labelled:
            if not isinstance(value, torch.Tensor) and hasattr(value, "data_ptr"):
                return (f"argument {label} of {name} is a {type(value).__name__}, not a tensor: pass tensors to your "
                        f"kernel (the checker follows what each launch is handed through them)")
        if self.provenance is None:
            return None
        return self.provenance.check_launch(name, [(label, t) for label, v in labelled for t in tensors_in(v)])

    def _launch(self, original, kernel, args, kwargs):
        with inside_launch():
            name = kernel_name(kernel)[1]
            problem = self._refused(kernel, name, args, kwargs)
            if problem is not None:
                self.refusal = self.refusal or problem
                raise Refused(problem)
            tensors = tensors_in(list(args) + list(kwargs.values()))
            before = {storage_key(t): storage_bytes(t).clone() for t in tensors}
            out = original(kernel, *args, **kwargs)
            self.count += 1
            for t in tensors:
                k = storage_key(t)
                after = storage_bytes(t)
                changed = not torch.equal(after, before[k])
                # bytes a kernel stored that happen to equal what was there (the allocator handed back
                # memory an earlier launch filled with the same result) still count as written by it
                rewritten = k in self._after and torch.equal(after, self._after[k])
                if changed or rewritten:
                    self._after[k] = after.clone()
                    self._written.append(self._view(self._after[k], t))
                    if self.provenance is not None:
                        self.provenance.launched(t, name)
            return out

    @staticmethod
    def _view(snap: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``t``'s elements as the storage bytes ``snap`` hold them."""
        return torch.empty(0, dtype=t.dtype, device=t.device).set_(snap.untyped_storage(), t.storage_offset(),
                                                                   t.size(), t.stride())

    def wrote(self, t: torch.Tensor) -> bool:
        """Whether ``t`` holds exactly what a Triton launch of this block wrote: into ``t``'s own
        storage, or into a tensor of which ``t`` is an exact reshape or dtype conversion."""
        if t.numel() == 0:   # nothing to write
            return True
        snap = self._after.get(storage_key(t))
        if snap is not None and _same(self._view(snap, t), t):
            return True
        return any(w.numel() == t.numel() and _same(w.reshape(t.shape).to(t.dtype), t) for w in self._written)

    def problem(self, *outputs) -> str | None:
        """The refused launch, ``NO_TRITON`` when no kernel ran, ``NOT_BY_TRITON`` when a tensor
        among ``outputs`` is not what a launch wrote, else None."""
        if self.refusal is not None:
            return self.refusal
        if self.count == 0:
            return NO_TRITON
        return NOT_BY_TRITON if any(not self.wrote(t) for t in tensors_in(list(outputs))) else None


@contextlib.contextmanager
def triton_launches(provenance: Provenance | None = None, *, allow_package_kernels: bool = False,
                    kernel_rule: Callable[[object], str | None] | None = None):
    """Watch the Triton kernel launches made inside the block, compiled or interpreted, in any
    thread::

        with triton_launches() as launched:
            out = learners_fn(x)
        problem = launched.problem(out)   # no kernel ran, or out is not what a kernel wrote

    ``launched["count"]`` is the number of launches. With ``provenance``, each launch's tensors
    are checked against it first (see the module docstring). A launch of one of the package's own
    kernels is refused (an exercise's answer must be the learner's kernel) unless
    ``allow_package_kernels``; so is one ``kernel_rule(kernel)`` gives a reason for."""
    log = LaunchLog(provenance, allow_package_kernels=allow_package_kernels, kernel_rule=kernel_rule)
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
