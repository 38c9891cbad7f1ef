"""What the two MSA chapters compute and draw behind the scenes, so each reads as its lesson.

Chapter 03 (the idea):

* :func:`why_sparse` -- dense causal attention at 1M tokens, counted and as recorded on the H200;
  :func:`recorded_with` -- the device, versions and timing of that record;
* :func:`planted_attention`, :func:`concentration_curves`, :func:`concentration_figure` -- how
  much attention mass the top keys (or key blocks) hold, on the tiny model and on generated rows;
* :func:`selection_figure` -- one document's selection, alone and over the teacher's block mass;
* :func:`distill_figure` -- the indexer's recall and loss over distillation;
* :func:`answer_token_blocks` -- which blocks the answer token selects across layers and groups,
  and how often the needle's, against a random pick.

Chapter 04 (the kernels):

* :func:`kernel_inputs` -- q, k, v and the index tensors at a preset's size (fixed seed);
* :func:`key_table` -- the int64 ranking key worked through on a few scores;
* :func:`paged_cache` -- a sequence's blocks copied to the pages a block table names;
* :func:`inverted_index_figure` -- one (sequence, group)'s selection, read by rows and by columns;
* :func:`prefill_figure`, :func:`gpu_summary`, :func:`kv_outer_floor` -- the recorded H200 numbers.

Figures come back for the notebook to show; numbers beside them come back as text whose comparison
words are computed from the numbers (:mod:`minimax_lab.notebook.words`).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import matplotlib.pyplot as plt
import numpy as np
import torch

from minimax_lab import runtime
from minimax_lab.attention import MSA_SHAPE, MSA_SHAPE_CPU, msa_select
from minimax_lab.bench.suite_msa_inputs import dense_causal_flops
from minimax_lab.data.needle import needle_batch, needle_document
from minimax_lab.model import msa_indexer as mi
from minimax_lab.model.layers import attention_probs
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


# --------------------------------------------------------------------------- chapter 03: the selection


@torch.no_grad()
def selection_figure(model, doc: dict, title: str):
    """One document's selection (last layer, group 0): alone, and over the dense attention's block
    mass (the teacher). Returns ``(figure, recall of the attention mass on this document)``."""
    Bk, G, topk = model.cfg.msa_block_size, model.cfg.n_kv_heads, model.cfg.msa_topk
    r = mi.run_layers(model, doc["tokens"][None], doc["images"][None], mode="msa")
    L = r["layers"][-1]
    mass = mi.block_mass(attention_probs(L["q"], L["k"]), G, Bk)
    spans = [(s, s + 16) for s in doc["image_starts"]]
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.8))
    vsel.selection_map(L["selected"][0, :, 0], block_size=Bk, image_spans=spans, needle_span=doc["needle_span"],
                       query_rows=[doc["answer_pos"]], ax=ax[0], title=f"{title}: selection (last layer, group 0)")
    vsel.selection_map(L["selected"][0, :, 0], block_size=Bk, mass=mass[0, :, 0], image_spans=spans,
                       needle_span=doc["needle_span"], ax=ax[1], title="over the dense attention's block mass")
    fig.tight_layout()
    return fig, mi.selection_recall(mass, L["selected"], Bk, topk).mean().item()


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


def distill_summary(histories: dict) -> str:
    """Each indexer's recall before and after, against the window and the oracle, in computed words."""
    lines = []
    for label, h in histories.items():
        lines.append(f"indexer ({label}): recall {words.change(h['recall'][0], h['recall'][-1])} over "
                     f"{h['step'][-1] + 1} steps ({h['seconds']:.0f} s here)")
    h = next(iter(histories.values()))
    last = {label: hh["recall"][-1] for label, hh in histories.items()}
    lines.append(f"sliding window (same number of blocks): {h['window']:.3f}; oracle (the best {h['config']['topk']} "
                 f"blocks): {h['oracle']:.3f}")
    for label, rec in last.items():
        lines.append(f"indexer ({label}) keeps {words.more_or_less(rec, h['window'])} the window's mass "
                     f"({rec / h['oracle']:.0%} of the oracle's; the window {h['window'] / h['oracle']:.0%})")
    return "\n".join(lines)


def fp8_summary(fp8: dict) -> str:
    """What FP8 index keys did to the trained indexer (:func:`~minimax_lab.model.msa_indexer.fp8_index_recall`)."""
    equal = fp8["rows_equal"]["all"]
    return (f"index keys stored in FP8: {1 - equal:.1%} of the rows that rank blocks select another set "
            f"(per layer {', '.join(f'{1 - x:.1%}' for x in fp8['rows_equal']['layers'])}); recall of the dense "
            f"attention mass {words.change(fp8['recall']['all'], fp8['recall_fp8']['all'])}")


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


