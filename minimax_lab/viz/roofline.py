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


_MARKERS = ("o", "s", "D", "^", "v", "P", "X", "*")


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def plot_roofline(devices: Sequence[dict], points: Sequence[dict] = (), ax=None, title: str = "Roofline"):
    """Draw one roofline per device and optional operator points.

    ``devices``: dicts with ``label``, ``copy_gbps``, ``gemm_tflops`` (and ``style``, e.g. "--"
    for recorded rather than measured-now). ``points``: dicts with ``label``, ``intensity``
    (FLOP/byte) and optionally ``tflops`` (achieved; otherwise the point sits on the first roof,
    ``devices[0]``). Points are told apart by marker in the legend (outside the axes, so no label covers another
    or the data); points at the same intensity are drawn as nested hollow markers.
    """
    if not devices:
        raise ValueError("plot_roofline needs at least one device")
    ax = ax or plt.subplots(figsize=(10, 4.8))[1]
    lo = min([0.1] + [0.5 * p["intensity"] for p in points])
    hi = max([1e4] + [2 * p["intensity"] for p in points])
    x = np.logspace(np.log10(lo), np.log10(hi), 300)
    for d in devices:
        line, = ax.loglog(x, attainable_tflops(x, d["copy_gbps"], d["gemm_tflops"]), d.get("style", "-"), lw=1.6,
                          label=f"{d['label']}: {d['copy_gbps']:,.0f} GB/s, {d['gemm_tflops']:.3g} TFLOP/s")
        ridge = d["gemm_tflops"] * 1e3 / d["copy_gbps"]
        ax.axvline(ridge, color=line.get_color(), lw=0.6, ls=":")
        ax.annotate(f"ridge {ridge:,.0f}", (ridge, 0), xycoords=("data", "axes fraction"), fontsize=7,
                    color=line.get_color(), xytext=(3, 4), textcoords="offset points")
    roof0 = devices[0]
    seen: dict[float, int] = {}
    for i, p in enumerate(points):
        y = p.get("tflops") or float(attainable_tflops(p["intensity"], roof0["copy_gbps"], roof0["gemm_tflops"]))
        key = round(float(np.log10(p["intensity"])), 1)
        nested = seen.get(key, 0)
        seen[key] = nested + 1
        ax.plot(p["intensity"], y, _MARKERS[i % len(_MARKERS)], ms=6 + 4 * nested, mfc="none", mew=1.6,
                label=f"{p['label']} (intensity {_fmt(p['intensity'])})")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.grid(True, which="both", alpha=0.2)
    ax.figure.tight_layout()
    return ax


def plot_timings(rows: Sequence[tuple[str, float, float, bool]], ceiling_gbps: float | None = None, ax=None,
                 title: str = "", ceiling_label: str = "copy ceiling"):
    """Horizontal bars of the bandwidth each timing implies, honest ones in green, mistakes in red.

    ``rows``: ``(label, ms, bytes_moved, honest)``. Showing GB/s rather than ms puts timings of
    different input sizes on one axis; a bar past the copy ceiling (``ceiling_gbps``, dashed) is
    a number memory cannot deliver: a timing mistake, or data served from a cache. Each bar is
    labelled with its percentage of the ceiling, so a ratio above 100% is seen where it is shown.
    """
    if not rows:
        raise ValueError("plot_timings needs at least one row")
    ax = ax or plt.subplots(figsize=(8, 0.45 * len(rows) + 1.4))[1]
    labels = [r[0] for r in rows]
    gbps = [r[2] / (r[1] * 1e-3) / 1e9 for r in rows]
    ax.barh(labels, gbps, color=["tab:green" if r[3] else "tab:red" for r in rows])
    ax.set_xscale("log")
    if ceiling_gbps:
        ax.axvline(ceiling_gbps, color="black", ls="--", lw=1)
        ax.annotate(f"{ceiling_label}: {_fmt(ceiling_gbps)} GB/s", (ceiling_gbps, 1.0), xycoords=("data", "axes fraction"),
                    fontsize=7, ha="center", va="bottom", xytext=(0, 2), textcoords="offset points")
        for i, g in enumerate(gbps):
            pct = 100 * g / ceiling_gbps
            ax.annotate(f"{pct:,.0f}%" + (" (> ceiling)" if pct > 100 else ""), (g, i), fontsize=7, va="center",
                        xytext=(3, 0), textcoords="offset points", color="black")
        ax.set_xlim(right=max(gbps + [ceiling_gbps]) * 6)
    ax.set_xlabel("implied bandwidth, GB/s (log scale); green = the harness's way; % = of the ceiling")
    ax.set_title(title, pad=14)
    ax.invert_yaxis()
    ax.figure.tight_layout()
    return ax
