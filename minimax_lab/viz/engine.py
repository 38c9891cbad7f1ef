"""The engine's pictures and tables, from bench records (suite ``engine``).

* **Days** (:func:`day_table`, :func:`day_ledger`, :func:`plot_days`): each day of
  :data:`minimax_lab.engine.DAYS` flips one switch and keeps the earlier ones, so a day's change
  over the day before is that switch's effect. Shown per day: the first agent turn's TTFT (the
  whole long context prefilled) beside the follow-up turn's, decode tokens/s at the day's batch,
  inter-token latency, memory (weights + KV pool), and, where the day was rehearsed, the
  first-call cost. A change of a time is computed only between two records that can be compared
  (:func:`comparable`): both rehearsed, or both made by Triton's interpreter, which compiles
  nothing. Every change is written as ``after / before`` (:func:`minimax_lab.notebook.words.change`),
  in the figure as in the sentences.
* **Records made under other rules** (:func:`breaks_batch_rule`, :func:`gpu_story_lines`): a
  decode record of a day without continuous batching that decoded more than one sequence was made
  before forks counted against ``max_batch``; it is left out and said so.
* **Load** (:func:`sweep_curves`, :func:`plot_sweep`, :func:`plot_preemption`,
  :func:`sweep_lines`): throughput against p99 TTFT as the arrival rate rises, p99 inter-token
  latency, and the share of requests that met the SLO, one curve per day or per memory policy.
* **Where decode sits** (:func:`decode_points`): each day's decode step as a point on chapter
  00's roofline (FLOPs and bytes of :mod:`minimax_lab.engine.traffic`, the measured step time).
* **A timeline** (:func:`plot_timeline`): the steps of a simulated run, one row per request.
* **Where FP8 moves the logits** (:func:`format_breakdown`, :func:`breakdown_lines`): the rows of
  :func:`minimax_lab.engine.quality.fp8_breakdown` as a table, and what they show in words.
* :func:`plot_gpu_story` -- the recorded GPU run in one figure, a panel only for what was
  recorded; :func:`gpu_story_lines` says what is missing.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np

from minimax_lab.bench.suite_engine import MixedRehearsal, day_ratio
from minimax_lab.engine.config import GPU, kv_bytes_per_token, param_count
from minimax_lab.engine.options import DAY_LABELS
from minimax_lab.engine.traffic import decode_step_bytes, decode_step_flops
from minimax_lab.notebook import recorded, words
from minimax_lab.viz.roofline import plot_roofline

COMMAND = "python -m minimax_lab.bench engine --preset gpu"


def no_record(cases: str = "") -> str:
    """What a sentence says where no GPU record exists."""
    return f"no H200 record yet (`{COMMAND}{' --cases ' + cases if cases else ''}` on a GPU makes it)"


def fmt_value(v: float, unit: str) -> str:
    """``v`` compactly: ms of a second or more as seconds, large rates with thousands separators."""
    if unit == "ms" and v >= 1000:
        return f"{v / 1e3:.3g} s"
    if v >= 1000:
        return f"{v:,.0f} {unit}"
    return f"{v:.3g} {unit}"


def engine_records(records: Sequence[dict]) -> list[dict]:
    return [r for r in records if r.get("suite") == "engine" and isinstance(r.get("day"), int)]


def _plain(r: dict) -> bool:
    """A day record (impl ``d<day>_<switch>``), not a load-sweep variant."""
    return r.get("impl") == f"d{r['day']}_{r.get('switch')}"


def by_case(records: Sequence[dict]) -> dict:
    """``{case: {day: record}}`` of the day records."""
    out: dict = {}
    for r in engine_records(records):
        if _plain(r):
            out.setdefault(r["case"], {})[r["day"]] = r
    return out


def _label(day: int) -> str:
    return DAY_LABELS[day] if 0 <= day < len(DAY_LABELS) else f"day {day}"


def _short(day: int) -> str:
    """``"day 14"`` for the FP8 day: the number a reader sees, not its place in the list."""
    return _label(day).split(":")[0]


def _days_text(days) -> str:
    """``"days 0-5"``, ``"days 0 and 14"``, ``"day 6"``: the days' own numbers, runs of three or more joined."""
    nums = sorted(int(_short(d).split()[1]) for d in days)
    runs: list = []
    for n in nums:
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    parts = [p for a, b in runs for p in ([f"{a}-{b}"] if b - a >= 2 else [str(x) for x in range(a, b + 1)])]
    if len(nums) == 1:
        return f"day {parts[0]}"
    return "days " + (", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0])


# ---------------------------------------------------------------------------------------------- days

#: (key, title, unit, True when larger is better)
METRICS = (
    ("ttft_first", "TTFT, first agent turn", "ms", False),
    ("ttft_followup", "TTFT, follow-up agent turn", "ms", False),
    ("decode_tok_s", "decode tokens/s (batch)", "tokens/s", True),
    ("itl", "inter-token latency", "ms", False),
    ("memory", "weights + KV pool", "GiB", False),
)
#: metrics that are times: a first call's compiling can be in them, so they need comparable records
TIMED = ("ttft_first", "ttft_followup", "decode_tok_s", "itl")


def _decode_records(cases: dict) -> dict:
    for case in sorted(cases):
        if case == "agent_long.decode" or case.startswith("agent_long.decode_b"):
            return cases[case]
    return {}


def breaks_batch_rule(r: dict) -> bool:
    """A decode record of a day without continuous batching that decoded more than one sequence at
    once: made before forks counted against the day's batch limit (such a day now decodes one)."""
    opts = r.get("options") or {}
    return (r.get("decode_batch") or 1) > 1 and opts.get("continuous_batching") is False


def itl_case(records: Sequence[dict]) -> str | None:
    """The workload whose inter-token latency the day tables show: ``agent`` where recorded, else ``chat``."""
    cases = by_case(records)
    return next((c.split(".")[0] for c in ("agent.itl", "chat.itl") if cases.get(c)), None)


def day_values(records: Sequence[dict]) -> dict:
    """``{metric key: {day: (value, record)}}`` for :data:`METRICS`, ``"batch": {day: B}``, and
    ``"old_batch": {day: B}`` for the decode records left out by :func:`breaks_batch_rule`."""
    cases = by_case(records)
    out: dict = {k: {} for k, *_ in METRICS}
    out["batch"], out["old_batch"] = {}, {}
    for key in ("ttft_first", "ttft_followup"):
        for day, r in cases.get(f"agent_long.{key}", {}).items():
            out[key][day] = (r["ms"], r)
    for day, r in _decode_records(cases).items():
        if breaks_batch_rule(r):
            out["old_batch"][day] = r.get("decode_batch")
        elif r.get("decode_tok_s"):
            out["decode_tok_s"][day] = (r["decode_tok_s"], r)
            out["batch"][day] = r.get("decode_batch")
    itl = itl_case(records)
    if itl:
        out["itl"] = {day: (r["ms"], r) for day, r in cases[f"{itl}.itl"].items()}
    for case in ("agent_long.ttft_followup", "agent.e2e", "chat.e2e"):
        mem = {day: (r["weights_gib"] + r["kv_cache_gib"], r) for day, r in cases.get(case, {}).items()
               if r.get("weights_gib") is not None and r.get("kv_cache_gib") is not None}
        if mem:
            out["memory"] = mem
            break
    return out


def comparable(a: dict, b: dict) -> str | None:
    """None when two records' times can be compared, else why not: ``"mixed rehearsal"`` (one was
    rehearsed, the other not) or ``"not rehearsed"`` (neither was, on a GPU: both may include
    Triton compiling, each a different amount). Records made by Triton's interpreter compile
    nothing and compare."""
    try:
        day_ratio({**a, "ms": 1.0}, {**b, "ms": 1.0})
    except MixedRehearsal:
        return "mixed rehearsal"
    if not a.get("rehearsed") and not (a.get("interpreter") and b.get("interpreter")):
        return "not rehearsed"
    return None


def change(prev, cur, higher_better: bool, *, timed: bool = True) -> tuple:
    """``(gain, note)`` of ``cur`` over ``prev`` (each ``(value, record)``): gain > 1 is better; None
    with a note when either is missing or, for a time (``timed``), the two records cannot be
    compared (:func:`comparable`)."""
    if prev is None or cur is None:
        return None, ""
    why = comparable(prev[1], cur[1]) if timed else None
    if why:
        return None, why
    a, b = prev[0], cur[0]
    return (b / a if higher_better else a / b), ""


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


# ---------------------------------------------------------------------------------------------- load


def sweep_curves(records: Sequence[dict], *, case: str = "load", simulated: bool | None = None) -> dict:
    """``{(day, policy, simulated): [record, ...] sorted by rate}`` of the ``load`` or
    ``preemption`` sweep records; ``simulated`` picks the simulated or the wall-clock ones (None: both)."""
    out: dict = {}
    for r in engine_records(records):
        if not r["case"].startswith(f"{case}_") or r.get("rate") is None:
            continue
        sim = r.get("clock") == "simulated"
        if simulated is not None and sim != simulated:
            continue
        out.setdefault((r["day"], r.get("policy", "reserve"), sim), []).append(r)
    return {k: sorted(v, key=lambda r: r["rate"]) for k, v in sorted(out.items())}


def _curve_label(day: int, policy: str, sim: bool, by: str, clock: bool = True) -> str:
    name = _label(day) if by == "day" else {"reserve": "reserve up front"}.get(policy, f"preempt: {policy}")
    return name + ((" (simulated)" if sim else " (wall clock)") if clock else "")


def _both_clocks(curves: dict) -> bool:
    return len({k[2] for k in curves}) > 1


def _attain(rows: list) -> float:
    return (rows[0].get("slo") or {}).get("attain", 0.9)


#: a line style per curve, so that curves lying on each other stay visible
_STYLES = (dict(marker="o", ls="-"), dict(marker="s", ls="--", mfc="none"), dict(marker="^", ls=":", mfc="none"),
           dict(marker="D", ls="-.", mfc="none"))


def plot_sweep(records: Sequence[dict], *, case: str = "load", by: str = "day", simulated: bool | None = None,
               axes=None, title: str = ""):
    """Three panels: throughput against p99 TTFT (one curve per day, or per policy with
    ``by="policy"``, each point one arrival rate), p99 inter-token latency against the rate, and
    the share of requests meeting the SLO against the rate, the share that counts as sustained
    dotted. Returns the axes; raises ``ValueError`` when there is no sweep record to draw."""
    curves = sweep_curves(records, case=case, simulated=simulated)
    if not curves:
        raise ValueError(f"no {case} sweep records to draw: {no_record(case)}")
    own = axes is None
    axes = axes if axes is not None else plt.subplots(1, 3, figsize=(15, 4.2))[1]
    ax, ax_itl, ax_slo = axes
    clock = _both_clocks(curves)
    for i, ((day, policy, sim), rows) in enumerate(curves.items()):
        style = dict(_STYLES[i % len(_STYLES)], ms=5, label=_curve_label(day, policy, sim, by, clock))
        line, = ax.plot([r["throughput_tok_s"] for r in rows], [r["ttft_p99_ms"] for r in rows], **style)
        style["color"] = line.get_color()
        ax_itl.plot([r["rate"] for r in rows], [r["itl_p99_ms"] or np.nan for r in rows], **style)
        ax_slo.plot([r["rate"] for r in rows], [100 * r["slo_attainment"] for r in rows], **style)
    rows = next(iter(curves.values()))
    slo = rows[0].get("slo") or {}
    ax.set_yscale("log")
    ax.set(xlabel="throughput (generated tokens/s)", ylabel="p99 time to first token (ms, log)")
    priced = ("simulated clock, steps priced by " + _prices([r for rs in curves.values() for r in rs])
              if not clock and next(iter(curves))[2] else "")
    ax.set_title(title or "throughput against p99 TTFT, the rate rising along a curve", fontsize=9)
    if own and priced:
        ax.figure.suptitle(priced, fontsize=9, y=1.0)
    ax_itl.set(xscale="log", xlabel="arrival rate (requests/s, log)", ylabel="p99 inter-token latency (ms)")
    ax_itl.set_ylim(bottom=0)
    ax_itl.set_title("time between two tokens of one answer", fontsize=9)
    ax_slo.set(xscale="log", xlabel="arrival rate (requests/s, log)", ylabel="requests meeting the SLO (%)",
               ylim=(-3, 103))
    if slo:
        ax_slo.set_title(f"SLO: TTFT <= {_ms(slo['ttft_s'])} and <= {_ms(slo['tpot_s'])} per token", fontsize=9)
    ax_slo.axhline(100 * _attain(rows), color="0.5", lw=0.8, ls=":")
    ax_slo.annotate(f"sustained: {_attain(rows):.0%} meet it", (1.0, 100 * _attain(rows)),
                    xycoords=("axes fraction", "data"), xytext=(-4, 3), textcoords="offset points", ha="right",
                    fontsize=7, color="0.4")
    ax_slo.legend(fontsize=7, loc="center right")
    for a, axis in ((ax, ax.yaxis), (ax_itl, ax_itl.xaxis), (ax_slo, ax_slo.xaxis)):
        axis.set_major_locator(mticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))  # 20, not 2x10^1
        axis.set_minor_formatter(mticker.NullFormatter())
    return axes


