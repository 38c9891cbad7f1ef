"""Harness integrity: what the judge computes with, recorded before a candidate runs and put back
after every call.

A candidate that runs in the harness's process can replace any function there: the comparison
that judges it, a function the reference computes with (``torch.exp``), one the inputs are drawn
with (``torch.randn``), one the timer's statistic goes through (``statistics.median``). So
:func:`trusted` records (:class:`Snapshot`) every function, class and module bound in

* the namespaces of ``builtins`` (except :data:`SHELL_BUILTINS`), ``torch``, ``torch.Tensor``,
  ``torch.nn.functional``, ``torch.linalg``, ``torch.testing``, ``torch.cuda`` (and
  ``torch.cuda.Event``), ``math``, ``statistics``, ``time``, ``random`` (and ``random.Random``),
  ``numpy``, ``secrets``, ``os`` and ``threading`` (and ``threading.Thread``);
* every module of the workbook that judging, timing or a reference reaches when the snapshot is
  taken (``minimax_lab.measure``, ``.bench``, ``.kernelbench``, ``.attention``, ``.paged_kv``, ``.moe``, the
  runtime, validation and FP8 helpers), with their constants (``FLOOR_SLACK``, ...) and the
  classes they define, and every problem of :data:`.problems.PROBLEMS`, field by field;

and :class:`Settings` records torch's global state that changes what the same call computes or
how fast it runs: the ``__torch_function__`` and ``__torch_dispatch__`` mode stacks, kernels
registered for built-in (``aten``, ``prims``) operators through ``torch.library`` on any dispatch
key but ``Meta`` -- ``CPU``, ``CUDA``, ``Autograd``, ``CompositeImplicitAutograd``, ..., a key
registered for the first time or once more (:class:`Registrations`) --, the default dtype, grad
mode, the thread count, matmul precision, deterministic algorithms, and on a machine with a CUDA
GPU TF32 and SDPA's backends.

The protocol, around every call of a candidate: :func:`accept_all` right before it (what trusted
code changed since -- a module imported on first use that wraps a torch function, a notebook
cell -- is taken as the state to keep), then :func:`restore_all` right after it returns, before
the harness runs any more of its code: everything the call replaced, deleted, or hid (a new name
that shadows a builtin or a base class's attribute) is named and put back. The same happens around
importing a candidate's module. The audit hook (:func:`start_watch`) sees, during a call, frame
walks and garbage-collector scans (**no introspection**) and a function's code being rewritten. A
frame read by the standard library for itself (``logging`` finding the line of a log call,
``namedtuple`` its caller's module) is not the candidate's; one handed out to it (``inspect``,
``traceback``, ``logging.currentframe``) is.

What this cannot stop, because the candidate shares the process: a candidate that edits the
record itself (:func:`trusted`, :meth:`Snapshot.accept`), the mutable state the harness keeps
(caches, the contents of lists and dicts and tensors), objects it reaches through the garbage
collector unseen, kernels registered with the C++ dispatcher directly, and memory written through
``ctypes``. Isolated mode (:mod:`.isolate`) stops those: there, judging and timing happen in
another process.

Cost: comparing every watched name around every call would cost more than all the other checks
of a call together. On CPython 3.8-3.13 every dict carries a version tag that changes with each
modification (PEP 509); reading it (through ``ctypes``) tells which namespaces changed at all, so
only those are compared. A self-test at import decides; on other interpreters every namespace is
compared name by name.
"""
from __future__ import annotations

import builtins
import ctypes
import dataclasses
import gc
import inspect
import logging
import math
import operator
import os
import random
import re
import secrets
import statistics
import sys
import sysconfig
import threading
import time
import traceback
import types
import warnings
import weakref
from typing import Any, Callable

import numpy
import torch
import torch.library
import torch.nn.functional

from minimax_lab.kernelbench.calls import library_file

#: the standard namespaces every candidate call is checked against (besides the workbook's own)
STANDARD_MODULES = (builtins, torch, torch.nn.functional, torch.linalg, torch.testing, torch.cuda, math, statistics,
                    time, random, numpy, secrets, os, threading)
STANDARD_CLASSES = (torch.Tensor, torch.cuda.Event, random.Random, threading.Thread)
#: the workbook's packages on the path of judging, timing and the problems' references
JUDGING_PACKAGES = ("minimax_lab.measure", "minimax_lab.bench", "minimax_lab.kernelbench", "minimax_lab.attention",
                    "minimax_lab.paged_kv", "minimax_lab.kvcache", "minimax_lab.moe", "minimax_lab.configs")
