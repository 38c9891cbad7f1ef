"""Solutions of chapter 08's exercises (``minimax_lab.exercises.ch08``)."""
from __future__ import annotations

import statistics
import time

import torch

from minimax_lab import measure
from minimax_lab.kernelbench import harness


def returns_stale_answers(candidate, rows: int, cols: int) -> bool:
    """Five calls: two on new tensors, then the same tensor refilled in place three times (a cache
    keyed by address, or one switched on after a few calls, is stale there). Each answer is judged
    right after its call, at a tolerance that honest rounding passes."""
    x = torch.randn(rows, cols)
    inputs = [x, torch.randn(rows, cols), x, x, x]
    for i, inp in enumerate(inputs):
        if i >= 2:
            inp.copy_(torch.randn(rows, cols))  # same tensor, same address, new values
        out = candidate(inp)
        if measure.relative_error(out, torch.softmax(inp, dim=-1)) > 1e-4:
            return True
    return False


def honest_time_ms(fn, make_input, reps: int = 5) -> float:
    """A new input per call (made before the clock starts); the clock stops only once every piece of
    side work is done and this code holds its own copy of the output (the copy reads a lazy output);
    the median ignores a one-off slow call."""
    times = []
    for _ in range(reps):
        x = make_input()
        harness.synchronize()
        t0 = time.perf_counter()
        out = fn(x)
        harness.synchronize()
        copy = out.clone()  # noqa: F841  (reading it forces a lazy output to do its work)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def my_hack(x: torch.Tensor) -> torch.Tensor:
    """The naive harness checks one fixed input and then times the same input again and again: do the
    work once per shape and return that answer ever after. Ours gives every call fresh values
    (caught by 'validation shapes' and 'fresh inputs') and keeps earlier outputs to compare
    addresses with (caught by 'no aliasing')."""
    answers = my_hack.__dict__.setdefault("answers", {})
    key = (tuple(x.shape), x.dtype, x.device)
    if key not in answers:
        answers[key] = torch.softmax(x.float(), dim=-1).to(x.dtype)
    return answers[key]
