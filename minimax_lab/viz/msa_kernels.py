"""What chapter 04 (MSA's kernels) computes behind the scenes, so each cell reads as its lesson.

* :func:`setup` -- the preset, the kernel device, the thread count and the chapter's inputs;
* :func:`kernel_inputs` -- q, k, v and the index tensors at a preset's size (fixed seed);
* :func:`key_table` -- the int64 ranking key worked through on a few scores;
* :func:`paged_cache` -- a sequence's blocks copied to the pages a block table names;
* :func:`tile_rows` -- how much of a query-outer tile is real query heads;
* :func:`random_teacher` -- a teacher's block mass for the index branch's loss;
* :func:`inverted_index_figure` -- one (sequence, group)'s selection, read by rows and by columns;
* :func:`train_runs`, :func:`training_figure`, :func:`training_words` -- the tiny model trained
  through each attention, side by side, and what the runs show against their noise;
* :func:`provenance` -- the chapter's last, collapsed cell: where its numbers come from.

The recorded GPU numbers the chapter draws are in :mod:`minimax_lab.viz.msa_records`.
"""
from __future__ import annotations

import dataclasses
import math
import platform
from types import SimpleNamespace

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator
import numpy as np
import torch

from minimax_lab import runtime
from minimax_lab.attention import MSA_SHAPE, MSA_SHAPE_CPU
from minimax_lab.data import make_examples
from minimax_lab.model import TrainConfig, accuracy, preset_config, train
from minimax_lab.viz import msa_records, noise
from minimax_lab.viz import selection as vsel

#: held-out questions every trained model of :func:`train_runs` answers (a fixed seed)
HELD_OUT = 500


def kernel_inputs(preset: str, *, seed: int = 0, device=None) -> SimpleNamespace:
    """Random q, k, v ``[B, S, Hq|G, D]`` and index tensors ``q_idx [B, S, G, D_idx]``, ``k_idx
    [B, S, D_idx]`` at MSA's CPU shape (fp32) or its production shape (the compute dtype), with a
    ragged last block and enough blocks that most rows rank (more visible blocks than ``topk``).
    The same ``seed`` gives the same tensors. ``describe()`` says what they are."""
    sh = runtime.pick(preset, cpu=MSA_SHAPE_CPU, gpu=MSA_SHAPE)
    B, S = 2, runtime.pick(preset, cpu=93, gpu=4096 + 77)
    dtype = runtime.pick(preset, cpu=torch.float32, gpu=runtime.compute_dtype())
    device = device or runtime.kernel_device()
    g = torch.Generator(device=device).manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, device=device, generator=g).to(dtype)  # noqa: E731
    x = SimpleNamespace(B=B, S=S, Hq=sh["Hq"], G=sh["G"], D=sh["D"], Didx=sh["Didx"], Bk=sh["Bk"],
                        topk=sh["topk"], dtype=dtype)
    x.q, x.k, x.v = rnd(B, S, x.Hq, x.D), rnd(B, S, x.G, x.D), rnd(B, S, x.G, x.D)
    x.q_idx, x.k_idx = rnd(B, S, x.G, x.Didx), rnd(B, S, x.Didx)
    x.n_blocks = math.ceil(S / x.Bk)
    ranking = ((torch.arange(S) // x.Bk + 1) > x.topk).float().mean().item()

    def describe() -> str:
        return (f"B={B} S={S} ({x.n_blocks} blocks of {x.Bk}, the last holds {S - (x.n_blocks - 1) * x.Bk} tokens), "
                f"Hq={x.Hq} G={x.G} D={x.D} D_idx={x.Didx} topk={x.topk}, {str(dtype).replace('torch.', '')}; "
                f"{ranking:.0%} of the tokens see more than topk blocks, so their selection must rank blocks")
    x.describe = describe
    return x


def setup(preset: str):
    """The chapter's setup: ``(preset, kernel device, inputs)``. Resolves ``preset`` ("auto" picks
    "gpu" where there is one), uses one thread on the CPU (its matrices are small: a second thread
    only waits), draws :func:`kernel_inputs` (seed 0) and prints the device and the inputs."""
    P = runtime.resolve_preset(preset)
    dev = runtime.kernel_device()
    torch.set_num_threads(runtime.pick(P, cpu=1, gpu=torch.get_num_threads()))
    x = kernel_inputs(P, seed=0)
    print(f"device {runtime.device_name()}, preset {P}, interpreter {runtime.is_interpreter()}")
    print(x.describe())
    return P, dev, x


def key_table(scores, block_ids) -> str:
    """The int64 ranking key of each (score, block id), step by step, and the order it gives."""
    s = torch.as_tensor(scores, dtype=torch.float32)
    ids = torch.as_tensor(block_ids, dtype=torch.int64)
    bits = (s + 0.0).view(torch.int32)
    flipped = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    key = flipped.to(torch.int64) * (1 << 20) + ((1 << 20) - 1 - ids)
    lines = [f"{'score':>7} {'block':>5} {'fp32 bits':>11} {'as int32':>12} {'orderable':>12} {'int64 key':>22}"]
    for i in range(len(s)):
        lines.append(f"{s[i].item():7.2f} {ids[i].item():5d}  0x{bits[i].item() & 0xFFFFFFFF:08x} "
                     f"{bits[i].item():12d} {flipped[i].item():12d} {key[i].item():22d}")
    order = key.argsort(descending=True)
    lines.append("keys, largest first -> " + ", ".join(f"block {ids[j].item()} ({s[j].item():g})" for j in order))
    return "\n".join(lines)


def paged_cache(x: torch.Tensor, table: torch.Tensor, block_size: int) -> torch.Tensor:
    """``x [B, S, ...]`` cut into blocks of ``block_size`` tokens (the last one zero-padded) and
    copied to the pages ``table [B, n_pages]`` names: a cache ``[table.numel(), block_size, ...]``."""
    B, S = x.shape[:2]
    n_pages = table.shape[1]
    x = torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, n_pages * block_size - S))
    cache = torch.zeros_like(x).reshape(B * n_pages, block_size, *x.shape[2:])
    cache[table.reshape(-1).long()] = x.reshape(B * n_pages, block_size, *x.shape[2:])
    return cache


