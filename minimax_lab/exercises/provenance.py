"""Where the bytes a learner's Triton kernel is handed come from.

A Triton exercise asks for its arithmetic inside the learner's kernel. Around the launch, PyTorch
may only prepare memory: allocate (``torch.empty``, ``zeros``, ``full``, ``arange``), take views,
and -- unless the copy is the exercise itself -- copy and cast. :class:`Provenance` watches every
PyTorch operator the learner's function runs, in its own thread and in every thread it starts
(a ``TorchDispatchMode`` entered there), and keeps for each tensor storage its :class:`Origin`:

* ``input`` -- a tensor the checker handed in (or a copy of one);
* ``made`` -- allocated, or filled whole with one value;
* ``kernel`` -- written by a Triton launch;
* ``computed`` -- the result of any other operator (``softmax``, ``exp``, ``matmul``, a copy where
  copies are not allowed, a custom ``torch.library`` operator, ...);
* ``python`` -- values written from Python (``torch.tensor``, item assignment).

Before each launch, :meth:`Provenance.check_launch` refuses a kernel handed a storage that was
computed, written from Python, never seen being made (made before the call, in a thread started
earlier, in another process, from numpy), or whose bytes changed since the last write it saw (a
write nobody could see: another thread, another process, ``ctypes``). It also notes which inputs
reached a kernel: an answer whose kernels never read an input did not compute from it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from minimax_lab.exercises.forbidden import launching

#: operators that allocate; their output holds no value the learner computed
ALLOCATE = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
                      "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like",
                      "new_full", "arange", "scalar_tensor"})
#: in-place fills with one value: a whole storage filled so is made, a part of one written from Python
FILL = frozenset({"fill_", "zero_"})
#: copies and casts: the output (or the written tensor) holds what its source held
COPY = frozenset({"clone", "_to_copy", "copy_", "_copy_from", "_copy_from_and_resize"})
#: tensors made from Python values
FROM_PYTHON = frozenset({"lift_fresh", "lift_fresh_copy"})
#: change a tensor's size or storage, not its values
KEEP = frozenset({"resize_", "set_"})


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where a storage's bytes came from: ``kind`` (see the module docstring), ``what`` (the
    operator or the kernel), ``inputs`` (the names of the inputs it holds a copy of), and whether
    it happened in another thread than the call's."""

    kind: str
    what: str = ""
    inputs: frozenset = frozenset()
    elsewhere: bool = False

    @property
    def clean(self) -> bool:
        return self.kind in ("input", "made", "kernel")

    def merged(self, other: "Origin") -> "Origin":
        """What a storage holds after part of it was overwritten by bytes of origin ``other``."""
        if not other.clean:
            return other
        if not self.clean:
            return self
        return Origin(self.kind if self.kind == other.kind else "input", self.what, self.inputs | other.inputs)


def storage_key(t: torch.Tensor) -> tuple:
    return t.device.type, t.device.index, t.untyped_storage().data_ptr()


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """All the bytes of ``t``'s storage, as a uint8 tensor sharing it."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _covers_storage(t: torch.Tensor) -> bool:
    """Whether ``t`` reaches every byte of its storage exactly once (in any order of dimensions)."""
    if t.storage_offset() != 0 or t.numel() * t.element_size() != t.untyped_storage().nbytes():
        return False
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) == t.numel()


def _tensors(value) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > 0]


def _op_name(func) -> str:
    return f"{func.namespace}.{func.overloadpacket.__name__}" if func.namespace != "aten" else \
        f"aten.{func.overloadpacket.__name__}"


class _Mode(TorchDispatchMode):
    """Reports every operator run in the thread that entered it to its :class:`Provenance`."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ to keep its compiler out, which imports the compiler
        # (seconds) on the first operator; nothing here is ever compiled
        return False

    def __init__(self, provenance: "Provenance"):
        super().__init__()
        self.provenance = provenance

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not launching() and self.provenance.open:
            self.provenance.record(func, args, kwargs, out)
        return out


