"""The H200 goals of the day-0-to-day-14 story (:data:`TARGETS`), each read from the bench records
and met or not.
"""
from __future__ import annotations

from typing import Sequence

from minimax_lab.bench.suite_engine_days import day_ratio
from minimax_lab.viz.engine.quality import quality_rows
from minimax_lab.viz.engine.records import _decode_records, by_case


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
