"""Bench suite ``kernelbench``: the hack gallery and the workbook's own kernels, scored by the harness.

    python -m minimax_lab.bench kernelbench [--cases gallery integrity isolation problems] [--preset auto]
                                            [--out FILE] [--problems softmax rope ...] [--n-test N]
                                            [--isolated-gallery] [--deadline-s S] [--partial FILE]

Case groups (:data:`CASES`, all by
default): ``gallery``, ``integrity``, ``isolation``, ``problems``. For every hack of the gallery
(``gallery``, records ``hack:<name>``): the naive verdict beside ours and the check that caught it
(on a GPU the side-stream hack uses a real CUDA stream); the hacks only the isolated mode catches
are run isolated as well (``--isolated-gallery``: every hack). The same for the integrity hacks
not yet in the catalogue (``integrity``, records ``integrity:<name>``, in both modes). The isolated
mode itself (``isolation``): the workbook's softmax scored in both modes, and the round trip
subtracted from every isolated call (record ``isolation_overhead``). For every problem with a
workbook implementation (``problems``): :func:`~minimax_lab.kernelbench.harness.evaluate` on it
(validation + held-out shapes, then timing against the problem's strong peer, the reference and
the workbook's best); its record's ``speedup_vs`` lists the strong peer first, and it keeps the
p20-p80 spread of each time it compares.

Records are handed to the command line as each item finishes (written at once, so a run cut short
keeps what it finished); ``--partial FILE`` appends them to ``FILE`` as well. ``--deadline-s S``
starts no new item after ``S`` seconds (the items are ordered cheapest first within each group).
A smoke of the strong peers on a GPU, a few minutes (:data:`GPU_SMOKE`)::

    python -m minimax_lab.bench kernelbench --preset gpu --cases problems isolation --n-test 2 --deadline-s 170
"""
from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Sequence

from minimax_lab import measure, runtime
from minimax_lab.kernelbench import hacks, harness
from minimax_lab.kernelbench import problems as problem_set

SUITE = "kernelbench"
#: the workbook's kernels, cheapest first (a run cut short keeps the early ones). ``fp8_fused_moe``
#: runs only when asked (``--problems fp8_fused_moe``): at preset gpu its evaluation takes far longer
#: than the others' together
DEFAULT_PROBLEMS = ("softmax", "rmsnorm_residual", "rope", "moe_align", "msa_select", "paged_decode",
                    "fp8_paged_decode")

#: case groups (all by default): the hack gallery, the integrity hacks, the isolated mode's own records,
#: the workbook's kernels
CASES = ("gallery", "integrity", "isolation", "problems")
#: the command of a GPU smoke of the strong peers: every default problem timed against its strong peer
#: and the reference, and the two modes' clocks on one honest kernel, within about three minutes
GPU_SMOKE = ("python -m minimax_lab.bench kernelbench --preset gpu --cases problems isolation --n-test 2 "
             "--deadline-s 170")

#: options of :func:`run` as ``python -m minimax_lab.bench kernelbench`` arguments
OPTIONS = {
    "problems": dict(nargs="+", metavar="NAME", help=f"problems to score (default {' '.join(DEFAULT_PROBLEMS)})"),
    "n_test": dict(type=int, metavar="N", help="held-out shapes per problem (default 3)"),
    "isolated_gallery": dict(action="store_true", help="run every hack in isolated mode too"),
    "deadline_s": dict(type=float, metavar="S", help="start no new item after S seconds"),
    "partial": dict(metavar="FILE", help="append the records to FILE after each item"),
}


def check_options(problems: Sequence[str] | None = None, n_test: int = 3, isolated_gallery: bool = False,
                  partial: str | Path | None = None, deadline_s: float | None = None) -> None:
    """Raise ``ValueError`` for an option :func:`run` cannot use (before anything runs)."""
    for name in problems or ():
        problem_set.get_problem(name)
    if n_test is None:
        n_test = 3
    if not (isinstance(n_test, int) and n_test >= 0):
        raise ValueError(f"--n-test must be a non-negative number of held-out shapes, got {n_test!r}")
    if partial is not None and Path(partial).is_dir():
        raise ValueError(f"--partial {partial} is a folder; name a records file")
    if deadline_s is not None and not deadline_s > 0:
        raise ValueError(f"--deadline-s must be a positive number of seconds, got {deadline_s!r}")


