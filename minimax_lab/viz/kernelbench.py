"""Pictures of the kernel bench (chapter 08): the path of one call through the harness, and the
recorded scores -- the hacks under the naive harness, the workbook's kernels against their strong
peers and the fp32 reference.

Records are those of suite ``kernelbench`` (:mod:`minimax_lab.bench.suite_kernelbench`): a hack's
record has case ``hack:<name>`` or ``integrity:<name>``; a kernel's has the problem as its case,
``speedup_vs`` with ``strong_peer`` (where recorded) and ``reference``, and ``isolated`` when it
was scored in its own process -- so one problem can have two rows, told apart by their labels.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np

from minimax_lab.notebook import words

#: what a kernel row says where its record has no strong-peer ratio (records made before peers were timed)
NO_PEER = "strong-peer ratio not yet recorded"
_STAGES = (
    ("fresh inputs", "a new seed from os.urandom; held-out shapes drawn only now"),
    ("candidate(**inputs)", "the only code the candidate controls"),
    ("copy the outputs", "on the caller's stream, right after the return"),
    ("put back what it replaced", "torch, math, time, numpy, the harness, the problems, torch's settings"),
    ("synchronize; threads done?", "work that escaped the call would change the outputs now"),
    ("reference on a copy", "computed only now: there was no answer to find during the call"),
    ("judge every element", "in the input's dtype, at the problem's tolerance"),
)


def harness_diagram(ax=None):
    """The path of one call through the harness, top to bottom, with what each step stops."""
    n = len(_STAGES)
    ax = ax or plt.subplots(figsize=(9, 0.55 * n + 0.6))[1]
    for i, (box, why) in enumerate(_STAGES):
        y = n - 1 - i
        ax.text(0, y, box, ha="center", va="center", fontsize=9,
                bbox=dict(boxstyle="round,pad=0.35", fc="white", ec="tab:red" if i == 1 else "tab:blue", lw=1.4))
        ax.text(0.55, y, why, ha="left", va="center", fontsize=8.5, color="0.3")
        if i < n - 1:
            ax.annotate("", (0, y - 0.68), (0, y - 0.32), arrowprops=dict(arrowstyle="->", color="0.4"))
    ax.set(xlim=(-0.6, 2.5), ylim=(-0.6, n - 0.4), title="one call through the harness (red: the candidate's code)")
    ax.axis("off")
    return ax


def kernel_rows(records: Sequence[dict]) -> list[dict]:
    """One row per workbook-kernel record (not a hack's, not the isolated mode's own), in record
    order: ``label`` (the problem, with ``" (isolated)"`` when scored in its own process),
    ``strong_peer`` and ``reference`` ratios (None where not recorded), the peer's name, ``passed``."""
    rows = []
    for r in records:
        case = r.get("case", "")
        if ":" in case or case.startswith("isolation_") or not (r.get("speedup_vs") or {}).get("reference"):
            continue
        ratios = r["speedup_vs"]
        rows.append({"label": case + (" (isolated)" if r.get("isolated") else ""), "problem": case,
                     "strong_peer": ratios.get("strong_peer"), "reference": ratios["reference"],
                     "peer": r.get("strong_peer"), "passed": r.get("status") == "pass"})
    return rows


def hack_rows(records: Sequence[dict]) -> list[dict]:
    """One row per hack and mode (the newest record of it): ``name``, ``mode`` (``"in-process"`` or
    ``"isolated"``), the naive harness's ``naive_speedup``, ``caught`` (failed by ours)."""
    rows: dict[tuple, dict] = {}
    for r in records:
        if r.get("case", "").startswith(("hack:", "integrity:")):
            row = {"name": r["case"].split(":", 1)[1], "mode": r.get("ours_mode") or "in-process",
                   "naive_speedup": r.get("naive_speedup"), "caught": bool(r.get("caught"))}
            rows.pop((row["name"], row["mode"]), None)  # a newer record of it moves to the end
            rows[(row["name"], row["mode"])] = row
    return list(rows.values())


def _kernels_panel(ax, rows: list[dict], device: str) -> None:
    y = np.arange(len(rows))
    h = 0.38
    strong = [r["strong_peer"] or np.nan for r in rows]
    ref = [r["reference"] for r in rows]
    ax.barh(y - h / 2, strong, h, color="tab:blue", label="over the strong peer (what a user would run)")
    ax.barh(y + h / 2, ref, h, color="0.75", label="over the fp32 reference (the weak baseline)")
    for yi, r in zip(y, rows):
        s = r["strong_peer"]
        ax.annotate(f"{s:.2f}x" if s else NO_PEER, (s if s else 1.0, yi - h / 2), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=7.5,
                    color="tab:blue" if s else "0.35", style="normal" if s else "italic")
        ax.annotate(f"{r['reference']:.2f}x", (r["reference"], yi + h / 2), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=7.5, color="0.35")
    ax.set_yticks(y, [r["label"] + ("" if r["passed"] else " (failed a check)") for r in rows])
    ax.invert_yaxis()
    ax.axvline(1, color="k", lw=0.8)
    vals = [v for v in strong + ref if v == v]
    ax.set(xscale="log", xlim=(min(min(vals), 1) / 2, max(max(vals), 1) * 6),
           xlabel=f"speed-up (x, log scale; recorded on the {device})", title="the workbook's kernels")
    ax.legend(loc="lower right", fontsize=7.5)


