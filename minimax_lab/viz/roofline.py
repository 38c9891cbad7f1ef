"""Rooflines and the timings drawn against them.

A roofline says how fast an operator *can* run: attainable FLOP/s = min(peak FLOP/s,
arithmetic intensity x memory bandwidth), with intensity = FLOPs / bytes moved. Below the
ridge point (peak / bandwidth) an operator is limited by memory; above it, by the matrix units.

* :func:`operator` / :func:`operator_table` -- an operator's FLOPs, bytes and intensity, and a table of them;
* :func:`machines` -- the ceilings measured now and those recorded on the H200, labelled as such;
* :func:`how_measured` -- how the ceilings measured now were timed (on a CPU, on how many threads);
* :func:`plot_machines` -- one roofline panel per machine, never two machines under one title;
* :func:`bound_lines` -- which side of each machine's ridge each operator lands on, in words;
* :func:`plot_timings` -- the share of the copy ceiling each timing of one operator implies, as
  bars that start at the ceiling;
* :func:`pct_text` -- a share of a ceiling, written alike in tables and on bars.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter
import numpy as np
import torch

from minimax_lab.measure.timing import Ceilings
from minimax_lab.notebook import recorded


def attainable_tflops(intensity: np.ndarray | float, copy_gbps: float, gemm_tflops: float) -> np.ndarray:
    """min(peak, intensity x bandwidth) in TFLOP/s, for intensity in FLOP/byte."""
    return np.minimum(gemm_tflops, np.asarray(intensity, dtype=float) * copy_gbps / 1e3)


_MARKERS = ("o", "s", "D", "^", "v", "P", "X", "*")


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def operator(label: str, flops: float, nbytes: float, how: str) -> dict:
    """One operator for the roofline: its FLOPs, the fewest bytes it moves, their ratio, and how counted."""
    if not (flops > 0 and nbytes > 0):
        raise ValueError(f"{label}: FLOPs and bytes must be positive, got {flops} and {nbytes}")
    return {"label": label, "flops": flops, "bytes": nbytes, "intensity": flops / nbytes, "how": how}


def operator_table(operators: Sequence[dict]) -> str:
    """The operators as text: FLOPs, bytes, intensity (FLOP/byte) and how each was counted."""
    lines = [f"{'operator':26s} {'FLOPs':>10s} {'bytes':>10s} {'intensity':>10s}   how counted"]
    lines += [f"{o['label']:26s} {o['flops']:10.3g} {o['bytes']:10.3g} {o['intensity']:10,.1f}   {o['how']}"
              for o in operators]
    return "\n".join(lines)


def machines(here: Ceilings, device: str = recorded.H200) -> list[dict]:
    """The machine measured now and, if its ceilings are recorded, ``device``: dicts with ``label``
    (which says measured now or recorded), ``copy_gbps`` and ``gemm_tflops``."""
    out = [{"label": f"measured now on {here.device}", "copy_gbps": here.copy_gbps, "gemm_tflops": here.gemm_tflops,
            "dtype": here.gemm_dtype}]
    copy = recorded.one("ceilings", "copy", "torch.copy_", device=device)
    gemm = next((r for r in recorded.all_of("ceilings", device=device) if r["case"].startswith("gemm")), None)
    if copy and gemm:
        out.append({"label": f"recorded on the {device}", "copy_gbps": copy["gbps"], "gemm_tflops": gemm["tflops"],
                    "dtype": gemm["case"].replace("gemm_", "")})
    return out


def describe_machines(ms: Sequence[dict]) -> str:
    """One line per machine: its copy bandwidth, its matrix-multiply rate and the ridge between them."""
    return "\n".join(f"{m['label']}: copy {m['copy_gbps']:,.1f} GB/s, {m['dtype']} matmul {m['gemm_tflops']:,.3g} "
                     f"TFLOP/s, ridge at {ridge(m):,.1f} FLOP/byte" for m in ms)


def how_measured(here: Ceilings) -> str:
    """How the ceilings measured now were timed, with torch's thread count where a CPU did it (a CPU
    copy or matmul on two threads of a busy machine waits for the second core)."""
    if "wall clock" not in here.method:   # CUDA events: the GPU's speed, whatever the host threads
        return here.method
    n = torch.get_num_threads()
    return f"{here.method}; torch on {n} thread{'s' if n > 1 else ''}"


def ridge(machine: dict) -> float:
    """The intensity (FLOP/byte) where the machine's two ceilings meet."""
    return machine["gemm_tflops"] * 1e3 / machine["copy_gbps"]


def bound_lines(operators: Sequence[dict], ms: Sequence[dict]) -> str:
    """For each machine, which operators sit left of its ridge (memory-bound) and which right of it."""
    lines = []
    for m in ms:
        memory = [o["label"] for o in operators if o["intensity"] < ridge(m)]
        compute = [o["label"] for o in operators if o["intensity"] >= ridge(m)]
        lines.append(f"{m['label']} (ridge {ridge(m):,.1f}): memory-bound: {', '.join(memory) or 'none'}; "
                     f"compute-bound: {', '.join(compute) or 'none'}")
    return "\n".join(lines)


