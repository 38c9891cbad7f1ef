"""Pictures and computed sentences for chapter 05 (Mixture of Experts), so the chapter shows the
lesson and this module keeps the bookkeeping: the chapter's setup, the routing picture, expert
loads and correction biases over training, routing by modality, FP8 weight bytes, the
expert-parallel check in processes, and the H200 records drawn as one figure with the sentences
that compare them (the records themselves: :mod:`minimax_lab.viz.moe_records`).

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
from matplotlib.lines import Line2D
import triton

from minimax_lab import measure, runtime
from minimax_lab.bench import suite_moe
from minimax_lab.data import TOKENIZER, make_examples
from minimax_lab.moe import expert_counts, moe_experts
from minimax_lab.moe.parallel import run_gloo_check
from minimax_lab.notebook import words
from minimax_lab.viz import noise
from minimax_lab.viz.flash_steps import recorded_with


def setup(preset: str = "auto") -> tuple[str, torch.device, torch.dtype]:
    """The chapter's one setup call: ``(preset, device, dtype)`` -- the preset resolved, the device
    the Triton kernels take their inputs on and the compute dtype -- after printing one line that
    says where the chapter runs. At preset ``cpu`` torch gets one thread: the chapter's matrices
    are too small to be worth splitting, and Triton's interpreter runs on one core anyway."""
    p, dev, dtype = runtime.resolve_preset(preset), runtime.kernel_device(), runtime.compute_dtype()
    if p == "cpu":
        torch.set_num_threads(1)
    where = "in its interpreter (numpy, one program after another)" if runtime.is_interpreter() else "compiled"
    print(f"{runtime.device_name()}, preset {p}, {str(dtype).replace('torch.', '')}; Triton {triton.__version__} "
          f"{where}; torch {torch.__version__}")
    return p, dev, dtype


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


