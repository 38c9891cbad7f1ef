"""Eviction policies for cached KV blocks, all behind one small interface.

A policy only ever sees the *evictable* blocks (cached, reference count 0) by their key (a
block's content hash). The cache tells it what happens, and asks it for a victim when full::

    policy.insert(key, t)      # a block became cached (or evictable again)
    policy.touch(key, t)       # an evictable block was hit
    policy.remove(key)         # the block stopped being evictable (pinned / in use) or was dropped
    key = policy.evict()       # choose a victim and forget it; KeyError when empty

``t`` is a logical clock (the index of the block access in a trace). Trace replay also brackets each
request with ``begin_request(conversation, now)`` and ``end_request(keys, output_tokens)`` (what a
server knows: the conversation, the time, the answer's length). Offline policies also get the whole
access sequence up front through ``plan(keys)``; online ones ignore it.

Policies:

* ``LRUPolicy`` -- least recently used, as vLLM's prefix cache does it (its free-block queue
  evicts the block freed longest ago; blocks of a request are touched in order, so a request's
  first block is older than its last).
* ``AgentPolicy`` ("agent", this workbook's design) -- frequency with aging, chains trimmed from the tail.
* ``ChainPolicy`` ("chain", this workbook's request-aware policy) -- recency in requests, deepest
  block first, a bonus per reuse, a request's new last block first.
* ``ReusePolicy`` ("reuse") -- Belady with a predicted future: next use = last use + last reuse gap.
* ``AdaptivePolicy`` ("adaptive") -- chain and reuse keep books side by side; the one whose shadow
  cache hits more lately picks each victim.
* ``ConversationPolicy`` ("conversation") -- a block is worth the chance its conversation comes back
  and reuses it, learned online from conversation ids, turn counts, idle time, sizes and position.
* ``LFUPolicy``, ``S3FIFOPolicy``, ``ARCPolicy`` -- the classic frequency, FIFO-with-promotion and
  self-tuning recency/frequency policies, for comparison (``gap_table`` in ``kvcache.policy_gap``).
* ``BeladyPolicy`` -- the offline optimum for a single cache (fewest block misses): evict the
  block whose next use lies farthest in the future (Belady 1966, "A study of replacement
  algorithms for a virtual storage computer", IBM Systems Journal 5(2)). It needs the future, so
  it is a reference to report against, not a policy to deploy.
"""
from __future__ import annotations

import heapq
import math
import random
from collections import OrderedDict

from minimax_lab.kvcache.turn_stats import TurnStats, request_class


class EvictionPolicy:
    """Interface; see the module docstring. Subclasses keep their own bookkeeping."""

    name = "base"

    def plan(self, keys) -> None:  # offline policies override
        """Receive the future access sequence (iterable of keys, in access order)."""

    def begin_request(self, conversation=None, now: float | None = None) -> None:  # request-aware policies override
        """A request starts: its blocks follow, root first (trace replay calls it; a ``BlockManager``
        does not). ``conversation`` names the conversation it belongs to (any hashable; None when
        unknown) and ``now`` is its arrival time in seconds: what a serving system knows."""

    def end_request(self, keys, output_tokens: int = 0) -> None:  # request-aware policies override
        """The request whose blocks are ``keys`` (root first) has been served; its answer was
        ``output_tokens`` long."""

    def insert(self, key, t: int, parent=None) -> None:
        raise NotImplementedError

    def touch(self, key, t: int) -> None:
        raise NotImplementedError

    def remove(self, key) -> None:
        raise NotImplementedError

    def evict(self):
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def __contains__(self, key) -> bool:
        raise NotImplementedError


class LRUPolicy(EvictionPolicy):
    """Least recently used: an ordered dict, oldest first (each operation is one dict operation)."""

    name = "lru"

    def __init__(self):
        self._od: OrderedDict = OrderedDict()

    def insert(self, key, t: int, parent=None) -> None:
        self._od[key] = t
        self._od.move_to_end(key)

    def touch(self, key, t: int) -> None:
        self._od.move_to_end(key)

    def remove(self, key) -> None:
        self._od.pop(key, None)

    def evict(self):
        if not self._od:
            raise KeyError("nothing to evict")
        return self._od.popitem(last=False)[0]

    def __len__(self) -> int:
        return len(self._od)

    def __contains__(self, key) -> bool:
        return key in self._od