def _summary(rows: list) -> tuple:
    """(highest sustained rate or None, the row there or None, the throughput ceiling)."""
    ok = [r for r in rows if r["slo_attainment"] >= _attain(rows)]
    best = max(ok, key=lambda r: r["rate"]) if ok else None
    return (best["rate"] if best else None), best, max(r["throughput_tok_s"] or 0 for r in rows)


def goodput_sentences(records: Sequence[dict], *, case: str = "load", by: str = "day") -> list[str]:
    """Per curve: the highest swept rate it sustains (the SLO's share of requests meet it), its
    goodput (requests/s meeting the SLO) and p99 inter-token latency there, its throughput
    ceiling and its preemptions."""
    curves = sweep_curves(records, case=case)
    if by == "policy":
        curves = dict(sorted(curves.items(), key=lambda kv: kv[0][1] != "reserve"))
    clock = _both_clocks(curves)
    out = []
    for (day, policy, sim), rows in curves.items():
        rate, at, top = _summary(rows)
        kept = (f"sustains up to {rate:.3g} requests/s (goodput {at['goodput_rps']:.3g} requests/s, p99 inter-token "
                f"latency {at['itl_p99_ms']:.3g} ms)" if at else "sustains no swept rate")
        out.append(f"{_curve_label(day, policy, sim, by, clock)}: {kept}; at most {top:,.0f} tokens/s; "
                   f"{sum(r['preemptions'] for r in rows)} preemptions over the sweep")
    return out


