"""Pictures of MiniMax Sparse Attention's block selection (chapters 03 and 04).

* :func:`selection_map` -- query position x key block: which blocks each query selected (the
  local block in its own colour), optionally over the teacher's block mass, with the image and
  text regions of the sequence marked on both axes.
* :func:`concentration_plot` -- mass kept vs fraction of keys kept (attention concentration).
* :func:`recall_plot` -- the indexer's recall over distillation vs sliding window and oracle.

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


IMAGE_COLOUR, TEXT_COLOUR, NEEDLE_COLOUR = "tab:cyan", "tab:gray", "tab:red"
#: legend placements outside the axes: below (maps, many entries) or to the right (bars, curves)
_BELOW = dict(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)


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
