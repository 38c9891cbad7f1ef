"""Pictures and computed sentences for chapter 05 (Mixture of Experts), so the chapter shows the
lesson and this module keeps the bookkeeping: the routing picture, expert loads over training,
routing by modality, the device's features, the expert-parallel check, and the H200
records drawn as one figure with the sentences that compare them.

Drawing functions take an axis (made if not given) or make their own figure, and return the
figure. Functions named ``*_words`` return text whose comparison words are computed from the
numbers they compare (:mod:`minimax_lab.notebook.words`), or say that nothing was recorded.
"""
from __future__ import annotations

import collections
from typing import Mapping, Sequence

import __main__
import matplotlib.pyplot as plt
import numpy as np
import torch

from minimax_lab import runtime
from minimax_lab.data import TOKENIZER, make_examples
from minimax_lab.moe import expert_counts
from minimax_lab.moe.parallel import run_gloo_check
from minimax_lab.notebook import words
from minimax_lab.viz import noise

#: how the figures name each implementation of the ``moe`` bench records
IMPL_LABELS = {"triton": "ours (Triton)", "torch_grouped_mm": "torch._grouped_mm",
               "sglang_triton": "SGLang fused MoE", "loop": "per-expert loop"}
_STYLES = {"triton": "-o", "torch_grouped_mm": "--s", "sglang_triton": "-.D", "loop": ":^"}


def _ax(ax, figsize=(6, 3.5)):
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
    return ax.figure, ax


def _np(a) -> np.ndarray:
    return a.detach().float().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a, dtype=float)


# --------------------------------------------------------------------------- the idea


def routing_grid(weights, ids, n_experts: int, *, ax=None, title: str = "the router: k experts per token"):
    """Tokens as rows, experts as columns: a cell in the expert's colour (as in
    :func:`alignment_strip`), labelled with the routing weight, where a token goes; under each
    column, how many tokens it got."""
    w, i = _np(weights), _np(ids).astype(int)
    fig, ax = _ax(ax, figsize=(4, 4))
    cmap = plt.get_cmap("tab10")
    for t in range(w.shape[0]):
        for j in range(w.shape[1]):
            e = i[t, j]
            ax.add_patch(plt.Rectangle((e - 0.5, t - 0.5), 1, 1, color=cmap(e % 10), alpha=0.25 + 0.6 * float(w[t, j])))
            ax.text(e, t, f"{w[t, j]:.2f}", ha="center", va="center", fontsize=7)
    counts = np.bincount(i.reshape(-1), minlength=n_experts)
    ax.set(xlim=(-0.5, n_experts - 0.5), ylim=(w.shape[0] - 0.5, -0.5))
    ax.set_xticks(range(n_experts), [f"{e}\n({c})" for e, c in enumerate(counts)])
    ax.set_yticks(range(w.shape[0]))
    ax.set(xlabel="expert (tokens routed to it)", ylabel="token", title=title)
    return fig


def idea_figure(weights, ids, alignment, *, block_m: int):
    """The chapter in one picture: the router's choices (left) and the same routed copies laid out
    expert by expert in blocks of ``block_m`` rows (right), the layout the fused kernel reads."""
    n_experts = len(alignment.counts)
    fig = plt.figure(figsize=(12, 3.6))
    grid = fig.add_gridspec(1, 2, width_ratios=(1, 2.6), wspace=0.15)
    routing_grid(weights, ids, n_experts, ax=fig.add_subplot(grid[0]))
    strip = fig.add_subplot(grid[1])
    n_slots = ids.numel()
    alignment_strip(alignment.sorted_ids[:int(alignment.num_rows)], alignment.block_expert, n_slots, block_m,
                    ids.shape[1], ax=strip,
                    title=f"the kernel's rows: slots sorted by expert, padded to blocks of {block_m} (grey)")
    strip.set_box_aspect(0.25)
    return fig


# --------------------------------------------------------------------------- balance in training


