"""Exercises of chapter 08 (A kernel bench that hacks cannot fool): build two of the harness's
defences yourself, then attack the naive harness.

* 08.1 ``returns_stale_answers`` -- a check that catches a candidate answering from a cache
  (keyed by shape, by address, or switched on after a few honest calls), by calling it on fresh
  inputs; it must not accuse an honest candidate whose rounding differs from ``torch.softmax``.
* 08.2 ``honest_time_ms`` -- a timer that side work, lazy outputs, caches and a slow first call
  cannot shrink or inflate. Checked by behaviour on the CPU: candidates whose work is a known sleep.
* 08.3 ``my_hack`` -- a softmax that cheats: the naive harness (:mod:`minimax_lab.kernelbench.naive`)
  must pass it and report it faster than the reference, and :func:`minimax_lab.kernelbench.harness.evaluate`
  must fail it.

The checkers build their candidates from the hack gallery (:mod:`minimax_lab.kernelbench.hacks`)
and the harness's own side-work machinery, with fresh random shapes on every call.
"""
from __future__ import annotations

import random
import time

import torch

from minimax_lab.exercises import exercise, fresh_rng
from minimax_lab.kernelbench import hacks, harness, naive
from minimax_lab.kernelbench.hacks import Deferred


# --------------------------------------------------------------------------- 08.1 a check for stale answers


def returns_stale_answers(candidate, rows: int, cols: int) -> bool:
    """``candidate(x)`` claims to return ``torch.softmax(x, dim=-1)`` for a float32 ``x`` of shape
    ``(rows, cols)``. Return True if it ever returns a wrong answer (relative error above 1e-4,
    see ``measure.relative_error``), False if it is right every time.

    A cheat may key its cache by the shape, by the tensor's address (``x.data_ptr()``), or switch
    the cache on only after a few honest calls. So call it at least four times, judging each answer
    right after its call: on new tensors, and on the same tensor refilled in place with new values
    (``x.copy_(torch.randn(rows, cols))``)."""
    raise NotImplementedError  # your code here


def _honest_rounding(x):
    """Honest, but computed by hand: differs from torch.softmax by rounding (~1e-7)."""
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def _by_address():
    """Caches the answer by the input's address: right on every new tensor, stale on a refilled one."""
    cache = {}

    def cache_by_address(x):
        key = (x.data_ptr(), tuple(x.shape))
        if key not in cache:
            cache[key] = torch.softmax(x, dim=-1)
        return cache[key].clone()
    return cache_by_address


def _cache_after(honest_calls: int):
    """Honest for its first ``honest_calls`` calls, then returns a copy of its last answer."""
    state = {"calls": 0, "last": None}

    def cache_after_a_while(x):
        state["calls"] += 1
        if state["calls"] <= honest_calls or state["last"] is None or state["last"].shape != x.shape:
            state["last"] = torch.softmax(x, dim=-1)
        return state["last"].clone()
    return cache_after_a_while


@exercise("08.1", "a check for stale answers",
          "Catch a candidate that answers from a cache by calling it on fresh inputs, without accusing an "
          "honest one.", returns_stale_answers)
