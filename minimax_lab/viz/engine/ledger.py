"""What each switch buys under load, and the FP8 verdict: a ledger of the load sweep per day (the
highest rate it sustains, its peak goodput, and p50/p99 TTFT and inter-token latency at a light
load, each with the range of its repeats) with a sentence per switch that calls a change only
where the two days' ranges do not overlap; the context from which FP8 pays, from the step prices;
and one sentence on what the FP8 day buys and costs on a GPU, from its records.
"""
from __future__ import annotations

import statistics
from typing import Sequence

from minimax_lab.engine.clock import StepShape
from minimax_lab.engine.config import GPU, kv_bytes_per_token
from minimax_lab.notebook import words
from minimax_lab.viz.engine.load import sweep_curves
from minimax_lab.viz.engine.records import (METRICS, TIMED, _label, _short, beyond_spread, by_device, change,
                                            day_values, versions)

FP8_DAY = 7
#: (key, title, unit, True when larger is better) of the sweep ledger
LEDGER = (("peak_goodput", "peak goodput", "requests/s", True), ("ttft_p50_ms", "TTFT p50", "ms", False),
          ("ttft_p99_ms", "TTFT p99", "ms", False), ("itl_p50_ms", "ITL p50", "ms", False),
          ("itl_p99_ms", "ITL p99", "ms", False))


def _ref_rate(curves: dict) -> float:
    rates = sorted({r["rate"] for rows in curves.values() for r in rows})
    return 1.0 if 1.0 in rates else rates[0]


def sweep_ledger(records: Sequence[dict], *, case: str = "load") -> list[dict]:
    """One row per day of the simulated sweep: ``{day, rate, <key>: [one value per repeat]}`` for
    each of :data:`LEDGER` -- the largest goodput over the rates, and the latencies at the light
    load ``rate`` (1 request/s where swept) -- and ``cached_share``, the share of prompt tokens the
    prefix cache served at that rate."""
    curves = sweep_curves(records, case=case, simulated=True)
    if not curves:
        return []
    ref = _ref_rate(curves)
    out = []
    for (day, policy, _), rows in curves.items():
        n = min(len(r.get("repeats") or [r]) for r in rows)
        reps = lambda r: (r.get("repeats") or [r])[:n]  # noqa: E731
        at = next(r for r in rows if r["rate"] == ref)
        row = {"day": day, "policy": policy, "rate": ref,
               "peak_goodput": [max(reps(r)[i]["goodput_rps"] or 0.0 for r in rows) for i in range(n)]}
        for key in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "cached_share"):
            row[key] = [x[key] for x in reps(at) if x.get(key) is not None]
        out.append(row)
    return out


def _fmt(vals: list, unit: str) -> str:
    if not vals:
        return "-"
    med, lo, hi = statistics.median(vals), min(vals), max(vals)
    f = (lambda x: f"{x:,.0f}") if hi >= 100 else (lambda x: f"{x:.3g}")
    return f(med) if lo == hi else f"{f(med)} ({f(lo)}-{f(hi)})"


def format_ledger(rows: list) -> str:
    """:func:`sweep_ledger` as a plain-text table: medians, the repeats' range in brackets."""
    if not rows:
        return "(no simulated sweep)"
    rate = rows[0]["rate"]
    cols = [("peak goodput (req/s)", 22), ("TTFT p50 (ms)", 20), ("TTFT p99 (ms)", 20), ("ITL p50 (ms)", 20),
            ("ITL p99 (ms)", 20), ("from cache", 11)]
    lines = [f"{'':36s}" + "".join(f"{c:>{w}s}" for c, w in cols),
             f"{'':36s}{'':>22s}{'-- each at ' + f'{rate:g} request/s arriving --':^91s}"]
    for row in rows:
        cached = f"{statistics.median(row['cached_share']):.0%}" if row.get("cached_share") else "-"
        cells = [_fmt(row[k], u) for k, _, u, _ in LEDGER] + [cached]
        lines.append(f"{_label(row['day'])[:36]:36s}" + "".join(f"{c:>{w}s}" for c, (_, w) in zip(cells, cols)))
    return "\n".join(lines)


def _apart(a: list, b: list) -> bool:
    """The two days' repeats do not overlap (with one repeat each: they differ by more than 3%)."""
    if len(a) >= 2 and len(b) >= 2:
        return max(a) < min(b) or max(b) < min(a)
    return abs(statistics.median(b) / statistics.median(a) - 1) > 0.03


