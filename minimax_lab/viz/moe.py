"""MoE pictures for notebook 04: expert loads over training, routing by modality, the aligned
token layout the fused kernel reads, and the recorded H200 comparison.

Every function draws on a matplotlib axis (made if not given) and returns the figure.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch


def _ax(ax, figsize=(6, 3.5)):
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
    return ax.figure, ax


def _np(a) -> np.ndarray:
    return a.detach().float().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a, dtype=float)


def load_heatmap(loads, *, ax=None, title: str = "", every: int = 1):
    """Heatmap of expert load over training: ``loads`` ``[steps, E]`` (tokens, or fractions, per
    expert per step). Each row is shown as a share of that step's routed slots; 1/E is balance."""
    a = _np(loads)
    if a.ndim != 2:
        raise ValueError(f"loads must be [steps, E], got shape {a.shape}")
    share = a / np.maximum(a.sum(axis=1, keepdims=True), 1e-12)
    fig, ax = _ax(ax)
    E = a.shape[1]
    im = ax.imshow(share[::every].T, aspect="auto", cmap="viridis", vmin=0, vmax=max(2.0 / E, float(share.max())),
                   interpolation="nearest", extent=(0, a.shape[0], E - 0.5, -0.5))
    ax.set(xlabel="training step", ylabel="expert", title=title)
    ax.set_yticks(range(E))
    fig.colorbar(im, ax=ax, fraction=0.046, label="share of routed slots")
    return fig


