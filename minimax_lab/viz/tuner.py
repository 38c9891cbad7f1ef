"""The launch-config tuner's measurements as chapter 05 shows them: what ``python -m
minimax_lab.bench.tune`` timed for the fused MoE experts, each candidate's score (time over the
fastest candidate at each case, geometric mean over the cases), the pick, and how the best
candidate that loads weights by pointers compares with it -- a figure and computed words.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np

from minimax_lab.bench import tune
from minimax_lab.notebook import words


def tuner_measurements(op: str = "moe_experts", key: str = "prefill") -> tuple[dict, str] | None:
    """What the tuner measured for ``op`` at ``key`` on the H200 (its newest run in the shipped
    measurements, :func:`minimax_lab.bench.tune.recorded_run`): ``(timings, chosen)``, where
    ``timings`` maps each candidate's label (``"BLOCK_M=128,...,USE_TMA=True"``) to its ms per
    case and ``chosen`` is the label of the config that run picked; None where nothing is stored."""
    run = tune.recorded_run(op, key)
    if not run or not run.get("timings") or not run.get("config"):
        return None
    return run["timings"], tune.label(run["config"])


#: the kernel's defaults for the keys a candidate may leave out (``experts_triton``: ``SWAP_AB`` off,
#: ``DOWN_SWAP_AB`` following ``SWAP_AB``), so two labels of one config are read as one config
_MOE_DEFAULTS = {"SWAP_AB": "False", "USE_TMA": "False"}


def _config(label: str) -> dict:
    """A tuner label as the config the kernel runs: the keys it names, with the defaults filled in."""
    kv = dict(item.split("=") for item in label.split(","))
    full = {**_MOE_DEFAULTS, **kv}
    full.setdefault("DOWN_SWAP_AB", full["SWAP_AB"])
    return full


def _tile_label(label: str) -> str:
    kv = _config(label)
    return (f"{kv.get('BLOCK_M')}x{kv.get('BLOCK_N')}x{kv.get('BLOCK_K')} tiles, {kv.get('num_warps')} warps, "
            f"{kv.get('num_stages')} stages")


def tuner_scores(timings: Mapping[str, Mapping[str, float]]) -> dict[tuple, list[float]]:
    """The tuner's score of each distinct config (time at each case over the fastest candidate's
    there, geometric mean over the cases), candidates that name one config two ways (a default
    spelled out) gathered under it: ``{config items: [score, ...]}``, one score per timing."""
    cases = sorted({c for t in timings.values() for c in t})
    fastest = {c: min(t[c] for t in timings.values() if c in t) for c in cases}
    out: dict[tuple, list[float]] = {}
    for lbl, t in timings.items():
        key = tuple(sorted(_config(lbl).items()))
        out.setdefault(key, []).append(float(np.exp(np.mean([np.log(t[c] / fastest[c]) for c in t]))))
    return out


def _repeat_noise(scores: Mapping[tuple, Sequence[float]]) -> float | None:
    """The largest gap between two timings of one config, as a share: the tuner's own noise."""
    gaps = [max(v) / min(v) - 1 for v in scores.values() if len(v) > 1]
    return max(gaps) if gaps else None


