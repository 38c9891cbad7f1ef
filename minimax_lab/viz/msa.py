"""What chapter 03 (MiniMax Sparse Attention, the idea) computes and draws behind the scenes, so
each cell reads as its lesson.

* :func:`why_sparse` -- dense causal attention at 1M tokens, counted and as recorded on the H200;
  :func:`recorded_with` -- the device, versions and timing of that record;
* :func:`planted_attention`, :func:`concentration_curves`, :func:`concentration_figure`,
  :func:`concentration_table` -- how much attention mass the top keys (or key blocks) hold, on the
  tiny model and on generated rows;
* :func:`distill_figure` -- the tiny model's indexer: recall and loss over distillation;
* :func:`recall_by_length`, :func:`recall_length_table` -- its recall against the window and the
  oracle as documents grow, with the paired gap's two standard errors.

Chapter 04's helpers (the kernels) are in :mod:`minimax_lab.viz.msa_kernels` and
:mod:`minimax_lab.viz.msa_records`. Numbers beside a figure come back as text whose comparison
words are computed from the numbers (:mod:`minimax_lab.notebook.words`).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import matplotlib.pyplot as plt
import numpy as np
import torch

from minimax_lab import runtime
from minimax_lab.attention import MSA_SHAPE
from minimax_lab.bench.suite_msa_inputs import dense_causal_flops
from minimax_lab.data.needle import needle_batch
from minimax_lab.model import msa_indexer as mi
from minimax_lab.notebook import recorded, words
from minimax_lab.viz import noise
from minimax_lab.viz import selection as vsel

#: the GPU the recorded numbers come from, as the figures name it
RECORDED_ON = "recorded on an NVIDIA H200"


def _sci(x: float) -> str:
    """1.8e16 -> '1.8·10¹⁶'."""
    e = math.floor(math.log10(abs(x)))
    return f"{x / 10**e:.1f}·10" + str(e).translate(str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹"))


# --------------------------------------------------------------------------- chapter 03: why sparse


def why_sparse(S: int = 2**20) -> str:
    """Dense causal attention's FLOPs per layer at ``S`` tokens and MSA's public shape, and the
    recorded H200 times of dense cuDNN and MSA's prefill at that length (where recorded)."""
    sh = MSA_SHAPE
    lines = [f"dense causal attention at S = {S:,} tokens (Hq = {sh['Hq']}, D = {sh['D']}): "
             f"{_sci(dense_causal_flops(S, sh['Hq'], sh['D']))} FLOPs per layer (4·Hq·D·S(S+1)/2)"]
    r = recorded.one("msa", f"prefill_s{S}", "triton_kv")
    dense_ms = r and (r.get("dense_cudnn_ms") or r.get("dense_cudnn_estimate_ms"))
    if dense_ms:
        how = "measured once" if r.get("dense_cudnn_ms") else "estimated from the 128k time x 64"
        lines.append(f"{RECORDED_ON}, one layer: dense cuDNN {dense_ms / 1e3:.1f} s ({how}); MSA's prefill "
                     f"(topk = {sh['topk']} blocks of Bk = {sh['Bk']} keys) {r['ms'] / 1e3:.2f} s, "
                     f"{words.speed(r['ms'], dense_ms)} dense")
    else:
        lines.append("no H200 record at this length: `python -m minimax_lab.bench msa` on a GPU makes one")
    return "\n".join(lines)


def recorded_with(S: int = 2**20) -> str:
    """How the prefill record :func:`why_sparse` quotes was taken: its device, torch and Triton
    versions, timing method, repeats and p20-p80 spread, and how the dense time beside it was
    obtained; a sentence saying so when nothing is recorded."""
    r = recorded.one("msa", f"prefill_s{S}", "triton_kv")
    if r is None:
        return f"no record of MSA's prefill at S = {S:,} on the {recorded.H200}"
    dense = ("measured once" if r.get("dense_cudnn_ms") else "estimated" if r.get("dense_cudnn_estimate_ms")
             else "not recorded")
    return (f"{r['device']}, torch {r['torch']}, Triton {r['triton']}; MSA's prefill timed by "
            f"{r.get('timing_method', 'an unnamed method')}, {r.get('reps', '?')} repeats, p20-p80 "
            f"{r['p20_ms']:.0f}-{r['p80_ms']:.0f} ms; the dense time {dense}")


