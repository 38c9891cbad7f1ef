"""Pictures and tables of the kernel bench (chapter 08): the path of one call through the harness,
the hack gallery as a table, the two modes side by side, the workbook's kernels scored, and the
recorded scores -- the hacks under the naive harness, the workbook's kernels against their strong
peers and the fp32 reference.

Timings are shown as speeds only where they are speeds (:func:`timings_are_speeds`: compiled
kernels on a GPU). On a CPU the Triton kernels run in Triton's interpreter and a busy machine
pauses calls, so the live tables there give verdicts, not ratios; the recorded GPU scores carry
the ratios, labelled with the device and the versions they were recorded with.

Records are those of suite ``kernelbench`` (:mod:`minimax_lab.bench.suite_kernelbench`): a hack's
record has case ``hack:<name>`` or ``integrity:<name>``; a kernel's has the problem as its case,
``speedup_vs`` with ``strong_peer`` (where timed) and ``reference``, the spreads of the times it
compares (``p20_ms``/``p80_ms``, ``strong_peer_p20_ms``, ...) where the harness kept them, and
``isolated`` when it was scored in its own process. A kernel record without a ``strong_peer``
ratio has no strong-peer timing: :func:`caption` names those problems. :func:`setup` is the
chapter's one setup call, :func:`provenance` its closing "where these numbers come from" cell.
"""
from __future__ import annotations

import math
import platform
import time
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.patches import Patch
import triton

from minimax_lab import runtime
from minimax_lab.kernelbench import harness, hacks, integrity, problems
from minimax_lab.notebook import recorded, words
from minimax_lab.viz.live_vs_recorded import versions_label

#: what a kernel row says where its record has no strong-peer ratio
NO_PEER = "strong-peer ratio not recorded"
#: the gallery's hacks that fake the clock: they aim at a timer that reads the clock around every
#: call, so the naive harness's one reading around several calls is not what they fool
CLOCK_HACKS = tuple(n for n, h in hacks.GALLERY.items() if h.caught_isolated == "clock agrees")
_CAUGHT_COLORS = {"in-process": "tab:green", "isolated": "tab:orange", None: "tab:red"}
#: what a hack pays for its trick, where that makes the naive clock time it slower than the reference
HACK_COST = {"read_expected": "a frame walk", "gc_copy_expected": "a scan of every live object",
             "side_stream": "work on a side stream", "thread_injection": "a thread",
             "partial_write": "a kept buffer per shape", "replay_by_pointer": "honest work until the checks end",
             "batch_and_skip": "honest work until the checks end", "lazy_after_checks": "honest work until the "
             "checks end", "warm_cache": "a cache that misses on every new input"}
#: the workbook's kernels the chapter scores live (cheapest first); the suite scores these and FP8 decode
WORKBOOK_PROBLEMS = ("softmax", "rmsnorm_residual", "rope", "moe_align", "msa_select", "paged_decode")
_STARTED: list[float] = []


def setup(preset: str = "auto") -> str:
    """Chapter 08's one setup call: the preset resolved; one line saying where the chapter runs and
    whether its timings are speeds. Returns the preset."""
    p = runtime.resolve_preset(preset)
    where = "in its interpreter" if runtime.is_interpreter() else "compiled"
    speeds = ("timings are speeds" if timings_are_speeds() else
              "timings here are not speeds (the interpreter, a shared CPU): the tables give verdicts")
    print(f"{runtime.device_name()}, preset {p}; Triton {triton.__version__} {where}, torch {torch.__version__}; "
          f"{speeds}")
    _STARTED[:] = [time.perf_counter()]
    return p