def tuner_words(timings: Mapping[str, Mapping[str, float]], chosen: str) -> str:
    """The tuner's pick and how the best candidate that loads weights through pointers (not TMA)
    compares with it, by the tuner's own score (geometric mean over cases of time / fastest),
    beside the tuner's noise where it timed one config twice."""
    scores = tuner_scores(timings)
    score = {k: float(np.mean(v)) for k, v in scores.items()}
    pick = tuple(sorted(_config(chosen).items()))
    tma = dict(pick).get("USE_TMA") == "True"
    text = f"The tuner's pick: {_tile_label(chosen)}, weights {'through TMA' if tma else 'by pointer loads'}."
    pointer = [k for k in score if dict(k).get("USE_TMA") != "True"]
    cases = len({c for t in timings.values() for c in t})
    noise_share = _repeat_noise(scores)
    if tma and pointer and pick in score:
        best = min(pointer, key=score.get)
        gap = score[best] / score[pick] - 1
        text += (f" The best candidate with pointer loads ({_tile_label(','.join(f'{k}={v}' for k, v in best))}) is "
                 f"{words.speed(score[best], score[pick], same_within=0.0)} it over the {cases} prefill cases")
        if noise_share is not None:
            close = [k for k in score if k != pick and score[k] / score[pick] - 1 <= noise_share]
            text += (f"; one config the tuner timed twice came out {noise_share:.1%} apart, so that gap is "
                     + ("larger than" if gap > noise_share else "inside") + " its noise, and "
                     + (f"{len(close)} other candidate{'s lie' if len(close) > 1 else ' lies'} within it of the pick: "
                        "among those the pick is a toss-up" if close else "no other candidate lies within it of the pick"))
        text += "."
    return text


def tuner_candidates(timings: Mapping[str, Mapping[str, float]], best: str, *, ax=None,
                     title: str = "the tuner's prefill candidates"):
    """What ``python -m minimax_lab.bench.tune`` measured for one regime (``timings``: candidate label ->
    {case: ms}, as a run of its measurements file holds it, :func:`minimax_lab.bench.tune.recorded_run`;
    ``best``: the winner's label, :func:`minimax_lab.bench.tune.label`): one bar per distinct config, its
    time above the fastest candidate at each case, geometric mean over the cases (the tuner's score), as a
    percentage from a true zero. A config timed twice (named two ways) is one bar at the mean of its two
    scores, with both marked. TMA candidates in one colour, pointer loads in another; ``best`` outlined."""
    if not timings:
        raise ValueError("no tuner timings to plot")
    scores = tuner_scores(timings)
    mean = {k: float(np.mean(v)) for k, v in scores.items()}
    order = sorted(mean, key=mean.get)
    cases = len({c for t in timings.values() for c in t})
    ax = ax if ax is not None else plt.subplots(figsize=(8, 0.35 * len(order) + 1.4))[1]

    def short(key):
        kv = dict(key)
        tile = f"{kv['BLOCK_M']}x{kv['BLOCK_N']}x{kv['BLOCK_K']} w{kv['num_warps']} s{kv['num_stages']}"
        down = f" down N{kv['DOWN_BLOCK_N']} K{kv['DOWN_BLOCK_K']}"
        group = f" GROUP_M={kv['GROUP_M']}" if "GROUP_M" in kv else ""
        swap = " swap" if kv["SWAP_AB"] == "True" else ""
        return tile + down + group + swap + (" TMA" if kv["USE_TMA"] == "True" else "") + \
            (" (timed twice)" if len(scores[key]) > 1 else "")

    pick = tuple(sorted(_config(best).items()))
    colors = ["tab:orange" if dict(k)["USE_TMA"] == "True" else "tab:gray" for k in order]
    bars = ax.barh(range(len(order)), [100 * (mean[k] - 1) for k in order], color=colors)
    for y, k in enumerate(order):
        if k == pick:
            bars[y].set_edgecolor("k")
            bars[y].set_linewidth(2)
        if len(scores[k]) > 1:
            ax.plot([100 * (v - 1) for v in scores[k]], [y] * len(scores[k]), "k|", ms=12, mew=1.5)
    ax.set_yticks(range(len(order)), [short(k) for k in order], fontsize=8.5)
    ax.invert_yaxis()
    ax.set_xlabel(f"time above the fastest candidate at each case, % (geometric mean over {cases} cases)")
    noise_share = _repeat_noise(scores)
    ax.set_title(title + " (orange: weights through TMA)"
                 + (f"\nticks: the two timings of one config, {noise_share:.1%} apart: the tuner's noise"
                    if noise_share is not None else ""), fontsize=10)
    return ax.figure
