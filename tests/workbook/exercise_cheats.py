"""The exercise cheat gallery: answers that get the right numbers without doing the exercise, each
of which its checker must refuse with a message that says what is missing.

Like the kernel bench's hack gallery (``minimax_lab/kernelbench/hacks.py``), each :class:`Cheat`
names its family and builds a fresh answer for one exercise; ``refused`` is a fragment the
verdict's message must contain. :data:`CHEATS` is the gallery; ``test_exercise_cheats.py`` runs it.

The families:

* **launder** -- the PyTorch answer (the solution's ``_torch`` twin) copied into fresh outputs by
  a three-line Triton copy kernel; the same with the answer computed in a thread started in the
  call, in a thread pool made before the check, in a forked process, in numpy, or through a
  ``torch.library`` operator; written under the watch's nose with ``ctypes``; handed to the
  kernel as a raw pointer;
* **package** -- the package's own answer: called directly, under an alias, as a method of an
  object, in a new thread, in a thread pool made before the check, in a process pool, or a
  package kernel launched;
* **judge** -- changing what the checker computes with: ``torch.softmax`` replaced, a
  ``torch.library`` kernel registered for ``aten::_softmax``, the checker's reference replaced,
  the expected answer read from the checker's frame or through the garbage collector;
* **structure** -- a kernel without the exercise's idea: a one-tile softmax, no running max, no
  rescaling, a backward that ignores the saved log-sum-exp, a copy that ignores the strides;
* **no calls** -- 08.1 and 08.2 answered without calling what they judge.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import gc
import importlib
import math
import multiprocessing
import sys
import threading
from typing import Callable

import numpy as np
import torch
import triton
import triton.language as tl

from minimax_lab import exercises, runtime
from minimax_lab.exercises import launches

TRITON_KEYS = ("00.5", "01.5", "02.4", "02.5", "03.3", "04.3", "04.9", "05.5", "06.3", "09.4")
#: a thread pool made before any check runs (what a notebook cell could have left running)
OLD_POOL = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="made-earlier")
OLD_POOL.submit(int).result()


@dataclasses.dataclass(frozen=True)
class Cheat:
    """One cheat: for exercise ``key``, of ``family``; ``build()`` returns the answer; the verdict's
    problems must contain ``refused``."""

    key: str
    family: str
    name: str
    build: Callable[[], Callable]
    refused: str

    @property
    def id(self) -> str:
        return f"{self.key}-{self.name}"


def torch_twin(key: str) -> Callable:
    """The solution's pure-PyTorch twin (``solutions.chNN.<stub>_torch``)."""
    ex = exercises.get(key)
    return getattr(importlib.import_module(f"minimax_lab.exercises.solutions.ch{ex.chapter}"), f"{ex.stub.__name__}_torch")


# --------------------------------------------------------------------------- the copy kernel of the laundering


@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.bool) else t.contiguous()


def kernel_copy(t, source=None):
    """A fresh tensor that a Triton launch wrote, holding ``t``'s values (``source``: the tensor the
    kernel reads, ``t`` by default)."""
    if not isinstance(t, torch.Tensor):
        return t
    src = _bytes_of(t if source is None else source)
    out = torch.empty_like(src)
    if src.numel():
        _copy_kernel[(triton.cdiv(src.numel(), 1024),)](src, out, src.numel(), BLOCK=1024)
    return out.view(t.dtype).view(t.shape) if t.dtype != out.dtype else out.view(t.shape)


def copied_out(result):
    if isinstance(result, (tuple, list)):
        return type(result)(kernel_copy(t) for t in result)
    return kernel_copy(result)


def _on_device(result):
    if isinstance(result, (tuple, list)):
        return type(result)(_on_device(t) for t in result)
    return result.to(runtime.kernel_device()) if isinstance(result, torch.Tensor) else result


# --------------------------------------------------------------------------- launder


def launder(key):
    twin = torch_twin(key)
    return lambda *a, **k: copied_out(twin(*a, **k))


def launder_in_new_thread(key):
    twin = torch_twin(key)

    def answer(*a, **k):
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return copied_out(pool.submit(twin, *a, **k).result())
    return answer


