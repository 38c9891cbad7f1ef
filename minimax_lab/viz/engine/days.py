"""The days (chapter 09): each day of :data:`minimax_lab.engine.DAYS` flips one switch and keeps
the earlier ones, so a day's change over the day before is that switch's effect. Per day: the
first agent turn's TTFT (the whole long context prefilled) beside the follow-up turn's,
inter-token latency (p50 and p99), decode tokens/s of 32 sequences, memory (weights + KV pool) and,
where the day was rehearsed, the first-call cost -- as a table (:func:`day_table`), a sentence per
day (:func:`day_ledger`) and bars with the repeats' spread (:func:`plot_days`). Only records whose
times compare (:func:`~.records.comparable`) are drawn or compared; the others are named.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np

from minimax_lab.notebook import words
from minimax_lab.viz.engine.records import (METRICS, TIMED, _days_text, _label, _short, beyond_spread, change,
                                            comparable, day_values, fmt_value, itl_case)


def _days(v: dict) -> list:
    return sorted({d for k, *_ in METRICS for d in v[k]} | set(v["old_batch"]))


def _cell(x, reps=()) -> str:
    if x is None:
        return "-"
    s = f"{x:,.0f}" if x >= 1000 else f"{x:.4g}"
    if len(reps) >= 2:
        lo, hi = min(reps), max(reps)
        s += f" ({lo:,.0f}-{hi:,.0f})" if hi >= 1000 else f" ({lo:.3g}-{hi:.3g})"
    return s


def day_table(records: Sequence[dict]) -> str:
    """One row per day: agent_long's first and follow-up TTFT, the inter-token latency of
    :func:`itl_case` (p50, p99), decode tokens/s of 32 sequences, memory, whether rehearsed, and --
    where some day was rehearsed -- the first-call TTFTs; a value measured several times is the
    median, its repeats' range in brackets."""
    v = day_values(records)
    days = _days(v)
    if not days:
        return "(no engine records)"
    first_calls = any(r.get("first_call_ttft_first_ms") for _, r, _ in v["ttft_first"].values())
    itl = itl_case(records)
    cols = [("TTFT first (ms)", 19), ("follow-up (ms)", 19), (f"{itl or ''} ITL p50 (ms)".strip(), 23),
            ("ITL p99 (ms)", 19), ("decode tok/s, B=32", 22), ("weights+KV", 11), ("rehearsed", 9)]
    if first_calls:
        cols.append(("first call: first / follow-up (ms)", 36))
    lines = [f"{'':36s} " + " ".join(f"{c:>{w}s}" for c, w in cols)]
    for d in days:
        get = lambda k: v[k].get(d, (None, None, ()))  # noqa: E731
        rec = (v["ttft_first"].get(d) or v["itl"].get(d) or (None, {}, ()))[1]
        mem = get("memory")[0]
        mem_s = "-" if mem is None else (fmt_value(mem * 1024, "MiB") if mem < 1 else fmt_value(mem, "GiB"))
        cells = [_cell(*get("ttft_first")[::2]), _cell(*get("ttft_followup")[::2]), _cell(*get("itl")[::2]),
                 _cell(*get("itl_p99")[::2]), _cell(*get("decode_b32")[::2]), mem_s,
                 "yes" if rec.get("rehearsed") else "no"]
        if first_calls:
            first = (rec.get("first_call_ttft_first_ms"), rec.get("first_call_ttft_followup_ms"))
            cells.append("-" if first[0] is None else f"{_cell(first[0])} / {_cell(first[1])}")
        lines.append(f"{_label(d)[:36]:36s} " + " ".join(f"{c:>{w}s}" for c, (_, w) in zip(cells, cols)))
    notes = ["TTFT and ITL: the agent_long workload at the day's batch; a value measured several times is the median "
             "of the repeats, their range in brackets."]
    if v["old_batch"]:
        notes.append(f"left out: a decode of B > 1 without continuous batching ({_days_text(v['old_batch'])}), made "
                     "before forks counted against the batch limit.")
    if first_calls:
        notes.append("first call: the same turn served the first time in this process, untimed rehearsal, "
                     "compiling included.")
    return "\n".join(lines + notes)


