"""One place that decides where and how the workbook computes.

Decided once, when ``minimax_lab`` is first imported:

* **device** -- ``"cuda"`` when PyTorch sees a CUDA GPU, else ``"cpu"``.
* **mode** -- on a GPU, Triton kernels are compiled for it; without one they run in
  Triton's *interpreter* (numpy on the CPU, ~1000x slower). The interpreter is switched on
  by setting ``TRITON_INTERPRET=1`` here, before any ``@triton.jit`` in this package runs.
* **capabilities** -- what the GPU can do (:func:`capabilities`: compute capability, SM count,
  shared memory per block, bf16, FP8, TMA), read once from the device. Every path that depends on
  the device asks it (:func:`supports`, :func:`require`); no other module checks a compute
  capability or hard-codes an SM count or a shared-memory size.
* **dtype** -- bf16 on GPUs that have it (compute capability 8.0 or newer), fp16 before that,
  and fp32 on the CPU. The interpreter's ``tl.dot`` multiplies bf16 bit patterns as if they were
  integers, so CPU runs never compute in bf16.
* **preset** -- ``"cpu"`` (tiny sizes, for CI and laptops), ``"gpu"`` (real sizes), or
  ``"auto"`` (``"gpu"`` on a GPU, ``"cpu"`` otherwise). Notebooks and tests share these.

Overrides, read once from the environment: ``MINIMAX_LAB_DEVICE=cpu|cuda`` and
``MINIMAX_LAB_INTERPRET=0|1``.
"""
from __future__ import annotations

import functools
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy
import torch

PRESETS = ("auto", "cpu", "gpu")
T = TypeVar("T")


def _decide_device() -> str:
    wanted = os.environ.get("MINIMAX_LAB_DEVICE", "").strip().lower()
    if wanted not in ("", "cpu", "cuda"):
        raise ValueError(f"MINIMAX_LAB_DEVICE must be 'cpu' or 'cuda', got {wanted!r}")
    if wanted == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("MINIMAX_LAB_DEVICE=cuda but PyTorch sees no CUDA device")
    if wanted:
        return wanted
    return "cuda" if torch.cuda.is_available() else "cpu"


DEVICE: str = _decide_device()


def _decide_interpret() -> bool:
    flag = os.environ.get("MINIMAX_LAB_INTERPRET", "").strip()
    if flag not in ("", "0", "1"):
        raise ValueError(f"MINIMAX_LAB_INTERPRET must be '0' or '1', got {flag!r}")
    if flag:
        return flag == "1"
    return DEVICE == "cpu"


INTERPRET: bool = _decide_interpret()
if INTERPRET:
    # Must happen before the @triton.jit decorators in this package run (they read it then).
    os.environ["TRITON_INTERPRET"] = "1"


def interpreter_problem() -> str | None:
    """Why Triton's interpreter cannot run here, or None when it can (as far as is known).

    Measured: triton 3.6's interpreter crashes on numpy >= 2.3 (``only 0-dimensional arrays can
    be converted to Python scalars`` in loops with tensor bounds); triton 3.9 does not. A GPU
    image may pair the two, and then only compiled kernels work there."""
    import triton  # deferred: `import minimax_lab` must not load Triton (the first kernel module does)

    tri = tuple(int(p) for p in triton.__version__.split(".")[:2])
    npy = tuple(int(p) for p in numpy.__version__.split(".")[:2])
    if tri <= (3, 6) and npy >= (2, 3):
        return (f"Triton {triton.__version__}'s interpreter crashes with numpy {numpy.__version__} "
                "(needs numpy < 2.3, or triton >= 3.9)")
    return None


def device() -> torch.device:
    """The device every tensor of the workbook lives on by default."""
    return torch.device(DEVICE)


def is_interpreter() -> bool:
    """True when Triton kernels run in the CPU interpreter rather than on a GPU."""
    return INTERPRET


def kernel_device() -> torch.device:
    """Where Triton kernels take their inputs: the GPU, or the CPU under the interpreter."""
    return torch.device("cpu") if INTERPRET else torch.device("cuda")


