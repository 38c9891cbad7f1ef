"""Eviction policies for cached KV blocks, all behind one small interface.

A policy only ever sees the *evictable* blocks (cached, reference count 0) by their key (a
block's content hash). The cache tells it what happens, and asks it for a victim when full::

    policy.insert(key, t)      # a block became cached (or evictable again)
    policy.touch(key, t)       # an evictable block was hit
    policy.remove(key)         # the block stopped being evictable (pinned / in use) or was dropped
    key = policy.evict()       # choose a victim and forget it; KeyError when empty

``t`` is a logical clock (the index of the block access in a trace). Offline policies also get
the whole access sequence up front through ``plan(keys)``; online ones ignore it.

Policies:

* ``LRUPolicy`` -- least recently used, as vLLM's prefix cache does it (its free-block queue
  evicts the block freed longest ago; blocks of a request are touched in order, so a request's
  first block is older than its last).
* ``AgentPolicy`` ("agent", this workbook's design) -- frequency with aging, chains trimmed from the tail.
* ``BeladyPolicy`` -- the offline optimum for a single cache (fewest block misses): evict the
  block whose next use lies farthest in the future (Belady 1966, "A study of replacement
  algorithms for a virtual storage computer", IBM Systems Journal 5(2)). It needs the future, so
  it is a reference to report against, not a policy to deploy.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict


class EvictionPolicy:
    """Interface; see the module docstring. Subclasses keep their own bookkeeping."""

    name = "base"

    def plan(self, keys) -> None:  # offline policies override
        """Receive the future access sequence (iterable of keys, in access order)."""

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


POLICIES = {"lru": LRUPolicy, "agent": AgentPolicy, "belady": BeladyPolicy}


def make_policy(policy) -> EvictionPolicy:
    """A policy instance from a name in ``POLICIES`` or an instance (returned as is)."""
    if isinstance(policy, EvictionPolicy):
        return policy
    if isinstance(policy, str) and policy in POLICIES:
        return POLICIES[policy]()
    raise ValueError(f"policy must be one of {sorted(POLICIES)} or an EvictionPolicy, got {policy!r}")
