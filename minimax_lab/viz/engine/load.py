"""The engine under load: p50 and p99 TTFT and inter-token latency, goodput and the share of
requests meeting the SLO as the arrival rate rises, one curve per day (the ``load`` sweep) or per
day and memory policy (the ``preemption`` sweep), the range of the repeats as error bars; how each
sweep was made, and what each curve sustains, in computed words.
"""
from __future__ import annotations

import statistics
from typing import Sequence

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np

from minimax_lab.notebook import words
from minimax_lab.viz.engine.records import _label, _short, engine_records, no_record


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
    order = lambda k: (k[0], list(POLICY).index(k[1]) if k[1] in POLICY else len(POLICY), k[2])  # noqa: E731
    return {k: sorted(out[k], key=lambda r: r["rate"]) for k in sorted(out, key=order)}


POLICY = {"reserve": "reserve up front", "recompute": "preempt: recompute", "swap": "preempt: swap"}


def curve_label(key: tuple, curves: dict, by: str = "day") -> str:
    """A curve's name: its day (``by="day"``), its policy, or both where the curves span several days."""
    day, policy, sim = key
    days = {k[0] for k in curves}
    name = _label(day) if by == "day" else POLICY.get(policy, policy)
    if by != "day" and len(days) > 1:
        name = f"{_short(day)}, {name}"
    if len({k[2] for k in curves}) > 1:
        name += " (simulated)" if sim else " (wall clock)"
    return name


def spread(rows: list, key: str) -> tuple:
    """``(median, low, high)`` arrays of ``key`` over each row's repeats (the row's own value where
    it holds none); NaN where missing."""
    med, lo, hi = [], [], []
    for r in rows:
        vals = [x[key] for x in r.get("repeats") or () if x.get(key) is not None] or (
            [r[key]] if r.get(key) is not None else [])
        med.append(r[key] if r.get(key) is not None else (statistics.median(vals) if vals else np.nan))
        lo.append(min(vals) if vals else np.nan)
        hi.append(max(vals) if vals else np.nan)
    return np.array(med, float), np.array(lo, float), np.array(hi, float)


def _attain(rows: list) -> float:
    return (rows[0].get("slo") or {}).get("attain", 0.9)


#: (metric, panel title, y label, log scale)
PANELS = (("ttft_p50_ms", "TTFT, p50", "ms (log)", True), ("ttft_p99_ms", "TTFT, p99", "ms (log)", True),
          ("goodput_rps", "goodput: requests/s meeting the SLO", "requests/s (log)", True),
          ("itl_p50_ms", "inter-token latency, p50", "ms (log)", True),
          ("itl_p99_ms", "inter-token latency, p99", "ms (log)", True),
          ("slo_attainment", "share of requests meeting the SLO", "%", False))
_MARKERS = "osD^vP*Xh<>"