def launder_in_old_thread(key):
    twin = torch_twin(key)
    return lambda *a, **k: copied_out(OLD_POOL.submit(twin, *a, **k).result())


def _in_child(conn, twin, args, kwargs):
    conn.send([t.cpu() if isinstance(t, torch.Tensor) else t for t in _as_tuple(twin(*args, **kwargs))])


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def launder_from_process(key):
    twin = torch_twin(key)

    def answer(*a, **k):
        parent, child = multiprocessing.get_context("fork").Pipe()
        p = multiprocessing.get_context("fork").Process(target=_in_child, args=(child, twin, a, k))
        p.start()
        got = _on_device(parent.recv())
        p.join()
        return copied_out(got if len(got) > 1 else got[0])
    return answer


def launder_through_numpy(key):
    twin = torch_twin(key)

    def answer(*a, **k):
        out = []
        for t in _as_tuple(twin(*a, **k)):
            raw = _bytes_of(t).cpu().numpy()
            via = torch.from_numpy(np.array(raw)).to(runtime.kernel_device())
            out.append(kernel_copy(via.view(t.dtype).view(t.shape) if via.dtype != t.dtype else via.view(t.shape)))
        return tuple(out) if len(out) > 1 else out[0]
    return answer


def _loaded_cudart() -> ctypes.CDLL:
    """The CUDA runtime library this process loaded (with PyTorch), found in its memory map."""
    with open("/proc/self/maps") as f:
        paths = sorted({line.split()[-1] for line in f if "libcudart.so" in line})
    if not paths:
        raise RuntimeError("no libcudart is loaded in this process: the ctypes cheat needs one on a GPU")
    return ctypes.CDLL(paths[0])


