"""Needle retrieval on long multi-image documents: dense attention vs MSA as the context grows.

The document (:func:`minimax_lab.data.needle.needle_document`, re-exported here)::

    <bos> <img>*16 <img>*16 ... <img>*16 what colour is the triangle ?

``n_images`` images, one of them (the *needle*, at a random place) holds the asked shape exactly
once; the other images (the *haystack*) never contain that shape. So the question has one answer
in the whole document and answering it is pure content retrieval: find the one triangle among
``16 * n_images`` patches. This differs from :func:`minimax_lab.data.long_document`, whose
distractor images may contain the asked shape and whose question names the image by number
("in image 7 ..."), a binding the tiny model was never trained on; here the question is worded
exactly as in the model's training data (the needle scene comes from
:func:`minimax_lab.data.examples.balanced_scene`, so the answer colour is uniform), only the
context is longer.

What :func:`needle_eval` measures, per number of images and per attention mode, at the answer
position (the final "?"):

* ``accuracy`` -- the model's own answer: argmax of the next-token logits == the colour word
  (chance = 1/4, four colours). This is the end-to-end task.
* ``needle_selected`` -- a retrieval probe of the selection: the fraction of (layer, group)
  pairs whose selected blocks contain the needle object's patch token. 1.0 for dense attention
  by definition; for MSA it says whether the index branch *found* the needle.
* ``needle_mass`` -- attention mass the answer query puts on the needle image's 16 patches
  (mean over layers and heads), under the mode's own attention pattern.

Modes: ``"dense"`` (full causal attention), ``"msa"`` (the model's index branch picks the blocks),
``"window"`` (sliding window: the ``topk`` most recent blocks, same FLOPs as MSA) and
``"oracle"`` (the ``topk`` blocks with the most dense attention mass, an upper bound).

The tiny model was trained on one image per sequence (~25 tokens), so everything past that is
length generalization. :func:`minimax_lab.viz.selection.needle_verdict` says what the measurement
shows, with every comparison word computed from the shares and their standard errors.
"""
from __future__ import annotations

import math

import torch
from tqdm import tqdm  # a text bar: its last state survives in a saved notebook

from minimax_lab.data.examples import PATCHES_PER_IMAGE
from minimax_lab.data.needle import needle_batch, needle_document
from minimax_lab.data.shapes import COLOURS
from minimax_lab.data.tokenizer import TOKENIZER
from minimax_lab.model.msa_indexer import MODES, run_layers

__all__ = ["CHANCE", "MODES", "answer_probs", "answer_words", "format_needle", "needle_batch", "needle_document",
           "needle_eval"]

#: a guesser that names one of the four colours is right this often
CHANCE = 1 / len(COLOURS)


