"""Pictures of chapter 02 (FlashAttention in Triton): the S×S memory naive attention needs, the
online-softmax recurrence tile by tile, the tiles a causal query tile visits, and what changed
between two versions of a kernel the chapter writes in cells.

Every picture is computed from code: the states of
:func:`minimax_lab.attention.online_softmax.online_attention`, the loop bounds of
:func:`minimax_lab.attention.dense_triton.tile_schedule`, the source of the kernels.
"""
from __future__ import annotations

import difflib
import inspect
import math
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import ListedColormap

from minimax_lab import runtime
from minimax_lab.attention import dense_triton
from minimax_lab.attention.online_softmax import SoftmaxState
from minimax_lab.viz.source import _unwrap

#: the H200's memory, for the naive-attention picture drawn without a GPU
H200_MEMORY_BYTES = 141e9


def plot_naive_memory(scores: torch.Tensor, *, memory_bytes: float | None = None, memory_label: str | None = None):
    """Left: one head's causal attention probabilities (``scores [S, S]``, -inf above the diagonal).
    Right: the memory of one head's attention at D = 128 as S grows, naive (S×S fp32 scores) against
    flash (Q, K, V, O in bf16 and two fp32 numbers per row), beside a device's memory (default:
    this GPU's, or the H200's off a GPU)."""
    if memory_bytes is None and runtime.kernel_device().type == "cuda":
        memory_bytes, memory_label = runtime.gpu_memory_bytes(), memory_label or "this GPU"
    memory_bytes = H200_MEMORY_BYTES if memory_bytes is None else memory_bytes
    memory_label = memory_label or "H200"
    seq = np.array([2**i for i in range(10, 18)])
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
    ax[0].imshow(torch.softmax(scores, -1).numpy(), cmap="magma")
    ax[0].set(title=f"causal attention probabilities (head 0, S={scores.shape[0]})", xlabel="key", ylabel="query")
    ax[1].loglog(seq, seq**2 * 4 / 2**30, "o-", label="naive: S×S fp32 scores, per head")
    ax[1].loglog(seq, seq * (4 * 128 * 2 + 8) / 2**30, "s-", label="flash: only Q, K, V, O (bf16) + m, l, per head")
    ax[1].axhline(memory_bytes / 2**30, color="gray", ls="--",
                  label=f"{memory_label}: {memory_bytes / 2**30:.0f} GiB of memory")
    ax[1].set(xlabel="sequence length S (tokens)", ylabel="memory (GiB)", title="memory of one head's attention (D=128)")
    ax[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.tight_layout()
    return fig


def drifting_row(n_keys: int = 96, d: int = 32, seed: int = 1):
    """One query and keys whose scores drift upward (noise plus a growing multiple of the query's
    direction), so most key tiles bring a new maximum: ``(q [1,1,1,d], k, v [1,n_keys,1,d])``."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, 1, d, generator=g)
    drift = torch.linspace(0, 0.8, n_keys)[None, :, None, None] * q / q.norm() * math.sqrt(d)
    k = torch.randn(1, n_keys, 1, d, generator=g) + drift
    return q, k, torch.randn(1, n_keys, 1, d, generator=g)


def plot_online_softmax(scores: torch.Tensor, states: Sequence[SoftmaxState], block_n: int):
    """The recurrence on one row: its scores and running max, the rescale factor each tile applies
    to the past, and the running sum split into the rescaled past and the tile's own terms."""
    m = np.array([st.m.item() for st in states])
    l = np.array([st.l.item() for st in states])  # noqa: E741 - the paper's name
    m_prev, l_prev = np.concatenate([[-np.inf], m[:-1]]), np.concatenate([[0.0], l[:-1]])
    alpha = np.exp(m_prev - m)                                  # the rescale factor of the past
    kept = l_prev * np.where(np.isfinite(alpha), alpha, 0)      # the past sum after the rescale
    tiles = np.arange(len(states))
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.4))
    ax[0].plot(scores.numpy(), ".", color="tab:gray", label="score s")
    edges = np.concatenate([[-0.5], (tiles + 1) * block_n - 0.5])   # tile t's max held over its own keys
    ax[0].step(edges, np.concatenate([m[:1], m]), where="pre", color="tab:red", label="running max m")
    for t in tiles:
        ax[0].axvline(t * block_n - 0.5, color="k", lw=0.3)
    ax[0].set(xlabel="key index (thin lines: tile edges)", ylabel="scaled score", title="the max grows tile by tile")
    ax[0].legend(fontsize=8, loc="upper left")
    shrinks = alpha[1:] < 0.999
    ax[1].bar(tiles[1:], alpha[1:], color=np.where(shrinks, "tab:orange", "tab:gray"))
    ax[1].set(xlabel="key tile", ylabel="α = exp(m_old − m_new)", ylim=(0, 1.1),
              title=f"rescale: {int(shrinks.sum())} of {len(tiles) - 1} later tiles shrink the past")
    ax[2].bar(tiles, kept, color="tab:blue", label="past sum, rescaled: l·α")
    ax[2].bar(tiles, l - kept, bottom=kept, color="tab:green", label="this tile: Σ exp(s − m_new)")
    ax[2].plot(tiles, l_prev, "k_", ms=14, mew=2, label="past sum before the rescale")
    ax[2].set(xlabel="key tile", ylabel="running sum l", title="l after each tile")
    ax[2].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.tight_layout()
    return fig