def planted_attention(layout: str, *, S: int, D: int, n_rel: int, n_q: int, seed: int = 0) -> torch.Tensor:
    """Attention rows ``[1, 1, S, S]`` (only the last ``n_q`` rows filled) of queries that each look
    for one pattern planted in ``n_rel`` earlier keys: one contiguous span (``"clustered"``, like an
    image or a paragraph) or random places (``"scattered"``)."""
    if layout not in ("clustered", "scattered"):
        raise ValueError(f"layout must be 'clustered' or 'scattered', got {layout!r}")
    g = torch.Generator().manual_seed(seed)
    probs = torch.zeros(1, 1, S, S)
    keys = torch.randn(S, D, generator=g)
    for t in range(S - n_q, S):
        u = torch.randn(D, generator=g)
        if layout == "clustered":
            s0 = int(torch.randint(0, t - n_rel, (1,), generator=g))
            pos = torch.arange(s0, s0 + n_rel)
        else:
            pos = torch.randperm(t, generator=g)[:n_rel]
        kk = keys[: t + 1].clone()
        kk[pos] = u + 0.5 * torch.randn(n_rel, D, generator=g)
        probs[0, 0, t, : t + 1] = (kk @ u / math.sqrt(D)).softmax(-1)
    return probs


FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)


@torch.no_grad()
def concentration_curves(model, preset: str) -> SimpleNamespace:
    """Mass kept vs fraction of keys (or key blocks) kept: the tiny model on a 1-image and a
    16-image document (all layers and heads), and generated rows (clustered, scattered) at a
    length the preset affords. Returns ``curves`` (label -> values at :data:`FRACTIONS`) and the sizes."""
    Bk = model.cfg.msa_block_size
    curves = {}
    for name, batch, start in (("1 image, tokens", needle_batch(1, 16, seed=5), 8),
                               ("16 images, tokens", needle_batch(16, 8, seed=5), 128)):
        r = mi.run_layers(model, batch["tokens"], batch["images"], keep=("probs",))
        probs = torch.cat([L["probs"] for L in r["layers"]], 1)
        curves[name] = mi.mass_concentration(probs, FRACTIONS, min_pos=start)
        if name.startswith("16"):
            curves[f"16 images, blocks of {Bk}"] = mi.mass_concentration(probs, FRACTIONS, block_size=Bk,
                                                                         min_pos=start)
    S, D, Bk_gen, n_rel, n_q = runtime.pick(preset, cpu=(2048, 32, 64, 32, 256), gpu=(8192, 64, 128, 64, 256))
    for layout in ("clustered", "scattered"):
        p = planted_attention(layout, S=S, D=D, n_rel=n_rel, n_q=n_q)
        curves[f"generated ({layout}), tokens"] = mi.mass_concentration(p, FRACTIONS, min_pos=S - n_q)
        curves[f"generated ({layout}), blocks of {Bk_gen}"] = mi.mass_concentration(
            p, FRACTIONS, block_size=Bk_gen, min_pos=S - n_q)
    return SimpleNamespace(curves=curves, S=S, n_q=n_q, n_rel=n_rel)


def concentration_figure(c: SimpleNamespace):
    """Two panels of :func:`concentration_curves`: the tiny model, and the generated rows."""
    fig, ax = plt.subplots(1, 2, figsize=(12, 5))
    model = {k: v for k, v in c.curves.items() if not k.startswith("gen")}
    gen = {k: v for k, v in c.curves.items() if k.startswith("gen")}
    vsel.concentration_plot(FRACTIONS, model, ax=ax[0], title="tiny model (all layers and heads)")
    vsel.concentration_plot(FRACTIONS, gen, ax=ax[1],
                            title=f"generated rows, S = {c.S} (last {c.n_q} queries, {c.n_rel} relevant keys each)")
    fig.tight_layout()
    return fig


