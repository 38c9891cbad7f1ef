"""Pictures for the KV-cache chapter (notebook 05): fragmentation, page maps, hit-ratio curves.

* ``simulate_fragmentation`` + ``plot_fragmentation`` -- the same stream of requests served by a
  contiguous allocator (each request reserves ``max_len`` slots up front, as pre-vLLM servers did)
  and by pages of ``page_size``: memory that holds tokens vs reserved-but-empty memory.
* ``plot_page_map`` -- one square per page of a ``BlockManager``, coloured by state.
* ``plot_hit_curves`` -- hit ratio against capacity, one line per eviction policy.
"""
from __future__ import annotations

import random
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

STATE_COLOURS = {"free": "#eeeeee", "used": "#4c78a8", "shared": "#f58518", "cached": "#54a24b", "pinned": "#b279a2"}


def simulate_fragmentation(n_requests: int = 24, *, max_len: int = 2048, page_size: int = 16, seed: int = 0) -> dict:
    """Token lengths drawn like chat traffic (mostly short, a long tail); returns the slots each
    allocator reserves and how many of them hold tokens."""
    rng = random.Random(seed)
    lens = [min(max_len, int(rng.lognormvariate(5.5, 0.9)) + 1) for _ in range(n_requests)]
    contiguous = n_requests * max_len
    paged = sum(-(-n // page_size) * page_size for n in lens)
    return dict(lengths=lens, used=sum(lens), contiguous_reserved=contiguous, paged_reserved=paged,
                max_len=max_len, page_size=page_size)


def plot_fragmentation(sim: Mapping, ax=None):
    """Stacked bars: tokens held vs slots wasted, contiguous vs paged."""
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    used = sim["used"]
    names = [f"contiguous\n(reserve {sim['max_len']})", f"paged\n(page {sim['page_size']})"]
    reserved = [sim["contiguous_reserved"], sim["paged_reserved"]]
    ax.barh(names, [used, used], color="#4c78a8", label="holds a token")
    ax.barh(names, [r - used for r in reserved], left=[used, used], color="#e45756", alpha=0.6,
            label="reserved, empty")
    for i, r in enumerate(reserved):
        ax.annotate(f"{100 * (r - used) / r:.0f}% wasted", (r, i), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.set_xlabel("KV slots")
    ax.set_title(f"{len(sim['lengths'])} requests, {used} tokens")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_xlim(0, max(reserved) * 1.25)
    return ax


def plot_page_map(states: Sequence[str], *, cols: int = 32, ax=None, title: str = "page pool"):
    """A grid of the pool's pages coloured by state (``BlockManager.page_states()``)."""
    names = list(STATE_COLOURS)
    idx = np.array([names.index(s) for s in states])
    rows = -(-len(idx) // cols)
    grid = np.full(rows * cols, -1)
    grid[:len(idx)] = idx
    cmap = ListedColormap(["white"] + [STATE_COLOURS[n] for n in names])
    ax = ax or plt.subplots(figsize=(min(10, cols / 3), max(1.2, rows / 3)))[1]
    ax.imshow(grid.reshape(rows, cols) + 1, cmap=cmap, vmin=0, vmax=len(names), aspect="equal")
    ax.set_xticks([]), ax.set_yticks([])
    counts = {n: int((idx == i).sum()) for i, n in enumerate(names)}
    handles = [plt.Rectangle((0, 0), 1, 1, color=STATE_COLOURS[n]) for n in names]
    ax.legend(handles, [f"{n} {counts[n]}" for n in names], fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    ax.set_title(title, fontsize=9)
    return ax


def plot_hit_curves(curves: Mapping[str, Sequence[tuple[float, float]]], *, ax=None, title: str = "",
                    xlabel: str = "cache capacity (tokens)", unbounded: float | None = None, logx: bool = True):
    """``curves``: policy -> [(capacity, hit ratio), ...]. Optional dashed line at the unbounded ratio."""
    ax = ax or plt.subplots(figsize=(6, 3.5))[1]
    for name, pts in curves.items():
        xs, ys = zip(*pts)
        ax.plot(xs, ys, "o-" if name != "belady" else "s--", ms=4, label=name)
    if unbounded is not None:
        ax.axhline(unbounded, color="grey", ls=":", lw=1, label=f"unbounded {unbounded:.3f}")
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("hit ratio (tokens)")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return ax
