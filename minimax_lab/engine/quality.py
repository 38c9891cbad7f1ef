"""What FP8 costs: where the M3 model's logits move, and what the tiny trained model's accuracy does.

**Where the error comes from** (:func:`fp8_breakdown`). The M3-shaped model has random weights,
so its FP8 day is compared with day 0 logit by logit. A pooled relative error
``||l - l0|| / ||l0||`` over a few answer tokens says how much, not where or why. The breakdown
re-scores each served turn with teacher forcing -- the whole sequence (prompt and answer) in one
forward pass, dense layers by causal attention, MSA layers by ``msa_select`` then
``msa_attention`` -- once in full precision and once per FP8 *component*: one layer's K and V
(rounded per token and head, as the FP8 cache stores them), one MSA layer's index keys (per
token), one layer's experts (FP8 weights per output channel and activations per token, as the
FP8 day runs them), and everything at once. Each row gives the pooled error, the median and
largest error of one token's logits, top-1 agreement, and how many of MSA's block selections
(one per token and kv group) changed -- with the smallest *margin* among the changed ones: how
far apart, relative to the largest block score, the two blocks' scores were in full precision.
A selection is a discrete choice, so a perturbation of any size flips the near-ties, and a
flipped block changes that token's attention wholesale: one such token can dominate a pooled
error over a handful of tokens. Whether it does is tested, not assumed: a component that flipped
selections is scored once more with the same rounding but the full-precision selections kept
(``err_selections_kept``); :func:`minimax_lab.viz.engine.breakdown_lines` puts the two errors side by side.

**What it costs a model that has learned something** (:func:`fp8_accuracy`). The workbook's tiny
early-fusion model (chapter 01, ``minimax_lab/assets/tiny_cpu.pt``) answers questions about
images, so there FP8 is scored by held-out answer accuracy, four ways, each storing in FP8 through
the package's one quantizer (:func:`minimax_lab.fp8.quantize_fp8`):

* ``"fp32"`` -- as trained;
* ``"fp8 KV"`` -- every layer's keys (after RoPE) and values rounded to FP8 per token and head;
* ``"fp8 FFN"`` -- the FFN's weights (gate, up, down: one dense SwiGLU where the M3 model has
  routed experts) in FP8 per output channel;
* ``"fp8 KV + FFN"`` -- both.

Each row gives the accuracy, its change from fp32 with a 95% confidence interval from a paired
bootstrap (the same examples scored both ways, resampled together; seeded), the number of answers
that turned right and wrong, and the answer logits' relative error and top-1 agreement.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from minimax_lab.attention import attention, msa_attention, msa_select
from minimax_lab.data import collate
from minimax_lab.data.examples import make_examples
from minimax_lab.engine.paged_attention import StepBatch
from minimax_lab.engine.precision import fake_quantize
from minimax_lab.model import load_pretrained

VARIANTS = ("fp32", "fp8 KV", "fp8 FFN", "fp8 KV + FFN")


# ---------------------------------------------------------------------------------------------- the M3 model


@dataclass
class Rescore:
    """One served turn to score again: the sequence's ``tokens`` (prompt, then the answer but its
    last token), its image ``patches`` at ``patch_positions``, and the positions whose logits are
    the answer's (``answer_rows``)."""

    tokens: list
    patches: torch.Tensor | None
    patch_positions: list
    answer_rows: list


def turns_to_rescore(run, engine) -> list[Rescore]:
    """The turns of ``run`` (a :class:`~minimax_lab.engine.workloads.RunResult`) served by
    ``engine``, as :class:`Rescore` items."""
    out = []
    for t in run.turns:
        seq = engine.sequences[t.request_id]
        n = len(seq.output)
        out.append(Rescore(seq.prompt + seq.output[:-1], seq.patches, list(seq.patch_positions),
                           list(range(seq.prompt_len - 1, seq.prompt_len + n - 1))))
    return out


