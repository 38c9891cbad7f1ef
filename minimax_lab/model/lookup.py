"""A key-value lookup whose answer lies many blocks back: a task where MSA's block selection decides
the answer, and the small attention model that solves it (the *main branch* of chapter 03).

**The sequence.** ``S`` positions, one token each; a token's embedding is the sum of its parts'::

    filler  filler  (k7, v3)  filler ... (k12, v0) ... filler | k12? k7? k12? ... (the last block)

* *filler* -- one of ``n_filler`` words that no question asks about;
* *pair* -- a key (one of ``n_keys``) and its value (one of ``n_values``): ``n_pairs`` pairs per
  sequence, with distinct keys, at random positions before the questions;
* *question* -- the last ``n_questions`` positions (one block of ``block_size``): each repeats one
  of the pairs' keys, and its answer is that pair's value.

The pairs lie anywhere before the question block, so most answers are many blocks back: a sliding
window of ``topk`` blocks sees an answer only when its pair happens to fall in the window.

**The main branch** (:class:`LookupModel`): one causal attention layer, ``n_heads`` query heads
sharing one key/value head (one GQA group, ``G = 1``), and a linear read-out of the values at the
question positions. It has no positions at all: the lookup is by content. Trained dense on short
sequences (:func:`train_lookup`), it answers long ones too.

**The index branch** (``LookupModel.index_qk``): MSA's shape, one index query per group
``q_idx = x W_qi`` ``[B, S, G, d_idx]`` and one index key per token ``k_idx = x W_ki``
``[B, S, d_idx]``; :mod:`minimax_lab.model.lookup_index` trains it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from minimax_lab.attention import attention, msa_attention
from minimax_lab.validate import check_positive_int

#: a token's role
FILLER, PAIR, QUESTION = 0, 1, 2


@dataclass(frozen=True)
class LookupConfig:
    """Sizes of the task, the main branch and the index branch. The main branch is trained on
    ``train_len``-token sequences with ``train_pairs`` pairs, the index branch on ``index_len``-token
    ones, and both are measured on held-out ``seq_len``-token ones; those two hold ``n_pairs`` pairs.
    The questions fill the last ``question_blocks`` blocks (``n_questions`` positions)."""

    n_keys: int = 64
    n_values: int = 16
    n_filler: int = 4
    n_pairs: int = 8
    block_size: int = 16
    topk: int = 4
    seq_len: int = 256
    index_len: int = 128
    train_len: int = 64
    train_pairs: int = 4
    d_model: int = 64
    n_heads: int = 2
    head_dim: int = 32
    d_idx: int = 16
    question_blocks: int = 1

    @property
    def n_questions(self) -> int:
        return self.question_blocks * self.block_size


def lookup_batch(cfg: LookupConfig, n: int, seq_len: int, *, seed: int, n_pairs: int | None = None) -> dict:
    """``n`` lookup sequences of ``seq_len`` tokens, drawn from ``seed``. Returns a dict of int64
    tensors: ``role, key, value, filler [n, seq_len]`` (a part a token lacks holds its table's last
    id: ``n_keys`` or ``n_values``), ``question_pos [Q]`` (the last ``Q = cfg.n_questions``
    positions), ``answer_pos [n, Q]`` (where each question's pair sits) and ``answer [n, Q]`` (its
    value). Raises ValueError when the pairs do not fit before the questions or the keys run out."""
    check_positive_int(n, "n")
    n_pairs = cfg.n_pairs if n_pairs is None else n_pairs
    Q = cfg.n_questions
    check_positive_int(n_pairs, "n_pairs", maximum=cfg.n_keys)
    if seq_len - Q < n_pairs:
        raise ValueError(f"{n_pairs} pairs do not fit before the {Q} questions in {seq_len} tokens")
    g = torch.Generator().manual_seed(seed)
    rows = torch.arange(n)[:, None]
    pos = torch.rand(n, seq_len - Q, generator=g).argsort(-1)[:, :n_pairs]      # distinct places
    keys = torch.rand(n, cfg.n_keys, generator=g).argsort(-1)[:, :n_pairs]      # distinct keys
    values = torch.randint(0, cfg.n_values, (n, n_pairs), generator=g)
    asked = torch.randint(0, n_pairs, (n, Q), generator=g)                       # which pair each question asks
    role = torch.full((n, seq_len), FILLER)
    key = torch.full((n, seq_len), cfg.n_keys)
    value = torch.full((n, seq_len), cfg.n_values)
    role[rows, pos], key[rows, pos], value[rows, pos] = PAIR, keys, values
    question_pos = torch.arange(seq_len - Q, seq_len)
    role[:, question_pos] = QUESTION
    key[:, question_pos] = keys.gather(1, asked)
    return {"role": role, "key": key, "value": value,
            "filler": torch.randint(0, cfg.n_filler, (n, seq_len), generator=g),
            "question_pos": question_pos, "answer_pos": pos.gather(1, asked), "answer": values.gather(1, asked)}


class LookupModel(nn.Module):
    """The main branch and the index branch (module docstring). Step API: :meth:`embed`,
    :meth:`qkv`, :meth:`index_qk`, :meth:`attend` (dense, or sparse over a given selection)."""

    def __init__(self, cfg: LookupConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.role = nn.Embedding(3, d)
        self.key = nn.Embedding(cfg.n_keys + 1, d)
        self.value = nn.Embedding(cfg.n_values + 1, d)
        self.filler = nn.Embedding(cfg.n_filler, d)
        self.wq = nn.Linear(d, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(d, cfg.head_dim, bias=False)
        self.wv = nn.Linear(d, cfg.head_dim, bias=False)
        self.readout = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.n_values)
        self.idx_q = nn.Linear(d, cfg.d_idx, bias=False)   # the index branch: one group
        self.idx_k = nn.Linear(d, cfg.d_idx, bias=False)

    def embed(self, batch: dict) -> torch.Tensor:
        """Token embeddings ``[B, S, d_model]``: the sum of the parts' embeddings."""
        return self.role(batch["role"]) + self.key(batch["key"]) + self.value(batch["value"]) + \
            self.filler(batch["filler"])

    def qkv(self, x: torch.Tensor):
        """``q [B, S, n_heads, head_dim]``, ``k, v [B, S, 1, head_dim]``."""
        B, S, _ = x.shape
        c = self.cfg
        return (self.wq(x).view(B, S, c.n_heads, c.head_dim), self.wk(x).view(B, S, 1, c.head_dim),
                self.wv(x).view(B, S, 1, c.head_dim))

    def index_qk(self, x: torch.Tensor):
        """The index branch: ``q_idx [B, S, 1, d_idx]``, ``k_idx [B, S, d_idx]``."""
        return self.idx_q(x)[:, :, None], self.idx_k(x)

    def attend(self, batch: dict, selected: torch.Tensor | None = None) -> torch.Tensor:
        """Logits over the values at the question positions ``[B, Q, n_values]``: dense causal
        attention, or MSA's sparse attention over ``selected`` (int32 ``[B, S, 1, topk]``)."""
        x = self.embed(batch)
        q, k, v = self.qkv(x)
        if selected is None:
            o = attention(q, k, v, causal=True, impl="torch")
        else:
            q_idx, k_idx = self.index_qk(x)
            o = msa_attention(q, k, v, q_idx, k_idx, block_size=self.cfg.block_size, topk=self.cfg.topk,
                              impl="torch", selected=selected)
        o = o[:, batch["question_pos"]]
        return self.readout(o.reshape(*o.shape[:2], -1))


