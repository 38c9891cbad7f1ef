"""Pictures of MiniMax Sparse Attention's block selection (chapters 03 and 04).

* :func:`selection_map` -- query position x key block: which blocks each query selected (the
  local block in its own colour), optionally over the teacher's block mass, with the image and
  text regions of the sequence marked on both axes.
* :func:`answer_blocks` -- for chosen query rows (the answer tokens), how often each key block
  is selected across layers and groups, the needle block highlighted.
* :func:`concentration_plot` -- mass kept vs fraction of keys kept (attention concentration).
* :func:`recall_plot` -- the indexer's recall over distillation vs sliding window and oracle.
* :func:`needle_plot` -- needle accuracy and the selection probe vs context length, with two
  standard errors per point.
* :func:`needle_verdict` -- what the needle test shows, at every length, in sentences whose
  comparison words are computed from the shares and their noise.

Every function draws on ``ax`` (or a new figure) and returns the figure. Legends sit outside the
axes (right of them, or below a map), so they never hide data; call ``plt.tight_layout()`` (or
``fig.tight_layout()``) after drawing to make room for them.
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import ListedColormap

from minimax_lab.model.needle import CHANCE, MODES
from minimax_lab.viz import noise

IMAGE_COLOUR, TEXT_COLOUR, NEEDLE_COLOUR = "tab:cyan", "tab:gray", "tab:red"
MODE_COLOURS = {"dense": "tab:blue", "msa": "tab:green", "window": "tab:orange", "oracle": "black"}
#: legend placements outside the axes: below (maps, many entries) or to the right (bars, curves)
_BELOW = dict(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
_RIGHT = dict(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _np(x):
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _axis(ax, size=(6, 4.5)):
    fig = ax.figure if ax is not None else plt.figure(figsize=size)
    return fig, ax or fig.add_subplot()


def _mark_regions(ax, image_spans, S, block_size, needle_span=None):
    """Bands for the image spans: along the key-block axis (x, in block units) and the query
    axis (y, in token units); neighbouring images alternate shades, the needle image is red."""
    for i, (s0, s1) in enumerate(image_spans):
        colour = NEEDLE_COLOUR if needle_span is not None and tuple(needle_span) == (s0, s1) else \
            (IMAGE_COLOUR if i % 2 == 0 else "paleturquoise")
        ax.axhspan(s0 - 0.5, s1 - 0.5, xmin=0, xmax=0.015, color=colour, alpha=0.9, lw=0)
        ax.axvspan(s0 / block_size - 0.5, s1 / block_size - 0.5, ymin=0.985, ymax=1.0, color=colour, alpha=0.9, lw=0)


def selection_map(selected, *, block_size: int, mass=None, image_spans=(), needle_span=None, query_rows=(),
                  ax=None, title: str = ""):
    """Draw one (sequence, group)'s selection ``selected int [S, topk]`` (-1 = unused slot) as a
    ``[S, n_blocks]`` grid: not visible (white), visible (light), selected (blue), local (green).
    With ``mass [S, n_blocks]`` the teacher's block mass is the background instead and the
    selection is drawn as dots. ``image_spans``: (start, end) token ranges of images, drawn as
    cyan bands on both axes (``needle_span`` in red); ``query_rows``: rows to mark with an arrow."""
    sel = _np(selected).astype(int)
    if sel.ndim != 2:
        raise ValueError(f"selected must be [S, topk], got shape {sel.shape}")
    S, topk = sel.shape
    nb = math.ceil(S / block_size)
    t = np.arange(S)
    local = t // block_size
    grid = np.where(np.arange(nb)[None, :] <= local[:, None], 1, 0)
    rows, slots = np.nonzero(sel >= 0)
    fig, ax = _axis(ax)
    if mass is None:
        grid[rows, sel[rows, slots]] = 2
        grid[t, local] = 3
        cmap = ListedColormap(["white", "#e8e8e8", "tab:blue", "tab:green"])
        ax.imshow(grid, aspect="auto", cmap=cmap, vmin=0, vmax=3, interpolation="nearest")
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("tab:blue", "tab:green")]
        ax.legend(handles, ["selected", "local block"], **_BELOW)
    else:
        m = _np(mass).astype(float)
        if m.shape != (S, nb):
            raise ValueError(f"mass must be [S={S}, n_blocks={nb}], got {m.shape}")
        im = ax.imshow(np.where(grid > 0, m, np.nan), aspect="auto", cmap="magma", interpolation="nearest")
        fig.colorbar(im, ax=ax, fraction=0.046, label="teacher block mass")
        ax.scatter(sel[rows, slots], rows, s=1.5, c="cyan", marker="s", lw=0, label="selected")
        ax.legend(markerscale=4, **_BELOW)
    _mark_regions(ax, image_spans, S, block_size, needle_span)
    for r in query_rows:
        ax.annotate("", xy=(-0.5, r), xytext=(-0.5 - nb * 0.06, r), annotation_clip=False,
                    arrowprops=dict(arrowstyle="->", color="black"))
    ax.set_xlabel(f"key block (Bk = {block_size} tokens each)")
    ax.set_ylabel("query position (token)")
    ax.set_title(title, fontsize=9)
    return fig


def answer_blocks(selected_rows, *, n_blocks: int, block_size: int, image_spans=(), needle_block=None,
                  local_block=None, ax=None, title: str = ""):
    """Bar chart of how often each key block is selected by ``selected_rows int [N, topk]`` (e.g.
    the answer query across layers x groups x documents); image blocks cyan, the needle's
    block red, and ``local_block`` (the query's own block, selected by every row by rule) hatched."""
    sel = _np(selected_rows).astype(int).reshape(-1, _np(selected_rows).shape[-1])
    counts = np.bincount(sel[sel >= 0], minlength=n_blocks)[:n_blocks] / max(1, len(sel))
    img_blocks = {b for s0, s1 in image_spans for b in range(s0 // block_size, (s1 - 1) // block_size + 1)}
    colours = [NEEDLE_COLOUR if b == needle_block else IMAGE_COLOUR if b in img_blocks else TEXT_COLOUR
               for b in range(n_blocks)]
    fig, ax = _axis(ax, (7, 2.8))
    if needle_block is not None:
        ax.axvspan(needle_block - 0.5, needle_block + 0.5, color=NEEDLE_COLOUR, alpha=0.15, lw=0)
    bars = ax.bar(np.arange(n_blocks), counts, color=colours)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in (NEEDLE_COLOUR, IMAGE_COLOUR, TEXT_COLOUR)]
    names = ["needle image", "other image", "text only"]
    if local_block is not None:
        bars[local_block].set_hatch("//")
        bars[local_block].set_edgecolor("black")
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="black", hatch="//"))
        names.append("local block (always selected)")
    ax.set_xlabel(f"key block ({block_size} tokens each)")
    ax.set_ylabel("selected (fraction of rows)")
    ax.set_ylim(0, 1.05)
    ax.legend(handles, names, **_RIGHT)
    ax.set_title(title, fontsize=9)
    return fig