def attach_load_logger(model) -> list[list[torch.Tensor]]:
    """Hooks on every MoE layer of ``model`` (a ``TinyMultimodalModel`` with ``ffn="moe"``): per
    layer, a list that gets one ``[E]`` count of routed slots per training forward (padding
    tokens excluded)."""
    logs, state = [[] for _ in model.blocks], {}
    model.register_forward_pre_hook(lambda mod, args: state.update(tokens=args[0]))
    for i, blk in enumerate(model.blocks):
        def hook(mod, inp, out, i=i):
            if mod.training:
                keep = (state["tokens"] != TOKENIZER.pad_id).reshape(-1)
                logs[i].append(expert_counts(mod.last_ids[keep], mod.n_experts))
        blk.ffn.register_forward_hook(hook)
    return logs


def guessing_accuracy(n_questions: int, *, split: str = "val", seed: int = 0) -> float:
    """The answer accuracy of uniform guessing on the first ``n_questions`` of ``split`` (what
    ``model.train`` evaluates on): each question type has a fixed set of answers."""
    answers = collections.defaultdict(set)
    for ex in make_examples("train", 300, seed=123):
        answers[ex.qtype].add(ex.answer)
    qtypes = [ex.qtype for ex in make_examples(split, n_questions, seed)]
    return float(np.mean([1 / len(answers[q]) for q in qtypes]))


#: the steps the busiest-expert ratio sums over, in the figure's curve and in the printed lines alike
#: (image and text batches alternate and route differently, so one step alone swings)
BALANCE_WINDOW = 10


def busiest_over_mean(loads: torch.Tensor, *, last: int = BALANCE_WINDOW) -> float:
    """The busiest expert's routed slots over the mean, summed over the last ``last`` steps of
    ``loads [steps, E]`` (1.0 = perfect balance)."""
    total = loads[-last:].sum(0).float()
    return float(total.max() / total.mean())


def balance_figure(runs: Mapping[str, Mapping], *, window: int = BALANCE_WINDOW):
    """Per run (rows) and layer (columns) the expert loads over training as heatmaps, and below
    them the busiest expert / mean load of every run and layer, each step's load summed over the
    last ``window`` steps (image and text batches alternate and route differently).
    ``runs``: name -> {"loads": [per layer, [steps, E] counts]}."""
    names = list(runs)
    n_layers = len(runs[names[0]]["loads"])
    fig = plt.figure(figsize=(5.2 * n_layers, 2.5 * len(names) + 3.0))
    grid = fig.add_gridspec(len(names) + 1, n_layers, height_ratios=[1] * len(names) + [1.2], hspace=0.75, wspace=0.4)
    curves = {}
    shares = [(ld / ld.sum(1, keepdim=True).clamp_min(1)).max().item() for run in runs.values() for ld in run["loads"]]
    top = max(shares + [2.0 / runs[names[0]]["loads"][0].shape[1]])   # one colour scale for every map
    for r, name in enumerate(names):
        for layer, loads in enumerate(runs[name]["loads"]):
            load_heatmap(loads, ax=fig.add_subplot(grid[r, layer]), title=f"{name}: layer {layer}", vmax=top)
            sums = torch.stack([loads[max(0, i - window + 1):i + 1].sum(0) for i in range(len(loads))]).float()
            curves[f"{name}, layer {layer}"] = (sums.max(1).values / sums.mean(1)).numpy()
    imbalance_curve(curves, ax=fig.add_subplot(grid[-1, :]),
                    title=f"busiest expert / mean load, routed slots summed over the last {window} steps")
    return fig


def balance_words(runs: Mapping[str, Mapping], *, last: int = BALANCE_WINDOW) -> str:
    """The busiest expert / mean load of each run and layer over the last ``last`` steps (the last
    point of each curve of :func:`balance_figure`), and how it moved from the first run (unbalanced)
    to the last (balanced), layer by layer."""
    ratios = {name: [busiest_over_mean(l, last=last) for l in run["loads"]] for name, run in runs.items()}
    lines = [f"{name}: busiest expert / mean load over the last {last} steps (the curves' last points), per layer: "
             + ", ".join(f"{x:.2f}" for x in xs) for name, xs in ratios.items()]
    names = list(ratios)
    if len(names) > 1:
        moved = [f"layer {l} {words.change(a, b)}" for l, (a, b) in enumerate(zip(ratios[names[0]], ratios[names[-1]]))]
        lines.append(f"Busiest expert / mean load, '{names[0]}' -> '{names[-1]}': " + "; ".join(moved) + ".")
    return "\n".join(lines)