def _check_returns_stale_answers(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    cases = [  # (name, builder, is it a cheat, what it does)
        ("honest_softmax", lambda: hacks.honest_softmax, False, "an honest softmax"),
        ("honest_rounding", lambda: _honest_rounding, False,
         "an honest softmax computed by hand (its rounding differs from torch.softmax by ~1e-7)"),
        ("cache_last_output", lambda: hacks.GALLERY["cache_last_output"].build("cpu"), True,
         "computes once per shape, then returns the stored answer"),
        ("partial_write", lambda: hacks.GALLERY["partial_write"].build("cpu"), True,
         "keeps one buffer per shape and rewrites only half of its rows"),
        ("cache_by_address", _by_address, True,
         "caches its answer by the input's address (new tensors get new addresses: refill one in place)"),
        ("cache_after_a_while", lambda: _cache_after(2), True,
         "is honest for its first two calls, then returns a copy of its last answer"),
    ]
    for name, build, cheat, what in cases:
        rows, cols = rng.randint(2, 9), rng.randint(2, 300)
        got = fn(build(), rows, cols)
        if not isinstance(got, (bool, torch.Tensor)) and got not in (0, 1):
            return [f"expected True or False, got {type(got).__name__} ({got!r})"]
        if bool(got) != cheat:
            verdict = "True (it returned a wrong answer)" if got else "False (always right)"
            problems.append(f"{name} ({what}), at shape ({rows}, {cols}): you answered {verdict}, but it "
                            + ("cheats" if cheat else "is honest"))
    return problems


# --------------------------------------------------------------------------- 08.2 an honest timer


def honest_time_ms(fn, make_input, reps: int = 5) -> float:
    """The time of one call of ``fn(x)`` in milliseconds, measured so that no trick shrinks it.

    ``make_input()`` returns a new input tensor each time it is called. ``fn`` may try to look
    fast: return before its work is done and finish it as side work (``harness.launch_side_work``,
    which ``harness.synchronize()`` waits for), return a lazy tensor that computes its values only
    when something first reads them, answer from a cache when it sees an input again, or be slow
    on its first call only (a compile) so that one outlier dominates an average. Charge all of a
    call's work to it, and return the median over ``reps`` calls (the clock: ``time.perf_counter``)."""
    raise NotImplementedError  # your code here


WORK_S = 0.02  #: the "work" of each candidate of 08.2: a sleep of 20 ms
SLOW_FIRST = 25  #: the first call of the "compile" candidate sleeps this many times longer in addition


def _work(x):
    time.sleep(WORK_S)
    return torch.softmax(x, dim=-1)


def _timed_side_work():
    def side_work(x):
        out = torch.empty_like(x)

        def later():
            out.copy_(_work(x))
        harness.launch_side_work(later)  # returns at once; harness.synchronize() waits for it
        return out
    return side_work


def _timed_lazy():
    return lambda x: Deferred(x, _work)  # 20 ms of work, done when a torch function first reads it


def _timed_cache():
    seen = set()

    def cached(x):
        key = tuple(x.reshape(-1)[:8].tolist())
        if key in seen:
            return torch.softmax(x, dim=-1)  # "cached": no work
        seen.add(key)
        return _work(x)
    return cached


def _timed_slow_first():
    calls = [0]

    def slow_first(x):
        calls[0] += 1
        if calls[0] == 1:
            time.sleep(SLOW_FIRST * WORK_S)  # a one-off compile
        return _work(x)
    return slow_first


@exercise("08.2", "an honest timer",
          "Time a call so that side work, lazy outputs, caches and a slow first call cannot distort it.",
          honest_time_ms)
def _check_honest_time_ms(fn) -> list[str]:
    problems = []
    rows, cols = random.randint(2, 8), random.randint(16, 256)
    make_input = lambda: torch.randn(rows, cols)  # noqa: E731
    ms_work = WORK_S * 1e3
    lo = 0.75 * ms_work  # a sleep never ends early: less than this, and work escaped the clock
    cases = [
        ("an honest fn", _work, "check the unit (milliseconds) and that the clock runs around the call"),
        ("a fn that finishes its work as side work after it returned", _timed_side_work(),
         "stop the clock only after harness.synchronize()"),
        ("a fn that returns a lazy tensor, computed when first read", _timed_lazy(),
         "read the output (e.g. out.clone()) before you stop the clock"),
        ("a fn that answers from a cache on inputs it has seen", _timed_cache(),
         "give every call a new input from make_input()"),
        (f"a fn whose first call takes {SLOW_FIRST}x longer (a compile)", _timed_slow_first(),
         "take the median over the calls, not the mean or the sum"),
    ]
    honest_ms = None
    for what, candidate, hint in cases:
        got = fn(candidate, make_input, 5)
        try:
            got = float(got)
        except (TypeError, ValueError):
            return [f"expected a number of milliseconds, got {type(got).__name__}"]
        # too long: for the honest fn, a wrong unit; for the slow first call, an average. Relative to
        # what this timer said for the honest fn, so a loaded machine's slower sleeps pass.
        hi = 20 * ms_work if honest_ms is None else max(3 * ms_work, 2 * honest_ms)
        if not lo <= got <= hi:
            problems.append(f"{what}: each call does {ms_work:.0f} ms of work, your timer said {got:.3g} ms "
                            f"(expected {lo:.0f}-{hi:.0f} ms): {hint}")
        if honest_ms is None:
            if problems:  # wrong on the honest fn: the tricks would only repeat the same problem
                return problems
            honest_ms = got
    harness.synchronize()  # leave no side work behind
    return problems


# --------------------------------------------------------------------------- 08.3 a hack of your own


def my_hack(x: torch.Tensor) -> torch.Tensor:
    """A row softmax of ``x`` (``[rows, cols]``, over the last dim) that cheats. The naive harness
    (``naive.naive_evaluate(my_hack, "softmax")``) must pass it and report it faster than the
    reference; ``harness.evaluate(my_hack, "softmax")`` must fail it. Use any family of the
    catalogue, or a trick of your own."""
    raise NotImplementedError  # your code here


@exercise("08.3", "a hack of your own",
          "Write a softmax that fools the naive harness (passes, looks faster) and that our harness catches.",
          my_hack)
def _check_my_hack(fn) -> list[str]:
    with hacks.undone():  # the naive harness leaves whatever the hack patched in place
        nv = naive.naive_evaluate(fn, "softmax", preset="cpu")
    if nv.message.startswith("raised NotImplementedError"):
        raise NotImplementedError  # the untouched stub: "not written yet"
    if not nv.passed:
        return [f"the naive harness failed it ({nv.message}): a hack must first fool it -- be right on its one "
                "fixed input (seed 0, the first validation shape)"]
    problems = []
    if not nv.speedup > 1.0:
        problems.append(f"the naive harness passed it, but timed it at {nv.ms:.3g} ms against the reference's "
                        f"{nv.reference_ms:.3g} ms: a hack must also look faster than the reference")
    with hacks.undone():
        rep = harness.evaluate(fn, "softmax", preset="cpu", n_test=2, compare_best=False, compare_peer=False)
    if rep.passed:
        problems.append("our harness passed it too: either it is honest (right, and as fast on fresh inputs as on "
                        "repeated ones), or it edits the integrity check's own record of the originals, which only "
                        "isolate=True catches: try a trick the in-process harness can see")
    else:
        print(f"08.3: the naive harness passed it ({nv.speedup:.1f}x faster than the reference on its wall clock); "
              f"ours caught it by {rep.caught_by}")
    return problems
