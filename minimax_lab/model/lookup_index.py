"""MSA's index branch on the lookup task (:mod:`minimax_lab.model.lookup`): taught by the main
branch's attention, judged by what it selects.

* **teacher** -- :func:`teacher_mass`: the main branch's dense attention, detached, summed per key
  block (its heads averaged: one group), ``[B, S, 1, n_blocks]``;
* **student** -- the index branch ``q_idx = x W_qi``, ``k_idx = x W_ki``, trained by
  :func:`distill_index` on ``KL(teacher || softmax(max-pooled index scores))``, the package's
  :func:`minimax_lab.attention.msa_backward_index.index_distill_loss`; the main branch is frozen.
  ``teacher="shuffled"`` hands each sequence the teacher of another sequence of the batch: the same
  kind of targets, about the wrong content;
* **selections** -- :func:`selections`: the trained index branch (``msa_select``), the sliding
  window (the ``topk`` most recent blocks), a random pick (random block scores through the same
  top-k rule) and the oracle (the teacher's own ``topk`` best blocks); every one keeps the local
  block and ``topk`` blocks in all, so every one costs the same;
* **measures** -- :func:`measure`: per sequence, the share of its questions whose selection holds
  the block of the answer's pair (``"hit"``) and the share the main branch answers right when it
  attends only to the selected blocks (``"answered"``).
"""
from __future__ import annotations

import math
import time

import torch

from minimax_lab.attention import msa_select
from minimax_lab.attention.msa_backward_index import index_distill_loss
from minimax_lab.attention.msa_torch import select_from_scores
from minimax_lab.model.layers import attention_probs
from minimax_lab.model.lookup import LookupModel, answer_loss, answered, init_index, lookup_batch
from minimax_lab.model.msa_indexer import block_mass, oracle_selection, window_selection
from minimax_lab.validate import check_choice, check_positive_int

#: how each selection is named in the chapter's figures
SELECTIONS = ("learned", "window", "random", "oracle")
TEACHERS = ("attention", "shuffled")


@torch.no_grad()
def teacher_mass(model: LookupModel, batch: dict) -> torch.Tensor:
    """The main branch's dense attention mass per key block ``[B, S, 1, n_blocks]`` (rows sum to 1)."""
    q, k, _ = model.qkv(model.embed(batch))
    return block_mass(attention_probs(q, k), 1, model.cfg.block_size)


@torch.no_grad()
def learned_selection(model: LookupModel, batch: dict) -> torch.Tensor:
    """The index branch's selection ``int32 [B, S, 1, topk]`` (``msa_select``, the contract's rule)."""
    q_idx, k_idx = model.index_qk(model.embed(batch))
    return msa_select(q_idx, k_idx, block_size=model.cfg.block_size, topk=model.cfg.topk, impl="torch")


def random_selection(B: int, S: int, *, block_size: int, topk: int, seed: int) -> torch.Tensor:
    """A random pick ``int32 [B, S, 1, topk]``: random block scores through the contract's top-k rule
    (the local block last, ``topk - 1`` earlier blocks drawn uniformly without replacement)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(B, S, 1, math.ceil(S / block_size), generator=g)
    return select_from_scores(scores, torch.arange(S)[None, :, None], block_size, topk)


@torch.no_grad()
def selections(model: LookupModel, batch: dict, *, seed: int = 0, names=SELECTIONS) -> dict:
    """``name -> int32 [B, S, 1, topk]`` for each of ``names`` (:data:`SELECTIONS`); ``seed``
    draws the random pick."""
    c = model.cfg
    B, S = batch["role"].shape
    make = {"learned": lambda: learned_selection(model, batch),
            "window": lambda: window_selection(B, S, 1, block_size=c.block_size, topk=c.topk),
            "random": lambda: random_selection(B, S, block_size=c.block_size, topk=c.topk, seed=seed),
            "oracle": lambda: oracle_selection(teacher_mass(model, batch), block_size=c.block_size, topk=c.topk)}
    for name in names:
        check_choice(name, "selection", SELECTIONS)
    return {name: make[name]() for name in names}


@torch.no_grad()
def measure(model: LookupModel, batch: dict, selected: torch.Tensor | None) -> dict:
    """Per sequence (float ``[B]``, a share of its questions): ``"hit"``, the selection at each
    question holds the block of its answer's pair (1 for dense attention, ``selected=None``), and
    ``"answered"``, the main branch answers right attending only to the selected blocks."""
    right = answered(model, batch, selected).mean(1)
    if selected is None:
        return {"hit": torch.ones_like(right), "answered": right}
    return {"hit": question_hits(batch, selected, model.cfg.block_size).mean(1), "answered": right}


def question_hits(batch: dict, selected: torch.Tensor, block_size: int) -> torch.Tensor:
    """Per question, whether ``selected`` at its position holds its answer's block: float ``[B, Q]``."""
    at_questions = selected[:, batch["question_pos"], 0].long()             # [B, Q, topk]
    answer_block = batch["answer_pos"] // block_size                        # [B, Q]
    return (at_questions == answer_block[..., None]).any(-1).float()