def timings_are_speeds() -> bool:
    """Whether this machine's timings are speeds: compiled kernels on a GPU. On a CPU the Triton
    kernels run in Triton's interpreter and a busy machine pauses calls: no ratio is shown from them."""
    return runtime.kernel_device().type == "cuda" and not runtime.is_interpreter()


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
            f"(function and dispatch modes, kernels registered for built-in operators through torch.library on any "
            f"dispatch key, default dtype, grad mode, "
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
    integrity check's row says what it watches in :func:`integrity_scope`'s short form (the full
    list is printed once, where the chapter explains the check)."""
    rows = []
    for check, demand in harness.CHECKS.items():
        if check == "harness integrity":
            demand = (f"{integrity_scope(short=True)} are as they were before the call (a change is named and put "
                      "back), and no function's code was rewritten")
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


def isolated_rows(isolated: Sequence, in_process: Sequence) -> list[dict]:
    """One row per hack run isolated (comparisons): its verdict in this process (from ``in_process``,
    the same hacks' in-process comparisons), isolated, and the checks that failed it isolated."""
    inside = {c.hack.name: c.ours for c in in_process}
    return [{"hack": c.hack.name,
             "in-process verdict": inside[c.hack.name].status.upper() if c.hack.name in inside else "-",
             "isolated verdict": c.ours.status.upper(), "caught by (isolated)": ", ".join(c.ours.caught_by)}
            for c in isolated]


def clock_claim(comparison) -> str:
    """What a clock hack's own clock claimed in isolated mode against the harness's clock, in words
    computed from the two times (empty where the report has no such pair)."""
    t = comparison.ours.timing or {}
    claimed, real = t.get("worker_ms"), t.get("ms")
    if not (claimed and real and claimed > 0 and real > 0):
        return ""
    return (f"{comparison.hack.name}: its own clock timed its calls at {claimed:.3g} ms, the harness's clock at "
            f"{real:.3g} ms: it claimed to be {words.speed(claimed, real)} it was")


def gallery_markdown(comparisons: Sequence) -> str:
    """The gallery as a Markdown table: hack, trick, the two verdicts and the check that caught it;
    the naive harness's speed-up too where this machine's timings are speeds."""
    cols = ["hack", "trick", "naive verdict"] + (["naive speed-up"] if timings_are_speeds() else []) + \
        ["our verdict", "caught by"]
    return markdown_table(gallery_rows(comparisons), cols)


def gallery_summary(comparisons: Sequence) -> str:
    """How many hacks ours caught in this process and why the rest were not; where timings are
    speeds, :func:`gallery_note`, else why no speed-up is shown."""
    caught = sum(c.caught for c in comparisons)
    rest = [c.hack.name for c in comparisons if not c.caught]
    out = [f"{caught} of {len(comparisons)} caught in this process"
           + (f"; {_names(rest)} edit the harness's own record, and only the isolated mode catches "
              f"{'them' if len(rest) > 1 else 'it'}" if rest else "") + "."]
    out.append(gallery_note(comparisons) if timings_are_speeds() else
               "The naive speed-ups are left out: on this shared CPU the wall clock times the machine's load, not "
               "kernels. The GPU records at the end of the chapter show them.")
    return " ".join(out)


def up_close(comparisons: Sequence) -> str:
    """Three hacks up close, each in the words of the check that failed it: the overfit flag of
    ``special_case_validation``, what ``warm_cache``'s fresh and repeated calls took, and the floor
    ``near_zero_time`` went below."""
    by_name = {c.hack.name: c.ours for c in comparisons}
    lines = []
    if "special_case_validation" in by_name:
        r = by_name["special_case_validation"]
        lines.append(f"special_case_validation: validation {r.validation}, held-out {r.test}, overfit={r.overfit}")
    if "warm_cache" in by_name and by_name["warm_cache"].failures.get("fresh-input speed"):
        lines.append(f"warm_cache: {by_name['warm_cache'].failures['fresh-input speed'][0]}"
                     + ("" if timings_are_speeds() else " (wall-clock times of a shared CPU: the check compares the "
                        "candidate with itself, call by call, so the machine's load slows both kinds alike)"))
    zero = (by_name.get("near_zero_time") and by_name["near_zero_time"].timing) or {}
    if zero.get("floor_ms") is not None:
        lines.append(f"near_zero_time: reported {zero['ms']:.3g} ms per call; no kernel moves the problem's bytes "
                     f"in less than {zero['floor_ms']:.3g} ms on this machine")
    return "\n".join(lines)


def _gap_words(a: Mapping, b: Mapping, resolution_ms: float) -> str:
    """Two times of the same honest work, ``a`` isolated and ``b`` in this process (dicts with ``ms``
    and, where kept, ``p20_ms``/``p80_ms``), judged against their spreads and the isolated mode's
    resolution (its round trip's jitter): they agree when their p20-p80 ranges overlap or they lie
    within twice the resolution; the words give the gap either way."""
    gap = abs(a["ms"] - b["ms"])
    ranges = all(x.get("p20_ms") and x.get("p80_ms") for x in (a, b))
    overlap = ranges and a["p20_ms"] <= b["p80_ms"] and b["p20_ms"] <= a["p80_ms"]
    text = f"a gap of {gap:.3g} ms, {gap / resolution_ms:.1f} times the isolated mode's resolution ({resolution_ms:.3g} ms)"
    if overlap:
        return text + ", inside the two times' p20-p80 ranges: the two clocks agree"
    if gap <= 2 * resolution_ms:
        return text + (", under twice the resolution (the margin two modes' times are allowed): no difference "
                       "beyond the round trip's jitter, the two clocks agree")
    return (text + (", outside both p20-p80 ranges" if ranges else "") + ": the two clocks disagree by more than "
            "the round trip's jitter" + ("" if timings_are_speeds() else
                                         " (on a shared CPU the load moves between the two runs)"))


def isolation_lines(isolated: Sequence, honest=None) -> str:
    """What the isolated runs of ``isolated`` (comparisons) showed: each clock hack's own clock against
    the harness's, the round trip subtracted and the resolution; with ``honest`` (the same honest work
    scored in this process, a report) whether the isolated clock agrees with it."""
    lines = [c for c in map(clock_claim, isolated) if c]
    timed = next((c.ours.timing for c in isolated if c.ours.timing and c.ours.timing.get("resolution_ms")), None)
    if timed:
        lines.append(f"Round trip subtracted per isolated call: {timed['overhead_ms']:.3g} ms; times closer than "
                     f"{timed['resolution_ms']:.3g} ms are not told apart.")
        if honest is not None and honest.timing:
            h = honest.timing
            spread = lambda t: f" (p20-p80 {t['p20_ms']:.3g}-{t['p80_ms']:.3g})" if t.get("p20_ms") else ""  # noqa: E731
            lines.append(f"The same honest work timed in this process: {h['ms']:.3g} ms per call{spread(h)}; the "
                         f"isolated harness's clock gave the clock hack {timed['ms']:.3g} ms{spread(timed)}: "
                         f"{_gap_words(timed, h, timed['resolution_ms'])}.")
    return "\n".join(lines)


def scores_markdown(reports: Sequence) -> str:
    """The workbook's kernels scored (:class:`~minimax_lab.kernelbench.harness.Report` objects) as a
    Markdown table: verdict, validation and held-out scores, the strong peer; where they were timed
    (a GPU), the time with its spread and the ratios over the strong peer and the reference."""
    rows, timed = [], any(rep.timing for rep in reports)
    for rep in reports:
        t = rep.timing or {}
        peer = t.get("speedup_vs_strong_peer")
        row = {"problem": rep.problem, "verdict": rep.status.upper(), "validation": str(rep.validation),
               "held-out": str(rep.test), "strong peer": _problem_peer(rep.problem)}
        if t:
            spread = f" ({t['p20_ms']:.3g}-{t['p80_ms']:.3g})" if t.get("p20_ms") else ""
            row.update({"ms (p20-p80)": f"{t['ms']:.3g}{spread}",
                        "vs strong peer": ratio_text(peer) if peer else t.get("strong_peer_error") or "-",
                        "vs fp32 reference": ratio_text(t.get("speedup_vs_reference"))})
        rows.append(row)
    cols = ["problem", "verdict", "validation", "held-out", "strong peer"]
    return markdown_table(rows, cols + (["ms (p20-p80)", "vs strong peer", "vs fp32 reference"] if timed else []))


def _problem_peer(name: str) -> str:
    return problems.get_problem(name).strong_peer().name


# ---------------------------------------------------------------------------------------------- the records


def _ratio_range(r: Mapping, peer: str) -> tuple[float, float] | None:
    """The range of ``peer_ms / ms`` the two times' p20-p80 spreads allow (slowest peer over fastest
    candidate, and back), where the record kept both spreads."""
    lo_peer, hi_peer = r.get(f"{peer}_p20_ms"), r.get(f"{peer}_p80_ms")
    lo, hi = r.get("p20_ms"), r.get("p80_ms")
    if not (lo_peer and hi_peer and lo and hi):
        return None
    return lo_peer / hi, hi_peer / lo


def kernel_rows(records: Sequence[dict], *, isolated: bool = False) -> list[dict]:
    """One row per workbook-kernel record (not a hack's, not the isolated mode's own; scored in its
    own process only with ``isolated``: such a time holds the round trip's jitter), in record order:
    ``label`` (the problem, with ``" (isolated)"`` when scored in its own process), ``strong_peer``
    and ``reference`` ratios (None where not timed) with their ``*_range`` (from the spreads, where
    kept), the peer's name, ``passed``, and ``peer_timed`` (whether the strong peer was timed)."""
    rows = []
    for r in records:
        case = r.get("case", "")
        if ":" in case or case.startswith("isolation_") or not (r.get("speedup_vs") or {}).get("reference"):
            continue
        if r.get("isolated") and not isolated:
            continue
        ratios = r["speedup_vs"]
        rows.append({"label": case + (" (isolated)" if r.get("isolated") else ""), "problem": case,
                     "strong_peer": ratios.get("strong_peer"), "reference": ratios["reference"],
                     "strong_peer_range": _ratio_range(r, "strong_peer"),
                     "reference_range": _ratio_range(r, "reference"),
                     "peer": r.get("strong_peer"), "passed": r.get("status") == "pass",
                     "peer_timed": bool(ratios.get("strong_peer"))})
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


def _versions(records: Sequence[dict], device: str) -> str:
    return f"{device}; {versions_label(records)}"


def _kernels_panel(ax, rows: list[dict], where: str) -> None:
    y = np.arange(len(rows))
    any_peer = any(r["strong_peer"] for r in rows)
    h = 0.38 if any_peer else 0.6
    bars = [("reference", y + h / 2 if any_peer else y, "0.6", "over the fp32 reference (the weak baseline)")]
    if any_peer:
        bars.insert(0, ("strong_peer", y - h / 2, "tab:blue", "over the strong peer (what a user would run)"))
    shown = []
    for key, ys, color, label in bars:
        vals = [r[key] or np.nan for r in rows]
        ax.barh(ys, vals, h, color=color, label=label)
        for yi, r, v in zip(ys, rows, vals):
            span = r[f"{key}_range"]
            if span and v == v:
                ax.errorbar(v, yi, xerr=[[v - span[0]], [span[1] - v]], fmt="none", ecolor="black", elinewidth=1,
                            capsize=2)
            text = ratio_text(v) if v == v else NO_PEER
            # labels start right of the 1x line and of the error bar, so no line crosses one
            at = max(v, 1.0, span[1] if span else 0.0) if v == v else 1.0
            ax.annotate(text, (at, yi), xytext=(4, 0), textcoords="offset points", va="center", fontsize=7.5,
                        color="tab:blue" if key == "strong_peer" and v == v else "0.3",
                        style="normal" if v == v else "italic")
            shown += [x for x in (v, *(span or ())) if x == x]
    ax.set_yticks(y, [r["label"] + ("" if r["passed"] else " (failed a check)") for r in rows])
    ax.invert_yaxis()
    ax.axvline(1, color="k", lw=0.8)
    ax.set(xscale="log", xlim=(min(min(shown), 1) / 2, max(max(shown), 1) * 6),
           xlabel=f"speed-up (x, log scale; "
                  + ("error bars: p20-p80 where recorded" if any(r["reference_range"] or r["strong_peer_range"]
                                                                 for r in rows) else "these records keep no spread")
                  + f")\n{where}",
           title="the workbook's kernels" + ("" if any_peer else "\n(over the fp32 reference only: no strong peer "
                                                                  "in these records)"))
    if any_peer:
        ax.legend(loc="lower right", fontsize=7.5)


def _hacks_panel(ax, rows: list[dict], where: str) -> None:
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
    ax.set_yticks(y, [r["name"] + (" (integrity)" if r["group"] == "integrity" else "") for r in rows], fontsize=8.5)
    for tick, r in zip(ax.get_yticklabels(), rows):
        tick.set_color(_CAUGHT_COLORS[r["caught"]])
    ax.axvline(1, color="k", lw=0.8)
    vals = [r["naive_speedup"] for r in rows if r["naive_speedup"] and not r["clock"]] or [1.0]
    ax.set(xscale="log", xlim=(min(min(vals), 1) / 2, max(max(vals), 1) * 8),
           xlabel=f"the naive harness's speed-up over the reference (x, log scale)\n{where}",
           title="hacks the naive harness passed, and where ours caught them")
    ax.set_ylim(len(rows) - 0.5, -0.5)  # rows without a bar keep their place too
    legend = {"in-process": "failed by ours in-process", "isolated": "failed by ours isolated only",
              None: "passed ours in every recorded mode"}
    ax.legend(handles=[Patch(color=_CAUGHT_COLORS[k], label=v) for k, v in legend.items()
                       if any(r["caught"] == k for r in rows)],
              loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=9, frameon=False)


def _is_hack(r: Mapping) -> bool:
    return r.get("case", "").startswith(("hack:", "integrity:"))


def recorded_scores(records: Sequence[dict], *, device: str = recorded.H200):
    """One figure of the recorded kernel-bench records: per hack the naive speed-up (left; colour:
    the mode in which our harness failed it; the clock hacks get no bar: they fake a per-call timer)
    and the workbook's kernels' speed-ups over their strong peer and over the fp32 reference (right;
    the strong-peer bars only where some record has that ratio; error bars from the recorded
    spreads). Each panel names the device and the versions its records were made with. Returns the
    figure; raises ``ValueError`` when the records hold neither hacks nor kernels."""
    kernels, hacks_ = kernel_rows(records), hack_rows(records)
    if not kernels and not hacks_:
        raise ValueError("no kernel-bench records to draw (run `python -m minimax_lab.bench kernelbench` on a GPU)")
    panels = [p for p in (("hacks", hacks_), ("kernels", kernels)) if p[1]]
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 0.32 * max(len(hacks_), len(kernels)) + 2.6))
    for ax, (kind, rows) in zip(np.atleast_1d(axes), panels):
        if kind == "hacks":
            _hacks_panel(ax, rows, _versions([r for r in records if _is_hack(r)], device))
        else:
            names = {r["problem"] for r in rows}
            _kernels_panel(ax, rows, _versions([r for r in records if r.get("case") in names and not r.get("isolated")],
                                               device))
    fig.tight_layout()
    return fig


