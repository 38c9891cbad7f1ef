"""Which tokens the next step computes: admission, chunked prefill and continuous batching.

The scheduler owns the page bookkeeping of its sequences through a
:class:`minimax_lab.kvcache.BlockManager` (keyed by each sequence's cache keys, see
:mod:`.sequence`). Each :meth:`Scheduler.schedule` returns a :class:`Plan`:

* **One at a time** (``continuous_batching=False``): the sequence in flight either gets its prompt
  (whole, or ``step_tokens`` at a time) or one decode token; when it finishes, the next waiting
  request is admitted.
* **Continuous batching**: every running sequence that has its first token decodes one more
  (``BlockManager.append`` gives its slot); the rest of the ``step_tokens`` budget goes to prompt
  chunks -- first the sequences already prefilling (oldest first), then newly admitted ones
  (first come, first served, up to ``max_batch`` running). A long prompt is thus computed in
  chunks beside the running decodes (chunked prefill). Nothing starves: every running sequence
  decodes at every step, the budget always leaves room for a chunk (``step_tokens > max_batch``),
  the oldest prefill is served first, and admission stops at the first waiting request that
  cannot be admitted rather than letting later ones overtake it.

Admission allocates pages for the whole prompt (``BlockManager.allocate``; with prefix caching
the verified cached prefix is shared, its tokens are not computed again) and **reserves** the
pages the request's ``max_tokens`` will need, so a running sequence never finds the pool full.
A request is admitted only when free plus evictable pages cover it and every reservation.

Prefix caching names a full page when it is *allocated*, before its K/V are computed, so a
newly admitted request must never find a page whose K/V no step will have written. It cannot:
a request is admitted only while budget is left, and budget is left only if every sequence still
prefilling got the rest of its prompt in this step (prompts are continued oldest first, each as far
as the budget goes); a page a decode token fills is named when the token is appended, and this
step computes that token. Every named page therefore holds K/V by the end of this step, and a step
writes all K/V of a layer before any attention of that layer reads them.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from minimax_lab.engine.sequence import Sequence, Status
from minimax_lab.kvcache.blocks import BlockManager


@dataclass
class Plan:
    """One step's work: ``decodes`` (one token each: the newest generated token, appended to the
    block manager at ``decode_slots``) and ``prefills`` (``(sequence, start, end)``: compute prompt
    tokens ``start .. end``)."""

    decodes: list = field(default_factory=list)
    decode_slots: list = field(default_factory=list)
    prefills: list = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return len(self.decodes) + sum(e - s for _, s, e in self.prefills)

    def __bool__(self) -> bool:
        return bool(self.decodes or self.prefills)


class Scheduler:
    """See the module docstring. ``max_seq_len`` bounds prompt + ``max_tokens`` of a request."""

    def __init__(self, blocks: BlockManager, *, continuous_batching: bool, max_batch: int,
                 step_tokens: int | None, max_seq_len: int):
        self.blocks = blocks
        self.page_size = blocks.page_size
        self.continuous_batching = continuous_batching
        self.max_batch = max_batch if continuous_batching else 1
        self.step_tokens = step_tokens
        self.max_seq_len = max_seq_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    # ---- requests ------------------------------------------------------------------------------
    def final_pages(self, seq: Sequence) -> int:
        """Pages ``seq`` holds when it has generated ``max_tokens`` (the last token's K/V is never computed)."""
        return math.ceil((seq.prompt_len + seq.sampling.max_tokens - 1) / self.page_size)

    def add(self, seq: Sequence) -> None:
        """Queue a request; raises ``ValueError`` if it could never fit (``max_seq_len`` or the pool)."""
        total = seq.prompt_len + seq.sampling.max_tokens
        if total > self.max_seq_len:
            raise ValueError(f"request {seq.seq_id!r}: prompt ({seq.prompt_len}) + max_tokens "
                             f"({seq.sampling.max_tokens}) = {total} tokens > max_seq_len={self.max_seq_len}")
        if self.final_pages(seq) > self.blocks.num_pages:
            raise ValueError(f"request {seq.seq_id!r} needs {self.final_pages(seq)} KV pages of {self.page_size} "
                             f"tokens, the pool has {self.blocks.num_pages}; give the engine more kv_tokens")
        self.waiting.append(seq)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Run ``child`` beside ``parent``, sharing its pages; raises ``ValueError`` when the pool
        cannot also hold the child's future pages."""
        available = self._available()
        self.blocks.fork(parent.seq_id, child.seq_id)
        need = self._future_pages(child)
        if need > available:
            self.blocks.free(child.seq_id)
            raise ValueError(f"the KV pool cannot hold fork {child.seq_id!r}: it needs {need} more pages, "
                             f"{available} are free")
        self.running.append(child)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Drop a finished sequence: its pages go back (full ones stay cached for later requests)."""
        self.blocks.free(seq.seq_id)
        self.running.remove(seq)
        seq.status = Status.FINISHED

    # ---- admission -----------------------------------------------------------------------------
    def _future_pages(self, seq: Sequence) -> int:
        """Pages ``seq`` will still take from the pool: up to its final length, plus one if its last
        page is partial and shared (after ``fork``: the first write copies it)."""
        held = self.blocks.seqs[seq.seq_id]
        future = self.final_pages(seq) - len(held.pages)
        if held.pages and len(held.tokens) % self.page_size and self.blocks.refcount[held.pages[-1]] > 1:
            future += 1
        return future

    def _available(self) -> int:
        """Pages free or evictable, minus those promised to running sequences."""
        reserved = sum(self._future_pages(s) for s in self.running)
        return len(self.blocks.free_pages) + len(self.blocks.policy) - reserved

    def _try_admit(self, seq: Sequence) -> bool:
        available = self._available()
        if self.final_pages(seq) > available:   # a cached prefix may still make it fit: count it
            hit = self.blocks.lookup(seq.keys, max_pages=(seq.prompt_len - 1) // self.page_size)
            idle_hits = sum(1 for p in hit if self.blocks.refcount[p] == 0)
            if self.final_pages(seq) - len(hit) + idle_hits > available:
                return False
        cached = self.blocks.allocate(seq.seq_id, seq.keys)
        seq.computed = seq.cached_tokens = cached
        seq.status = Status.PREFILL
        self.waiting.popleft()
        self.running.append(seq)
        return True

    # ---- the step ------------------------------------------------------------------------------
    def schedule(self) -> Plan:
        """The next step's :class:`Plan` (empty when there is nothing to do or nothing fits)."""
        plan = Plan()
        budget = self.step_tokens if self.step_tokens is not None else math.inf
        for seq in self.running:             # decode: the newest token's K/V and the next logits
            if seq.status is Status.DECODE:
                plan.decode_slots.append(self.blocks.append(seq.seq_id, seq.output[-1]))
                plan.decodes.append(seq)
                budget -= 1
        for seq in self.running:             # continue prompts, oldest first
            if seq.status is Status.PREFILL and budget > 0:
                n = min(seq.remaining_prompt, budget)
                plan.prefills.append((seq, seq.computed, seq.computed + n))
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_batch:
            seq = self.waiting[0]
            if not self._try_admit(seq):
                break
            n = min(seq.remaining_prompt, budget)
            plan.prefills.append((seq, seq.computed, seq.computed + n))
            budget -= n
        return plan