JUDGING_MODULES = ("minimax_lab", "minimax_lab.runtime", "minimax_lab.validate", "minimax_lab.fp8", "minimax_lab.sdpa",
                   "minimax_lab.triton_blocks", "minimax_lab.resources")
#: names an interactive shell rebinds between cells (IPython's ``input`` and output history): not watched
SHELL_BUILTINS = frozenset({"input", "_", "__", "___"})
#: constants (besides functions, classes and modules) are watched in these: numbers, strings, tuples
_CONSTANTS = (int, float, complex, str, bytes, tuple, frozenset, torch.dtype)
_IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: attributes of such a class cannot be set at all
_MISSING = object()


# --------------------------------------------------------------------------- the audit hook

_SPY_EVENTS = frozenset({"sys._getframe", "sys._current_frames", "gc.get_objects", "gc.get_referrers",
                         "gc.get_referents", "sys.settrace", "sys.setprofile"})
_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})  # reading one reaches a frame
_CODE_ATTRS = frozenset({"__code__", "__defaults__", "__kwdefaults__"})  # writing one rewrites a function
_STDLIB = (os.path.realpath(sysconfig.get_paths()["stdlib"]),)
_watch = {"log": None}  # the list a watched call's events go to (None: nothing is watched)
_watch_state = threading.local()


def _audit_kind(event: str, args) -> tuple[str, str] | None:
    """``(kind, what)`` for the audit events a candidate must not raise, else None."""
    if event in _SPY_EVENTS:
        return "introspection", event
    if event == "object.__getattr__" and len(args) > 1 and args[1] in _FRAME_ATTRS:
        return "introspection", f"{type(args[0]).__name__}.{args[1]}"
    if event == "object.__setattr__" and len(args) > 1 and args[1] in _CODE_ATTRS:
        return "integrity", f"rewrote {getattr(args[0], '__qualname__', '?')}.{args[1]}"
    return None


def _standard_library(code) -> bool:
    return code.co_filename.startswith("<frozen ") or os.path.realpath(code.co_filename).startswith(_STDLIB)


def _hands_out_frames(code) -> bool:
    """Whether a standard-library function the candidate called gives it frames: ``inspect``'s and
    ``traceback``'s functions, and ``logging.currentframe``. Other standard-library code that reads
    a frame does it for itself -- ``logging`` finds the file and line of a log call, ``namedtuple``
    and ``typing`` the module of their caller, ``warnings`` its stack level, an import its caller
    -- and hands no frame to the candidate."""
    return (os.path.realpath(code.co_filename) in _FRAME_MODULES
            or code is getattr(getattr(logging, "currentframe", None), "__code__", None))


_FRAME_MODULES = frozenset(os.path.realpath(m.__file__) for m in (inspect, traceback))


def _audit_hook(event: str, args) -> None:
    log = _watch["log"]
    if log is None or getattr(_watch_state, "busy", False):
        return
    kind = _audit_kind(event, args)
    if kind is None:
        return
    _watch_state.busy = True
    try:
        f, entry = sys._getframe(1), None
        while f is not None and _standard_library(f.f_code):
            f, entry = f.f_back, f.f_code  # entry: the standard-library function the caller called
        if entry is not None and kind[0] == "introspection" and not _hands_out_frames(entry):
            return  # logging.warning(...), a namedtuple: the standard library reading a frame for itself
        where = f"{f.f_code.co_filename}:{f.f_lineno}" if f is not None else "?"
        if f is None or not library_file(f.f_code.co_filename):  # torch/triton internals are not the candidate
            log.append((kind[0], f"{kind[1]} from {where}"))
    finally:
        _watch_state.busy = False


sys.addaudithook(_audit_hook)  # audit hooks cannot be removed; this one is idle unless a call is watched


def start_watch(log: list) -> None:
    """Send the audit events of the call about to run (any thread) to ``log`` as ``(kind, what)``:
    kind ``"introspection"`` (frames, gc) or ``"integrity"`` (a function's code rewritten)."""
    _watch["log"] = log


def stop_watch() -> None:
    _watch["log"] = None


# --------------------------------------------------------------------------- dict versions


