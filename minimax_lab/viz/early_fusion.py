"""Chapter 01's bookkeeping around the model it builds in cells: the setup call, the check that a
part written by hand computes what the package's module computes, the picture of what RoPE does to
a dot product, and the chapter's closing provenance cell.

The parts themselves (embedding, RMSNorm, RoPE, causal GQA attention, SwiGLU, a block, the model)
are written in the chapter; this module only checks and draws them.
"""
from __future__ import annotations

import platform
from typing import Callable, Mapping

import matplotlib.pyplot as plt
import numpy as np
import torch

from minimax_lab import runtime
from minimax_lab.viz import step_zero


def setup(preset: str, seed: int) -> str:
    """Resolve ``preset`` (``"auto"``, ``"cpu"`` or ``"gpu"``; ValueError otherwise), seed torch with
    ``seed``, and on the CPU preset run torch on one thread (the tiny model's matrices gain little
    from more, and on a busy machine each extra thread waits for a core). Prints one line and
    returns the resolved preset."""
    P = runtime.resolve_preset(preset)
    if P == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(seed)
    print(f"device {runtime.device_name()}, preset {P}, torch {torch.__version__}")
    return P


def same(what: str, ours: torch.Tensor, theirs: torch.Tensor, *, rtol: float = 1.3e-6, atol: float = 1e-5) -> None:
    """Raise (``torch.testing.assert_close``) unless ``ours`` equals ``theirs`` within the tolerance
    ``|ours - theirs| <= atol + rtol * |theirs|`` (shapes and dtypes equal; the defaults are
    ``assert_close``'s fp32 ones); else print one line naming that tolerance and the largest
    difference."""
    ours, theirs = ours.detach(), theirs.detach()
    torch.testing.assert_close(ours, theirs, rtol=rtol, atol=atol)
    print(f"{what}: equal to the package's within rtol {rtol:.1e}, atol {atol:.0e}, shape {tuple(ours.shape)}, "
          f"max |difference| {float((ours - theirs).abs().max()) if ours.numel() else 0.0:.1e}")


