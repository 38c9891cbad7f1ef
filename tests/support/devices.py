"""Where the tests compute and how closely they must agree: one place for every test file.

* **Device.** Inputs live on :func:`minimax_lab.runtime.kernel_device` -- the GPU, or the CPU when
  Triton runs in its interpreter -- so the same test checks the compiled kernels on a GPU and
  the interpreted ones elsewhere. Random inputs are drawn from a seeded *CPU* generator and then
  moved there: one seed gives the same numbers on every machine.
* **Tolerance.** It follows the dtype the kernel really computed in. fp16/bf16 inputs take
  :data:`minimax_lab.bench.TOLERANCES`. fp32 inputs are exact-ish in the interpreter (numpy
  fp32), but on a GPU an fp32 ``tl.dot`` runs in TF32 (10-bit mantissa) unless the kernel asks
  for ``input_precision="ieee"``: simulated TF32 truncation gives a relative error of ~1.2e-3 on
  attention and ~2.5e-3 on the SwiGLU experts, so :data:`TF32_TOL` leaves a 4x margin.
* **GPU-only tests** are decorated with :func:`gpu_only` (a module: ``pytestmark = GPU_ONLY``):
  the ``gpu`` marker, and a skip with its reason without a CUDA GPU running compiled kernels.
  Tests of CPU-only behaviour carry :func:`cpu_only` with the reason they cannot run on a GPU.

* **Seeds.** Every random draw of a test comes from :func:`fresh_seed`, which is fixed by the
  test's own name (and ``MINIMAX_LAB_TEST_SEED``, default 0: set it to draw other inputs); a
  failing test prints the seeds it used (``tests/conftest.py``), so any failure replays. The
  global generators (torch's on the CPU and every CUDA device, ``random``, numpy's) are seeded by
  the test's name too before it starts (:func:`seed_global_generators`), so a draw that names no
  generator gives the same numbers whatever ran before it.

Import it as ``from tests.support.devices import ...``.
"""
from __future__ import annotations

import os
import random
import zlib

import pytest
import torch

import minimax_lab  # noqa: F401 - decides the runtime (and the interpreter) before triton is imported
from minimax_lab import runtime
from minimax_lab.measure import TOLERANCES, relative_error  # noqa: F401 - re-exported for the tests

#: Where Triton kernels take their inputs in this run.
DEVICE = runtime.kernel_device()
#: True when the kernels are compiled for a CUDA GPU (not interpreted).
ON_GPU = DEVICE.type == "cuda"
#: Relative error allowed for a Triton kernel whose fp32 ``tl.dot`` runs in TF32 on the GPU.
TF32_TOL = 1e-2

#: Skips a test without a CUDA GPU running compiled kernels, and says so.
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU running compiled Triton kernels; "
                                                  "this run has none (CPU, Triton interpreter)")
#: The marks of a GPU-only module: ``pytestmark = GPU_ONLY``.
GPU_ONLY = [pytest.mark.gpu, needs_gpu]


def gpu_only(test):
    """Decorator for a GPU-only test: the ``gpu`` marker plus :data:`needs_gpu`."""
    return pytest.mark.gpu(needs_gpu(test))


def cpu_only(why: str):
    """Skip on a GPU run, saying ``why`` the test only makes sense on the CPU."""
    return pytest.mark.skipif(ON_GPU, reason=f"CPU-only: {why}")


#: the running test's name, the seeds it has drawn and the seed of the global generators (set by
#: ``tests/conftest.py``)
_TEST = {"name": "", "drawn": [], "global": None}


def start_test(name: str) -> None:
    """Called before each test: its seeds start again from its own name."""
    _TEST["name"], _TEST["drawn"], _TEST["global"] = name, [], None


def seeds_drawn() -> list[int]:
    """The seeds the running test has drawn so far (a failing test reports them)."""
    return list(_TEST["drawn"])


def global_seed_of_test() -> int | None:
    """The seed the running test's global generators started from (None before they were seeded)."""
    return _TEST["global"]


def name_seed(name: str, what: str) -> int:
    """A seed fixed by ``name``, ``what`` it seeds and ``MINIMAX_LAB_TEST_SEED`` (default 0)."""
    offset = int(os.environ.get("MINIMAX_LAB_TEST_SEED", "0") or 0)
    return zlib.crc32(f"{name}#{what}#{offset}".encode()) % 2**31


def fresh_seed() -> int:
    """The test's next seed: fixed by its name, the number of seeds drawn before and
    ``MINIMAX_LAB_TEST_SEED`` (default 0), so a run repeats exactly and another offset draws other
    inputs."""
    seed = name_seed(_TEST["name"], str(len(_TEST["drawn"])))
    _TEST["drawn"].append(seed)
    return seed


def seed_global_generators(name: str) -> int:
    """Seed torch's global generator (the CPU's and every CUDA device's), ``random``'s and numpy's
    from ``name`` (a test's or a fixture's) and return the seed: what ran before cannot change what
    ``torch.randn(3)`` gives next."""
    seed = name_seed(name, "global")
    torch.manual_seed(seed)  # seeds every CUDA device too
    random.seed(seed)
    try:
        import numpy
    except ImportError:  # torch runs without numpy; then there is no numpy generator to seed
        pass
    else:
        numpy.random.seed(seed)
    if name == _TEST["name"]:
        _TEST["global"] = seed
    return seed


def generator(seed: int | None = None) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (a fresh one when ``None``)."""
    return torch.Generator().manual_seed(fresh_seed() if seed is None else int(seed))


def randn(*shape: int, gen: torch.Generator, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Standard normal ``shape`` drawn on the CPU from ``gen``, then cast to ``dtype`` on ``device``
    (default :data:`DEVICE`)."""
    return torch.randn(*shape, generator=gen).to(device=DEVICE if device is None else device, dtype=dtype)


def to_device(*tensors: torch.Tensor, device=None):
    """Move tensors to ``device`` (default :data:`DEVICE`); one tensor in, one out."""
    moved = tuple(t.to(DEVICE if device is None else device) for t in tensors)
    return moved[0] if len(moved) == 1 else moved


def tol(dtype: torch.dtype, *, exact: float = 1e-4, tf32: bool = True) -> float:
    """Relative-error tolerance for a kernel output computed from ``dtype`` inputs on :data:`DEVICE`.

    fp32/fp64: ``exact`` (the caller's bound for true fp32 arithmetic), or :data:`TF32_TOL` on a
    GPU when the kernel's fp32 dots may run in TF32 (``tf32=False`` for kernels that ask for
    ``"ieee"`` and for torch ops, which keep fp32 unless TF32 is switched on). fp16/bf16:
    :data:`minimax_lab.bench.TOLERANCES`. Raises ``ValueError`` for other dtypes.
    """
    if dtype in (torch.float32, torch.float64):
        return TF32_TOL if (ON_GPU and tf32 and dtype == torch.float32) else exact
    if dtype not in TOLERANCES:
        raise ValueError(f"no tolerance for dtype {dtype}")
    return max(TOLERANCES[dtype], exact)
