"""The workbook's honest benchmark harness: check first, then time, then record.

Four jobs, each a small function:

* **correctness** -- :func:`check` runs a candidate on fresh random inputs, poisons its output
  buffer first (NaN for floats, a sentinel for ints) so unwritten elements fail, and compares
  with a reference computed in float64 (or fp32) by relative norm error. NaN never passes.
* **timing** -- :func:`time_fn` warms up, rotates through enough input sets to overflow the
  L2 cache, and takes the median of per-call CUDA-event times (optionally replaying a CUDA
  graph for launch-bound cases). On the CPU it uses a wall clock and says so.
* **ceilings** -- :func:`ceilings` measures the device's copy bandwidth and matrix-multiply
  rate once per process; records report each case as a percentage of the relevant one.
* **records** -- :func:`make_record` and :func:`append_records` write JSON records to
  ``results/<gpu-name>.json`` in the working directory (or ``$MINIMAX_LAB_RESULTS``);
  :func:`load_records` reads them back for notebooks, together with the recorded ones shipped
  with the package (see :mod:`minimax_lab.resources`).

Command line: ``python -m minimax_lab.bench <suite> [<suite> ...] [--preset P] [--out F]`` with
suites from :data:`SUITES` (``ceilings``, ``pitfalls``, ``attention``, ``msa``, ``moe``, ``kvcache``,
``kernelbench``, ``engine``, ``all``), and ``python -m minimax_lab.bench merge FILE`` to fold
records fetched from a GPU run into ``results/`` (run both from the clone's root to write the
clone's ``results/``), and ``python -m minimax_lab.bench compare BEFORE AFTER [--tolerance 0.03]``
to check that a change kept every case's ratio to its peers (:func:`compare_records`). Every suite is a module with ``CASES`` (its case groups) and
``run(preset, cases=None, **options)``; with one suite named, ``--cases G ...`` picks its groups,
and the suite's own options (its ``OPTIONS``) are arguments too::

    python -m minimax_lab.bench kvcache --cases fp8
    python -m minimax_lab.bench msa --cases prefill --lengths 131072 --no-dense
    python -m minimax_lab.bench msa --help      # the suite's case groups and options
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import fcntl
import importlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from minimax_lab import resources, runtime

#: Relative-error tolerances by the *candidate's* compute dtype (METHOD: fp32 far under 1e-3,
#: tf32 near 3e-4, bf16 operands between 1e-3 and 1e-2).
TOLERANCES = {
    torch.float64: 1e-9,
    torch.float32: 1e-3,
    torch.float16: 1e-2,
    torch.bfloat16: 2e-2,
}

INT_POISON = -12345


# --------------------------------------------------------------------------- correctness


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; ``inf`` if ``out`` has NaN/inf or shapes differ.

    When ``ref`` is all zeros the absolute norm ‖out‖ is returned instead. Computed on ``out``'s
    device: copying GPU-size tensors to the host would cost more than the kernel being checked.
    """
    if not isinstance(out, torch.Tensor) or not isinstance(ref, torch.Tensor):
        raise TypeError(f"relative_error takes tensors, got {type(out).__name__} and {type(ref).__name__}")
    if out.shape != ref.shape:
        return math.inf
    a = out.detach().to(torch.float64)
    b = ref.detach().to(out.device, torch.float64)
    if not torch.isfinite(a).all():
        return math.inf
    denom = torch.linalg.vector_norm(b).item()
    num = torch.linalg.vector_norm(a - b).item()
    return num / denom if denom > 0 else num