def _version_reader() -> Callable[[dict], Any] | None:
    """A function giving a live view of a dict's version tag (``view.value``), or None where the
    self-test fails: CPython 3.8-3.13 bump ``ma_version_tag`` on every change of a dict (PEP 509);
    another interpreter, a free-threaded build or a newer layout falls back to full comparisons."""
    if (sys.implementation.name != "cpython" or not (3, 8) <= sys.version_info[:2] <= (3, 13)
            or sysconfig.get_config_var("Py_GIL_DISABLED")):
        return None
    offset = object.__basicsize__ + ctypes.sizeof(ctypes.c_ssize_t)  # PyObject_HEAD, then ma_used

    def view(d: dict):
        return ctypes.c_uint64.from_address(id(d) + offset)

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        a: Any = 1

    class Cls:
        a = 1

    mod = types.ModuleType("version_probe")
    mod.a = 1
    obj = Frozen()
    probes = [({"a": 1}, lambda d: d.__setitem__("a", object())), ({"a": 1}, lambda d: d.pop("a")),
              (vars(mod), lambda d: setattr(mod, "a", object())),
              (gc.get_referents(vars(Cls))[0], lambda d: setattr(Cls, "a", object())),
              (vars(obj), lambda d: object.__setattr__(obj, "a", object()))]
    for d, change in probes:
        v = view(d)
        before = v.value
        if v.value != before:
            return None
        change(d)
        if v.value == before:
            return None
    return view


_VERSION = _version_reader()
_TAG_VALUE = operator.attrgetter("value")
#: the code of the wrapper torch's ``_disable_dynamo`` puts around a function (importing
#: ``torch._dynamo`` the first time wraps ``torch.manual_seed`` so): it calls the function it wraps
_DYNAMO_WRAPPER = torch._disable_dynamo(lambda: None).__code__ if hasattr(torch, "_disable_dynamo") else None


def _torch_own_wrap(now, before, _getattr=getattr) -> bool:
    """``now`` is torch's ``_disable_dynamo`` wrapper around ``before``: the same function, which
    torch itself installs when it first imports ``torch._dynamo`` -- not a candidate's patch."""
    return (_DYNAMO_WRAPPER is not None and _getattr(now, "__code__", None) is _DYNAMO_WRAPPER
            and _getattr(now, "__wrapped__", None) is before)


# --------------------------------------------------------------------------- namespaces


def _watched(value, constants: bool) -> bool:
    if callable(value) or isinstance(value, (types.ModuleType, torch.dtype)):
        return True
    return constants and isinstance(value, _CONSTANTS)