@torch.no_grad()
def answer_token_blocks(model, doc: dict, *, n_images: int = 12, n_docs: int = 24, seed: int = 9) -> SimpleNamespace:
    """Which blocks the answer token (the final "?") selects, over every layer and group: ``figure``
    (on ``doc``, the document of :func:`selection_figure`), and over ``n_docs`` other needle documents
    of ``n_images`` images (:func:`~minimax_lab.data.needle.needle_batch` with ``seed``): ``hit`` (the
    share of (layer, group) rows holding the needle object's block), ``chance`` (the share a random
    pick of the ``topk - 1`` ranked blocks among the earlier ones would hit) and ``summary`` (the two
    compared against two standard errors of a random pick, counting documents)."""
    Bk, topk = model.cfg.msa_block_size, model.cfg.msa_topk
    nb = needle_batch(n_images, n_docs, seed=seed)
    r = mi.run_layers(model, nb["tokens"], nb["images"], mode="msa")
    hits = []
    for i in range(n_docs):
        pos, needle = int(nb["answer_pos"][i]), int(nb["focus_pos"][i]) // Bk
        sel = torch.stack([L["selected"][i, pos] for L in r["layers"]]).reshape(-1, topk)  # [layers * G, topk]
        hits.append((sel == needle).any(-1).float().mean().item())
    one = mi.run_layers(model, doc["tokens"][None], doc["images"][None], mode="msa")
    pos = int(doc["answer_pos"])
    rows = torch.stack([L["selected"][0, pos] for L in one["layers"]]).reshape(-1, topk)
    n_blocks = math.ceil(doc["tokens"].shape[0] / Bk)
    fig, ax = plt.subplots(figsize=(9, 2.8))
    vsel.answer_blocks(rows, n_blocks=n_blocks, block_size=Bk, ax=ax,
                       image_spans=[(s, s + 16) for s in doc["image_starts"]],
                       needle_block=int(doc["focus_pos"]) // Bk, local_block=pos // Bk,
                       title="blocks the answer token selects in the document above (all layers and groups)")
    fig.tight_layout()
    hit, chance = float(np.mean(hits)), (topk - 1) / (n_blocks - 1)
    summary = (f"over {n_docs} other documents of {n_images} images, the answer token selects the needle object's "
               f"block in {hit:.2f} of (layer, group) rows; a random pick of {topk - 1} of the {n_blocks - 1} "
               f"earlier blocks would hit {chance:.2f}. The indexer is "
               + noise.gap_words(hit, chance, 2 * math.sqrt(chance * (1 - chance) / n_docs),
                                 above="better than a random pick", below="worse than a random pick",
                                 level="no better than a random pick")
               + f", counting {n_docs} documents")
    return SimpleNamespace(figure=fig, hit=hit, chance=chance, n_docs=n_docs, summary=summary)


# --------------------------------------------------------------------------- chapter 04: the kernels


def kernel_inputs(preset: str, *, seed: int = 0, device=None) -> SimpleNamespace:
    """Random q, k, v ``[B, S, Hq|G, D]`` and index tensors ``q_idx [B, S, G, D_idx]``, ``k_idx
    [B, S, D_idx]`` at MSA's CPU shape (fp32) or its production shape (the compute dtype), with a
    ragged last block and enough blocks that most rows rank (more visible blocks than ``topk``).
    The same ``seed`` gives the same tensors. ``describe()`` says what they are."""
    sh = runtime.pick(preset, cpu=MSA_SHAPE_CPU, gpu=MSA_SHAPE)
    B, S = 2, runtime.pick(preset, cpu=125, gpu=4096 + 77)
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
                f"{ranking:.0%} of the tokens see more than topk blocks, so their selection ranks")
    x.describe = describe
    return x


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


