"""Rooflines and recorded benchmark results.

A roofline says how fast an operator *can* run: attainable FLOP/s = min(peak FLOP/s,
arithmetic intensity x memory bandwidth), with intensity = FLOPs / bytes moved. Below the
ridge point (peak / bandwidth, about 185 FLOP/byte on an H200 in bf16) an operator is
limited by memory; above it, by the matrix units.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np


def attainable_tflops(intensity: np.ndarray | float, copy_gbps: float, gemm_tflops: float) -> np.ndarray:
    """min(peak, intensity x bandwidth) in TFLOP/s, for intensity in FLOP/byte."""
    return np.minimum(gemm_tflops, np.asarray(intensity, dtype=float) * copy_gbps / 1e3)


def plot_roofline(devices: Sequence[dict], points: Sequence[dict] = (), ax=None, title: str = "Roofline"):
    """Draw one roofline per device and optional operator points.

    ``devices``: dicts with ``label``, ``copy_gbps``, ``gemm_tflops`` (and ``style``, e.g. "--"
    for recorded rather than measured-now). ``points``: dicts with ``label``, ``intensity``
    (FLOP/byte) and optionally ``tflops`` (achieved; otherwise the point sits on the first roof).
    """
    if not devices:
        raise ValueError("plot_roofline needs at least one device")
    ax = ax or plt.subplots(figsize=(7, 4.5))[1]
    x = np.logspace(-1, 4, 300)
    for d in devices:
        line, = ax.loglog(x, attainable_tflops(x, d["copy_gbps"], d["gemm_tflops"]), d.get("style", "-"),
                          label=f"{d['label']}: {d['copy_gbps']:.0f} GB/s, {d['gemm_tflops']:.3g} TFLOP/s")
        ridge = d["gemm_tflops"] * 1e3 / d["copy_gbps"]
        ax.axvline(ridge, color=line.get_color(), lw=0.6, ls=":")
        ax.annotate(f"ridge {ridge:.0f}", (ridge, d["gemm_tflops"]), fontsize=7, color=line.get_color(),
                    xytext=(3, -12), textcoords="offset points")
    roof0 = devices[0]
    for p in points:
        y = p.get("tflops") or float(attainable_tflops(p["intensity"], roof0["copy_gbps"], roof0["gemm_tflops"]))
        ax.plot(p["intensity"], y, "o", ms=5)
        ax.annotate(p["label"], (p["intensity"], y), fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", alpha=0.2)
    return ax


def plot_timings(rows: Sequence[tuple[str, float, float, bool]], ceiling_gbps: float | None = None, ax=None,
                 title: str = ""):
    """Horizontal bars of the bandwidth each timing implies, honest ones in green, mistakes in red.

    ``rows``: ``(label, ms, bytes_moved, honest)``. Showing GB/s rather than ms puts timings of
    different input sizes on one axis; a bar past the copy ceiling (``ceiling_gbps``, dashed) is
    a number the memory cannot deliver, so it must be wrong.
    """
    if not rows:
        raise ValueError("plot_timings needs at least one row")
    ax = ax or plt.subplots(figsize=(7, 0.45 * len(rows) + 1))[1]
    labels = [r[0] for r in rows]
    gbps = [r[2] / (r[1] * 1e-3) / 1e9 for r in rows]
    ax.barh(labels, gbps, color=["tab:green" if r[3] else "tab:red" for r in rows])
    if ceiling_gbps:
        ax.axvline(ceiling_gbps, color="black", ls="--", lw=1)
        ax.annotate(f"copy ceiling {ceiling_gbps:.0f} GB/s", (ceiling_gbps, 0), fontsize=7,
                    xytext=(3, -10), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("implied bandwidth, GB/s (log scale); green = the harness's way")
    ax.set_title(title)
    ax.invert_yaxis()
    return ax