"""Pictures and tables of the kernel bench (chapter 08): the path of one call through the harness,
the hack gallery as a table, the two modes side by side, and the recorded scores -- the hacks under
the naive harness, the workbook's kernels against their strong peers and the fp32 reference.

Records are those of suite ``kernelbench`` (:mod:`minimax_lab.bench.suite_kernelbench`): a hack's
record has case ``hack:<name>`` or ``integrity:<name>``; a kernel's has the problem as its case,
``speedup_vs`` with ``strong_peer`` (where recorded) and ``reference``, and ``isolated`` when it
was scored in its own process -- so one problem can have two rows, told apart by their labels.
A kernel record without a ``strong_peer`` field was made by a harness that did not time strong
peers; :func:`caption` says so, and says which hack groups have no record.
"""
from __future__ import annotations

import math
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch

from minimax_lab import runtime
from minimax_lab.kernelbench import harness, hacks, integrity
from minimax_lab.notebook import words

#: what a kernel row says where its record has no strong-peer ratio
NO_PEER = "strong-peer ratio not recorded"
#: the gallery's hacks that fake the clock: they aim at a timer that reads the clock around every
#: call, so the naive harness's one reading around several calls is not what they fool
CLOCK_HACKS = tuple(n for n, h in hacks.GALLERY.items() if h.caught_isolated == "clock agrees")
_CAUGHT_COLORS = {"in-process": "tab:green", "isolated": "tab:orange", None: "tab:red"}


def _owner(cls) -> str:
    """``torch.Tensor`` rather than ``torch._tensor.Tensor``: the watched module the class is bound in."""
    owner = next((m for m in integrity.STANDARD_MODULES if getattr(m, cls.__name__, None) is cls), None)
    return f"{owner.__name__}.{cls.__name__}" if owner else f"{cls.__module__}.{cls.__qualname__}"


def integrity_scope(short: bool = False) -> str:
    """What the **harness integrity** check records before a call and puts back after it, read from
    :mod:`minimax_lab.kernelbench.integrity` (``short``: a one-line summary of the same list)."""
    if short:
        return "torch's, Python's and numpy's functions, the harness, the problems, torch's settings"
    names = [m.__name__ for m in integrity.STANDARD_MODULES] + [_owner(c) for c in integrity.STANDARD_CLASSES]
    names = sorted(names, key=lambda n: (n != "builtins", n.split(".")[0] != "torch", n))
    ours = ", ".join(integrity.JUDGING_PACKAGES)
    return (f"the namespaces {', '.join(names)}; the workbook's modules on the path of judging ({ours} and the "
            f"runtime, validation and FP8 helpers) and every problem, field by field; and torch's global settings "
            f"(function and dispatch modes, kernels registered for aten operators, default dtype, grad mode, "
            f"threads; on a GPU also TF32 and SDPA's backends)")