@dataclass(frozen=True)
class Capabilities:
    """What a device can do: its name, compute capability ``major.minor``, streaming
    multiprocessors, shared memory one block may use (bytes, the opt-in maximum), and whether it
    has bf16, FP8 (e4m3) and TMA (Hopper's tensor memory accelerator)."""
    name: str
    major: int
    minor: int
    sm_count: int
    smem_per_block: int
    bf16: bool
    fp8: bool
    tma: bool

    @property
    def arch(self) -> str:
        """``"sm_90"`` for compute capability 9.0 (``"cpu"`` for the CPU entry)."""
        return f"sm_{self.major}{self.minor}" if self.major else "cpu"


#: the compute capability each feature needs: bf16 tensor cores (Ampere), FP8 e4m3 (Ada; Triton
#: compiles ``float8_e4m3fn`` only from there), TMA descriptors (Hopper)
FEATURE_SINCE = {"bf16": (8, 0), "fp8": (8, 9), "tma": (9, 0)}
FEATURE_NAMES = {"bf16": "bf16", "fp8": "FP8 (float8_e4m3fn)", "tma": "TMA descriptors"}

#: the CPU: Triton kernels run in the interpreter there, which emulates every feature
#: (:func:`supports`), though the hardware has none; 8 stands in for the SM count of the split
#: heuristics and the interpreter has no shared-memory limit (0: never checked)
CPU = Capabilities(name="CPU (Triton interpreter)", major=0, minor=0, sm_count=8, smem_per_block=0,
                   bf16=False, fp8=False, tma=False)


def gpu_capabilities(name: str, major: int, minor: int, sm_count: int, smem_per_block: int) -> Capabilities:
    """A GPU's :class:`Capabilities` from its properties; the features follow from the compute
    capability (:data:`FEATURE_SINCE`)."""
    has = {f: (major, minor) >= since for f, since in FEATURE_SINCE.items()}
    return Capabilities(name=name, major=major, minor=minor, sm_count=sm_count, smem_per_block=smem_per_block, **has)


@functools.lru_cache(maxsize=None)
def _cuda_capabilities(index: int) -> Capabilities:
    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", 0)
    if not smem:  # older torch builds: ask Triton's driver (the limit its compiler checks against)
        import triton  # deferred: `import minimax_lab` must not load Triton (the first kernel module does)

        smem = triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]
    return gpu_capabilities(props.name, props.major, props.minor, props.multi_processor_count, int(smem))


def _torch_gpu() -> Capabilities:
    """The current CUDA GPU's :class:`Capabilities` (``DEVICE == "cuda"`` only)."""
    return _cuda_capabilities(torch.cuda.current_device())


#: the GPU every shipped benchmark record was measured on (chapters that draw records off a GPU
#: describe it): an H200 SXM, 132 SMs, 227 KiB of shared memory per block, a 50 MiB L2
RECORDED_GPU = gpu_capabilities("NVIDIA H200", 9, 0, sm_count=132, smem_per_block=227 * 1024)
RECORDED_GPU_L2_BYTES = 50 * 2**20


def capabilities() -> Capabilities:
    """What the device the Triton kernels run on can do: the current CUDA GPU's
    :class:`Capabilities` (read once per GPU), or :data:`CPU` under the interpreter."""
    if DEVICE == "cuda" and not INTERPRET:
        return _torch_gpu()
    return CPU


def supports(feature: str) -> bool:
    """Whether this package's Triton kernels may use ``feature`` (``"bf16"``, ``"fp8"`` or
    ``"tma"``) here: the interpreter emulates each; a GPU needs the compute capability of
    :data:`FEATURE_SINCE`. Raises ``ValueError`` for another name."""
    if feature not in FEATURE_SINCE:
        raise ValueError(f"feature must be one of {sorted(FEATURE_SINCE)}, got {feature!r}")
    return is_interpreter() or getattr(capabilities(), feature)


class UnsupportedOnDevice(RuntimeError):
    """A kernel needs something this device does not have (a feature, or more shared memory)."""


def require(feature: str, what: str) -> None:
    """Raise :class:`UnsupportedOnDevice` naming ``what`` when :func:`supports` says no."""
    if not supports(feature):
        caps = capabilities()
        major, minor = FEATURE_SINCE[feature]
        raise UnsupportedOnDevice(f"{what} needs {FEATURE_NAMES[feature]}: compute capability {major}.{minor} or "
                                  f"newer; this {caps.name} is {caps.arch}")


