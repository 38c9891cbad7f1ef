"""The hack gallery: candidates that score well under the naive harness and are caught by ours.

Each :class:`Hack` builds a fresh candidate for the row-softmax problem (state such as caches
starts empty), says what trick it plays, and names the check of :mod:`.harness` that catches it.
:func:`compare` runs one through both harnesses; :func:`gallery_table` runs them all.

These are the tricks kernel benchmarks have actually been gamed with -- by people tuning for a
leaderboard and by models rewarded for speed-ups (see e.g. METR's "Recent frontier models are
reward hacking", 2025, https://metr.org/blog/2025-06-05-recent-reward-hacking/, and the
KernelBench discussion of timing and caching exploits, https://github.com/ScalingIntelligence/KernelBench).
They are written here only to be caught.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from typing import Callable

import torch

from minimax_lab import runtime
from minimax_lab.kernelbench import harness, naive, problems

PROBLEM = "softmax"
TIMED_N_TEST = 3  # the n_test the harness is run with for hacks that must be timed to be caught


def _softmax(x: torch.Tensor) -> torch.Tensor:
    """The honest core every hack wraps: a correct row softmax in x's dtype."""
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


@dataclasses.dataclass(frozen=True)
class Hack:
    """One trick: ``build(preset)`` returns a fresh candidate; ``caught_by`` names our check."""

    name: str
    idea: str
    caught_by: str
    why: str
    build: Callable[[str], Callable]
    problem: str = PROBLEM
    timed: bool = False  # caught only if the harness also times it


# --------------------------------------------------------------------------- the tricks


def _cache_last_output(preset):
    cache = {}

    def cache_last_output(x):
        key = (tuple(x.shape), x.dtype)
        if key not in cache:  # first call: honest; every later call at this shape: the old answer
            cache[key] = _softmax(x)
        return cache[key]
    return cache_last_output


def _memo_on_input_identity(preset):
    memo = {}

    def memo_on_input_identity(x):
        key = (x.data_ptr(), x._version, tuple(x.shape), x.dtype)  # same tensor, not rewritten: reuse
        if key not in memo:
            memo[key] = _softmax(x)
        return memo[key]
    return memo_on_input_identity


def _special_case_validation(preset):
    public = {(s["rows"], s["cols"]) for s in problems.get_problem(PROBLEM).validation_shapes(preset)}

    def special_case_validation(x):
        if tuple(x.shape) in public:
            return _softmax(x)
        return torch.full_like(x, 1.0 / x.shape[-1])  # anywhere else: a constant, no work at all
    return special_case_validation


def _precision_cut(preset):
    def precision_cut(x):
        e = torch.exp(x.half())  # fp16 and no max subtraction: fine for N(0, 1), overflows on sharp logits
        return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
    return precision_cut


def _side_stream(preset):
    stream = []

    def side_stream(x):
        out = torch.empty_like(x)
        if x.is_cuda:
            if not stream:
                stream.append(torch.cuda.Stream())
            s = stream[0]
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):  # the caller's stream is never told to wait for this
                torch.cuda._sleep(2_000_000)  # ~1 ms of a busy GPU before the answer lands
                out.copy_(_softmax(x))
        else:
            def late():
                time.sleep(0.05)
                out.copy_(_softmax(x))
            harness.launch_side_work(late)  # the CPU's stand-in for a side stream
        return out
    return side_stream


