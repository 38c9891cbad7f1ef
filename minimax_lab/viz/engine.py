"""The engine's pictures and tables, from bench records (suite ``engine``).

* **Days** (:func:`day_table`, :func:`day_ledger`, :func:`plot_days`): each day of
  :data:`minimax_lab.engine.DAYS` flips one switch and keeps the earlier ones, so a day's change
  over the day before is that switch's effect. Shown per day: the first agent turn's TTFT (the
  whole long context prefilled) beside the follow-up turn's, decode tokens/s at the day's batch,
  inter-token latency, memory (weights + KV pool), the logits' error against day 0, and, where
  the day was rehearsed, the first-call cost. A change is computed only between records made the
  same way (:func:`minimax_lab.bench.suite_engine.day_ratio`): a rehearsed day against an
  unrehearsed one says so instead of giving a ratio.
* **Load** (:func:`sweep_curves`, :func:`plot_sweep`, :func:`plot_preemption`): throughput against
  p99 TTFT as the arrival rate rises, one curve per day or per memory policy, and the share of
  requests that met the SLO.
* **Where decode sits** (:func:`decode_points`): each day's decode step as a point on chapter
  00's roofline (FLOPs and bytes of :mod:`minimax_lab.engine.traffic`, the measured step time).
* **A timeline** (:func:`plot_timeline`): the steps of a simulated run, one row per request.
* :func:`plot_gpu_story` -- the recorded GPU run in one figure.

Where no record exists a panel says so, naming the command that makes it.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np

from minimax_lab.bench.suite_engine import MixedRehearsal, day_ratio
from minimax_lab.engine.config import GPU, kv_bytes_per_token
from minimax_lab.engine.options import DAY_LABELS
from minimax_lab.engine.traffic import decode_step_bytes, decode_step_flops
from minimax_lab.notebook import words
from minimax_lab.viz.roofline import plot_roofline

COMMAND = "python -m minimax_lab.bench engine --preset gpu"


def no_record(cases: str = "") -> str:
    """What a panel or table says where no GPU record exists (three short lines)."""
    return f"no H200 record yet: run\n`{COMMAND}\n{'--cases ' + cases if cases else ''}` on a GPU"


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


# ---------------------------------------------------------------------------------------------- days

#: (key, title, unit, True when larger is better)
METRICS = (
    ("ttft_first", "TTFT, first agent turn", "ms", False),
    ("ttft_followup", "TTFT, follow-up agent turn", "ms", False),
    ("decode_tok_s", "decode tokens/s (batch)", "tokens/s", True),
    ("itl", "inter-token latency", "ms", False),
    ("memory", "weights + KV pool", "GiB", False),
)


def _decode_records(cases: dict) -> dict:
    for case in sorted(cases):
        if case == "agent_long.decode" or case.startswith("agent_long.decode_b"):
            return cases[case]
    return {}


def day_values(records: Sequence[dict]) -> dict:
    """``{metric key: {day: (value, record)}}`` for :data:`METRICS`, and ``"batch": {day: B}``."""
    cases = by_case(records)
    out: dict = {k: {} for k, *_ in METRICS}
    out["batch"] = {}
    for key in ("ttft_first", "ttft_followup"):
        for day, r in cases.get(f"agent_long.{key}", {}).items():
            out[key][day] = (r["ms"], r)
    for day, r in _decode_records(cases).items():
        if r.get("decode_tok_s"):
            out["decode_tok_s"][day] = (r["decode_tok_s"], r)
            out["batch"][day] = r.get("decode_batch")
    for case in ("agent.itl", "chat.itl"):
        if cases.get(case):
            out["itl"] = {day: (r["ms"], r) for day, r in cases[case].items()}
            break
    for case in ("agent_long.ttft_followup", "agent.e2e", "chat.e2e"):
        mem = {day: (r["weights_gib"] + r["kv_cache_gib"], r) for day, r in cases.get(case, {}).items()
               if r.get("weights_gib") is not None and r.get("kv_cache_gib") is not None}
        if mem:
            out["memory"] = mem
            break
    return out


def change(prev, cur, higher_better: bool) -> tuple:
    """``(gain, note)`` of ``cur`` over ``prev`` (each ``(value, record)``): gain > 1 is better; None
    with a note when either is missing or the two were not recorded the same way."""
    if prev is None or cur is None:
        return None, ""
    try:
        day_ratio(prev[1], cur[1])
    except MixedRehearsal:
        return None, "mixed rehearsal"
    a, b = prev[0], cur[0]
    return (b / a if higher_better else a / b), ""


def day_table(records: Sequence[dict]) -> str:
    """One row per day: first and follow-up TTFT, decode tokens/s and its batch, ITL, memory,
    logits error against day 0, whether rehearsed, and the first-call TTFTs where rehearsed."""
    v = day_values(records)
    days = sorted({d for k, *_ in METRICS for d in v[k]})
    if not days:
        return "(no engine records)"
    fmt = lambda x: "-" if x is None else f"{x:,.4g}"  # noqa: E731
    head = (f"{'day':36s} {'TTFT first':>11s} {'follow-up':>10s} {'decode tok/s':>13s} {'ITL ms':>8s} "
            f"{'memory':>9s} {'err vs d0':>9s} {'rehearsed':>9s} {'first call: TTFT first / follow-up':>35s}")
    lines = [head]
    for d in days:
        get = lambda k: v[k].get(d, (None, None))[0]  # noqa: E731
        rec = next((v[k][d][1] for k, *_ in METRICS if d in v[k]), {})
        err = rec.get("logits_rel_err")
        first = (rec.get("first_call_ttft_first_ms"), rec.get("first_call_ttft_followup_ms"))
        dec = get("decode_tok_s")
        dec_s = "-" if dec is None else f"{dec:,.4g} (B={v['batch'].get(d)})"
        first_s = "-" if first[0] is None else f"{first[0]:,.4g} / {fmt(first[1])} ms"
        mem = get("memory")
        mem_s = "-" if mem is None else (fmt_value(mem * 1024, "MiB") if mem < 1 else fmt_value(mem, "GiB"))
        lines.append(f"{_label(d)[:36]:36s} {fmt(get('ttft_first')):>11s} {fmt(get('ttft_followup')):>10s} "
                     f"{dec_s:>13s} {fmt(get('itl')):>8s} {mem_s:>9s} "
                     f"{'-' if err is None else f'{err:.2%}':>9s} {str(bool(rec.get('rehearsed'))):>9s} {first_s:>35s}")
    return "\n".join(lines)


def day_ledger(records: Sequence[dict]) -> list[str]:
    """One sentence per day after the first: what its switch changed on every metric, better and
    worse, the words computed from the numbers (ms in the table, ``words.change``)."""
    v = day_values(records)
    days = sorted({d for k, *_ in METRICS for d in v[k]})
    out = []
    for prev, d in zip(days, days[1:]):
        buys, costs = [], []
        unrehearsed_pair = False
        for key, title, unit, hb in METRICS:
            a, b = v[key].get(prev), v[key].get(d)
            if a is None or b is None:
                continue
            g, note = change(a, b, hb)
            seconds = unit == "ms" and max(a[0], b[0]) >= 1000
            x, y, u = (a[0] / 1e3, b[0] / 1e3, "s") if seconds else (a[0], b[0], unit)
            text = f"{title} {words.change(x, y, unit=u, digits=4 if max(x, y) >= 1000 else 3)}"
            if not (a[1].get("rehearsed") and b[1].get("rehearsed")):
                unrehearsed_pair = True
            if note:
                costs.append(f"{title}: not compared ({note})")
            elif g is not None and g > 1.03:
                buys.append(text)
            elif g is not None and g < 1 / 1.03:
                costs.append(text)
        note = " (Not rehearsed: these times may include compiling kernels.)" if unrehearsed_pair else ""
        out.append(f"{_label(d)}: buys " + ("; ".join(buys) or "nothing measurable here") + ". Costs: "
                   + ("; ".join(costs) or "nothing measured") + "." + note)
    return out


def plot_days(records: Sequence[dict], *, device: str = "NVIDIA H200", axes=None):
    """Bars per day for the first four :data:`METRICS` (first-turn TTFT beside follow-up TTFT,
    decode tokens/s labelled with its batch, ITL), log axes, each bar labelled with its value and
    its change over the day before (or why there is none). Returns the axes."""
    v = day_values(records)
    days = sorted({d for k, *_ in METRICS for d in v[k]})
    axes = axes if axes is not None else plt.subplots(1, 4, figsize=(16, 3.8), sharey=True)[1]
    y = np.arange(len(days))[::-1]
    for ax, (key, title, unit, hb) in zip(axes, METRICS[:4]):
        vals = [v[key].get(d) for d in days]
        if not any(vals):
            ax.text(0.5, 0.5, no_record("chat agent agent_long"), transform=ax.transAxes, ha="center", va="center",
                    fontsize=7, wrap=True)
            ax.set_title(title, fontsize=9)
            continue
        xs = [x[0] if x else 0 for x in vals]
        ax.barh(y, xs, color="tab:blue", alpha=0.75)
        ax.set_xscale("log")
        for i, (yy, x) in enumerate(zip(y, vals)):
            if x is None:
                continue
            g, note = change(vals[i - 1], x, hb) if i else (None, "")
            tag = f"  x{g:.2f}" if g is not None else (f"  ({note})" if note else "")
            batch = f", B={v['batch'].get(days[i])}" if key == "decode_tok_s" else ""
            ax.text(x[0], yy, f" {fmt_value(x[0], unit)}{batch}{tag}", va="center", fontsize=7)
        ax.set_xlim(min(x for x in xs if x) / 2, max(xs) * 3000)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(f"{unit}, {device} ({'higher' if hb else 'lower'} is better)", fontsize=8)
    axes[0].set_yticks(y, [_label(d) for d in days], fontsize=8)
    return axes


# ---------------------------------------------------------------------------------------------- load


def sweep_curves(records: Sequence[dict], *, case: str = "load", simulated: bool | None = None) -> dict:
    """``{(day, policy): [record, ...] sorted by rate}`` of the ``load`` or ``preemption`` sweep
    records; ``simulated`` picks the simulated or the wall-clock ones (None: both)."""
    out: dict = {}
    for r in engine_records(records):
        if not r["case"].startswith(f"{case}_") or r.get("rate") is None:
            continue
        sim = r.get("clock") == "simulated"
        if simulated is not None and sim != simulated:
            continue
        out.setdefault((r["day"], r.get("policy", "reserve"), sim), []).append(r)
    return {k: sorted(v, key=lambda r: r["rate"]) for k, v in sorted(out.items())}


def _curve_label(day: int, policy: str, sim: bool, by: str) -> str:
    name = _label(day) if by == "day" else {"reserve": "reserve up front"}.get(policy, f"preempt: {policy}")
    return name + (" (simulated)" if sim else "")


def plot_sweep(records: Sequence[dict], *, case: str = "load", by: str = "day", simulated: bool | None = None,
               axes=None, title: str = ""):
    """Two panels: throughput against p99 TTFT (one curve per day, or per policy with
    ``by="policy"``, each point one arrival rate) and the share of requests meeting the SLO
    against the rate. Returns the axes."""
    curves = sweep_curves(records, case=case, simulated=simulated)
    axes = axes if axes is not None else plt.subplots(1, 2, figsize=(13, 4))[1]
    ax, ax2 = axes
    if not curves:
        for a in axes:
            a.text(0.5, 0.5, no_record(case), transform=a.transAxes, ha="center", va="center", fontsize=8)
        return axes
    for (day, policy, sim), rows in curves.items():
        label = _curve_label(day, policy, sim, by)
        line, = ax.plot([r["throughput_tok_s"] for r in rows], [r["ttft_p99_ms"] for r in rows], "o-", label=label,
                        ms=4)
        ax2.plot([r["rate"] for r in rows], [100 * r["slo_attainment"] for r in rows], "o-", color=line.get_color(),
                 label=label, ms=4)
    any_row = next(iter(curves.values()))[0]
    slo = any_row.get("slo") or {}
    ax.set_yscale("log")
    ax.set_xlabel("throughput (generated tokens/s)")
    ax.set_ylabel("p99 time to first token (ms, log)")
    ax.set_title(title or "throughput against tail latency, rate rising along each curve", fontsize=9)
    ax2.set_xscale("log")
    ax2.set_xlabel("arrival rate (requests/s, log)")
    ax2.set_ylabel("requests meeting the SLO (%)")
    if slo:
        ax2.set_title(f"SLO: TTFT <= {slo['ttft_s'] * 1e3:.3g} ms, per token <= {slo['tpot_s'] * 1e3:.3g} ms",
                      fontsize=9)
    ax2.axhline(90, color="0.6", lw=0.8, ls=":")
    ax.legend(fontsize=7)
    return axes


def goodput_sentences(records: Sequence[dict], *, case: str = "load", by: str = "day") -> list[str]:
    """Per curve: the highest swept rate at which 90% of requests met the SLO, and the throughput
    at the highest rate (the curve's ceiling)."""
    out = []
    for (day, policy, sim), rows in sweep_curves(records, case=case).items():
        ok = [r["rate"] for r in rows if r["slo_attainment"] >= 0.9]
        best = max(rows, key=lambda r: r["throughput_tok_s"] or 0)
        kept = f"keeps the SLO up to {max(ok):.3g} requests/s" if ok else "meets the SLO at no swept rate"
        out.append(f"{_curve_label(day, policy, sim, by)}: {kept}; at most {best['throughput_tok_s']:,.0f} "
                   f"tokens/s; {sum(r['preemptions'] for r in rows)} preemptions over the sweep")
    return out


def curve_comparison(records: Sequence[dict], *, case: str = "load", by: str = "day") -> list[str]:
    """Each curve against the first (the earliest day, or reserving up front): the highest rate at
    which it keeps the SLO and its throughput ceiling, as computed comparison words."""
    curves = sweep_curves(records, case=case)
    if by == "policy":
        curves = dict(sorted(curves.items(), key=lambda kv: kv[0][1] != "reserve"))
    items = list(curves.items())
    if len(items) < 2:
        return []

    def summary(rows):
        ok = [r["rate"] for r in rows if r["slo_attainment"] >= 0.9]
        return (max(ok) if ok else None), max(r["throughput_tok_s"] or 0 for r in rows)

    (k0, rows0), out = items[0], []
    rate0, top0 = summary(rows0)
    name0 = _curve_label(*k0, by)
    for k, rows in items[1:]:
        rate, top = summary(rows)
        if rate and rate0:
            kept = f"keeps the SLO up to {rate:.3g} requests/s ({words.more_or_less(rate, rate0)} {name0})"
        elif rate:
            kept = f"keeps the SLO up to {rate:.3g} requests/s ({name0} at no swept rate)"
        else:
            kept = "keeps the SLO at no swept rate"
        out.append(f"{_curve_label(*k, by)} {kept} and tops out at {top:,.0f} tokens/s "
                   f"({words.more_or_less(top, top0)} {name0})")
    return out


def plot_preemption(records: Sequence[dict], *, day: int | None = None, simulated: bool | None = None, axes=None):
    """:func:`plot_sweep` of the ``preemption`` case for one day (default: the first found), one
    curve per policy."""
    recs = [r for r in engine_records(records) if r["case"].startswith("preemption_")]
    if day is None and recs:
        day = min(r["day"] for r in recs)
    recs = [r for r in recs if r["day"] == day]
    return plot_sweep(recs, case="preemption", by="policy", simulated=simulated, axes=axes,
                      title=f"{_label(day) if day is not None else ''}: reserve up front vs preemption")


# ---------------------------------------------------------------------------------------------- roofline


def decode_points(records: Sequence[dict]) -> list[dict]:
    """Each day's decode step as a roofline point ``{label, intensity, tflops, gbps, day, batch}``:
    FLOPs and bytes from the record (or, for a record without them, computed for the GPU-size
    model at the record's batch and context), TFLOP/s and GB/s from its step time."""
    out = []
    for day, r in sorted(_decode_records(by_case(records)).items()):
        batch, ms = r.get("decode_batch"), r.get("ms")
        if not batch or not ms:
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


def plot_decode_roofline(records: Sequence[dict], *, copy_gbps: float | None, gemm_tflops: float | None,
                         device: str = "NVIDIA H200", ax=None):
    """:func:`decode_points` on chapter 00's roofline of ``device``; a note where anything is missing."""
    ax = ax if ax is not None else plt.subplots(figsize=(8, 4))[1]
    pts = decode_points(records)
    if not pts or not copy_gbps or not gemm_tflops:
        ax.text(0.5, 0.5, no_record("agent_long") if not pts else "no recorded ceilings (suite ceilings)",
                transform=ax.transAxes, ha="center", va="center", fontsize=8)
        return ax
    plot_roofline([{"label": device, "copy_gbps": copy_gbps, "gemm_tflops": gemm_tflops}],
                  [{"label": f"day {p['day']}, B={p['batch']}", "intensity": p["intensity"], "tflops": p["tflops"]}
                   for p in pts], ax=ax, title=f"each day's decode step on the {device} roofline")
    ax.legend(fontsize=6, loc="lower right")
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


def plot_gpu_story(recorded: Sequence[dict], *, copy_gbps: float | None = None, gemm_tflops: float | None = None,
                   device: str = "NVIDIA H200"):
    """The recorded GPU run in one figure: the days (first and follow-up TTFT, decode tokens/s,
    ITL), the wall-clock load sweep per day, and each day's decode step on the roofline. Returns
    the figure."""
    fig = plt.figure(figsize=(17, 9))
    grid = fig.add_gridspec(2, 12, hspace=0.45, wspace=0.9)
    top = [fig.add_subplot(grid[0, 3 * i:3 * i + 3]) for i in range(4)]
    plot_days(recorded, device=device, axes=top)
    for ax in top[1:]:
        ax.tick_params(labelleft=False)
    plot_sweep(recorded, case="load", simulated=False, axes=[fig.add_subplot(grid[1, 0:4]),
                                                            fig.add_subplot(grid[1, 4:7])],
               title="load sweep (wall clock)")
    plot_decode_roofline(recorded, copy_gbps=copy_gbps, gemm_tflops=gemm_tflops, device=device,
                         ax=fig.add_subplot(grid[1, 8:12]))
    fig.suptitle(f"recorded on the {device}", fontsize=11)
    return fig


def memory_lines(cfg=GPU) -> list[str]:
    """What FP8 storage saves at ``cfg``'s size (default the GPU size): the experts' weights and
    the KV cache per token, in the model's dtype and in FP8 with their scales."""
    elt = 2 if cfg.dtype == "bfloat16" else 4
    experts = cfg.n_layers * cfg.n_experts * 3 * cfg.d_model * cfg.d_expert
    scales = cfg.n_layers * cfg.n_experts * (2 * cfg.d_expert + cfg.d_model) * 4
    kv, kv8 = kv_bytes_per_token(cfg), kv_bytes_per_token(cfg, "fp8_e4m3")
    return [f"experts: {experts * elt / 2**30:.2f} GiB in {cfg.dtype} -> {(experts + scales) / 2**30:.2f} GiB in FP8 "
            f"with scales", f"KV cache per token: {kv:,} B in {cfg.dtype} -> {kv8:,} B in FP8 with scales; "
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


def unrehearsed(records: Sequence[dict]) -> dict:
    """``{workload: [days]}`` of the engine day records that were not rehearsed (or predate the
    flag): their times may include Triton compiling a kernel for a shape it met for the first time."""
    out: dict = {}
    for r in engine_records(records):
        if _plain(r) and not r.get("rehearsed") and r["case"] != "step_cost":
            out.setdefault(r["case"].split(".")[0], set()).add(r["day"])
    return {w: sorted(d) for w, d in sorted(out.items())}


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