def answer_loss_index_grads(model: LookupModel, batch: dict) -> list:
    """What the answer loss of sparse attention over the index branch's own selection sends back to
    the index weights ``(W_qi, W_ki)``: autograd's gradients, ``None`` where no path leads there."""
    selected = learned_selection(model, batch)
    loss = answer_loss(model, batch, selected)
    return list(torch.autograd.grad(loss, [model.idx_q.weight, model.idx_k.weight], allow_unused=True))


def distill_index(model: LookupModel, *, teacher: str = "attention", steps: int = 60, seed: int = 0,
                  n_train: int = 64, batch_size: int = 16, lr: float = 1e-2, held: dict | None = None,
                  eval_every: int = 10) -> dict:
    """Train the index branch in place, from a fresh draw (:func:`~minimax_lab.model.lookup.init_index`
    with ``seed``), by the distillation loss against ``teacher`` (:data:`TEACHERS`, module
    docstring) on ``n_train`` sequences of ``cfg.index_len`` tokens (batches of ``batch_size``, Adam);
    the main branch stays frozen. With ``held`` (a :func:`~minimax_lab.model.lookup.lookup_batch`)
    the hit share on it is measured every ``eval_every`` steps, and at the end :func:`measure` of the
    trained selection (``"final"``). Returns ``{"step", "loss", "eval_step", "hit", "teacher",
    "seconds"}`` (and ``"final"``)."""
    check_choice(teacher, "teacher", TEACHERS)
    check_positive_int(steps, "steps")
    if batch_size < 2 and teacher == "shuffled":
        raise ValueError("a shuffled teacher needs batch_size >= 2 (each sequence gets another's teacher)")
    c = model.cfg
    init_index(model, seed)
    batches = [lookup_batch(c, batch_size, c.index_len, seed=50_000 + 1_000 * seed + i)
               for i in range(max(1, n_train // batch_size))]
    with torch.no_grad():
        targets = [(model.embed(b), teacher_mass(model, b)) for b in batches]
    if teacher == "shuffled":
        targets = [(x, mass.roll(1, dims=0)) for x, mass in targets]
    index_weights = [model.idx_q.weight, model.idx_k.weight]
    opt = torch.optim.Adam(index_weights, lr=lr)
    hist = {"step": [], "loss": [], "eval_step": [], "hit": [], "teacher": teacher}

    def evaluate(step):
        if held is not None:
            hist["eval_step"].append(step)
            hist["hit"].append(question_hits(held, learned_selection(model, held), c.block_size).mean().item())

    evaluate(0)
    t0 = time.perf_counter()
    for step in range(steps):
        x, mass = targets[step % len(targets)]
        loss = index_distill_loss(*model.index_qk(x), mass, block_size=c.block_size, impl="torch")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        hist["step"].append(step)
        hist["loss"].append(loss.item())
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            evaluate(step + 1)
    hist["seconds"] = time.perf_counter() - t0
    if held is not None:
        hist["final"] = measure(model, held, learned_selection(model, held))
    return hist


#: the rows of :func:`compare`, in the order the chapter draws them
COMPARED = ("untrained", "shuffled teacher", "random pick", "sliding window", "distilled", "oracle")


@torch.no_grad()
def compare(model: LookupModel, held: dict, *, untrained: dict, shuffled: dict, seed: int = 0) -> dict:
    """Every selection of the same cost on ``held``, as :func:`measure` dicts, in :data:`COMPARED`
    order, plus ``"dense"`` (all keys): ``untrained`` and ``shuffled`` are the measures of the index
    branch before distillation and after a shuffled teacher's; the model's index branch is the
    distilled one; ``seed`` draws the random pick."""
    sel = selections(model, held, seed=seed)
    out = {"untrained": untrained, "shuffled teacher": shuffled, "random pick": measure(model, held, sel["random"]),
           "sliding window": measure(model, held, sel["window"]), "distilled": measure(model, held, sel["learned"]),
           "oracle": measure(model, held, sel["oracle"])}
    out["dense"] = measure(model, held, None)
    return out


@torch.no_grad()
def by_length(model: LookupModel, lengths, *, n: int, seed: int = 3, names=("learned", "window", "random")) -> dict:
    """The needle test as the context grows: for each of ``lengths`` (tokens), ``n`` fresh sequences
    with ``cfg.n_pairs`` pairs (so the haystack grows), :func:`measure` of dense attention and of
    each selection in ``names``. Returns ``{"lengths", "n", "dense": [measure per length], name: [...]}``."""
    out = {"lengths": list(lengths), "n": n, "dense": [], **{name: [] for name in names}}
    for i, S in enumerate(lengths):
        batch = lookup_batch(model.cfg, n, S, seed=seed + i)
        out["dense"].append(measure(model, batch, None))
        for name, sel in selections(model, batch, seed=seed + i, names=names).items():
            out[name].append(measure(model, batch, sel))
    return out