def modality_shares(model, batch) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Route ``batch`` through ``model`` (no gradient) and return, per MoE layer, the share of
    image-patch slots and of text-token slots each expert gets (``[E]`` each, summing to 1)."""
    seen = {}
    hooks = [blk.ffn.register_forward_hook(lambda m, i, o, l=l: seen.__setitem__(l, m.last_ids.cpu()))
             for l, blk in enumerate(model.blocks)]
    try:
        with torch.no_grad():
            model(batch.tokens, batch.images)
    finally:
        for h in hooks:
            h.remove()
    tok = batch.tokens.cpu().reshape(-1)
    is_img, is_txt = tok == TOKENIZER.img_id, (tok != TOKENIZER.img_id) & (tok != TOKENIZER.pad_id)
    out = []
    for layer in sorted(seen):
        n = model.blocks[layer].ffn.n_experts
        ci, ct = expert_counts(seen[layer][is_img], n).float(), expert_counts(seen[layer][is_txt], n).float()
        out.append((ci / ci.sum(), ct / ct.sum()))
    return out


def modality_figure(shares: Sequence[tuple[torch.Tensor, torch.Tensor]]):
    """One panel per layer: each expert's share of the image-patch slots and of the text slots."""
    fig, axes = plt.subplots(1, len(shares), figsize=(5.5 * len(shares), 3.2), squeeze=False)
    for layer, (img, txt) in enumerate(shares):
        modality_routing(img, txt, ax=axes[0, layer], title=f"layer {layer}: image vs text slots")
    fig.tight_layout()
    return fig


def modality_words(shares: Sequence[tuple[torch.Tensor, torch.Tensor]], top_k: int) -> str:
    """Per layer: the expert with the most image-patch slots, its share of them and of the text
    slots, and the share of patches that pick it (its slot share times ``top_k``: a token's
    ``top_k`` experts are distinct)."""
    lines = []
    for layer, (img, txt) in enumerate(shares):
        top = int(img.argmax())
        a, b = float(img[top]), float(txt[top])
        lines.append(f"layer {layer}: expert {top} takes {a:.0%} of the image-patch slots (uniform: {1 / len(img):.1%}), "
                     f"so {min(1.0, a * top_k):.0%} of the patches pick it; its image share is "
                     + (f"{words.more_or_less(a, b, bigger='larger', smaller='smaller')} its text share ({b:.0%})"
                        if a > 0 and b > 0 else f"{a:.0%} and its text share {b:.0%}"))
    return "\n".join(lines)


