"""Correctness before speed: run a candidate on fresh random inputs, poison what it must write, and
compare it with a reference computed in higher precision.

* :func:`check` -- ``candidate(**inputs)`` against ``reference(**inputs upcast)`` over several
  fresh draws; the output buffer is poisoned first (NaN for floats, a sentinel for ints) so
  unwritten elements fail; NaN never passes.
* :func:`relative_error` -- ‖out − ref‖ / ‖ref‖ in float64, the one error measure.
* :func:`compare_outputs` -- every output of a call against the reference's (integers exactly).
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Mapping

import torch

#: Relative-error tolerances by the *candidate's* compute dtype (METHOD: fp32 far under 1e-3,
#: tf32 near 3e-4, bf16 operands between 1e-3 and 1e-2).
TOLERANCES = {
    torch.float64: 1e-9,
    torch.float32: 1e-3,
    torch.float16: 1e-2,
    torch.bfloat16: 2e-2,
}


INT_POISON = -12345


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
