"""Exercises of chapter 06 (A paged KV cache for agents): find a token in the page pool, find the
cached prefix of a new request by its page names, and write an eviction policy.

* 06.1 ``page_and_offset`` -- token position -> (page id, offset) through a block table.
* 06.2 ``cached_prefix_pages`` -- which leading pages of a new request are already cached, by
  their chained names (``page_hash``).
* 06.3 ``sliding_window_paged_decode`` -- a paged-decode Triton kernel whose query sees only the
  last ``window`` tokens, checked against an fp64 reference on the kernel device; the learner's
  kernel must do the work.
* 06.4 ``MyPolicy`` -- an eviction policy, replayed with ``replay_trace`` on Mooncake's trace and
  two generated workloads. It passes when it is valid (it only ever evicts a block it holds, also
  inside a ``BlockManager``) and its mean hit ratio on each trace is at least FIFO's; the checker
  prints how it compares with FIFO, LRU and Belady. The package's own policies may not do the work
  (inherit ``EvictionPolicy``, not one of them).
"""
from __future__ import annotations

import contextlib
import functools
import random
import statistics

import torch

from minimax_lab import measure, runtime
from minimax_lab.exercises import exercise, fresh_rng
from minimax_lab.kvcache import eviction
from minimax_lab.kvcache.blocks import BlockManager, page_hash
from minimax_lab.kvcache.eviction import EvictionPolicy
from minimax_lab.paged_kv.layout import gather_sequence
from minimax_lab.kvcache.trace import find_trace, read_trace, replay_trace
from minimax_lab.kvcache.workloads import agent_workload, chat_workload

# --------------------------------------------------------------------------- 06.1 the page lookup