def load_heatmap(loads, *, ax=None, title: str = "", every: int = 1, vmax: float | None = None):
    """Heatmap of expert load over training: ``loads`` ``[steps, E]`` (tokens, or fractions, per
    expert per step). Each row is shown as a share of that step's routed slots; 1/E is balance.
    ``vmax`` (default: this map's own largest share, at least 2/E) fixes the top of the colour
    scale, so maps drawn side by side can share it."""
    a = _np(loads)
    if a.ndim != 2:
        raise ValueError(f"loads must be [steps, E], got shape {a.shape}")
    share = a / np.maximum(a.sum(axis=1, keepdims=True), 1e-12)
    fig, ax = _ax(ax)
    E = a.shape[1]
    top = vmax if vmax is not None else max(2.0 / E, float(share.max()))
    im = ax.imshow(share[::every].T, aspect="auto", cmap="viridis", vmin=0, vmax=top,
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
    ax.set(xlabel="training step", ylabel="busiest expert / mean", title=title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
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
            ax.text(r + 0.5, 0.5, str(s // top_k), ha="center", va="center", fontsize=7)
    for b in range(0, len(ids) + 1, block_m):
        ax.axvline(b, color="k", lw=1.2)
        if b < len(ids) and b // block_m < len(be) and be[b // block_m] >= 0:
            ax.text(b + block_m / 2, 1.04, f"expert {be[b // block_m]}", ha="center", va="bottom", fontsize=8)
    ax.set(xlim=(0, len(ids)), ylim=(0, 1), yticks=[], xlabel="padded row (label: the token it holds)")
    ax.set_title(title, pad=20)
    return fig


# --------------------------------------------------------------------------- the package's kernels


def run_parallel_check(cases: Sequence[dict], *, device=None, timeout_s: float = 180.0) -> list[str]:
    """:func:`minimax_lab.moe.parallel.run_gloo_check` on ``cases`` in two processes; one line per
    case: its settings and, per rank, the largest difference from the single-process layer and
    the tokens that rank held."""
    if "triton" in getattr(__main__, "__file__", ""):
        # Triton's interpreter can leave its own file as a notebook's __main__.__file__; the
        # spawned ranks would then run that file instead of importing their target
        del __main__.__file__
    results = run_gloo_check(list(cases), world_size=2, timeout_s=timeout_s, device=device)
    return [f"{case}\n   per rank (max |EP - single|, tokens): {per_rank}" for case, per_rank in zip(cases, results)]


# --------------------------------------------------------------------------- the H200 records


def _rec(records: Sequence[dict], E: int, T: int, impl: str) -> dict | None:
    return next((r for r in records if r["shape"]["E"] == E and r["shape"]["T"] == T and r["impl"] == impl), None)


def _draw_regimes(records: Sequence[dict], axes, impls: Sequence[str], decode_suffix: str = "") -> None:
    """Left: decode, % of the copy ceiling (records of ``impl + decode_suffix``, e.g. the CUDA-graph
    twins); right: prefill, % of the bf16 GEMM ceiling; one line per (shape, impl), colour =
    shape, line style = impl, against tokens T on a log axis."""
    shapes = sorted({(r["shape"]["E"], r["shape"]["d"], r["shape"]["f"]) for r in records})
    colors = plt.get_cmap("tab10")
    for si, (E, d, f) in enumerate(shapes):
        for impl in impls:
            def line(name):
                return sorted((r for r in records if r["impl"] == name and r.get("pct_of_ceiling") is not None
                               and (r["shape"]["E"], r["shape"]["d"], r["shape"]["f"]) == (E, d, f)),
                              key=lambda r: r["shape"]["T"])
            for ax, ceiling, rs in zip(axes, ("copy", "gemm"), (line(impl + decode_suffix), line(impl))):
                part = [r for r in rs if r.get("ceiling") == ceiling]
                if part:
                    ax.plot([r["shape"]["T"] for r in part], [r["pct_of_ceiling"] for r in part],
                            _STYLES.get(impl, "-"), color=colors(si), ms=4, alpha=1.0 if impl == "triton" else 0.6,
                            label=f"{IMPL_LABELS.get(impl, impl)}, E={E} d={d} f={f}")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.axhline(100, color="k", lw=1)
        ax.set_xlabel("tokens T")
        ax.grid(alpha=0.3)
    axes[0].set(ylabel="% of copy bandwidth", ylim=(0, 115),
                title="decode: streaming the used experts' weights" + (" (CUDA graphs)" if decode_suffix else ""))
    axes[1].set(ylabel="% of bf16 GEMM rate", title="prefill: matrix units", ylim=(0, 110))
    if any(r.get("ceiling") == "copy" and r.get("pct_of_ceiling", 0) > 100 for r in records):
        axes[0].text(0.02, 0.98, "above 100%: a copy reads and writes; a weight stream only reads",
                     transform=axes[0].transAxes, fontsize=7, va="top")


def recorded_comparison(records: Sequence[dict], *, axes=None, impls=("triton", "torch_grouped_mm")):
    """The ``moe`` suite's records in two panels: decode sizes as % of the measured copy bandwidth
    (used experts' weights read once), prefill sizes as % of the measured bf16 GEMM rate. One line
    per (shape, impl); the legend sits below the panels, where it hides no data."""
    recs = [r for r in records if r.get("suite") == "moe"]
    if not recs:
        raise ValueError("no 'moe' records to plot")
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(12, 4))
    fig = axes[0].figure
    _draw_regimes(recs, axes, impls)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.06 + 0.035 * ((len(labels) + 1) // 2), 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=7, frameon=False)
    return fig


def fp8_panel(records: Sequence[dict], *, ax=None):
    """FP8 weights against bf16, the same kernels on the same routing: bf16 time / FP8 time per
    token count, launched eagerly and replayed as a CUDA graph (above 1: FP8 is faster)."""
    fig, ax = _ax(ax, figsize=(5, 3.5))
    Ts = sorted({r["shape"]["T"] for r in records if r["impl"] == "triton_fp8"})
    for j, (suffix, label) in enumerate((("", "launched eagerly"), ("_cudagraph", "CUDA-graph replay"))):
        xs, ys = [], []
        for i, T in enumerate(Ts):
            f8 = next((r for r in records if r["shape"]["T"] == T and r["impl"] == "triton_fp8" + suffix), None)
            bf = next((r for r in records if r["shape"]["T"] == T and r["impl"] == "triton_bf16" + suffix), None)
            if f8 and bf:
                xs.append(i + (j - 0.5) * 0.38)
                ys.append(bf["ms"] / f8["ms"])
        bars = ax.bar(xs, ys, 0.38, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(1.0, color="k", lw=1)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.12)
    E = next((r["shape"]["E"] for r in records), "?")
    ax.set_xticks(range(len(Ts)), [f"{T:,}" for T in Ts])
    ax.set(xlabel="tokens T", ylabel="bf16 time / FP8 time", title=f"FP8 weights vs bf16 (ours, E={E})")
    ax.legend(fontsize=7, frameon=False, loc="upper left")
    return fig


def on_a_gpu(records: Sequence[dict], *, measured: Sequence[dict] = (), device_now: str | None = None):
    """The chapter's one figure from the records: decode and prefill of ours and the peers (bf16),
    and FP8 against bf16. ``measured``: this machine's records of the same suite, drawn as stars
    labelled with ``device_now``. Raises ValueError without records."""
    bf16 = [r for r in records if r.get("suite") == "moe" and not r["case"].startswith("fp8_")]
    fp8 = [r for r in records if r.get("suite") == "moe" and r["case"].startswith("fp8_")]
    if not bf16:
        raise ValueError("no 'moe' records to plot")
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.4), gridspec_kw=dict(width_ratios=(1, 1, 0.75)))
    graphed = any(r["impl"].endswith("_cudagraph") for r in bf16)
    _draw_regimes(bf16, axes[:2], ("triton", "torch_grouped_mm", "sglang_triton"), "_cudagraph" if graphed else "")
    for r in measured:   # the same timing method as the recorded lines they sit on
        want = "triton" + ("_cudagraph" if graphed and r.get("ceiling") == "copy" else "")
        if r["impl"] == want and r.get("pct_of_ceiling") is not None:
            ax = axes[0] if r.get("ceiling") == "copy" else axes[1]
            ax.plot(r["shape"]["T"], r["pct_of_ceiling"], "*", color="k", ms=11,
                    label=f"ours on {device_now or 'this GPU'}, measured now")
    if fp8:
        fp8_panel(fp8, ax=axes[2])
    else:
        axes[2].set_axis_off()
    handles, labels = [], []
    for ax in axes[:2]:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    fig.suptitle("recorded on an NVIDIA H200" + (f" (stars: {device_now}, now)" if measured else ""), y=0.99)
    fig.tight_layout(rect=(0, 0.05 + 0.03 * ((len(labels) + 2) // 3), 1, 0.97))
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
    return fig


def on_a_gpu_words(records: Sequence[dict], *, E: int = 128) -> str:
    """Sentences on the records, every comparison computed and judged against the p20-p80 spreads of
    the two timings (:func:`minimax_lab.viz.noise.speed_words`): decode at T = 64 and prefill at the
    largest T, ours against ``torch._grouped_mm`` and SGLang at ``E``; FP8 against bf16. Says so
    when nothing was recorded."""
    bf16 = [r for r in records if r.get("suite") == "moe" and not r["case"].startswith("fp8_")]
    if not bf16:
        return "No H200 records of the `moe` suite: `python -m minimax_lab.bench moe` on a GPU writes them."
    Es = sorted({r["shape"]["E"] for r in bf16})
    out = []
    graphed = _rec(bf16, E, 64, "triton_cudagraph") is not None
    sfx, mode = ("_cudagraph", "under CUDA-graph replay") if graphed else ("", "launched eagerly")
    ours = _rec(bf16, E, 64, "triton" + sfx)
    if ours:
        got = [r for e in Es if (r := _rec(bf16, e, 64, "triton" + sfx))]
        pcts = " and ".join(f"{r['pct_of_ceiling']:.0f}% (E={r['shape']['E']})" for r in got)
        peers = [f"{noise.speed_words(ours, p)} {name}" for impl, name in
                 (("torch_grouped_mm", "`torch._grouped_mm`"), ("sglang_triton", "SGLang's fused MoE"))
                 if (p := _rec(bf16, E, 64, impl + sfx))]
        past = (" (past 100%: the ceiling is a copy, which mixes reads and writes, and the memory turns between the "
                "two at a small cost; streaming weights only reads)"
                if any(r["pct_of_ceiling"] > 100 for r in got) else "")
        out.append(f"In decode (T = 64, {mode}) ours streams the used experts' weights at {pcts} of the "
                   f"measured copy bandwidth{past}" + (f", {' and '.join(peers)} at E={E}" if peers else "") + ".")
    T_pre = max(r["shape"]["T"] for r in bf16)
    ours = _rec(bf16, E, T_pre, "triton")
    if ours and ours.get("ceiling") == "gemm":
        pcts = " and ".join(f"{r['pct_of_ceiling']:.0f}% (E={e})" for e in Es if (r := _rec(bf16, e, T_pre, "triton")))
        peers = [f"{noise.speed_words(ours, p)} {name}" for impl, name in
                 (("torch_grouped_mm", "`torch._grouped_mm`"), ("sglang_triton", "SGLang's fused MoE"))
                 if (p := _rec(bf16, E, T_pre, impl))]
        standins = " (three of SGLang's helpers, CUDA extensions there, run as stand-ins)" \
            if _rec(bf16, E, T_pre, "sglang_triton") else ""
        out.append(f"In prefill (T = {T_pre:,}) it reaches {pcts} of the measured bf16 GEMM rate"
                   + (f", {' and '.join(peers)} at E={E}{standins}" if peers else "") + ".")
    fp8 = [r for r in records if r.get("suite") == "moe" and r["case"].startswith("fp8_")]
    pairs = []
    for T, sfx, how in ((64, "_cudagraph", "at T = 64 under graph replay"), (64, "", "launched eagerly"),
                        (T_pre, "", f"at T = {T_pre:,}")):
        f8 = next((r for r in fp8 if r["shape"]["T"] == T and r["impl"] == "triton_fp8" + sfx), None)
        bf = next((r for r in fp8 if r["shape"]["T"] == T and r["impl"] == "triton_bf16" + sfx), None)
        if f8 and bf:
            pairs.append(f"{noise.speed_words(f8, bf)} bf16 {how}")
    if pairs:
        out.append(f"FP8 weights make ours {', '.join(pairs[:-1]) + ' and ' if len(pairs) > 1 else ''}{pairs[-1]}.")
    if out and noise.has_spread(*records):
        out.append("Each comparison counts as a gap only where the p20-p80 spreads of the two timings do not overlap.")
    return " ".join(out)