class _HeapPolicy(EvictionPolicy):
    """Shared machinery: a min-heap of ``(priority, key)`` with lazy deletion (``_cur`` holds each
    key's live priority; stale heap entries are skipped when popped, so the heap holds one entry
    per ``insert``/``touch`` not yet popped)."""

    def __init__(self):
        self._heap: list = []
        self._cur: dict = {}

    def _set(self, key, prio: tuple) -> None:
        self._cur[key] = prio
        heapq.heappush(self._heap, (prio, key))

    def _evicted(self, prio: tuple) -> None:
        """Hook: called with the victim's priority."""

    def remove(self, key) -> None:
        self._cur.pop(key, None)

    def evict(self):
        while self._heap:
            prio, key = heapq.heappop(self._heap)
            if self._cur.get(key) == prio:
                del self._cur[key]
                self._evicted(prio)
                return key
        raise KeyError("nothing to evict")

    def __len__(self) -> int:
        return len(self._cur)

    def __contains__(self, key) -> bool:
        return key in self._cur


class AgentPolicy(_HeapPolicy):
    """Agent-aware eviction (this workbook's design): *keep what gets reused, trim chains from the tail*.

    Two observations about agent and multi-turn traffic:

    1. Most blocks are seen once (a fresh document, a one-off tool output) while a few are reused
       many times (system prompts, the uploaded codebase, the growing conversation). Under LRU a
       burst of one-off blocks flushes the reused ones. So the priority of a block counts its
       accesses, with *dynamic aging* so that old popularity fades: ``priority = L + accesses``,
       where ``L`` is the priority of the last victim (LFU with dynamic aging, Arlitt et al. 2000,
       "Evaluating content management techniques for Web proxy caches"; the GreedyDual idea of
       Cao & Irani 1997). A block that was popular long ago sinks below fresh blocks once ``L``
       has climbed past it.
    2. A cached block only helps if every block before it in its chain is cached too (a hit is a
       *prefix*). Blocks of a request are touched root first, so among equal priorities the block
       touched *last* (the deepest) goes first: a chain is trimmed from its tail, not cut at its root.
       (In a prefix tree a parent is accessed at least as often as each child, so counts already
       rank roots above leaves.)

    Priority ``(L + accesses, -t)`` in a heap with lazy deletion.
    """

    name = "agent"

    def __init__(self):
        super().__init__()
        self._count: dict = {}
        self._L = 0

    def _push(self, key, t: int) -> None:
        c = self._count.get(key, 0) + 1
        self._count[key] = c
        self._set(key, (self._L + c, -t))

    def _evicted(self, prio: tuple) -> None:
        self._L = prio[0]

    def insert(self, key, t: int, parent=None) -> None:
        self._push(key, t)

    def touch(self, key, t: int) -> None:
        self._push(key, t)


class BeladyPolicy(_HeapPolicy):
    """Offline optimum: evict the block whose next access is farthest away (never = infinity).

    ``plan(keys)`` must be given the exact sequence of accesses the cache will see (one entry per
    ``insert``/``touch``, in order); one access more raises ``RuntimeError``. Priority
    ``-next_use`` in a heap with lazy deletion. Optimal for block hits; a prefix hit also needs
    every earlier block, so on traces of several blocks per request it is a strong reference,
    not a proven bound.
    """

    name = "belady"

    def __init__(self):
        super().__init__()
        self._next: list[int] = []
        self._i = 0

    def plan(self, keys) -> None:
        keys = list(keys)
        inf = len(keys) + 1
        nxt = [inf] * len(keys)
        last: dict = {}
        for i in range(len(keys) - 1, -1, -1):
            nxt[i] = last.get(keys[i], inf)
            last[keys[i]] = i
        self._next, self._i = nxt, 0

    def _access(self, key) -> None:
        if self._i >= len(self._next):
            raise RuntimeError("BeladyPolicy saw more accesses than were planned")
        self._set(key, (-self._next[self._i],))    # farthest next use = smallest priority
        self._i += 1

    def insert(self, key, t: int, parent=None) -> None:
        self._access(key)

    def touch(self, key, t: int) -> None:
        self._access(key)


class LFUPolicy(_HeapPolicy):
    """Least frequently used: priority ``(accesses, t)`` -- the fewest accesses go first, the
    least recent among equals. No aging: a block once popular stays."""

    name = "lfu"

    def __init__(self):
        super().__init__()
        self._count: dict = {}

    def insert(self, key, t: int, parent=None) -> None:
        self._count[key] = self._count.get(key, 0) + 1
        self._set(key, (self._count[key], t))

    touch = insert


