"""Page pool bookkeeping: a hypothesis state machine checks the invariants after every step."""
import pytest
import torch
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minimax_lab.kvcache import BlockManager, KVPages, PoolExhausted, page_hash

PS = 4          # page size
NP = 12         # pages
VOCAB = 3       # few token values, so prefixes collide often


class PagesMachine(RuleBasedStateMachine):
    """Each token's K value is its id (+1), so reading a sequence's pages must give back its tokens."""

    def __init__(self):
        super().__init__()
        self.kv = KVPages.allocate(1, NP, PS, 1, 1)
        self.m = BlockManager(NP, PS, kv=self.kv, policy="agent")
        self.next_id = 0

    def _write(self, sid, start):
        seq = self.m.seqs[sid]
        slots = self.m.slots(sid, start)
        vals = torch.tensor(seq.tokens[start:], dtype=torch.float32).view(-1, 1, 1) + 1
        self.kv.write(0, slots, vals, -vals)

    def _read(self, sid):
        seq = self.m.seqs[sid]
        return [int(x) - 1 for x in self.kv.k[0].view(-1)[self.m.slots(sid)].tolist()]

    @rule(tokens=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=14))
    def allocate(self, tokens):
        sid = self.next_id
        self.next_id += 1
        before = list(self.m.lookup(tokens))
        try:
            cached = self.m.allocate(sid, tokens)
        except PoolExhausted:
            assert sid not in self.m.seqs
            return
        assert cached % PS == 0 and cached < len(tokens)
        assert self.m.seqs[sid].pages[:cached // PS] == before[:cached // PS]
        # a hit yields exactly the stored tokens
        assert self._read(sid)[:cached] == tokens[:cached]
        self._write(sid, cached)

    @precondition(lambda self: self.m.seqs)
    @rule(data=st.data(), token=st.integers(0, VOCAB - 1))
    def append(self, data, token):
        sid = data.draw(st.sampled_from(sorted(self.m.seqs)))
        others = {s: self._read(s) for s in self.m.seqs if s != sid}
        try:
            slot = self.m.append(sid, token)
        except PoolExhausted:
            return
        self.kv.write(0, torch.tensor([slot]), torch.tensor([[[token + 1.0]]]), torch.tensor([[[-token - 1.0]]]))
        for s, toks in others.items():       # copy-on-write: nobody else sees the new token
            assert self._read(s) == toks

    @precondition(lambda self: self.m.seqs)
    @rule(data=st.data())
    def fork(self, data):
        sid = data.draw(st.sampled_from(sorted(self.m.seqs)))
        child = self.next_id
        self.next_id += 1
        self.m.fork(sid, child)
        assert self._read(child) == self.m.seqs[sid].tokens

    @precondition(lambda self: self.m.seqs)
    @rule(data=st.data())
    def free(self, data):
        self.m.free(data.draw(st.sampled_from(sorted(self.m.seqs))))

    @rule()
    def evict(self):
        try:
            self.m.evict(1)
        except PoolExhausted:
            assert len(self.m.policy) == 0

    @rule(tokens=st.lists(st.integers(0, VOCAB - 1), min_size=PS, max_size=12))
    def lookup(self, tokens):
        pages = self.m.lookup(tokens)
        for i, p in enumerate(pages):
            assert self.m.page_prefix[p].all_tokens() == tokens[:(i + 1) * PS]
            assert [int(x) - 1 for x in self.kv.k[0, p, :, 0, 0].tolist()] == tokens[i * PS:(i + 1) * PS]

    @precondition(lambda self: self.m.seqs)
    @rule(data=st.data(), pin=st.booleans())
    def pin(self, data, pin):
        toks = self.m.seqs[data.draw(st.sampled_from(sorted(self.m.seqs)))].tokens
        (self.m.pin if pin else self.m.unpin)(toks)

    @invariant()
    def consistent(self):
        self.m.check_invariants()
        for s in self.m.seqs:
            assert self._read(s) == self.m.seqs[s].tokens

    def teardown(self):
        for s in list(self.m.seqs):
            self.m.free(s)
        self.m.unpin_all()
        self.m.check_invariants()
        # nothing leaked: every page is free or cached (evictable), and evicting all frees everything
        assert len(self.m.policy) == len(self.m.cached)
        self.m.evict(len(self.m.policy))
        assert sorted(self.m.free_pages) == list(range(NP))


PagesMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestPages = PagesMachine.TestCase


def test_full_pool_raises_and_never_overwrites():
    kv = KVPages.allocate(1, 3, 2, 1, 1)
    m = BlockManager(3, 2, kv=kv)
    m.allocate("a", [1, 2, 3, 4, 5])          # 3 pages, all live
    with pytest.raises(PoolExhausted, match="pool full"):
        m.allocate("b", [7])
    with pytest.raises(PoolExhausted):
        m.append("a", 6)                      # fills page 3 (slot free)... then the next needs a page
        m.append("a", 7)
    assert "b" not in m.seqs
    m.check_invariants()


def test_prefix_sharing_and_hash_chain():
    m = BlockManager(8, 2)
    assert m.allocate("a", [1, 2, 3, 4, 5]) == 0
    assert m.allocate("b", [1, 2, 3, 4, 9]) == 4          # two full pages shared
    assert m.seqs["a"].pages[:2] == m.seqs["b"].pages[:2]
    assert m.allocate("c", [9, 9, 3, 4]) == 0              # same page content, different parent
    assert m.allocate("d", [1, 2, 3, 4]) == 2              # always computes >= 1 token
    assert page_hash(page_hash(None, [1, 2]), [3, 4]) != page_hash(page_hash(None, [9, 9]), [3, 4])
    m.free("a"); m.free("b"); m.free("c"); m.free("d")
    m.check_invariants()
    m2 = BlockManager(8, 2, prefix_caching=False)
    assert m2.allocate("a", [1, 2, 3]) == 0 and m2.allocate("b", [1, 2, 3]) == 0


def test_verified_on_hit():
    m = BlockManager(4, 2)
    m.allocate("a", [1, 2, 3])
    m.free("a")
    p = m.cached[page_hash(None, [1, 2])]
    m.page_prefix[p].tokens = (1, 7)                       # a forged / colliding entry is not served
    assert m.lookup([1, 2, 3]) == []


def test_block_table_layout():
    m = BlockManager(6, 2)
    m.allocate("a", [1, 2, 3])
    m.allocate("b", [4])
    bt = m.block_table(["a", "b"])
    assert bt.dtype == torch.int32 and bt.shape == (2, 2) and bt[1, 1] == -1
    assert m.seq_lens(["a", "b"]).tolist() == [3, 1]


def test_page_hash_is_chained_blake2b_128():
    import hashlib
    h = hashlib.blake2b(b"minimax-lab-kv-root", digest_size=16)
    h.update(b"1|2")
    assert page_hash(None, [1, 2]) == h.digest() and len(page_hash(h.digest(), [3])) == 16
    assert page_hash(page_hash(None, [1, 2]), [3]) != page_hash(None, [3])


def test_slots_follow_the_block_table():
    m = BlockManager(8, 4)
    m.allocate("a", list(range(11)))
    m.allocate("b", list(range(100, 105)))
    bt = m.block_table(["a", "b"])
    for row, sid in enumerate(["a", "b"]):
        s = m.slots(sid)
        t = torch.arange(len(m.seqs[sid].tokens))
        assert s.dtype == torch.int64
        assert torch.equal(s, bt[row, t // 4].long() * 4 + t % 4)      # token t -> page bt[b, t // ps], slot t % ps
    assert m.slots("a", 3, 6).tolist() == m.slots("a")[3:6].tolist()
    with pytest.raises(ValueError, match="max_pages"):
        m.block_table(["a"], max_pages=2)


def test_allocate_errors_and_pin():
    m = BlockManager(4, 2)
    with pytest.raises(ValueError, match="at least one token"):
        m.allocate("a", [])
    m.allocate("a", [1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="already exists"):
        m.allocate("a", [1])
    m.free("a")
    assert m.pin([1, 2, 3, 4, 9]) == 4               # the cached prefix: two pages
    assert m.page_states().count("pinned") == 2
    m.evict(len(m.policy))                            # everything evictable goes; pinned pages stay
    assert m.lookup([1, 2, 3, 4]) and m.page_states().count("pinned") == 2
    with pytest.raises(PoolExhausted):
        m.evict(1)
    m.unpin([1, 2, 3, 4])
    assert m.page_states().count("cached") == 2
    m.evict(2)
    assert m.lookup([1, 2, 3, 4]) == [] and m.page_states() == ["free"] * 4
    m.check_invariants()


def test_page_states():
    m = BlockManager(6, 2)
    m.allocate("a", [1, 2, 3])                        # pages: [1, 2] named, [3] partial
    m.fork("a", "b")                                  # both pages shared
    m.allocate("c", [7])
    m.free("c")                                       # unnamed partial page: back to free
    states = m.page_states()
    assert states.count("shared") == 2 and states.count("free") == 4
    m.free("a")
    m.free("b")
    assert sorted(m.page_states()) == ["cached"] + ["free"] * 5
    m.check_invariants()


def test_on_evict_sees_the_page_before_it_is_reused():
    kv = KVPages.allocate(2, 2, 2, 1, 3)
    seen = []
    m = BlockManager(2, 2, kv=kv, on_evict=lambda name, page, tokens: seen.append((name, tokens, kv.page_block(page))))
    m.allocate("a", [1, 2, 3])
    kv.write(1, m.slots("a", 0, 2), torch.full((2, 1, 3), 5.0), torch.full((2, 1, 3), 6.0))
    block = kv.page_block(m.seqs["a"].pages[0])
    m.free("a")
    m.allocate("b", [4, 5, 6])                        # needs both pages: evicts [1, 2]
    assert len(seen) == 1
    name, tokens, got = seen[0]
    assert name == page_hash(None, [1, 2]) and tokens == (1, 2) and torch.equal(got, block)
    assert m.stats["evictions"] == 1


def test_kv_pages():
    from minimax_lab.runtime import device
    kv = KVPages.allocate(2, 4, 3, 2, 5, dtype=torch.float16, device=device())
    assert kv.k.shape == (2, 4, 3, 2, 5) and kv.page_size == 3 and kv.block_shape == (2, 2, 3, 2, 5)
    assert kv.nbytes_per_page() == 2 * 2 * 3 * 2 * 5 * 2
    k = torch.randn(2, 2, 5, device=device())
    kv.write(1, torch.tensor([4, 5], device=device()), k, -k)          # page 1, slots 1 and 2
    kp, vp = kv.layer(1)
    assert kp.data_ptr() == kv.k[1].data_ptr()                          # a view, not a copy
    assert torch.equal(kp[1, 1:3], k.half()) and torch.equal(vp[1, 1:3], (-k).half())
    kv.copy_page(1, 3)
    assert torch.equal(kv.page_block(3), kv.page_block(1))
    b = kv.page_block(1)
    kv.k[:, 1] = 0                                                      # page_block is a copy
    kv.load_block(2, b)
    assert torch.equal(kv.page_block(2), b) and b.dtype == torch.float16
    with pytest.raises(ValueError, match="shape"):
        kv.load_block(0, b[:, :1])
    with pytest.raises(ValueError, match="float16"):
        kv.load_block(0, b.float())
    with pytest.raises(TypeError):
        kv.load_block(0, b.tolist())
    with pytest.raises(ValueError, match="do not match"):
        BlockManager(5, 3, kv=kv)
