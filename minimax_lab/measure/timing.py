"""Timing that survives the classic mistakes: warm-up, inputs rotated past the cache, one pair of
CUDA events per call (or a CUDA-graph replay), medians; and the device's two measured ceilings.

* :func:`time_fn` -- the median time of a callable (see its docstring for how).
* :func:`ceilings` -- device-to-device copy GB/s and the matrix-multiply rate, measured once per
  process; records report each case as a percentage of one of them.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Any, Callable, Mapping, Sequence

import torch

from minimax_lab import runtime

@dataclasses.dataclass
class Timing:
    """Median and spread of one timed callable, and how it was timed."""

    ms: float
    p20_ms: float
    p80_ms: float
    reps: int
    method: str
    input_sets: int

    def __str__(self) -> str:
        return f"{self.ms:.4f} ms (p20 {self.p20_ms:.4f}, p80 {self.p80_ms:.4f}; {self.reps} reps, {self.method})"


def nbytes(obj) -> int:
    """Bytes of the tensors in ``obj``: a tensor, or mappings, lists and tuples of them (nested);
    anything else counts 0. :func:`time_fn` sizes its rotating input sets with it."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Mapping):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    return 0


def _quantiles(samples: Sequence[float]) -> tuple[float, float, float]:
    s = sorted(samples)
    pick = lambda q: s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]  # noqa: E731
    return statistics.median(s), pick(0.2), pick(0.8)


def time_fn(
    fn: Callable[..., Any],
    make_inputs: Callable[[int], Mapping[str, Any]] | None = None,
    *,
    inputs: Mapping[str, Any] | None = None,
    warmup: int = 5,
    reps: int = 50,
    min_time_s: float = 0.2,
    rotate: bool = True,
    max_sets: int = 16,
    max_working_set_bytes: int = 16 * 2**30,
    cuda_graph: bool = False,
) -> Timing:
    """Median time of ``fn(**inputs)`` in milliseconds.

    Inputs come from ``make_inputs(seed)`` (or a fixed ``inputs``). With ``rotate`` the
    harness builds enough input sets that together they exceed twice the device's cache (the
    GPU's L2, or the CPU's largest cache: :func:`minimax_lab.runtime.cache_bytes`; at most
    ``max_sets`` and ``max_working_set_bytes``) and cycles through them, so no call finds its
    inputs cache-resident. On CUDA every call is bracketed by its own pair of events; with
    ``cuda_graph`` a graph of one pass over the sets is captured and replayed, which removes
    launch gaps for launch-bound cases. On the CPU a wall clock times each call. The inputs'
    tensors say which: CUDA tensors mean events, CPU tensors a wall clock; with no tensor among
    the inputs (``inputs={}`` and a closure) the runtime's device decides.
    """
    if (make_inputs is None) == (inputs is None):
        raise ValueError("pass exactly one of make_inputs or inputs")
    sets = [dict(inputs)] if inputs is not None else [dict(make_inputs(0))]
    if rotate and make_inputs is not None:
        per_set = max(1, nbytes(sets[0]))
        want = min(max_sets, max(2, math.ceil(2 * runtime.cache_bytes()[0] / per_set)))
        want = min(want, max(1, max_working_set_bytes // per_set))
        sets += [dict(make_inputs(i)) for i in range(1, want)]
    tensors = [v for v in sets[0].values() if isinstance(v, torch.Tensor)]
    # a closure (no tensor among the inputs) is timed on the runtime's device: on a GPU machine a
    # wall clock without a synchronize would time only the launches
    on_gpu = any(v.is_cuda for v in tensors) if tensors else runtime.DEVICE == "cuda"

    if not on_gpu:
        n_warm = max(1, warmup // 2)
        for i in range(n_warm):
            fn(**sets[i % len(sets)])
        samples, start = [], time.perf_counter()
        while len(samples) < max(3, reps // 5) and (time.perf_counter() - start < min_time_s or len(samples) < 3):
            t0 = time.perf_counter()
            fn(**sets[(n_warm + len(samples)) % len(sets)])  # the rotation goes on past the warm-up's sets
            samples.append((time.perf_counter() - t0) * 1e3)
        med, lo, hi = _quantiles(samples)
        return Timing(med, lo, hi, len(samples), "wall clock (CPU; not a GPU speed)", len(sets))

    for i in range(warmup):
        fn(**sets[i % len(sets)])
    torch.cuda.synchronize()

    if cuda_graph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for s in sets:  # warm the graph's private pool
                fn(**s)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for s in sets:
                fn(**s)
        graph.replay()
        torch.cuda.synchronize()
        samples = []
        for _ in range(max(5, reps // len(sets))):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            b.synchronize()
            samples.append(a.elapsed_time(b) / len(sets))
        med, lo, hi = _quantiles(samples)
        return Timing(med, lo, hi, len(samples) * len(sets), "CUDA graph replay, events", len(sets))

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    t_begin = time.perf_counter()
    n = 0
    while n < reps:
        starts[n].record()
        fn(**sets[n % len(sets)])
        ends[n].record()
        n += 1
        if n == reps // 2 and time.perf_counter() - t_begin > 30:  # very slow case: stop early
            break
    torch.cuda.synchronize()
    samples = [starts[i].elapsed_time(ends[i]) for i in range(n)]
    med, lo, hi = _quantiles(samples)
    return Timing(med, lo, hi, n, "CUDA events per call", len(sets))


@dataclasses.dataclass
class Ceilings:
    """The device's two measured ceilings: copy bandwidth and matrix-multiply rate."""

    copy_gbps: float
    gemm_tflops: float
    gemm_dtype: str
    device: str
    method: str


_CEILINGS: Ceilings | None = None


def ceilings(*, refresh: bool = False) -> Ceilings:
    """Measure (once per process) device-to-device copy GB/s (bytes read + written) and the
    GEMM rate (bf16 8192^3 on a GPU, fp32 1024^3 on the CPU), on random data."""
    global _CEILINGS
    if _CEILINGS is not None and not refresh:
        return _CEILINGS
    dev = runtime.device()
    if dev.type == "cuda":
        n_bytes, gemm_n, dtype = 2 * 2**30, 8192, torch.bfloat16
    else:
        n_bytes, gemm_n, dtype = 64 * 2**20, 1024, torch.float32
    src = torch.randn(n_bytes // 4, device=dev)
    dst = torch.empty_like(src)
    t_copy = time_fn(lambda a, b: b.copy_(a), inputs={"a": src, "b": dst}, reps=20, rotate=False)
    copy_gbps = 2 * n_bytes / (t_copy.ms * 1e-3) / 1e9
    del src, dst
    a = torch.randn(gemm_n, gemm_n, device=dev, dtype=dtype)
    b = torch.randn(gemm_n, gemm_n, device=dev, dtype=dtype)
    t_mm = time_fn(torch.matmul, inputs={"input": a, "other": b}, reps=20, rotate=False)
    gemm_tflops = 2 * gemm_n**3 / (t_mm.ms * 1e-3) / 1e12
    _CEILINGS = Ceilings(round(copy_gbps, 1), round(gemm_tflops, 2), str(dtype).replace("torch.", ""),
                         runtime.device_name(), f"copy {n_bytes >> 20} MiB; matmul {gemm_n}^3; {t_mm.method}")
    return _CEILINGS