def gallery_records(comparisons: Sequence[hacks.Comparison], prefix: str = "hack") -> list[dict]:
    """One record per hack that the naive harness passed (its naive wall-clock ms as ``ms``; a
    time at or below zero -- the naive harness believed a patched clock -- is recorded as its
    absolute value with ``naive_ms_reported``); the case is ``<prefix>:<hack>``."""
    recs = []
    for c in comparisons:
        if not c.naive.passed:
            continue
        mode = "isolated" if c.ours.isolated else "in-process"
        recs.append(measure.make_record(
            SUITE, f"{prefix}:{c.hack.name}", f"naive-vs-ours ({mode})", abs(c.naive.ms) or 1e-9, extra={
                "naive_passed": True, "naive_ms_reported": c.naive.ms,
                "naive_reference_ms": round(c.naive.reference_ms, 6), "naive_speedup": round(c.naive.speedup, 3),
                "ours_passed": c.ours.passed, "ours_mode": mode, "caught_by": c.expected_check,
                "caught": c.caught, "all_failed_checks": c.ours.caught_by, "overfit": c.ours.overfit,
                "timing_method": "naive: wall clock, no synchronize"}))
    return recs


def isolation_records(preset: str, n_test: int = 3) -> list[dict]:
    """The workbook's Triton softmax scored in both modes: the isolated score (a record), and the
    round trip subtracted from each isolated call beside both modes' times (``isolation_overhead``);
    and an honest kernel slow enough to stand above the isolated mode's resolution (~20 ms on a GPU)
    scored in both modes (``isolation_agreement``)."""
    cand = "minimax_lab.kernelbench.ops_triton:softmax_triton"
    inside = harness.evaluate(cand, "softmax", preset=preset, n_test=n_test, compare_best=False)
    iso = harness.evaluate(cand, "softmax", preset=preset, n_test=n_test, compare_best=False, isolate=True,
                           name="workbook:softmax (isolated)")
    recs = iso.to_records(SUITE)
    if inside.timing and iso.timing:
        t_in, t_iso = inside.timing, iso.timing
        recs.append(measure.make_record(
            SUITE, "isolation_overhead", "worker round trip", t_iso["overhead_ms"], shape=t_iso["shape"],
            dtype=t_iso["dtype"], extra={
                "resolution_ms": t_iso["resolution_ms"], "in_process_ms": t_in["ms"], "isolated_ms": t_iso["ms"],
                "isolated_over_in_process": t_iso["ms"] / t_in["ms"], "both_passed": inside.passed and iso.passed,
                "timing_method": "median round trip of a trusted stand-in before the candidate is loaded"}))
    # above the isolated mode's resolution: an honest ~20 ms kernel (the softmax plus a spin on a GPU)
    slow = "minimax_lab.kernelbench.hacks:slow_softmax"
    slow_in = harness.evaluate(slow, "softmax", preset=preset, n_test=1, compare_best=False)
    slow_iso = harness.evaluate(slow, "softmax", preset=preset, n_test=1, compare_best=False, isolate=True)
    if slow_in.timing and slow_iso.timing:
        a, b = slow_in.timing["ms"], slow_iso.timing["ms"]
        recs.append(measure.make_record(
            SUITE, "isolation_agreement", "honest slow softmax, both modes", b, shape=slow_iso.timing["shape"],
            dtype=slow_iso.timing["dtype"], extra={
                "in_process_ms": a, "isolated_ms": b, "isolated_over_in_process": b / a,
                "in_process_p20_ms": slow_in.timing.get("p20_ms"), "in_process_p80_ms": slow_in.timing.get("p80_ms"),
                "isolated_p20_ms": slow_iso.timing.get("p20_ms"), "isolated_p80_ms": slow_iso.timing.get("p80_ms"),
                "resolution_ms": slow_iso.timing["resolution_ms"], "both_passed": slow_in.passed and slow_iso.passed,
                "timing_method": "in-process: CUDA events (wall clock on the CPU); isolated: the parent's wall "
                                 "clock, round trip subtracted"}))
    return recs