def ledger_sentences(rows: list) -> list[str]:
    """One sentence per day after the first: what its switch buys and costs under load -- only the
    changes larger than the spread of both days' repeats -- and what stays inside it."""
    out = []
    for prev, row in zip(rows, rows[1:]):
        buys, costs, level = [], [], []
        for key, title, unit, hb in LEDGER:
            a, b = prev[key], row[key]
            if not a or not b:
                continue
            ma, mb = statistics.median(a), statistics.median(b)
            if ma <= 0 or mb <= 0:
                if ma != mb:
                    (buys if (mb > ma) == hb else costs).append(f"{title} {'from none to' if ma <= 0 else 'to none from'} "
                                                              f"{max(ma, mb):.3g} {unit}")
                continue
            if not _apart(a, b):
                level.append(title)
                continue
            if unit == "ms" and max(ma, mb) >= 1000:          # no "1.95e+03 ms"
                ma, mb, unit = ma / 1e3, mb / 1e3, "s"
            text = f"{title} {words.change(ma, mb, unit=unit, same_within=0.0)}"
            (buys if (mb > ma) == hb else costs).append(text)
        line = f"{_label(row['day'])}: buys{': ' + '; '.join(buys) if buys else ' nothing beyond the spread'}"
        line += f"; costs: {'; '.join(costs)}" if costs else ""
        line += f" (inside the spread: {', '.join(level)})." if level else "."
        out.append(line)
    return out


# ---------------------------------------------------------------------------------------------- FP8


def fp8_choice_line(records: Sequence[dict]) -> str:
    """What the FP8 day of a simulated sweep stored in FP8, and why: the time its candidates' prices
    give the sweep's requests' own steps (first repeat), and whether the pool fills."""
    r = next((x for x in records if x.get("day") == FP8_DAY and x.get("fp8_choice")), None)
    if r is None:
        return "The FP8 day was not in this sweep."
    why = r["fp8_choice"]
    names = {"none": "nothing", "kv+experts": "the KV cache and the experts", "kv": "the KV cache alone",
             "experts": "the experts alone"}
    times = ", ".join(f"{t / 1e3:.3g} s with {names.get(c, c)} in FP8" + (" (day 6)" if c == "none" else "")
                      for c, t in why["candidates_ms"].items())
    chosen = names.get(why["chosen"], why["chosen"])
    pool = ("the pool fills in the model's dtype, so only candidates with an FP8 KV cache competed"
            if why["pool_fills"] else "the pool does not fill")
    return f"The FP8 day stores {chosen} in FP8 here: the requests' own steps cost {times}; {pool}."


def _said(where: str, L) -> str:
    if where == "above":
        return f"costs less than day 6's from {L:,.0f} tokens of context per sequence on"
    if where == "below":
        return f"costs less than day 6's only below {L:,.0f} tokens of context per sequence"
    return {"always": "costs less than day 6's at every context", "never": "costs more than day 6's at every context"}[where]


def fp8_break_even(before, after, *, batch: int = 32) -> tuple:
    """Where a decode step of ``batch`` sequences costs less at the ``after`` price (FP8) than at
    ``before`` (:class:`~minimax_lab.engine.clock.StepCost`): ``("above", L)`` -- from ``L`` tokens of
    context per sequence on; ``("below", L)``; ``("always", None)`` or ``("never", None)``."""
    def cost(c, ctx):
        return c.ms(StepShape(decodes=batch, attended=batch * ctx))
    d0 = cost(after, 0) - cost(before, 0)                               # at no context
    slope = (cost(after, 1_000_000) - cost(before, 1_000_000) - d0) / 1e6  # per token of context
    if slope == 0:
        return ("always", None) if d0 < 0 else ("never", None)
    L = -d0 / slope
    if L <= 0:
        return ("always", None) if slope < 0 else ("never", None)
    return ("above", L) if slope < 0 else ("below", L)