def tolerance_for(dtype: torch.dtype) -> float:
    """Default relative tolerance for outputs computed in ``dtype``."""
    if dtype not in TOLERANCES:
        raise ValueError(f"no default tolerance for dtype {dtype}; pass tol= explicitly")
    return TOLERANCES[dtype]


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` with NaN (floats) or :data:`INT_POISON` (ints/bools -> True) in place."""
    if t.is_floating_point() or t.is_complex():
        return t.fill_(float("nan"))
    if t.dtype == torch.bool:
        return t.fill_(True)
    return t.fill_(INT_POISON)


def poison_allocator(device: torch.device, nbytes: int = 64 * 2**20) -> None:
    """Best effort: fill ``nbytes`` of freed GPU memory with NaN so a kernel's ``torch.empty``
    output is poisoned too (the caching allocator hands the same blocks back). Does nothing on
    a device that is not CUDA."""
    if device.type == "cuda":
        junk = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(float("nan"))
        del junk


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def upcast(value, dtype: torch.dtype):
    """``value`` with every floating-point tensor in it (nested in dicts, lists and tuples too)
    converted to ``dtype`` and detached; everything else as it is. How :func:`check` feeds the
    reference."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(dtype)
    if isinstance(value, dict):
        return {k: upcast(v, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(upcast(v, dtype) for v in value)
    return value


@dataclasses.dataclass
class CheckResult:
    """What :func:`check` found: passed only if every trial and every output is within tol."""

    name: str
    passed: bool
    max_error: float
    tol: float
    trials: int
    failures: list[str]

    def __bool__(self) -> bool:  # lets `assert check(...)` read naturally
        return self.passed

    def summary(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        extra = "" if self.passed else " -- " + "; ".join(self.failures[:3])
        return f"{verdict} {self.name}: max rel err {self.max_error:.2e} (tol {self.tol:.0e}, {self.trials} trials){extra}"


def compare_outputs(out, ref, *, tol: float, exact_ints: bool = True) -> tuple[float, list[str]]:
    """Compare each output of a candidate with the reference's; returns (max error, failures).

    Float outputs: relative norm error must be <= ``tol`` (NaN/inf -> inf, never passes).
    Integer/bool outputs: must be equal element for element when ``exact_ints`` (a float output
    where the reference is integer never passes). Compared on the output's device.
    """
    outs, refs = _as_tuple(out), _as_tuple(ref)
    if len(outs) != len(refs):
        return math.inf, [f"candidate returned {len(outs)} outputs, reference {len(refs)}"]
    worst, failures = 0.0, []
    for i, (o, r) in enumerate(zip(outs, refs)):
        if not isinstance(o, torch.Tensor):
            failures.append(f"output {i} is {type(o).__name__}, not a tensor")
            worst = math.inf
            continue
        if o.shape != r.shape:
            failures.append(f"output {i} has shape {tuple(o.shape)}, expected {tuple(r.shape)}")
            worst = math.inf
            continue
        if not r.is_floating_point() and exact_ints:
            r = r.detach().to(o.device)
            mismatches = o.numel() if o.is_floating_point() else int((o.detach().long() != r.long()).sum())
            err = 0.0 if mismatches == 0 else math.inf
            if mismatches:
                failures.append(f"output {i}: {mismatches} of {o.numel()} integer elements differ")
        else:
            err = relative_error(o, r)
            if not err <= tol:  # also catches NaN
                failures.append(f"output {i}: rel err {err:.2e} > tol {tol:.0e}")
        worst = max(worst, err)
    return worst, failures


def check(
    candidate: Callable[..., Any],
    reference: Callable[..., Any],
    make_inputs: Callable[[int], Mapping[str, Any]],
    *,
    name: str = "",
    tol: float | None = None,
    trials: int = 3,
    seed: int | None = None,
    make_out: Callable[[Mapping[str, Any]], torch.Tensor] | None = None,
    reference_dtype: torch.dtype = torch.float64,
) -> CheckResult:
    """Check ``candidate(**inputs)`` against ``reference(**inputs_upcast)`` on fresh inputs.

    ``make_inputs(seed) -> dict`` must draw new random tensors for every seed; each trial uses
    a new seed (from ``seed`` or the clock), so a candidate cannot memorise one input.
    ``make_out(inputs) -> tensor`` (optional): the harness allocates the output, poisons it and
    passes it as ``out=``; elements the candidate leaves unwritten then fail the check.
    The reference runs on float tensors upcast to ``reference_dtype``. ``tol`` defaults to
    :data:`TOLERANCES` for the dtype of the candidate's first float output.
    """
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    base = seed if seed is not None else int(time.time_ns() % 2**31)
    worst, failures, used_tol = 0.0, [], tol
    for trial in range(trials):
        inputs = dict(make_inputs(base + 7919 * trial))
        device = next((v.device for v in inputs.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))
        kwargs = dict(inputs)
        if make_out is not None:
            kwargs["out"] = poison_(make_out(inputs))
        poison_allocator(device)
        out = candidate(**kwargs)
        if make_out is not None and out is None:
            out = kwargs["out"]
        ref = reference(**upcast(inputs, reference_dtype))
        if used_tol is None:
            first = next((o for o in _as_tuple(out) if isinstance(o, torch.Tensor) and o.is_floating_point()), None)
            used_tol = tolerance_for(first.dtype) if first is not None else 0.0
        err, fails = compare_outputs(out, ref, tol=used_tol)
        worst = max(worst, err)
        failures += [f"trial {trial}: {f}" for f in fails]
    return CheckResult(name or getattr(candidate, "__name__", "candidate"), not failures, worst, used_tol, trials, failures)


# --------------------------------------------------------------------------- timing


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
    harness builds enough input sets that together they exceed twice the L2 cache (at most
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
        want = min(max_sets, max(2, math.ceil(2 * runtime.l2_cache_bytes() / per_set)))
        want = min(want, max(1, max_working_set_bytes // per_set))
        sets += [dict(make_inputs(i)) for i in range(1, want)]
    tensors = [v for v in sets[0].values() if isinstance(v, torch.Tensor)]
    # a closure (no tensor among the inputs) is timed on the runtime's device: on a GPU machine a
    # wall clock without a synchronize would time only the launches
    on_gpu = any(v.is_cuda for v in tensors) if tensors else runtime.DEVICE == "cuda"

    if not on_gpu:
        for i in range(max(1, warmup // 2)):
            fn(**sets[i % len(sets)])
        samples, start = [], time.perf_counter()
        while len(samples) < max(3, reps // 5) and (time.perf_counter() - start < min_time_s or len(samples) < 3):
            t0 = time.perf_counter()
            fn(**sets[len(samples) % len(sets)])
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


# --------------------------------------------------------------------------- ceilings


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


# --------------------------------------------------------------------------- records


def git_commit() -> str | None:
    """The clone's HEAD commit (with ``-dirty`` if the tree has changes); for an installed
    package the commit pip recorded (``pip install git+...``); else None.

    ``MINIMAX_LAB_COMMIT`` overrides it (a GPU machine gets the tree without its ``.git``)."""
    if os.environ.get("MINIMAX_LAB_COMMIT"):
        return os.environ["MINIMAX_LAB_COMMIT"]
    root = resources.checkout_root()
    if root is None:
        return resources.installed_commit()
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (sha + ("-dirty" if dirty else "")) or None


def make_record(
    suite: str,
    case: str,
    impl: str,
    timing: Timing | float,
    *,
    shape: Mapping[str, Any] | None = None,
    dtype: torch.dtype | str | None = None,
    flops: float | None = None,
    bytes_moved: float | None = None,
    ceiling: str | None = None,
    peers: Mapping[str, float] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict:
    """One JSON-ready benchmark record.

    ``flops``/``bytes_moved`` give TFLOP/s and GB/s; ``ceiling`` (``"gemm"`` or ``"copy"``)
    picks which measured ceiling the percentage is of. ``peers`` maps a peer's name to its
    median ms *from the same run*; each gets ``speedup_vs[name] = peer_ms / ms``.
    """
    ms = timing.ms if isinstance(timing, Timing) else float(timing)
    if not ms > 0:
        raise ValueError(f"time must be positive, got {ms}")
    rec: dict[str, Any] = {
        "suite": suite, "case": case, "impl": impl, "ms": round(ms, 6),
        "shape": dict(shape or {}), "dtype": str(dtype).replace("torch.", "") if dtype is not None else None,
    }
    if isinstance(timing, Timing):
        rec.update(p20_ms=round(timing.p20_ms, 6), p80_ms=round(timing.p80_ms, 6), reps=timing.reps,
                   timing_method=timing.method)
    if flops is not None:
        rec["tflops"] = round(flops / (ms * 1e-3) / 1e12, 3)
    if bytes_moved is not None:
        rec["gbps"] = round(bytes_moved / (ms * 1e-3) / 1e9, 2)
    if ceiling is not None:
        c = ceilings()
        if ceiling == "gemm" and flops is not None:
            rec["pct_of_ceiling"] = round(100 * rec["tflops"] / c.gemm_tflops, 1)
        elif ceiling == "copy" and bytes_moved is not None:
            rec["pct_of_ceiling"] = round(100 * rec["gbps"] / c.copy_gbps, 1)
        else:
            raise ValueError(f"ceiling {ceiling!r} needs {'flops' if ceiling == 'gemm' else 'bytes_moved'}")
        rec["ceiling"] = ceiling
    if peers:
        rec["peers_ms"] = {k: round(v, 6) for k, v in peers.items() if v is not None}
        rec["speedup_vs"] = {k: round(v / ms, 3) for k, v in peers.items() if v is not None}
    if extra:
        rec.update(extra)
    return rec


def gpu_slug(name: str | None = None) -> str:
    """File-name form of a device name: 'NVIDIA H200' -> 'NVIDIA_H200'."""
    name = name or runtime.device_name()
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "unknown"


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(path.suffix + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def append_records(records: Sequence[dict], path: Path | str | None = None) -> Path:
    """Append records (stamped with commit, versions and time) to ``path``, by default
    ``<results>/<gpu>.json`` with ``<results>`` = ``$MINIMAX_LAB_RESULTS`` or ``./results``
    (:func:`minimax_lab.resources.user_results_dir`; never inside an installed package).

    The file is a JSON list; writes go through a temporary file and a rename under a lock, so
    concurrent writers and interrupted runs never leave a half-written file.
    """
    path = Path(path) if path is not None else resources.user_results_dir() / f"{gpu_slug()}.json"
    stamp = {"commit": git_commit(), "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
             **{k: v for k, v in runtime.describe().items() if k in ("device", "torch", "triton", "interpreter")}}
    new = [{**stamp, **r} if "commit" not in r else dict(r) for r in records]
    with _locked(path):
        old = json.loads(path.read_text()) if path.exists() else []
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(old + new, indent=1) + "\n")
        os.replace(tmp, path)
    return path


def load_records(device: str | None = "NVIDIA H200", suite: str | None = None, *, latest: bool = True) -> list[dict]:
    """Records for ``device`` (None: all devices) and ``suite`` (None: all): the recorded ones
    shipped with the package (a clone's ``results/``), then the user's own (``$MINIMAX_LAB_RESULTS``
    or ``./results``, if present; see :func:`minimax_lab.resources.results_dirs`).

    With ``latest`` only the newest record of each (suite, case, impl) is kept -- the user's own
    when both have one. JSON files that are not lists of records are ignored.
    """
    recs = []
    for folder in resources.results_dirs():
        files = [folder / f"{gpu_slug(device)}.json"] if device else sorted(folder.glob("*.json"))
        for f in files:
            stored = json.loads(f.read_text()) if f.is_file() else []
            if not isinstance(stored, list):
                continue
            recs += [r for r in stored if isinstance(r, dict) and (suite is None or r.get("suite") == suite)]
    if latest:
        newest: dict[tuple, dict] = {}
        for r in recs:
            newest[(r.get("device"), r.get("suite"), r.get("case"), r.get("impl"))] = r
        recs = list(newest.values())
    return recs


def format_table(records: Sequence[dict]) -> str:
    """A plain-text table of records, one row each."""
    cols = ["suite", "case", "impl", "ms", "tflops", "gbps", "pct_of_ceiling", "speedup_vs"]
    rows = []
    for r in records:
        row = []
        for c in cols:
            v = r.get(c, "")
            if isinstance(v, dict):
                v = " ".join(f"{k}:{x:.2f}x" for k, x in v.items())
            elif isinstance(v, float):
                v = f"{v:.4g}"
            row.append(str(v))
        rows.append(row)
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    line = lambda cells: "  ".join(s.ljust(w) for s, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(r) for r in rows])


# --------------------------------------------------------------------------- suites & CLI


def ceilings_suite(preset: str = "auto") -> list[dict]:
    """The device's measured ceilings as two records (suite ``ceilings``, both case groups)."""
    from minimax_lab import ceilings_suite as suite

    return suite.run(preset)


def select_cases(cases, valid: Sequence[str], default: Sequence[str] | None = None) -> list[str]:
    """The case groups a suite runs, in the order of ``valid``: ``default`` (all of ``valid`` when
    it is None) for ``cases=None``, else ``cases`` -- a list of names or one name. Raises
    ``ValueError`` naming the valid groups for an unknown name or an empty list."""
    if cases is None:
        chosen = list(valid if default is None else default)
    else:
        chosen = [cases] if isinstance(cases, str) else list(cases)
        unknown = [c for c in chosen if c not in valid]
        if unknown or not chosen:
            what = f"unknown case group(s) {unknown}" if unknown else "no case group given"
            raise ValueError(f"{what}; choose from {list(valid)}")
    return [c for c in valid if c in chosen]


#: suite name -> module. Each module has ``CASES`` (its case groups), ``run(preset="auto",
#: cases=None, **options)`` returning records, and optionally ``OPTIONS`` (option name -> the
#: keyword arguments of ``argparse.add_argument`` for ``--<option-name>``; the CLI passes the
#: options given to ``run`` as keywords). Modules are imported when a suite runs, not with this
#: one; a suite whose module does not exist yet is reported as missing, not as an error.
SUITES: dict[str, str] = {
    "ceilings": "minimax_lab.ceilings_suite",
    "pitfalls": "minimax_lab.timing_pitfalls",
    "attention": "minimax_lab.attention.bench_suite",
    "msa": "minimax_lab.attention.msa_bench",
    "moe": "minimax_lab.moe.bench_suite",
    "kvcache": "minimax_lab.kvcache.bench_suite",
    "kernelbench": "minimax_lab.kernelbench.suite",
    "engine": "minimax_lab.engine.bench",
}


def suite_module(name: str):
    """The module of registered suite ``name``, imported; None (with a message) if it is not built."""
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; choose from {sorted(SUITES)} or 'all'")
    module_name = SUITES[name]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            print(f"[bench] suite {name!r} is not built yet ({module_name} missing)")
            return None
        raise


def run_suite(name: str, preset: str = "auto", cases=None, **options) -> list[dict]:
    """Import and run one registered suite: ``cases`` (None: the preset's default groups) and the
    suite's ``options``; returns its records (not yet written)."""
    module = suite_module(name)
    if module is None:
        return []
    return list(module.run(preset=preset, cases=cases, **options))


def _option_dest(name: str) -> str:
    return f"suite_option:{name}"


def _add_suite_options(parser: argparse.ArgumentParser, modules: Mapping[str, Any]) -> None:
    """``--<option>`` for every option of the named suites (an option two suites share once)."""
    seen = set()
    for name, module in modules.items():
        if module is None:
            continue
        opts = getattr(module, "OPTIONS", {})
        default = getattr(module, "DEFAULT_CASES", None)
        group = parser.add_argument_group(
            f"suite {name!r}", f"case groups {', '.join(module.CASES)}"
            + (f" (default {', '.join(default)})" if default else "") + ("" if opts else "; no options"))
        for opt, spec in opts.items():
            if opt not in seen:
                seen.add(opt)
                group.add_argument("--" + opt.replace("_", "-"), dest=_option_dest(opt), default=argparse.SUPPRESS,
                                   **spec)


def compare_records(before: Sequence[dict], after: Sequence[dict], *, tolerance: float = 0.03) -> dict:
    """Each case's ratio to its peers (``speedup_vs``, measured in the same run) before and after a
    change: ``{"rows": [{suite, case, impl, peer, before, after, change}], "regressions": [rows whose
    ratio fell by more than ``tolerance``], "missing": ["suite/case/impl" recorded before, not after]}``.
    Ratios, not times, so two runs on one GPU compare even when its clocks differ; the newest record
    of each (suite, case, impl) in each list counts. ``change`` = after / before - 1."""
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")

    def newest(records):
        out = {}
        for r in records:
            out[(r.get("suite"), r.get("case"), r.get("impl"))] = r
        return out

    b, a = newest(before), newest(after)
    rows, missing = [], []
    for key in sorted(b, key=str):
        if key not in a:
            missing.append("/".join(map(str, key)))
            continue
        pb, pa = b[key].get("speedup_vs") or {}, a[key].get("speedup_vs") or {}
        for peer in sorted(set(pb) & set(pa)):
            if pb[peer] and pa[peer]:
                rows.append(dict(zip(("suite", "case", "impl"), key), peer=peer, before=pb[peer], after=pa[peer],
                                 change=pa[peer] / pb[peer] - 1))
    return {"rows": rows, "regressions": [r for r in rows if r["change"] < -tolerance], "missing": missing}


def format_comparison(result: dict, tolerance: float = 0.03) -> str:
    """:func:`compare_records`' result as a markdown table (regressions marked), then what is missing."""
    lines = ["| suite | case | impl | vs | before | after | change |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        flag = " **worse**" if r["change"] < -tolerance else ""
        lines.append(f"| {r['suite']} | {r['case']} | {r['impl']} | {r['peer']} | {r['before']:.3f}x | "
                     f"{r['after']:.3f}x | {100 * r['change']:+.1f}%{flag} |")
    lines.append(f"\n{len(result['rows'])} ratios compared; {len(result['regressions'])} fell by more than "
                 f"{100 * tolerance:.0f}%")
    if result["missing"]:
        lines.append(f"recorded before, not after: {', '.join(result['missing'])}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m minimax_lab.bench SUITE [SUITE ...] [--cases G ...] [--preset P] [--out F]
    [--no-record] [suite options]`` and ``python -m minimax_lab.bench merge FILE [FILE ...]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    epilog = ("Name one suite with --help to see its case groups and options, e.g. "
              "'python -m minimax_lab.bench msa --help'.")

    def parser_for(modules: Mapping[str, Any], *, first: bool = False) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog="python -m minimax_lab.bench", description=__doc__.split("\n\n")[0],
                                    epilog=epilog, add_help=not first)
        p.add_argument("suites", nargs="*" if first else "+",
                       help=f"suites to run: {', '.join(SUITES)}, all; or 'merge FILE...'")
        p.add_argument("--preset", default="auto", choices=runtime.PRESETS)
        p.add_argument("--cases", nargs="+", default=None, metavar="GROUP",
                       help="case groups of the one suite named (default: the preset's); see its --help")
        p.add_argument("--out", default=None,
                       help="records file (default: <results>/<device>.json, <results> = $MINIMAX_LAB_RESULTS or ./results)")
        p.add_argument("--no-record", action="store_true", help="print the table, write nothing")
        _add_suite_options(p, modules)
        return p

    if argv[:1] == ["compare"]:
        p = argparse.ArgumentParser(prog="python -m minimax_lab.bench compare",
                                    description="every case's ratio to its peers, before and after a change")
        p.add_argument("before")
        p.add_argument("after")
        p.add_argument("--tolerance", type=float, default=0.03, help="largest allowed fall of a ratio (0.03: 3%%)")
        a = p.parse_args(argv[1:])
        result = compare_records(json.loads(Path(a.before).read_text()), json.loads(Path(a.after).read_text()),
                                 tolerance=a.tolerance)
        print(format_comparison(result, a.tolerance))
        return 1 if result["regressions"] or result["missing"] else 0
    named = parser_for({}, first=True).parse_known_args(argv)[0].suites  # which suites' options to offer
    names = [] if named[:1] == ["merge"] else list(SUITES) if "all" in named else [n for n in named if n in SUITES]
    modules = {n: suite_module(n) for n in dict.fromkeys(names)}
    parser = parser_for(modules)
    args = parser.parse_args(argv)
    if args.suites[0] == "merge":
        for f in args.suites[1:]:
            recs = json.loads(Path(f).read_text())
            dev = recs[0].get("device") if recs else None
            out = append_records(recs, args.out or resources.user_results_dir() / f"{gpu_slug(dev)}.json")
            print(f"merged {len(recs)} records from {f} into {out}")
        return 0
    names = list(SUITES) if args.suites == ["all"] else args.suites
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {unknown}; choose from {', '.join(SUITES)} or all")
    if args.cases is not None:
        if len(names) != 1:
            parser.error(f"--cases names case groups of one suite; {len(names)} suites given ({', '.join(names)})")
        if modules[names[0]] is not None:
            try:
                select_cases(args.cases, modules[names[0]].CASES)
            except ValueError as e:
                parser.error(f"suite {names[0]!r}: {e}")
    print(f"[bench] {runtime.device_name()} torch {torch.__version__}; preset {runtime.resolve_preset(args.preset)}")
    all_records: list[dict] = []
    failed = []
    for name in names:
        opts = getattr(modules[name], "OPTIONS", {}) if modules[name] is not None else {}
        given = {o: getattr(args, _option_dest(o)) for o in opts if hasattr(args, _option_dest(o))}
        t0 = time.perf_counter()
        try:
            recs = run_suite(name, args.preset, cases=args.cases, **given)
        except Exception as e:  # keep going: one broken suite must not hide the others' numbers
            import traceback

            traceback.print_exc()
            failed.append(name)
            print(f"[bench] suite {name!r} FAILED: {type(e).__name__}: {e}")
            continue
        print(f"[bench] suite {name!r}: {len(recs)} records in {time.perf_counter() - t0:.1f} s")
        if recs and not args.no_record:
            append_records(recs, args.out)
        all_records += recs
    print(format_table(all_records))
    if failed:
        print(f"[bench] failed suites: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":  # run through the package module so there is one copy of its state
    from minimax_lab.bench import main as _main

    sys.exit(_main())