def concentration_table(c: SimpleNamespace, at: float = 0.1) -> str:
    """Per document or layout: the mass the top ``at`` of the tokens keep, and the mass the top ``at``
    of the blocks keep beside it."""
    i = FRACTIONS.index(at)
    lines = [f"{'':22s} top {at:.0%} of ..."]
    for k, v in c.curves.items():
        if "blocks" not in k:
            lines.append(f"{k.split(', tokens')[0]:22s} tokens keep {float(v[i]):.2f} of the mass")
            continue
        what = k.split(", blocks")[0]
        tokens = float(c.curves[what + ", tokens"][i])
        lines.append(f"{what:22s} {k.split(', ')[-1]} keep {float(v[i]):.2f} (the tokens {tokens:.2f})")
    return "\n".join(lines)


# --------------------------------------------------------------------------- chapter 03: the tiny model's indexer


def distill_figure(histories: dict, *, topk: int, block_size: int):
    """Recall on held-out documents over distillation (against window and oracle), and the loss."""
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.4))
    vsel.recall_plot(histories, ax=ax[0], title=f"recall on held-out 12-image documents (topk={topk}, Bk={block_size})")
    for label, h in histories.items():
        ax[1].plot(h["step"], h["loss"], lw=1, label=label)
    ax[1].set(xlabel="distillation step", ylabel="KL(P || Q) (nats, mean over layers)", yscale="log")
    ax[1].set_title("distillation loss", fontsize=9)
    ax[1].legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    fig.tight_layout()
    return fig


@torch.no_grad()
def recall_by_length(model, n_images_list, *, n_docs: int, seed: int = 3) -> dict:
    """:func:`~minimax_lab.model.msa_indexer.recall_vs_length`'s recalls (indexer, window, oracle;
    mean over layers), measured one held-out document at a time, so that the indexer's gap to the
    window comes with two standard errors over the documents (``"gap"``: ``(mean, two_se)`` per
    length; the two are measured on the same documents, so the differences are paired)."""
    Bk, topk = model.cfg.msa_block_size, model.cfg.msa_topk
    out = {"n_images": list(n_images_list), "seq_len": [], "msa": [], "window": [], "oracle": [], "gap": [],
           "n_docs": n_docs}
    for n in n_images_list:
        batch = needle_batch(n, n_docs, seed=seed)
        out["seq_len"].append(int(batch["tokens"].shape[1]))
        per = [mi.evaluate_recall(model, {k: v[i:i + 1] for k, v in batch.items()}, block_size=Bk, topk=topk)
               for i in range(n_docs)]
        for name in ("msa", "window", "oracle"):
            out[name].append(float(np.mean([r[name]["all"] for r in per])))
        out["gap"].append(noise.mean_diff([r["msa"]["all"] - r["window"]["all"] for r in per]))
    return out


def recall_length_table(ctx: dict) -> str:
    """:func:`recall_by_length` as a table, with the indexer's gap to the window, its two standard
    errors over the documents and what they allow to be said."""
    lines = [f"{'images':>6} {'tokens':>6} {'indexer':>8} {'window':>8} {'oracle':>8}   indexer - window "
             f"(two standard errors over {ctx['n_docs']} documents)"]
    for row in zip(ctx["n_images"], ctx["seq_len"], ctx["msa"], ctx["window"], ctx["oracle"], ctx["gap"]):
        mean, se2 = row[5]
        verdict = "indexer ahead" if mean > se2 else "window ahead" if -mean > se2 else "level"
        lines.append(f"{row[0]:>6} {row[1]:>6} " + " ".join(f"{x:>8.3f}" for x in row[2:5])
                     + f"   {mean:+.3f} ± {se2:.3f}: {verdict}")
    return "\n".join(lines)