def _median_cost(costs: list):
    key = lambda c: c.ms(StepShape(decodes=32, attended=32 * 8192))  # noqa: E731
    return sorted(costs, key=key)[len(costs) // 2]


def fp8_threshold_lines(prices) -> list[str]:
    """Where FP8 pays per decode step, from ``prices`` (:class:`~minimax_lab.bench.suite_engine_prices.Prices`):
    the FP8 day's stores against day 6's, and each store alone where priced; empty where day 6 or
    the FP8 day is not priced."""
    if prices is None or not {6, FP8_DAY} <= set(prices.by_day):
        return []
    base = _median_cost(prices.by_day[6])
    cands = [("KV cache and experts in FP8", prices.by_day[FP8_DAY])]
    cands += [(name, prices.variants[key]) for key, name in (("fp8_kv", "the KV cache alone in FP8"),
                                                              ("fp8_experts", "the experts alone in FP8"))
              if prices.variants.get(key)]
    out = []
    for name, costs in cands:
        c = _median_cost(costs)
        per_m = (c.attend_ms_per_mpair, base.attend_ms_per_mpair)
        out.append(f"{name}: a decode step of 32 sequences {_said(*fp8_break_even(base, c))} (a million tokens of "
                   f"context read cost {per_m[0]:.3g} ms against {per_m[1]:.3g} ms)")
    return out


def _fp8_set(records: Sequence[dict]):
    """``(device, its records)`` of the GPU run that holds both day 6 and the FP8 day, newest recording first."""
    for device, recs in by_device(records).items():
        if any(r.get("interpreter") for r in recs):
            continue
        v = day_values(recs)
        if any(6 in v[k] and FP8_DAY in v[k] for k in TIMED):
            return device, recs
    return None, []


def fp8_verdict(records: Sequence[dict]) -> str:
    """One sentence: on the GPU whose records hold day 6 and the FP8 day, which recorded times the
    FP8 day wins and which it loses (only changes larger than the repeats' spread, or 3% for values
    measured once), with the device and versions, and the memory it saves."""
    device, recs = _fp8_set(records)
    if device is None:
        return "No GPU record holds both day 6 and the FP8 day yet."
    v = day_values(recs)
    wins, losses, level = [], [], []
    for key, title, unit, hb in METRICS:
        a, b = v[key].get(6), v[key].get(FP8_DAY)
        if key not in TIMED or a is None or b is None or change(a, b, hb)[0] is None:
            continue
        g = change(a, b, hb)[0]
        apart = beyond_spread(a, b)
        if apart is False or (apart is None and abs(g - 1) <= 0.03):
            level.append(title)
            continue
        text = f"{title} {fmt(b[0], unit)} against {fmt(a[0], unit)}"
        (wins if g > 1 else losses).append(text)
    r7 = next((x[1] for x in (v["memory"].get(FP8_DAY), v["ttft_first"].get(FP8_DAY), v["itl"].get(FP8_DAY)) if x), {})
    r6 = next((x[1] for x in (v["memory"].get(6), v["ttft_first"].get(6), v["itl"].get(6)) if x), {})
    chosen = _stores(r7)
    head = f"On the {device} ({versions(r7 or r6)}), the FP8 day ({chosen})"
    if losses and not wins:
        body = (f" is slower than day 6 on every recorded time that moved more than its spread (3% where measured "
                f"once): {'; '.join(losses)}")
    elif wins and not losses:
        body = (f" is faster than day 6 on every recorded time that moved more than its spread (3% where measured "
                f"once): {'; '.join(wins)}")
    elif wins:
        body = f" wins {'; '.join(wins)}, and loses {'; '.join(losses)}"
    else:
        body = " is level with day 6 on every recorded time"
    mem = ""
    if r6.get("weights_gib") and r7.get("weights_gib"):
        kv, kv8 = kv_bytes_per_token(GPU), kv_bytes_per_token(GPU, "fp8_e4m3")
        kv_said = (f", KV {kv:,} -> {kv8:,} bytes per token" if (r7.get("options") or {}).get("kv_dtype") else "")
        mem = (f"; it holds its weights in {r7['weights_gib']:.2f} GiB against {r6['weights_gib']:.2f} GiB"
               f"{kv_said}")
    lev = f" (level: {', '.join(level)})" if level else ""
    return head + body + lev + mem + "."


def _stores(r: dict) -> str:
    opts = r.get("options") or {}
    stores = [n for k, n in (("kv_dtype", "KV cache"), ("expert_dtype", "experts")) if opts.get(k)]
    return ("its " + " and ".join(stores) + " in FP8") if stores else "nothing in FP8: it did not pay at these shapes"


def fmt(v: float, unit: str) -> str:
    return f"{v:,.0f} {unit}" if v >= 1000 else f"{v:.3g} {unit}"