_STAGES = (
    ("fresh inputs", "a new seed from os.urandom; held-out shapes drawn only now"),
    ("candidate(**inputs)", "the only code the candidate controls"),
    ("copy the outputs", "on the caller's stream, right after the return"),
    ("put back what it replaced", integrity_scope(short=True)),
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


def checks_rows() -> list[dict]:
    """The harness's checks (:data:`minimax_lab.kernelbench.harness.CHECKS`) as table rows; the
    integrity check's row names what it watches from :func:`integrity_scope`, the one list."""
    rows = []
    for check, demand in harness.CHECKS.items():
        if check == "harness integrity":
            demand = (f"everything bound in {integrity_scope()} is as it was before the call (a change is named "
                      "and put back), and no function's code was rewritten")
        rows.append({"check": check, "what it demands": demand})
    return rows


# ---------------------------------------------------------------------------------------------- numbers


def ratio_text(x: float | None) -> str:
    """A speed-up with its digits: ``'13x'``, ``'1.5x'``, ``'0.0017x'`` (never rounded to 0); a
    time at or below zero gives an infinite ratio, said so."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if math.isinf(x):
        return "infinite (time <= 0)"
    return f"{x:,.0f}x" if x >= 100 else f"{x:.2g}x"


# ---------------------------------------------------------------------------------------------- the gallery, live


def gallery_rows(comparisons: Sequence) -> list[dict]:
    """The gallery's :class:`~minimax_lab.kernelbench.hacks.Comparison` objects as table rows:
    hack, trick, the naive verdict and the speed-up its wall clock reported (:func:`ratio_text`),
    our verdict and the check that caught it."""
    rows = []
    for c in comparisons:
        row = c.row()
        row["naive speed-up"] = ratio_text(c.naive.speedup) if c.naive.passed else "-"
        rows.append(row)
    return rows


def gallery_note(comparisons: Sequence) -> str:
    """Which hacks the naive wall clock timed slower than the reference, and what a per-call timer
    (ours, in this process) reported for the clock hacks -- computed from ``comparisons``."""
    slow = [c.hack.name for c in comparisons if c.naive.passed and c.naive.speedup < 1]
    out = [f"The naive wall clock timed {len(slow)} of the {len(comparisons)} slower than the reference"
           + (f": {', '.join(slow)}." if slow else ".")]
    clocks = [c for c in comparisons if c.hack.name in CLOCK_HACKS and c.ours.timing]
    if clocks:
        out.append("A per-call timer (ours, in this process) read " + "; ".join(
            f"{c.ours.timing['ms']:.3g} ms per call for {c.hack.name}" for c in clocks) + ".")
    return " ".join(out)


def mode_rows(reports: Sequence) -> list[dict]:
    """One row per harness report of the same candidate in the two modes: mode, verdict, the time
    per call, the time on repeated inputs, and what clock measured it."""
    rows = []
    cuda = runtime.kernel_device().type == "cuda"  # the cache is flushed before each call only on a GPU
    for rep in reports:
        t = rep.timing or {}
        if rep.isolated:
            clock = (f"this process's wall clock from sending a call to holding its outputs, round trip "
                     f"({t.get('overhead_ms', float('nan')):.3g} ms) subtracted")
        else:
            clock = "CUDA events around each call" if cuda else "wall clock around each call"
        if cuda:
            clock += "; cache flushed before each call"
        rows.append({"mode": "isolated" if rep.isolated else "in-process", "verdict": rep.status.upper(),
                     "ms per call": t.get("ms"), "repeated inputs, ms": t.get("seen_ms"), "clock": clock})
    return rows


def clock_claim(comparison) -> str:
    """What a clock hack's own clock claimed in isolated mode against the harness's clock, in words
    computed from the two times (empty where the report has no such pair)."""
    t = comparison.ours.timing or {}
    claimed, real = t.get("worker_ms"), t.get("ms")
    if not (claimed and real and claimed > 0 and real > 0):
        return ""
    return (f"{comparison.hack.name}: its own clock timed its calls at {claimed:.3g} ms, the harness's clock at "
            f"{real:.3g} ms: it claimed to be {words.speed(claimed, real)} it was")


# ---------------------------------------------------------------------------------------------- the records


def kernel_rows(records: Sequence[dict]) -> list[dict]:
    """One row per workbook-kernel record (not a hack's, not the isolated mode's own), in record
    order: ``label`` (the problem, with ``" (isolated)"`` when scored in its own process),
    ``strong_peer`` and ``reference`` ratios (None where not recorded), the peer's name, ``passed``,
    and ``peer_timed`` (False for a record made before the harness timed strong peers)."""
    rows = []
    for r in records:
        case = r.get("case", "")
        if ":" in case or case.startswith("isolation_") or not (r.get("speedup_vs") or {}).get("reference"):
            continue
        ratios = r["speedup_vs"]
        rows.append({"label": case + (" (isolated)" if r.get("isolated") else ""), "problem": case,
                     "strong_peer": ratios.get("strong_peer"), "reference": ratios["reference"],
                     "peer": r.get("strong_peer"), "passed": r.get("status") == "pass",
                     "peer_timed": "strong_peer" in r})
    return rows


def hack_rows(records: Sequence[dict]) -> list[dict]:
    """One row per hack (the newest record of each mode): ``name``, ``group`` (``"gallery"`` or
    ``"integrity"``), the naive harness's ``naive_speedup`` (from the in-process record), ``clock``
    (a clock hack: see :data:`CLOCK_HACKS`), and ``caught`` -- ``"in-process"``, ``"isolated"``
    (passed in-process, failed isolated) or None (not caught in any recorded mode)."""
    modes: dict[tuple, dict] = {}
    for r in records:
        if r.get("case", "").startswith(("hack:", "integrity:")):
            prefix, name = r["case"].split(":", 1)
            mode = r.get("ours_mode") or "in-process"
            modes.setdefault((name, "gallery" if prefix == "hack" else "integrity"), {})[mode] = r
    rows = []
    for (name, group), by_mode in modes.items():
        inside, iso = by_mode.get("in-process"), by_mode.get("isolated")
        caught = ("in-process" if inside and inside.get("caught") else
                  "isolated" if iso and iso.get("caught") else None)
        rows.append({"name": name, "group": group, "naive_speedup": (inside or iso).get("naive_speedup"),
                     "clock": name in CLOCK_HACKS, "caught": caught, "isolated_recorded": iso is not None})
    order = {n: i for i, n in enumerate(list(hacks.GALLERY) + list(hacks.INTEGRITY_HACKS))}
    return sorted(rows, key=lambda r: order.get(r["name"], len(order)))  # the gallery's order, then any other


def _kernels_panel(ax, rows: list[dict], device: str) -> None:
    y = np.arange(len(rows))
    any_peer = any(r["strong_peer"] for r in rows)
    h = 0.38 if any_peer else 0.6
    ref = [r["reference"] for r in rows]
    bars = [("reference", ref, y + h / 2 if any_peer else y, "0.6", "over the fp32 reference (the weak baseline)")]
    if any_peer:
        bars.insert(0, ("strong_peer", [r["strong_peer"] or np.nan for r in rows], y - h / 2, "tab:blue",
                        "over the strong peer (what a user would run)"))
    for key, vals, ys, color, label in bars:
        ax.barh(ys, vals, h, color=color, label=label)
        for yi, v in zip(ys, vals):
            text = ratio_text(v) if v == v else NO_PEER
            # labels start right of the 1x line, so the line never crosses one
            ax.annotate(text, (max(v, 1.0) if v == v else 1.0, yi), xytext=(4, 0), textcoords="offset points",
                        va="center", fontsize=7.5, color="tab:blue" if key == "strong_peer" and v == v else "0.3",
                        style="normal" if v == v else "italic")
    ax.set_yticks(y, [r["label"] + ("" if r["passed"] else " (failed a check)") for r in rows])
    ax.invert_yaxis()
    ax.axvline(1, color="k", lw=0.8)
    vals = [v for _, vs, *_ in bars for v in vs if v == v]
    ax.set(xscale="log", xlim=(min(min(vals), 1) / 2, max(max(vals), 1) * 6),
           xlabel=f"speed-up (x, log scale; recorded on the {device})",
           title="the workbook's kernels" + ("" if any_peer else "\n(over the fp32 reference only: no strong peer "
                                                                  "was timed)"))
    if any_peer:
        ax.legend(loc="lower right", fontsize=7.5)


def _hacks_panel(ax, rows: list[dict], device: str) -> None:
    y = np.arange(len(rows))
    for yi, r in zip(y, rows):
        color = _CAUGHT_COLORS[r["caught"]]
        if r["clock"] or not r["naive_speedup"]:
            ax.annotate("fakes a per-call clock: no naive speed-up drawn" if r["clock"] else "no naive time recorded",
                        (1.0, yi), xytext=(4, 0), textcoords="offset points", va="center", fontsize=7,
                        style="italic", color="0.35")
            continue
        ax.barh(yi, r["naive_speedup"], color=color)
        ax.annotate(ratio_text(r["naive_speedup"]), (max(r["naive_speedup"], 1.0), yi), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=7, color="0.25")
    ax.set_yticks(y, [r["name"] + (" (integrity)" if r["group"] == "integrity" else "") for r in rows], fontsize=7.5)
    for tick, r in zip(ax.get_yticklabels(), rows):
        tick.set_color(_CAUGHT_COLORS[r["caught"]])
    ax.axvline(1, color="k", lw=0.8)
    vals = [r["naive_speedup"] for r in rows if r["naive_speedup"] and not r["clock"]] or [1.0]
    ax.set(xscale="log", xlim=(min(min(vals), 1) / 2, max(max(vals), 1) * 8),
           xlabel=f"the naive harness's speed-up over the reference (x, log scale; {device})",
           title="hacks the naive harness passed, and where ours caught them")
    ax.set_ylim(len(rows) - 0.5, -0.5)  # rows without a bar keep their place too
    legend = {"in-process": "failed by ours in-process", "isolated": "failed by ours isolated only",
              None: "passed ours in every recorded mode"}
    ax.legend(handles=[Patch(color=_CAUGHT_COLORS[k], label=v) for k, v in legend.items()
                       if any(r["caught"] == k for r in rows)],
              loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=3, fontsize=7, frameon=False)


def recorded_scores(records: Sequence[dict], *, device: str = "NVIDIA H200"):
    """One figure of the recorded kernel-bench records: per hack the naive speed-up (left; colour:
    the mode in which our harness failed it; the clock hacks get no bar: they fake a per-call timer)
    and the workbook's kernels' speed-ups over their strong peer and over the fp32 reference (right;
    the strong-peer bars only where some record has that ratio). Returns the figure; raises
    ``ValueError`` when the records hold neither hacks nor kernels."""
    kernels, hacks_ = kernel_rows(records), hack_rows(records)
    if not kernels and not hacks_:
        raise ValueError("no kernel-bench records to draw (run `python -m minimax_lab.bench kernelbench` on a GPU)")
    panels = [p for p in (("hacks", hacks_), ("kernels", kernels)) if p[1]]
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 0.32 * max(len(hacks_), len(kernels)) + 2.2))
    for ax, (kind, rows) in zip(np.atleast_1d(axes), panels):
        (_hacks_panel if kind == "hacks" else _kernels_panel)(ax, rows, device)
    fig.tight_layout()
    return fig


def _names(names) -> str:
    names = sorted(names)
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


def caption(records: Sequence[dict], *, device: str = "NVIDIA H200") -> str:
    """At most three sentences about the recorded scores, every comparison word and every statement
    of what is missing computed from them."""
    kernels, hacks_ = kernel_rows(records), hack_rows(records)
    out = []
    if hacks_:
        groups = {g: [r for r in hacks_ if r["group"] == g] for g in ("gallery", "integrity")}
        what = " and ".join(f"{len(rs)} {'gallery' if g == 'gallery' else 'integrity'} hacks"
                            for g, rs in groups.items() if rs)
        timed = [r for r in hacks_ if not r["clock"] and r["naive_speedup"]]
        fast = [r for r in timed if r["naive_speedup"] > 1]
        top = max(fast, key=lambda r: r["naive_speedup"]) if fast else None
        inside = sum(r["caught"] == "in-process" for r in hacks_)
        iso = sum(r["caught"] == "isolated" for r in hacks_)
        missed = [r["name"] for r in hacks_ if r["caught"] is None]
        out.append(f"On the {device} the naive harness passed all {what} recorded, and its wall clock timed "
                   f"{len(fast)} of the {len(timed)} that do not fake the clock faster than the reference"
                   + (f" (up to {ratio_text(top['naive_speedup'])}, {top['name']})" if top else "")
                   + f"; our harness failed {inside} in-process"
                   + (f" and the other {iso} isolated (the candidate in its own process)" if iso and not missed
                      else f" and {iso} more isolated (the candidate in its own process)" if iso else "")
                   + (f", and missed {_names(missed)}" if missed else "") + ".")
    if kernels:
        with_peer = [r for r in kernels if r["strong_peer"]]
        lo, hi = min(r["reference"] for r in kernels), max(r["reference"] for r in kernels)
        text = (f"Over the fp32 reference the workbook's kernels score {ratio_text(lo)} to {ratio_text(hi)}, the "
                "flattering number a weak baseline gives")
        if with_peer:
            best = max(with_peer, key=lambda r: r["strong_peer"])
            worst = min(r["strong_peer"] for r in with_peer)
            span = ratio_text(worst) if worst == best["strong_peer"] else \
                f"from {ratio_text(worst)} to {ratio_text(best['strong_peer'])}"
            how = words.more_or_less(best["strong_peer"], 1.0, bigger="faster", smaller="slower", same="as fast as")
            text += (f"; over the strong peer {len(with_peer)} of {len(kernels)} have a recorded ratio, {span} "
                     f"(at best {best['label']}, {how} the peer)")
        out.append(text + ".")
    missing = []
    old = [r["label"] for r in kernels if not r["peer_timed"]]
    if old:
        missing.append(("every kernel record comes" if len(old) == len(kernels) else
                        f"the record{'s' if len(old) > 1 else ''} of {_names(old)} come{'' if len(old) > 1 else 's'}")
                       + " from a harness that timed no strong peer")
    if hacks_ and not any(r["group"] == "integrity" for r in hacks_):
        missing.append("the integrity hacks have no record yet")
    if missing:
        out.append(f"These records are not all from the harness of this chapter: {', and '.join(missing)} "
                   "(`python -m minimax_lab.bench kernelbench` on a GPU re-makes them).")
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