def _hacks_panel(ax, rows: list[dict], device: str) -> None:
    y = np.arange(len(rows))
    colors = ["tab:green" if r["caught"] else "tab:red" for r in rows]
    ax.barh(y, [r["naive_speedup"] for r in rows], color=colors)
    ax.set_yticks(y, [f"{r['name']}" + (" (isolated)" if r["mode"] == "isolated" else "") for r in rows],
                  fontsize=7.5)
    ax.invert_yaxis()
    ax.axvline(1, color="k", lw=0.8)
    ax.set(xscale="log", xlabel=f"the naive harness's speed-up (x, log scale; {device})",
           title="hacks the naive harness passed\n(green: failed by ours; red: passed ours in this process)")


def recorded_scores(records: Sequence[dict], *, device: str = "NVIDIA H200"):
    """One figure of the recorded kernel-bench records: the hacks' naive speed-ups (left; green:
    failed by our harness) and the workbook's kernels' speed-ups over their strong peer and over
    the fp32 reference (right; ``NO_PEER`` where the record has no strong-peer ratio). Returns the
    figure; raises ``ValueError`` when the records hold neither hacks nor kernels."""
    kernels, hacks = kernel_rows(records), hack_rows(records)
    if not kernels and not hacks:
        raise ValueError("no kernel-bench records to draw (run `python -m minimax_lab.bench kernelbench` on a GPU)")
    panels = [p for p in (("hacks", hacks), ("kernels", kernels)) if p[1]]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 0.32 * max(len(hacks), len(kernels)) + 2))
    for ax, (kind, rows) in zip(np.atleast_1d(axes), panels):
        (_hacks_panel if kind == "hacks" else _kernels_panel)(ax, rows, device)
    fig.tight_layout()
    return fig


def caption(records: Sequence[dict], *, device: str = "NVIDIA H200") -> str:
    """At most three sentences about the recorded scores, every comparison word computed from them."""
    kernels, hacks = kernel_rows(records), hack_rows(records)
    out = []
    if hacks:
        names = {r["name"] for r in hacks}
        caught = {r["name"] for r in hacks if r["caught"]}
        inside = {r["name"] for r in hacks if r["caught"] and r["mode"] == "in-process"}
        fooled = [r for r in hacks if r["mode"] == "in-process" and (r["naive_speedup"] or 0) > 1]
        top = max(fooled, key=lambda r: r["naive_speedup"]) if fooled else None
        out.append(f"On the {device} the naive harness passed the {len(names)} hacks recorded and timed "
                   f"{len(fooled)} of them faster than the reference"
                   + (f" (up to {top['naive_speedup']:.0f}x, {top['name']})" if top else "")
                   + f"; our harness failed {len(inside)} of them in the candidate's process and "
                   f"{len(caught - inside)} more in its own process" + ("" if caught == names else
                                                                       f", and missed {len(names - caught)}") + ".")
    if kernels:
        with_peer = [r for r in kernels if r["strong_peer"]]
        lo, hi = min(r["reference"] for r in kernels), max(r["reference"] for r in kernels)
        out.append(f"Over the fp32 reference the workbook's kernels score {lo:.2f}x to {hi:.2f}x, the flattering "
                   "number a weak baseline gives.")
        if with_peer:
            best = max(with_peer, key=lambda r: r["strong_peer"])
            worst = min(r["strong_peer"] for r in with_peer)
            span = f"{best['strong_peer']:.2f}x" if worst == best["strong_peer"] else \
                f"from {worst:.2f}x to {best['strong_peer']:.2f}x"
            how = words.more_or_less(best["strong_peer"], 1.0, bigger="faster", smaller="slower", same="as fast as")
            out.append(f"Over the strong peer {len(with_peer)} of {len(kernels)} have a recorded ratio, {span} "
                       f"(at best, {best['label']}: {how} the peer).")
        else:
            out.append(f"Their {NO_PEER}: these records were made before the harness timed strong peers.")
    return " ".join(out)


def markdown_table(rows: Sequence[dict], cols: Sequence[str]) -> str:
    """Rows (dicts) as a Markdown table of the columns ``cols`` (floats to 3 significant digits)."""
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else ("" if v is None else str(v))  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(lines + ["| " + " | ".join(fmt(r.get(c)).replace("|", "\\|") for c in cols) + " |"
                              for r in rows])


def report_rows(reports: Sequence) -> list[dict]:
    """The harness's reports (:class:`minimax_lab.kernelbench.harness.Report`) as table rows: verdict,
    the candidate's time, and its speed-ups over the strong peer (first) and the reference."""
    rows = []
    for rep in reports:
        t = rep.timing or {}
        peer = t.get("speedup_vs_strong_peer")
        rows.append({"problem": rep.problem, "verdict": rep.status.upper(), "checks": f"{len(rep.checks)} run",
                     "ms": t.get("ms"), "strong peer": t.get("strong_peer"),
                     "vs strong peer": f"{peer:.3g}x" if peer else t.get("strong_peer_error"),
                     "vs fp32 reference": f"{t['speedup_vs_reference']:.3g}x" if t.get("speedup_vs_reference") else None})
    return rows
