"""The remote tier on a real Mooncake Store: content-addressed, verified, signed with the pool's
secret, batched and moved without copies in Python, bounded, and off with one sentence when the
store cannot start."""
import os
import stat
import time
import warnings

import pytest
import torch
from tests.support.devices import generator

from minimax_lab.engine.slice import PagedEngine
from minimax_lab.kvcache import remote as rm
from minimax_lab.kvcache import store as mc
from minimax_lab.kvcache.blocks import page_hash
from minimax_lab.kvcache.remote import RemoteTier
from minimax_lab.kvcache.pool_value import ValueCodec
from minimax_lab.kvcache.tiers import TieredStore
from minimax_lab.model.train import load_pretrained
from tests.kvcache.conftest import _require_store

# the pool's values are checked with xxhash and signed with blake3 (requirements.txt)
pytest.importorskip("xxhash", reason="the remote tier checks values with xxhash (requirements.txt)")
pytest.importorskip("blake3", reason="the remote tier signs values with blake3 (requirements.txt)")

SHAPE = (2, 2, 4, 2, 8)


def _blocks(n, g):
    names, blocks, parent = [], [], None
    for i in range(n):
        parent = page_hash(parent, [int(x) for x in torch.randint(0, 1000, (4,), generator=g)])
        names.append(parent)
        blocks.append(torch.randn(SHAPE, generator=g))
    return names, blocks


@pytest.fixture(scope="module")
def tier(mooncake):
    t = RemoteTier(mooncake.master_address, mooncake.metadata_url, model="test-model", dtype=torch.float32,
                   block_shape=SHAPE, timeout_s=5.0, buffer_bytes=1 << 20, netns=mooncake.netns)
    assert t.enabled, t.reason
    yield t
    t.close()


def test_put_get_roundtrip_batched_and_prefix(tier):
    g = generator()
    names, blocks = _blocks(40, g)
    tier.buffer_bytes = 4 * (tier.value_size(names[0]) + 64)      # force batches of 4
    tier._buf = None
    assert tier.put_many(names[:30], blocks[:30]) == 30
    assert tier.prefix(names) == 30
    got = tier.get_many(names)
    assert all(torch.equal(a, b) for a, b in zip(got[:30], blocks[:30]))
    assert got[30:] == [None] * 10
    assert [torch.equal(a, b) for a, b in zip(tier.get_prefix(names), blocks)] == [True] * 30
    # a second put of the same name keeps the first value (content addressing: equal bytes anyway)
    assert tier.put_many(names[:1], [torch.zeros(SHAPE)]) == 1
    assert torch.equal(tier.get_many(names[:1])[0], blocks[0])
    assert tier.zero_copy and tier._buf.registered           # the client's batch_put_from / batch_get_into
    tier.buffer_bytes = 1 << 20


def test_another_format_never_sees_the_blocks(mooncake, tier):
    g = generator()
    names, blocks = _blocks(3, g)
    tier.put_many(names, blocks)
    for other in (dict(model="other-model", dtype=torch.float32, block_shape=SHAPE),
                  dict(model="test-model", dtype=torch.float16, block_shape=SHAPE),
                  dict(model="test-model", dtype=torch.float32, block_shape=(2, 2, 8, 1, 8))):
        t = RemoteTier(mooncake.master_address, mooncake.metadata_url, timeout_s=5.0, netns=mooncake.netns, **other)
        assert t.prefix(names) == 0 and t.get_many(names) == [None] * 3
        t.close()
    with pytest.raises(ValueError, match="float32 blocks of shape"):
        tier.put_many(names[:1], [torch.zeros(SHAPE, dtype=torch.float16)])


@pytest.mark.parametrize("damage", ["flip", "truncate", "other_block", "garbage"])
def test_damaged_value_is_a_miss_counted_and_removed(tier, damage):
    g = generator()
    names, blocks = _blocks(2, g)
    tier.put_many(names, blocks)
    key = tier.key(names[0])
    raw = bytearray(tier.raw("get", key))
    bad = {"flip": lambda: bytes(raw[:-40]) + bytes([raw[-40] ^ 1]) + bytes(raw[-39:]),
           "truncate": lambda: bytes(raw[:-10]),
           "other_block": lambda: tier.encode(names[1], blocks[1]),
           "garbage": lambda: b"not a block"}[damage]()
    assert tier.raw("upsert", key, bad) == 0
    before = tier.stats.rejected
    assert tier.get_many(names)[0] is None
    assert tier.stats.rejected == before + 1
    assert tier.raw("is_exist", key) == 0                 # removed: the next put can land
    assert tier.put_many(names[:1], blocks[:1]) == 1 and torch.equal(tier.get_many(names[:1])[0], blocks[0])