@dataclasses.dataclass
class Namespace:
    """One watched dict: a module's, a class's, an object's, or a plain dict (``kind``)."""

    label: str
    owner: Any
    table: dict
    kind: str  # "module", "class", "object", "dict"
    constants: bool = False  # watch numbers, strings and tuples too (a module's own settings)
    expected: dict = dataclasses.field(default_factory=dict)  # name -> the object trusted there
    known: set = dataclasses.field(default_factory=set)  # every name there then: a name outside it is new
    version: Any = None  # a live view of the dict's version tag (or None)
    seen: int | None = None  # the version when last compared

    def trust(self) -> None:
        """Take what the dict holds now as what it should hold."""
        table = self.table
        if self.kind in ("class", "object", "dict"):
            self.expected = dict(table)
        else:
            skip = SHELL_BUILTINS if self.owner is builtins else ()
            self.expected = {k: v for k, v in table.items() if _watched(v, self.constants) and k not in skip}
        self.known = set(table)
        self.seen = self.version.value if self.version is not None else None
        self.expect(self.expected)

    def expect(self, expected: dict) -> None:
        """Expect ``expected`` (name -> object) from now on."""
        self.expected = expected
        names = tuple(expected)
        self._objs = tuple(expected.values())
        self._get = operator.itemgetter(*names) if len(names) > 1 else lambda t, n=names: tuple(t[k] for k in n)

    def _same_objects(self, _all=all, _map=map, _is=operator.is_, _KeyError=KeyError) -> bool:
        try:
            now = self._get(self.table)
        except _KeyError:  # a watched name was deleted
            return False
        return _all(_map(_is, now, self._objs))

    def _put(self, name: str, obj) -> None:
        if self.kind == "class":
            type.__setattr__(self.owner, name, obj)
        else:
            self.table[name] = obj

    def _remove(self, name: str) -> None:
        if self.kind == "class":
            type.__delattr__(self.owner, name)
        else:
            del self.table[name]

    def _hides(self, name: str) -> str | None:
        """What a name added here hides: a base class's attribute, a builtin, or nothing."""
        if self.kind == "class":
            base = next((b for b in self.owner.__mro__[1:] if name in vars(b)), None)
            return f"{base.__qualname__}.{name}" if base is not None else None
        if self.kind == "object":
            return f"{type(self.owner).__qualname__}.{name}" if hasattr(type(self.owner), name) else None
        if self.kind == "module" and self.owner is not builtins and name in vars(builtins):
            return f"the builtin {name}"
        return None

    def unchanged(self) -> bool:
        """True when the dict has not been modified since it was last compared (needs versions)."""
        return self.version is not None and self.version.value == self.seen

    def intact(self) -> bool:
        """True when no watched name was replaced or deleted and no name was added (the whole
        comparison, for interpreters without dict versions)."""
        return self.unchanged() or (self.table.keys() == self.known and self._same_objects())

    def restore(self, _len=len, _list=list) -> list[str]:
        """Put back every watched name that was replaced or deleted, remove new names that hide
        something; returns what was changed. (The builtins it runs on are bound when it is defined:
        replacing them cannot blind it.)"""
        table, changed = self.table, []
        if not self._same_objects():
            for name, obj in _list(self.expected.items()):
                now = table.get(name, _MISSING)
                if now is obj:
                    continue
                if _torch_own_wrap(now, obj):
                    self.expect({**self.expected, name: now})
                    continue
                changed.append(f"{self.label}.{name}" + (" (deleted)" if now is _MISSING else ""))
                self._put(name, obj)
        if _len(table) != _len(self.known) or self.version is not None:
            for name in [n for n in table if n not in self.known]:
                hidden = self._hides(name)
                if hidden is None:
                    self.known.add(name)  # a new submodule, a warnings registry: hides nothing
                else:
                    changed.append(f"{self.label}.{name} (added, hiding {hidden})")
                    self._remove(name)
        if self.version is not None:
            self.seen = self.version.value
        return changed


def _namespace(label: str, owner, kind: str, constants: bool) -> Namespace:
    if kind == "class":
        table = gc.get_referents(vars(owner))[0]  # the dict behind the class's mappingproxy
    else:
        table = owner if kind == "dict" else vars(owner)
    ns = Namespace(label, owner, table, kind, constants, version=_VERSION(table) if _VERSION is not None else None)
    ns.trust()
    return ns


def _judging_modules() -> list[types.ModuleType]:
    names = [n for n in list(sys.modules) if n in JUDGING_MODULES
             or any(n == p or n.startswith(p + ".") for p in JUDGING_PACKAGES)]
    return [sys.modules[n] for n in sorted(names) if isinstance(sys.modules[n], types.ModuleType)]