def _same(rows_a: list, rows_b: list) -> bool:
    keys = ("rate", "throughput_tok_s", "ttft_p99_ms", "itl_p99_ms", "slo_attainment")
    return len(rows_a) == len(rows_b) and all(
        all(np.isclose(a[k] or 0, b[k] or 0, rtol=1e-9) for k in keys) for a, b in zip(rows_a, rows_b))


def curve_comparison(records: Sequence[dict], *, case: str = "load", by: str = "day") -> list[str]:
    """Each curve against the first (the earliest day, or reserving up front): the highest rate it
    sustains and its throughput ceiling, as computed comparison words; a curve that repeats an
    earlier one at every rate is said to."""
    curves = sweep_curves(records, case=case)
    if by == "policy":
        curves = dict(sorted(curves.items(), key=lambda kv: kv[0][1] != "reserve"))
    items = list(curves.items())
    if len(items) < 2:
        return []
    clock = _both_clocks(curves)
    name = lambda k: _curve_label(*k, by, clock)  # noqa: E731
    (k0, rows0), out = items[0], []
    rate0, _, top0 = _summary(rows0)
    for i, (k, rows) in enumerate(items[1:], 1):
        twin = next((kk for kk, rr in items[:i] if _same(rr, rows)), None)
        if twin is not None:
            out.append(f"{name(k)} gives the same numbers as {name(twin)} at every rate")
            continue
        rate, _, top = _summary(rows)
        if rate and rate0:
            kept = f"sustains up to {rate:.3g} requests/s ({words.more_or_less(rate, rate0)} {name(k0)})"
        elif rate:
            kept = f"sustains up to {rate:.3g} requests/s ({name(k0)}: no swept rate)"
        else:
            kept = "sustains no swept rate"
        itl, itl0 = _median_itl(rows), _median_itl(rows0)
        lat = (f"; its p99 inter-token latency, median over the rates, is {itl:.3g} ms "
               f"({words.more_or_less(itl, itl0)} {name(k0)}'s {itl0:.3g} ms)" if itl and itl0 else "")
        out.append(f"{name(k)} {kept} and tops out at {top:,.0f} tokens/s "
                   f"({words.more_or_less(top, top0)} {name(k0)}){lat}")
    return out