def plot_machines(ms: Sequence[dict], operators: Sequence[dict]):
    """One roofline panel per machine, each titled with its own machine and the operators placed on
    its own roof, so numbers measured now and recorded elsewhere are never drawn under one title."""
    fig, axes = plt.subplots(1, len(ms), figsize=(6.5 * len(ms), 4.2), squeeze=False)
    points = [{"label": o["label"], "intensity": o["intensity"]} for o in operators]
    for ax, m in zip(axes[0], ms):
        roof = {**m, "label": "roof"}
        title = f"{m['label']}\ncopy {_fmt(m['copy_gbps'])} GB/s, {m['dtype']} matmul {_fmt(m['gemm_tflops'])} TFLOP/s"
        plot_roofline([roof], points, ax=ax, title=title, legend=ax is axes[0][-1])
    fig.tight_layout()
    return fig


def plot_roofline(devices: Sequence[dict], points: Sequence[dict] = (), ax=None, title: str = "Roofline",
                  legend: bool = True):
    """Draw one roofline per device and optional operator points.

    ``devices``: dicts with ``label``, ``copy_gbps``, ``gemm_tflops`` (and ``style``, e.g. "--"
    for recorded rather than measured-now). ``points``: dicts with ``label``, ``intensity``
    (FLOP/byte) and optionally ``tflops`` (achieved; otherwise the point sits on the first roof,
    ``devices[0]``). Points are told apart by marker in the legend (outside the axes, so no label covers another
    or the data); points at the same intensity are drawn as nested hollow markers.
    """
    if not devices:
        raise ValueError("plot_roofline needs at least one device")
    own_figure = ax is None  # lay out only a figure made here: a caller's figure may hold other axes
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
    ax.set_title(title, fontsize=10)
    if legend:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.grid(True, which="both", alpha=0.2)
    if own_figure:
        ax.figure.tight_layout()
    return ax


def pct_text(pct: float) -> str:
    """A share of a ceiling as printed in tables and on bars alike: ``'184%'``, ``'9.6%'``."""
    return f"{pct:,.0f}%" if pct >= 10 else f"{pct:.1f}%"


def plot_timings(rows: Sequence[tuple[str, float, float, bool]], ceiling_gbps: float, ax=None,
                 title: str = "", ceiling_label: str = "copy ceiling", spreads: Sequence | None = None,
                 ceiling_spread_gbps: tuple[float, float] | None = None):
    """Horizontal bars of the share of the copy ceiling each timing implies, honest ones in green,
    mistakes in red.

    ``rows``: ``(label, ms, bytes_moved, honest)``. Showing bandwidth rather than ms puts timings of
    different input sizes on one axis. The axis is logarithmic and every bar starts at the ceiling
    (100%, dashed), so a bar's length is the factor by which the timing claims more (rightwards) or
    less (leftwards) than memory delivered to a plain copy; two bars of equal length are equal factors.
    Each bar is labelled with its percentage, written as :func:`pct_text` writes it in tables.
    ``spreads`` (per row a ``(p20_ms, p80_ms)`` or None) draws error bars at the bars' ends;
    ``ceiling_spread_gbps`` (the ceiling's own p20-p80, in GB/s) a grey band around the dashed line.
    """
    if not rows:
        raise ValueError("plot_timings needs at least one row")
    if not (ceiling_gbps and ceiling_gbps > 0):
        raise ValueError(f"ceiling_gbps must be a positive bandwidth, got {ceiling_gbps!r}")
    ax = ax or plt.subplots(figsize=(8, 0.45 * len(rows) + 1.4))[1]
    pct = [100 * r[2] / (r[1] * 1e-3) / 1e9 / ceiling_gbps for r in rows]
    y = np.arange(len(rows))
    ax.barh(y, [p - 100 for p in pct], left=100, color=["tab:green" if r[3] else "tab:red" for r in rows])
    ax.set_xscale("log")
    ax.axvline(100, color="black", ls="--", lw=1)
    ax.annotate(f"{ceiling_label}: {_fmt(ceiling_gbps)} GB/s = 100%", (100, 1.0), xycoords=("data", "axes fraction"),
                fontsize=7, ha="center", va="bottom", xytext=(0, 2), textcoords="offset points")
    ranged = {i: s for i, s in enumerate(spreads or ()) if s}
    ends = {}  # row -> the (low, high) share its error bar spans
    for i, (p20, p80) in ranged.items():
        share = lambda ms: 100 * rows[i][2] / (ms * 1e-3) / 1e9 / ceiling_gbps  # noqa: E731
        ends[i] = (min(share(p80), pct[i]), max(share(p20), pct[i]))
        ax.errorbar(pct[i], i, xerr=[[pct[i] - ends[i][0]], [ends[i][1] - pct[i]]], fmt="none", ecolor="black",
                    elinewidth=1, capsize=3)
    for i, p in enumerate(pct):
        right = p >= 100
        lo, hi = ends.get(i, (p, p))
        ax.annotate(pct_text(p), (max(hi, 100) if right else min(lo, 100), i), fontsize=7, va="center",
                    ha="left" if right else "right", xytext=(4 if right else -4, 0), textcoords="offset points")
    if ceiling_spread_gbps:
        ax.axvspan(*(100 * g / ceiling_gbps for g in ceiling_spread_gbps), color="0.85", zorder=0, lw=0)
    ax.set_xlim(min(pct + [100]) / 4, max(pct + [100]) * 4)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))
    ax.set_yticks(y, [r[0] for r in rows])
    ax.set_xlabel("bandwidth as a share of the dashed copy line (log scale; every bar starts at 100%); "
                  "green = the harness's way"
                  + ("\nerror bars" + (" and grey band" if ceiling_spread_gbps else "") + ": p20-p80 of the medians"
                     if ranged or ceiling_spread_gbps else ""))
    ax.set_title(title, pad=14)
    ax.invert_yaxis()
    ax.figure.tight_layout()
    return ax