def _names(names) -> str:
    names = sorted(names)
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


def _hacks_sentence(hacks_: list[dict], records: Sequence[dict], device: str) -> str:
    groups = {g: [r for r in hacks_ if r["group"] == g] for g in ("gallery", "integrity")}
    what = " and ".join(f"{len(rs)} {g} hacks" for g, rs in groups.items() if rs)
    timed = [r for r in hacks_ if not r["clock"] and r["naive_speedup"]]
    fast = [r for r in timed if r["naive_speedup"] > 1]
    slow = [r for r in timed if r["naive_speedup"] <= 1]
    top = max(fast, key=lambda r: r["naive_speedup"]) if fast else None
    inside = sum(r["caught"] == "in-process" for r in hacks_)
    iso = sum(r["caught"] == "isolated" for r in hacks_)
    missed = [r["name"] for r in hacks_ if r["caught"] is None]
    text = (f"On the {device} ({versions_label([r for r in records if _is_hack(r)])}) the naive harness passed all "
            f"{what} recorded; our harness failed {inside} in-process"
            + (f" and the other {iso} isolated (the candidate in its own process)" if iso and not missed
               else f" and {iso} more isolated (the candidate in its own process)" if iso else "")
            + (f", and missed {_names(missed)}" if missed else "")
            + f"; the naive wall clock timed {len(fast)} of the {len(timed)} that do not fake the clock faster than "
              "the reference" + (f" (up to {ratio_text(top['naive_speedup'])}, {top['name']})" if top else ""))
    if slow:
        costs = "; ".join(f"{r['name']}: {HACK_COST.get(r['name'], 'its trick')}" for r in slow)
        text += f", and the other {len(slow)} slower, as they pay for their trick ({costs})"
    return text + "."


