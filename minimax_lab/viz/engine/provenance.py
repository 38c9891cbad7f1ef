"""Where chapter 09's numbers come from, for its last, collapsed cell (:func:`provenance`): this
run's machine and versions, what was measured live, what priced the simulated sweeps, which GPU
records the figures draw (device, versions, date), how spreads were taken, and the command that
records every day again on a GPU.
"""
from __future__ import annotations

import platform

from minimax_lab import runtime
from minimax_lab.viz.engine.gpu_story import gpu_devices
from minimax_lab.viz.engine.records import COMMAND, versions


def provenance(ch, *, seconds: float) -> str:
    """Markdown for the collapsed cell (``ch``: :func:`~.setup.setup`'s :class:`~.setup.Chapter`)."""
    info = runtime.describe()
    rows = [f"- this run: preset `{ch.preset}`, {info['device']}, Python {info['python']}, torch {info['torch']}, "
            f"Triton {info['triton']}{' (interpreter)' if info['interpreter'] else ''}, {platform.system()}; the "
            f"chapter took {seconds:.0f} s",
            "- measured live here: the engine's answers and logits on the days served (section 4), and in the sweeps "
            "the scheduler's and page pool's own decisions -- batching, prefix-cache hits, admission, preemption -- "
            "for every request and step"]
    if ch.prices is not None:
        p = ch.prices
        how = ("fitted to the steps each day's engine timed on the GPU: decode steps of 1, 8 and 32 sequences at two "
               "contexts and prompts prefilled as the day prefills them, once untimed, then three times, each repeat "
               "its own fit" if p.kind != "modelled" else
               "a model: a decode step reads its bytes at one bandwidth after one fixed cost, both fitted to the "
               "recorded decode times of the days that run the same kernels; a prompt computes its FLOPs at the rate "
               "the recorded 131k-token first turns reached; days that change only the scheduler share their "
               "kernels' price; swaps at the recorded pinned host link")
        rows.append(f"- the sweeps' step prices: {p.label()}, {how}")
    for device, recs in gpu_devices(ch.records).items():
        when = sorted({str(r.get("when", ""))[:10] for r in recs if r.get("when")})
        rows.append(f"- recorded on the {device}: {versions(recs[0])}, "
                    f"{when[0] if len(when) == 1 else (when[0] + ' to ' + when[-1]) if when else 'date not recorded'}; "
                    f"{len(recs)} engine records")
    rows += ["- spreads: every repeated value is the median of its repeats, its error bar or bracket their range; a "
             "change is called only where the two ranges do not overlap (a value measured once: where it moved more "
             "than 3%)",
             "- seeds: fixed (the model's weights, the trace's slices, the Poisson draws); the simulated sweeps repeat "
             "exactly for the same prices",
             f"- to record every day again on a GPU (rehearsed, three repeats, about five minutes on one H100): "
             f"`{COMMAND}`"]
    return ("<details><summary><b>Where these numbers come from</b> (click to open)</summary>\n\n"
            + "\n".join(rows) + "\n\n</details>")
