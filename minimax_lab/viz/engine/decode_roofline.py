"""Where each day's decode step sits on chapter 00's roofline: its FLOPs and bytes
(:mod:`minimax_lab.engine.traffic`, or the record's own) over the measured step time.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt

from minimax_lab.engine.config import GPU
from minimax_lab.engine.traffic import decode_step_bytes, decode_step_flops
from minimax_lab.notebook import recorded
from minimax_lab.viz.engine.records import _decode_records, _label, _short, breaks_batch_rule, by_case, comparable
from minimax_lab.viz.roofline import plot_roofline


def decode_points(records: Sequence[dict]) -> list[dict]:
    """Each day's decode step as a roofline point ``{label, intensity, tflops, gbps, day, batch}``
    (records whose times do not compare -- not rehearsed -- left out):
    the step of 32 sequences the ``prices`` case timed where recorded (every day the same shape),
    else the agent's decode step; FLOPs and bytes from the record (or, for a record without them,
    computed for the GPU-size model at the record's batch and context), TFLOP/s and GB/s from its
    step time. Records that :func:`breaks_batch_rule` are left out."""
    out = []
    cases = by_case(records)
    priced = {d: {**r, "decode_bytes_per_step": None, "workload": {"context_tokens": r.get("decode_context", 0)}}
              for d, r in cases.get("step_cost", {}).items() if r.get("decode_batch")}
    for day, r in sorted((priced or _decode_records(cases)).items()):
        batch, ms = r.get("decode_batch"), r.get("ms")
        if not batch or not ms or (not priced and breaks_batch_rule(r)):   # the prices case batches every day
            continue
        if comparable(r, r) is not None:        # not rehearsed: the step may hold compiling
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
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)
    return ax


def roofline_sentences(records: Sequence[dict], copy_gbps: float | None) -> list[str]:
    """Per day: the bandwidth its decode step implies, as a share of the copy ceiling."""
    if not copy_gbps:
        return []
    return [f"{p['label']}: {p['gbps']:,.0f} GB/s of the bytes it must read, {p['gbps'] / copy_gbps:.0%} of the "
            f"copy ceiling" for p in decode_points(records)]
