"""What FP8 costs a model that has learned something: the shipped tiny model's held-out accuracy.

The M3-shaped model the engine serves has random weights, so its FP8 day can only be compared
with day 0 logit by logit (``logits_rel_err``, ``top1_agreement`` in the bench records). The
workbook's tiny early-fusion model (notebook 01, ``minimax_lab/assets/tiny_cpu.pt``) answers
questions about images, so there FP8 can be scored by what matters: held-out answer accuracy.

:func:`fp8_accuracy` evaluates it four ways, each storing in FP8 through the package's one
quantizer (:func:`minimax_lab.fp8.quantize_fp8`, power-of-two scales), as the engine does:

* ``"fp32"`` -- as trained;
* ``"fp8 KV"`` -- every layer's keys (after RoPE) and values rounded to FP8 with one scale per
  token and head, the values an FP8 KV cache would hand back to attention;
* ``"fp8 FFN"`` -- the FFN's weights (gate, up, down: the tiny model's FFN is dense, one SwiGLU,
  where the M3 model has routed SwiGLU experts) in FP8 with one scale per output channel, as the
  engine's FP8 experts;
* ``"fp8 KV + FFN"`` -- both.

Each row also gives the answer logits' relative error and top-1 agreement against fp32 on the
same examples.
"""
from __future__ import annotations

import copy

import torch

from minimax_lab.data import collate
from minimax_lab.data.examples import make_examples
from minimax_lab.engine.precision import fake_quantize
from minimax_lab.model import load_pretrained

VARIANTS = ("fp32", "fp8 KV", "fp8 FFN", "fp8 KV + FFN")


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


def fp8_accuracy(n_examples: int = 1024, *, seed: int = 1, model=None) -> list[dict]:
    """Rows ``{variant, accuracy, logits_rel_err, top1_agreement, examples}`` for each of
    :data:`VARIANTS`, on ``n_examples`` held-out (test-split) examples drawn from ``seed``, with
    ``model`` (default: the shipped checkpoint, on the CPU). Accuracy is the share of answers
    whose argmax is the right word (as :func:`minimax_lab.model.accuracy`)."""

    if isinstance(n_examples, bool) or not isinstance(n_examples, int) or n_examples < 1:
        raise ValueError(f"n_examples must be a positive int, got {n_examples!r}")
    model = load_pretrained()[0] if model is None else model
    examples = make_examples("test", n_examples, seed)
    answers = torch.cat([collate(examples[i:i + 256]).answer_id for i in range(0, n_examples, 256)])
    base = None
    rows = []
    for name in VARIANTS:
        logits = _answer_logits(variant(model, name), examples)
        base = logits if base is None else base
        rows.append({"variant": name, "accuracy": float((logits.argmax(-1) == answers).double().mean()),
                     "logits_rel_err": float(torch.linalg.vector_norm(logits - base) / torch.linalg.vector_norm(base)),
                     "top1_agreement": float((logits.argmax(-1) == base.argmax(-1)).double().mean()),
                     "examples": n_examples})
    return rows


def format_rows(rows: list[dict]) -> str:
    """The rows of :func:`fp8_accuracy` as a plain-text table."""
    lines = [f"{'variant':14s} {'accuracy':>9s} {'logits rel. err':>16s} {'top-1 = fp32':>13s}"]
    for r in rows:
        lines.append(f"{r['variant']:14s} {r['accuracy']:9.1%} {r['logits_rel_err']:16.2e} {r['top1_agreement']:13.1%}")
    return "\n".join(lines)
