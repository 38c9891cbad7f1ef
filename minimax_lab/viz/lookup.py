"""What chapter 03 draws and says about the lookup task (:mod:`minimax_lab.model.lookup`) and its
index branch (:mod:`minimax_lab.model.lookup_index`), so the chapter reads as its lesson.

* :func:`question_rows` / :func:`rows_figure` -- the question rows of one sequence, block by block:
  the teacher's attention mass, or the index branch's block distribution and its picks, with the
  answer's block outlined and the sliding window marked;
* :func:`teacher_words` -- how much of its attention the teacher puts on the answer's block;
* :func:`result_figure`, :func:`result_table`, :func:`result_summary`, :func:`result_words` -- every
  selection of the same cost compared, two standard errors over the held-out sequences;
* :func:`length_figure`, :func:`length_words` -- the needle test as the context grows;
* :func:`provenance` -- where this run's numbers come from, as a collapsed block.

Error bars and comparison words count held-out sequences: each sequence's share of its questions is
one sample; two selections measured on the same sequences are compared by their paired differences
(:func:`minimax_lab.viz.noise.mean_diff`).
"""
from __future__ import annotations

import math
import platform

import matplotlib.pyplot as plt
import numpy as np
import torch

from minimax_lab import runtime
from minimax_lab.model import lookup_index as li
from minimax_lab.viz import noise

#: one colour per selection, the same in every figure
COLOURS = {"untrained": "tab:gray", "shuffled teacher": "tab:purple", "random pick": "tab:brown",
           "sliding window": "tab:orange", "distilled": "tab:green", "oracle": "black", "dense": "tab:blue",
           "learned": "tab:green", "window": "tab:orange", "random": "tab:brown"}
#: how the selections of :func:`minimax_lab.model.lookup_index.by_length` are named in the figures
LENGTH_NAMES = {"dense": "dense (all keys)", "learned": "distilled index", "window": "sliding window",
                "random": "random pick"}
MEASURES = {"hit": "the answer's block selected", "answered": "answered right"}


def _two_se(x: torch.Tensor) -> float:
    """Two standard errors of the mean of per-sequence shares."""
    return 2 * x.float().std().item() / math.sqrt(len(x)) if len(x) > 1 else float("nan")


# --------------------------------------------------------------------------- the question rows


@torch.no_grad()
def question_rows(model, batch: dict, i: int = 0, *, what: str = "teacher"):
    """The question rows of sequence ``i``, one column per key block: ``what="teacher"`` gives the
    main branch's attention mass ``[Q, n_blocks]`` and no picks; ``what="index"`` gives the index
    branch's block distribution (softmax of its max-pooled scores over the visible blocks) and its
    picks ``int [Q, topk]``. Returns ``(matrix, picks or None)``."""
    one = {k: (v[i:i + 1] if v.dim() == 2 and k != "question_pos" else v) for k, v in batch.items()}
    rows = one["question_pos"]
    if what == "teacher":
        return li.teacher_mass(model, one)[0, rows, 0], None
    if what != "index":
        raise ValueError(f"what must be 'teacher' or 'index', got {what!r}")
    c = model.cfg
    q_idx, k_idx = model.index_qk(model.embed(one))
    S = k_idx.shape[1]
    nb = math.ceil(S / c.block_size)
    tok = torch.einsum("btgd,bjd->btgj", q_idx, k_idx)[0, rows, 0] / math.sqrt(c.d_idx)      # [Q, S]
    tok = tok.masked_fill(torch.arange(S)[None, :] > rows[:, None], float("-inf"))
    tok = torch.nn.functional.pad(tok, (0, nb * c.block_size - S), value=float("-inf"))
    dist = tok.view(len(rows), nb, c.block_size).amax(-1).softmax(-1)
    return dist, li.learned_selection(model, one)[0, rows, 0]