def plot_sweep(records: Sequence[dict], *, case: str = "load", by: str = "day", simulated: bool | None = None,
               axes=None, title: str = ""):
    """Six panels against the arrival rate (log): p50 and p99 TTFT, goodput, p50 and p99
    inter-token latency, and the share of requests meeting the SLO (the share that counts as
    sustained dotted) -- one curve per day (or, ``by="policy"``, per day and policy), each point the
    median of the repeats with their range as an error bar. ``axes``: six axes. Returns the axes;
    raises ``ValueError`` when there is no sweep record to draw."""
    curves = sweep_curves(records, case=case, simulated=simulated)
    if not curves:
        raise ValueError(f"no {case} sweep records to draw: {no_record(case)}")
    own = axes is None
    if own:
        fig, grid = plt.subplots(2, 3, figsize=(15, 7.4))
        axes = grid.ravel()
    axes = list(axes)
    colors = [plt.get_cmap("tab10")(i % 10) for i in range(len(curves))]
    for i, (key, rows) in enumerate(curves.items()):
        rate = np.array([r["rate"] for r in rows], float)
        style = dict(marker=_MARKERS[i % len(_MARKERS)], ms=4, lw=1.2, color=colors[i], capsize=2, elinewidth=0.8,
                     mfc="none" if i % 2 else colors[i], label=curve_label(key, curves, by))
        for ax, (metric, *_rest) in zip(axes, PANELS):
            med, lo, hi = spread(rows, metric)
            scale = 100 if metric == "slo_attainment" else 1
            ax.errorbar(rate, med * scale, yerr=[np.clip((med - lo) * scale, 0, None), np.clip((hi - med) * scale, 0, None)],
                        **style)
    for ax, (metric, name, ylabel, log) in zip(axes, PANELS):
        ax.set_xscale("log")
        if log:
            ax.set_yscale("log")
        ax.set_title(name, fontsize=9)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_xlabel("arrival rate (requests/s, log)", fontsize=8)
        ax.tick_params(labelsize=7)
        for axis in (ax.xaxis,) + ((ax.yaxis,) if log else ()):
            axis.set_major_locator(mticker.LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))  # 20, not 2x10^1
            axis.set_minor_formatter(mticker.NullFormatter())
    rows = next(iter(curves.values()))
    slo = rows[0].get("slo") or {}
    good = axes[2]
    lim = [r["rate"] for rs in curves.values() for r in rs]
    good.plot([min(lim), max(lim)], [min(lim), max(lim)], color="0.6", lw=0.8, ls=":", label="every request meets it")
    share = axes[5]
    share.set_ylim(-3, 103)
    share.axhline(100 * _attain(rows), color="0.5", lw=0.8, ls=":")
    share.annotate(f"{_attain(rows):.0%} of requests", (0.02, 100 * _attain(rows)), xycoords=("axes fraction", "data"),
                   xytext=(2, -10), textcoords="offset points", fontsize=7, color="0.4")
    if slo:
        share.set_title(f"meeting the SLO (TTFT <= {_ms(slo['ttft_s'])}, <= {_ms(slo['tpot_s'])} per token)", fontsize=9)
    fig = axes[0].figure
    handles, labels = axes[0].get_legend_handles_labels()
    if own:
        fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False)
        fig.subplots_adjust(bottom=0.11 + 0.035 * ((len(labels) - 1) // 4), hspace=0.45, wspace=0.3)
        heading = title or ("simulated clock, steps priced by " + _prices([r for rs in curves.values() for r in rs])
                            if next(iter(curves))[2] else "")
        if heading:
            fig.suptitle(heading, fontsize=9)
    else:
        axes[0].legend(handles, labels, fontsize=6, loc="upper left")
        if title:
            axes[0].set_title(title, fontsize=9)
    return axes


def _summary(rows: list) -> tuple:
    """(the row of the largest goodput, that goodput)."""
    best = max(rows, key=lambda r: r["goodput_rps"] or 0)
    return best, best["goodput_rps"] or 0.0


def goodput_sentences(records: Sequence[dict], *, case: str = "load", by: str = "day") -> list[str]:
    """Per curve: its peak goodput (the most requests per second that met the SLO, median of the
    repeats), the rate and p99 inter-token latency there, and its preemptions."""
    curves = sweep_curves(records, case=case)
    out = []
    for key, rows in curves.items():
        at, top = _summary(rows)
        n = round(sum(r["preemptions"] for r in rows))
        out.append(f"{curve_label(key, curves, by)}: at most {top:.3g} requests/s meet the SLO (at {at['rate']:g} "
                   f"arriving per second, p99 inter-token latency {at['itl_p99_ms']:.3g} ms); "
                   f"{n} preemption{'' if n == 1 else 's'} over the sweep")
    return out


def curve_comparison(records: Sequence[dict], *, case: str = "load", by: str = "day") -> list[str]:
    """Each curve against the first (the earliest day, or reserving up front): its peak goodput as
    computed comparison words; a curve that repeats an earlier one at every rate is said to."""
    curves = sweep_curves(records, case=case)
    items = list(curves.items())
    if len(items) < 2:
        return []
    name = lambda k: curve_label(k, curves, by)  # noqa: E731
    (k0, rows0), out = items[0], []
    top0 = _summary(rows0)[1]
    for i, (k, rows) in enumerate(items[1:], 1):
        twin = next((kk for kk, rr in items[:i] if _same(rr, rows)), None)
        if twin is not None:
            out.append(f"{name(k)} gives the same numbers as {name(twin)} at every rate")
            continue
        top = _summary(rows)[1]
        out.append(f"{name(k)}: at most {top:.3g} requests/s meet the SLO ({words.more_or_less(top, top0)} {name(k0)})")
    return out


def _same(rows_a: list, rows_b: list) -> bool:
    keys = ("rate", "throughput_tok_s", "ttft_p99_ms", "itl_p99_ms", "slo_attainment")
    return len(rows_a) == len(rows_b) and all(
        all(np.isclose(a[k] or 0, b[k] or 0, rtol=1e-9) for k in keys) for a, b in zip(rows_a, rows_b))


def _prices(rows: list) -> str:
    """What priced the simulated ``rows``: their one label, or each distinct one."""
    return "; ".join(sorted({r.get("prices") or "?" for r in rows}))


def _ms(seconds: float) -> str:
    return f"{seconds:g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


def sweep_lines(records: Sequence[dict], *, case: str = "load") -> list[str]:
    """How a sweep was made, from its records: the arrival process, requests and repeats, the clock
    and what priced its steps, the SLO and how it was set."""
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
        reps = len(r.get("repeats") or ()) or 1
        clock = f"simulated clock, steps priced by {_prices(rows)}" if sim else "the wall clock"
        out.append(f"{arrivals}, {r.get('requests')} requests per rate, {reps} repeat{'s' * (reps > 1)} (each its own "
                   f"requests{', priced by its own measured steps' if r.get('prices_kind') != 'modelled' else ''}); "
                   f"{clock}; SLO: TTFT <= {_ms(slo.get('ttft_s', 0))} and <= {_ms(slo.get('tpot_s', 0))} per output "
                   f"token{how}")
    return out


def plot_preemption(records: Sequence[dict], *, simulated: bool | None = None, axes=None):
    """:func:`plot_sweep` of the ``preemption`` case, one curve per day and policy."""
    recs = [r for r in engine_records(records) if r["case"].startswith("preemption_")]
    return plot_sweep(recs, case="preemption", by="policy", simulated=simulated, axes=axes,
                      title="a pool that fills: reserve up front, or preempt")