def _median_itl(rows: list) -> float | None:
    vals = [r["itl_p99_ms"] for r in rows if r.get("itl_p99_ms")]
    return float(np.median(vals)) if vals else None


def _prices(rows: list) -> str:
    """What priced the simulated ``rows``: their one source, or each day's own steps of one device."""
    sources = sorted({r.get("prices") or "?" for r in rows})
    if len(sources) == 1:
        return sources[0]
    devices = {s.split(":")[0] for s in sources}
    return f"each day's own {devices.pop()} steps" if len(devices) == 1 else "; ".join(sources)


def _ms(seconds: float) -> str:
    return f"{seconds:g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


def sweep_lines(records: Sequence[dict], *, case: str = "load") -> list[str]:
    """How a sweep was made, from its records: the arrival process and requests, the clock and
    what priced its steps, the SLO and how it was set, the share of requests that counts as
    sustained."""
    out = []
    for sim in (True, False):
        rows = [r for rs in sweep_curves(records, case=case, simulated=sim).values() for r in rs]
        if not rows:
            continue
        r = rows[0]
        arrivals = {"mooncake": "Mooncake's trace, its timestamps scaled to each rate",
                    "poisson": "Poisson arrivals"}.get(r.get("arrivals"), r.get("arrivals"))
        slo = r.get("slo") or {}
        how = f" ({r['slo_rule']})" if r.get("slo_rule") else ""
        clock = f"simulated clock, steps priced by {_prices(rows)}" if sim else "the wall clock"
        out.append(f"{arrivals}, {r.get('requests')} requests per rate; {clock}; SLO: TTFT <= "
                   f"{_ms(slo.get('ttft_s', 0))} and <= {_ms(slo.get('tpot_s', 0))} per output "
                   f"token{how}; a rate is sustained while {slo.get('attain', 0.9):.0%} of requests meet it")
    return out


def plot_preemption(records: Sequence[dict], *, day: int | None = None, simulated: bool | None = None, axes=None):
    """:func:`plot_sweep` of the ``preemption`` case for one day (default: the first found), one
    curve per policy."""
    recs = [r for r in engine_records(records) if r["case"].startswith("preemption_")]
    if day is None and recs:
        day = min(r["day"] for r in recs)
    recs = [r for r in recs if r["day"] == day]
    return plot_sweep(recs, case="preemption", by="policy", simulated=simulated, axes=axes,
                      title=f"{_short(day) if day is not None else ''}: reserve up front vs preemption")