class S3FIFOPolicy(EvictionPolicy):
    """S3-FIFO (Yang et al., SOSP'23, "FIFO queues are all you need for cache eviction"): a small
    FIFO (10% of what the cache holds) admits new blocks; one touched while there moves to the main
    FIFO when it reaches the head, the others leave (and are remembered in a ghost FIFO, so a quick
    return enters main directly). Main is a FIFO with re-insertion of blocks touched since (a
    frequency of up to 3, decremented per pass)."""

    name = "s3fifo"

    def __init__(self, small_fraction: float = 0.1):
        self.small: OrderedDict = OrderedDict()
        self.main: OrderedDict = OrderedDict()
        self.ghost: OrderedDict = OrderedDict()
        self.freq: dict = {}
        self.frac = small_fraction

    def insert(self, key, t: int, parent=None) -> None:
        self.freq[key] = 0
        if key in self.ghost:
            del self.ghost[key]
            self.main[key] = None
        else:
            self.small[key] = None

    def touch(self, key, t: int) -> None:
        self.freq[key] = min(3, self.freq.get(key, 0) + 1)

    def remove(self, key) -> None:
        self.small.pop(key, None)
        self.main.pop(key, None)
        self.freq.pop(key, None)

    def evict(self):
        total = len(self.small) + len(self.main)
        if not total:
            raise KeyError("nothing to evict")
        while True:
            if self.small and (len(self.small) >= self.frac * total or not self.main):
                key, _ = self.small.popitem(last=False)
                if self.freq.get(key, 0) > 0:
                    self.freq[key] = 0
                    self.main[key] = None
                    continue
                self.freq.pop(key, None)
                self.ghost[key] = None
                while len(self.ghost) > max(16, total):
                    self.ghost.popitem(last=False)
                return key
            key, _ = self.main.popitem(last=False)
            if self.freq.get(key, 0) > 0:
                self.freq[key] -= 1
                self.main[key] = None
                continue
            self.freq.pop(key, None)
            return key

    def __len__(self) -> int:
        return len(self.small) + len(self.main)

    def __contains__(self, key) -> bool:
        return key in self.small or key in self.main


class ARCPolicy(EvictionPolicy):
    """ARC (Megiddo & Modha, FAST'03, "ARC: A Self-Tuning, Low Overhead Replacement Cache"): a
    recency list T1 (seen once) and a frequency list T2 (seen again), each with a ghost list of
    what it evicted (B1, B2). A miss that hits B1 grows T1's target ``p``, one that hits B2
    shrinks it; ``evict`` takes T1's LRU block while T1 is over ``p``, else T2's."""

    name = "arc"

    def __init__(self):
        self.t1: OrderedDict = OrderedDict()
        self.t2: OrderedDict = OrderedDict()
        self.b1: OrderedDict = OrderedDict()
        self.b2: OrderedDict = OrderedDict()
        self.p = 0.0

    def insert(self, key, t: int, parent=None) -> None:
        c = max(1, len(self))
        if key in self.b1:
            self.p = min(float(c), self.p + max(1.0, len(self.b2) / max(1, len(self.b1))))
            del self.b1[key]
            self.t2[key] = None
        elif key in self.b2:
            self.p = max(0.0, self.p - max(1.0, len(self.b1) / max(1, len(self.b2))))
            del self.b2[key]
            self.t2[key] = None
        else:
            self.t1[key] = None

    def touch(self, key, t: int) -> None:
        if key in self.t1:
            del self.t1[key]
        self.t2[key] = None
        self.t2.move_to_end(key)

    def remove(self, key) -> None:
        self.t1.pop(key, None)
        self.t2.pop(key, None)

    def evict(self):
        if not self.t1 and not self.t2:
            raise KeyError("nothing to evict")
        if self.t1 and (len(self.t1) > self.p or not self.t2):
            key, _ = self.t1.popitem(last=False)
            self.b1[key] = None
        else:
            key, _ = self.t2.popitem(last=False)
            self.b2[key] = None
        c = len(self) + 1
        while len(self.b1) > c:
            self.b1.popitem(last=False)
        while len(self.b2) > c:
            self.b2.popitem(last=False)
        return key

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def __contains__(self, key) -> bool:
        return key in self.t1 or key in self.t2


