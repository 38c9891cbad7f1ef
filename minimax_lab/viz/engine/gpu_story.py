"""The recorded GPU runs in one figure, one row of day panels per device that recorded comparable
times (:func:`plot_gpu_story`), each named with its versions, and what the records hold and lack in
words (:func:`gpu_story_lines`).
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt

from minimax_lab.viz.engine.days import day_panels, left_out, plot_days
from minimax_lab.viz.engine.decode_roofline import decode_points, plot_decode_roofline, recorded_ceilings
from minimax_lab.viz.engine.records import (COMMAND, _days_text, by_device, day_values, engine_records, no_record,
                                            versions)


def gpu_devices(records: Sequence[dict]) -> dict:
    """``{device: its engine records}`` of the GPU runs that have something to draw (interpreter
    records left out), the device with the most day records first."""
    out = {}
    for device, recs in by_device(records).items():
        gpu = [r for r in recs if not r.get("interpreter")]
        if gpu and day_panels(gpu):
            out[device] = gpu
    return out


def plot_gpu_story(records: Sequence[dict], *, ceilings=recorded_ceilings):
    """One row per device of :func:`gpu_devices`: the day panels (:func:`~.days.plot_days`), and
    each day's decode step on the device's roofline where its ceilings were recorded
    (``ceilings(device) -> (copy GB/s, matmul TFLOP/s)``). Returns the figure, or None when there
    is nothing to draw (:func:`gpu_story_lines` says what is missing)."""
    devices = gpu_devices(records)
    if not devices:
        return None
    rows = []
    for device, recs in devices.items():
        copy, gemm = ceilings(device)
        roof = bool(copy and gemm and decode_points(recs))
        rows.append((device, recs, len(day_panels(recs)) + roof, (copy, gemm) if roof else None))
    width = max(n for *_, n, _ in rows)
    fig, grid = plt.subplots(len(rows), width, figsize=(3.4 * width + 1.5, 4.0 * len(rows)), squeeze=False)
    for row, (device, recs, n, roof) in zip(grid, rows):
        panels = len(day_panels(recs))
        plot_days(recs, device=device, axes=row[:panels])
        if roof:
            plot_decode_roofline(recs, copy_gbps=roof[0], gemm_tflops=roof[1], device=device, ax=row[panels])
        for ax in row[n:]:
            ax.set_visible(False)
        row[0].annotate(f"recorded on the {device} ({versions(recs[0])})", (0, 1.16), xycoords="axes fraction",
                        fontsize=10, fontweight="bold")
    fig.subplots_adjust(left=0.16, right=0.98, hspace=0.75, wspace=0.25, top=0.88)
    return fig


def unrehearsed(records: Sequence[dict]) -> dict:
    """``{metric title: [days]}`` of the recorded GPU times left out of the figure because they
    were not rehearsed (they may include Triton compiling a kernel for a shape met the first time)."""
    return left_out([r for r in engine_records(records) if not r.get("interpreter")])


def gpu_story_lines(records: Sequence[dict]) -> list:
    """What the recorded GPU runs hold and lack, computed from the records: per device the times
    left out (not rehearsed) and the decode records made before forks counted against the batch
    limit; the recording command where no run holds every day's step prices."""
    recs = [r for r in engine_records(records) if not r.get("interpreter")]
    if not recs:
        return [f"There is {no_record()}."]
    out = []
    for device, mine in by_device(recs).items():
        gone = left_out(mine)
        if gone:
            out.append(f"{device}: left out, not rehearsed (the times may include compiling): "
                       + "; ".join(f"{t} on {_days_text(d)}" for t, d in gone.items()) + ".")
        old = day_values(mine)["old_batch"]
        if old:
            out.append(f"{device}: the decode records of {_days_text(old)} decoded {max(old.values())} sequences at "
                       "once without continuous batching, made before forks counted against the batch limit: left out.")
    priced = {r["day"] for r in recs if r["case"] == "step_cost" and r.get("step_costs")}
    if len(priced) < 8:
        out.append(f"No GPU run has recorded every day's step prices yet (`{COMMAND}` records them, rehearsed, "
                   "with three repeats).")
    return out