class RoutingLog:
    """What every MoE layer of ``model`` (a ``TinyMultimodalModel`` with ``ffn="moe"``) routed in
    each training forward, recorded by hooks: per layer, ``loads`` ``[steps, E]`` (routed slots
    per expert, padding tokens excluded) and ``bias`` ``[steps, E]`` (the correction bias after
    that step's update); ``image_steps`` ``[steps]`` (bool): the steps whose batch held images."""

    def __init__(self, model):
        self._loads, self._bias = [[] for _ in model.blocks], [[] for _ in model.blocks]
        self._image, state = [], {}

        def batch(mod, args):
            state["tokens"] = args[0]
            if mod.training:
                self._image.append(bool((args[0] == TOKENIZER.img_id).any()))

        model.register_forward_pre_hook(batch)
        for i, blk in enumerate(model.blocks):
            def hook(mod, inp, out, i=i):
                if mod.training:
                    keep = (state["tokens"] != TOKENIZER.pad_id).reshape(-1)
                    self._loads[i].append(expert_counts(mod.last_ids[keep], mod.n_experts).cpu())
                    self._bias[i].append(mod.expert_bias.detach().float().cpu().clone())
            blk.ffn.register_forward_hook(hook)

    @property
    def loads(self) -> list[torch.Tensor]:
        return [torch.stack(x) for x in self._loads]

    @property
    def bias(self) -> list[torch.Tensor]:
        return [torch.stack(x) for x in self._bias]

    @property
    def image_steps(self) -> torch.Tensor:
        return torch.tensor(self._image, dtype=torch.bool)

    def result(self) -> dict:
        """``{"loads", "bias", "image_steps"}``, as :func:`balance_figure` and :func:`sign_rule_words` take a run."""
        return {"loads": self.loads, "bias": self.bias, "image_steps": self.image_steps}


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
    last ``window`` steps (image and text batches alternate and route differently), shaded with its
    range over the pairs of steps in the window (:func:`pair_ratios`).
    ``runs``: name -> {"loads": [per layer, [steps, E] counts]}."""
    names = list(runs)
    n_layers = len(runs[names[0]]["loads"])
    fig = plt.figure(figsize=(5.2 * n_layers, 2.5 * len(names) + 3.0))
    grid = fig.add_gridspec(len(names) + 1, n_layers, height_ratios=[1] * len(names) + [1.2], hspace=0.75, wspace=0.4)
    curves, bands = {}, {}
    shares = [(ld / ld.sum(1, keepdim=True).clamp_min(1)).max().item() for run in runs.values() for ld in run["loads"]]
    top = max(shares + [2.0 / runs[names[0]]["loads"][0].shape[1]])   # one colour scale for every map
    for r, name in enumerate(names):
        for layer, loads in enumerate(runs[name]["loads"]):
            load_heatmap(loads, ax=fig.add_subplot(grid[r, layer]), title=f"{name}: layer {layer}", vmax=top)
            sums = torch.stack([loads[max(0, i - window + 1):i + 1].sum(0) for i in range(len(loads))]).float()
            curves[f"{name}, layer {layer}"] = (sums.max(1).values / sums.mean(1)).numpy()
            pairs = [pair_ratios(loads[max(0, i - window + 1):i + 1], last=window) if i else [np.nan]
                     for i in range(len(loads))]
            bands[f"{name}, layer {layer}"] = (np.array([min(p) for p in pairs]), np.array([max(p) for p in pairs]))
    imbalance_curve(curves, ax=fig.add_subplot(grid[-1, :]), bands=bands,
                    title=f"busiest expert / mean load, routed slots summed over the last {window} steps "
                          "(band: its range over the step pairs in them)")
    return fig


def pair_ratios(loads: torch.Tensor, *, last: int = BALANCE_WINDOW) -> list[float]:
    """The busiest expert's slots over the mean for each pair of consecutive steps among the last
    ``last`` of ``loads [steps, E]`` (in the mixed schedule a pair is one image and one text batch):
    the spread of :func:`busiest_over_mean` from step to step."""
    tail = loads[-last:].float()
    tail = tail[len(tail) % 2:]
    pairs = tail.reshape(len(tail) // 2, 2, -1).sum(1)
    return (pairs.max(1).values / pairs.mean(1)).tolist()


def balance_words(runs: Mapping[str, Mapping], *, last: int = BALANCE_WINDOW) -> str:
    """The busiest expert / mean load of each run and layer over the last ``last`` steps (the last
    point of each curve of :func:`balance_figure`) with its range over the step pairs in them
    (:func:`pair_ratios`), and how it moved from the first run (unbalanced) to the last
    (balanced), layer by layer: a move only where the two ranges do not overlap."""
    ratios = {name: [busiest_over_mean(l, last=last) for l in run["loads"]] for name, run in runs.items()}
    spans = {name: [pair_ratios(l, last=last) for l in run["loads"]] for name, run in runs.items()}
    lines = [f"{name}: busiest expert / mean load over the last {last} steps (the curves' last points), per layer: "
             + ", ".join(f"{x:.2f} ({min(sp):.2f}-{max(sp):.2f} over {len(sp)} step pairs)"
                         for x, sp in zip(xs, spans[name]))
             for name, xs in ratios.items()]
    names = list(ratios)
    if len(names) > 1:
        first, final = names[0], names[-1]
        moved = []
        for layer, (a, b) in enumerate(zip(ratios[first], ratios[final])):
            sa, sb = spans[first][layer], spans[final][layer]
            overlap = min(sa) <= max(sb) and min(sb) <= max(sa)
            moved.append(f"layer {layer} " + (f"moved from {a:.3g} to {b:.3g}, inside the spread of the step pairs"
                                              if overlap else words.change(a, b)))
        lines.append(f"Busiest expert / mean load, '{first}' -> '{final}': " + "; ".join(moved) + ".")
    return "\n".join(lines)


def _busiest_image_expert(run: Mapping, last: int) -> tuple[int, int]:
    """(layer, expert) with the largest load over the mean on the image steps among the last ``last``."""
    best, where = -1.0, (0, 0)
    for layer, loads in enumerate(run["loads"]):
        img = run["image_steps"][-last:]
        rel = loads[-last:][img].float() / loads[-last:][img].float().mean(1, keepdim=True)
        e = int(rel.mean(0).argmax())
        if float(rel.mean(0)[e]) > best:
            best, where = float(rel.mean(0)[e]), (layer, e)
    return where


def _relative_load(run: Mapping, layer: int, expert: int) -> np.ndarray:
    loads = run["loads"][layer].float()
    return (loads[:, expert] / loads.mean(1)).numpy()


def sign_rule_words(run: Mapping, *, rate: float, last: int = BALANCE_WINDOW) -> str:
    """For the balanced ``run`` (a :meth:`RoutingLog.result` with the bias updated at ``rate``):
    the expert busiest on image steps, its load over the mean on the image and on the text steps
    among the last ``last`` (mean and range over the steps), and what the sign rule did to its
    bias: how many steps moved it down and up, and where it ended."""
    layer, e = _busiest_image_expert(run, last)
    rel, img = _relative_load(run, layer, e)[-last:], run["image_steps"][-last:].numpy()
    bias = run["bias"][layer][:, e].numpy()
    steps = np.diff(np.concatenate([[0.0], bias]))
    down, up = int((steps < -rate / 2).sum()), int((steps > rate / 2).sum())

    def span(x):
        return f"{x.mean():.2f}x the mean ({x.min():.2f}-{x.max():.2f} over {len(x)} steps)"
    text = (f"Layer {layer}'s expert {e}, over the last {last} steps of the balanced run: on image steps "
            f"{span(rel[img])}, on text steps {span(rel[~img])}. Its bias moves by {rate:g} a step (not at all "
            f"when its load equals the mean): over {len(bias)} steps, down {down} times and up {up} times, ending at "
            f"{bias[-1]:+.3f}, "
            f"{abs(bias[-1]) / (rate * len(bias)):.0%} of the way the rule could have moved it.")
    if rel[img].min() > 1 > rel[~img].max() and abs(bias[-1]) <= 0.25 * rate * len(bias):
        text += (" Over the mean on each of those image steps, under it on each text step: the bias went down and "
                 "up in turn, by the same step whatever the size of the imbalance, and stayed near where it began.")
    return text


def sign_rule_figure(runs: Mapping[str, Mapping], *, last: int = BALANCE_WINDOW):
    """The expert busiest on image steps in the last run (the balanced one), step by step: left, its
    load over the mean load on image and on text steps in every run; right, its correction bias
    in the last run."""
    names = list(runs)
    layer, e = _busiest_image_expert(runs[names[-1]], last)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 3.4), gridspec_kw=dict(width_ratios=(1.4, 1)))
    for name, style in zip(names, ("--", "-")):
        run = runs[name]
        rel, img = _relative_load(run, layer, e), run["image_steps"].numpy()
        x = np.arange(len(rel))
        ax.plot(x[img], rel[img], style, marker="o", ms=3, color="tab:cyan", label=f"image steps, {name}")
        ax.plot(x[~img], rel[~img], style, marker="s", ms=3, color="tab:gray", label=f"text steps, {name}")
    ax.axhline(1.0, color="k", ls=":", lw=1, label="the mean load")
    ax.set(xlabel="training step", ylabel="its slots / mean slots per expert",
           title=f"layer {layer}, expert {e}: its load, step by step")
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    bias = runs[names[-1]]["bias"][layer][:, e].numpy()
    bx.plot(np.arange(len(bias)), bias, "-o", ms=3, color="tab:purple")
    bx.axhline(0.0, color="k", ls=":", lw=1)
    bx.set(xlabel="training step", ylabel="correction bias", title=f"its bias in '{names[-1]}'")
    fig.tight_layout()
    return fig


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


def imbalance_curve(curves: Mapping[str, Sequence[float]], *, ax=None, title: str = "max load / mean load",
                    bands: Mapping[str, tuple] | None = None):
    """One line per run: the most loaded expert's load over the mean load, per step (1 = balanced),
    and, where ``bands`` gives a curve's ``(low, high)`` per step, its spread as a shaded band.
    The legend sits to the right of the axes, where it hides no curve."""
    fig, ax = _ax(ax, figsize=(9, 3.5))
    for label, c in curves.items():
        (line,) = ax.plot(np.arange(len(c)), c, label=label)
        if bands and label in bands:
            ax.fill_between(np.arange(len(c)), *bands[label], color=line.get_color(), alpha=0.15, lw=0)
    ax.axhline(1.0, color="gray", ls=":", lw=1, label="perfect balance")
    ax.set(xlabel="training step", ylabel="busiest expert / mean", title=title)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
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
    ax.legend(fontsize=9, loc="upper center", ncol=3, frameon=False)   # in the headroom above the bars
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


# --------------------------------------------------------------------------- FP8 experts and expert parallelism


def fp8_bytes_words(w_gate_up_fp8, gate_up_scale, w_down_fp8, down_scale, w_gate_up, w_down) -> str:
    """What the FP8 experts store (weights and scales) against the same weights in bf16, the dtype a
    GPU serves them in, and in the chapter's own dtype where that is another."""
    fp8 = sum(t.nbytes for t in (w_gate_up_fp8, gate_up_scale, w_down_fp8, down_scale))
    n = w_gate_up.numel() + w_down.numel()
    scales = gate_up_scale.nbytes + down_scale.nbytes
    text = (f"FP8 weights + scales: {fp8:,} bytes ({scales:,} of them scales), "
            f"{words.more_or_less(fp8, 2 * n, smaller='fewer')} the {2 * n:,} bytes of the same weights in bf16")
    if w_gate_up.element_size() != 2:
        own = w_gate_up.nbytes + w_down.nbytes
        text += f" ({words.more_or_less(fp8, own, smaller='fewer')} the {own:,} bytes they take here in {w_gate_up.dtype})"
    return text


