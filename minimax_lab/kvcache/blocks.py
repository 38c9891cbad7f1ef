"""Pages and prefix sharing: a preallocated page pool, block tables, reference counts, content hashes.

The layout every kernel in this chapter reads (vLLM's PagedAttention, Kwon et al. 2023,
arXiv:2309.06180)::

    k_pages[layer], v_pages[layer]   [num_pages, page_size, Hkv, D]   (one pool per layer)
    block_table                      int32 [B, max_pages]  (-1 = unused)
    token t of sequence b  ->  page block_table[b, t // page_size], slot t % page_size

``KVPages`` holds the tensors; ``BlockManager`` does the bookkeeping and never touches a value
except to copy a page on write. A page is in exactly one of three states:

* **free** -- on the free list, reference count 0, no name;
* **in use** -- referenced by ``refcount > 0`` block-table entries (sequences share prefix pages);
* **cached** -- reference count 0 but *named*: a full page is named by a chained content hash
  ``hash(parent page's hash, this page's tokens)``, so equal prefixes get equal names. Cached
  pages are evictable (the eviction policy decides which goes first), unless pinned.

A lookup walks a token list page by page, following names. A name only finds a candidate: every
hit is **verified** against the whole token prefix the page was computed for -- each full page
keeps its tokens and a link to the record of the page before it, and a hit must match the
request's tokens on every page up to it -- so a hash collision can never serve wrong KV (it only
costs a miss). When a new page is needed and the free list is empty, a cached page is evicted;
when nothing is evictable the manager raises ``PoolExhausted`` -- it never overwrites a page in
use. (No preemption: the caller decides whom to free; the engine frees finished sequences.)

Token ids are non-negative integers (``int``, NumPy or 0-d tensor integers, or a 1-D integer
tensor); anything else raises ``TypeError``/``ValueError`` rather than being rounded to an id.

Copy-on-write: ``fork`` makes a child share all of the parent's pages, including a partly filled
last page. The first ``append`` of either onto a shared partial page copies it to a fresh page
first (``KVPages.copy_page``), so neither sees the other's new tokens.
"""
from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass, field

import torch

from minimax_lab.kvcache.eviction import EvictionPolicy, make_policy
from minimax_lab.validate import check_int, check_positive_int

ROOT_HASH = b"minimax-lab-kv-root"


class PoolExhausted(RuntimeError):
    """Every page is in use or pinned: nothing can be evicted to make room."""


def page_hash(parent: bytes | None, tokens) -> bytes:
    """Chained content hash of a full page: blake2b-128 of the parent's hash and the token ids."""
    h = hashlib.blake2b(parent or ROOT_HASH, digest_size=16)
    h.update(b"|".join(str(int(t)).encode() for t in tokens))
    return h.digest()


def token_ids(tokens, name: str = "tokens") -> list[int]:
    """``tokens`` as a list of ``int``; raises ``TypeError`` for a non-integer id (``1.5``, ``"7"``,
    a float tensor) and ``ValueError`` for a negative one -- never rounds or truncates."""
    if isinstance(tokens, torch.Tensor):
        if tokens.ndim != 1 or tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
            raise TypeError(f"{name} must be a 1-D integer tensor, got {tokens.dtype} of shape {tuple(tokens.shape)}")
        tokens = tokens.tolist()
    elif isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__iter__"):
        raise TypeError(f"{name} must be a sequence of integer token ids, got {type(tokens).__name__}")
    out = []
    for i, t in enumerate(tokens):
        out.append(token_id(t, f"{name}[{i}]"))
    return out


def token_id(t, name: str = "token") -> int:
    """One token id as an ``int``; raises like ``token_ids``."""
    return check_int(t, name, minimum=0)


class PagePrefix:
    """What a full page's KV was computed from: its ``tokens``, the ``parent`` record of the page
    before it (``None`` for the first page) and its ``name`` (``page_hash``). Following ``parent``
    links gives the whole token prefix, so two records can be compared exactly, not just by name.
    A record lives while a cached page, a sequence or a later record refers to it."""

    __slots__ = ("name", "tokens", "parent")

    def __init__(self, name: bytes, tokens: tuple, parent: "PagePrefix | None"):
        self.name, self.tokens, self.parent = name, tokens, parent

    def depth(self) -> int:
        n, p = 0, self
        while p is not None:
            n, p = n + 1, p.parent
        return n

    def all_tokens(self) -> list[int]:
        """The whole prefix, page by page from the first."""
        chunks, p = [], self
        while p is not None:
            chunks.append(p.tokens)
            p = p.parent
        return [t for c in reversed(chunks) for t in c]