class Snapshot:
    """Every watched namespace as it was when :meth:`capture` ran (see the module docstring)."""

    def __init__(self, namespaces: list[Namespace]):
        self.namespaces = namespaces
        self._tags = [ns.version for ns in namespaces] if _VERSION is not None else None
        self._seen = [ns.seen for ns in namespaces]  # each namespace's version when last compared

    @classmethod
    def capture(cls, problems: dict | None = None) -> "Snapshot":
        """Record the standard namespaces, the workbook's judging modules loaded now and the
        classes they define, and ``problems`` (name -> Problem) with the dict that holds them."""
        spaces = [_namespace(m.__name__, m, "module", m is math) for m in STANDARD_MODULES]
        spaces += [_namespace(f"{c.__module__}.{c.__qualname__}", c, "class", False) for c in STANDARD_CLASSES]
        for m in _judging_modules():
            spaces.append(_namespace(m.__name__, m, "module", True))
            for v in list(vars(m).values()):
                if (isinstance(v, type) and v.__module__ == m.__name__ and not v.__flags__ & _IMMUTABLE_TYPE
                        and "<locals>" not in v.__qualname__):
                    spaces.append(_namespace(f"{m.__name__}.{v.__qualname__}", v, "class", False))
        if problems is not None:
            spaces.append(_namespace("problems.PROBLEMS", problems, "dict", False))
            spaces += [_namespace(f"problems.PROBLEMS[{k!r}]", p, "object", False) for k, p in problems.items()]
        seen, unique = set(), []
        for ns in spaces:  # a class re-exported by a second module is watched once
            if id(ns.table) not in seen:
                seen.add(id(ns.table))
                unique.append(ns)
        return cls(unique)

    def restore(self, _list=list, _map=map) -> list[str]:
        """Everything replaced, deleted or hidden since the snapshot, each put back (empty: intact)."""
        if self._tags is not None and _list(_map(_TAG_VALUE, self._tags)) == self._seen:
            return []  # no watched dict was modified at all (the common case: one read per dict)
        changed = []
        for ns in self.namespaces:
            if not ns.unchanged():
                changed += ns.restore()
        self._seen = [ns.seen for ns in self.namespaces]
        return changed

    def accept(self, _list=list, _map=map) -> None:
        """Take the current state as the trusted one: what trusted code changed since the last
        comparison (a module imported on first use that wraps a torch function, a cell of a notebook)
        is not the next candidate's doing. The harness calls it right before every call of a
        candidate -- so :meth:`restore` names exactly what that call changed -- and before it imports
        a candidate's module. (A candidate that calls it is the in-process limit the module
        docstring names.)"""
        if self._tags is not None and _list(_map(_TAG_VALUE, self._tags)) == self._seen:
            return
        for ns in self.namespaces:
            if not (ns.unchanged() if ns.version is not None else ns.intact()):
                ns.trust()
        self._seen = [ns.seen for ns in self.namespaces]

    def state(self) -> list[tuple[dict, set]]:
        """A copy of what the snapshot expects (for :meth:`load`)."""
        return [(dict(ns.expected), set(ns.known)) for ns in self.namespaces]

    def load(self, state: list[tuple[dict, set]]) -> None:
        """Expect ``state`` (from :meth:`state`) again; :meth:`restore` then puts it back."""
        for ns, (expected, known) in zip(self.namespaces, state):
            ns.expect(dict(expected))
            ns.known, ns.seen = set(known), None
        self._seen = [ns.seen for ns in self.namespaces]

    def __len__(self) -> int:
        return sum(len(ns.expected) for ns in self.namespaces)


_TRUSTED: list[Snapshot] = []


def trusted(problems: dict | None = None) -> Snapshot:
    """The snapshot of this process: taken on the first call (the harness makes it when it is
    imported, the candidate's process before it loads the candidate), the same one afterwards
    (brought up to date by trusted code through :meth:`Snapshot.accept`)."""
    if not _TRUSTED:
        _TRUSTED.append(Snapshot.capture(problems))
    return _TRUSTED[0]


# --------------------------------------------------------------------------- torch's global settings


#: the namespaces whose operators the references and the judging compute with: a kernel registered
#: for one of their operators changes what ``torch.exp`` (say) computes, on whichever key it is
#: registered for (CPU, CUDA, Autograd, CompositeImplicitAutograd, ...)
BUILT_IN_NAMESPACES = ("aten", "prims")


def _kernel_keys(keys) -> set[str]:
    """The registrations among ``keys`` (``"namespace/op/dispatch key"``) that replace a kernel of a
    built-in operator, on every dispatch key but ``Meta``: a Meta kernel computes shapes, no values,
    and torch registers them lazily (for shape inference) in the middle of ordinary calls."""
    return {k for k in keys if k.split("/", 1)[0] in BUILT_IN_NAMESPACES and not k.endswith("/Meta")}


def _live_libraries() -> list[tuple[Any, set]]:
    """Every live ``torch.library.Library`` with its set of registrations (``"ns/op/key"``), found
    through the finalizer each one registers (torch keeps no list of them): ``(library, keys)``."""
    found = []
    for info in list(_FINALIZERS.values()):
        if info.func is _DEL_LIBRARY and len(info.args) > 1 and isinstance(info.args[1], set):
            lib = info.weakref()
            if lib is not None:
                found.append((lib, info.args[1]))
    return found


def _library_ns(lib) -> str:
    return getattr(lib, "ns", "") or ""


_TORCH_DIR = os.path.realpath(os.path.dirname(torch.__file__)) + os.sep
#: torch's registration helpers: a library they create is registered "at" them, whoever called them
_TORCH_HELPERS = (os.path.join(_TORCH_DIR, "library.py"), os.path.join(_TORCH_DIR, "_library") + os.sep)
_REGISTERED_AT = re.compile(r"registered at (.+):\d+ ::")