class ChainPolicy(_HeapPolicy):
    """This workbook's request-aware policy for prefix caches: *whole requests age, chains are cut
    from the tail, reuse buys time, a request's last block goes first.*

    * Recency is counted in **requests**, not block accesses: every block a request touches gets
      the request's number as its stamp, so a request's root is no older than its leaf (under
      LRU the root, touched first, is evicted first -- and with it every hit below it).
    * Among equal stamps the **deepest** block goes first, so a prefix larger than the cache
      keeps its root part (a scan through a chain leaves the chain's start in place).
    * Each access adds ``reuse_weight`` requests (100) to a block's stamp: a block used ``c`` times
      outlives one used once by ``(c - 1) * reuse_weight`` requests.
    * A request's **last block**, if new, is demoted to go first: it is usually partial and its
      name never recurs (a longer prompt names its tokens differently).

    Priority ``(stamp + reuse_weight * accesses, -depth)`` in a heap with lazy deletion. Trace
    replay calls ``begin_request``/``end_request``; inside a ``BlockManager`` (no request hooks)
    the stamp is the manager's clock and depth is 0, so it orders like LRU with a reuse bonus.
    """

    name = "chain"

    def __init__(self, reuse_weight: float = 100.0):
        super().__init__()
        self.reuse_weight = float(reuse_weight)
        self._count: dict = {}
        self._req: int | None = None
        self._depth = 0

    def begin_request(self, conversation=None, now=None) -> None:
        self._req = (self._req or 0) + 1
        self._depth = 0

    def _push(self, key, t: int) -> None:
        c = self._count.get(key, 0) + 1
        self._count[key] = c
        stamp = t if self._req is None else self._req
        self._set(key, (stamp + self.reuse_weight * c, -self._depth))
        self._depth += self._req is not None

    def insert(self, key, t: int, parent=None) -> None:
        self._push(key, t)

    def touch(self, key, t: int) -> None:
        self._push(key, t)

    def end_request(self, keys, output_tokens: int = 0) -> None:
        last = keys[-1] if len(keys) else None
        if last in self._cur and self._count.get(last, 0) <= 1:
            self._set(last, (float("-inf"), self._cur[last][1]))


class ReusePolicy(EvictionPolicy):
    """Evict the block predicted to be used farthest in the future -- Belady with a guess for the
    future: a block's next use is predicted at its last use plus its last reuse gap (in requests);
    a block seen once, at its last use plus ``first_factor`` times the mean gap seen so far. A
    block whose predicted use is overdue by more than ``slack`` of its gap was mispredicted: it
    goes first. Among equal predictions the deepest block goes first; a request's new last block
    goes before everything. Two heaps with lazy deletion (farthest and overdue)."""

    name = "reuse"

    def __init__(self, first_factor: float = 2.0, slack: float = 1.0, alpha: float = 0.05):
        self.first_factor, self.slack, self.alpha = float(first_factor), float(slack), float(alpha)
        self._req = self._depth = 0
        self._last: dict = {}
        self._gap: dict = {}
        self._cur: dict = {}
        self._far: list = []
        self._near: list = []
        self._mean_gap = 50.0

    def begin_request(self, conversation=None, now=None) -> None:
        self._req += 1
        self._depth = 0

    def _push(self, key, t: int) -> None:
        if key in self._last:
            g = self._req - self._last[key]
            if g > 0:
                self._gap[key] = g
                self._mean_gap += self.alpha * (g - self._mean_gap)
        self._last[key] = self._req
        g = self._gap.get(key)
        pred = self._req + (g if g is not None else self.first_factor * self._mean_gap)
        self._enter(key, pred, self._depth)
        self._depth += 1

    def _enter(self, key, pred: float, depth: int) -> None:
        self._cur[key] = (pred, depth)
        heapq.heappush(self._far, (-pred, -depth, key))
        heapq.heappush(self._near, (pred, -depth, key))

    insert = lambda self, key, t, parent=None: self._push(key, t)  # noqa: E731
    touch = lambda self, key, t: self._push(key, t)  # noqa: E731

    def end_request(self, keys, output_tokens: int = 0) -> None:
        last = keys[-1] if len(keys) else None
        if last in self._cur and last not in self._gap:
            self._enter(last, float("inf"), self._cur[last][1])

    def remove(self, key) -> None:
        self._cur.pop(key, None)

    def _top(self, heap: list, sign: int):
        while heap:
            p, d, k = heap[0]
            e = self._cur.get(k)
            if e is not None and e == (sign * p, -d):
                return k
            heapq.heappop(heap)
        return None

    def evict(self):
        k = self._top(self._near, 1)
        if k is None:
            raise KeyError("nothing to evict")
        pred = self._cur[k][0]
        if pred + self.slack * max(1.0, self._gap.get(k, self._mean_gap)) >= self._req:
            k = self._top(self._far, -1)          # nothing overdue: the farthest predicted use
        del self._cur[k]
        return k

    def __len__(self) -> int:
        return len(self._cur)

    def __contains__(self, key) -> bool:
        return key in self._cur


