"""Which tokens the next step computes: admission, chunked prefill, continuous batching, preemption.

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

``max_batch`` bounds the running sequences, forks included (:meth:`Scheduler.fork` refuses one
more).

**Memory** (``preemption``):

* ``None`` -- reserve up front: admission allocates pages for the whole prompt
  (``BlockManager.allocate``; with prefix caching the verified cached prefix is shared, its tokens
  are not computed again) and **reserves** the pages the request's ``max_tokens`` will need, so a
  running sequence never finds the pool full. A request is admitted only when free plus evictable
  pages cover it and every reservation.
* ``"recompute"`` or ``"swap"`` -- admission reserves only the prompt's pages (and keeps a
  watermark of :data:`WATERMARK` of the pool free), so more requests run at once. When the
  decodes of a step need more new pages than are free or evictable, the scheduler **preempts**
  the newest decoding sequence (latest arrival), again until the rest fit: by *recompute* its
  pages are freed and it waits at the head of the queue, to be prefilled again over its prompt
  and every token it has generated (its full pages stay cached with prefix caching, so a hit
  saves most of that); by *swap* its pages are copied to the host (:class:`HostSwap`) and freed,
  and on readmission copied back into fresh pages, and it decodes in that same step (a swap-in
  is never a step of its own: the readmitted sequence's next page is among those admission
  found free, since admission leaves the watermark free). Either way it resumes with the tokens
  it would have generated unpreempted: its next token comes from the same context, and its
  sampler's state is untouched. Only decoding sequences are preempted: a prefilling one already holds every
  page of its prompt, and its pages beyond the computed ones are named but not yet written.

Prefix caching names a full page when it is *allocated*, before its K/V are computed, so a
newly admitted request must never find a page whose K/V no step will have written. It cannot:
a request is admitted only while budget is left, and budget is left only if every sequence still
prefilling got the rest of its prompt in this step (prompts are continued oldest first, each as far
as the budget goes); a page a decode token fills is named when the token is appended, and this
step computes that token; preemption happens before any append of the step, to a sequence whose
every page is computed. Every named page therefore holds K/V by the end of this step, and a step
writes all K/V of a layer before any attention of that layer reads them.
"""
from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field

from minimax_lab.engine.sequence import Sequence, Status
from minimax_lab.kvcache.blocks import BlockManager

PREEMPTION_MODES = (None, "recompute", "swap")
#: share of the pool admission keeps free when preemption is on (so a new prompt does not force a
#: preemption at the very next decode step)
WATERMARK = 0.01


@dataclass
class Plan:
    """One step's work: ``decodes`` (one token each: the newest generated token, appended to the
    block manager at ``decode_slots``; a sequence swapped back in this step is among them) and
    ``prefills`` (``(sequence, start, end)``: compute tokens ``start .. end`` of
    ``sequence.tokens``); the sequences ``preempted`` before it, and the pages it copied to
    (``swap_out_pages``) and from (``swap_in_pages``) the host."""

    decodes: list = field(default_factory=list)
    decode_slots: list = field(default_factory=list)
    prefills: list = field(default_factory=list)
    preempted: list = field(default_factory=list)
    swap_out_pages: int = 0
    swap_in_pages: int = 0

    @property
    def n_tokens(self) -> int:
        return len(self.decodes) + sum(e - s for _, s, e in self.prefills)

    def __bool__(self) -> bool:
        return bool(self.decodes or self.prefills)


class HostSwap:
    """Host copies of preempted sequences' pages: ``save`` copies pages of the KV cache (anything
    with ``read_pages(pages)`` and ``write_pages(pages, data)``) out, ``load`` copies them back
    into other pages. ``bytes_out`` / ``bytes_in`` count the traffic."""

    def __init__(self, cache):
        self.cache = cache
        self.bytes_out = self.bytes_in = 0

    def save(self, pages: list) -> list:
        data = self.cache.read_pages(pages)
        self.bytes_out += sum(t.numel() * t.element_size() for t in data)
        return data

    def load(self, data: list, pages: list, first: int = 0) -> None:
        """Copy saved pages ``first ..`` into ``pages`` (the pages before ``first`` are prefix-cache hits)."""
        if first >= len(pages):
            return
        part = [t[first:] for t in data]
        self.bytes_in += sum(t.numel() * t.element_size() for t in part)
        self.cache.write_pages(pages[first:], part)


