"""The days (chapter 09): each day of :data:`minimax_lab.engine.DAYS` flips one switch and keeps
the earlier ones, so a day's change over the day before is that switch's effect. Per day: the
first agent turn's TTFT (the whole long context prefilled) beside the follow-up turn's, decode
tokens/s at the day's batch, inter-token latency, memory (weights + KV pool) and, where the day
was rehearsed, the first-call cost -- as a table (:func:`day_table`), a sentence per day
(:func:`day_ledger`) and bars (:func:`plot_days`).
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np

from minimax_lab.notebook import words
from minimax_lab.viz.engine.records import (METRICS, TIMED, _days_text, _label, _short, change, comparable, day_values,
                                            fmt_value, itl_case)


def _days(v: dict) -> list:
    return sorted({d for k, *_ in METRICS for d in v[k]} | set(v["old_batch"]))


def day_table(records: Sequence[dict]) -> str:
    """One row per day: agent_long's first and follow-up TTFT and decode tokens/s at its batch,
    the inter-token latency of :func:`itl_case`, memory, whether rehearsed, and -- where some day
    was rehearsed -- the first-call TTFTs."""
    v = day_values(records)
    days = _days(v)
    if not days:
        return "(no engine records)"
    fmt = lambda x: "-" if x is None else f"{x:,.0f}" if x >= 1000 else f"{x:.4g}"  # noqa: E731
    first_calls = any(r.get("first_call_ttft_first_ms") for _, r in v["ttft_first"].values())
    itl = itl_case(records)
    workloads = ["agent_long"] + ([itl] if itl else [])
    cols = [("TTFT first (ms)", 16), ("follow-up (ms)", 15), ("decode tok/s (B)", 17),
            (f"{itl or ''} ITL (ms)".strip(), 14), ("weights+KV", 11),
            (f"rehearsed ({' / '.join(workloads)})", 12 + 8 * len(workloads))]
    if first_calls:
        cols.append(("first call: first / follow-up (ms)", 36))
    lines = [f"{'':36s} " + " ".join(f"{c:>{w}s}" for c, w in cols)]
    for d in days:
        get = lambda k: v[k].get(d, (None, None))[0]  # noqa: E731
        rec = (v["ttft_first"].get(d) or v["ttft_followup"].get(d) or (None, {}))[1]
        said = [rec.get("rehearsed")] + ([v["itl"].get(d, (None, {}))[1].get("rehearsed")] if itl else [])
        dec = get("decode_tok_s")
        dec_s = (f"{dec:,.4g} ({v['batch'].get(d)})" if dec is not None else
                 f"left out ({v['old_batch'][d]})" if d in v["old_batch"] else "-")
        mem = get("memory")
        mem_s = "-" if mem is None else (fmt_value(mem * 1024, "MiB") if mem < 1 else fmt_value(mem, "GiB"))
        cells = [fmt(get("ttft_first")), fmt(get("ttft_followup")), dec_s, fmt(get("itl")), mem_s,
                 " / ".join("yes" if r else "no" for r in said)]
        if first_calls:
            first = (rec.get("first_call_ttft_first_ms"), rec.get("first_call_ttft_followup_ms"))
            cells.append("-" if first[0] is None else f"{fmt(first[0])} / {fmt(first[1])}")
        lines.append(f"{_label(d)[:36]:36s} " + " ".join(f"{c:>{w}s}" for c, (_, w) in zip(cells, cols)))
    notes = ["TTFT and decode: the agent_long workload; B: sequences decoding at once."]
    if v["old_batch"]:
        notes.append(f"left out: a decode of B > 1 without continuous batching ({_days_text(v['old_batch'])}), made "
                     "before forks counted against the batch limit.")
    if first_calls:
        notes.append("first call: the same turn served the first time in this process, untimed rehearsal, "
                     "compiling included.")
    return "\n".join(lines + notes)


def day_ledger(records: Sequence[dict]) -> list[str]:
    """One sentence per day after the first: what its switch changed on every metric, better and
    worse (``words.change``: ``after / before``), and which metrics it could not compare and why."""
    v = day_values(records)
    days = sorted({d for k, *_ in METRICS for d in v[k]})
    reasons = {"not rehearsed": "neither record rehearsed: both may include compiling",
               "mixed rehearsal": "one rehearsed, the other not"}
    out = []
    for prev, d in zip(days, days[1:]):
        buys, costs, skipped = [], [], {}
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
            text = f"{title} {words.change(x, y, unit=u, digits=4 if max(x, y) >= 1000 else 3)}"
            if g > 1.03:
                buys.append(text)
            elif g < 1 / 1.03:
                costs.append(text)
        line = f"{_label(d)} against {_short(prev)}: "
        if buys or costs:
            line += f"buys {'; '.join(buys) or 'nothing measured'}. Costs: {'; '.join(costs) or 'nothing measured'}."
        else:
            line += "no change computed."
        for note, titles in skipped.items():
            line += f" Not compared ({reasons.get(note, note)}): {'; '.join(titles)}."
        out.append(line)
    return out


def _bar_panel(ax, days: list, vals: list, key: str, title: str, unit: str, hb: bool, v: dict, device: str) -> None:
    y = np.arange(len(days))[::-1]
    shown = [(yy, d, x) for yy, d, x in zip(y, days, vals) if x is not None]
    ok = [comparable(x[1], x[1]) is None or key not in TIMED for _, _, x in shown]
    ax.barh([yy for yy, _, _ in shown], [x[0] for _, _, x in shown],
            color=["tab:blue" if o else "0.75" for o in ok], alpha=0.8)
    ax.set_xscale("log")
    for i, (yy, d, x) in enumerate(shown):
        before = vals[days.index(d) - 1] if days.index(d) else None
        g, note = change(before, x, hb, timed=key in TIMED)
        tag = f"  {x[0] / before[0]:.2f}x" if g is not None else ""  # after / before, as words.change writes it
        batch = f", B={v['batch'].get(d)}" if key == "decode_tok_s" else ""
        ax.text(x[0], yy, f" {fmt_value(x[0], unit)}{batch}{tag}", va="center", fontsize=7)
    for yy, d in zip(y, days):
        if key == "decode_tok_s" and d in v["old_batch"]:
            ax.annotate(f"left out: B={v['old_batch'][d]} without batching", (0.02, yy), xycoords=("axes fraction", "data"),
                        va="center", fontsize=6.5, style="italic", color="0.4")
    xs = [x[0] for _, _, x in shown]
    ax.set_xlim(min(xs) / 2, max(xs) * 25)
    ax.set_ylim(-0.6, len(days) - 0.4)
    note = "" if all(ok) else "\n(grey: not rehearsed, no ratio)"
    ax.set_title(title + note, fontsize=9)
    ax.set_xlabel(f"{unit}, {device} ({'higher' if hb else 'lower'} is better)", fontsize=8)


def plot_days(records: Sequence[dict], *, device: str = "NVIDIA H200", axes=None):
    """Bars per day for each of the first four :data:`METRICS` that has records (first-turn TTFT
    beside follow-up TTFT, decode tokens/s labelled with its batch, ITL), log axes, each bar
    labelled with its value and its ratio to the day above (``after / before``) where the two can
    be compared; bars of records that cannot are grey. ``axes``: one per metric with records
    (:func:`day_panels`). Returns the axes."""
    v = day_values(records)
    days = sorted({d for k, *_ in METRICS for d in v[k]})
    metrics = day_panels(records)
    axes = axes if axes is not None else plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.8))[1]
    itl = itl_case(records)
    for ax, (key, title, unit, hb) in zip(np.atleast_1d(axes), metrics):
        title = f"{title} ({itl})" if key == "itl" else title
        _bar_panel(ax, days, [v[key].get(d) for d in days], key, title, unit, hb, v, device)
    first = np.atleast_1d(axes)[0] if metrics else None
    if first is not None:
        first.set_yticks(np.arange(len(days))[::-1], [_label(d) for d in days], fontsize=8)
        for ax in np.atleast_1d(axes)[1:]:
            ax.set_yticks(np.arange(len(days))[::-1], [""] * len(days))
    return axes


def day_panels(records: Sequence[dict]) -> list:
    """The entries of :data:`METRICS` (but memory) that have at least one record to draw."""
    v = day_values(records)
    return [m for m in METRICS[:4] if v[m[0]]]