def imbalance_curve(curves: Mapping[str, Sequence[float]], *, ax=None, title: str = "max load / mean load"):
    """One line per run: the most loaded expert's load over the mean load, per step (1 = balanced).
    The legend sits to the right of the axes, where it hides no curve."""
    fig, ax = _ax(ax, figsize=(9, 3.5))
    for label, c in curves.items():
        ax.plot(np.arange(len(c)), c, label=label)
    ax.axhline(1.0, color="gray", ls=":", lw=1, label="perfect balance")
    ax.set(xlabel="training step", ylabel="busiest expert's slots / mean (ratio)", title=title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def modality_routing(image_share, text_share, *, ax=None, title: str = "where image and text tokens go"):
    """Grouped bars: for each expert, the share of image-token slots and of text-token slots it gets
    (``[E]`` each, summing to 1)."""
    img, txt = _np(image_share), _np(text_share)
    fig, ax = _ax(ax)
    x = np.arange(len(img))
    ax.bar(x - 0.2, img, 0.4, label="image patches", color="tab:cyan")
    ax.bar(x + 0.2, txt, 0.4, label="text tokens", color="tab:gray")
    ax.axhline(1.0 / len(img), color="k", ls=":", lw=1, label="uniform (1/E)")
    ax.set(xlabel="expert", ylabel="share of the modality's slots", title=title)
    ax.set_xticks(x)
    ax.set_ylim(0, max(float(img.max()), float(txt.max()), 1.0 / len(img)) * 1.3)
    ax.legend(fontsize=8, loc="upper center", ncol=3, frameon=False)   # in the headroom above the bars
    return fig


def alignment_strip(sorted_ids, block_expert, n_slots: int, block_m: int, top_k: int, *, ax=None,
                    title: str = "aligned rows: expert blocks and padding"):
    """The fused kernel's view of a batch: every padded row coloured by its block's expert (grey
    = padding, white = unused capacity), labelled with the token it holds."""
    ids, be = _np(sorted_ids).astype(int), _np(block_expert).astype(int)
    fig, ax = _ax(ax, figsize=(10, 1.8))
    cmap = plt.get_cmap("tab10")
    for r, s in enumerate(ids):
        e = be[r // block_m] if r // block_m < len(be) else -1
        color = "white" if e < 0 else (cmap(e % 10) if s < n_slots else "lightgray")
        ax.add_patch(plt.Rectangle((r, 0), 1, 1, color=color, ec="k", lw=0.3))
        if s < n_slots and len(ids) <= 96:
            ax.text(r + 0.5, 0.5, str(s // top_k), ha="center", va="center", fontsize=6)
    for b in range(0, len(ids) + 1, block_m):
        ax.axvline(b, color="k", lw=1.2)
    ax.set(xlim=(0, len(ids)), ylim=(0, 1), yticks=[], xlabel="padded row (label: token)", title=title)
    return fig


def recorded_comparison(records: Sequence[dict], *, axes=None, impls=("triton", "torch_grouped_mm"),
                        labels=None, decode_max_t: int = 256, targets=(80.0, 50.0)):
    """The ``moe`` suite's H200 records: tokens on x; left, used-expert weight bandwidth as % of the
    measured copy bandwidth (the decode regime's ceiling); right, % of the measured bf16 GEMM rate
    (the prefill regime's ceiling). One line per (shape, impl): colour = shape, line style = impl;
    the ceilings are 100 %, the ``targets`` (percent of each ceiling) dotted. Ceilings are recovered
    from the records (``gbps / pct`` and ``tflops / pct``). The legend sits below the two panels,
    where it hides no data; a note says why a point can sit above the copy ceiling."""
    recs = [r for r in records if r.get("suite") == "moe"]
    if not recs:
        raise ValueError("no 'moe' records to plot")
    copy = np.median([r["gbps"] / r["pct_of_ceiling"] * 100 for r in recs if r.get("ceiling") == "copy"
                      and r.get("pct_of_ceiling")])
    gemm = np.median([r["tflops"] / r["pct_of_ceiling"] * 100 for r in recs if r.get("ceiling") == "gemm"
                      and r.get("pct_of_ceiling")])
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    fig = axes[0].figure
    shapes = sorted({(r["shape"]["E"], r["shape"]["d"], r["shape"]["f"]) for r in recs})
    styles = {"triton": "-o", "torch_grouped_mm": "--s", "sglang_triton": "-.D", "loop": ":^"}
    labels = labels or {"triton": "ours (Triton)", "torch_grouped_mm": "torch._grouped_mm",
                        "sglang_triton": "SGLang fused MoE (Triton)", "loop": "per-expert loop"}
    colors = plt.get_cmap("tab10")
    over = 0.0
    for si, (E, d, f) in enumerate(shapes):
        for impl in impls:
            rs = sorted((r for r in recs if r["impl"] == impl and (r["shape"]["E"], r["shape"]["d"], r["shape"]["f"])
                         == (E, d, f)), key=lambda r: r["shape"]["T"])
            if not rs:
                continue
            T = [r["shape"]["T"] for r in rs]
            lab = f"{labels.get(impl, impl)}, E={E} d={d} f={f}"
            bw = [100 * r["gbps"] / copy for r in rs]
            over = max([over] + [b for b, t in zip(bw, T) if t <= decode_max_t])
            axes[0].plot(T, bw, styles.get(impl, "-"), color=colors(si), label=lab,
                         ms=4, alpha=1.0 if impl == "triton" else 0.6)
            axes[1].plot(T, [100 * r["tflops"] / gemm for r in rs], styles.get(impl, "-"), color=colors(si),
                         ms=4, alpha=1.0 if impl == "triton" else 0.6)
    for ax, name, tgt in ((axes[0], f"copy bandwidth ({copy:,.0f} GB/s)", targets[0]),
                          (axes[1], f"bf16 GEMM ({gemm:,.0f} TFLOP/s)", targets[1])):
        ax.set_xscale("log", base=2)
        ax.axhline(100, color="k", lw=1)
        ax.text(1, 98, f"ceiling: {name}", fontsize=7, va="top")
        ax.axhline(tgt, color="tab:red", ls=":", lw=1)
        ax.axvspan(0.7, decode_max_t * 1.4, color="tab:blue", alpha=0.05)
        ax.set_xlabel("tokens T (shaded: decode regime)")
    axes[0].text(1, targets[0] - 6, f"target {targets[0]:.0f}% at T=64-256", color="tab:red", fontsize=7)
    axes[1].text(1, targets[1] + 2, f"aim {targets[1]:.0f}% at T=16k", color="tab:red", fontsize=7)
    axes[0].set(ylabel="used experts' weights, % of copy GB/s", title="decode: weight streaming", ylim=(0, 115))
    axes[1].set(ylabel="% of bf16 GEMM rate", title="prefill: matrix units", ylim=(0, 110))
    if over > 100:
        axes[0].text(1, 104, "above 100%: copy_ counts reads + writes; a read-only stream runs a little faster",
                     fontsize=6, va="bottom")
    handles, labs = axes[0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.06 + 0.035 * ((len(labs) + 1) // 2), 1, 1))
    fig.legend(handles, labs, loc="lower center", ncol=2, fontsize=7, frameon=False)
    return fig


def tuner_candidates(timings: Mapping[str, Mapping[str, float]], best: str, *, ax=None,
                     title: str = "the tuner's prefill candidates"):
    """What ``python -m minimax_lab.bench.tune`` measured for one regime (``timings``: candidate label ->
    {case: ms}, as a run of its measurements file holds it, :func:`minimax_lab.bench.tune.recorded_run`;
    ``best``: the winner's label, :func:`minimax_lab.bench.tune.label`): one bar per candidate, its time at
    each case relative to the fastest candidate at that case, geometric mean over the cases (the
    tuner's score). TMA candidates in one colour, pointer loads in another; ``best`` outlined."""
    if not timings:
        raise ValueError("no tuner timings to plot")
    cases = sorted({c for t in timings.values() for c in t})
    fastest = {c: min(t[c] for t in timings.values() if c in t) for c in cases}
    score = {lbl: float(np.exp(np.mean([np.log(t[c] / fastest[c]) for c in t]))) for lbl, t in timings.items()}
    order = sorted(score, key=score.get)
    fig, ax = _ax(ax, figsize=(8, 0.35 * len(order) + 1.2))

    def short(lbl):
        kv = dict(item.split("=") for item in lbl.split(","))
        tile = f"{kv['BLOCK_M']}x{kv['BLOCK_N']}x{kv['BLOCK_K']} w{kv['num_warps']} s{kv['num_stages']}"
        down = f" down N{kv['DOWN_BLOCK_N']} K{kv['DOWN_BLOCK_K']}"
        group = f" GROUP_M={kv['GROUP_M']}" if "GROUP_M" in kv else ""
        return tile + down + group + (" TMA" if kv.get("USE_TMA") == "True" else "")

    colors = ["tab:orange" if "USE_TMA=True" in lbl else "tab:gray" for lbl in order]
    bars = ax.barh(range(len(order)), [score[lbl] for lbl in order], color=colors)
    for bar, lbl in zip(bars, order):
        if lbl == best:
            bar.set_edgecolor("k")
            bar.set_linewidth(2)
    ax.set_yticks(range(len(order)), [short(lbl) for lbl in order], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0.95, max(score.values()) * 1.02)
    ax.set_xlabel(f"time / fastest candidate (geometric mean over {len(cases)} cases)")
    ax.set_title(title + " (orange: weights through TMA)")
    return fig