def _kernels_sentence(kernels: list[dict]) -> str:
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
    missing = [r["problem"] for r in kernels if not r["strong_peer"]]
    if missing:
        text += (f"; {'no' if len(missing) == len(kernels) else 'and no'} strong peer was timed yet for "
                 f"{_names(missing)}, so how {'they compare' if len(missing) > 1 else 'it compares'} with what a "
                 "user would run instead is not known from these records")
    return text + "."


def _agreement_sentence(records: Sequence[dict]) -> str:
    r = next((x for x in reversed(records) if x.get("case") == "isolation_agreement"), None)
    if not r or not (r.get("in_process_ms") and r.get("isolated_ms") and r.get("resolution_ms")):
        return ""
    mode = lambda m: {"ms": r[f"{m}_ms"], "p20_ms": r.get(f"{m}_p20_ms"), "p80_ms": r.get(f"{m}_p80_ms")}  # noqa: E731
    return (f"The same honest kernel timed in this process and isolated took {r['in_process_ms']:.3g} and "
            f"{r['isolated_ms']:.3g} ms: {_gap_words(mode('isolated'), mode('in_process'), r['resolution_ms'])}.")


def caption(records: Sequence[dict], *, device: str = recorded.H200) -> str:
    """At most three sentences about the recorded scores, every comparison word and every statement
    of what is missing computed from them: the hacks (with the versions they were recorded with),
    the kernels (naming the problems with no strong-peer timing), and how the two modes' clocks
    agreed on one honest kernel."""
    kernels, hacks_ = kernel_rows(records), hack_rows(records)
    out = [_hacks_sentence(hacks_, records, device) if hacks_ else "",
           _kernels_sentence(kernels) if kernels else "", _agreement_sentence(records)]
    return " ".join(x for x in out if x)