def test_the_tier_signs_with_the_pools_secret(mooncake, tier):
    assert tier.keyed and tier.codec.secret == mooncake.secret
    path = mc.secret_path(mooncake.master_address)
    assert path.read_bytes() == mooncake.secret
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert mc.pool_secret(mooncake.master_address) == mooncake.secret


def test_a_forged_value_is_refused_by_the_signed_tier_and_served_by_a_checksum_only_one(mooncake, tier):
    g = generator()
    names, blocks = _blocks(1, g)
    wrong = torch.full(SHAPE, 42.0)
    plain = RemoteTier(mooncake.master_address, mooncake.metadata_url, model="test-model", dtype=torch.float32,
                       block_shape=SHAPE, timeout_s=5.0, netns=mooncake.netns, secret=False)
    try:
        assert not plain.keyed
        # a writer who can reach the pool but has no secret: a value with a checksum recomputed to match
        forger = ValueCodec("test-model", torch.float32, SHAPE, None)
        assert plain.raw("upsert", plain.key(names[0]), forger.encode(names[0], wrong)) == 0
        served = plain.get_many(names)[0]
        assert served is not None and torch.equal(served, wrong)      # checksum only: a wrong tensor
        # the same forgery under the signed tier's key is a miss, counted and removed
        assert tier.put_many(names, blocks) == 1
        assert tier.raw("upsert", tier.key(names[0]), forger.encode(names[0], wrong)) == 0
        before = tier.stats.rejected
        assert tier.get_many(names) == [None] and tier.stats.rejected == before + 1
        # signed with another secret: refused too
        other = ValueCodec("test-model", torch.float32, SHAPE, bytes(32))
        assert tier.raw("upsert", tier.key(names[0]), other.encode(names[0], wrong)) == 0
        assert tier.get_many(names) == [None]
    finally:
        plain.close()


def test_the_secret_can_come_from_the_environment(monkeypatch):
    monkeypatch.setenv(mc.SECRET_ENV, "ab" * 32)
    assert mc.pool_secret(None) == bytes([0xAB]) * 32
    t = RemoteTier(None, None, model="m", dtype=torch.float32, block_shape=SHAPE, client=_Stuck())
    assert t.keyed and t.codec.secret == bytes([0xAB]) * 32
    t.close()
    monkeypatch.setenv(mc.SECRET_ENV, "not hex")
    with pytest.raises(ValueError, match="64 hex digits"):
        mc.pool_secret(None)


class _BytesOnly:
    """A stand-in client without the zero-copy calls: values travel as bytes."""

    def __init__(self):
        self.kv = {}

    def put_batch(self, keys, values):
        for k, v in zip(keys, values):
            self.kv.setdefault(k, bytes(v))
        return 0

    def get_batch(self, keys):
        return [self.kv.get(k, b"") for k in keys]

    def batch_is_exist(self, keys):
        return [int(k in self.kv) for k in keys]

    def remove(self, key, force=False):
        return 0 if self.kv.pop(key, None) is not None else -704


def test_a_client_without_zero_copy_calls_gets_bytes():
    client = _BytesOnly()
    t = RemoteTier(None, None, model="m", dtype=torch.float32, block_shape=SHAPE, client=client, secret=bytes(32))
    names, blocks = _blocks(5, generator())
    assert not t.zero_copy and t.put_many(names, blocks) == 5 and t.prefix(names) == 5
    assert all(torch.equal(a, b) for a, b in zip(t.get_many(names), blocks))
    key = t.key(names[2])
    client.kv[key] = client.kv[key][:-1] + bytes([client.kv[key][-1] ^ 1])
    assert t.get_many(names)[2] is None and t.stats.rejected == 1 and key not in client.kv
    t.close()