def check_fp8_kernel(inputs: Mapping, w_gate_up_fp8, gate_up_scale, w_down_fp8, down_scale, fp8_reference) -> str:
    """The package's FP8 Triton experts on ``inputs`` (``x``, ``weights``, ``ids``) against the FP8
    reference output, within :func:`minimax_lab.bench.suite_moe.fp8_check_tolerance`; or, on a GPU
    without FP8 tensor cores, a line saying they are skipped. Raises ``AssertionError`` when the
    error is too large."""
    if not runtime.supports("fp8"):
        return (f"{runtime.device_name()}: no FP8 tensor cores (compute capability below 8.9), so the FP8 "
                "kernels are skipped here")
    got = moe_experts(**inputs, w_gate_up=w_gate_up_fp8, w_down=w_down_fp8, w_gate_up_scale=gate_up_scale,
                      w_down_scale=down_scale, impl="triton")
    err = measure.relative_error(got, fp8_reference)
    tol = suite_moe.fp8_check_tolerance(True, inputs["x"].shape[0], inputs["x"].device)
    assert err <= tol, f"FP8 Triton experts vs the FP8 reference: rel. error {err:.1e} > {tol:.0e}"
    return f"FP8 Triton kernels vs the FP8 reference: rel. error {err:.1e} (tolerance {tol:.0e})"


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