def compute_dtype() -> torch.dtype:
    """bf16 on GPUs that have it, fp16 on older GPUs, fp32 on the CPU (interpreter-safe)."""
    if DEVICE != "cuda":
        return torch.float32
    gpu = capabilities() if not INTERPRET else _torch_gpu()
    return torch.bfloat16 if gpu.bf16 else torch.float16


def resolve_preset(preset: str = "auto") -> str:
    """Map ``"auto"`` to ``"gpu"`` or ``"cpu"``; reject anything else with a clear error."""
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ValueError(f"preset must be one of {PRESETS}, got {preset!r}")
    if preset == "auto":
        return "gpu" if DEVICE == "cuda" and not INTERPRET else "cpu"
    if preset == "gpu" and DEVICE != "cuda":
        raise ValueError("preset 'gpu' needs a CUDA GPU; this machine has none (use 'cpu' or 'auto')")
    return preset


def pick(preset: str, *, cpu: T, gpu: T) -> T:
    """Choose a size by preset: ``pick(preset, cpu=256, gpu=65536)``."""
    return gpu if resolve_preset(preset) == "gpu" else cpu


def device_name() -> str:
    """A human name for the device: the GPU's name, or the CPU's."""
    if DEVICE == "cuda":
        return _torch_gpu().name
    return f"CPU {platform.processor() or platform.machine()}"


def device_slug(name: str | None = None) -> str:
    """File-name form of a device name (default: this device's): 'NVIDIA H200' -> 'NVIDIA_H200'.
    Records (``results/<slug>.json``) and launch configs (``configs/<slug>.json``) are named by it."""
    name = name or device_name()
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "unknown"


def describe() -> dict:
    """What a benchmark record needs to say about where it ran."""
    import triton  # deferred: `import minimax_lab` must not load Triton (the first kernel module does)

    info = {
        "device": device_name(),
        "device_kind": DEVICE,
        "interpreter": INTERPRET,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "compute_dtype": str(compute_dtype()).replace("torch.", ""),
    }
    if DEVICE == "cuda":
        caps = _torch_gpu()
        info["sm_count"] = caps.sm_count
        info["capability"] = f"{caps.major}.{caps.minor}"
        info["memory_gib"] = round(gpu_memory_bytes() / 2**30, 1)
    return info


def gpu_memory_bytes() -> int:
    """The current CUDA GPU's total memory in bytes; raises ``RuntimeError`` off a GPU."""
    if DEVICE != "cuda":
        raise RuntimeError("gpu_memory_bytes() needs a CUDA GPU; this process runs on the CPU")
    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)


def l2_cache_bytes() -> int:
    """The GPU's L2 size (or a 32 MiB stand-in on the CPU), for sizing rotating inputs."""
    if DEVICE == "cuda":
        props = torch.cuda.get_device_properties(0)
        size = getattr(props, "L2_cache_size", 0) or 0
        return int(size) if size > 0 else 50 * 2**20
    return 32 * 2**20


def _cpu_cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> tuple[int, str] | None:
    """The largest CPU cache Linux reports (size, "L<level>"), or None where it reports none."""
    best = None
    for d in sorted(Path(root).glob("index*")):
        try:
            size, level = (d / "size").read_text().strip(), (d / "level").read_text().strip()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        n = int(size[:-1]) * units[size[-1]] if size[-1:] in units else int(size or 0)
        if n > 0 and (best is None or n > best[0]):
            best = (n, f"L{level}")
    return best


def cache_bytes() -> tuple[int, str]:
    """The cache a timed input must overflow to be read from memory, and its name: the GPU's L2
    (:func:`l2_cache_bytes`); on the CPU its largest cache (Linux's report), else the 32 MiB stand-in."""
    if DEVICE == "cuda":
        return l2_cache_bytes(), "GPU L2"
    found = _cpu_cache_bytes()
    if found is None:
        return l2_cache_bytes(), "CPU cache (size not reported: a 32 MiB guess)"
    return found[0], f"CPU {found[1]}"
