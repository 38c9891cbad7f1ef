"""Bench suite ``kernelbench``: the hack gallery and the workbook's own kernels, scored by the harness.

    python -m minimax_lab.kernelbench [--preset auto] [--out FILE] [--problems softmax rope ...]

For every hack: the naive verdict beside ours and the check that caught it (on a GPU the
side-stream hack uses a real CUDA stream). For every problem with a workbook implementation:
:func:`~minimax_lab.kernelbench.harness.evaluate` on it (validation + held-out shapes, then
timing against the reference). Records (suite ``"kernelbench"``) are written after each item,
so a run cut short still leaves what it finished.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Sequence

from minimax_lab import bench, runtime
from minimax_lab.kernelbench import hacks, harness, problems

SUITE = "kernelbench"
#: the workbook's kernels, cheapest first (a run cut short keeps the early ones)
DEFAULT_PROBLEMS = ("softmax", "rmsnorm_residual", "rope", "moe_align", "msa_select", "paged_decode")


def gallery_records(comparisons: Sequence[hacks.Comparison]) -> list[dict]:
    """One record per hack that the naive harness passed (its naive wall-clock ms as ``ms``)."""
    recs = []
    for c in comparisons:
        if not (c.naive.passed and c.naive.ms > 0):
            continue
        recs.append(bench.make_record(
            SUITE, f"hack:{c.hack.name}", "naive-vs-ours", c.naive.ms, extra={
                "naive_passed": True, "naive_reference_ms": round(c.naive.reference_ms, 6),
                "naive_speedup": round(c.naive.speedup, 3), "ours_passed": c.ours.passed,
                "caught_by": c.hack.caught_by, "caught": c.caught, "all_failed_checks": c.ours.caught_by,
                "overfit": c.ours.overfit, "timing_method": "naive: wall clock, no synchronize"}))
    return recs


def run(preset: str = "auto", *, names: Sequence[str] | None = None, n_test: int = 3, gallery: bool = True,
        out: str | Path | None = None, verbose: bool = True) -> list[dict]:
    """Score the gallery and the workbook's kernels; returns the records (appended to ``out`` as it goes)."""
    preset = runtime.resolve_preset(preset)
    records: list[dict] = []

    def emit(recs):
        records.extend(recs)
        if out is not None and recs:
            bench.append_records(recs, out)

    if gallery:
        t0 = time.perf_counter()
        comps = hacks.gallery_table(preset=preset, n_test=n_test)
        for c in comps:
            if verbose:
                print(f"[kernelbench] hack {c.hack.name:24s} naive {'PASS' if c.naive.passed else 'FAIL'} "
                      f"({c.naive.speedup:.2f}x)  ours {'PASS' if c.ours.passed else 'FAIL'}  "
                      f"caught by {c.hack.caught_by!r}: {c.caught}  (all: {', '.join(c.ours.caught_by)})")
        emit(gallery_records(comps))
        if verbose:
            print(f"[kernelbench] gallery in {time.perf_counter() - t0:.1f} s")
    for name in names or DEFAULT_PROBLEMS:
        p = problems.get_problem(name)
        t0 = time.perf_counter()
        if p.available() is not None:
            print(f"[kernelbench] {name}: skipped -- {p.available()}")
            continue
        best = p.best()
        try:
            rep = harness.evaluate(best or p.reference, p, preset=preset, n_test=n_test, compare_best=False,
                                   name=f"workbook:{name}" if best else f"reference:{name}")
        except Exception as e:  # a broken reference or input generator must not hide the other problems
            import traceback

            traceback.print_exc()
            print(f"[kernelbench] {name}: ERROR {type(e).__name__}: {e}")
            continue
        if verbose:
            print(f"[kernelbench] ({time.perf_counter() - t0:.1f} s) {rep.summary()}")
        emit(rep.to_records(SUITE))
    return records


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minimax_lab.kernelbench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="auto", choices=runtime.PRESETS)
    ap.add_argument("--out", default=None, help="records file to append to (default: print only)")
    ap.add_argument("--problems", nargs="*", default=None, help=f"from {sorted(problems.PROBLEMS)}")
    ap.add_argument("--n-test", type=int, default=3, help="held-out shapes per problem")
    ap.add_argument("--no-gallery", action="store_true")
    args = ap.parse_args(argv)
    print(f"[kernelbench] {runtime.device_name()} torch {__import__('torch').__version__}; "
          f"preset {runtime.resolve_preset(args.preset)}")
    recs = run(args.preset, names=args.problems, n_test=args.n_test, gallery=not args.no_gallery, out=args.out)
    print(bench.format_table(recs))
    return 0