# ---------------------------------------------------------------------------------------------- roofline


def decode_points(records: Sequence[dict]) -> list[dict]:
    """Each day's decode step as a roofline point ``{label, intensity, tflops, gbps, day, batch}``:
    FLOPs and bytes from the record (or, for a record without them, computed for the GPU-size
    model at the record's batch and context), TFLOP/s and GB/s from its step time. Records that
    :func:`breaks_batch_rule` are left out."""
    out = []
    for day, r in sorted(_decode_records(by_case(records)).items()):
        batch, ms = r.get("decode_batch"), r.get("ms")
        if not batch or not ms or breaks_batch_rule(r):
            continue
        nbytes, flops = r.get("decode_bytes_per_step"), r.get("decode_flops_per_step")
        if nbytes is None:
            opts = r.get("options") or {}
            context = (r.get("workload") or {}).get("context_tokens", 0) + (r.get("workload") or {}).get("max_tokens", 0) // 2
            nbytes = decode_step_bytes(GPU, batch=batch, context=context, kv_dtype=opts.get("kv_dtype"),
                                       expert_dtype=opts.get("expert_dtype"))["total"]
            flops = decode_step_flops(GPU, batch=batch, context=context)
        out.append({"label": f"{_label(day)} (B={batch})", "intensity": flops / nbytes,
                    "tflops": flops / (ms * 1e-3) / 1e12, "gbps": nbytes / (ms * 1e-3) / 1e9, "day": day,
                    "batch": batch})
    return out


def recorded_ceilings(device: str = recorded.H200) -> tuple:
    """``(copy GB/s, bf16 matmul TFLOP/s)`` of ``device`` from the recorded ``ceilings`` suite (None where absent)."""
    ceil = {r["case"]: r for r in recorded.all_of("ceilings", device=device)}
    return ceil.get("copy", {}).get("gbps"), ceil.get("gemm_bfloat16", {}).get("tflops")


def plot_decode_roofline(records: Sequence[dict], *, copy_gbps: float, gemm_tflops: float,
                         device: str = "NVIDIA H200", ax=None):
    """:func:`decode_points` on chapter 00's roofline of ``device``, one small marker per day."""
    ax = ax if ax is not None else plt.subplots(figsize=(8, 4))[1]
    plot_roofline([{"label": device, "copy_gbps": copy_gbps, "gemm_tflops": gemm_tflops}], [], ax=ax, legend=False,
                  title=f"each day's decode step on the {device} roofline")
    for i, p in enumerate(decode_points(records)):
        ax.plot(p["intensity"], p["tflops"], "os^DvP*X"[i % 8], ms=5, mfc="none", mew=1.2,
                label=f"{_short(p['day'])}, B={p['batch']}")
    ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)
    return ax


def roofline_sentences(records: Sequence[dict], copy_gbps: float | None) -> list[str]:
    """Per day: the bandwidth its decode step implies, as a share of the copy ceiling."""
    if not copy_gbps:
        return []
    return [f"{p['label']}: {p['gbps']:,.0f} GB/s of the bytes it must read, {p['gbps'] / copy_gbps:.0%} of the "
            f"copy ceiling" for p in decode_points(records)]


# ---------------------------------------------------------------------------------------------- a timeline