def _shape_of(r: Mapping) -> tuple[int, int, int]:
    return r["shape"]["E"], r["shape"]["d"], r["shape"]["f"]


def _pct_bar(r: Mapping) -> tuple[float, float]:
    """How far a record's % of its ceiling reaches below and above its point at the p80 and the p20
    time (0 where the record carries no spread)."""
    if not noise.has_spread(r):
        return 0.0, 0.0
    pct = r["pct_of_ceiling"]
    return pct - pct * r["ms"] / r["p80_ms"], pct * r["ms"] / r["p20_ms"] - pct


def _draw_regimes(records: Sequence[dict], axes, impls: Sequence[str], decode_suffix: str = "") -> list:
    """Left: decode, % of the copy ceiling (records of ``impl + decode_suffix``, e.g. the CUDA-graph
    twins); right: prefill, % of the bf16 GEMM ceiling; one line per (shape, impl), colour =
    shape, line style = impl, against tokens T on a log axis, with p20-p80 error bars. Returns the
    legend's handles: one per implementation (its line style), one per shape (its colour)."""
    shapes = sorted({_shape_of(r) for r in records})
    colors = plt.get_cmap("tab10")
    drawn = []
    for si, shape in enumerate(shapes):
        for impl in impls:
            def line(name):
                return sorted((r for r in records if r["impl"] == name and r.get("pct_of_ceiling") is not None
                               and _shape_of(r) == shape), key=lambda r: r["shape"]["T"])
            for ax, ceiling, rs in zip(axes, ("copy", "gemm"), (line(impl + decode_suffix), line(impl))):
                part = [r for r in rs if r.get("ceiling") == ceiling]
                if part:
                    bars = np.array([_pct_bar(r) for r in part]).T
                    ax.errorbar([r["shape"]["T"] for r in part], [r["pct_of_ceiling"] for r in part], yerr=bars,
                                fmt=_STYLES.get(impl, "-"), color=colors(si), ms=4, capsize=2, elinewidth=1,
                                alpha=1.0 if impl == "triton" else 0.6)
                    drawn.append(impl)
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
                     transform=axes[0].transAxes, fontsize=8, va="top")
    handles = [Line2D([], [], linestyle=_STYLES.get(i, "-")[:-1] or "-", marker=_STYLES.get(i, "-o")[-1],
                      color="k", label=IMPL_LABELS.get(i, i)) for i in impls if i in drawn]
    return handles + [Line2D([], [], color=colors(si), lw=3, label=f"E={E}, d={d}, f={f}")
                      for si, (E, d, f) in enumerate(shapes)]


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
    handles = _draw_regimes(recs, axes, impls)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=9, frameon=False)
    return fig