def _registered_by_torch(key: str) -> bool:
    """Whether torch's own code registered the kernel ``key`` (``"ns/op/dispatch key"``) now in the
    dispatcher: the dispatcher keeps, per key, where the library that registered its kernel was
    created. Torch creates some libraries lazily, on first use (a submodule imported in the middle
    of a call); one created through ``torch.library``'s helpers is registered "at" the helper, so it
    counts as the caller's, not torch's."""
    ns, op, dispatch_key = key.split("/", 2)
    try:
        dump = torch._C._dispatch_dump(f"{ns}::{op}")
    except RuntimeError:
        return False
    for line in dump.splitlines():
        if line.startswith((f"{dispatch_key}:", f"{dispatch_key}[alias]:")):
            found = _REGISTERED_AT.search(line)
            where = os.path.realpath(found.group(1)) if found else ""
            return where.startswith(_TORCH_DIR) and not where.startswith(_TORCH_HELPERS)
    return False


_FINALIZERS = weakref.finalize._registry  # noqa: SLF001 - the only record of every live Library
_DEL_LIBRARY = getattr(torch.library, "_del_library", None)


class Registrations:
    """The Python kernels registered with torch's dispatcher (``torch.library``) as they were when
    taken, and the signature that tells cheaply whether they changed since.

    A kernel registered for a built-in operator on *any* dispatch key but ``Meta`` changes what the
    reference computes: ``CPU`` or ``CUDA`` (the device's own kernel), ``Autograd``/``AutogradCUDA``
    (in front of it whenever a tensor requires grad), ``CompositeImplicitAutograd`` and the rest. It
    is found whether it adds a new ``"aten/op/key"`` to torch's set of registrations
    (``torch.library._impls``) or registers a key that is already in that set (a second kernel
    for the same operator and key: the set does not grow, but the dispatcher now runs the newest),
    through a new library or one that already exists. Torch's own lazy registrations (a library
    created in torch's code, outside its ``torch.library`` helpers: :func:`_registered_by_torch`)
    and libraries already destroyed again are not the candidate's. The signature, read around every call:
    the size of torch's set, a version of the table of live libraries (a dict: its PEP 509 version
    tag where the interpreter has one, else its size) and the number of registrations of every
    library in a built-in namespace or made since the first capture. Only when it moved are the
    libraries compared key by key."""

    _first_libraries: set[int] | None = None  # ids of the key sets of the libraries live at the first capture

    def __init__(self):
        if Registrations._first_libraries is None:
            Registrations._first_libraries = {id(keys) for _, keys in _live_libraries()}
        self.take()

    def _signature(self, _len=len, _sum=sum, _map=map) -> tuple:
        impls = getattr(torch.library, "_impls", ())
        table = self._table_version.value if self._table_version is not None else _len(_FINALIZERS)
        return _len(impls), table, _sum(_map(_len, self._watched))

    def take(self) -> None:
        """Take the registrations now as the ones to keep."""
        libs = _live_libraries()
        self.keys = {id(keys): (keys, frozenset(keys)) for _, keys in libs}
        self.impls = frozenset(getattr(torch.library, "_impls", ()))
        first = Registrations._first_libraries or set()
        self._watched = [keys for lib, keys in libs
                         if _library_ns(lib) in BUILT_IN_NAMESPACES and (id(keys) not in first or _library_ns(lib) == "aten")]
        self._table_version = _VERSION(_FINALIZERS) if _VERSION is not None else None
        self.signature = self._signature()

    def changed(self) -> bool:
        return self._signature() != self.signature

    def added(self) -> tuple[set[str], list]:
        """``(keys, libraries)``: the registrations of built-in operators made since :meth:`take`
        (on every key but Meta), and the libraries that hold them."""
        added, holders = set(), []
        for lib, keys in _live_libraries():
            if getattr(lib, "m", True) is None:
                continue  # a destroyed library (torch's scoped ones, say): its kernels are gone
            before = self.keys.get(id(keys))
            new = _kernel_keys(keys - before[1] if before is not None and before[0] is keys else keys)
            new = {k for k in new if not _registered_by_torch(k)}
            if new:
                added |= new
                holders.append(lib)
        added |= {k for k in _kernel_keys(set(getattr(torch.library, "_impls", ())) - self.impls)
                  if not _registered_by_torch(k)}
        return added, holders


def _pop_function_modes(n: int) -> None:
    while torch._C._len_torch_function_stack() > n:
        torch._C._pop_torch_function_stack()


def _pop_dispatch_modes(n: int) -> None:
    while torch._C._len_torch_dispatch_stack() > n:
        torch._C._pop_torch_dispatch_stack(None)