class _Shadow:
    """A cache of ``cap`` block ids run by ``policy`` on the request stream: how many prefix hits
    that policy would have had."""

    def __init__(self, policy: EvictionPolicy, cap: int):
        self.policy, self.cap, self.cached, self.t = policy, cap, set(), 0

    def serve(self, keys, conversation=None, now=None, output_tokens: int = 0) -> int:
        hit = 0
        for k in keys:
            if k not in self.cached:
                break
            hit += 1
        self.policy.begin_request(conversation, now)
        for k in keys:
            if k in self.cached:
                self.policy.touch(k, self.t)
            else:
                self.cached.add(k)
                self.policy.insert(k, self.t)
                if len(self.cached) > self.cap:
                    self.cached.discard(self.policy.evict())
            self.t += 1
        self.policy.end_request(keys, output_tokens)
        return hit


class AdaptivePolicy(EvictionPolicy):
    """This workbook's adaptive policy: ``ChainPolicy`` and ``ReusePolicy`` both keep books on the
    cached blocks, and the one whose *shadow cache* -- the same capacity, fed the same requests,
    run by that policy alone -- has had more prefix hits lately (hits decayed by ``decay`` per
    request) chooses each victim. The capacity is taken at the first eviction (a replay evicts
    once it holds one block more than it may); shadows start there. Needs the request hooks of
    trace replay to adapt; without them it behaves as ``ChainPolicy``."""

    name = "adaptive"

    def __init__(self, decay: float = 0.995):
        self.experts = [ChainPolicy(), ReusePolicy()]
        self.decay = float(decay)
        self.scores = [0.0, 0.0]
        self.shadows: list | None = None
        self.leader = 0
        self._request = (None, None)

    def begin_request(self, conversation=None, now=None) -> None:
        for e in self.experts:
            e.begin_request(conversation, now)
        self._request = (conversation, now)

    def end_request(self, keys, output_tokens: int = 0) -> None:
        for e in self.experts:
            e.end_request(keys, output_tokens)
        if self.shadows is not None:
            for i, sh in enumerate(self.shadows):
                self.scores[i] = self.scores[i] * self.decay + sh.serve(keys, *self._request, output_tokens)
            self.leader = max(range(len(self.scores)), key=lambda i: (self.scores[i], -i))

    def insert(self, key, t: int, parent=None) -> None:
        for e in self.experts:
            e.insert(key, t)

    def touch(self, key, t: int) -> None:
        for e in self.experts:
            e.touch(key, t)

    def remove(self, key) -> None:
        for e in self.experts:
            e.remove(key)

    def evict(self):
        if self.shadows is None and len(self) > 1:
            self.shadows = [_Shadow(ChainPolicy(), len(self) - 1), _Shadow(ReusePolicy(), len(self) - 1)]
        key = self.experts[self.leader].evict()
        for i, e in enumerate(self.experts):
            if i != self.leader:
                e.remove(key)
        return key

    def __len__(self) -> int:
        return len(self.experts[0])

    def __contains__(self, key) -> bool:
        return key in self.experts[0]


class _Conversation:
    """What the conversation policy knows of one conversation: its turns, when the last one came,
    the blocks of its last request, and the evictable blocks it owns (deepest first, lazily)."""

    __slots__ = ("turns", "last_s", "last_keys", "owned", "heap", "slot", "cls", "q")

    def __init__(self):
        self.turns, self.last_s, self.last_keys = 0, 0.0, ()
        self.cls, self.q = None, 0.5
        self.owned: dict = {}          # key -> depth in the request that last touched it
        self.heap: list = []           # (-depth, key), stale entries skipped
        self.slot = -1                 # index in the policy's list of conversations owning blocks