def answer_loss(model: LookupModel, batch: dict, selected: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy of the questions' answers (mean over questions)."""
    logits = model.attend(batch, selected)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["answer"].reshape(-1))


@torch.no_grad()
def answered(model: LookupModel, batch: dict, selected: torch.Tensor | None = None) -> torch.Tensor:
    """Per question, whether the model's answer is right: float ``[B, Q]`` (1.0 or 0.0)."""
    return (model.attend(batch, selected).argmax(-1) == batch["answer"]).float()


def train_lookup(cfg: LookupConfig = LookupConfig(), *, steps: int = 100, batch_size: int = 32, lr: float = 1e-2,
                 seed: int = 0) -> tuple[LookupModel, dict]:
    """Train the main branch dense on ``cfg.train_len``-token sequences with ``cfg.train_pairs``
    pairs (a fresh batch per step, seeds from ``seed``); the index branch is left as initialised.
    Returns ``(model, {"loss": [...], "seconds"})``."""
    check_positive_int(steps, "steps")
    torch.manual_seed(seed)
    model = LookupModel(cfg)
    main = [p for name, p in model.named_parameters() if not name.startswith("idx_")]
    opt = torch.optim.Adam(main, lr=lr)
    losses, t0 = [], time.perf_counter()
    for step in range(steps):
        batch = lookup_batch(cfg, batch_size, cfg.train_len, seed=seed * 1_000_003 + step, n_pairs=cfg.train_pairs)
        loss = answer_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    return model, {"loss": losses, "seconds": time.perf_counter() - t0}


def init_index(model: LookupModel, seed: int, *, scale: float = 0.1) -> None:
    """Re-draw the index weights ``N(0, scale² / d_model)`` from ``seed`` (an untrained index branch).

    Small weights keep the first scores small, so the distillation's softmax starts near uniform;
    scaling both weights does not change the untrained ranking."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in (model.idx_q.weight, model.idx_k.weight):
            w.copy_(scale * torch.randn(w.shape, generator=g) / math.sqrt(w.shape[1]))
