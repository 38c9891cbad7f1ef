"""A simulated run drawn step by step, one row per request
(:func:`minimax_lab.bench.suite_engine_timeline.timeline` records the events).
"""
from __future__ import annotations

import matplotlib.pyplot as plt


def plot_timeline(events: dict, *, ax=None, title: str = ""):
    """One row per request (:func:`minimax_lab.bench.suite_engine_timeline.timeline`): a thin grey line from
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