def plot_timeline(events: dict, *, ax=None, title: str = ""):
    """One row per request (:func:`minimax_lab.bench.suite_engine.timeline`): a thin grey line from
    arrival to finish, a blue bar for each step that computes part of its prompt, a green one for
    each step that decodes a token for it, a red cross where it is preempted."""
    ax = ax if ax is not None else plt.subplots(figsize=(13, 4))[1]
    n = len(events["arrivals"])
    t0 = min(events["arrivals"])
    ms = lambda t: (t - t0) * 1e3  # noqa: E731
    for i, (a, f) in enumerate(zip(events["arrivals"], events["finished"])):
        ax.plot([ms(a), ms(f)], [i, i], color="0.8", lw=1, zorder=1)
    for kind, color in (("prefills", "tab:blue"), ("decodes", "tab:green")):
        bars: dict = {}
        for st in events["steps"]:
            for i in st[kind]:
                bars.setdefault(i, []).append((ms(st["start"]), ms(st["end"]) - ms(st["start"])))
        for i, spans in bars.items():
            ax.broken_barh(spans, (i - 0.35, 0.7), color=color, zorder=2)
    for st in events["steps"]:
        for i in st["preempted"]:
            ax.plot(ms(st["start"]), i, "x", color="tab:red", ms=8, mew=2, zorder=3)
    ax.plot([], [], color="tab:blue", lw=6, label="prompt chunk")
    ax.plot([], [], color="tab:green", lw=6, label="decode")
    ax.plot([], [], "x", color="tab:red", label="preempted")
    ax.plot([], [], color="0.8", label="waiting / in flight")
    ax.set_yticks(range(n), [f"request {i}" for i in range(n)], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (ms)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    return ax


# ---------------------------------------------------------------------------------------------- the GPU figure


def plot_gpu_story(records: Sequence[dict], *, copy_gbps: float | None = None, gemm_tflops: float | None = None,
                   device: str = "NVIDIA H200"):
    """The recorded GPU run in one figure, a panel only for what the records hold: the days (first
    and follow-up TTFT, decode tokens/s, ITL), the wall-clock load sweep per day, the wall-clock
    preemption sweep, and each day's decode step on the roofline (with the ceilings given).
    Returns the figure, or None when there is nothing to draw (:func:`gpu_story_lines` says what
    is missing)."""
    days = day_panels(records)
    load = sweep_curves(records, case="load", simulated=False)
    pre = sweep_curves(records, case="preemption", simulated=False)
    roof = bool(decode_points(records) and copy_gbps and gemm_tflops)
    rows = [r for r in (days, bool(load), bool(pre) or roof) if r]
    if not rows:
        return None
    fig = plt.figure(figsize=(16, 4.3 * len(rows)))
    grid = fig.add_gridspec(len(rows), 12, hspace=0.55, wspace=1.2, left=0.14, right=0.98)
    row = 0
    if days:
        width = 12 // len(days)
        plot_days(records, device=device, axes=[fig.add_subplot(grid[0, width * i:width * (i + 1)])
                                                for i in range(len(days))])
        row += 1
    if load:
        plot_sweep(records, case="load", simulated=False, title="load sweep (wall clock)",
                   axes=[fig.add_subplot(grid[row, 4 * i:4 * (i + 1)]) for i in range(3)])
        row += 1
    if pre or roof:
        if pre:
            plot_preemption(records, simulated=False, axes=[fig.add_subplot(grid[row, 3 * i:3 * (i + 1)])
                                                            for i in range(3)])
        if roof:
            plot_decode_roofline(records, copy_gbps=copy_gbps, gemm_tflops=gemm_tflops, device=device,
                                 ax=fig.add_subplot(grid[row, 9:12] if pre else grid[row, 0:5]))
    fig.suptitle(f"recorded on the {device}", fontsize=11)
    return fig


def unrehearsed(records: Sequence[dict]) -> dict:
    """``{workload: [days]}`` of the day records the tables and figures use (:func:`day_values`;
    an older record of a case since renamed is not among them) that were made on a GPU without a
    rehearsal (or before records said): their times may include Triton compiling a kernel for a
    shape met the first time."""
    v = day_values(records)
    out: dict = {}
    for key in TIMED:
        for day, (_, r) in v[key].items():
            if not r.get("rehearsed") and not r.get("interpreter"):
                out.setdefault(r["case"].split(".")[0], set()).add(day)
    return {w: sorted(d) for w, d in sorted(out.items())}


def gpu_story_lines(records: Sequence[dict], *, copy_gbps: float | None = None, device: str = "NVIDIA H200") -> list:
    """What the recorded GPU run holds and lacks, computed from the records: which workloads and
    days were not rehearsed (no change computed between them), decode records made before forks
    counted against the batch limit (left out), and the sweeps, step prices and ceilings with no
    record yet."""
    recs = engine_records(records)
    if not recs:
        return [f"The {device} has {no_record()}."]
    out = []
    cold = unrehearsed(recs)
    if cold:
        out.append("Not rehearsed, so their times may include Triton compiling kernels and no change is computed "
                   "between them: " + "; ".join(f"{w} on {_days_text(d)}" for w, d in cold.items()) + ".")
    old = day_values(recs)["old_batch"]
    if old:
        out.append(f"The decode records of {_days_text(old)} decoded {max(old.values())} sequences at once without "
                   "continuous batching: made before forks counted against the batch limit, they are left out "
                   f"until re-recorded (`{COMMAND} --cases agent_long`).")
    missing = [what for what, have in (
        ("a wall-clock load sweep", sweep_curves(recs, case="load", simulated=False)),
        ("a preemption sweep", sweep_curves(recs, case="preemption", simulated=False)),
        ("step prices for the simulated sweeps", any(r["case"] == "step_cost" for r in recs)),
        ("the copy ceiling the roofline needs", copy_gbps)) if not have]
    if missing:
        out.append(f"No {device} record yet of " + ", ".join(missing[:-1]) + (" or " if len(missing) > 1 else "")
                   + f"{missing[-1]} (`{COMMAND} --cases load preemption` makes the sweeps and prices).")
    return out


def memory_lines(cfg=GPU) -> list[str]:
    """What FP8 storage saves at ``cfg``'s size (default the GPU size, named in the first line):
    the experts' weights and the KV cache per token, in the model's dtype and in FP8 with their scales."""
    elt = 2 if cfg.dtype == "bfloat16" else 4
    experts = cfg.n_layers * cfg.n_experts * 3 * cfg.d_model * cfg.d_expert
    scales = cfg.n_layers * cfg.n_experts * (2 * cfg.d_expert + cfg.d_model) * 4
    kv, kv8 = kv_bytes_per_token(cfg), kv_bytes_per_token(cfg, "fp8_e4m3")
    size = f"{param_count(cfg) / 1e9:.1f} B" if param_count(cfg) >= 1e8 else f"{param_count(cfg):,}"
    return [f"at the size of the {'GPU' if cfg == GPU else 'given'} model ({size} parameters, {cfg.dtype}):",
            f"  experts: {experts * elt / 2**30:.2f} GiB in {cfg.dtype} -> {(experts + scales) / 2**30:.2f} GiB in FP8 "
            f"with scales", f"  KV cache per token: {kv:,} B in {cfg.dtype} -> {kv8:,} B in FP8 with scales; "
            f"a 128k-token context {131_072 * kv / 2**30:.2f} -> {131_072 * kv8 / 2**30:.2f} GiB"]


# ---------------------------------------------------------------------------------------------- quality


def quality_rows(records: Sequence[dict]) -> list[dict]:
    """Each day's logits against day 0's on forced answers: ``{case, day, label, logits_rel_err,
    token_err_p50, top1_agreement, compared_tokens}`` from the records that carry them (one per
    case and day: ``.e2e`` and ``agent_long.ttft_followup``), by case then day."""
    rows = []
    for r in engine_records(records):
        if not (r["case"].endswith(".e2e") or r["case"] == "agent_long.ttft_followup") or not _plain(r):
            continue
        if r.get("logits_rel_err") is None:
            continue
        rows.append({"case": r["case"].split(".")[0], "day": r["day"], "label": r.get("label") or _label(r["day"]),
                     "logits_rel_err": r["logits_rel_err"], "token_err_p50": r.get("token_err_p50"),
                     "top1_agreement": r.get("top1_agreement"), "compared_tokens": r.get("compared_tokens")})
    return sorted(rows, key=lambda x: (x["case"], x["day"]))


def format_quality(records: Sequence[dict]) -> str:
    """:func:`quality_rows` as a plain-text table."""
    rows = quality_rows(records)
    if not rows:
        return "(no quality figures in these records)"
    lines = [f"{'case':11s} {'day':36s} {'pooled err':>10s} {'median token err':>16s} {'top-1 = day 0':>13s} "
             f"{'tokens':>6s}"]
    for r in rows:
        top1 = "-" if r["top1_agreement"] is None else f"{r['top1_agreement']:.1%}"
        p50 = "-" if r["token_err_p50"] is None else f"{r['token_err_p50']:.2%}"
        lines.append(f"{r['case']:11s} {r['label'][:36]:36s} {r['logits_rel_err']:10.2%} {p50:>16s} {top1:>13s} "
                     f"{r['compared_tokens'] or 0:>6d}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- targets (report)

#: The H200 goals of the day-0-to-day-14 story, for the bench report: (what, how it is measured, the goal).
TARGETS = (
    ("agent follow-up TTFT, day 0 / day 14", "agent_long.ttft_followup at 128k context", 20.0),
    ("decode tokens/s, day 14 / day 0", "agent_long.decode at 128k context, each day's batch", 5.0),
    ("FP8 KV paged decode vs bf16 (CUDA graphs)", "B=32, 128k context, per-token scales", 1.8),
    ("FP8 KV paged decode, share of copy bandwidth (%)", "bytes the FP8 kernel must read", 80.0),
    ("FP8 fused MoE decode vs bf16 (CUDA graphs)", "E=128, k=8, d=2048, f=768, T=64", 1.6),
    ("FP8 fused MoE prefill vs bf16", "same experts, T=16384", 1.3),
    ("FP8 fused MoE prefill vs torch._scaled_grouped_mm", "same experts, T=16384", 1.0),
    ("random model top-1 = day 0, bf16 kernel days (%, lowest)", "days 1-6, every case", 99.0),
)


def _find(records, suite, case, impl):
    hits = [r for r in records if r.get("suite") == suite and r.get("case") == case and r.get("impl") == impl]
    return hits[-1] if hits else None


def target_rows(records: Sequence[dict]) -> list[dict]:
    """One row per :data:`TARGETS` entry, read from bench records (suites ``engine``, ``kvcache``,
    ``moe``): ``{target, measured_on, goal, value, met}``; ``value`` and ``met`` are ``None`` where
    the records lack the measurement or its two records were not made the same way (the FP8 day
    counts as day 14: the last of the waterfall)."""
    rs = list(records)
    cases = by_case(rs)

    def ratio(recs, num_day, den_day, field="ms"):
        a, b = recs.get(num_day), recs.get(den_day)
        if a is None or b is None:
            return None
        try:
            return day_ratio(a, b, field=field)
        except ValueError:
            return None

    last = max((d for c in cases.values() for d in c), default=None)
    decode = _decode_records(cases)
    kv = "fp8_decode_B32_L131072_Hq32_Hkv8_D128_p16"
    moe64, moe16k = "fp8_E128_k8_d2048_f768_T64", "fp8_E128_k8_d2048_f768_T16384"

    def speedup(suite, case, mine, other):
        a, b = _find(rs, suite, case, mine), _find(rs, suite, case, other)
        return b["ms"] / a["ms"] if a and b else None

    fp8_kv = _find(rs, "kvcache", kv, "triton_fp8_token_cudagraph")
    top1 = [r["top1_agreement"] for r in quality_rows(rs) if 1 <= r["day"] <= 6 and r["top1_agreement"] is not None]
    dec = ratio(decode, last, 0, field="decode_tok_s") if last is not None else None
    values = [
        ratio(cases.get("agent_long.ttft_followup", {}), 0, last) if last is not None else None,
        dec,
        speedup("kvcache", kv, "triton_fp8_token_cudagraph", "triton_bf16_cudagraph"),
        fp8_kv.get("pct_of_ceiling") if fp8_kv else None,
        speedup("moe", moe64, "triton_fp8_cudagraph", "triton_bf16_cudagraph"),
        speedup("moe", moe16k, "triton_fp8", "triton_bf16"),
        speedup("moe", moe16k, "triton_fp8", "torch_scaled_grouped_mm"),
        100 * min(top1) if top1 else None,
    ]
    return [{"target": t, "measured_on": m, "goal": g, "value": v, "met": None if v is None else v >= g}
            for (t, m, g), v in zip(TARGETS, values)]


def format_targets(records: Sequence[dict]) -> str:
    """:func:`target_rows` as a plain-text table."""
    lines = [f"{'goal':55s} {'wanted':>7s} {'measured':>9s}  met"]
    for r in target_rows(records):
        v = "-" if r["value"] is None else f"{r['value']:.3g}"
        met = "-" if r["met"] is None else ("yes" if r["met"] else "NO")
        lines.append(f"{r['target'][:55]:55s} {r['goal']:>7.3g} {v:>9s}  {met}")
    return "\n".join(lines)


def _component(r: dict) -> str:
    return r["component"] + ("" if r["layer"] is None else f", layer {r['layer']}")


def format_breakdown(rows: list) -> str:
    """The rows of :func:`minimax_lab.engine.quality.fp8_breakdown` as a plain-text table."""
    lines = [f"{'in FP8':22s} {'pooled err':>10s} {'token p50':>9s} {'token max':>9s} {'top-1':>6s} "
             f"{'selections changed':>19s} {'closest margin':>14s} {'err, selections kept':>21s}"]
    for r in rows:
        margin = "-" if r["closest_margin"] is None else f"{r['closest_margin']:.2%}"
        kept = "-" if r.get("err_selections_kept") is None else f"{r['err_selections_kept']:.2%}"
        lines.append(f"{_component(r):22s} {r['logits_rel_err']:10.2%} {r['token_err_p50']:9.2%} {r['token_err_max']:9.2%} "
                     f"{r['top1_agreement']:6.0%} {r['selection_flips']:>8d} of {r['selections']:<8d} {margin:>14s} "
                     f"{kept:>21s}")
    return "\n".join(lines)


def breakdown_lines(rows: list) -> list[str]:
    """What the rows of :func:`minimax_lab.engine.quality.fp8_breakdown` show, every number and comparison word computed from
    them: how close the changed selections were, and for each component that changed any whether
    keeping the full-precision selections removes its error (the flips carry it) or not (the
    rounding itself does)."""
    flipped = [r for r in rows if r["selection_flips"] and r.get("err_selections_kept") is not None]
    if not flipped:
        return ["No FP8 component changed an MSA selection here: the error is the rounding's own."]
    lo = min(r["closest_margin"] for r in flipped if r["closest_margin"] is not None)
    hi = max(r["widest_margin"] for r in flipped if r["widest_margin"] is not None)
    span = f"{lo:.2%}" if f"{lo:.2%}" == f"{hi:.2%}" else f"{lo:.2%} to {hi:.2%}"
    out = [f"Every selection that changed had two blocks within {span} of each other in full precision."]
    for r in flipped:
        err, kept = r["logits_rel_err"], r["err_selections_kept"]
        if not err > 0:
            n = r["selection_flips"]
            out.append(f"{_component(r)}: {n} selection{'s' if n > 1 else ''} changed and the answers' logits did not "
                       "move: the change did not reach them.")
            continue
        moved = words.change(100 * err, max(100 * kept, 1e-6), unit="%", digits=3)
        verdict = ("the flipped selections, not the rounding, carry the error" if kept < 0.5 * err else
                   "the rounding itself carries most of the error, not the flips")
        out.append(f"{_component(r)}: with the full-precision selections kept, its pooled error {moved}: {verdict}.")
    return out