def markdown_table(rows: Sequence[dict], cols: Sequence[str]) -> str:
    """Rows (dicts) as a Markdown table of the columns ``cols`` (floats to 3 significant digits)."""
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else ("" if v is None else str(v))  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(lines + ["| " + " | ".join(fmt(r.get(c)).replace("|", "\\|") for c in cols) + " |"
                              for r in rows])


def provenance(preset: str, records: Sequence[dict] = ()) -> str:
    """Markdown for chapter 08's last, collapsed cell: this run, the records drawn, how to record your
    own, and how comparisons are judged."""
    info = runtime.describe()
    seconds = time.perf_counter() - _STARTED[0] if _STARTED else float("nan")
    rows = [f"- this run: preset `{preset}`, {info['device']}, Python {info['python']}, torch {info['torch']}, "
            f"Triton {info['triton']}{' (interpreter)' if info['interpreter'] else ''}, {platform.system()}; "
            f"{seconds:.0f} s from the setup cell to here; "
            + ("timings are CUDA events per call, the cache flushed before each" if timings_are_speeds() else
               "its timings are wall clocks of Triton's interpreter on a shared CPU, so the tables give verdicts "
               "and no speed-up")]
    if records:
        dates = sorted({str(r.get("when", ""))[:10] for r in records if r.get("when")})
        peers = sorted({r["case"] for r in records if (r.get("speedup_vs") or {}).get("strong_peer")})
        rows.append(f"- the GPU numbers: {len(records)} records of the `kernelbench` bench suite on the "
                    f"{recorded.H200} ({versions_label(records)}), "
                    + (f"recorded {dates[0]} to {dates[-1]}; " if dates else "")
                    + (f"strong peers timed for {_names(peers)}" if peers else "no strong peer timed in them"))
    rows.append("- your own GPU: `python -m minimax_lab.bench kernelbench --preset gpu` scores the gallery, the "
                "integrity hacks, the isolated mode and the workbook's kernels against their strong peers, and "
                "records them; `--cases problems isolation` times only the kernels and the two modes (a few "
                "minutes); `python -m minimax_lab.bench report` writes every record to one page")
    rows.append("- comparison words: two times are called different only when their p20-p80 ranges do not "
                "overlap; an isolated time and an in-process one only beyond twice the round trip's resolution "
                "(its jitter); error bars are those ranges, where the records keep them")
    return ("<details><summary><b>Where these numbers come from</b> (click to open)</summary>\n\n"
            + "\n".join(rows) + "\n\n</details>")
