"""Choosing the next token: greedy, or temperature + top-p (nucleus) sampling from a seeded generator.

``SamplingParams`` belongs to a request. :func:`sample` takes the fp32 logits of the rows a step
produced and one params object per row:

* ``temperature == 0`` -- greedy: ``argmax`` (ties: the lowest id, as ``torch.argmax``);
* ``temperature > 0`` -- softmax of ``logits / temperature``, keep the smallest set of the most
  likely tokens whose probability reaches ``top_p`` (Holtzman et al. 2019, arXiv 1904.09751;
  at least the most likely token), renormalise, draw one token with the request's own
  ``torch.Generator`` (seeded with ``seed``), so a request draws the same tokens whatever it is
  batched with;
* ``forced_tokens`` -- the request emits these tokens instead (teacher forcing: the bench runs
  every day on day 0's tokens, so their logits are compared on equal contexts).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from minimax_lab.kvcache.blocks import token_ids
from minimax_lab.validate import check_positive_int


@dataclass(frozen=True)
class SamplingParams:
    """``max_tokens`` new tokens; ``temperature`` (0 = greedy) and ``top_p`` in ``(0, 1]``; ``seed``
    of the request's generator; ``eos_id`` ends a request early (``None``: never);
    ``forced_tokens`` (a tuple of ids, at least ``max_tokens`` long) replaces sampling."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    eos_id: int | None = None
    forced_tokens: tuple | None = None

    def __post_init__(self):
        check_positive_int(self.max_tokens, "max_tokens")
        for name in ("temperature", "top_p"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise TypeError(f"{name} must be a finite number, got {v!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"seed must be an int, got {type(self.seed).__name__}")
        if self.forced_tokens is not None:
            forced = tuple(token_ids(self.forced_tokens, "forced_tokens"))
            if len(forced) < self.max_tokens:
                raise ValueError(f"forced_tokens must hold max_tokens={self.max_tokens} ids, got {len(forced)}")
            object.__setattr__(self, "forced_tokens", forced)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """``probs [V]`` (summing to 1) -> the nucleus: zero outside the smallest set of most likely
    tokens whose mass reaches ``top_p``, renormalised."""
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(descending=True)
    before = sorted_p.cumsum(0) - sorted_p            # mass of the tokens ranked above each one
    keep = before < top_p                              # the first token always has before = 0
    kept = torch.zeros_like(probs).scatter_(0, order, torch.where(keep, sorted_p, 0.0))
    return kept / kept.sum()


def sample(logits: torch.Tensor, params: list, generators: list, steps: list) -> list[int]:
    """One token per row of ``logits [n, V]`` (fp32): ``params[i]`` says how, ``generators[i]`` is the
    row's request generator (``None`` when greedy or forced), ``steps[i]`` how many tokens the
    request has emitted (indexes ``forced_tokens``)."""
    n = logits.shape[0]
    out: list = [None] * n
    greedy_rows = [i for i in range(n) if params[i].forced_tokens is None and params[i].greedy]
    if greedy_rows:
        picks = logits[greedy_rows].argmax(-1).tolist()
        for i, t in zip(greedy_rows, picks):
            out[i] = t
    for i in range(n):
        p = params[i]
        if p.forced_tokens is not None:
            out[i] = p.forced_tokens[steps[i]]
        elif not p.greedy:
            probs = top_p_filter(torch.softmax(logits[i] / p.temperature, dim=-1), p.top_p)
            out[i] = int(torch.multinomial(probs, 1, generator=generators[i]))
    return out