class _WholeSequence:
    """``attend`` for one whole sequence (see :meth:`M3Model.forward`), rounding the components
    named in ``kv`` / ``index`` (layer indices) as FP8 storage does, and keeping each MSA layer's
    selection and index branch; with ``keep`` (``{layer: selection}``) an MSA layer attends to
    those blocks instead of selecting its own."""

    def __init__(self, cfg, *, kv=(), index=(), keep: dict | None = None):
        self.cfg, self.kv, self.index, self.keep = cfg, set(kv), set(index), keep or {}
        self.selected: dict = {}
        self.index_branch: dict = {}

    def __call__(self, layer, q, k, v, q_idx, k_idx):
        c = self.cfg
        if layer in self.kv:
            k, v = fake_quantize(k), fake_quantize(v)
        if q_idx is None:
            return attention(q[None], k[None], v[None], causal=True, impl="torch")[0]
        if layer in self.index:
            k_idx = fake_quantize(k_idx)
        sel = (self.keep[layer][None] if layer in self.keep else
               msa_select(q_idx[None], k_idx[None], block_size=c.block_size, topk=c.topk, impl="torch"))
        self.selected[layer], self.index_branch[layer] = sel[0], (q_idx, k_idx)
        return msa_attention(q[None], k[None], v[None], q_idx[None], k_idx[None], block_size=c.block_size,
                             topk=c.topk, impl="torch", selected=sel)[0]


@torch.inference_mode()
def rescore(model, items: list, *, kv=(), index=(), experts=(), keep: list | None = None) -> tuple[list, list]:
    """Teacher-forced logits of each :class:`Rescore` item (``[answer tokens, vocab]`` fp32) with
    FP8 in the layers named by ``kv``, ``index`` and ``experts``; and per item the
    :class:`_WholeSequence` that holds its MSA selections. ``keep``: per item, the
    :class:`_WholeSequence` of an earlier run whose selections every MSA layer reuses."""
    if experts:
        model.quantize_experts()
    dev = next(model.parameters()).device
    logits, attends = [], []
    for i, it in enumerate(items):
        n = len(it.tokens)
        rows = [p for p in it.patch_positions if p < n]
        batch = StepBatch(torch.tensor(it.tokens, device=dev), torch.arange(n, device=dev),
                          torch.zeros(n, dtype=torch.long, device=dev),
                          logit_rows=torch.tensor(it.answer_rows, device=dev))
        if rows:
            batch.patches, batch.patch_rows = it.patches[:len(rows)], torch.tensor(rows, device=dev)
        attend = _WholeSequence(model.cfg, kv=kv, index=index, keep=keep[i].selected if keep else None)
        logits.append(model(batch, attend, moe_impl="torch", expert_fp8=set(experts)).float())
        attends.append(attend)
    return logits, attends


def _block_scores(q_idx_row, k_idx, t: int, block_size: int) -> torch.Tensor:
    """Block scores (max over the block's visible tokens) of one query's index row ``[D_idx]`` at position ``t``."""
    s = (k_idx[:t + 1].float() @ q_idx_row.float())
    nb = t // block_size + 1
    padded = torch.full((nb * block_size,), float("-inf"), device=s.device)
    padded[:t + 1] = s
    return padded.view(nb, block_size).amax(1)