def page_and_offset(block_table: torch.Tensor, positions: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's block table (int32 [max_pages], its pages in order) and token positions
    (int64 [n]): return (page_ids, offsets), both int64 [n], such that the K/V of token
    positions[i] sits in slot offsets[i] of page page_ids[i] of the pool."""
    raise NotImplementedError  # your code here


@exercise("06.1", "the page lookup", "Map token positions to (page id, offset) through a block table.",
          page_and_offset)
def _check_page_and_offset(fn) -> list[str]:
    problems = []
    rng = fresh_rng()
    for page_size in (1, 3, 16, 5):
        length = rng.randint(page_size + 1, 12 * page_size)
        n_pages = -(-length // page_size)
        pool_pages = n_pages + rng.randint(2, 6)
        pages = rng.sample(range(pool_pages), n_pages)               # shuffled, not contiguous
        table = torch.tensor(pages + [-1] * rng.randint(0, 3), dtype=torch.int32)
        # a pool whose slots hold the position of the token stored there (-1: not this sequence's)
        pool = torch.full((pool_pages, page_size), -1, dtype=torch.int64)
        for t in range(length):
            pool[pages[t // page_size], t % page_size] = t
        positions = torch.tensor(rng.sample(range(length), min(length, 20)) + [length - 1, 0], dtype=torch.int64)
        got = fn(table.clone(), positions.clone(), page_size)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            return [f"expected a pair (page_ids, offsets), got {type(got).__name__}"]
        page_ids, offsets = (torch.as_tensor(x) for x in got)
        if page_ids.shape != positions.shape or offsets.shape != positions.shape:
            problems.append(f"page size {page_size}: expected two tensors of shape {tuple(positions.shape)}, "
                            f"got {tuple(page_ids.shape)} and {tuple(offsets.shape)}")
            continue
        page_ids, offsets = page_ids.long(), offsets.long()
        in_pool = (page_ids >= 0) & (page_ids < pool_pages) & (offsets >= 0) & (offsets < page_size)
        found = torch.full_like(positions, -1)
        found[in_pool] = pool[page_ids[in_pool], offsets[in_pool]]
        wrong = (found != positions).nonzero().flatten().tolist()
        if wrong:
            i = wrong[0]
            t = int(positions[i])
            problems.append(f"page size {page_size}, block table {pages}: token {t} is in page "
                            f"{pages[t // page_size]} at offset {t % page_size}, got page {int(page_ids[i])} "
                            f"offset {int(offsets[i])} ({len(wrong)} of {len(positions)} positions wrong)")
    return problems


# --------------------------------------------------------------------------- 06.2 prefix sharing


def cached_prefix_pages(tokens: list[int], page_size: int, cached: dict) -> list[int]:
    """`cached` maps the name of every cached full page to the id of the page holding it. A page's
    name is page_hash(name of the page before it (None for the first page), its page_size tokens).
    Return the page ids of the longest run of full pages at the start of `tokens` whose names are
    in `cached`, in order (a partial last page never counts)."""
    raise NotImplementedError  # your code here


def _names(tokens, page_size):
    names, parent = [], None
    for i in range(len(tokens) // page_size):
        parent = page_hash(parent, tokens[i * page_size:(i + 1) * page_size])
        names.append(parent)
    return names


@exercise("06.2", "prefix sharing by page names",
          "Find the pages of a new request that are already cached, by their chained names.", cached_prefix_pages,
          answers=(_names,))
def _check_cached_prefix_pages(fn) -> list[str]:
    problems = []
    rng = fresh_rng()
    for page_size in (4, 3):
        words = lambda n: [rng.randrange(1000, 2000) for _ in range(n)]  # noqa: E731
        system = words(3 * page_size)                                     # a shared system prompt
        cached, next_id = {}, 0

        def cache(tokens):
            nonlocal next_id
            for name in _names(tokens, page_size):
                if name not in cached:
                    cached[name] = next_id = next_id + rng.randint(1, 3)
        seen = system + words(2 * page_size + 1)                         # 5 full pages + 1 token
        cache(seen)                                                       # an earlier request
        cache(words(4 * page_size))                                       # an unrelated one
        # a request whose 4th page was evicted while its 5th is still cached: the hit stops at page 3
        cut = system + words(2 * page_size)
        cut_names = _names(cut, page_size)
        cached[cut_names[4]] = next_id = next_id + 1
        # a name for the partial tail of `seen`: only full pages have names, so it must never match
        cached[page_hash(_names(seen, page_size)[-1], seen[5 * page_size:])] = 999
        cases = {
            "shares the system prompt and one more page": seen[:4 * page_size] + words(page_size + 2),
            "the same request again (its partial last page has no name)": list(seen),
            "shares everything but the last page": seen + words(page_size - 1),
            "a new first page (so every later name differs)": words(page_size) + seen[page_size:],
            "its 4th page was evicted, its 5th is still cached": cut + words(2),
            "shorter than one page": seen[:page_size - 1],
        }
        for what, tokens in cases.items():
            want = []
            for name in _names(tokens, page_size):
                if name not in cached:
                    break
                want.append(cached[name])
            got = fn(list(tokens), page_size, dict(cached))
            if list(got) != want:
                problems.append(f"page size {page_size}, {what} ({len(tokens)} tokens): expected pages {want}, "
                                f"got {list(got)}")
    return problems


# --------------------------------------------------------------------------- 06.4 an eviction policy


class MyPolicy(EvictionPolicy):
    """Your eviction policy. The cache calls insert(key, t) when a block becomes evictable,
    touch(key, t) when an evictable block is hit, remove(key) when a block stops being evictable,
    and evict() when it is full: evict forgets one block the policy holds and returns its key.
    t counts block accesses (a request touches its blocks in order, first block first)."""

    name = "mine"

    def __init__(self):
        pass  # your state here

    def insert(self, key, t, parent=None):
        raise NotImplementedError  # your code here

    def touch(self, key, t):
        raise NotImplementedError  # your code here

    def remove(self, key):
        raise NotImplementedError  # your code here

    def evict(self):
        raise NotImplementedError  # your code here


class FIFOPolicy(EvictionPolicy):
    """The bar of exercise 06.4: evict the block cached longest ago, whatever its hits."""

    name = "fifo"

    def __init__(self):
        self._order: dict = {}

    def insert(self, key, t, parent=None):
        self._order[key] = t

    def touch(self, key, t):
        pass

    def remove(self, key):
        self._order.pop(key, None)

    def evict(self):
        key = next(iter(self._order))
        del self._order[key]
        return key

    def __len__(self):
        return len(self._order)

    def __contains__(self, key):
        return key in self._order


class _InvalidPolicy(Exception):
    pass


class _Audited(EvictionPolicy):
    """Forwards to the learner's policy and keeps the books the cache keeps: evict() must return a
    block that is evictable (inserted, not evicted or removed since). ``plan`` is not forwarded:
    the policy is online."""

    def __init__(self, inner):
        self.inner, self.live = inner, set()
        self.name = getattr(inner, "name", type(inner).__name__)

    def insert(self, key, t, parent=None):
        self.live.add(key)
        self.inner.insert(key, t)

    def touch(self, key, t):
        self.inner.touch(key, t)

    def remove(self, key):
        self.live.discard(key)
        self.inner.remove(key)

    def evict(self):
        try:
            key = self.inner.evict()
        except KeyError as e:
            raise _InvalidPolicy(f"evict() raised KeyError ({e}) while holding {len(self.live)} evictable blocks") from None
        if key not in self.live:
            raise _InvalidPolicy(f"evict() returned {key!r:.40}, which is not an evictable block (never inserted, "
                                 "already evicted, or removed since)")
        self.live.discard(key)
        return key

    def __len__(self):
        return len(self.live)

    def __contains__(self, key):
        return key in self.live


#: the package's eviction policies: 06.4 asks for one of your own (EvictionPolicy is the base to inherit)
PACKAGE_POLICIES = tuple(c for c in vars(eviction).values()
                         if isinstance(c, type) and issubclass(c, EvictionPolicy) and c is not EvictionPolicy)


@functools.lru_cache(maxsize=1)
def policy_traces() -> tuple:
    """The traces 06.4 replays: (name, requests, capacities in tokens). Mooncake's synthetic trace
    (where the package ships it) at 1, 3 and 10 M tokens, and a small generated chat and agent
    workload at 10-50% of their distinct blocks."""
    out = []
    path = find_trace()
    if path is not None:
        out.append(("Mooncake", tuple(read_trace(path)), (1_000_000, 3_000_000, 10_000_000)))
    for wl in (chat_workload(60, seed=3), agent_workload(2, 30, seed=1)):
        distinct = wl.unique_blocks() * wl.block_tokens
        out.append((f"{wl.name} (generated)", tuple(wl.requests),
                    tuple(int(distinct * f) for f in (0.1, 0.2, 0.35, 0.5))))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _baseline(trace_index: int, policy: str) -> tuple:
    _, reqs, caps = policy_traces()[trace_index]
    maker = FIFOPolicy if policy == "fifo" else (lambda: policy)
    return tuple(replay_trace(reqs, capacity_tokens=c, policy=maker()).hit_ratio for c in caps)


def _blockmanager_drill(make) -> None:
    """Sequences sharing prefixes in a small pool, several alive at once: cached pages are reused
    (``remove``: in use, not evictable), freed (``insert``), evicted, pinned."""
    rng = random.Random(0)
    m = BlockManager(16, 2, policy=_Audited(make()))
    system = [1, 2, 3, 4]
    m.allocate("system", system + [5])
    m.free("system")
    m.pin(system)
    alive = []
    for i in range(60):
        seq = system + [rng.randrange(5, 8) for _ in range(rng.randint(1, 7))]
        m.allocate(i, seq)
        alive.append(i)
        if i % 4 == 0:
            m.fork(i, ("fork", i))
            m.append(("fork", i), 7)
            alive.append(("fork", i))
        while len(alive) > 2 or (alive and rng.random() < 0.3):
            m.free(alive.pop(rng.randrange(len(alive))))
        m.check_invariants()
    m.unpin_all()
    for s in alive:
        m.free(s)
    m.check_invariants()


@exercise("06.4", "an eviction policy",
          "Write an eviction policy that does at least as well as FIFO, replayed on three traces.", MyPolicy,
          answers=PACKAGE_POLICIES)
def _check_policy(make) -> list[str]:
    # the checker drives the policy itself: its replays run as one watched call of the learner's code
    # (no package policy may do the work), the baselines outside it
    guard = getattr(make, "guard", None)
    learners = guard.watching if guard is not None else contextlib.nullcontext
    try:
        with learners():
            _blockmanager_drill(make)
    except _InvalidPolicy as e:
        return [f"in a BlockManager (pages reused, freed, pinned): {e}"]
    problems, lines = [], []
    for i, (name, reqs, caps) in enumerate(policy_traces()):
        fifo, lru, belady = _baseline(i, "fifo"), _baseline(i, "lru"), _baseline(i, "belady")
        try:
            with learners():
                mine = [replay_trace(reqs, capacity_tokens=c, policy=_Audited(make())).hit_ratio for c in caps]
        except _InvalidPolicy as e:
            return [f"replaying {name}: {e}"]
        lines.append(f"{name}:")
        lines.append(f"  {'capacity (tokens)':>18s} {'yours':>6s} {'FIFO':>6s} {'LRU':>6s} {'Belady':>6s}")
        for c, a, f, l_, b in zip(caps, mine, fifo, lru, belady):
            lines.append(f"  {c:18,d} {a:6.3f} {f:6.3f} {l_:6.3f} {b:6.3f}")
        means = [statistics.mean(x) for x in (mine, fifo, lru, belady)]
        lines.append(f"  {'mean':>18s} " + " ".join(f"{x:6.3f}" for x in means)
                     + f"   (yours: {means[0] - means[2]:+.3f} vs LRU, {means[0] / means[3]:.0%} of Belady)")
        if means[0] < means[1] - 1e-9:
            problems.append(f"{name}: your mean hit ratio {means[0]:.3f} is below FIFO's {means[1]:.3f}")
    print("hit ratio (tokens served from cache / input tokens) by capacity:\n" + "\n".join(lines))
    return problems


# --------------------------------------------------------------------------- 06.3 a paged-decode kernel


def sliding_window_paged_decode(q, k_cache, v_cache, block_table, seq_lens, window: int):
    """Paged decode with the inputs of paged_decode (on the kernel device), where each sequence's
    query attends only to its last `window` cached tokens, positions [max(0, L - window), L).
    Write it as a Triton kernel: start from small_paged_decode_kernel. Returns o [B, Hq, D] in
    q's dtype, zeros for an empty sequence."""
    raise NotImplementedError  # your code here


def _window_reference(q, k_cache, v_cache, block_table, seq_lens, window):
    B, Hq, D = q.shape
    G = Hq // k_cache.shape[2]
    out = torch.zeros_like(q)
    for b in range(B):
        L = int(seq_lens[b])
        if L == 0:
            continue
        k = gather_sequence(k_cache, block_table, b, L)[max(0, L - window):].repeat_interleave(G, dim=1)
        v = gather_sequence(v_cache, block_table, b, L)[max(0, L - window):].repeat_interleave(G, dim=1)
        s = torch.einsum("hd,lhd->hl", q[b], k) / D ** 0.5
        out[b] = torch.einsum("hl,lhd->hd", torch.softmax(s, dim=-1), v)
    return out


def _window_inputs(seed: int, window: int, *, page_size: int, Hq: int, Hkv: int, D: int) -> dict:
    """Five sequences of ragged lengths (one empty, one of one token) in shuffled pages."""
    g = torch.Generator().manual_seed(seed)
    lens = [0, 1] + torch.randint(2, 60, (3,), generator=g).tolist()
    need = [-(-n // page_size) for n in lens]
    n_pages = sum(need) + 2
    perm = torch.randperm(n_pages, generator=g).to(torch.int32)
    bt = torch.full((len(lens), max(need) + 1), -1, dtype=torch.int32)
    used = 0
    for b, k in enumerate(need):
        bt[b, :k] = perm[used:used + k]
        used += k
    x = dict(q=torch.randn(len(lens), Hq, D, generator=g), k_cache=torch.randn(n_pages, page_size, Hkv, D, generator=g),
             v_cache=torch.randn(n_pages, page_size, Hkv, D, generator=g), block_table=bt,
             seq_lens=torch.tensor(lens, dtype=torch.int32))
    dev = runtime.kernel_device()
    return {**{k: t.to(dev) for k, t in x.items()}, "window": window}


@exercise("06.3", "a sliding-window paged-decode kernel",
          "Write a paged-decode Triton kernel whose query sees only the last `window` tokens.",
          sliding_window_paged_decode, writes_triton=True, answers=(_window_reference,))
def _check_sliding_window(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    for window in (1, rng.randint(2, 9), 200):   # 200: longer than every sequence, so plain paged decode
        shape = dict(page_size=rng.choice([4, 8, 16]), Hq=rng.choice([2, 4, 8]), Hkv=2, D=rng.choice([16, 32]))
        where = (f"window {window}, pages of {shape['page_size']} tokens, {shape['Hq']} query heads over "
                 f"{shape['Hkv']} kv heads, head dim {shape['D']}")
        # fp32 inputs; 5e-3 leaves room for tl.dot, which rounds fp32 to tf32 on a GPU
        res = measure.check(fn, _window_reference, lambda seed: _window_inputs(seed, window, **shape),
                            name=f"window {window}", tol=5e-3, trials=1, seed=rng.randrange(2**30))
        if not res.passed:
            hint = ("NaN or inf in the output: an empty sequence must give zeros, and masked tokens -inf scores"
                    if res.max_error == float("inf") else
                    "each query should see positions max(0, L - window) .. L - 1 of its own sequence, no more")
            problems += [f"{where}: {f} against an fp64 reference ({hint})" for f in res.failures]
    return problems