class Provenance:
    """The origins of the storages a learner's function touches during one call (see the module
    docstring). ``copies``: whether PyTorch may copy and cast (False where the copy is the
    exercise). Enter :meth:`mode` in each thread to watch; :meth:`threads` makes the threads
    started inside its block watch themselves."""

    def __init__(self, inputs: dict[str, torch.Tensor], *, copies: bool = True):
        self.copies = copies
        self.open = True
        self.caller = threading.current_thread()
        self._lock = threading.Lock()
        self._origin: dict[tuple, Origin] = {}
        self._bytes: dict[tuple, torch.Tensor] = {}
        self.input_names: dict[str, tuple] = {}
        self.reached: set[str] = set()
        for name, t in inputs.items():
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > 0:
                key = storage_key(t)
                self.input_names[name] = key
                known = self._origin.get(key, Origin("input"))
                self._set(t, Origin("input", inputs=known.inputs | {name}))

    # ---------------------------------------------------------------- the watch

    def mode(self) -> TorchDispatchMode:
        return _Mode(self)

    @contextlib.contextmanager
    def threads(self):
        """Threads started inside the block run under this provenance's mode (``Thread.run`` is
        wrapped meanwhile)."""
        original = threading.Thread.run

        def run(thread):
            with self.mode():
                original(thread)
        threading.Thread.run = run
        try:
            yield
        finally:
            threading.Thread.run = original

    def close(self) -> None:
        """Stop recording (a thread that outlives the call keeps its mode, idle)."""
        self.open = False

    def _set(self, t: torch.Tensor, origin: Origin) -> None:
        key = storage_key(t)
        self._origin[key] = origin
        self._bytes[key] = storage_bytes(t).clone()

    def origin(self, t: torch.Tensor) -> Origin | None:
        return self._origin.get(storage_key(t))

    def record(self, func, args, kwargs, out) -> None:
        """One operator ran: update the origins of the storages it wrote or made."""
        name = func.overloadpacket.__name__
        elsewhere = threading.current_thread() is not self.caller
        computed = Origin("computed", _op_name(func), elsewhere=elsewhere)
        sources = _tensors((args, kwargs))
        with self._lock:
            source_keys = {storage_key(t) for t in sources}
            written = []
            for i, a in enumerate(func._schema.arguments):
                if a.alias_info is not None and a.alias_info.is_write:
                    value = args[i] if i < len(args) else kwargs.get(a.name)
                    written += _tensors(value)
            for t in written:
                if name in KEEP:
                    origin = self.origin(t) or Origin("made")
                elif name in FILL:
                    origin = Origin("made") if _covers_storage(t) else \
                        Origin("python", f"{_op_name(func)} on part of a tensor", elsewhere=elsewhere)
                elif name in COPY and self.copies:
                    src = [self.origin(s) or Origin("unseen") for s in sources if s is not t]
                    origin = src[0] if len(src) == 1 else computed
                    if not _covers_storage(t):
                        origin = (self.origin(t) or Origin("made")).merged(origin)
                else:
                    origin = computed
                self._set(t, origin)
            for t in _tensors(out):
                if any(t is w for w in written):
                    continue
                if name in FROM_PYTHON:
                    self._set(t, Origin("python", "torch.tensor or torch.from_numpy", elsewhere=elsewhere))
                elif storage_key(t) in source_keys:
                    continue                                     # a view of an input: same storage
                elif name in ALLOCATE:
                    self._set(t, Origin("made", _op_name(func)))
                elif name in COPY and self.copies and len(sources) == 1:
                    self._set(t, self.origin(sources[0]) or Origin("unseen"))
                else:
                    self._set(t, computed)

    # ---------------------------------------------------------------- launches

    def check_launch(self, kernel: str, tensors: list[tuple[int | str, torch.Tensor]]) -> str | None:
        """Why ``kernel`` may not be handed ``tensors`` (``(argument, tensor)`` pairs), or None;
        notes the inputs that reach it."""
        with self._lock:
            for arg, t in tensors:
                if t.untyped_storage().nbytes() == 0:
                    continue
                key = storage_key(t)
                origin = self._origin.get(key)
                where = f"{kernel} was handed a tensor (argument {arg})"
                if origin is None or origin.kind == "unseen":
                    return (f"{where} that your function did not make from its inputs while the checker watched: "
                            f"one made before the call (a global, a default argument), in a thread started before "
                            f"it, in another process, or outside PyTorch (numpy, ctypes). Hand your kernel the "
                            f"inputs, and buffers your function allocates")
                if not torch.equal(storage_bytes(t), self._bytes[key]):
                    return (f"{where} whose bytes changed since your function last wrote it, by code the checker "
                            f"could not see (a thread started before your function ran, another process, ctypes): "
                            f"hand your kernel the inputs, and buffers your function allocates")
                if origin.kind == "computed":
                    verb = "copied" if origin.what.split(".")[-1] in COPY else "computed"
                    thread = " in another thread" if origin.elsewhere else ""
                    return (f"{where} that PyTorch {verb} ({origin.what}{thread}): the exercise's work belongs "
                            f"inside your kernel -- around it, PyTorch may only {self.allowed()}")
                if origin.kind == "python":
                    return (f"{where} that holds values written from Python ({origin.what}): your kernel must "
                            f"compute them -- around it, PyTorch may only {self.allowed()}")
                self.reached |= origin.inputs
        return None

    def launched(self, t: torch.Tensor, kernel: str) -> None:
        """A launch of ``kernel`` wrote ``t``."""
        with self._lock:
            known = self.origin(t)
            self._set(t, Origin("kernel", kernel, known.inputs if known is not None else frozenset()))

    def allowed(self) -> str:
        return ("allocate, reshape, copy and cast" if self.copies else
                "allocate memory and take views -- here the copy is the exercise")

    def unread_inputs(self) -> list[str]:
        """The inputs no kernel was handed, neither themselves nor a copy."""
        return [name for name in self.input_names if name not in self.reached]
