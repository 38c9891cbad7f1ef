"""The engine's day-by-day waterfall, from bench records (suite ``engine``).

Each day of :data:`minimax_lab.engine.DAYS` flips one switch and keeps the earlier ones, so the
step from one day's bar to the next is that switch's gain with everything else fixed. Four
panels, one bar per day:

* **TTFT of a follow-up agent turn** -- ``agent_long.ttft_followup`` (ms; a tool result appended to
  a long agent context: the case prefix caching exists for);
* **decode tokens/s** -- ``agent_long.decode_b<B>`` (``decode_tok_s``: ``B`` sequences decoding at
  the long context);
* **inter-token latency** -- ``agent.itl`` (ms, the agent workload's mean; ``chat.itl`` where no
  agent record exists);
* **memory** -- the weights the day serves with plus the KV pool (``weights_gib + kv_cache_gib`` of
  the ``agent_long`` records, else the ``agent``/``chat`` ones).

Records measured in this process (``live``) and recorded ones (``recorded``, from
:func:`minimax_lab.bench.load_records`) are drawn side by side; where no recorded engine run
exists the figure says so rather than leave the reader to guess.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np

#: (key, title, unit, True when larger is better)
METRICS = (
    ("ttft_followup", "TTFT, follow-up agent turn", "ms", False),
    ("decode_tok_s", "decode tokens/s", "tokens/s", True),
    ("itl", "inter-token latency", "ms", False),
    ("memory", "weights + KV pool", "GiB", False),
)
NO_RECORD = "no H200 record yet: run `python -m minimax_lab.bench engine --preset gpu` on a GPU"


def _engine(records: Sequence[dict]) -> list[dict]:
    return [r for r in records if r.get("suite") == "engine" and isinstance(r.get("day"), int)]


def _by_case(records: Sequence[dict]) -> dict:
    out: dict = {}
    for r in _engine(records):
        out.setdefault(r["case"], {})[r["day"]] = r
    return out


def _memory(r: dict) -> float | None:
    w, kv = r.get("weights_gib"), r.get("kv_cache_gib")
    return w + kv if w is not None and kv is not None else None


def waterfall(records: Sequence[dict]) -> dict:
    """``{metric key: {day: value}}`` for the :data:`METRICS` found in ``records`` (days without a
    value are absent), plus ``"labels"``: ``{day: label}`` and ``"batch"``: the decode batch (or None)."""
    cases = _by_case(records)
    out: dict = {k: {} for k, *_ in METRICS}
    out["labels"], out["batch"] = {}, None
    for day, r in cases.get("agent_long.ttft_followup", {}).items():
        out["ttft_followup"][day] = r["ms"]
    for case, recs in cases.items():
        if case.startswith("agent_long.decode_b"):
            for day, r in recs.items():
                if r.get("decode_tok_s"):
                    out["decode_tok_s"][day] = r["decode_tok_s"]
                    out["batch"] = r.get("decode_batch")
    for case in ("agent.itl", "chat.itl"):
        if cases.get(case):
            out["itl"] = {day: r["ms"] for day, r in cases[case].items()}
            break
    for case in ("agent_long.ttft_followup", "agent.e2e", "chat.e2e"):
        mem = {day: _memory(r) for day, r in cases.get(case, {}).items()}
        mem = {d: v for d, v in mem.items() if v is not None}
        if mem:
            out["memory"] = mem
            break
    for recs in cases.values():
        for day, r in recs.items():
            out["labels"].setdefault(day, r.get("label") or f"day {day}: {r.get('switch', '?')}")
    return out


def gain(prev: float | None, cur: float | None, higher_better: bool) -> float | None:
    """How many times better ``cur`` is than ``prev`` (> 1: better, < 1: worse; None if either is missing)."""
    if not prev or not cur:
        return None
    return cur / prev if higher_better else prev / cur


def _labels(live: dict, recorded: dict) -> dict:
    return {**recorded["labels"], **live["labels"]}


def format_waterfall(live: Sequence[dict], recorded: Sequence[dict] = (), *, device_now: str = "this machine",
                     recorded_device: str = "NVIDIA H200") -> str:
    """The waterfall as a plain-text table: per day and metric, the live and the recorded value and
    the recorded gain over the day before (the live one where nothing is recorded)."""
    a, b = waterfall(live), waterfall(recorded)
    labels = _labels(a, b)
    if not labels:
        return "(no engine records)"
    fmt = lambda v: "-" if v is None else f"{v:,.4g}"  # noqa: E731
    lines = [] if _engine(recorded) else [NO_RECORD]
    for key, title, unit, hb in METRICS:
        lines.append(f"{title} ({unit}, {'higher' if hb else 'lower'} is better): now on {device_now} | "
                     f"recorded on {recorded_device} | gain over the day before")
        prev = None
        for day in sorted(labels):
            now, rec = a[key].get(day), b[key].get(day)
            src = b[key] if b[key] else a[key]
            g = gain(src.get(prev), src.get(day), hb) if prev is not None else None
            lines.append(f"  {labels[day][:40]:40s} {fmt(now):>12s} {fmt(rec):>12s} "
                         f"{'-' if g is None else f'x{g:.2f}':>8s}")
            prev = day
    stale = unrehearsed(recorded)
    if stale:
        lines.append("recorded without a rehearsal (times may include Triton compiling new shapes): "
                     + "; ".join(f"{w} days {', '.join(map(str, d))}" for w, d in stale.items()))
    return "\n".join(lines)


def unrehearsed(records: Sequence[dict]) -> dict:
    """``{workload: [days]}`` of the engine records of Triton days that say they were not rehearsed
    (or predate the flag): their times may include Triton compiling a kernel for a shape it met for
    the first time (see :mod:`minimax_lab.bench.suite_engine`)."""
    out: dict = {}
    for r in _engine(records):
        triton_day = any(v == "triton" for k, v in (r.get("options") or {}).items() if k.endswith("_impl"))
        if triton_day and not r.get("rehearsed"):
            out.setdefault(r["case"].split(".")[0], set()).add(r["day"])
    return {w: sorted(d) for w, d in sorted(out.items())}


def plot_waterfall(live: Sequence[dict], recorded: Sequence[dict] = (), *, device_now: str = "this machine",
                   recorded_device: str = "NVIDIA H200", fig=None):
    """Four panels (:data:`METRICS`), one row per day: the recorded bar (grey, hatched) above the
    live one (orange), each labelled with its value and, on the recorded bar (the live one where
    nothing is recorded), the gain over the day before; time and rate panels use a log axis when
    the values span more than 20x (a GPU beside the CPU's interpreter). Says so in the title when
    nothing is recorded. Returns the figure; raises ``ValueError`` when neither side holds an engine record."""
    a, b = waterfall(live), waterfall(recorded)
    labels = _labels(a, b)
    if not labels:
        raise ValueError("no engine records to draw (suite 'engine'): run the engine bench first")
    days = sorted(labels)
    fig = fig or plt.figure(figsize=(15, 0.42 * len(days) + 2.2))
    axes = fig.subplots(1, len(METRICS), sharey=True)
    y = np.arange(len(days))[::-1]
    h = 0.38
    has_rec = bool(_engine(recorded))
    for ax, (key, title, unit, hb) in zip(axes, METRICS):
        rec = [b[key].get(d) for d in days]
        now = [a[key].get(d) for d in days]
        vals = [v for v in rec + now if v]
        # a GPU and the CPU's interpreter differ ~1000x in time: a log axis keeps both sides' steps visible
        log = unit != "GiB" and len(vals) > 1 and max(vals) / min(vals) > 20
        left = min(vals) / 3 if log else 0
        ax.barh(y + h / 2, [(v or left) - left for v in rec], h, left=left, color="0.7", hatch="//", edgecolor="0.4",
                label=f"recorded on {recorded_device}")
        ax.barh(y - h / 2, [(v or left) - left for v in now], h, left=left, color="tab:orange",
                label=f"measured now on {device_now}")
        if log:
            ax.set_xscale("log")
        rec_side = any(v is not None for v in rec)    # the gains are read off the recorded bars if any
        for side, off, col, gains in ((rec, h / 2, "0.3", rec_side), (now, -h / 2, "black", not rec_side)):
            for i, (yy, v) in enumerate(zip(y, side)):
                if v is None:
                    continue
                g = gain(side[i - 1], v, hb) if gains and i else None
                ax.text(v, yy + off, f" {v:,.3g}" + ("" if g is None else f"  x{g:.2f}"), va="center", fontsize=7,
                        color=col)
        batch = f" (batch {a['batch'] or b['batch']})" if key == "decode_tok_s" and (a["batch"] or b["batch"]) else ""
        ax.set_title(f"{title}{batch}", fontsize=9)
        ax.set_xlabel(f"{unit} ({'higher' if hb else 'lower'} is better{', log scale' if log else ''})", fontsize=8)
        if log:
            ax.set_xlim(left, max(vals) * 30)     # room for the labels right of the longest bar
        else:
            ax.margins(x=0.45)
        if not vals:
            ax.text(0.5, 0.5, "no records", transform=ax.transAxes, ha="center", va="center", color="0.5")
    axes[0].set_yticks(y, [labels[d] for d in days], fontsize=8)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=2, fontsize=8, frameon=False, bbox_to_anchor=(0.5, -0.02))
    sup = "the engine, day by day (x: gain over the day before, the other switches fixed)"
    fig.suptitle(sup if has_rec else f"{sup}\n{NO_RECORD}", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def quality_rows(records: Sequence[dict]) -> list[dict]:
    """Each day's logits against day 0's on forced answers: ``{case, day, label, logits_rel_err,
    top1_agreement, compared_tokens}`` from the records that carry them (one per case and day,
    ``.e2e`` and ``agent_long.ttft_followup`` records), by case then day."""
    rows = []
    for r in _engine(records):
        if not (r["case"].endswith(".e2e") or r["case"] == "agent_long.ttft_followup"):
            continue
        if r.get("logits_rel_err") is None:
            continue
        rows.append({"case": r["case"].split(".")[0], "day": r["day"], "label": r.get("label") or f"day {r['day']}",
                     "logits_rel_err": r["logits_rel_err"], "top1_agreement": r.get("top1_agreement"),
                     "compared_tokens": r.get("compared_tokens")})
    return sorted(rows, key=lambda x: (x["case"], x["day"]))


def format_quality(records: Sequence[dict]) -> str:
    """:func:`quality_rows` as a plain-text table."""
    rows = quality_rows(records)
    if not rows:
        return "(no quality figures in these records)"
    lines = [f"{'case':11s} {'day':40s} {'logits rel. err vs day 0':>25s} {'top-1 = day 0':>14s}"]
    for r in rows:
        top1 = "-" if r["top1_agreement"] is None else f"{r['top1_agreement']:.1%}"
        lines.append(f"{r['case']:11s} {r['label'][:40]:40s} {r['logits_rel_err']:25.2e} {top1:>14s}")
    return "\n".join(lines)


#: The H200 targets of the day-0-to-day-14 story: (what, how it is measured, the goal).
TARGETS = (
    ("agent follow-up TTFT, day 0 / day 14", "agent_long.ttft_followup at 128k context", 20.0),
    ("decode tokens/s at batch 32, day 14 / day 0", "agent_long.decode_b32 at 128k context", 5.0),
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
    the records lack the measurement (the FP8 day counts as day 14: the last of the waterfall)."""
    rs = list(records)
    cases = _by_case(rs)

    def ratio(case, num_day, den_day, field="ms"):
        c = cases.get(case, {})
        a, b = c.get(num_day), c.get(den_day)
        if a is None or b is None or not a.get(field) or not b.get(field):
            return None
        return a[field] / b[field]

    last = max((d for c in cases.values() for d in c), default=None)
    decode_case = next((k for k in cases if k.startswith("agent_long.decode_b")), None)
    kv = "fp8_decode_B32_L131072_Hq32_Hkv8_D128_p16"
    moe64, moe16k = "fp8_E128_k8_d2048_f768_T64", "fp8_E128_k8_d2048_f768_T16384"

    def speedup(suite, case, mine, other):
        a, b = _find(rs, suite, case, mine), _find(rs, suite, case, other)
        return b["ms"] / a["ms"] if a and b else None

    fp8_kv = _find(rs, "kvcache", kv, "triton_fp8_token_cudagraph")
    top1 = [r["top1_agreement"] for r in quality_rows(rs) if 1 <= r["day"] <= 6 and r["top1_agreement"] is not None]
    values = [
        ratio("agent_long.ttft_followup", 0, last) if last else None,
        ratio(decode_case, 0, last) if decode_case and last else None,
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
    lines = [f"{'target':55s} {'goal':>7s} {'measured':>9s}  met"]
    for r in target_rows(records):
        v = "-" if r["value"] is None else f"{r['value']:.3g}"
        met = "-" if r["met"] is None else ("yes" if r["met"] else "NO")
        lines.append(f"{r['target'][:55]:55s} {r['goal']:>7.3g} {v:>9s}  {met}")
    return "\n".join(lines)