def _ratio_bar(bf: Mapping, f8: Mapping) -> tuple[float, float, float]:
    """bf16 time / FP8 time, and how far it reaches below and above at the two p20-p80 spreads."""
    r = bf["ms"] / f8["ms"]
    if not noise.has_spread(bf, f8):
        return r, 0.0, 0.0
    return r, r - bf["p20_ms"] / f8["p80_ms"], bf["p80_ms"] / f8["p20_ms"] - r


def fp8_panel(records: Sequence[dict], *, ax=None):
    """FP8 weights against bf16, the same kernels on the same routing: bf16 time / FP8 time per
    token count, launched eagerly and replayed as a CUDA graph (above 1: FP8 is faster), with the
    ratio's range at the two timings' p20-p80 spreads as error bars."""
    fig, ax = _ax(ax, figsize=(5, 3.5))
    Ts = sorted({r["shape"]["T"] for r in records if r["impl"] == "triton_fp8"})
    for j, (suffix, label) in enumerate((("", "launched eagerly"), ("_cudagraph", "CUDA-graph replay"))):
        xs, ys, lo, hi = [], [], [], []
        for i, T in enumerate(Ts):
            f8 = next((r for r in records if r["shape"]["T"] == T and r["impl"] == "triton_fp8" + suffix), None)
            bf = next((r for r in records if r["shape"]["T"] == T and r["impl"] == "triton_bf16" + suffix), None)
            if f8 and bf:
                xs.append(i + (j - 0.5) * 0.38)
                r, down, up = _ratio_bar(bf, f8)
                ys.append(r)
                lo.append(down)
                hi.append(up)
        bars = ax.bar(xs, ys, 0.38, yerr=[lo, hi], capsize=2, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=8, padding=3)
    ax.axhline(1.0, color="k", lw=1)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
    E = next((r["shape"]["E"] for r in records), "?")
    ax.set_xticks(range(len(Ts)), [f"{T:,}" for T in Ts])
    ax.set(xlabel="tokens T", ylabel="bf16 time / FP8 time (above 1: FP8 faster)",
           title=f"FP8 weights vs bf16 (ours, E={E})")
    ax.legend(fontsize=9, frameon=False, loc="upper left")
    return fig