def tile_rows(x: SimpleNamespace) -> str:
    """How many of a query-outer program's tile rows are real query heads (``Hq / G`` of them,
    padded to 16, ``tl.dot``'s smallest side): for the inputs ``x`` and at MSA's shape."""
    lines = []
    for name, sh in (("here", dict(Hq=x.Hq, G=x.G)), ("MSA's shape", MSA_SHAPE)):
        hpg = sh["Hq"] // sh["G"]
        lines.append(f"{name}: Hq/G = {hpg} query heads per group -> a {max(16, 1 << (hpg - 1).bit_length())}-row "
                     f"tile, {hpg} of them useful, per selected block loaded")
    return "\n".join(lines)


def random_teacher(B: int, S: int, G: int, block_size: int, *, generator: torch.Generator) -> torch.Tensor:
    """A teacher for the index branch's loss: float64 ``[B, S, G, n_blocks]``, random mass on the
    blocks each token can see (``j <= t // block_size``), each row summing to 1."""
    nb = math.ceil(S / block_size)
    mass = torch.rand(B, S, G, nb, generator=generator, dtype=torch.float64)
    mass = mass * (torch.arange(nb) <= torch.arange(S)[:, None, None] // block_size)
    return mass / mass.sum(-1, keepdim=True)


def inverted_index_figure(selected: torch.Tensor, *, block_size: int, block: int = 2, title: str = ""):
    """One (sequence, group)'s selection ``[S, topk]`` read two ways: by rows (what a query-outer
    program loads: its token's blocks) and by columns (what a KV-outer program serves: the tokens
    that picked its block), with the length of each block's list. Column ``block`` and its bar are
    outlined in red: one block's list is one column of the table."""
    n_blocks = math.ceil(selected.shape[0] / block_size)
    counts = torch.bincount(selected[selected >= 0].long().cpu(), minlength=n_blocks)
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.4), gridspec_kw={"width_ratios": [1.4, 1]})
    vsel.selection_map(selected, block_size=block_size, ax=ax[0],
                       title="by rows: each query loads its selected blocks (query-outer)")
    S = selected.shape[0]
    ax[0].add_patch(plt.Rectangle((block - 0.5, -0.5), 1, S, fill=False, edgecolor="tab:red", lw=2))
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, edgecolor=e)
               for c, e in (("tab:blue", "none"), ("tab:green", "none"), ("#e8e8e8", "none"), ("none", "tab:red"))]
    ax[0].legend(handles, ["selected", "local block", "visible, not selected", f"block {block}'s list (one column)"],
                 fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4, frameon=False)
    c = counts.cpu().numpy()
    colours = ["tab:red" if j == block else "tab:blue" for j in range(len(c))]
    ax[1].bar(np.arange(len(c)), c, color=colours)
    ax[1].axhline(c.mean(), color="black", ls=":", lw=1, label=f"mean {c.mean():.0f} entries per block")
    ax[1].set(xlabel=f"key block (Bk = {block_size})", ylabel="entries (token, slot) in its list")
    ax[1].set_title("by columns: each block serves the queries that picked it (KV-outer)", fontsize=10)
    ax[1].legend(fontsize=10, frameon=False)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- training through the kernels