def _say(c: hacks.Comparison) -> str:
    mode = "isolated" if c.ours.isolated else "in-process"
    return (f"[kernelbench] hack {c.hack.name:24s} naive {'PASS' if c.naive.passed else 'FAIL'} "
            f"({c.naive.speedup:.2f}x)  ours ({mode}) {'PASS' if c.ours.passed else 'FAIL'}  "
            f"caught by {c.expected_check!r}: {c.caught}  (all: {', '.join(c.ours.caught_by)})")


def run(preset: str = "auto", cases=None, *, problems: Sequence[str] | None = None, n_test: int = 3,
        isolated_gallery: bool = False, partial: str | Path | None = None, deadline_s: float | None = None,
        sink=None, verbose: bool = True) -> list[dict]:
    """Score the case groups ``cases`` (default all of :data:`CASES`), in this order: the gallery
    (in-process, and isolated: the hacks that need it, or all with ``isolated_gallery``), the
    integrity hacks, the workbook's kernels (``problems``, default :data:`DEFAULT_PROBLEMS`) and the
    isolated mode's own records; returns
    the records, handing each item's to ``sink`` (and appending them to ``partial``) as it goes.
    After ``deadline_s`` seconds no new item starts (each one skipped is said)."""
    chosen = measure.select_cases(cases, CASES)
    preset = runtime.resolve_preset(preset)
    check_options(problems, n_test, isolated_gallery, partial, deadline_s)  # a bad option fails here, before anything runs
    records: list[dict] = []
    t_start = time.perf_counter()

    def emit(recs):
        records.extend(recs)
        if sink is not None and recs:
            sink(recs)
        if partial is not None and recs:
            measure.append_records(recs, partial)

    def in_time(item: str) -> bool:
        if deadline_s is None or time.perf_counter() - t_start < deadline_s:
            return True
        print(f"[kernelbench] {item}: not started, past the deadline of {deadline_s:g} s")
        return False

    if "gallery" in chosen and in_time("gallery"):
        t0 = time.perf_counter()
        comps = hacks.gallery_table(preset=preset, n_test=n_test)
        isolated = [n for n, h in hacks.GALLERY.items() if isolated_gallery or h.needs_isolation]
        comps += hacks.gallery_table(preset=preset, n_test=n_test, names=isolated, isolated=True)
        for c in comps:
            if verbose:
                print(_say(c))
        emit(gallery_records(comps))
        if verbose:
            print(f"[kernelbench] gallery in {time.perf_counter() - t0:.1f} s")
    if "integrity" in chosen and in_time("integrity"):
        names = sorted(hacks.INTEGRITY_HACKS)
        comps = [c for isolated in (False, True)
                 for c in hacks.gallery_table(preset=preset, n_test=n_test, names=names, isolated=isolated)]
        for c in comps:
            if verbose:
                print(_say(c))
        emit(gallery_records(comps, prefix="integrity"))
    for name in (problems or DEFAULT_PROBLEMS) if "problems" in chosen else ():
        if not in_time(name):
            continue
        p = problem_set.get_problem(name)
        t0 = time.perf_counter()
        if p.available() is not None:
            print(f"[kernelbench] {name}: skipped -- {p.available()}")
            continue
        best = p.best()
        try:
            rep = harness.evaluate(best or p.reference, p, preset=preset, n_test=n_test, compare_best=False,
                                   name=f"workbook:{name}" if best else f"reference:{name}")
        except Exception as e:  # a broken reference or input generator must not hide the other problems
            traceback.print_exc()
            print(f"[kernelbench] {name}: ERROR {type(e).__name__}: {e}")
            continue
        if verbose:
            print(f"[kernelbench] ({time.perf_counter() - t0:.1f} s) {rep.summary()}")
        emit(rep.to_records(SUITE))
    if "isolation" in chosen and in_time("isolation"):
        t0 = time.perf_counter()
        emit(isolation_records(preset, n_test))
        if verbose:
            print(f"[kernelbench] isolation in {time.perf_counter() - t0:.1f} s")
    return records