def concentration_plot(fractions, curves: dict, *, ax=None, title: str = "attention mass concentration"):
    """``curves``: label -> mass kept at each of ``fractions`` (as from
    :func:`minimax_lab.model.msa_indexer.mass_concentration`). The diagonal is uniform attention."""
    fig, ax = _axis(ax, (4.5, 3.6))
    f = np.asarray(fractions, dtype=float)
    for label, ys in curves.items():
        ax.plot(f, _np(ys), "o-", ms=3, label=label)
    ax.plot([0, 1], [0, 1], ":", color="gray", label="uniform attention")
    ax.set(xlabel="fraction of visible keys (or blocks) kept, top by mass", ylabel="fraction of attention mass kept",
           xlim=(0, 1), ylim=(0, 1.02))
    ax.legend(**_BELOW)
    ax.set_title(title, fontsize=9)
    return fig


def recall_plot(histories: dict, *, ax=None, title: str = "recall of attention mass (held-out)"):
    """``histories``: label -> history of :func:`~minimax_lab.model.msa_indexer.distill_indexer`.
    Draws each indexer's recall over steps, the sliding window and the oracle (same ``topk``) as
    horizontal lines, and shades the dense warm-up."""
    fig, ax = _axis(ax, (6, 3.6))
    first = next(iter(histories.values()))
    for label, h in histories.items():
        ax.plot(h["eval_step"], h["recall"], "o-", ms=3, label=f"indexer: {label}")
    ax.axhline(first["window"], color="tab:orange", ls="--", label="sliding window (same blocks)")
    ax.axhline(first["oracle"], color="black", ls=":", label="oracle top-k (upper bound)")
    w = first["config"]["warmup_steps"]
    if w:
        ax.axvspan(0, w, color="gray", alpha=0.12, label="dense warm-up")
    ax.set(xlabel="distillation step", ylabel="recall (fraction of dense attention mass)")
    ax.legend(**_BELOW)
    ax.set_title(title, fontsize=9)
    return fig


def _two_se(p: float, n: int) -> float:
    """Two standard errors of a share measured on ``n`` documents (at least that of one document in n)."""
    return 2 * math.sqrt(max(p * (1 - p), 1 / n) / n)