def _flips(ref_attends: list, attends: list, block_size: int) -> tuple[int, int, list]:
    """(selections compared, selections changed, the full-precision margins of the changed ones)."""
    total = changed = 0
    margins = []
    for ra, a in zip(ref_attends, attends):
        for layer, sel0 in ra.selected.items():
            sel1 = a.selected[layer]
            s0, s1 = sel0.sort(-1).values, sel1.sort(-1).values
            diff = (s0 != s1).any(-1)                      # [S, G]
            total += diff.numel()
            changed += int(diff.sum())
            q_idx, k_idx = ra.index_branch[layer]
            for t, g in diff.nonzero().tolist():
                scores = _block_scores(q_idx[t, g], k_idx, t, block_size)
                chosen = {b for b in sel0[t, g].tolist() if b >= 0 and b != t // block_size}
                others = [b for b in range(t // block_size) if b not in chosen]
                if not chosen or not others:
                    continue
                gap = min(scores[b] for b in chosen) - max(scores[b] for b in others)
                margins.append(float(gap / scores[:t // block_size + 1].abs().max().clamp_min(1e-30)))
    return total, changed, margins


def _compare(logits: list, ref: list) -> dict:
    a, b = torch.cat(logits).double(), torch.cat(ref).double()
    per_token = torch.linalg.vector_norm(a - b, dim=-1) / torch.linalg.vector_norm(b, dim=-1)
    return {"logits_rel_err": float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)),
            "token_err_p50": float(per_token.median()), "token_err_max": float(per_token.max()),
            "top1_agreement": float((a.argmax(-1) == b.argmax(-1)).double().mean()), "tokens": int(a.shape[0])}


def fp8_breakdown(model, items: list) -> list[dict]:
    """One row per FP8 component of ``model`` (module docstring) on the turns ``items``:
    ``{component, layer, logits_rel_err, token_err_p50, token_err_max, top1_agreement, tokens,
    selections, selection_flips, closest_margin, widest_margin, err_selections_kept}``
    (``err_selections_kept``: the pooled error with the same rounding and the full-precision
    selections, None where no selection changed); the last row puts everything in FP8."""
    cfg = model.cfg
    ref, ref_att = rescore(model, items)
    parts = []
    for layer in range(cfg.n_layers):
        parts.append(("K and V", layer, dict(kv=(layer,))))
        if layer in cfg.sparse_layers:
            parts.append(("index keys", layer, dict(index=(layer,))))
        parts.append(("experts", layer, dict(experts=(layer,))))
    every = tuple(range(cfg.n_layers))
    parts.append(("everything", None, dict(kv=every, index=cfg.sparse_layers, experts=every)))
    rows = []
    for name, layer, kw in parts:
        logits, att = rescore(model, items, **kw)
        total, changed, margins = _flips(ref_att, att, cfg.block_size)
        kept = _compare(rescore(model, items, keep=ref_att, **kw)[0], ref)["logits_rel_err"] if changed else None
        rows.append({"component": name, "layer": layer, **_compare(logits, ref), "selections": total,
                     "selection_flips": changed, "closest_margin": min(margins, default=None),
                     "widest_margin": max(margins, default=None), "err_selections_kept": kept})
    return rows


# ---------------------------------------------------------------------------------------------- the tiny model


def _fp8_kv(block) -> None:
    """Make ``block.qkv`` return FP8-rounded keys and values (an instance attribute shadows the method)."""
    qkv = block.qkv

    def rounded(h, positions):
        q, k, v = qkv(h, positions)
        return q, fake_quantize(k), fake_quantize(v)

    block.qkv = rounded


@torch.no_grad()
def _fp8_ffn(block) -> None:
    for lin in (block.ffn.gate, block.ffn.up, block.ffn.down):   # weight [out, in]: one scale per output row
        lin.weight.copy_(fake_quantize(lin.weight))


def variant(model, name: str):
    """A copy of the tiny ``model`` computing as ``name`` (one of :data:`VARIANTS`); raises
    ``ValueError`` for another name or a model whose FFN is not the dense SwiGLU."""
    if name not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {name!r}")
    m = copy.deepcopy(model).eval()
    for block in m.blocks:
        if "KV" in name:
            _fp8_kv(block)
        if "FFN" in name:
            if not all(hasattr(block.ffn, n) for n in ("gate", "up", "down")):
                raise ValueError(f"fp8 FFN needs the dense SwiGLU FFN, got {type(block.ffn).__name__}")
            _fp8_ffn(block)
    return m


@torch.no_grad()
def _answer_logits(model, examples, batch_size: int = 256) -> torch.Tensor:
    out = []
    for i in range(0, len(examples), batch_size):
        b = collate(examples[i:i + batch_size])
        logits = model(b.tokens, b.images)
        out.append(logits[torch.arange(len(b.qtypes)), b.answer_pos].float())
    return torch.cat(out)


def paired_change(before: torch.Tensor, after: torch.Tensor, *, resamples: int = 2000, level: float = 0.95,
                  seed: int = 0) -> dict:
    """The change in accuracy from ``before`` to ``after`` (bool tensors: each example right or
    wrong, the same examples) with a ``level`` confidence interval from a paired bootstrap:
    ``{change, low, high, turned_right, turned_wrong}`` (changes as shares, e.g. -0.004)."""
    if before.shape != after.shape or before.ndim != 1 or before.numel() == 0:
        raise ValueError(f"before and after must be 1-D of one length, got {tuple(before.shape)} and {tuple(after.shape)}")
    d = after.double() - before.double()
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, d.numel(), (resamples, d.numel()), generator=g)
    means = d[idx].mean(1)
    tail = (1 - level) / 2
    lo, hi = torch.quantile(means, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return {"change": float(d.mean()), "low": lo, "high": hi,
            "turned_right": int(((d > 0)).sum()), "turned_wrong": int((d < 0).sum())}


def fp8_accuracy(n_examples: int = 1024, *, seed: int = 1, model=None) -> list[dict]:
    """Rows ``{variant, accuracy, change, low, high, turned_right, turned_wrong, logits_rel_err,
    top1_agreement, examples}`` for each of :data:`VARIANTS`, on ``n_examples`` held-out
    (test-split) examples drawn from ``seed``, with ``model`` (default: the shipped checkpoint, on
    the CPU). Accuracy is the share of answers whose argmax is the right word (as
    :func:`minimax_lab.model.accuracy`); ``change`` and its interval (``low``, ``high``) are
    against fp32 (:func:`paired_change`)."""
    if isinstance(n_examples, bool) or not isinstance(n_examples, int) or n_examples < 1:
        raise ValueError(f"n_examples must be a positive int, got {n_examples!r}")
    model = load_pretrained()[0] if model is None else model
    examples = make_examples("test", n_examples, seed)
    answers = torch.cat([collate(examples[i:i + 256]).answer_id for i in range(0, n_examples, 256)])
    base = base_right = None
    rows = []
    for name in VARIANTS:
        logits = _answer_logits(variant(model, name), examples)
        right = logits.argmax(-1) == answers
        if base is None:
            base, base_right = logits, right
        rows.append({"variant": name, "accuracy": float(right.double().mean()), **paired_change(base_right, right),
                     "logits_rel_err": float(torch.linalg.vector_norm(logits - base) / torch.linalg.vector_norm(base)),
                     "top1_agreement": float((logits.argmax(-1) == base.argmax(-1)).double().mean()),
                     "examples": n_examples})
    return rows


def format_rows(rows: list[dict]) -> str:
    """The rows of :func:`fp8_accuracy` as a plain-text table."""
    lines = [f"{'variant':14s} {'accuracy':>9s} {'change (95% CI)':>26s} {'turned right':>13s} {'turned wrong':>13s} "
             f"{'logits rel. err':>16s} {'top-1 = fp32':>13s}"]
    for r in rows:
        ci = f"{100 * r['change']:+.1f} pt ({100 * r['low']:+.1f} to {100 * r['high']:+.1f})"
        lines.append(f"{r['variant']:14s} {r['accuracy']:9.1%} {ci:>26s} {r['turned_right']:>13d} {r['turned_wrong']:>13d} "
                     f"{r['logits_rel_err']:16.2e} {r['top1_agreement']:13.1%}")
    return "\n".join(lines)
