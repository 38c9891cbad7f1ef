"""A request inside the engine: its prompt, images, cache keys, progress and timestamps.

Two token lists per sequence:

* ``prompt`` -- the model's ids: text ids, and ``cfg.img_id`` once per image patch;
* ``keys`` -- what the block manager names pages by (:mod:`minimax_lab.kvcache.blocks`): the text
  ids themselves, and for the k-th patch of an image ``vocab_size + blake2b(image bytes, k)``
  (a 128-bit integer), so two prompts share cached pages only where their images are equal
  too -- a placeholder id alone would let two different images share K/V.

Progress: ``computed`` tokens of :attr:`Sequence.tokens` (prompt, then output) have K/V in the
cache; ``prefill_end`` is how many tokens the prefill phase computes before the next token is
sampled -- the prompt, or after a preemption by recompute the prompt and every output token.
Timestamps (seconds on the engine's clock): ``arrival``, ``first_token``, ``token_times`` (one per
generated token), ``finished``.
"""
from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field

import torch

from minimax_lab.engine.sampling import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"      # not admitted: no pages (new, or preempted)
    PREFILL = "prefill"      # admitted, prefill partly computed
    DECODE = "decode"        # prefill computed, generating
    FINISHED = "finished"


def image_keys(image: torch.Tensor, n_patches: int, offset: int) -> list[int]:
    """Cache keys of one image's patches: ``offset + blake2b-128(image bytes, patch index)``."""
    data = image.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
    digest = hashlib.blake2b(data, digest_size=16).digest()
    keys = []
    for k in range(n_patches):
        patch = hashlib.blake2b(digest + k.to_bytes(4, "little"), digest_size=16).digest()
        keys.append(offset + int.from_bytes(patch, "little"))
    return keys


@dataclass(eq=False)
class Sequence:
    """One request's state (see the module docstring).

    ``swapped`` holds the host copy of its pages while it waits after a preemption by swap;
    ``preemptions`` counts how often it was preempted; ``aborted`` is set by ``Engine.abort``."""

    seq_id: object
    prompt: list
    keys: list
    sampling: SamplingParams
    patches: torch.Tensor | None = None       # [n_patches, d] patch embeddings, in placeholder order
    patch_positions: list = field(default_factory=list)   # prompt positions of the placeholders
    status: Status = Status.WAITING
    computed: int = 0
    prefill_end: int = 0
    output: list = field(default_factory=list)
    logits: list = field(default_factory=list)            # fp32 [V] rows, when the engine records them
    generator: torch.Generator | None = None
    arrival: float = 0.0
    first_token: float | None = None
    token_times: list = field(default_factory=list)
    finished: float | None = None
    cached_tokens: int = 0                                 # prompt tokens served by the prefix cache
    swapped: object | None = None
    preemptions: int = 0
    aborted: bool = False

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def tokens(self) -> list:
        """Every token of the sequence so far: the prompt, then the generated ones."""
        return self.prompt + self.output

    def cache_keys(self) -> list:
        """The block manager's names for :attr:`tokens` (the prompt's keys, then the output ids)."""
        return self.keys + self.output

    @property
    def remaining_prompt(self) -> int:
        """Tokens the prefill phase still has to compute."""
        return self.prefill_end - self.computed

    def is_done(self) -> bool:
        p = self.sampling
        return len(self.output) >= p.max_tokens or (p.eos_id is not None and bool(self.output)
                                                    and self.output[-1] == p.eos_id)