def needle_plot(res: dict, *, axes=None, chance: float = CHANCE):
    """Two panels from :func:`minimax_lab.model.needle.needle_eval`: answer accuracy and the
    fraction of (layer, group) selections holding the needle block, vs context length; each point
    with two standard errors, counting documents (the modes are nudged apart so the bars show)."""
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    else:
        fig = axes[0].figure
    x, n = np.asarray(res["seq_len"], dtype=float), res["n_docs"]
    modes = [m for m in MODES if m in res]
    for i, m in enumerate(modes):
        nudged = x * 1.03 ** (i - (len(modes) - 1) / 2)
        style = dict(color=MODE_COLOURS[m], ms=4, label=m, ls=":" if m == "oracle" else "-", capsize=2, elinewidth=0.8)
        for ax, key in ((axes[0], "accuracy"), (axes[1], "needle_selected")):
            if key == "needle_selected" and m == "dense":
                continue
            ys = res[m][key]
            ax.errorbar(nudged, ys, yerr=[_two_se(y, n) for y in ys], marker="o", **style)
    axes[0].axhline(chance, color="gray", ls=":", label=f"chance ({chance:.2f})")
    axes[0].set(xscale="log", xlabel="context (tokens)", ylabel="answer accuracy (fraction of documents)",
                ylim=(0, 1.05), title=f"needle accuracy ({n} documents per point; bars: two standard errors)")
    axes[1].set(xscale="log", xlabel="context (tokens)", ylabel="needle block selected (fraction of rows)",
                ylim=(0, 1.05),
                title=f"does the answer token select the needle? (topk={res['topk']}, Bk={res['block_size']}; "
                      "bars: two standard errors, counting documents)")
    for a in axes:
        a.set_xticks(x, [str(int(v)) for v in x], fontsize=7)
        a.minorticks_off()
        a.legend(**_RIGHT)
        a.title.set_fontsize(9)
    fig.tight_layout()
    return fig


def _images(ns) -> str:
    ns = [str(v) for v in ns]
    return (ns[0] if len(ns) == 1 else ", ".join(ns[:-1]) + " and " + ns[-1]) + " images"


def _by_length(res: dict, a: str, b: str, key: str) -> tuple[dict, float]:
    """The lengths (images) where mode ``a`` is ahead of ``b`` on ``key`` by more than two standard
    errors, behind, and level; and the largest noise met."""
    n, out, worst = res["n_docs"], {"ahead": [], "behind": [], "level": []}, 0.0
    for i, images in enumerate(res["n_images"]):
        x, y = res[a][key][i], res[b][key][i]
        se = noise.two_se_shares(x, y, n)
        worst = max(worst, se)
        out["ahead" if x - y > se else "behind" if y - x > se else "level"].append(images)
    return out, worst


def _comparison(res: dict, a: str, b: str, key: str, what: str, names: tuple[str, str]) -> tuple[str, dict]:
    found, worst = _by_length(res, a, b, key)
    if len(found["level"]) == len(res["n_images"]):
        where = "level at every length"
    else:
        where = "; ".join(f"{word} at {_images(found[cat])}" for cat, word in
                          (("ahead", f"{names[0]} ahead"), ("behind", f"{names[0]} behind"), ("level", "level"))
                          if found[cat])
    return (f"{names[0].capitalize()} against {names[1]}, {what}: {where} (two standard errors at most "
            f"{worst:.2f}, {res['n_docs']} documents per length)."), found


def needle_verdict(res: dict, *, answers: dict | None = None) -> str:
    """What :func:`~minimax_lab.model.needle.needle_eval`'s result shows, every comparison word
    computed from the shares and two standard errors of their difference (counting documents):
    dense against guessing at the longest length (``answers``, :func:`~minimax_lab.model.needle.answer_words`
    for dense, adds how many of its answers are a colour at all), the oracle against dense and the
    trained indexer (``"msa"``) against the sliding window at every length, then one sentence of
    result. Modes missing from ``res`` are left out."""
    n, L = res["n_docs"], res["n_images"][-1]
    out, result = [], []
    if "dense" in res:
        acc = res["dense"]["accuracy"][-1]
        line = f"At {L} images dense attention answers {acc:.2f} of {n} documents: " + noise.versus_chance(
            acc, CHANCE, n, fmt="{:.2f}".format).replace("questions", "documents")
        if answers:
            line += f"; {answers['colour']} of its {answers['n_docs']} answers are a colour word at all"
            line += f" (the others: {', '.join(answers['others'][:6])})" if answers["others"] else ""
        out.append(line + ".")
    if "dense" in res and "oracle" in res:
        text, found = _comparison(res, "oracle", "dense", "accuracy", "answer accuracy", ("the oracle", "dense"))
        out.append(text)
        if found["ahead"]:
            result.append(f"selecting the blocks with the most attention mass answers better than dense attention "
                          f"at {_images(found['ahead'])}")
    if "msa" in res and "window" in res:
        verdicts = {}
        for key, what in (("accuracy", "answer accuracy"), ("needle_selected", "selecting the needle's block")):
            if key in res["msa"] and key in res["window"]:
                text, verdicts[what] = _comparison(res, "msa", "window", key, what,
                                                   ("the indexer", "the sliding window (same cost)"))
                out.append(text)
        told = {what: f for what, f in verdicts.items() if f["ahead"] or f["behind"]}
        if verdicts and not told:
            result.append(f"the trained indexer cannot be told apart from the sliding window of the same cost, "
                          f"neither in {' nor in '.join(verdicts)}")
        for what, f in told.items():
            parts = [f"{side} the window at {_images(f[key])}" for key, side in (("ahead", "ahead of"), ("behind", "behind"))
                     if f[key]]
            result.append(f"on {what}, the trained indexer is {' and '.join(parts)}"
                          + (f", level with it at {_images(f['level'])}" if f["level"] else ""))
    if result:
        out.append(f"Result, at {n} documents per length: " + "; ".join(result) + ".")
    return "\n".join(out)