def rows_figure(panels, batch: dict, i: int, *, block_size: int, topk: int):
    """One panel per ``(title, matrix [Q, n_blocks], picks [Q, topk] or None)`` of
    :func:`question_rows`, side by side on one colour scale: the answer's block outlined in white on
    every row, the picks as cyan dots, the blocks holding a pair marked above, and the sliding
    window's blocks numbered in orange."""
    n = len(panels)
    fig, axes = plt.subplots(1, n, figsize=(4.3 * n + 1.4, 4.2), squeeze=False, layout="constrained")
    axes = axes[0]
    answer = (batch["answer_pos"][i] // block_size).tolist()
    pair_blocks = sorted({int(p) // block_size for p in torch.nonzero(batch["role"][i] == 1).flatten()})
    im = None
    for ax, (title, matrix, picks) in zip(axes, panels):
        m = matrix.detach().cpu().numpy()
        Q, nb = m.shape
        im = ax.imshow(m, aspect="auto", cmap="magma", vmin=0, vmax=1, interpolation="nearest")
        for r, b in enumerate(answer):
            ax.add_patch(plt.Rectangle((b - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="white", lw=1.4))
        if picks is not None:
            p = picks.cpu().numpy()
            rr, ss = np.nonzero(p >= 0)
            ax.scatter(p[rr, ss], rr, s=14, c="cyan", marker="o", lw=0)
        ax.plot(pair_blocks, [-1.0] * len(pair_blocks), "v", color="tab:red", ms=5)
        ax.set_xlim(-0.5, nb - 0.5)
        ax.set_ylim(Q - 0.5, -1.5)
        ax.set_xticks(range(nb), [str(b) for b in range(nb)], fontsize=7)
        for b, label in enumerate(ax.get_xticklabels()):
            if b >= nb - topk:
                label.set_color("tab:orange")
                label.set_fontweight("bold")
        ax.set_yticks(range(0, Q, 4))
        ax.set_xlabel(f"key block ({block_size} tokens each)", fontsize=9)
        ax.set_title(title, fontsize=10)
    axes[0].set_ylabel("question (row)")
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor="lightgray", edgecolor="black", lw=1.4),
               plt.Line2D([], [], ls="", marker="v", color="tab:red"),
               plt.Line2D([], [], ls="", marker="s", color="tab:orange"),
               plt.Line2D([], [], ls="", marker="o", color="cyan", markeredgecolor="gray")]
    names = ["the answer's block (outlined)", "a block holding a pair", "the window's blocks (orange numbers)",
             "selected by the index branch"]
    if all(p is None for _, _, p in panels):
        handles, names = handles[:3], names[:3]
    fig.colorbar(im, ax=list(axes), shrink=0.9, label="share of the row")
    fig.legend(handles, names, loc="outside lower center", ncol=len(names), fontsize=8.5, frameon=False)
    return fig


@torch.no_grad()
def teacher_words(model, batch: dict) -> str:
    """How much of its attention the teacher puts on the answer's block at the questions, and how
    often the answer lies in the sliding window, over ``batch``."""
    c = model.cfg
    mass = li.teacher_mass(model, batch)[:, batch["question_pos"], 0]                   # [B, Q, nb]
    answer = batch["answer_pos"] // c.block_size
    on_answer = mass.gather(-1, answer[..., None])[..., 0].mean(1)                      # per sequence
    nb = mass.shape[-1]
    in_window = (answer >= nb - c.topk).float().mean(1)
    B, Q = answer.shape
    return (f"over {B} held-out sequences ({Q} questions each, {nb} blocks): the teacher puts "
            f"{on_answer.mean():.2f} ± {_two_se(on_answer):.2f} of each question's attention on the answer's block; "
            f"the sliding window of the last {c.topk} blocks holds the answer for {in_window.mean():.2f} of the "
            f"questions (two standard errors over the sequences)")


# --------------------------------------------------------------------------- every selection compared


def _bars(ax, results: dict, key: str, names):
    means = [results[n][key].mean().item() for n in names]
    errs = [_two_se(results[n][key]) for n in names]
    x = np.arange(len(names))
    ax.bar(x, means, yerr=errs, capsize=3, color=[COLOURS[n] for n in names], error_kw=dict(lw=1))
    for xi, m in zip(x, means):
        ax.text(xi, m + 0.04, f"{m:.2f}", ha="center", fontsize=7)
    ax.set_xticks(x, [n.replace(" ", "\n", 1) for n in names], fontsize=7.5)
    ax.set_ylim(0, 1.12)
    ax.set_title(MEASURES[key], fontsize=10)


def result_figure(results: dict, histories: dict, *, chance: float):
    """Three panels: the distilled and the shuffled-teacher index's hit share on the held-out
    sequences over distillation (window and random pick as lines), then every selection's hit share
    and the main branch's answers on its blocks (dense as a line), with two standard errors over the
    held-out sequences; ``chance`` (one over the number of values) is a guesser's share."""
    fig, ax = plt.subplots(1, 3, figsize=(14, 3.9), gridspec_kw={"width_ratios": [1.1, 1.3, 1.3]})
    for label, h in histories.items():
        name = "distilled" if label == "attention" else "shuffled teacher"
        ax[0].plot(h["eval_step"], h["hit"], "o-", ms=3, color=COLOURS[name], label=f"index: {name}")
    for name in ("sliding window", "random pick"):
        ax[0].axhline(results[name]["hit"].mean().item(), ls="--", lw=1, color=COLOURS[name], label=name)
    ax[0].set(xlabel="distillation step", ylabel="share of held-out questions", ylim=(0, 1.05))
    ax[0].set_title("the answer's block selected, while training", fontsize=10)
    ax[0].legend(fontsize=8, frameon=False, loc="center right")
    names = list(li.COMPARED)
    _bars(ax[1], results, "hit", names)
    _bars(ax[2], results, "answered", names)
    ax[1].set_ylabel("share of held-out questions")
    dense = results["dense"]["answered"].mean().item()
    ax[2].axhline(dense, color=COLOURS["dense"], ls=":", lw=1.2, label=f"dense attention, all keys ({dense:.2f})")
    ax[2].axhline(chance, color="gray", ls="--", lw=1, label=f"guessing a value ({chance:.2f})")
    ax[2].legend(fontsize=8, frameon=False, loc="upper left")
    fig.tight_layout()
    return fig


def result_table(results: dict) -> str:
    """Every selection's two shares with two standard errors over the held-out sequences."""
    n = len(results["dense"]["hit"])
    lines = [f"{'selection (same cost)':22s} {'answer block selected':>24s} {'answered right':>18s}   "
             f"(two standard errors over {n} held-out sequences)"]
    for name in (*li.COMPARED, "dense"):
        r = results[name]
        label = "dense (all keys)" if name == "dense" else name
        lines.append(f"{label:22s} {r['hit'].mean():>15.3f} ± {_two_se(r['hit']):.3f} "
                     f"{r['answered'].mean():>10.3f} ± {_two_se(r['answered']):.3f}")
    return "\n".join(lines)


def paired_gap(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, str]:
    """``a`` against ``b`` (per-sequence shares on the same sequences): the mean paired difference,
    two standard errors of it, and ``"ahead"``, ``"behind"`` or ``"level"`` (within them)."""
    mean, se2 = noise.mean_diff((a - b).tolist())
    return mean, se2, "ahead" if mean > se2 else "behind" if -mean > se2 else "level"


def paired_words(a: torch.Tensor, b: torch.Tensor, *, names: tuple[str, str], what: str) -> str:
    """:func:`paired_gap` in a line: ``'x against y, what: +0.780 ± 0.043: x ahead'``."""
    mean, se2, word = paired_gap(a, b)
    verdict = "level, inside two standard errors" if word == "level" else f"{names[0]} {word}"
    return f"{names[0]} against {names[1]}, {what}: {mean:+.3f} ± {se2:.3f}: {verdict}"


_RELATION = {"ahead": "ahead of", "behind": "behind", "level": "level with"}


def _verdict(a: torch.Tensor, b: torch.Tensor, other: str) -> str:
    mean, se2, word = paired_gap(a, b)
    return f"{_RELATION[word]} {other} ({mean:+.2f} ± {se2:.2f})"


def result_summary(results: dict) -> str:
    """The result in two sentences: the distilled index against the window and the random pick on
    selecting the answer's block (paired differences, two standard errors), and what the main
    branch answers on its blocks and on every key."""
    d, w, r = (results[n]["hit"] for n in ("distilled", "sliding window", "random pick"))
    n = len(d)
    return (f"The distilled index selects the answer's block for {d.mean():.2f} of the held-out questions, the "
            f"sliding window for {w.mean():.2f} and a random pick for {r.mean():.2f}: it is "
            f"{_verdict(d, w, 'the window')} and {_verdict(d, r, 'the random pick')}, paired "
            f"over {n} sequences, two standard errors. Attending only to its blocks, the main branch answers "
            f"{results['distilled']['answered'].mean():.2f} of the questions right; attending to every key, "
            f"{results['dense']['answered'].mean():.2f}.")


def result_words(results: dict) -> str:
    """The other comparisons the chapter draws, each judged by paired differences over the held-out
    sequences: the distilled index against the window and the random pick on answers, and the two
    indexes without a usable teacher against the random pick on selecting the answer's block."""
    pairs = ((("distilled", "sliding window"), "answered"), (("distilled", "random pick"), "answered"),
             (("shuffled teacher", "random pick"), "hit"), (("untrained", "random pick"), "hit"))
    return "\n".join(paired_words(results[a][key], results[b][key], names=(a, b), what=MEASURES[key])
                     for (a, b), key in pairs)


# --------------------------------------------------------------------------- as the context grows


def length_figure(bl: dict, *, block_size: int, topk: int, chance: float):
    """:func:`~minimax_lab.model.lookup_index.by_length` in two panels (answers, and the answer's
    block selected) against the context length, two standard errors over the sequences per point;
    ``chance``: a guesser's share of answers."""
    fig, ax = plt.subplots(1, 2, figsize=(11.5, 4.1), layout="constrained")
    x = np.asarray(bl["lengths"], dtype=float)
    names = [n for n in LENGTH_NAMES if n in bl]
    for j, name in enumerate(names):
        nudged = x * 1.025 ** (j - (len(names) - 1) / 2)
        for a, key in zip(ax, ("answered", "hit")):
            if key == "hit" and name == "dense":
                continue
            vals = [m[key] for m in bl[name]]
            a.errorbar(nudged, [v.mean().item() for v in vals], yerr=[_two_se(v) for v in vals], marker="o", ms=4,
                       capsize=2, lw=1.3, color=COLOURS[name], label=LENGTH_NAMES[name])
    for a, key in zip(ax, ("answered", "hit")):
        a.set(xscale="log", xlabel="context (tokens)", ylabel="share of questions", ylim=(0, 1.05))
        a.set_xticks(x, [f"{int(v)}\n({topk * block_size / v:.0%} of keys)" for v in x], fontsize=7.5)
        a.minorticks_off()
        a.set_title(MEASURES[key], fontsize=10)
    ax[0].axhline(chance, color="gray", ls="--", lw=1, label=f"guessing a value ({chance:.2f})")
    fig.legend(*ax[0].get_legend_handles_labels(), loc="outside lower center", ncol=5, fontsize=8.5, frameon=False)
    return fig


def length_words(bl: dict) -> str:
    """Per length: the distilled index's answers against dense attention's and the window's, by
    paired differences over that length's sequences (two standard errors)."""
    lines = []
    for i, S in enumerate(bl["lengths"]):
        learned = bl["learned"][i]["answered"]
        parts = []
        for name, label in (("dense", "dense attention"), ("window", "the window")):
            mean, se2, word = paired_gap(learned, bl[name][i]["answered"])
            parts.append(f"{mean:+.3f} ± {se2:.3f} against {label} ({word})")
        lines.append(f"{S:>5} tokens: the distilled index answers " + ", ".join(parts))
    return "\n".join(lines)


# --------------------------------------------------------------------------- where the numbers come from


def provenance(*, preset: str, cfg, n_held: int, main_history: dict, histories: dict, seconds: float,
               tiny_history: dict | None = None, recorded_with: str = "") -> str:
    """Markdown for the chapter's last, collapsed cell: the machine and versions this run used, the
    task's sizes and seeds, the training it did (``tiny_history``: the tiny model's
    :func:`~minimax_lab.model.msa_indexer.distill_indexer` history), and the recorded GPU number the
    setup cell quotes (``recorded_with``: :func:`minimax_lab.viz.msa.recorded_with`'s line, the device
    and versions it was recorded with)."""
    info = runtime.describe()
    rows = [f"- this run: preset `{preset}`, {info['device']}, Python {info['python']}, torch {info['torch']}, "
            f"Triton {info['triton']}{' (interpreter)' if info['interpreter'] else ''}, {platform.system()}; "
            f"{seconds:.0f} s from the setup cell to here",
            f"- the lookup: {cfg.n_keys} keys, {cfg.n_values} values, {cfg.n_filler} filler words, blocks of "
            f"{cfg.block_size}, topk {cfg.topk}; main branch ({cfg.n_heads} heads of {cfg.head_dim}, one KV head) "
            f"trained dense for {len(main_history['loss'])} steps on {cfg.train_len}-token sequences with "
            f"{cfg.train_pairs} pairs ({main_history['seconds']:.1f} s); index branch ({cfg.d_idx} dims) distilled "
            + ", ".join(f"{len(h['loss'])} steps from the {t} teacher ({h['seconds']:.1f} s)" for t, h in histories.items())
            + f" on {cfg.index_len}-token sequences; measured on {n_held} held-out {cfg.seq_len}-token sequences "
            f"with {cfg.n_pairs} pairs",
            "- seeds: fixed in the package's functions (`lookup_batch(seed=...)`, `train_lookup(seed=0)`, "
            "`distill_index(seed=0)`, `DistillConfig(seed=0)`): a rerun draws the same data and weights",
            "- error bars and comparison words: two standard errors over the held-out sequences (each sequence's "
            "share of its questions is one sample; two selections on the same sequences are compared by their "
            "paired differences)"]
    if tiny_history:
        c = tiny_history["config"]
        rows.append(f"- the tiny model's index branch: {c['steps']} steps ({c['warmup_steps']} of them the dense "
                    f"warm-up) on {c['n_train']} documents of {c['n_images']} images, batches of {c['batch_size']}, "
                    f"recall on {c['n_eval']} held-out documents ({tiny_history['seconds']:.1f} s)")
    if recorded_with:
        rows.append(f"- the recorded 1M-token prefill of the setup cell: {recorded_with}")
    return ("<details><summary><b>Where these numbers come from</b> (click to open)</summary>\n\n"
            + "\n".join(rows) + "\n\n</details>")