def plot_tile_schedule(block_m: int = 128, block_n: int = 64, seq_len: int = 1024):
    """Which (query tile, key tile) pairs the package's kernel runs unmasked, masked or skips, at
    causal self-attention of ``seq_len`` tokens, from the kernel's own loop bounds."""
    grid = dense_triton.tile_schedule(seq_len, seq_len, block_m, block_n, causal=True)
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.imshow(grid, cmap=ListedColormap(["white", "tab:blue", "tab:orange"]), vmin=0, vmax=2)
    ax.set(title=f"S={seq_len}, {block_m}×{block_n} tiles\nblue: unmasked {int((grid == 1).sum())}, orange: masked "
           f"{int((grid == 2).sum())}, white: skipped {int((grid == 0).sum())}", xlabel="key tile", ylabel="query tile")
    fig.tight_layout()
    plt.show()


def _code(line: str) -> str:
    """A source line as :class:`Edit` compares it: a trailing comment dropped, runs of whitespace as
    one space (a comment-only line is kept)."""
    if not line.lstrip().startswith("#"):
        line = line.split("  #", 1)[0]
    return " ".join(line.split())


class Edit:
    """What changed from one version of a kernel (or launcher) to the next: a unified diff of
    their sources, lines removed ``-``, lines added ``+``, ``context`` unchanged lines around each
    change. The new version's name, re-indented lines and trailing comments do not count as
    changes (unchanged lines are shown as the new version writes them). Renders as a highlighted
    diff in Jupyter and as plain text elsewhere."""

    def __init__(self, before, after, context: int = 1):
        self.names = tuple(getattr(_unwrap(f), "__name__", str(f)) for f in (before, after))
        old, new = (inspect.getsource(_unwrap(f)).splitlines() for f in (before, after))
        key_old = [_code(line.replace(*self.names)) for line in old]  # the old name read as the new one
        key_new = [_code(line) for line in new]
        matcher = difflib.SequenceMatcher(None, key_old, key_new, autojunk=False)
        self.lines = []
        for group in matcher.get_grouped_opcodes(context):
            (_, i1, _, j1, _), (_, _, i2, _, j2) = group[0], group[-1]
            self.lines.append(f"@@ -{i1 + 1},{i2 - i1} +{j1 + 1},{j2 - j1} @@")
            for tag, a1, a2, b1, b2 in group:
                if tag == "equal":
                    self.lines += [" " + line for line in new[b1:b2]]
                    continue
                self.lines += ["-" + line for line in old[a1:a2]] + ["+" + line for line in new[b1:b2]]
        self.added = sum(line.startswith("+") for line in self.lines)
        self.removed = sum(line.startswith("-") for line in self.lines)

    def summary(self) -> str:
        return f"{self.names[0]} -> {self.names[1]}: {self.added} lines added, {self.removed} removed"

    def __str__(self) -> str:
        return self.summary() + "\n" + "\n".join(self.lines)

    __repr__ = __str__

    def _repr_markdown_(self) -> str:
        return (f"**What changed**, `{self.names[0]}` → `{self.names[1]}` ({self.added} lines added, "
                f"{self.removed} removed):\n\n```diff\n" + "\n".join(self.lines) + "\n```")


def show_edit(before, after, context: int = 1) -> Edit:
    """The edit from ``before`` to ``after`` (two functions or ``@triton.jit`` kernels with Python
    source, e.g. written in notebook cells), to display as a cell's value. Raises TypeError for an
    object without source."""
    try:
        return Edit(before, after, context)
    except (TypeError, OSError) as e:
        raise TypeError(f"show_edit needs two functions with Python source ({e})") from None