def test_tier_ladder_reaches_the_pool(mooncake, tier):
    g = generator()
    names, blocks = _blocks(5, g)
    tier.put_many(names[:3], blocks[:3])
    st = TieredStore(2, model="test-model", dtype=torch.float32, block_shape=SHAPE, remote=tier)
    st.spill(names[0], blocks[0])                         # host has the first, the pool the rest
    got = st.fetch_prefix(names)
    assert len(got) == 3 and all(torch.equal(a, b) for a, b in zip(got, blocks))
    assert st.stats.host_hits == 1 and st.stats.remote_hits == 2
    assert st.publish(names[3:], blocks[3:]) == 2 and len(st.fetch_prefix(names)) == 5


def test_unavailable_store_says_why_once_and_misses(monkeypatch):
    monkeypatch.setattr(mc, "store_unavailable", lambda: "Mooncake Store cannot start: its client is not installed")
    monkeypatch.setattr(rm, "_SAID", set())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        tiers = [RemoteTier("127.0.0.1:1", "http://127.0.0.1:1/metadata", model="m", dtype=torch.float32,
                            block_shape=SHAPE) for _ in range(3)]
    said = [w for w in seen if "cannot start" in str(w.message)]
    assert len(said) == 1 and "keeps working" in str(said[0].message)
    t = tiers[0]
    assert not t.enabled and t.prefix([b"x" * 16]) == 0 and t.get_many([b"x" * 16]) == [None]
    assert t.put_many([b"x" * 16], [torch.zeros(SHAPE)]) == 0


class _Stuck:
    """A client whose calls never answer in time."""

    def __init__(self):
        self.calls = 0

    def batch_is_exist(self, keys):
        self.calls += 1
        time.sleep(1.0)
        return [1] * len(keys)

    get_batch = put_batch = remove = batch_is_exist


def test_every_call_is_bounded_and_the_circuit_opens():
    client = _Stuck()
    t = RemoteTier(None, None, model="m", dtype=torch.float32, block_shape=SHAPE, timeout_s=0.1, retry_s=30,
                   client=client)
    assert t.prefix([b"a" * 16]) == 0 and t.stats.timeouts == 1
    assert t.get_many([b"a" * 16]) == [None] and t.put_many([b"a" * 16], [torch.zeros(SHAPE)]) == 0
    assert t.stats.skipped == 2 and client.calls == 1     # no second wait while the circuit is open
    t.close()


def test_the_engine_keeps_working_without_the_store(monkeypatch):
    monkeypatch.setattr(mc, "store_unavailable", lambda: "Mooncake Store cannot start: test")
    model, cfg = load_pretrained()
    shape = (2, cfg.n_layers, 16, cfg.n_kv_heads, cfg.head_dim)
    monkeypatch.setattr(rm, "_SAID", set())
    with pytest.warns(RuntimeWarning, match="keeps working without the remote tier"):
        remote = RemoteTier("127.0.0.1:1", "http://127.0.0.1:1/metadata", model="m", dtype=torch.float32,
                            block_shape=shape)
    store = TieredStore(0, model="m", dtype=torch.float32, block_shape=shape, remote=remote)
    prompt = [4 + (7 * i) % (cfg.vocab_size - 4) for i in range(50)]
    with_store = PagedEngine(model, num_pages=64, page_size=16, store=store)
    plain = PagedEngine(model, num_pages=64, page_size=16)
    assert with_store.generate("a", prompt, 5) == plain.generate("a", prompt, 5)
    assert with_store.stats.fetched_tokens == 0 and with_store.stats.prefill_tokens == 50


def test_ci_fails_rather_than_skips_without_the_store(monkeypatch):
    monkeypatch.setattr(mc, "store_unavailable", lambda: "Mooncake Store cannot start: test")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run the Mooncake Store tests"):
        _require_store()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="cannot start: test"):
        _require_store()


def test_the_store_runs_in_its_own_network_namespace_where_it_may(mooncake):
    assert (mooncake.netns is not None) == mc.netns_available()
    assert mooncake.alive()


def test_start_store_says_why_instead_of_raising(monkeypatch):
    monkeypatch.setattr(mc, "store_unavailable", lambda: "Mooncake Store cannot start: test")
    assert mc.start_store() == (None, "Mooncake Store cannot start: test")


def test_a_closed_tier_misses():
    t = RemoteTier(None, None, model="m", dtype=torch.float32, block_shape=SHAPE, client=_Stuck())
    t.close()
    assert t.prefix([b"a" * 16]) == 0 and t.get_many([b"a" * 16]) == [None]
