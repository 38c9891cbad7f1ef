"""The naive harness: how kernels are often "benchmarked", and what the hack gallery fools.

One fixed input (seed 0, the first validation shape), the expected answer computed first and
kept in a local variable, one call, one ``torch.allclose``, then a wall-clock loop that calls the
candidate on that same input without synchronizing. Each line of it is a habit seen in the wild;
:mod:`.harness` is the same job done so that none of them can be exploited.
"""
from __future__ import annotations

import dataclasses
import time

import torch

from minimax_lab import measure
from minimax_lab.kernelbench import problems as _problems
from minimax_lab.kernelbench.calls import as_tuple, resolve_candidate, synchronize


@dataclasses.dataclass
class NaiveReport:
    """The naive verdict: right on its one input, and its wall-clock speed-up over the reference."""

    problem: str
    candidate: str
    passed: bool
    ms: float
    reference_ms: float
    message: str = ""

    @property
    def speedup(self) -> float:
        return self.reference_ms / self.ms if self.ms > 0 else float("inf")

    def summary(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return (f"naive {verdict} {self.candidate} on {self.problem}: {self.ms:.4g} ms vs reference "
                f"{self.reference_ms:.4g} ms ({self.speedup:.1f}x){' -- ' + self.message if self.message else ''}")


def _wall_ms(fn, inputs: dict, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn(**inputs)  # no synchronize: on a GPU this times the launches, not the work
    return (time.perf_counter() - t0) * 1e3 / reps


def naive_evaluate(candidate, problem, *, preset: str = "auto", reps: int = 5) -> NaiveReport:
    """Score ``candidate`` the naive way (see the module docstring). Same inputs as
    :func:`minimax_lab.kernelbench.harness.evaluate`; leaves any damage a candidate did in place."""
    fn, name = resolve_candidate(candidate)
    problem = _problems.get_problem(problem)
    missing = problem.available()
    if missing is not None:
        return NaiveReport(problem.name, name, False, float("nan"), float("nan"), missing)
    inputs = problem.make_inputs(problem.validation_shapes(preset)[0], 0, "normal")
    expected = problem.reference(**inputs)  # computed first, sitting in a local variable
    tol = problem.tol if problem.tol is not None else measure.tolerance_for(
        next(v.dtype for v in inputs.values() if isinstance(v, torch.Tensor) and v.is_floating_point()))
    message = ""
    try:
        out = fn(**inputs)
        synchronize()
        outs, refs = as_tuple(out), as_tuple(expected)
        passed = len(outs) == len(refs) and all(
            isinstance(o, torch.Tensor) and o.shape == r.shape
            and (torch.allclose(o.float(), r.float(), rtol=tol, atol=tol) if r.is_floating_point()
                 else torch.equal(o.long(), r.long()))
            for o, r in zip(outs, refs))
    except Exception as e:  # noqa: BLE001 - the verdict says what happened
        passed, message = False, f"raised {type(e).__name__}: {e}"
    if not passed:
        return NaiveReport(problem.name, name, False, float("nan"), float("nan"), message or "wrong answer")
    ms = _wall_ms(fn, inputs, reps)
    ref_ms = _wall_ms(problem.reference, inputs, reps)
    synchronize()  # outside the timed region, as the naive harness's author would do
    return NaiveReport(problem.name, name, True, ms, ref_ms)