def same_prefix(a: PagePrefix | None, b: PagePrefix | None) -> bool:
    """True when ``a`` and ``b`` stand for the same token prefix: walks both chains, comparing
    names and tokens page by page, until they meet at one shared record (or both end)."""
    while a is not b:
        if a is None or b is None or a.name != b.name or a.tokens != b.tokens:
            return False
        a, b = a.parent, b.parent
    return True


@dataclass
class KVPages:
    """The page pools of all layers: ``k``, ``v`` ``[n_layers, num_pages, page_size, Hkv, D]``.

    ``layer(i)`` returns that layer's ``(k_pages, v_pages)`` views ``[num_pages, page_size, Hkv, D]``.
    """

    k: torch.Tensor
    v: torch.Tensor

    @classmethod
    def allocate(cls, n_layers: int, num_pages: int, page_size: int, kv_heads: int, head_dim: int, *,
                 dtype=torch.float32, device="cpu") -> "KVPages":
        shape = (n_layers, num_pages, page_size, kv_heads, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    @property
    def page_size(self) -> int:
        return self.k.shape[2]

    def layer(self, i: int):
        return self.k[i], self.v[i]

    def copy_page(self, src: int, dst: int) -> None:
        self.k[:, dst].copy_(self.k[:, src])
        self.v[:, dst].copy_(self.v[:, src])

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k, v [N, Hkv, D]`` at flat ``slots [N]`` (``page * page_size + offset``)."""
        kp, vp = self.layer(layer)
        kp.view(-1, *kp.shape[2:])[slots] = k.to(kp.dtype)
        vp.view(-1, *vp.shape[2:])[slots] = v.to(vp.dtype)

    def nbytes_per_page(self) -> int:
        return 2 * self.k[:, 0].numel() * self.k.element_size()

    @property
    def block_shape(self) -> tuple:
        """Shape of one page's block: ``(2, n_layers, page_size, Hkv, D)`` (K then V)."""
        return (2, self.k.shape[0], *self.k.shape[2:])

    def page_block(self, page: int) -> torch.Tensor:
        """A copy of page ``page`` of every layer, K and V: ``block_shape``, the pool's dtype and device."""
        return torch.stack([self.k[:, page], self.v[:, page]])

    def load_block(self, page: int, block: torch.Tensor) -> None:
        """Write a block (from ``page_block``, or a tier's ``fetch``) into page ``page``.
        Raises ``ValueError`` unless it has ``block_shape`` and the pool's dtype."""
        if not isinstance(block, torch.Tensor):
            raise TypeError(f"block must be a torch.Tensor, got {type(block).__name__}")
        if tuple(block.shape) != self.block_shape or block.dtype != self.k.dtype:
            raise ValueError(f"block must be {self.k.dtype} of shape {list(self.block_shape)}, "
                             f"got {block.dtype} of shape {list(block.shape)}")
        self.k[:, page].copy_(block[0])
        self.v[:, page].copy_(block[1])


@dataclass
class Sequence:
    """A sequence's tokens and the pages that hold them (its row of the block table)."""

    seq_id: object
    tokens: list = field(default_factory=list)
    pages: list = field(default_factory=list)
    prefix: list = field(default_factory=list)   # PagePrefix of each full page (with prefix caching)


class BlockManager:
    """Bookkeeping for one page pool (shared by all layers: page ``p`` is page ``p`` in every layer).

    ``allocate(seq_id, tokens)`` reuses the longest verified cached prefix (when
    ``prefix_caching``) and returns how many tokens are cached -- the caller computes K/V only for
    the rest, writing them at ``slots(seq_id, start, end)``. ``append`` adds one token and returns
    its flat slot. ``fork`` shares pages, ``free`` drops a sequence. ``on_evict(hash, page,
    tokens)`` (if given) is called just before a cached page is reused, while the page still holds
    its K/V -- the hook the host/disk tiers use to keep its contents
    (``tiers.TieredStore.on_evict_hook``). If the hook raises, that page stays cached and the call
    that needed a page (``allocate``, ``append``, ``evict``) raises the hook's exception, leaving
    every sequence and reference count as before the call and no page leaked (pages it evicted
    before the failure stay evicted) -- the same as when it raises ``PoolExhausted``.

    At least one token of a prompt is always computed (a fully cached prompt gives back its last
    page), because the caller needs the last token's logits.
    """

    def __init__(self, num_pages: int, page_size: int, *, policy: EvictionPolicy | str = "lru",
                 kv: KVPages | None = None, prefix_caching: bool = True, on_evict=None):
        self.num_pages = check_positive_int(num_pages, "num_pages")
        self.page_size = check_positive_int(page_size, "page_size")
        if kv is not None and (kv.k.shape[1] != num_pages or kv.page_size != page_size):
            raise ValueError(f"kv pages {tuple(kv.k.shape)} do not match num_pages={num_pages}, page_size={page_size}")
        self.kv = kv
        self.policy = make_policy(policy)
        self.prefix_caching = prefix_caching
        self.on_evict = on_evict
        self.free_pages: deque[int] = deque(range(num_pages))
        self.refcount = [0] * num_pages
        self.page_hash: list[bytes | None] = [None] * num_pages    # name of a full, registered page
        self.page_prefix: list[PagePrefix | None] = [None] * num_pages  # what it holds, for verification
        self.cached: dict[bytes, int] = {}                          # name -> page
        self.pinned: set[bytes] = set()
        self.seqs: dict[object, Sequence] = {}
        self.clock = 0
        self.stats = dict(hit_tokens=0, prompt_tokens=0, evictions=0, cow_copies=0)

    # ---- pages ---------------------------------------------------------------------------------
    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def _new_page(self) -> int:
        if not self.free_pages:
            self.evict(1)
        return self.free_pages.popleft()

    def evict(self, n: int = 1) -> list[int]:
        """Evict ``n`` cached, unpinned pages (policy order) to the free list; returns the pages.
        Raises ``PoolExhausted`` when fewer than ``n`` can be evicted."""
        out = []
        for _ in range(n):
            try:
                h = self.policy.evict()
            except KeyError:
                raise PoolExhausted(
                    f"KV page pool full: all {self.num_pages} pages of {self.page_size} tokens are in use "
                    f"by {len(self.seqs)} sequence{'s' if len(self.seqs) != 1 else ''} or pinned ({len(self.pinned)}); free a sequence or "
                    f"allocate a larger pool") from None
            page = self.cached[h]
            assert self.refcount[page] == 0, "policy returned a live page"
            if self.on_evict is not None:
                try:
                    self.on_evict(h, page, self.page_prefix[page].tokens)
                except BaseException:
                    self.policy.insert(h, self._tick())    # the page stays cached (and evictable)
                    raise
            del self.cached[h]
            self._clear(page)
            self.free_pages.append(page)
            self.stats["evictions"] += 1
            out.append(page)
        return out

    def _clear(self, page: int) -> None:
        self.page_hash[page] = self.page_prefix[page] = None

    def _ref(self, page: int) -> None:
        if self.refcount[page] == 0 and self.page_hash[page] is not None:
            self.policy.remove(self.page_hash[page])   # in use: no longer evictable
        self.refcount[page] += 1

    def _unref(self, page: int) -> None:
        self.refcount[page] -= 1
        if self.refcount[page] == 0:
            h = self.page_hash[page]
            if h is None:
                self.free_pages.append(page)
            elif h not in self.pinned:
                self.policy.insert(h, self._tick())

    def _seal(self, seq: Sequence, i: int) -> None:
        """Page ``i`` of ``seq`` just became full: name it, register it unless the name exists."""
        if not self.prefix_caching:
            return
        assert len(seq.prefix) == i, "pages must be sealed in order"
        parent = seq.prefix[i - 1] if i else None
        toks = tuple(seq.tokens[i * self.page_size:(i + 1) * self.page_size])
        h = page_hash(parent.name if parent else None, toks)
        rec = PagePrefix(h, toks, parent)
        other = self.cached.get(h)
        if other is not None:          # the name is taken: identical content (or a hash collision)
            known = self.page_prefix[other]
            if known.tokens == toks and same_prefix(known.parent, parent):
                known.parent = parent  # identical: share the record, so later pages chain to it
                rec = known
            seq.prefix.append(rec)
            return
        seq.prefix.append(rec)
        page = seq.pages[i]
        self.page_hash[page], self.page_prefix[page] = h, rec
        self.cached[h] = page

    # ---- lookup --------------------------------------------------------------------------------
    def lookup(self, tokens, *, max_pages: int | None = None) -> list[int]:
        """Pages of the longest cached, verified prefix of ``tokens`` (full pages only).

        A page counts only if the whole prefix it was computed for -- its own tokens and those of
        every page before it -- equals the request's."""
        if not self.prefix_caching:
            return []
        tokens = token_ids(tokens)
        return self._lookup(tokens, max_pages)[0]

    def _lookup(self, tokens: list[int], max_pages: int | None = None):
        """(pages, their ``PagePrefix`` records) of the longest verified cached prefix."""
        ps, pages, recs, parent = self.page_size, [], [], None
        n_full = len(tokens) // ps
        if max_pages is not None:
            n_full = min(n_full, max_pages)
        for i in range(n_full):
            toks = tuple(tokens[i * ps:(i + 1) * ps])
            page = self.cached.get(page_hash(parent.name if parent else None, toks))
            if page is None:
                break
            rec = self.page_prefix[page]
            if rec.tokens != toks or not same_prefix(rec.parent, parent):
                break                  # a name collision: different tokens somewhere in the prefix
            rec.parent = parent        # equal prefixes: link to the verified record, so the chains meet
            pages.append(page)
            recs.append(rec)
            parent = rec
        return pages, recs

    # ---- sequences -----------------------------------------------------------------------------
    def allocate(self, seq_id, tokens) -> int:
        """Create sequence ``seq_id`` holding ``tokens``; returns the number of tokens whose K/V are
        already cached (a multiple of ``page_size``, < len(tokens)). Raises ``ValueError`` for a
        known id or empty tokens, ``TypeError``/``ValueError`` for a token that is not an integer
        id >= 0, ``PoolExhausted`` when the pool cannot hold it (no sequence is created, no page
        leaked; an exception from ``on_evict`` is raised the same way)."""
        if seq_id in self.seqs:
            raise ValueError(f"sequence {seq_id!r} already exists")
        tokens = token_ids(tokens)
        if not tokens:
            raise ValueError("a sequence needs at least one token")
        hit, recs = ([], []) if not self.prefix_caching else \
            self._lookup(tokens, max_pages=(len(tokens) - 1) // self.page_size)
        seq = Sequence(seq_id, tokens, [], list(recs))
        n_pages = -(-len(tokens) // self.page_size)
        if n_pages > self.num_pages:
            raise PoolExhausted(f"a sequence of {len(tokens)} tokens needs {n_pages} pages of {self.page_size} "
                                f"tokens; the pool holds {self.num_pages}: allocate a larger pool")
        try:
            for p in hit:
                self._ref(p)
                seq.pages.append(p)
            for _ in range(len(hit), n_pages):
                p = self._new_page()
                self.refcount[p] = 1
                seq.pages.append(p)
        except BaseException:          # PoolExhausted, or an on_evict hook failed: give back what we took
            for p in seq.pages:
                self._unref(p)
            raise
        self.seqs[seq_id] = seq
        for i in range(len(hit), len(tokens) // self.page_size):
            self._seal(seq, i)
        cached = len(hit) * self.page_size
        self.stats["hit_tokens"] += cached
        self.stats["prompt_tokens"] += len(tokens)
        return cached

    def append(self, seq_id, token) -> int:
        """Add one token to ``seq_id``; returns the flat slot where its K/V go. Copies a shared
        partial last page first (copy-on-write). Raises ``PoolExhausted`` when no page is free,
        ``TypeError``/``ValueError`` for a token that is not an integer id >= 0."""
        seq = self._seq(seq_id)
        token = token_id(token)
        pos = len(seq.tokens)
        if pos % self.page_size == 0:           # last page full (or none): start a new one
            p = self._new_page()
            self.refcount[p] = 1
            seq.pages.append(p)
        else:
            last = seq.pages[-1]
            if self.refcount[last] > 1:         # shared partial page: copy before writing
                p = self._new_page()
                self.refcount[p] = 1
                if self.kv is not None:
                    self.kv.copy_page(last, p)
                self._unref(last)
                seq.pages[-1] = p
                self.stats["cow_copies"] += 1
        seq.tokens.append(token)
        if len(seq.tokens) % self.page_size == 0:
            self._seal(seq, len(seq.pages) - 1)
        return seq.pages[-1] * self.page_size + pos % self.page_size

    def fork(self, parent_id, child_id) -> None:
        """``child_id`` shares every page of ``parent_id`` (reference counts +1)."""
        par = self._seq(parent_id)
        if child_id in self.seqs:
            raise ValueError(f"sequence {child_id!r} already exists")
        for p in par.pages:
            self._ref(p)
        self.seqs[child_id] = Sequence(child_id, list(par.tokens), list(par.pages), list(par.prefix))

    def free(self, seq_id) -> None:
        """Drop ``seq_id``: its pages lose a reference; named ones become cached (evictable)."""
        seq = self.seqs.pop(seq_id, None)
        if seq is None:
            raise KeyError(f"unknown sequence {seq_id!r}")
        for p in reversed(seq.pages):    # tail first, so equal-time policies evict the tail first
            self._unref(p)

    def pin(self, tokens) -> int:
        """Pin the cached prefix of ``tokens`` (e.g. a system prompt): never evicted until unpinned.
        Returns the number of pinned tokens."""
        pages = self.lookup(tokens)
        for p in pages:
            h = self.page_hash[p]
            if h not in self.pinned:
                self.pinned.add(h)
                self.policy.remove(h)
        return len(pages) * self.page_size

    def unpin(self, tokens) -> None:
        for p in self.lookup(tokens):
            h = self.page_hash[p]
            if h in self.pinned:
                self.pinned.discard(h)
                if self.refcount[p] == 0:
                    self.policy.insert(h, self._tick())

    def unpin_all(self) -> None:
        for h in list(self.pinned):
            self.pinned.discard(h)
            if self.refcount[self.cached[h]] == 0:
                self.policy.insert(h, self._tick())

    # ---- views ---------------------------------------------------------------------------------
    def _seq(self, seq_id) -> Sequence:
        try:
            return self.seqs[seq_id]
        except KeyError:
            raise KeyError(f"unknown sequence {seq_id!r}") from None

    def slots(self, seq_id, start: int = 0, end: int | None = None) -> torch.Tensor:
        """Flat slots (``page * page_size + offset``) of tokens ``[start, end)`` of ``seq_id``, int64."""
        seq = self._seq(seq_id)
        end = len(seq.tokens) if end is None else end
        t = torch.arange(start, end)
        pages = torch.tensor(seq.pages, dtype=torch.int64)
        return pages[t // self.page_size] * self.page_size + t % self.page_size

    def block_table(self, seq_ids, max_pages: int | None = None, device="cpu") -> torch.Tensor:
        """int32 ``[B, max_pages]``, -1 where unused."""
        rows = [self._seq(s).pages for s in seq_ids]
        width = max([len(r) for r in rows] + [1]) if max_pages is None else max_pages
        bt = torch.full((len(rows), width), -1, dtype=torch.int32)
        for i, r in enumerate(rows):
            if len(r) > width:
                raise ValueError(f"sequence {seq_ids[i]!r} has {len(r)} pages > max_pages={width}")
            bt[i, :len(r)] = torch.tensor(r, dtype=torch.int32)
        return bt.to(device)

    def seq_lens(self, seq_ids, device="cpu") -> torch.Tensor:
        return torch.tensor([len(self._seq(s).tokens) for s in seq_ids], dtype=torch.int32, device=device)

    def page_states(self) -> list[str]:
        """Per page: ``"free"``, ``"used"``, ``"shared"`` (refcount > 1), ``"cached"`` or ``"pinned"``."""
        out = []
        free = set(self.free_pages)
        for p in range(self.num_pages):
            h = self.page_hash[p]
            if p in free:
                out.append("free")
            elif self.refcount[p] > 1:
                out.append("shared")
            elif self.refcount[p] == 1:
                out.append("used")
            else:
                out.append("pinned" if h in self.pinned else "cached")
        return out

    def check_invariants(self) -> None:
        """Assert the bookkeeping is consistent (used by the tests after every step)."""
        refs = [0] * self.num_pages
        for s in self.seqs.values():
            assert len(s.pages) == -(-len(s.tokens) // self.page_size), "pages do not cover the tokens"
            for p in s.pages:
                refs[p] += 1
        assert refs == self.refcount, "reference counts differ from block-table references"
        free = list(self.free_pages)
        assert len(free) == len(set(free)), "a page is on the free list twice"
        for p in free:
            assert refs[p] == 0 and self.page_hash[p] is None, f"page {p} is free and referenced or named"
        for s in self.seqs.values():
            if self.prefix_caching:
                assert len(s.prefix) == len(s.tokens) // self.page_size, "a full page has no prefix record"
                prev = None
                for i, rec in enumerate(s.prefix):   # record i = page i's tokens after record i - 1
                    assert rec.tokens == tuple(s.tokens[i * self.page_size:(i + 1) * self.page_size]) \
                        and same_prefix(rec.parent, prev), "a prefix record differs from the sequence's tokens"
                    prev = rec
        for h, p in self.cached.items():
            assert self.page_hash[p] == h and p not in set(free)
            rec = self.page_prefix[p]
            assert rec is not None and rec.name == h and len(rec.tokens) == self.page_size
            evictable = self.refcount[p] == 0 and h not in self.pinned
            assert (h in self.policy) == evictable, f"page {p}: evictable={evictable} but policy disagrees"
        unnamed_idle = [p for p in range(self.num_pages) if refs[p] == 0 and self.page_hash[p] is None]
        assert sorted(unnamed_idle) == sorted(free), "an idle unnamed page is not on the free list (leak)"
        assert len(self.policy) == sum(1 for h, p in self.cached.items()
                                       if self.refcount[p] == 0 and h not in self.pinned)
