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
and the harness's own side-work machinery, with fresh random shapes (and, in 08.2, fresh amounts of
work) on every call. Every candidate is handed over alike and counts the calls made of it: 08.1's
verdict must agree with the answers the learner's calls got, 08.2's timer must call what it times.
The answers may not use the harness's own checks and timers; 08.3's answer, meant to tamper, runs
unguarded and is judged by the harness itself.
"""
from __future__ import annotations

import statistics
import time

import torch

from minimax_lab import measure
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


class _Candidate:
    """What the learner's check is handed: every candidate, honest or not, looks the same (one class,
    one name), and it keeps the books of the calls made -- how many, and which answers were wrong
    (relative error above 1e-4, judged right after the call) -- so a verdict must come from calls."""

    __name__ = __qualname__ = "candidate"

    def __init__(self, build):
        self._call = build()
        self.calls = 0
        self.wrong: list[int] = []   # the calls (1, 2, ...) whose answer was wrong

    def __call__(self, x):
        self.calls += 1
        out = self._call(x)
        if measure.relative_error(out, torch.softmax(x, dim=-1)) > 1e-4:
            self.wrong.append(self.calls)
        return out

    def __repr__(self) -> str:
        return "<candidate>"


@exercise("08.1", "a check for stale answers",
          "Catch a candidate that answers from a cache by calling it on fresh inputs, without accusing an "
          "honest one.", returns_stale_answers, answers=(harness.evaluate, naive.naive_evaluate))
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
    rng.shuffle(cases)
    for name, build, cheat, what in cases:
        rows, cols = rng.randint(2, 9), rng.randint(2, 300)
        candidate = _Candidate(build)
        got = fn(candidate, rows, cols)
        if not isinstance(got, (bool, torch.Tensor)) and got not in (0, 1):
            return [f"expected True or False, got {type(got).__name__} ({got!r})"]
        where = f"{name} ({what}), at shape ({rows}, {cols})"
        if not bool(got) and candidate.calls < 4:
            problems.append(f"{where}: you answered False after {candidate.calls} call(s); call it at least four times "
                            "and judge its answers (its name or type tells nothing: every candidate is handed over "
                            "alike)")
        elif bool(got) and not candidate.wrong:
            problems.append(f"{where}: you answered True, but none of its {candidate.calls} answers to your calls was "
                            "wrong (relative error above 1e-4): the verdict must come from the answers you judged")
        elif not bool(got) and candidate.wrong:
            problems.append(f"{where}: its answer to your call {candidate.wrong[0]} was wrong, yet you answered False")
        elif bool(got) != cheat:
            verdict = "True (it returned a wrong answer)" if got else "False (always right)"
            problems.append(f"{where}: you answered {verdict}, but it " + ("cheats" if cheat else "is honest"))
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


SLOW_FIRST = 25  #: the first call of the "compile" candidate sleeps this many times longer in addition


class _Timed:
    """A candidate of 08.2 whose work is a sleep of ``work_s`` (drawn per check: no fixed number
    passes) and a softmax. It keeps the books: how many calls, how many served from its cache, and
    each call's true duration -- from the call to the end of its work, wherever that work ran (side
    work, a lazy output read later) -- which an honest timer reads too."""

    __name__ = __qualname__ = "fn"

    def __init__(self, work_s: float, trick: str):
        self.work_s, self.trick = work_s, trick
        self.calls, self.hits = 0, 0
        self._seen: set = set()
        self._spans: list[list] = []   # [start, end of its work or None], one per call

    def _work(self, x, span: list):
        time.sleep(self.work_s)
        out = torch.softmax(x, dim=-1)
        span[1] = time.perf_counter()
        return out

    def __call__(self, x):
        self.calls += 1
        span = [time.perf_counter(), None]
        self._spans.append(span)
        if self.trick == "side work":
            out = torch.empty_like(x)

            def later():
                out.copy_(self._work(x, span))
            harness.launch_side_work(later)  # returns at once; harness.synchronize() waits for it
            return out
        if self.trick == "lazy":
            return Deferred(x, lambda t: self._work(t, span))   # the work runs when a torch function first reads it
        if self.trick == "cache":
            key = tuple(x.reshape(-1)[:8].tolist())
            if key in self._seen:
                self.hits += 1
                span[1] = time.perf_counter()
                return torch.softmax(x, dim=-1)  # "cached": no work
            self._seen.add(key)
        if self.trick == "slow first" and self.calls == 1:
            time.sleep(SLOW_FIRST * self.work_s)  # a one-off compile
        return self._work(x, span)

    def median_ms(self) -> float:
        """The median true duration of the calls made, in ms (a call whose work never ran counts as
        its sleep alone)."""
        return statistics.median((end - start) if end is not None else self.work_s for start, end in self._spans) * 1e3


@exercise("08.2", "an honest timer",
          "Time a call so that side work, lazy outputs, caches and a slow first call cannot distort it.",
          honest_time_ms, answers=(harness.time_calls, harness.evaluate, measure.time_fn))
def _check_honest_time_ms(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    rows, cols = rng.randint(2, 8), rng.randint(16, 256)
    work = rng.uniform(0.012, 0.025)
    cases = [
        ("an honest fn", "honest", work, "check the unit (milliseconds) and that the clock runs around the call"),
        ("a fn that finishes its work as side work after it returned", "side work", work,
         "stop the clock only after harness.synchronize()"),
        ("a fn that returns a lazy tensor, computed when first read", "lazy", work,
         "read the output (e.g. out.clone()) before you stop the clock"),
        ("a fn that answers from a cache on inputs it has seen", "cache", work,
         "give every call a new input from make_input()"),
        (f"a fn whose first call takes {SLOW_FIRST}x longer (a compile)", "slow first", work,
         "take the median over the calls, not the mean or the sum"),
        ("an honest fn that works 4-5x longer", "honest", work * rng.uniform(4, 5),
         "the clock must run around each call"),
    ]
    for what, trick, work_s, hint in cases:
        candidate = _Timed(work_s, trick)
        got = fn(candidate, lambda: torch.randn(rows, cols), 5)
        harness.synchronize()  # leave no side work behind
        try:
            got = float(got)
        except (TypeError, ValueError):
            return [f"expected a number of milliseconds, got {type(got).__name__}"]
        if candidate.calls < 5:
            return problems + [f"{what}: your timer called fn {candidate.calls} time(s); time 5 calls (reps) and "
                               "return their median"]
        if candidate.hits:
            problems.append(f"{what}: {candidate.hits} of your {candidate.calls} calls got an input fn had seen before, "
                            f"which it answered from its cache: {hint}")
            continue
        # each call's true duration, as fn itself saw it: an honest timer reads a little more (the
        # clock runs around the call), never less; on a loaded machine both grow alike
        true_ms = candidate.median_ms()
        lo, hi = 0.9 * true_ms, 1.25 * true_ms + 8
        if not lo <= got <= hi:
            problems.append(f"{what}: each call does {work_s * 1e3:.0f} ms of work and took {true_ms:.0f} ms from "
                            f"the call to the end of its work, your timer said {got:.3g} ms (expected {lo:.0f}-{hi:.0f} "
                            f"ms): {hint}")
            if trick == "honest" and len(problems) == 1:   # wrong on the honest fn: the tricks would repeat it
                return problems
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
          my_hack, guarded=False)   # the answer is meant to tamper: the harness itself watches it
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