def _drop_kernels(added: set[str], holders: list) -> None:
    """Undo the ``torch.library`` registrations ``added``: destroy every library that holds one of
    them (``holders``, and any other found through the garbage collector, e.g. one whose finalizer
    was detached). The dispatcher then runs the kernel each key had before."""
    libs = list(holders)
    if any(not (lib._op_impls & added) for lib in holders) or not holders:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            libs += [o for o in gc.get_objects() if isinstance(o, torch.library.Library) and o not in libs]
    for lib in libs:
        if getattr(lib, "_op_impls", set()) & added:
            lib._destroy()


def _set_backend_flag(obj, attr: str) -> Callable[[Any], None]:
    return lambda v: setattr(obj, attr, v)


#: name -> (read, put back): torch's global state that changes what a call computes or how fast
_SETTINGS: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
    "torch function modes": (torch._C._len_torch_function_stack, _pop_function_modes),
    "torch dispatch modes": (torch._C._len_torch_dispatch_stack, _pop_dispatch_modes),
    "torch default dtype": (torch.get_default_dtype, torch.set_default_dtype),
    "torch grad mode": (torch.is_grad_enabled, torch.set_grad_enabled),
    "torch threads": (torch.get_num_threads, torch.set_num_threads),
    "torch deterministic algorithms": (torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms),
    "torch float32 matmul precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
}
#: ... and on a machine with a CUDA GPU, where they take effect
_CUDA_SETTINGS: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
    "torch.backends.cuda.matmul.allow_tf32": (lambda: torch.backends.cuda.matmul.allow_tf32,
                                              _set_backend_flag(torch.backends.cuda.matmul, "allow_tf32")),
    "torch.backends.cudnn.allow_tf32": (lambda: torch.backends.cudnn.allow_tf32,
                                        _set_backend_flag(torch.backends.cudnn, "allow_tf32")),
    "SDPA flash backend": (torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.enable_flash_sdp),
    "SDPA memory-efficient backend": (torch.backends.cuda.mem_efficient_sdp_enabled,
                                      torch.backends.cuda.enable_mem_efficient_sdp),
    "SDPA math backend": (torch.backends.cuda.math_sdp_enabled, torch.backends.cuda.enable_math_sdp),
    "SDPA cuDNN backend": (torch.backends.cuda.cudnn_sdp_enabled, torch.backends.cuda.enable_cudnn_sdp),
}
if torch.cuda.is_available():
    _SETTINGS.update(_CUDA_SETTINGS)


class Settings:
    """Torch's global settings (see the module docstring) as they were when :meth:`capture` ran."""

    def __init__(self):
        self._reads = tuple(read for read, _ in _SETTINGS.values())
        self.values = self._read()
        self.kernels = Registrations()

    def accept(self) -> None:
        """Take the current settings as the trusted ones (see :meth:`Snapshot.accept`)."""
        self.values = self._read()
        if self.kernels.changed():
            self.kernels.take()

    @classmethod
    def capture(cls) -> "Settings":
        return cls()

    def _read(self, _tuple=tuple) -> tuple:
        return _tuple(read() for read in self._reads)

    def restore(self) -> list[str]:
        """Every setting changed since :meth:`capture`, each put back (empty: unchanged)."""
        changed = []
        now = self._read()
        if now != self.values:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # setting some flags warns about newer APIs
                for (name, (_, put)), old, new in zip(_SETTINGS.items(), self.values, now):
                    if old != new:
                        changed.append(f"{name} ({old!r} -> {new!r})")
                        put(old)
        if self.kernels.changed():
            added, holders = self.kernels.added()
            if added:
                shown = sorted(added)
                changed.append(f"torch.library kernels for {', '.join(shown[:3])}"
                               + (f" (+{len(shown) - 3} more)" if len(shown) > 3 else ""))
                _drop_kernels(added, holders)
            self.kernels.take()  # the candidate's own operators stay
        return changed


def accept_all(snapshot: Snapshot, settings: Settings) -> None:
    """:meth:`Snapshot.accept` and :meth:`Settings.accept`: right before a candidate's call."""
    snapshot.accept()
    settings.accept()


def restore_all(snapshot: Snapshot, settings: Settings | None) -> list[str]:
    """:meth:`Snapshot.restore` and (if given) :meth:`Settings.restore`: what changed, put back."""
    return snapshot.restore() + (settings.restore() if settings is not None else [])