def day_ledger(records: Sequence[dict]) -> list[str]:
    """One sentence per day after the first: what its switch changed, better and worse
    (``words.change``: ``after / before``), only where the change is larger than the spread of both
    days' repeats (or, for values measured once, than 3%); the metrics inside it, and those that
    could not be compared and why."""
    v = day_values(records)
    days = sorted({d for k, *_ in METRICS for d in v[k]})
    reasons = {"not rehearsed": "neither record rehearsed: both may include compiling",
               "mixed rehearsal": "one rehearsed, the other not"}
    out = []
    for prev, d in zip(days, days[1:]):
        buys, costs, level, skipped = [], [], [], {}
        for key, title, unit, hb in METRICS:
            a, b = v[key].get(prev), v[key].get(d)
            if a is None or b is None:
                continue
            g, note = change(a, b, hb, timed=key in TIMED)
            if note:
                skipped.setdefault(note, []).append(title)
                continue
            seconds = unit == "ms" and max(a[0], b[0]) >= 1000
            x, y, u = (a[0] / 1e3, b[0] / 1e3, "s") if seconds else (a[0], b[0], unit)
            text = f"{title} {words.change(x, y, unit=u, same_within=0.0, digits=4 if max(x, y) >= 1000 else 3)}"
            apart = beyond_spread(a, b)
            if apart is False or (apart is None and abs(g - 1) <= 0.03):
                level.append(title)
            elif g > 1:
                buys.append(text)
            else:
                costs.append(text)
        line = f"{_label(d)} against {_short(prev)}: "
        if buys or costs:
            line += f"buys {'; '.join(buys) or 'nothing measured'}. Costs: {'; '.join(costs) or 'nothing measured'}."
        else:
            line += "no change larger than its spread."
        if level and (buys or costs):
            line += f" No change beyond the spread (or 3%): {'; '.join(level)}."
        for note, titles in skipped.items():
            line += f" Not compared ({reasons.get(note, note)}): {'; '.join(titles)}."
        out.append(line)
    return out


def _bar_panel(ax, days: list, vals: list, key: str, title: str, unit: str, hb: bool, device: str) -> None:
    y = np.arange(len(days))[::-1]
    shown = [(yy, d, x) for yy, d, x in zip(y, days, vals) if x is not None]
    err = [[max(0.0, x[0] - min(x[2])) if len(x[2]) >= 2 else 0 for _, _, x in shown],
           [max(0.0, max(x[2]) - x[0]) if len(x[2]) >= 2 else 0 for _, _, x in shown]]
    ax.barh([yy for yy, _, _ in shown], [x[0] for _, _, x in shown], color="tab:blue", alpha=0.8,
            xerr=err if any(any(e) for e in err) else None, error_kw=dict(ecolor="0.2", capsize=2, lw=0.8))
    ax.set_xscale("log")
    for yy, d, x in shown:
        i = days.index(d)
        before = vals[i - 1] if i else None
        g, _ = change(before, x, hb, timed=key in TIMED)
        tag = f"  {x[0] / before[0]:.2f}x" if g is not None else ""  # after / before, as words.change writes it
        ax.text(x[0] * 1.15, yy, f"{fmt_value(x[0], unit)}{tag}", va="center", fontsize=7)
    xs = [x[0] for _, _, x in shown]
    ax.set_xlim(min(xs) / 2, max(xs) * 30)
    ax.set_ylim(-0.6, len(days) - 0.4)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(f"{unit}, {device} ({'higher' if hb else 'lower'} is better)", fontsize=8)


def _drawable(v: dict) -> dict:
    """The values whose times can be drawn side by side: each day's record comparable with itself
    (rehearsed, or compiling nothing)."""
    out = {}
    for key, *_ in METRICS:
        out[key] = {d: x for d, x in v[key].items() if key not in TIMED or comparable(x[1], x[1]) is None}
    return {**v, **out}


def day_panels(records: Sequence[dict]) -> list:
    """The entries of :data:`METRICS` with drawable records of at least two days (times only where
    rehearsed or compiling nothing): a panel compares days."""
    v = _drawable(day_values(records))
    return [m for m in METRICS if len(v[m[0]]) >= 2]


def left_out(records: Sequence[dict]) -> dict:
    """``{metric title: [days]}`` of the recorded times :func:`plot_days` leaves out because they
    were not rehearsed (they may include compiling)."""
    v, shown = day_values(records), _drawable(day_values(records))
    out = {}
    for key, title, *_ in METRICS:
        gone = sorted(set(v[key]) - set(shown[key]))
        if gone:
            out[title] = gone
    return out


def plot_days(records: Sequence[dict], *, device: str = "NVIDIA H200", axes=None):
    """Bars per day for each of :func:`day_panels`, log axes, the repeats' range as error bars, each
    bar labelled with its value and its ratio to the day above (``after / before``) where the two
    compare. Times that were not rehearsed are not drawn (:func:`left_out` names them).
    ``axes``: one per panel. Returns the axes."""
    v = _drawable(day_values(records))
    metrics = day_panels(records)
    days = sorted({d for k, *_ in metrics for d in v[k]})
    axes = axes if axes is not None else plt.subplots(1, len(metrics), figsize=(3.6 * len(metrics), 3.8))[1]
    itl = itl_case(records)
    for ax, (key, title, unit, hb) in zip(np.atleast_1d(axes), metrics):
        title = f"{title} ({itl})" if key.startswith("itl") else title
        _bar_panel(ax, days, [v[key].get(d) for d in days], key, title, unit, hb, device)
    first = np.atleast_1d(axes)[0] if metrics else None
    if first is not None:
        first.set_yticks(np.arange(len(days))[::-1], [_label(d) for d in days], fontsize=8)
        for ax in np.atleast_1d(axes)[1:]:
            ax.set_yticks(np.arange(len(days))[::-1], [""] * len(days))
    return axes