class ConversationPolicy(EvictionPolicy):
    """This workbook's conversation-aware policy: *keep the blocks whose conversation is likely to
    come back soon, and within a conversation cut from the tail.*

    Online, from what a serving system knows when it evicts -- conversation ids, turn counts, the
    time since each conversation's last turn, a block's position in its request, its size and its
    answer's length, and how many conversations used a block -- it estimates, with
    ``turn_stats.TurnStats`` learned from the turns seen so far:

    * ``q`` -- that a conversation has another turn: the share of conversations of its class (turn
      count, request size, answer length) that had one; or ``continuation(conversation, turns,
      blocks, output_tokens)`` when given (a learned model, ``kvcache.reuse_model``);
    * ``p = q S / (q S + 1 - q)`` -- that it still comes back after being idle ``age`` seconds
      (``S``: the share of think times longer than ``age``; Bayes);
    * ``kept(j)`` -- that its next turn reuses the block ``j`` blocks before its last request's end
      (the last, partial block: almost never).

    A block is worth ``p * kept(j)``; a block several conversations used (a system prompt, a shared
    document or codebase) is worth at least ``1 - 1/n`` for ``n`` conversations, decaying once it
    goes unused for three times its usual interval. Reuse probability decaying predictably with
    time per request category is what Wang et al. measured in production ("KVCache Cache in the
    Wild", 2025, arXiv:2506.02634); LPC (Yang et al., NeurIPS'25) learns a continuation guess.
    ``evict`` samples ``sample`` conversations that own evictable blocks when a request starts
    evicting, values each one's deepest block, and evicts the least valuable, valuing that
    conversation's next block again (values change with time, so a fresh sample per request
    replaces one global order); the conversation whose request is being served is left alone
    (its blocks are in use) while others own blocks.

    Needs the request hooks of trace replay (``begin_request(conversation, now)``); without them
    it evicts the least recently used block.
    """

    name = "conversation"

    def __init__(self, sample: int = 64, seed: int = 0, stats=None, continuation=None):
        self.stats = stats if stats is not None else TurnStats()
        self.continuation = continuation
        self.sample = int(sample)
        self._rng = random.Random(seed)
        self._convs: dict = {}
        self._active: list = []        # conversations owning evictable blocks
        self._owner: dict = {}         # key -> conversation id
        self._uses: dict = {}          # key -> [conversations that used it, first, last time, last conversation]
        self._lru: OrderedDict = OrderedDict()
        self._conv = None
        self._now: float | None = None
        self._depth = 0
        self._cands: list = []         # (value, tie, conversation) sampled for the request being served
        self._heap_now = None
        self._tie = 0

    # ---- request hooks ---------------------------------------------------------------------
    def begin_request(self, conversation=None, now=None) -> None:
        self._conv, self._now, self._depth = conversation, None if now is None else float(now), 0
        c = self._convs.get(conversation)
        if c is None:
            c = self._convs[conversation] = _Conversation()
        c.turns += 1
        self.stats.new_turn(c.turns, c.cls)

    def end_request(self, keys, output_tokens: int = 0) -> None:
        c = self._convs.get(self._conv)
        if c is None:
            return
        keys = tuple(keys)
        if c.turns > 1 and self._now is not None:
            shared = 0
            for a, b in zip(c.last_keys, keys):
                if a != b:
                    break
                shared += 1
            self.stats.returned(self._now - c.last_s, len(c.last_keys) - shared)
        c.last_keys = keys
        c.cls = request_class(c.turns, len(keys), output_tokens)
        if self.continuation is not None:
            c.q = float(self.continuation(self._conv, c.turns, len(keys), output_tokens))
        self.stats.ended_turn(c.cls)
        if self._now is not None:
            c.last_s = self._now

    # ---- the cache's events ----------------------------------------------------------------
    def _own(self, key) -> None:
        old = self._owner.get(key)
        if old is not None and old != self._conv or key not in self._lru:
            self._disown(key)
        c = self._convs.get(self._conv)
        if c is None:
            c = self._convs[self._conv] = _Conversation()
        self._owner[key] = self._conv
        c.owned[key] = self._depth
        heapq.heappush(c.heap, (-self._depth, key))
        if c.slot < 0:
            c.slot = len(self._active)
            self._active.append(self._conv)

    def _disown(self, key) -> None:
        conv = self._owner.pop(key, None)
        c = self._convs.get(conv)
        if c is None or key not in c.owned:
            return
        del c.owned[key]
        if not c.owned:
            self._drop_active(c)

    def _drop_active(self, c: _Conversation) -> None:
        i = c.slot
        last = self._active.pop()
        if i < len(self._active):
            self._active[i] = last
            self._convs[last].slot = i
        c.slot, c.heap = -1, []

    def _access(self, key, t: int) -> None:
        use = self._uses.get(key)
        if use is None:
            self._uses[key] = [1, self._now, self._now, self._conv]
        elif use[3] != self._conv:              # another conversation reuses it: a shared prefix
            use[0] += 1
            use[2], use[3] = self._now, self._conv
        else:
            use[2] = self._now
        self._own(key)
        self._lru[key] = t
        self._lru.move_to_end(key)
        self._depth += 1

    insert = lambda self, key, t, parent=None: self._access(key, t)  # noqa: E731
    touch = lambda self, key, t: self._access(key, t)  # noqa: E731

    def remove(self, key) -> None:
        self._disown(key)
        self._lru.pop(key, None)

    # ---- choosing the victim ---------------------------------------------------------------
    def _deepest(self, c: _Conversation):
        while c.heap:
            d, key = c.heap[0]
            if c.owned.get(key) == -d:
                return key, -d
            heapq.heappop(c.heap)
        return None, 0

    def value(self, conv, key, depth: int) -> float:
        """Expected hits per second of keeping ``key`` (the class docstring's ``p * kept / r``, or
        its reuse rate if higher)."""
        c = self._convs[conv]
        now = self._now if self._now is not None else c.last_s
        age = max(0.0, now - c.last_s)
        st = self.stats
        if self.continuation is not None:
            q = c.q
        else:
            q = st.class_continuation(c.cls) if c.cls is not None else st.continuation(c.turns)
        qs = q * st.survival(age)
        p = qs / (qs + 1.0 - q) if qs > 0 else 0.0
        v = p * st.kept(len(c.last_keys) - 1 - depth)
        use = self._uses.get(key)
        if use is not None and use[0] > 1 and use[1] is not None:
            shared, first, last = use[0], use[1], use[2]
            between = max(last - first, 1.0) / (shared - 1)     # mean time between conversations using it
            v = max(v, (1.0 - 1.0 / shared) * math.exp(-max(now - last, 0.0) / (3.0 * between)))
        return v

    def _candidate(self, conv):
        """``(value of its deepest block, tie-break, conversation)`` or None when it owns nothing."""
        key, depth = self._deepest(self._convs[conv])
        if key is None:
            return None
        self._tie += 1
        return (self.value(conv, key, depth), self._tie, conv)

    def evict(self):
        if not self._lru:
            raise KeyError("nothing to evict")
        if self._now is None:
            key = next(iter(self._lru))
            self.remove(key)
            return key
        if self._heap_now != self._now or not self._cands:     # a new request: a fresh sample
            pool = [c for c in self._active if c != self._conv] or list(self._active)
            picks = pool if len(pool) <= self.sample else self._rng.sample(pool, self.sample)
            self._cands = [x for x in map(self._candidate, picks) if x is not None]
            heapq.heapify(self._cands)
            self._heap_now = self._now
        while self._cands:
            _, _, conv = heapq.heappop(self._cands)
            key, _ = self._deepest(self._convs[conv])
            if key is None:
                continue
            self.remove(key)
            nxt = self._candidate(conv)              # its next block, valued again
            if nxt is not None:
                heapq.heappush(self._cands, nxt)
            return key
        key = next(iter(self._lru))
        self.remove(key)
        return key

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, key) -> bool:
        return key in self._lru


POLICIES = {"lru": LRUPolicy, "conversation": ConversationPolicy,  "chain": ChainPolicy, "reuse": ReusePolicy, "adaptive": AdaptivePolicy, "agent": AgentPolicy, "belady": BeladyPolicy, "lfu": LFUPolicy,
            "s3fifo": S3FIFOPolicy, "arc": ARCPolicy}


def make_policy(policy) -> EvictionPolicy:
    """A policy instance from a name in ``POLICIES`` or an instance (returned as is)."""
    if isinstance(policy, EvictionPolicy):
        return policy
    if isinstance(policy, str) and policy in POLICIES:
        return POLICIES[policy]()
    raise ValueError(f"policy must be one of {sorted(POLICIES)} or an EvictionPolicy, got {policy!r}")