def _copy_outside_torch(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``src``'s bytes into ``dst`` without PyTorch seeing it: ``memmove`` on the CPU; on a GPU,
    ``cudaMemcpy`` called through ctypes (``memmove`` on device pointers would crash the process)."""
    nbytes = src.numel() * src.element_size()
    if src.device.type == "cpu":
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)
        return
    torch.cuda.synchronize(src.device)
    device_to_device = 3                                   # cudaMemcpyKind
    rc = _loaded_cudart().cudaMemcpy(ctypes.c_void_p(dst.data_ptr()), ctypes.c_void_p(src.data_ptr()),
                                     ctypes.c_size_t(nbytes), ctypes.c_int(device_to_device))
    if rc != 0:
        raise RuntimeError(f"cudaMemcpy returned {rc}")


def launder_with_ctypes(key):
    """The answer's bytes moved with ``ctypes`` (``memmove``, or ``cudaMemcpy`` on a GPU) into a
    buffer the function allocated; the kernel copies that buffer."""
    twin = torch_twin(key)

    def answer(*a, **k):
        out = []
        for t in _as_tuple(twin(*a, **k)):
            src = _bytes_of(t)
            buf = torch.empty_like(src)
            _copy_outside_torch(buf, src)
            out.append(kernel_copy(t, source=buf))
        return tuple(out) if len(out) > 1 else out[0]
    return answer


class _Pointer:
    """What Triton accepts as a pointer argument: anything with ``data_ptr()``."""

    def __init__(self, t):
        self.t, self.dtype = t, t.dtype

    def data_ptr(self):
        return self.t.data_ptr()


def launder_as_pointer(key):
    twin = torch_twin(key)

    def answer(*a, **k):
        out = []
        for t in _as_tuple(twin(*a, **k)):
            src = _bytes_of(t)
            dst = torch.empty_like(src)
            _copy_kernel[(triton.cdiv(src.numel(), 1024),)](_Pointer(src), dst, src.numel(), BLOCK=1024)
            out.append(dst.view(t.dtype).view(t.shape) if t.dtype != dst.dtype else dst)
        return tuple(out) if len(out) > 1 else out[0]
    return answer


_CUSTOM_OPS: dict = {}


def launder_through_custom_op(key):
    """The PyTorch answer behind a ``torch.library`` operator of its own (one tensor output)."""
    if key not in _CUSTOM_OPS:
        twin = torch_twin(key)
        name = f"mine::answer_{key.replace('.', '_')}"

        @torch.library.custom_op(name, mutates_args=())
        def op(x: torch.Tensor, block_n: int) -> torch.Tensor:
            return twin(x, block_n).clone()
        _CUSTOM_OPS[key] = op
    op = _CUSTOM_OPS[key]
    return lambda x, block_n=16: kernel_copy(op(x, block_n))


def noop_beside(key):
    twin = torch_twin(key)

    @triton.jit
    def _noop(X):
        pass

    def answer(*a, **k):
        _noop[(1,)](torch.zeros(1, device=runtime.kernel_device()))
        return twin(*a, **k)
    return answer


LAUNDRY = [  # (family, name, builder, fragment of the refusal)
    ("launder", "copy-kernel", launder, "that PyTorch c"),
    ("launder", "in-a-new-thread", launder_in_new_thread, "in another thread"),
    ("launder", "in-a-thread-made-earlier", launder_in_old_thread, "did not make from its inputs"),
    ("launder", "in-a-forked-process", launder_from_process, "another process"),
    ("launder", "through-numpy", launder_through_numpy, "written from Python"),
    ("launder", "ctypes", launder_with_ctypes, "could not see"),
    ("launder", "raw-pointer", launder_as_pointer, "not a tensor"),
    ("launder", "no-op-kernel-beside", noop_beside, launches.NOT_BY_TRITON),
]


# --------------------------------------------------------------------------- judge


def frame_reader(local_name: str, fallback: Callable):
    """Reads ``local_name`` from the calling frames (where a checker keeps its expected answer)."""
    def answer(*a, **k):
        f = sys._getframe(1)
        while f is not None:
            if local_name in f.f_locals:
                return f.f_locals[local_name]
            f = f.f_back
        return fallback(*a, **k)
    return answer


def gc_reader(fallback: Callable):
    """Looks through the garbage collector for the checker's expected answer."""
    def answer(*a, **k):
        gc.get_objects()
        return fallback(*a, **k)
    return answer


def patched_softmax(answer_with: Callable):
    """Replaces ``torch.softmax`` (what the checker's reference computes with) so the reference
    agrees with a wrong answer (all zeros)."""
    def answer(x, block_n=16):
        torch.softmax = lambda t, dim=-1, **k: torch.zeros_like(t)
        return kernel_copy(torch.zeros_like(x))
    return answer


_LIBRARIES: list = []


def registered_softmax():
    """Registers a CPU kernel for ``aten::_softmax`` returning zeros, and answers zeros."""
    def answer(x, block_n=16):
        lib = torch.library.Library("aten", "IMPL")
        _LIBRARIES.append(lib)
        lib.impl("_softmax", lambda t, dim, half: torch.zeros_like(t), "CPU")
        return kernel_copy(torch.zeros_like(x))
    return answer


def replaced_reference(module: str, name: str, returns: Callable, answer_value):
    """Replaces the checker's own reference with one that returns ``returns(*args)``, and answers that."""
    def answer(*a, **k):
        setattr(importlib.import_module(module), name, returns)
        return answer_value(*a, **k)
    return answer


# --------------------------------------------------------------------------- threads and processes, any function


def in_new_thread(fn: Callable, pick=lambda r: r):
    def answer(*a, **k):
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pick(pool.submit(fn, *a, **k).result())
    return answer


def in_old_thread(fn: Callable, pick=lambda r: r):
    return lambda *a, **k: pick(OLD_POOL.submit(fn, *a, **k).result())


def in_process_pool(fn: Callable, pick=lambda r: r):
    def answer(*a, **k):
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
            return pick(pool.submit(fn, *a, **k).result())
    return answer


def in_raw_thread(fn: Callable, pick=lambda r: r):
    def answer(*a, **k):
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("r", fn(*a, **k)))
        t.start()
        t.join()
        return pick(box["r"]) if "r" in box else None
    return answer


__all__ = ["Cheat", "LAUNDRY", "TRITON_KEYS", "math"]
