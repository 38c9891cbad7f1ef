"""What this machine measured just now, beside what was recorded on the H200.

Both sides are benchmark records (the dicts of :func:`minimax_lab.measure.make_record`):
``measured`` from a run in this process -- the bench suites' own case functions return them --
and ``recorded`` from :func:`minimax_lab.measure.load_records`. A row pairs the two sides'
records of one ``(case, impl)``; recorded rows are kept only for the cases measured now, so the
comparison is always at the same shape. A side without a twin leaves its bar (or cell) empty.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np

#: metric -> (axis label, True when larger is better)
METRICS = {"tflops": ("TFLOP/s", True), "gbps": ("GB/s", True), "ms": ("ms per call", False)}


def _check_metric(metric: str) -> None:
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {sorted(METRICS)}, got {metric!r}")


def pair_rows(measured: Sequence[dict], recorded: Sequence[dict], metric: str) -> list[dict]:
    """Rows ``{case, impl, measured, recorded}`` (values of ``metric`` or None): the measured
    records in their order, then recorded-only impls of the same cases."""
    _check_metric(metric)
    cases = {r["case"] for r in measured}
    rows: dict[tuple, dict] = {}
    for side, recs in (("measured", measured), ("recorded", [r for r in recorded if r.get("case") in cases])):
        for r in recs:
            row = rows.setdefault((r["case"], r["impl"]), {"case": r["case"], "impl": r["impl"],
                                                          "measured": None, "recorded": None})
            row[side] = r.get(metric)
    return list(rows.values())


def commits_label(records: Sequence[dict]) -> str:
    """'commit 580080a' (or 'commits a, b') of the records, shortened to 7 characters: provenance for
    the bench report, not for a chapter's titles (a learner's copy has no such commit)."""
    shas = sorted({str(r["commit"])[:7] for r in records if r.get("commit")})
    if not shas:
        return "commit unknown"
    return ("commit " if len(shas) == 1 else "commits ") + ", ".join(shas)


def versions_label(records: Sequence[dict]) -> str:
    """'torch 2.11.0+cu130, triton 3.6.0' (or several, joined by '; '): the software the records were
    measured with, which a reader can match; the commits are the bench report's business."""
    found = sorted({f"torch {r['torch']}, triton {r['triton']}" for r in records if r.get("torch") and r.get("triton")})
    return "; ".join(found) or "versions unknown"


def _recorded_label(measured: Sequence[dict], recorded: Sequence[dict]) -> str:
    cases = {r["case"] for r in measured}
    here = [r for r in recorded if r.get("case") in cases]
    return versions_label(here) if here else "no record at these shapes"


def format_rows(measured: Sequence[dict], recorded: Sequence[dict], metric: str, *,
                device_now: str = "this machine", recorded_device: str = "NVIDIA H200") -> str:
    """The rows as a plain-text table, with the ratio measured / recorded where both exist."""
    _check_metric(metric)
    unit, _ = METRICS[metric]
    rows = pair_rows(measured, recorded, metric)
    if not rows:
        return "(nothing measured)"
    fmt = lambda v: "-" if v is None else f"{v:,.4g}"  # noqa: E731
    head = (f"{'case':34s} {'impl':34s} {'now, ' + device_now[:22]:>28s} {'recorded, ' + recorded_device:>24s}"
            f" {'now/recorded':>12s}")
    lines = [f"{unit}: measured now on {device_now} vs recorded on {recorded_device} "
             f"({_recorded_label(measured, recorded)})",
             head, "-" * len(head)]
    for r in rows:
        ratio = f"{r['measured'] / r['recorded']:.2f}" if r["measured"] and r["recorded"] else "-"
        lines.append(f"{r['case'][:34]:34s} {r['impl'][:34]:34s} {fmt(r['measured']):>28s} "
                     f"{fmt(r['recorded']):>24s} {ratio:>12s}")
    return "\n".join(lines)


def plot(measured: Sequence[dict], recorded: Sequence[dict], metric: str, *, device_now: str,
         recorded_device: str = "NVIDIA H200", title: str | None = None, ax=None):
    """Horizontal bars, two per row: recorded (grey, hatched) and measured now (orange), each
    labelled with where it comes from. Returns the axes. Raises ``ValueError`` when no row has
    both sides (then there is nothing to compare: print :func:`format_rows` instead)."""
    _check_metric(metric)
    unit, higher_better = METRICS[metric]
    rows = pair_rows(measured, recorded, metric)
    if not any(r["measured"] is not None and r["recorded"] is not None for r in rows):
        raise ValueError("no (case, impl) was both measured now and recorded: nothing to compare")
    ax = ax or plt.subplots(figsize=(9, 0.45 * len(rows) + 1.6))[1]
    y = np.arange(len(rows))[::-1]
    h = 0.38
    rec_vals = [r["recorded"] or 0 for r in rows]
    now_vals = [r["measured"] or 0 for r in rows]
    ax.barh(y + h / 2, rec_vals, h, color="0.7", hatch="//", edgecolor="0.4",
            label=f"recorded on {recorded_device} ({_recorded_label(measured, recorded)})")
    ax.barh(y - h / 2, now_vals, h, color="tab:orange", label=f"measured now on {device_now}")
    for yy, v in zip(y + h / 2, rec_vals):
        if v:
            ax.text(v, yy, f" {v:,.3g}", va="center", fontsize=7, color="0.3")
    for yy, v in zip(y - h / 2, now_vals):
        if v:
            ax.text(v, yy, f" {v:,.3g}", va="center", fontsize=7)
    cases = {r["case"] for r in rows}
    ax.set_yticks(y, [r["impl"] if len(cases) == 1 else f"{r['case']} · {r['impl']}" for r in rows], fontsize=8)
    ax.set_xlabel(f"{unit} ({'higher' if higher_better else 'lower'} is better)")
    ax.set_title(title or (next(iter(cases)) if len(cases) == 1 else "measured now vs recorded"), fontsize=10)
    # outside, right of the axes: a legend inside can cover the bars it explains
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.margins(x=0.15)
    return ax