class Scheduler:
    """See the module docstring. ``max_seq_len`` bounds prompt + ``max_tokens`` of a request;
    ``swap`` (a :class:`HostSwap`) is needed for ``preemption="swap"``."""

    def __init__(self, blocks: BlockManager, *, continuous_batching: bool, max_batch: int,
                 step_tokens: int | None, max_seq_len: int, preemption: str | None = None,
                 swap: HostSwap | None = None):
        if preemption not in PREEMPTION_MODES:
            raise ValueError(f"preemption must be one of {PREEMPTION_MODES}, got {preemption!r}")
        if preemption == "swap" and swap is None:
            raise ValueError("preemption='swap' needs a HostSwap to copy pages to")
        self.blocks = blocks
        self.page_size = blocks.page_size
        self.continuous_batching = continuous_batching
        self.max_batch = max_batch if continuous_batching else 1
        self.step_tokens = step_tokens
        self.max_seq_len = max_seq_len
        self.preemption = preemption
        self.swap = swap
        self.watermark = max(1, math.ceil(WATERMARK * blocks.num_pages)) if preemption else 0
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0

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
        if self.final_pages(seq) + self.watermark > self.blocks.num_pages:
            raise ValueError(f"request {seq.seq_id!r} needs {self.final_pages(seq)} KV pages of {self.page_size} "
                             f"tokens (+{self.watermark} kept free), the pool has {self.blocks.num_pages}; give the "
                             f"engine more kv_tokens")
        self.waiting.append(seq)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Run ``child`` beside ``parent``, sharing its pages; raises ``ValueError`` when it would
        run more than ``max_batch`` sequences, or (reserving up front) when the pool cannot also
        hold the child's future pages. With preemption the fork takes no page now (its pages are
        the parent's), so it is never refused for the pool: its later pages come as any running
        sequence's do, by preempting when the pool runs short."""
        if len(self.running) >= self.max_batch:
            raise ValueError(f"fork {child.seq_id!r} would run {len(self.running) + 1} sequences, more than "
                             f"max_batch={self.max_batch}" + ("" if self.continuous_batching else
                                                             " (one at a time without continuous batching)"))
        available = self._available()
        self.blocks.fork(parent.seq_id, child.seq_id)
        if self.preemption is None:
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

    def abort(self, seq: Sequence) -> bool:
        """Stop ``seq`` (waiting or running): it generates no more tokens. Returns True when it is
        gone now, False when it must first finish computing its prompt's full pages: with prefix
        caching those pages are named when allocated, so freeing them unwritten would let a later
        request read K/V no step wrote (the engine finishes it, without a token, once they are)."""
        seq.aborted = True
        if seq.status is Status.WAITING:
            self.waiting.remove(seq)
            seq.swapped = None
            seq.status = Status.FINISHED
            return True
        if seq.status is Status.PREFILL and self.blocks.prefix_caching:
            full_end = seq.prefill_end // self.page_size * self.page_size
            if full_end > seq.computed:
                seq.prefill_end = full_end      # the partial last page is not named: no need to compute it
                return False
        self.finish(seq)
        return True

    # ---- memory --------------------------------------------------------------------------------
    def _future_pages(self, seq: Sequence) -> int:
        """Pages ``seq`` will still take from the pool: up to its final length, plus one if its last
        page is partial and shared (after ``fork``: the first write copies it)."""
        held = self.blocks.seqs[seq.seq_id]
        return self.final_pages(seq) - len(held.pages) + self._copies_on_write(seq)

    def _copies_on_write(self, seq: Sequence) -> int:
        held = self.blocks.seqs[seq.seq_id]
        return int(bool(held.pages) and len(held.tokens) % self.page_size != 0
                   and self.blocks.refcount[held.pages[-1]] > 1)

    def _next_page(self, seq: Sequence) -> int:
        """Pages the next decode of ``seq`` takes from the pool (0 or 1)."""
        held = self.blocks.seqs[seq.seq_id]
        return 1 if len(held.tokens) % self.page_size == 0 else self._copies_on_write(seq)

    def _idle(self) -> int:
        """Pages free or evictable (cached, reference count 0, unpinned)."""
        return len(self.blocks.free_pages) + len(self.blocks.policy)

    def _available(self) -> int:
        """Pages a new request may take: free or evictable, minus those promised to running
        sequences (reserving up front) or the watermark (with preemption)."""
        if self.preemption is None:
            return self._idle() - sum(self._future_pages(s) for s in self.running)
        return self._idle() - self.watermark

    def _admission_pages(self, seq: Sequence) -> int:
        """Pages admitting ``seq`` must find: its whole life up front, or its tokens so far with preemption."""
        if self.preemption is None:
            return self.final_pages(seq)
        return math.ceil(len(self._alloc_keys(seq)) / self.page_size)

    def _alloc_keys(self, seq: Sequence) -> list:
        """What admission allocates: the prompt, or after a preemption every token the sequence
        has whose K/V exist or are recomputed (by swap: all but the newest, which the next decode computes)."""
        if not seq.output:
            return seq.keys
        keys = seq.cache_keys()
        return keys[:-1] if seq.swapped is not None else keys

    def _preempt(self, seq: Sequence, plan: Plan) -> None:
        """Take ``seq`` (decoding, every page computed) off the pool: swap its pages to the host or
        drop them, and queue it again in arrival order ahead of requests that came later."""
        if self.preemption == "swap":
            pages = self.blocks.seqs[seq.seq_id].pages
            seq.swapped = self.swap.save(pages)
            plan.swap_out_pages += len(pages)
        self.blocks.free(seq.seq_id)
        self.running.remove(seq)
        seq.status = Status.WAITING
        seq.computed = 0
        seq.preemptions += 1
        self.preemptions += 1
        plan.preempted.append(seq)
        arrivals = [s.arrival for s in self.waiting]
        self.waiting.insert(bisect.bisect_right(arrivals, seq.arrival), seq)

    def _make_room_for_decodes(self, plan: Plan) -> None:
        """Preempt the newest decoding sequences until every remaining decode's next page fits."""
        while True:
            decoding = [s for s in self.running if s.status is Status.DECODE]
            if sum(self._next_page(s) for s in decoding) <= self._idle() or not decoding:
                return
            self._preempt(max(decoding, key=lambda s: s.arrival), plan)

    def _try_admit(self, seq: Sequence, plan: Plan) -> bool:
        available = self._available()
        need = self._admission_pages(seq)
        keys = self._alloc_keys(seq)
        if need > available:   # a cached prefix may still make it fit: count it
            hit = self.blocks.lookup(keys, max_pages=(len(keys) - 1) // self.page_size)
            idle_hits = sum(1 for p in hit if self.blocks.refcount[p] == 0)
            if need - len(hit) + idle_hits > available:
                return False
        cached = self.blocks.allocate(seq.seq_id, keys)
        self.waiting.popleft()
        self.running.append(seq)
        if seq.swapped is not None:   # resume decoding: the pages the cache does not hold come from the host
            pages = self.blocks.seqs[seq.seq_id].pages
            self.swap.load(seq.swapped, pages, cached // self.page_size)
            plan.swap_in_pages += len(pages) - cached // self.page_size
            seq.swapped = None
            seq.computed = seq.prefill_end = len(keys)
            seq.status = Status.DECODE
            return True
        if not seq.output:
            seq.cached_tokens = cached
        seq.computed, seq.prefill_end = cached, len(keys)
        seq.status = Status.PREFILL
        return True

    # ---- the step ------------------------------------------------------------------------------
    def schedule(self) -> Plan:
        """The next step's :class:`Plan` (empty when there is nothing to do or nothing fits)."""
        plan = Plan()
        budget = self.step_tokens if self.step_tokens is not None else math.inf
        if self.preemption is not None:
            self._make_room_for_decodes(plan)
        for seq in self.running:             # decode: the newest token's K/V and the next logits
            if seq.status is Status.DECODE:
                plan.decode_slots.append(self.blocks.append(seq.seq_id, seq.output[-1]))
                plan.decodes.append(seq)
                budget -= 1
        for seq in self.running:             # continue prefills, oldest first
            if seq.status is Status.PREFILL and budget > 0:
                n = min(seq.remaining_prompt, budget)
                plan.prefills.append((seq, seq.computed, seq.computed + n))
                budget -= n
        # no admission in a step that had to preempt: the pool is short, and the preempted
        # sequence would come straight back in
        while self.waiting and budget > 0 and len(self.running) < self.max_batch and not plan.preempted:
            seq = self.waiting[0]
            if not self._try_admit(seq, plan):
                break
            if seq.status is Status.DECODE:      # swapped back in: it decodes in this step
                plan.decode_slots.append(self.blocks.append(seq.seq_id, seq.output[-1]))
                plan.decodes.append(seq)
                budget -= 1
            elif seq.status is Status.PREFILL:
                n = min(seq.remaining_prompt, budget)
                plan.prefills.append((seq, seq.computed, seq.computed + n))
                budget -= n
        return plan