def _partial_write(preset):
    buffers = {}

    def partial_write(x):
        key = (tuple(x.shape), x.dtype)
        if key not in buffers:
            buffers[key] = _softmax(x)
            return buffers[key]
        y = buffers[key]
        half = max(1, x.shape[0] // 2)
        y[:half] = _softmax(x[:half])  # only the first half of the rows is rewritten
        return y
    return partial_write


def _read_expected(preset):
    def read_expected(x):
        f = sys._getframe(1)
        while f is not None:  # look through the callers for a tensor that looks like the answer
            for v in list(f.f_locals.values()):
                if (isinstance(v, torch.Tensor) and v.shape == x.shape and v.dtype == x.dtype
                        and v.data_ptr() != x.data_ptr() and v.numel() and bool((v >= 0).all())
                        and torch.allclose(v.float().sum(-1), torch.ones(x.shape[0], device=x.device), atol=1e-2)):
                    return v.clone()
            f = f.f_back
        return torch.full_like(x, 1.0 / x.shape[-1])  # nothing found: guess
    return read_expected


def _patch_the_judge(preset):
    def patch_the_judge(x):
        torch.allclose = lambda *a, **k: True  # every comparison made with allclose now passes
        return torch.full_like(x, 1.0 / x.shape[-1])
    return patch_the_judge


def _lazy_after_checks(preset):
    state = {"calls": 0, "last": None}
    honest_calls = harness.check_calls(PROBLEM, preset, n_test=TIMED_N_TEST)

    def lazy_after_checks(x):
        state["calls"] += 1
        if state["calls"] <= honest_calls or state["last"] is None or state["last"].shape != x.shape:
            state["last"] = _softmax(x)  # honest while it is being checked ...
            return state["last"].clone()
        return state["last"].clone()  # ... then, in the timing loop, the old answer: no work at all
    return lazy_after_checks


def _in_place_on_input(preset):
    def in_place_on_input(x):
        x.sub_(x.amax(dim=-1, keepdim=True)).exp_()  # reuse the input as the output: no allocation
        return x.div_(x.sum(dim=-1, keepdim=True))
    return in_place_on_input


GALLERY: dict[str, Hack] = {h.name: h for h in [
    Hack("cache_last_output", "computes once per shape, then returns the stored answer",
         "fresh inputs", "every call gets new random inputs, so an old answer is wrong", _cache_last_output),
    Hack("memo_on_input_identity", "reuses the answer when called on the same, unmodified tensor "
         "(the naive timer calls it on one input over and over)",
         "no aliasing", "a repeat call returns the very tensor it returned before", _memo_on_input_identity),
    Hack("special_case_validation", "runs the real kernel only on the public validation shapes",
         "held-out shapes", "shapes drawn at evaluation time hit the fake path (flagged overfit)",
         _special_case_validation),
    Hack("precision_cut", "computes in fp16 without the max trick: within tolerance on N(0,1) inputs",
         "value regimes", "sharp logits (x40) overflow fp16 to inf", _precision_cut),
    Hack("side_stream", "launches the work on a side stream (CPU: a thread) and returns at once",
         "stream-ordered result", "the output read on the caller's stream right after return is not the "
         "answer yet; the timer's device-wide synchronize also counts the hidden work", _side_stream),
    Hack("partial_write", "keeps one output buffer per shape and rewrites only half of its rows",
         "no aliasing", "the returned buffer is an earlier output; its stale rows are wrong on fresh inputs",
         _partial_write),
    Hack("read_expected", "walks the caller's frames for the expected answer and returns a copy",
         "no introspection", "frame walks are seen by an audit hook; and the reference is only computed after "
         "the candidate returns, so there is nothing to find", _read_expected),
    Hack("patch_the_judge", "replaces torch.allclose with a function that always says yes",
         "harness integrity", "the judging functions are checked (and restored) after every call; ours "
         "never used allclose anyway", _patch_the_judge),
    Hack("in_place_on_input", "writes the softmax into its input and returns it",
         "inputs untouched", "inputs are compared with a copy taken before the call", _in_place_on_input),
    Hack("lazy_after_checks", "counts the harness's check calls (its source is public), stays honest for "
         "exactly that many, then returns a copy of its last answer",
         "checked while timed", "the outputs made inside the timing loop are checked against their own inputs",
         _lazy_after_checks, timed=True),
]}


# --------------------------------------------------------------------------- running them


@dataclasses.dataclass
class Comparison:
    """One hack under both harnesses."""

    hack: Hack
    naive: naive.NaiveReport
    ours: harness.Report

    @property
    def fools_naive(self) -> bool:
        return self.naive.passed

    @property
    def caught(self) -> bool:
        return not self.ours.passed and self.hack.caught_by in self.ours.caught_by

    def row(self) -> dict:
        return {"hack": self.hack.name, "trick": self.hack.idea,
                "naive verdict": "PASS" if self.naive.passed else "FAIL",
                "naive speed-up": round(self.naive.speedup, 2) if self.naive.passed else None,
                "our verdict": "PASS" if self.ours.passed else "FAIL",
                "caught by": self.hack.caught_by, "also failed": ", ".join(c for c in self.ours.caught_by
                                                                          if c != self.hack.caught_by),
                "overfit flagged": self.ours.overfit}


def compare(hack: Hack | str, *, preset: str = "auto", n_test: int = 3) -> Comparison:
    """Run ``hack`` through the naive harness and through ours (fresh state for each)."""
    hack = GALLERY[hack] if isinstance(hack, str) else hack
    preset = runtime.resolve_preset(preset)
    nv = naive.naive_evaluate(hack.build(preset), hack.problem, preset=preset)
    harness.restore_tampering()  # the naive harness leaves a patched torch behind; undo it
    if hack.timed:
        n_test = TIMED_N_TEST
    ours = harness.evaluate(hack.build(preset), hack.problem, preset=preset, n_test=n_test, time_it=hack.timed,
                            compare_best=False)
    harness.restore_tampering()
    return Comparison(hack, nv, ours)


def gallery_table(*, preset: str = "auto", n_test: int = 3, progress: bool = False) -> list[Comparison]:
    """Every hack in :data:`GALLERY` through both harnesses."""
    items = list(GALLERY.values())
    if progress:
        try:
            from tqdm.auto import tqdm
            items = tqdm(items, desc="hack gallery")
        except ImportError:  # pragma: no cover
            pass
    return [compare(h, preset=preset, n_test=n_test) for h in items]