def rope_scores(rope: Callable, head_dim: int, distances: np.ndarray, *, start: int, n_vectors: int = 256,
                seed: int = 0) -> np.ndarray:
    """``[n_vectors, len(distances)]``: for random unit vectors ``u`` (fixed ``seed``), the dot product
    of ``rope(u)`` at position ``start`` with ``rope(u)`` at ``start + distance``. ``rope(x, positions)``
    takes ``x [B, S, H, D]`` and ``positions [B, S]``, as the chapter's does."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(n_vectors, head_dim, generator=g)
    u = u / u.norm(dim=-1, keepdim=True)
    d = torch.as_tensor(distances, dtype=torch.long)
    pos = torch.cat([torch.tensor([start]), start + d])[None].expand(n_vectors, -1)     # [n, 1 + len(d)]
    x = u[:, None, None, :].expand(-1, pos.shape[1], 1, -1)                             # [n, 1 + len(d), 1, D]
    r = rope(x, pos)[:, :, 0]                                                           # [n, 1 + len(d), D]
    return (r[:, :1] * r[:, 1:]).sum(-1).numpy()


def plot_rope(rope: Callable, head_dim: int, base: float, *, max_distance: int = 300, seq_len: int | None = None):
    """Two panels drawn from ``rope``: left, the first (fastest) and last (slowest) dimension pair of
    one vector turned position by position; right, the dot product of a unit vector with itself
    rotated to two positions, against their distance, from two starting positions (the curves
    coincide: only the distance counts), with the mean over random vectors. ``seq_len``: mark the
    longest sequence the model sees."""
    fig, ax = plt.subplots(1, 2, figsize=(12, 3.8), gridspec_kw={"width_ratios": [1, 1.9]})
    half = head_dim // 2
    t = np.linspace(0, 2 * np.pi, 200)
    ax[0].plot(np.cos(t), np.sin(t), color="lightgray", lw=0.8)
    for pair, colour in [(0, "tab:red"), (half // 4, "tab:purple"), (half - 1, "tab:blue")]:
        x = torch.zeros(1, 7, 1, head_dim)
        x[..., pair] = 1.0                                       # the pair (dim i, dim i + D/2) starts at (1, 0)
        r = rope(x, torch.arange(7)[None])[0, :, 0]
        xs, ys = r[:, pair].numpy(), r[:, pair + half].numpy()
        turn = float(base ** (-2 * pair / head_dim))
        ax[0].scatter(xs, ys, color=colour, s=18, zorder=3, label=f"pair {pair}: {turn:.2g} rad per position")
        if pair == 0:
            for pos in range(1, 7):
                ax[0].annotate(str(pos), (xs[pos], ys[pos]), textcoords="offset points", xytext=(5, 2),
                               fontsize=7, color=colour)
    ax[0].set(xlim=(-1.3, 1.3), ylim=(-1.3, 1.3), aspect="equal", xlabel="dim i", ylabel="dim i + D/2",
              title="one pair turned, positions 0 to 6")
    ax[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), borderaxespad=0.3)
    d = np.arange(max_distance + 1)
    for start, style, colour, lw in [(0, "-", "tab:gray", 2.2), (1000, ":", "tab:orange", 1.2)]:
        s = rope_scores(rope, head_dim, d, start=start)
        ax[1].plot(d, s[0], style, color=colour, lw=lw, label=f"one vector, first position {start}")
        if start == 0:
            mean = s.mean(0)
            ax[1].plot(d, mean, color="black", lw=1.6, label=f"mean over {s.shape[0]} random vectors")
    if seq_len:
        ax[1].axvline(seq_len, color="tab:green", ls="--", lw=1, label=f"this chapter's longest sequence ({seq_len})")
    ax[1].axhline(0, color="lightgray", lw=0.8)
    ax[1].set(xlabel="distance between the two positions (tokens)", ylabel="rotated q · rotated k (q = k, |q| = 1)",
              title=f"RoPE (head dim {head_dim}, base {base:g}): only the distance counts")
    ax[1].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


def provenance(preset: str, seconds: float, checkpoint_meta: Mapping, experiment: Mapping, *,
               n_test: int, rerun: bool = False) -> str:
    """Markdown for the chapter's last, collapsed cell: this run, the checkpoint and the step-zero
    runs the chapter read (where and with what they were trained), and how its comparisons are judged."""
    info = runtime.describe()
    tc = checkpoint_meta.get("train_config", {})
    runs = step_zero.runs(experiment)
    seeds = [r["seed"] for r in runs]
    where = sorted({r.get("trained_on", "not recorded") for r in runs})
    versions = sorted({f"torch {r['versions']['torch']}, Python {r['versions']['python']}" if "versions" in r
                       else "versions not recorded" for r in runs})
    rows = [
        f"- this run: preset `{preset}`, {info['device']}, Python {info['python']}, torch {info['torch']}, "
        f"Triton {info['triton']}{' (interpreter)' if info['interpreter'] else ''}, {platform.system()}; "
        f"{seconds:.0f} s from the setup cell to here",
        f"- the shipped checkpoint (`minimax_lab/assets/tiny_cpu.pt`): {tc.get('steps', '?')} steps of "
        f"{tc.get('batch_size', '?')} examples, seed {tc.get('seed', '?')}, trained in "
        f"{checkpoint_meta.get('train_seconds', float('nan')):.0f} s on {checkpoint_meta.get('trained_on', '?')} with "
        f"torch {checkpoint_meta.get('torch', '?')} (`python -m minimax_lab.model.make_checkpoint`); its history's "
        f"validation accuracy is scored every {tc.get('eval_every', '?')} steps on {tc.get('eval_examples', '?')} "
        f"validation questions, the held-out accuracy here on {n_test} test questions",
        f"- the step-zero experiment ({'run here' if rerun else '`minimax_lab/assets/experiment_step_zero.json`'}): "
        f"{runs[0]['steps']} steps per schedule, seeds {seeds} (each seed draws the weights, the data stream and "
        f"its own {runs[0].get('n_test', '?')} test questions), trained on {', '.join(where)}, {', '.join(versions)}; "
        "to record them again, run this chapter with `rerun_experiment = True` (it calls "
        "`step_zero.run_experiment`)",
        "- comparison words: an accuracy against guessing or another accuracy on the same questions is judged "
        "against two binomial standard errors of the questions; a grounding ratio's error is two standard "
        "errors over the questions, and two heads are compared by their paired difference on the same questions; "
        "the two schedules are compared by their paired difference per seed, against two standard errors over "
        "the seeds",
        "- the checks of section 2: the chapter's parts against the package's modules on the same (copied) "
        "weights and the same held-out batch (ragged lengths, right padding), fp32, within "
        "`torch.testing.assert_close`'s fp32 tolerances (1.3e-6 relative, 1e-5 absolute) unless a check names "
        "looser ones (the whole model: 1e-5 relative, 1e-4 absolute; the loss: 1e-5 relative, 1e-5 absolute)",
    ]
    return ("<details><summary><b>Where these numbers come from</b> (click to open)</summary>\n\n"
            + "\n".join(rows) + "\n\n</details>")