def answer_probs(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, selected: torch.Tensor | None,
                 block_size: int) -> torch.Tensor:
    """The attention probabilities of one query row per sequence, under a mode's pattern: ``q
    [N, S, Hq, D]``, ``k [N, S, G, D]``, ``pos`` int ``[N]`` (the row of each sequence),
    ``selected`` int ``[N, S, G, topk]`` (None: dense causal). Returns fp32 ``[N, Hq, S]``: the
    softmax of ``q . k / sqrt(D)`` over the keys ``j <= pos`` that lie in a selected block of the
    head's group (the same numbers as the full probability matrix's row, renormalized over the
    selected keys)."""
    N, S, Hq, D = q.shape
    G = k.shape[2]
    rows = torch.arange(N, device=q.device)
    qa = q[rows, pos].float()                                              # [N, Hq, D]
    kk = k.float().repeat_interleave(Hq // G, dim=2)                      # [N, S, Hq, D]
    s = torch.einsum("nhd,nshd->nhs", qa, kk) / math.sqrt(D)
    keys = torch.arange(S, device=q.device)
    allowed = (keys[None, :] <= pos[:, None])[:, None, :]                 # [N, 1, S] causal
    if selected is not None:
        blocks = selected[rows, pos].long()                               # [N, G, topk]
        in_sel = (blocks[..., None] == (keys // block_size)).any(-2)      # [N, G, S]
        allowed = allowed & in_sel.repeat_interleave(Hq // G, dim=1)
    return s.masked_fill(~allowed, float("-inf")).softmax(-1)


@torch.no_grad()
def needle_eval(model, n_images_list=(1, 2, 4, 8, 16, 32), *, n_docs: int = 32, modes=("dense", "msa", "window"),
                block_size: int | None = None, topk: int | None = None, seed: int = 1, batch_size: int = 16,
                impl: str = "torch", index_rope: bool = True, progress: bool = True) -> dict:
    """Needle accuracy and retrieval probes (module docstring) for each ``n_images`` and mode.

    ``model``: a :class:`~minimax_lab.model.TinyMultimodalModel`; mode ``"msa"`` needs its index
    branch (``use_indexer=True``, trained with :func:`minimax_lab.model.msa_indexer.distill_indexer`).
    ``index_rope`` must match how the indexer was trained. ``block_size``/``topk`` default to the model config's ``msa_block_size``/``msa_topk``.
    Returns ``{"n_images": [...], "seq_len": [...], "block_size", "topk", "n_docs",
    mode: {"accuracy": [...], "needle_selected": [...], "needle_mass": [...]}}``.
    """
    for m in modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}; expected some of {MODES}")
    block_size = block_size or model.cfg.msa_block_size
    topk = topk or model.cfg.msa_topk
    out = {"n_images": list(n_images_list), "seq_len": [], "block_size": block_size, "topk": topk, "n_docs": n_docs}
    out.update({m: {"accuracy": [], "needle_selected": [], "needle_mass": []} for m in modes})
    jobs = [(n, m) for n in n_images_list for m in modes]
    batches = {}
    for n, mode in tqdm(jobs, desc="needle eval", disable=not progress):
        if n not in batches:
            batches[n] = needle_batch(n, n_docs, seed=seed)
            out["seq_len"].append(int(batches[n]["tokens"].shape[1]))
        nb = batches[n]
        hits = sel_hits = mass = 0.0
        for i in range(0, n_docs, batch_size):
            sl = slice(i, i + batch_size)
            r = run_layers(model, nb["tokens"][sl], nb["images"][sl], mode=mode, block_size=block_size, topk=topk,
                           impl=impl, index_rope=index_rope)
            rows = torch.arange(r["logits"].shape[0])
            pos, focus = nb["answer_pos"][sl], nb["focus_pos"][sl]
            hits += (r["logits"][rows, pos].argmax(-1) == nb["answer_id"][sl]).sum().item()
            for layer in r["layers"]:
                p = answer_probs(layer["q"], layer["k"], pos, layer["selected"], block_size)  # [N, Hq, S]
                span = nb["needle_start"][sl][:, None] + torch.arange(PATCHES_PER_IMAGE)
                mass += p.gather(2, span[:, None, :].expand(-1, p.shape[1], -1)).sum(-1).mean(-1).sum().item()
                if layer["selected"] is None:
                    sel_hits += len(rows)
                else:
                    sel = layer["selected"][rows, pos].long()  # [N, G, topk]
                    sel_hits += (sel == (focus // block_size)[:, None, None]).any(-1).float().mean(-1).sum().item()
        L = len(model.blocks)
        out[mode]["accuracy"].append(hits / n_docs)
        out[mode]["needle_selected"].append(sel_hits / (n_docs * L))
        out[mode]["needle_mass"].append(mass / (n_docs * L))
    return out


def format_needle(res: dict) -> str:
    """The result of :func:`needle_eval` as a plain-text table."""
    modes = [m for m in MODES if m in res]
    head = f"{'images':>6} {'tokens':>6}  " + "  ".join(f"{m + ' acc':>10} {'sel':>5} {'mass':>5}" for m in modes)
    lines = [head, "-" * len(head)]
    for i, (n, S) in enumerate(zip(res["n_images"], res["seq_len"])):
        cells = "  ".join(f"{res[m]['accuracy'][i]:>10.2f} {res[m]['needle_selected'][i]:>5.2f} "
                          f"{res[m]['needle_mass'][i]:>5.2f}" for m in modes)
        lines.append(f"{n:>6} {S:>6}  {cells}")
    return "\n".join(lines)


@torch.no_grad()
def answer_words(model, n_images: int, n_docs: int, *, mode: str = "dense", seed: int = 1) -> dict:
    """What the model answers at the answer position of :func:`needle_eval`'s documents (same
    ``seed``): ``{"colour": how many answers are a colour word at all, "n_docs", "others": the
    other words it says, sorted}``."""
    batch = needle_batch(n_images, n_docs, seed=seed)
    logits = run_layers(model, batch["tokens"], batch["images"], mode=mode)["logits"]
    pred = logits[torch.arange(n_docs), batch["answer_pos"]].argmax(-1).tolist()
    colour_ids = set(TOKENIZER.encode(list(COLOURS)))
    return {"colour": sum(p in colour_ids for p in pred), "n_docs": n_docs,
            "others": sorted({TOKENIZER.decode([p]) for p in pred if p not in colour_ids})}
