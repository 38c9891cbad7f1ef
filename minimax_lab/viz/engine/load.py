"""The engine under load: throughput against p99 TTFT as the arrival rate rises, p99 inter-token
latency and the share of requests that met the SLO, one curve per day (the ``load`` sweep) or per
memory policy (the ``preemption`` sweep), with how each sweep was made and what each curve sustains
in computed words.
"""
from __future__ import annotations

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
