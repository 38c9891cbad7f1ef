"""The four classic ways to time GPU code wrongly, each next to the harness's right answer.

1. **No synchronize** -- CUDA launches are asynchronous: a host clock read right after the
   launch measures the launch, not the kernel.
2. **No warm-up** -- the first call pays for compilation (Triton JIT), module load and
   allocator growth.
3. **A cache-resident input** -- timing one small buffer over and over measures the cache (a
   GPU's L2; :func:`minimax_lab.runtime.cache_bytes` reads the running device's), not memory; the
   honest twin rotates the same size through buffers that together exceed the cache.
4. **A single run** -- one sample hides the spread; medians of many runs are stable.

The operator timed is ``y = a*x + b`` (:func:`axpb`): one read and one write per element, so
its honest speed is bytes / time against the copy ceiling. ``run(preset)`` is the bench suite
``pitfalls``: each mistaken number recorded beside the honest one.
"""
from __future__ import annotations

import itertools
import math
import os
import time
from typing import Callable

import torch
import triton
import triton.language as tl

from minimax_lab import measure, runtime
from minimax_lab.validate import check_tensor, check_triton_inputs


@triton.jit
def _axpb_kernel(x_ptr, y_ptr, n, a, b, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, a * x + b, mask=mask)


def axpb(x: torch.Tensor, a: float = 2.0, b: float = 1.0, *, impl: str = "torch", block: int = 1024,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """``a * x + b`` elementwise, in ``x``'s dtype. ``impl``: "torch" or "triton".

    ``x``: any-shape contiguous float tensor (on the GPU for "triton", or the CPU under the
    interpreter). ``block`` is the Triton block size; a new value forces a new compilation.
    """
    check_tensor(x, "x", dtypes=(torch.float16, torch.bfloat16, torch.float32))
    out = torch.empty_like(x) if out is None else out
    if impl == "torch":  # b + a*x in one pass over memory (mul then add would make two)
        return torch.add(torch.tensor(b, dtype=x.dtype), x, alpha=a, out=out)
    if impl != "triton":
        raise ValueError(f"impl must be 'torch' or 'triton', got {impl!r}")
    if not x.is_contiguous():
        raise ValueError("x must be contiguous for impl='triton'")
    check_triton_inputs(x=x)  # kernel device; no backward: refuse autograd rather than detach
    n = x.numel()
    _axpb_kernel[(triton.cdiv(n, block),)](x, out, n, a, b, BLOCK=block)
    return out


#: block sizes for the first-call timing, one per call of :func:`demo`: a size this process has not
#: compiled yet, so the first call pays for compiling (Triton block sizes are powers of two)
_FRESH_BLOCKS = itertools.cycle((256, 512, 2048, 4096, 128, 8192))


def _memory_cap_bytes() -> int:
    """An eighth of the memory available now (Linux's count), at most 1 GiB: the largest input the
    CPU demo allocates (it holds about six tensors of that size at once)."""
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        free = 8 * 2**30
    return max(32 * 2**20, min(2**30, free // 8))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def ms_without_sync(fn: Callable[[], object]) -> float:
    """Mistake 1: host clock around the call, no synchronize (the GPU may still be working)."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def ms_first_call(fn: Callable[[], object], device: torch.device) -> float:
    """Mistake 2: the very first call, compilation and all (synchronized, so only the warm-up is missing)."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return (time.perf_counter() - t0) * 1e3


def time_cache_resident(fn: Callable[..., object], x: torch.Tensor, out: torch.Tensor,
                        copies: int = 16) -> measure.Timing:
    """Mistake 3: the same small buffer every call, so it stays in cache (warm, synchronized, median
    with its p20-p80 spread).

    ``copies`` calls on the one ``(x, out)`` pair are replayed back to back (a CUDA graph on the
    GPU, so launch gaps do not hide the effect); the honest twin is :func:`time_rotating`.
    """
    return measure.time_fn(fn, lambda seed: {"x": x, "out": out}, max_sets=copies, reps=10 * copies,
                           cuda_graph=x.is_cuda)


def time_rotating(fn: Callable[..., object], make_pair: Callable[[int], dict], copies: int = 16) -> measure.Timing:
    """The honest twin of mistake 3: the same small size, but a fresh ``(x, out)`` pair each call."""
    sample = make_pair(0)
    return measure.time_fn(fn, make_pair, max_sets=copies, reps=10 * copies, cuda_graph=sample["x"].is_cuda)


def ms_cache_resident(fn: Callable[..., object], x: torch.Tensor, out: torch.Tensor, copies: int = 16) -> float:
    """:func:`time_cache_resident`'s median in ms."""
    return time_cache_resident(fn, x, out, copies).ms


def ms_rotating(fn: Callable[..., object], make_pair: Callable[[int], dict], copies: int = 16) -> float:
    """:func:`time_rotating`'s median in ms."""
    return time_rotating(fn, make_pair, copies).ms


def ms_single_runs(fn: Callable[[], object], device: torch.device, n: int = 30) -> list[float]:
    """Mistake 4 shown as data: ``n`` separate single-run timings (warm, synchronized)."""
    fn()
    samples = []
    for _ in range(n):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def demo(preset: str = "auto") -> dict:
    """Time :func:`axpb` the four wrong ways and the harness's way; returns a dict of numbers.

    Mistakes 1, 2 and 4 and the honest median use a large input (512 MB on a GPU, so the kernel
    takes far longer than its launch; on the CPU twice its largest cache, so the honest number is
    memory's, not the cache's, unless the machine's memory cannot spare that much: ``"input_bytes"``
    and ``"device_cache_bytes"`` say which), written into preallocated outputs; ``copy_gbps`` is a
    plain copy of the same size timed the same way, the ceiling to compare with. Mistake 3 needs an
    input that fits in the cache: 8 MB in + 8 MB out on a GPU, 1 MB + 1 MB on the CPU; it is
    compared with the same size rotated through buffers that together exceed the cache
    (:func:`minimax_lab.runtime.cache_bytes`) several times. On the CPU torch runs on one thread
    here (``"threads"``): with two, each call waits for the second core, and on a busy machine
    that wait (a scheduler tick, milliseconds) would swamp a 0.1 ms call.
    """
    on_gpu = runtime.resolve_preset(preset) == "gpu"
    threads = torch.get_num_threads()
    if not on_gpu:
        torch.set_num_threads(1)
    try:
        out = _demo(preset, on_gpu)
    finally:
        torch.set_num_threads(threads)
    out["threads"] = None if on_gpu else 1
    return out


def _demo(preset: str, on_gpu: bool) -> dict:
    dev = runtime.device()
    cache, cache_name = runtime.cache_bytes()
    n = runtime.pick(preset, cpu=min(max(2 * cache // 4, 8 << 20), _memory_cap_bytes() // 4), gpu=128 << 20)
    n_small = runtime.pick(preset, cpu=1 << 18, gpu=2 << 20)
    copies = min(512, max(16, math.ceil(4 * cache / (2 * n_small * 4))))
    impl = "triton" if on_gpu else "torch"

    def make(seed: int, size: int = n) -> dict:
        x = torch.randn(size, device=dev, generator=torch.Generator(dev).manual_seed(seed))
        return {"x": x, "out": torch.empty_like(x)}

    into = lambda x, out: axpb(x, impl=impl, out=out)  # noqa: E731
    fixed = make(0)
    call = lambda: into(**fixed)  # noqa: E731
    fresh_block = next(_FRESH_BLOCKS)
    first = ms_first_call(lambda: axpb(fixed["x"], impl=impl, block=fresh_block, out=fixed["out"]), dev)
    call()  # warm the configuration timed below
    honest = measure.time_fn(into, make, reps=100)
    copy = measure.time_fn(lambda x, out: out.copy_(x), make, reps=100)  # the ceiling, timed the same way
    small = make(0, n_small)
    resident = time_cache_resident(into, small["x"], small["out"])
    rotating = time_rotating(into, lambda seed: make(seed, n_small), copies)
    return {
        "device": runtime.device_name(), "impl": impl, "n": n, "bytes": 2 * n * 4, "input_bytes": n * 4,
        "no_sync_ms": ms_without_sync(call),
        "first_call_ms": first,
        "single_runs_ms": ms_single_runs(call, dev),
        "honest_ms": honest.ms, "honest_p20_ms": honest.p20_ms, "honest_p80_ms": honest.p80_ms,
        "honest_method": honest.method, "copy_ms": copy.ms, "copy_gbps": 2 * n * 4 / (copy.ms * 1e-3) / 1e9,
        "copy_p20_ms": copy.p20_ms, "copy_p80_ms": copy.p80_ms,
        "cache_n": n_small, "cache_bytes": 2 * n_small * 4, "device_cache_bytes": cache, "device_cache": cache_name,
        "cache_sets": rotating.input_sets,
        "cache_resident_ms": resident.ms, "cache_resident_p20_ms": resident.p20_ms,
        "cache_resident_p80_ms": resident.p80_ms,
        "cache_rotating_ms": rotating.ms, "cache_rotating_p20_ms": rotating.p20_ms,
        "cache_rotating_p80_ms": rotating.p80_ms,
        "timings": {"honest": honest, "cache_resident": resident, "cache_rotating": rotating},
    }


#: case groups of bench suite ``pitfalls``: ``timing`` (no_sync, no_warmup, single_run_min/max and
#: honest, on the large input) and ``cache`` (cache_resident beside cache_rotating); both by default
CASES = ("timing", "cache")


def run(preset: str = "auto", cases=None) -> list[dict]:
    """Bench suite ``pitfalls``: check :func:`axpb`, then record each mistaken timing beside the honest
    one, for the groups of :data:`CASES` in ``cases`` (default both; :func:`demo` times them all)."""
    chosen = measure.select_cases(cases, CASES)
    dev = runtime.device()
    impl = "triton" if runtime.resolve_preset(preset) == "gpu" else "torch"
    mk = lambda seed: {"x": torch.randn(4099, device=dev, generator=torch.Generator(dev).manual_seed(seed))}  # noqa: E731
    res = measure.check(lambda x: axpb(x, impl=impl), lambda x: 2.0 * x + 1.0, mk, name=f"axpb[{impl}]")
    if not res.passed:
        raise AssertionError(res.summary())
    d = demo(preset)
    single = sorted(d["single_runs_ms"])
    big = ({"n": d["n"]}, d["bytes"], d["honest_ms"])
    small = ({"n": d["cache_n"]}, d["cache_bytes"], d["cache_rotating_ms"])
    timed = d["timings"]  # the harness's medians keep their p20-p80 spread in the record
    rows = [("no_sync", d["no_sync_ms"], big), ("no_warmup", d["first_call_ms"], big),
            ("single_run_min", single[0], big), ("single_run_max", single[-1], big),
            ("honest", timed["honest"], big),
            ("cache_resident", timed["cache_resident"], small), ("cache_rotating", timed["cache_rotating"], small)]
    return [measure.make_record("pitfalls", name, impl, ms, shape=shape, dtype="float32", bytes_moved=nbytes,
                                ceiling="copy", peers={"honest": honest_ms},
                                extra={"single_runs_ms": [round(t, 6) for t in single]} if name == "single_run_min"
                                else None)
            for name, ms, (shape, nbytes, honest_ms) in rows
            if ("cache" if name.startswith("cache_") else "timing") in chosen]
