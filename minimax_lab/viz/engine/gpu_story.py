"""The recorded GPU run in one figure, a panel only for what was recorded (:func:`plot_gpu_story`),
and what the records hold and lack in words (:func:`gpu_story_lines`).
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt

from minimax_lab.viz.engine.days import day_panels, plot_days
from minimax_lab.viz.engine.decode_roofline import decode_points, plot_decode_roofline
from minimax_lab.viz.engine.load import plot_preemption, plot_sweep, sweep_curves
from minimax_lab.viz.engine.records import COMMAND, TIMED, _days_text, day_values, engine_records, no_record


def plot_gpu_story(records: Sequence[dict], *, copy_gbps: float | None = None, gemm_tflops: float | None = None,
                   device: str = "NVIDIA H200"):
    """The recorded GPU run in one figure, a panel only for what the records hold: the days (first
    and follow-up TTFT, decode tokens/s, ITL), the wall-clock load sweep per day, the wall-clock
    preemption sweep, and each day's decode step on the roofline (with the ceilings given).
    Returns the figure, or None when there is nothing to draw (:func:`gpu_story_lines` says what
    is missing)."""
    days = day_panels(records)
    load = sweep_curves(records, case="load", simulated=False)
    pre = sweep_curves(records, case="preemption", simulated=False)
    roof = bool(decode_points(records) and copy_gbps and gemm_tflops)
    rows = [r for r in (days, bool(load), bool(pre) or roof) if r]
    if not rows:
        return None
    fig = plt.figure(figsize=(16, 4.3 * len(rows)))
    grid = fig.add_gridspec(len(rows), 12, hspace=0.55, wspace=1.2, left=0.14, right=0.98)
    row = 0
    if days:
        width = 12 // len(days)
        plot_days(records, device=device, axes=[fig.add_subplot(grid[0, width * i:width * (i + 1)])
                                                for i in range(len(days))])
        row += 1
    if load:
        plot_sweep(records, case="load", simulated=False, title="load sweep (wall clock)",
                   axes=[fig.add_subplot(grid[row, 4 * i:4 * (i + 1)]) for i in range(3)])
        row += 1
    if pre or roof:
        if pre:
            plot_preemption(records, simulated=False, axes=[fig.add_subplot(grid[row, 3 * i:3 * (i + 1)])
                                                            for i in range(3)])
        if roof:
            plot_decode_roofline(records, copy_gbps=copy_gbps, gemm_tflops=gemm_tflops, device=device,
                                 ax=fig.add_subplot(grid[row, 9:12] if pre else grid[row, 0:5]))
    fig.suptitle(f"recorded on the {device}", fontsize=11)
    return fig


def unrehearsed(records: Sequence[dict]) -> dict:
    """``{workload: [days]}`` of the day records the tables and figures use (:func:`day_values`;
    an older record of a case since renamed is not among them) that were made on a GPU without a
    rehearsal (or before records said): their times may include Triton compiling a kernel for a
    shape met the first time."""
    v = day_values(records)
    out: dict = {}
    for key in TIMED:
        for day, (_, r) in v[key].items():
            if not r.get("rehearsed") and not r.get("interpreter"):
                out.setdefault(r["case"].split(".")[0], set()).add(day)
    return {w: sorted(d) for w, d in sorted(out.items())}


def gpu_story_lines(records: Sequence[dict], *, copy_gbps: float | None = None, device: str = "NVIDIA H200") -> list:
    """What the recorded GPU run holds and lacks, computed from the records: which workloads and
    days were not rehearsed (no change computed between them), decode records made before forks
    counted against the batch limit (left out), and the sweeps, step prices and ceilings with no
    record yet."""
    recs = engine_records(records)
    if not recs:
        return [f"The {device} has {no_record()}."]
    out = []
    cold = unrehearsed(recs)
    if cold:
        out.append("Not rehearsed, so their times may include Triton compiling kernels and no change is computed "
                   "between them: " + "; ".join(f"{w} on {_days_text(d)}" for w, d in cold.items()) + ".")
    old = day_values(recs)["old_batch"]
    if old:
        out.append(f"The decode records of {_days_text(old)} decoded {max(old.values())} sequences at once without "
                   "continuous batching: made before forks counted against the batch limit, they are left out "
                   f"until re-recorded (`{COMMAND} --cases agent_long`).")
    missing = [what for what, have in (
        ("a wall-clock load sweep", sweep_curves(recs, case="load", simulated=False)),
        ("a preemption sweep", sweep_curves(recs, case="preemption", simulated=False)),
        ("step prices for the simulated sweeps", any(r["case"] == "step_cost" for r in recs)),
        ("the copy ceiling the roofline needs", copy_gbps)) if not have]
    if missing:
        out.append(f"No {device} record yet of " + ", ".join(missing[:-1]) + (" or " if len(missing) > 1 else "")
                   + f"{missing[-1]} (`{COMMAND} --cases load preemption` makes the sweeps and prices).")
    return out