#: the labels of :func:`train_runs`' three models
DENSE, MSA_TORCH, MSA_TRITON = "dense", "MSA, PyTorch", "MSA, Triton kernels"


def train_runs(preset: str, *, msa: dict, index_loss_weight: float, steps: int, device=None) -> SimpleNamespace:
    """Chapter 01's tiny model (one layer at the CPU preset, where the interpreter runs every kernel
    program in Python) trained three ways from the same seed and data stream: dense attention, and
    with ``msa`` (the :class:`~minimax_lab.model.ModelConfig` fields MSA changes) through the torch
    impl and through the Triton kernels, both with the index branch's distillation loss at
    ``index_loss_weight``. Batch 2 at the CPU preset, 64 on a GPU. Each model then answers
    :data:`HELD_OUT` held-out questions through the torch impl, so all are scored the same way.
    Returns ``runs`` (label -> ``loss`` per step, ``acc``, ``seconds``), ``steps``, ``batch_size``,
    ``n_held_out``."""
    small = runtime.pick(preset, cpu=dict(n_layers=1), gpu={})
    configs = {DENSE: preset_config(preset, **small),
               MSA_TORCH: preset_config(preset, attn_impl="torch", **msa, **small),
               MSA_TRITON: preset_config(preset, attn_impl="triton", **msa, **small)}
    tc = TrainConfig(steps=steps, batch_size=runtime.pick(preset, cpu=2, gpu=64), warmup=min(100, steps // 3 + 1),
                     eval_every=steps, eval_examples=runtime.pick(preset, cpu=2, gpu=256),
                     index_loss_weight=index_loss_weight)
    held_out = make_examples("test", HELD_OUT, 1)
    out = {}
    for label, cfg in configs.items():
        run_tc = tc if cfg.attention == "msa" else dataclasses.replace(tc, index_loss_weight=0.0)
        model, hist = train(cfg, run_tc, progress=False, device=device)
        model.cfg.attn_impl = "torch"
        out[label] = dict(loss=list(hist["loss"]), acc=accuracy(model, held_out)["all"], seconds=hist["seconds"])
    return SimpleNamespace(runs=out, steps=steps, batch_size=tc.batch_size, n_held_out=HELD_OUT)


def _two_se(acc: float, n: int) -> float:
    return 2 * math.sqrt(max(acc * (1 - acc), 1 / n) / n)


def training_figure(t: SimpleNamespace):
    """The runs of :func:`train_runs`: training loss per step (the MSA runs through PyTorch and
    through Triton drawn one over the other) and held-out accuracy with two standard errors."""
    fig, ax = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [1.6, 1]})
    styles = [dict(lw=2.5, color="tab:gray"), dict(lw=4, color="tab:blue", alpha=0.45),
              dict(lw=1.5, color="black", ls="--")]
    for (label, r), st in zip(t.runs.items(), styles):
        ax[0].plot(np.arange(1, len(r["loss"]) + 1), r["loss"], marker="o" if t.steps <= 20 else None, label=label,
                   **st)
    ax[0].set(xlabel="training step", ylabel="training loss")
    ax[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    ax[0].set_title(f"training loss, batch {t.batch_size}", fontsize=10)
    ax[0].legend(fontsize=10, frameon=False)
    labels = list(t.runs)
    accs = [t.runs[k]["acc"] for k in labels]
    ax[1].bar(range(len(labels)), accs, yerr=[_two_se(a, t.n_held_out) for a in accs], capsize=4,
              color=[st["color"] for st in styles])
    ax[1].set_xticks(range(len(labels)), [lab.replace(", ", ",\n") for lab in labels], fontsize=10)
    ax[1].set(ylabel="held-out accuracy", ylim=(0, 1))
    ax[1].set_title(f"after {t.steps} steps, {t.n_held_out} questions (± two standard errors)", fontsize=10)
    fig.tight_layout()
    return fig


def training_words(t: SimpleNamespace, *, min_steps: int = 100) -> str:
    """How far the MSA runs through PyTorch and through Triton drift apart, step by step; then, after
    at least ``min_steps`` steps, each accuracy gap judged against two standard errors over the
    held-out questions (before that, accuracy measures the starting weights, and the words say so)."""
    torch_run, triton_run, dense_run = MSA_TORCH, MSA_TRITON, DENSE
    a, b = t.runs[torch_run], t.runs[triton_run]
    drift = max(abs(x - y) for x, y in zip(a["loss"], b["loss"]))
    n = t.n_held_out
    same = (f"are equal in every bit at each of the {t.steps} steps" if drift == 0 else
            f"differ by at most {drift:.1e} over {t.steps} steps (the kernels add in another order)")
    lines = [f"{triton_run} against {torch_run}, from the same weights and data: the training losses {same}",
             "held-out accuracy: " + ", ".join(f"{k} {r['acc']:.3f} ± {_two_se(r['acc'], n):.3f}"
                                                for k, r in t.runs.items())]
    if t.steps < min_steps:
        lines.append(f"after {t.steps} steps these accuracies measure each model's starting weights, not what "
                     f"training bought: no comparison is drawn from them (the GPU preset trains longer)")
        return "\n".join(lines)
    for other in (torch_run, dense_run):
        gap = noise.gap_words(b["acc"], t.runs[other]["acc"], noise.two_se_shares(b["acc"], t.runs[other]["acc"], n),
                              above="ahead", below="behind", level="level", fmt="{:.3f}".format)
        lines.append(f"{triton_run} against {other}: {gap} (one training run each: the noise is the questions', "
                     "not the training seeds')")
    return "\n".join(lines)


# --------------------------------------------------------------------------- provenance


def provenance(*, preset: str, seconds: float, x: SimpleNamespace, backward: tuple, trained: SimpleNamespace | None = None
               ) -> str:
    """Markdown for the chapter's last, collapsed cell: this run, the checks' inputs (``x`` of
    :func:`kernel_inputs`; ``backward = (q, k, selected)`` of section 6), the training runs, and the
    recorded GPU numbers the chapter draws (devices, versions, how they were timed)."""
    info = runtime.describe()
    q, k, sel = backward
    backward_inputs = (f"q {list(q.shape)}, k and v {list(k.shape)}, {sel.shape[-1]} selected blocks per row, "
                       f"{int((sel < 0).all(-1).sum())} (row, group) pairs with no block, seed 1")
    rows = [f"- this run: preset `{preset}`, {info['device']}, Python {info['python']}, torch {info['torch']}, "
            f"Triton {info['triton']}{' (interpreter)' if info['interpreter'] else ''}, {platform.system()}; "
            f"{seconds:.0f} s from the setup cell to here",
            f"- the forward checks (sections 1-5): {x.describe()}; seeds 0 and 1 (`kernel_inputs`); each kernel "
            "against the package's `impl=\"torch\"` on the same inputs and selection",
            f"- the backward checks (section 6): {backward_inputs}; the truth is float64 autograd through the "
            "package's reference forward (`msa_attention(impl=\"reference\")`) and the reference distillation loss",
            "- comparison words: a gap in accuracy is called one only beyond two standard errors over the held-out "
            "questions; a gap in time only where the two timings' p20-p80 ranges do not overlap (the error bars)"]
    if trained is not None:
        rows.append(f"- training: {trained.steps} steps, batch {trained.batch_size}, seed 0, each model scored on "
                    f"{trained.n_held_out} held-out questions; " + ", ".join(
                        f"{k} {r['seconds']:.0f} s" for k, r in trained.runs.items()))
    rows += msa_records.provenance_rows()
    return ("<details><summary><b>Where these numbers come from</b> (click to open)</summary>\n\n"
            + "\n".join(rows) + "\n\n</details>")