def inverted_index_figure(selected: torch.Tensor, *, block_size: int, block: int = 2, title: str = ""):
    """One (sequence, group)'s selection ``[S, topk]`` read two ways: by rows (what a query-outer
    program loads: its token's blocks) and by columns (what a KV-outer program serves: the tokens
    that picked its block), with the length of each block's list. Column ``block`` and its bar are
    outlined in red: one block's list is one column of the table."""
    n_blocks = math.ceil(selected.shape[0] / block_size)
    counts = torch.bincount(selected[selected >= 0].long().cpu(), minlength=n_blocks)
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1.4, 1]})
    vsel.selection_map(selected, block_size=block_size, ax=ax[0],
                       title="by rows: each query loads its selected blocks (query-outer)")
    S = selected.shape[0]
    ax[0].add_patch(plt.Rectangle((block - 0.5, -0.5), 1, S, fill=False, edgecolor="tab:red", lw=2))
    c = counts.cpu().numpy()
    colours = ["tab:red" if j == block else "tab:blue" for j in range(len(c))]
    ax[1].bar(np.arange(len(c)), c, color=colours)
    ax[1].axhline(c.mean(), color="black", ls=":", lw=1, label=f"mean {c.mean():.0f}")
    ax[1].set(xlabel=f"key block (Bk = {block_size})", ylabel="entries (token, slot) in its list")
    ax[1].set_title("by columns: each block serves the queries that picked it (KV-outer)", fontsize=9)
    ax[1].legend(fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- chapter 04: on a GPU

#: the prefill implementations the chapter draws: record impl -> label
PREFILL_IMPLS = {"triton_kv": "MSA, KV-outer (the package's kernels)", "triton_query": "MSA, query-outer",
                 "sglang_triton": "SGLang's Triton MSA", "flex_msa_mask": "FlexAttention, same sparse output",
                 "sdpa_cudnn": "dense causal attention (cuDNN)"}


def _prefill_ms(S: int, impl: str) -> float | None:
    r = recorded.one("msa", f"prefill_s{S}", impl)
    return r["ms"] if r else None


def prefill_figure(ax=None):
    """Recorded MSA prefill time per layer vs sequence length, against dense attention and the
    sparse peers; None when nothing is recorded."""
    rows = {impl: sorted((r["shape"]["S"], r["ms"]) for r in recorded.all_of("msa", impl=impl)
                         if r["case"].startswith("prefill_s") and r["shape"]["S"] <= 131072)
            for impl in PREFILL_IMPLS}
    rows = {impl: pts for impl, pts in rows.items() if pts}
    if not rows:
        return None
    fig = ax.figure if ax is not None else plt.figure(figsize=(8, 4.4))
    ax = ax or fig.add_subplot()
    for impl, pts in rows.items():
        S, ms = zip(*pts)
        ax.plot(S, ms, "o-" if impl.startswith("triton") else "s--", lw=2.5 if impl == "triton_kv" else 1.2,
                label=PREFILL_IMPLS[impl])
    sh = MSA_SHAPE
    ax.set(xscale="log", yscale="log", xlabel="sequence length S (tokens)", ylabel="prefill time per layer (ms)")
    ax.set_title(f"{RECORDED_ON}: MSA prefill\n(bf16, Hq={sh['Hq']}, G={sh['G']}, D={sh['D']}, "
                 f"Bk={sh['Bk']}, topk={sh['topk']})", fontsize=10)
    ax.set_xticks(sorted({s for pts in rows.values() for s, _ in pts}),
                  [f"{s // 1024}k" for s in sorted({s for pts in rows.values() for s, _ in pts})])
    ax.minorticks_off()
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def gpu_summary(S: int = 131072) -> str:
    """Two sentences on the recorded prefill (at ``S``, and the schedules at 64k), comparison words
    computed from the records."""
    ours, cudnn, sglang = (_prefill_ms(S, i) for i in ("triton_kv", "sdpa_cudnn", "sglang_triton"))
    if not (ours and cudnn and sglang):
        return "No H200 prefill records yet: `python -m minimax_lab.bench msa --cases prefill` on a GPU makes them."
    out = [f"At S = {S // 1024}k the KV-outer prefill takes {ours:.1f} ms per layer: {words.speed(ours, cudnn)} "
           f"dense cuDNN ({cudnn:.1f} ms) and {words.speed(ours, sglang)} SGLang's Triton MSA ({sglang:.1f} ms)."]
    kv, query, flex = (_prefill_ms(65536, i) for i in ("triton_kv", "triton_query", "flex_msa_mask"))
    if kv and query and flex:
        out.append(f"At 64k the KV-outer schedule ({kv:.1f} ms) is {words.speed(kv, query)} query-outer "
                   f"({query:.1f} ms) and {words.speed(kv, flex)} FlexAttention given the selection as a "
                   f"block mask ({flex:.0f} ms).")
    return "\n".join(out)


def kv_outer_floor(S: int = 131072) -> str:
    """The KV-outer sparse part's memory traffic at ``S`` (gathered query rows, partial outputs
    written, read back by the merge) and the time it needs at the recorded copy bandwidth, against
    the recorded time of the sparse part."""
    ours = recorded.one("msa", f"prefill_s{S}", "triton_kv")
    sparse = recorded.one("msa", f"sparse_attn_s{S}", "triton_kv")
    copy = recorded.one("ceilings", "copy", "torch.copy_")
    if not (ours and sparse and copy and ours.get("selected_pairs_per_head")):
        return "No H200 records of the sparse part and the copy bandwidth yet."
    sh = ours["shape"]
    entries = ours["selected_pairs_per_head"] / sh["Bk"] * sh["G"]  # (token, group, selected block) entries
    stream = entries * (sh["Hq"] // sh["G"]) * sh["D"] * 2          # one stream of bf16 rows
    total = 3 * stream + S * sh["Hq"] * sh["D"] * 2                 # + the final output
    floor_ms = total / (copy["gbps"] * 1e9) * 1e3
    return (f"S = {S // 1024}k: {entries / 1e6:.2f} M (token, group, block) entries move {total / 1e9:.0f} GB; "
            f"at the recorded copy bandwidth ({copy['gbps'] / 1e3:.2f} TB/s) that takes {floor_ms:.1f} ms, "
            f"and the sparse part takes {sparse['ms']:.1f} ms ({floor_ms / sparse['ms']:.0%} of copy speed)")