def on_a_gpu(records: Sequence[dict], *, measured: Sequence[dict] = (), device_now: str | None = None):
    """The chapter's one figure from the records: decode and prefill of ours and the peers (bf16),
    and FP8 against bf16, with p20-p80 error bars (widened over repeated runs where the records
    come from :func:`minimax_lab.viz.moe_records.gpu_records`) and the device and versions they
    were recorded with in the title. ``measured``: this machine's records of the same suite, drawn
    as stars labelled with ``device_now``. Raises ValueError without records."""
    bf16 = [r for r in records if r.get("suite") == "moe" and not r["case"].startswith("fp8_")]
    fp8 = [r for r in records if r.get("suite") == "moe" and r["case"].startswith("fp8_")]
    if not bf16:
        raise ValueError("no 'moe' records to plot")
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.6), gridspec_kw=dict(width_ratios=(1, 1, 0.75)))
    graphed = any(r["impl"].endswith("_cudagraph") for r in bf16)
    handles = _draw_regimes(bf16, axes[:2], ("triton", "torch_grouped_mm", "sglang_triton"),
                            "_cudagraph" if graphed else "")
    star = None
    for r in measured:   # the same timing method as the recorded lines they sit on
        want = "triton" + ("_cudagraph" if graphed and r.get("ceiling") == "copy" else "")
        if r["impl"] == want and r.get("pct_of_ceiling") is not None:
            ax = axes[0] if r.get("ceiling") == "copy" else axes[1]
            (star,) = ax.plot(r["shape"]["T"], r["pct_of_ceiling"], "*", color="k", ms=11,
                              label=f"ours on {device_now or 'this GPU'}, measured now")
    if fp8:
        fp8_panel(fp8, ax=axes[2])
    else:
        axes[2].set_axis_off()
    runs = max((r.get("n_runs", 1) for r in records), default=1)
    fig.suptitle(f"recorded on {recorded_with(bf16 + fp8)}; error bars: p20-p80 of the timings"
                 + (f", widened over up to {runs} recorded runs" if runs > 1 else ""), y=0.99)
    fig.tight_layout(rect=(0, 0.09, 1, 0.96))
    fig.legend(handles=handles + ([star] if star else []), loc="lower center", ncol=len(handles) + bool(star),
               fontsize=9, frameon=False)
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
    for T, sfx, how in ((64, "_cudagraph", "at T = 64 under graph replay"), (64, "", "at T = 64 launched eagerly"),
                        (T_pre, "", f"at T = {T_pre:,}")):
        f8 = next((r for r in fp8 if r["shape"]["T"] == T and r["impl"] == "triton_fp8" + sfx), None)
        bf = next((r for r in fp8 if r["shape"]["T"] == T and r["impl"] == "triton_bf16" + sfx), None)
        if f8 and bf:
            pairs.append(f"{noise.speed_words(f8, bf)} bf16 {how}")
    if pairs:
        out.append(f"FP8 weights make ours {', '.join(pairs[:-1]) + ' and ' if len(pairs) > 1 else ''}{pairs[-1]}.")
    if out and noise.has_spread(*records):
        runs = max((r.get("n_runs", 1) for r in records), default=1)
        out.append("Each comparison counts as a gap only where the p20-p80 spreads of the two timings do not overlap"
                   + (f" (each spread widened over every recorded run, up to {runs}, that repeats its versions, "
                      "shape and launch config)" if runs > 1 else "") + ".")
    return " ".join(out)
