"""The KV cache under faults: disk full, directory removed, permission denied, concurrent writer
processes, lying files, hash collisions. Nothing is corrupted, nothing wrong is served.

Faults are injected by replacing the ``open`` the tiers and block-file modules use (a fault-injecting opener), so
no real full disk is needed; concurrent writers are real processes sharing one directory.
``MINIMAX_LAB_FAULT_EXAMPLES`` scales the state-machine run (default: about 4,000 steps).
"""
import builtins
import errno
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, OrderedDict
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

import minimax_lab.kvcache.blocks as blocks
import minimax_lab.kvcache.block_file as block_file
import minimax_lab.kvcache.tiers as tiers
from minimax_lab.kvcache.blocks import BlockManager, KVPages, PoolExhausted, page_hash
from minimax_lab.kvcache.block_file import read_block_file, write_block_file
from minimax_lab.kvcache.tiers import TieredStore

REPO = Path(__file__).resolve().parents[2]


# ---- a fault-injecting opener ------------------------------------------------------------------

class _FileProxy:
    """A file that passes everything on; subclasses change one behaviour."""

    def __init__(self, f):
        self.f = f

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


class _TornWriter(_FileProxy):
    """A file whose writes stop with ENOSPC after ``limit`` bytes (a disk filling up mid-write)."""

    def __init__(self, f, limit):
        super().__init__(f)
        self.limit = limit

    def write(self, b):
        room = max(0, self.limit - self.f.tell())
        if len(b) > room:
            self.f.write(b[:room])
            self.f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.f.write(b)


class FaultyOpen:
    """Stands in for ``open`` in ``minimax_lab.kvcache.tiers`` and ``.block_file``. ``mode`` picks the fault:
    ``None`` (none), ``"enospc"`` (disk full at open), ``"torn"`` (disk full mid-write, a partial
    temporary file left behind), ``"eacces"`` (permission denied), ``"eio_read"`` (reads fail)."""

    WRITE_FAULTS = ("enospc", "torn", "eacces")

    def __init__(self):
        self.mode = None

    def __call__(self, file, mode="r", *args, **kw):
        writing = any(c in mode for c in "wxa+")
        if writing and self.mode == "enospc":
            raise OSError(errno.ENOSPC, "No space left on device", str(file))
        if writing and self.mode == "eacces":
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        if not writing and self.mode == "eio_read":
            raise OSError(errno.EIO, "Input/output error", str(file))
        f = builtins.open(file, mode, *args, **kw)
        return _TornWriter(f, limit=20) if writing and self.mode == "torn" else f


@pytest.fixture
def faults(monkeypatch):
    f = FaultyOpen()
    for module in (tiers, block_file):
        monkeypatch.setattr(module, "open", f, raising=False)
    return f


def _fast_dir(prefix):
    """A fresh directory, in memory when the machine has /dev/shm (fsync there costs nothing)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


# ---- KV values that are a function of the token prefix ---------------------------------------
# A token's K is a number computed from the whole prefix up to it (as real KV is), V = -K. So a
# block served for the wrong prefix -- or the wrong model -- has different bytes.

def _prefix_value(tokens) -> float:
    h = 7
    for t in tokens:
        h = (h * 131 + t + 1) % 1_000_003
    return float(h)                      # exact in fp32 (< 2**24)


def make_block(prefix_tokens, page_size, model_offset=0.0) -> torch.Tensor:
    """The block ``[2, 1, page_size, 1, 2]`` of the last page of ``prefix_tokens``."""
    n = len(prefix_tokens)
    k = torch.tensor([[_prefix_value(prefix_tokens[:i + 1]) + model_offset, i] for i in range(n - page_size, n)])
    k = k.view(1, page_size, 1, 2)
    return torch.stack([k, -k])


# ---- findings of the fault review, one test each -----------------------------------------------

def test_disk_full_during_allocate_keeps_pool_consistent(tmp_path, faults):
    """Disk full while a page is evicted: allocate succeeds, the block is dropped cleanly."""
    kv = KVPages.allocate(1, 2, 2, 1, 2)
    store = TieredStore.for_pages(kv, host_blocks=0, disk_dir=tmp_path, model="m", pin_memory=False)
    m = BlockManager(2, 2, kv=kv, on_evict=store.on_evict_hook(kv))
    m.allocate("a", [1, 2, 3])
    m.free("a")                                      # page [1, 2] cached, page of [3] free
    faults.mode = "enospc"
    assert m.allocate("b", [5, 6, 7]) == 0           # needs both pages: evicts [1, 2], whose write fails
    m.check_invariants()
    assert store.stats.write_errors == 1 and store.stats.spills_disk == 0
    assert not list(tmp_path.iterdir())             # no temporary file left
    assert store.fetch(page_hash(None, [1, 2])) is None
    store.close()


@pytest.mark.parametrize("fault", ["enospc", "torn", "eacces"])
def test_a_failed_write_drops_the_block_cleanly(tmp_path, faults, fault):
    """spill does not raise; the block is counted and gone; no temporary file; the next write works."""
    store = TieredStore(0, tmp_path, model="m", pin_memory=False)
    a, b = page_hash(None, [1]), page_hash(None, [2])
    faults.mode = fault
    store.spill(a, torch.ones(64))
    assert store.stats.write_errors == 1 and store.stats.spills_disk == 0
    assert list(tmp_path.iterdir()) == [] and store.fetch(a) is None
    faults.mode = None
    store.spill(b, torch.ones(64))
    assert torch.equal(store.fetch(b), torch.ones(64)) and [p.suffix for p in tmp_path.iterdir()] == [".kv"]
    store.close()


def test_a_failed_write_leaves_the_earlier_file(tmp_path, faults):
    n = page_hash(None, [1])
    write_block_file(tmp_path / "x.kv", n, torch.ones(64), model="m")
    faults.mode = "torn"
    with pytest.raises(OSError):
        write_block_file(tmp_path / "x.kv", n, torch.zeros(64), model="m")
    faults.mode = None
    assert torch.equal(read_block_file(tmp_path / "x.kv", n, model="m"), torch.ones(64))
    assert [p.name for p in tmp_path.iterdir()] == ["x.kv"]


def test_a_removed_directory_is_made_again(tmp_path):
    d = tmp_path / "tier"
    store = TieredStore(0, d, model="m", pin_memory=False)
    shutil.rmtree(d)
    n = page_hash(None, [1])
    store.spill(n, torch.ones(4))
    assert store.stats.write_errors == 0 and torch.equal(store.fetch(n), torch.ones(4))
    store.close()


def test_an_unreadable_file_is_a_miss_and_is_kept(tmp_path, faults):
    store = TieredStore(0, tmp_path, model="m", pin_memory=False)
    n = page_hash(None, [1])
    store.spill(n, torch.ones(4))
    faults.mode = "eio_read"
    assert store.fetch(n) is None and store.stats.read_errors == 1 and store.stats.rejected_files == 0
    faults.mode = None
    assert torch.equal(store.fetch(n), torch.ones(4))
    store.close()


_GOOD_FILE = []   # the bytes of one good block file, written once


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_reading_any_damage_gives_the_block_or_a_miss(data):
    """Flip, cut, extend or overwrite bytes of a block file anywhere: reading never raises, and
    returns the original block or None."""
    n = page_hash(None, [1])
    t = torch.arange(24, dtype=torch.float32).view(2, 3, 4)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "x.kv"
        if not _GOOD_FILE:
            write_block_file(path, n, t, model="m")
            _GOOD_FILE.append(path.read_bytes())
        raw = bytearray(_GOOD_FILE[0])
        for _ in range(data.draw(st.integers(1, 3))):
            kind = data.draw(st.sampled_from(["flip", "cut", "extend", "overwrite"]))
            at = data.draw(st.integers(0, max(0, len(raw) - 1)))
            if kind == "flip" and raw:
                raw[at] ^= data.draw(st.integers(1, 255))
            elif kind == "cut":
                del raw[at:at + data.draw(st.integers(1, 64))]
            elif kind == "extend":
                raw[at:at] = data.draw(st.binary(min_size=1, max_size=16))
            else:
                chunk = data.draw(st.binary(min_size=1, max_size=16))
                raw[at:at + len(chunk)] = chunk
        path.write_bytes(bytes(raw))
        got = read_block_file(path, n, model="m")
    assert got is None or torch.equal(got, t)


@pytest.mark.parametrize("where", ["allocate", "append", "evict"])
def test_failing_evict_hook_rolls_back(where):
    """A hook that raises: the page stays cached, the caller's call fails, nothing else changes."""
    calls = []

    def hook(name, page, tokens):
        calls.append(tokens)
        raise RuntimeError("tier broke")

    m = BlockManager(3, 2, on_evict=hook)
    m.allocate("a", [1, 2, 3])
    m.free("a")                                      # one cached page, two free
    m.allocate("b", [1, 2, 9])                       # shares the cached page, takes one free page
    m.allocate("c", [4])                             # takes the last free page
    m.free("b")
    m.allocate("f", [8])                             # no free page left: the next page needs an eviction
    m.append("c", 5)                                 # c's page is full now
    before = (dict(m.cached), list(m.refcount), sorted(m.free_pages), {s: (list(q.tokens), list(q.pages)) for s, q in m.seqs.items()})
    with pytest.raises(RuntimeError, match="tier broke"):
        if where == "allocate":
            m.allocate("d", [7, 8, 9])
        elif where == "append":
            m.append("c", 6)
        else:
            m.evict(1)
    m.check_invariants()
    after = (dict(m.cached), list(m.refcount), sorted(m.free_pages), {s: (list(q.tokens), list(q.pages)) for s, q in m.seqs.items()})
    assert after == before and "d" not in m.seqs and calls
    m.free("f")
    assert m.allocate("e", [1, 2, 5]) == 2           # the block is still cached and served


def test_same_name_from_two_threads_never_collides(tmp_path, monkeypatch):
    """Both writers finish their temporary files before either renames: no shared temp name."""
    barrier = threading.Barrier(2)

    class Slow(_FileProxy):
        def __exit__(self, *exc):
            self.f.close()
            barrier.wait(10)

    monkeypatch.setattr(block_file, "open", lambda f, mode="r", *a, **k: Slow(builtins.open(f, mode, *a, **k))
                        if "x" in mode or "w" in mode else builtins.open(f, mode, *a, **k), raising=False)
    t, n, errors = torch.randn(4, 4), page_hash(None, [1]), []

    def write():
        try:
            write_block_file(tmp_path / "x.kv", n, t, model="m")
        except Exception as e:               # noqa: BLE001 -- collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=write) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert torch.equal(read_block_file(tmp_path / "x.kv", n, model="m"), t)
    assert [p.name for p in tmp_path.iterdir()] == ["x.kv"]


_WRITER = r"""
import os, sys, time
from pathlib import Path
import torch
from minimax_lab.kvcache.blocks import page_hash
from minimax_lab.kvcache.tiers import TieredStore
d, model, seconds, go = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), Path(sys.argv[4])
st = TieredStore(0, d, model=model, pin_memory=False)
blocks = [torch.full((2, 1, 256, 1, 32), float(i)) for i in range(2)]   # 64 KiB each
(go.parent / f"ready.{os.getpid()}").touch()
while not go.exists():
    time.sleep(0.001)
end, i = time.monotonic() + seconds, 0
while time.monotonic() < end:           # two names over and over, for as long as the others write too
    st.spill(page_hash(None, [i % 2]), blocks[i % 2])
    i += 1
print(st.stats.write_errors, st.stats.spills_disk, i)
"""


def _start_writers(d, go, model, seconds, n_procs):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return [subprocess.Popen([sys.executable, "-c", _WRITER, str(d), model, str(seconds), str(go)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for _ in range(n_procs)]


def test_concurrent_writer_processes_lose_nothing():
    """Three processes spill the same two blocks over and over into one directory for the same
    second (with one shared temporary name, some of these writes failed every time): no write
    fails, every file is whole, no temporary file is left behind."""
    root = _fast_dir("kv-writers-")
    go, d = root / "go", root / "tier"
    try:
        procs = _start_writers(d, go, "m", 1.0, 3)
        deadline = time.monotonic() + 120
        while len(list(root.glob("ready.*"))) < 3 and time.monotonic() < deadline:   # all set up: start together
            time.sleep(0.02)
        go.touch()
        total = 0
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            write_errors, spilled, calls = map(int, out.split())
            assert write_errors == 0 and spilled == calls > 0
            total += calls
        assert total > 100
        assert sorted(p.suffix for p in d.iterdir()) == [".kv"] * 2
        st = TieredStore(0, d, model="m", pin_memory=False)
        for i in range(2):
            assert torch.equal(st.fetch(page_hash(None, [i])), torch.full((2, 1, 256, 1, 32), float(i)))
        assert st.stats.rejected_files == 0
        st.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _forge_header(path, **change):
    """Rewrite a block file's header fields, with a valid checksum over the lie."""
    data = path.read_bytes()
    (hlen,) = struct.unpack("<I", data[8:12])
    header = json.loads(data[12:12 + hlen])
    payload = data[12 + hlen:-32]
    header.update(change)
    h = json.dumps(header).encode()
    path.write_bytes(data[:8] + struct.pack("<I", len(h)) + h + payload
                     + hashlib.blake2b(h + payload, digest_size=32).digest())


@pytest.mark.parametrize("lie", [dict(nbytes="64"), dict(nbytes=True), dict(nbytes=-1), dict(shape=[3, 3]),
                                 dict(shape=[-4, -4]), dict(shape="xx"), dict(shape=[4, 4.0]),
                                 dict(dtype="int64", shape=[4, 4]), dict(dtype="Tensor"), dict(dtype=5),
                                 dict(dtype="float64"), dict(model="other"), dict(hash="00" * 16)])
def test_lying_header_is_a_miss(tmp_path, lie):
    """A file whose checksum is right but whose header lies is a miss, never an exception."""
    store = TieredStore(0, tmp_path, model="m", pin_memory=False)
    n = page_hash(None, [1])
    store.spill(n, torch.randn(4, 4))
    _forge_header(store.path_for(n), **lie)
    assert read_block_file(store.path_for(n), n, model="m") is None
    assert store.fetch(n) is None
    assert store.stats.rejected_files == 1 and store.stats.misses == 1
    assert not store.path_for(n).exists()
    store.close()


def test_header_length_beyond_the_file_is_a_miss(tmp_path):
    n = page_hash(None, [1])
    write_block_file(tmp_path / "x.kv", n, torch.randn(4), model="m")
    data = bytearray((tmp_path / "x.kv").read_bytes())
    data[8:12] = struct.pack("<I", 2**31)
    (tmp_path / "x.kv").write_bytes(bytes(data))
    assert read_block_file(tmp_path / "x.kv", n, model="m") is None


def test_directory_shared_by_two_models(tmp_path):
    """Two models, same block names, one directory: each only ever gets its own blocks."""
    a = TieredStore(0, tmp_path, model="model-a", pin_memory=False)
    b = TieredStore(0, tmp_path, model="model-b", pin_memory=False)
    n = page_hash(None, [1, 2])
    a.spill(n, torch.ones(2, 2))
    assert b.fetch(n) is None and b.stats.rejected_files == 0      # a different file, not a rejected one
    b.spill(n, torch.zeros(2, 2))
    assert torch.equal(a.fetch(n), torch.ones(2, 2)) and torch.equal(b.fetch(n), torch.zeros(2, 2))
    # the same model with another dtype or block shape is another format: its own files too
    c = TieredStore(0, tmp_path, model="model-a", dtype=torch.float16, block_shape=(2, 2), pin_memory=False)
    assert c.fetch(n) is None
    with pytest.raises(ValueError, match="float16"):
        c.spill(n, torch.ones(2, 2))
    with pytest.raises(ValueError, match="shape"):
        c.spill(n, torch.ones(2, 3, dtype=torch.float16))
    with pytest.raises(ValueError, match="model="):
        TieredStore(0, tmp_path)
    for s in (a, b, c):
        s.close()


def _colliding_hash(parent, tokens):
    """A deliberately weak page hash: the order of a page's tokens does not matter."""
    return hashlib.blake2b((parent or b"root") + repr(sorted(int(t) for t in tokens)).encode(), digest_size=16).digest()


def test_hash_collision_never_serves_a_page_computed_for_another_prefix(monkeypatch):
    """The docstring's promise, under a hash that collides: a hit proves the whole token prefix."""
    monkeypatch.setattr(blocks, "page_hash", _colliding_hash)
    kv = KVPages.allocate(1, 8, 2, 1, 2)
    m = BlockManager(8, 2, kv=kv)
    m.allocate("s", [1, 2, 5, 6, 9])
    m.free("s")
    m.pin([1, 2, 5, 6])
    m.unpin([1, 2])
    m.evict(1)                                     # the parent page [1, 2] goes, its child [5, 6] stays
    assert m.allocate("s2", [2, 1, 9]) == 0        # [2, 1] has the name [1, 2] had
    assert m.allocate("r", [2, 1, 5, 6, 0]) == 2   # page [5, 6] was computed after [1, 2]: not served
    m.check_invariants()
    # and one page: equal names, different tokens
    m2 = BlockManager(4, 2)
    m2.allocate("a", [1, 2, 3])
    assert m2.allocate("b", [2, 1, 3]) == 0
    m2.check_invariants()


def test_recached_parent_still_reaches_its_children():
    """Verification is exact, not stricter than needed: after a parent page is evicted and computed
    again, its still-cached child is found through the new parent."""
    m = BlockManager(8, 2)
    m.allocate("s", [1, 2, 5, 6, 9])
    m.free("s")
    m.pin([1, 2, 5, 6])
    m.unpin([1, 2])
    m.evict(1)
    m.allocate("again", [1, 2, 7])                 # the parent is computed and cached again
    m.free("again")
    assert m.allocate("r", [1, 2, 5, 6, 0]) == 4
    m.check_invariants()


# ---- a state machine: the pool, the tiers and faults -------------------------------------------

PS, NP, VOCAB = 2, 6, 3
EXAMPLES = int(os.environ.get("MINIMAX_LAB_FAULT_EXAMPLES", "100"))
STEPS = 50
TOTALS = Counter()       # what the state machine exercised, summed over all examples


_BACKGROUND = r"""
import sys, random
from pathlib import Path
import torch
sys.path.insert(0, sys.argv[3])
from tests.kvcache.test_kvcache_faults import PS, VOCAB, make_block
from minimax_lab.kvcache.blocks import page_hash
from minimax_lab.kvcache.tiers import TieredStore
d, stop = Path(sys.argv[1]), Path(sys.argv[2])
mine = TieredStore(0, d, model="m", dtype=torch.float32, block_shape=(2, 1, PS, 1, 2), pin_memory=False)
other = TieredStore(0, d, model="other", dtype=torch.float32, block_shape=(2, 1, PS, 1, 2), pin_memory=False)
rng = random.Random(0)
while not stop.exists():
    toks = [rng.randrange(VOCAB) for _ in range(PS * rng.randint(1, 3))]
    name = None
    for i in range(0, len(toks), PS):
        name = page_hash(name, toks[i:i + PS])
    mine.spill(name, make_block(toks, PS))               # the same bytes the machine's pool holds
    other.spill(name, make_block(toks, PS, 1000.0))      # another model's block under the same name
"""


@pytest.fixture(scope="module")
def shared_tier():
    """A tier directory with another process writing into it for as long as the tests run."""
    d = _fast_dir("kv-fault-tier-")
    stop = d.parent / (d.name + ".stop")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", _BACKGROUND, str(d), str(stop), str(Path(__file__).resolve().parents[2])],
                            stderr=subprocess.PIPE, text=True, env=env)
    yield d
    stop.touch()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    shutil.rmtree(d, ignore_errors=True)
    stop.unlink()


class TierFaultMachine(RuleBasedStateMachine):
    """Sequences come and go on a small pool; evicted pages spill to a host tier of two blocks and a
    disk tier that another process writes to as well, while faults come and go. After every step:
    the pool's invariants hold, every page holds its prefix's values, every block the tiers serve
    has exactly the bytes spilled for its name, and no spilled block is missing unless a fault
    explains it (its write failed, its directory was removed, reads fail)."""

    tier_dir: Path = None        # set by the test

    def __init__(self):
        super().__init__()
        self.faults = FaultyOpen()
        self.real_open = {m: getattr(m, "open", None) for m in (tiers, block_file)}
        for m in self.real_open:
            m.open = self.faults
        self.kv = KVPages.allocate(1, NP, PS, 1, 2)
        self.store = TieredStore.for_pages(self.kv, host_blocks=2, disk_dir=self.tier_dir, model="m",
                                           pin_memory=False)
        self.hook_fails = False
        self.m = BlockManager(NP, PS, kv=self.kv, on_evict=self._on_evict, policy="agent")
        self.prefix_of: dict[bytes, list] = {}       # every name ever spilled -> its token prefix
        self.host = OrderedDict()                    # model of the host tier (LRU of names)
        self.on_disk: set[bytes] = set()             # names whose file this store wrote
        self.next_id = 0

    # the hook: check the page still holds its prefix's values, then spill (or fail, when told)
    def _on_evict(self, name, page, tokens):
        if self.hook_fails:
            TOTALS["hook_failures"] += 1
            raise RuntimeError("hook failed")
        prefix = self.m.page_prefix[page].all_tokens()
        assert torch.equal(self.kv.page_block(page), make_block(prefix, PS)), "evicted page lost its values"
        self.prefix_of[name] = prefix
        self.store.on_evict_hook(self.kv)(name, page, tokens)
        self.host[name] = True
        self.host.move_to_end(name)
        while len(self.host) > 2:
            old, _ = self.host.popitem(last=False)
            if self.faults.mode not in FaultyOpen.WRITE_FAULTS:
                self.on_disk.add(old)

    def _fill(self, sid, start):
        seq = self.m.seqs[sid]
        for pos in range(start, len(seq.tokens)):
            v = torch.tensor([_prefix_value(seq.tokens[:pos + 1]), pos])
            slot = seq.pages[pos // PS] * PS + pos % PS
            self.kv.k[0].view(-1, 1, 2)[slot] = v
            self.kv.v[0].view(-1, 1, 2)[slot] = -v

    def teardown(self):
        st = self.store.stats
        TOTALS.update(examples=1, host_hits=st.host_hits, disk_hits=st.disk_hits, write_errors=st.write_errors,
                      read_errors=st.read_errors, spills_disk=st.spills_disk, spills_host=st.spills_host)
        self.store.close()
        for m, real in self.real_open.items():
            if real is None:
                del m.open
            else:
                m.open = real

    @rule(tokens=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=9))
    def allocate(self, tokens):
        sid = self.next_id
        self.next_id += 1
        before = self._snapshot()
        # pages allocate takes before it may need an eviction: cached prefix pages and free pages
        taken = len(self.m.lookup(tokens, max_pages=(len(tokens) - 1) // PS)) + len(self.m.free_pages)
        try:
            cached = self.m.allocate(sid, tokens)
        except PoolExhausted:
            self._rolled_back(before)
            return
        except RuntimeError as e:
            assert self.hook_fails and "hook failed" in str(e)
            self._rolled_back(before)
            TOTALS["rollbacks_after_taking_pages"] += taken > 0
            return
        self._fill(sid, cached)

    @rule(tokens=st.lists(st.integers(0, VOCAB - 1), min_size=PS + 1, max_size=9))
    def allocate_while_the_hook_fails(self, tokens):
        """The rollback path, often: a prompt of several pages while every eviction fails."""
        saved, self.hook_fails = self.hook_fails, True
        try:
            self.allocate(tokens)
        finally:
            self.hook_fails = saved

    @precondition(lambda self: self.m.seqs)
    @rule(data=st.data(), token=st.integers(0, VOCAB - 1))
    def append(self, data, token):
        sid = data.draw(st.sampled_from(sorted(self.m.seqs)))
        before = self._snapshot()
        try:
            self.m.append(sid, token)
        except PoolExhausted:
            self._rolled_back(before)
            return
        except RuntimeError:
            assert self.hook_fails
            self._rolled_back(before)
            return
        self._fill(sid, len(self.m.seqs[sid].tokens) - 1)

    @precondition(lambda self: self.m.seqs)
    @rule(data=st.data())
    def free(self, data):
        self.m.free(data.draw(st.sampled_from(sorted(self.m.seqs))))

    @precondition(lambda self: self.m.seqs)
    @rule(data=st.data())
    def fork(self, data):
        sid = data.draw(st.sampled_from(sorted(self.m.seqs)))
        self.m.fork(sid, self.next_id)
        self.next_id += 1

    @rule(fault=st.sampled_from([None, None, "enospc", "torn", "eacces", "eio_read", "hook", "hook", "remove_directory"]))
    def set_fault(self, fault):
        """Faults come and go; a removed directory is a one-off (the next write makes it again)."""
        if fault == "remove_directory":
            TOTALS["directories_removed"] += 1
            shutil.rmtree(self.tier_dir, ignore_errors=True)
            self.on_disk.clear()
            return
        self.hook_fails = fault == "hook"
        self.faults.mode = None if fault == "hook" else fault

    @rule()
    def evict(self):
        try:
            self.m.evict(1)
        except PoolExhausted:
            assert len(self.m.policy) == 0
        except RuntimeError:
            assert self.hook_fails

    @precondition(lambda self: self.prefix_of)
    @rule(data=st.data(), prefetch=st.booleans())
    def fetch(self, data, prefetch):
        names = data.draw(st.lists(st.sampled_from(sorted(self.prefix_of)), min_size=1, max_size=3, unique=True))
        if prefetch:
            self.store.prefetch(names)
        for n in names:
            got = self.store.fetch(n)
            TOTALS["fetches"] += 1
            if got is None:
                assert n not in self.host, "a host-tier block was lost"
                assert n not in self.on_disk or self.faults.mode == "eio_read", "a block written to disk was lost"
            else:
                assert torch.equal(got, make_block(self.prefix_of[n], PS)), "a tier served wrong bytes"
                if n in self.host:
                    self.host.move_to_end(n)

    @rule(tokens=st.lists(st.integers(0, VOCAB - 1), min_size=PS, max_size=3 * PS))
    def fetch_any(self, tokens):
        """Names this process never spilled may be on disk (the other writer): right bytes or a miss."""
        tokens = tokens[:len(tokens) // PS * PS]
        name = None
        for i in range(0, len(tokens), PS):
            name = page_hash(name, tokens[i:i + PS])
        got = self.store.fetch(name)
        TOTALS["foreign_hits" if got is not None and name not in self.prefix_of else "foreign_lookups"] += 1
        assert got is None or torch.equal(got, make_block(tokens, PS)), "served another model's or prefix's block"
        if got is not None and name in self.host:
            self.host.move_to_end(name)

    def _snapshot(self):
        m = self.m
        return (dict(m.cached), list(m.refcount), {s: (list(q.tokens), list(q.pages)) for s, q in m.seqs.items()})

    def _rolled_back(self, before):
        """A failed call leaves every sequence and reference count as it was; pages it evicted
        before failing stay evicted (spilled, now free); nothing else left the cache."""
        cached, refcount, seqs = self._snapshot()
        assert (refcount, seqs) == (before[1], before[2])
        assert set(cached) <= set(before[0])
        for name in set(before[0]) - set(cached):
            assert name in self.prefix_of and self.m.page_hash[before[0][name]] is None

    @invariant()
    def consistent(self):
        TOTALS["steps"] += 1
        self.m.check_invariants()
        for sid, seq in self.m.seqs.items():             # every page holds its own prefix's values
            got = self.kv.k[0].view(-1, 1, 2)[self.m.slots(sid)][:, 0, 0].tolist()
            assert got == [_prefix_value(seq.tokens[:i + 1]) for i in range(len(seq.tokens))]
        pid = f".{os.getpid()}."
        if self.tier_dir.exists():                       # no temporary file of ours is left behind
            assert not [p for p in self.tier_dir.iterdir() if pid in p.name and p.suffix == ".tmp"]
        assert self.store.stats.rejected_files == 0      # nobody wrote a bad file


def test_tiers_under_faults_state_machine(shared_tier):
    TierFaultMachine.tier_dir = shared_tier
    run_state_machine_as_test(TierFaultMachine, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, derandomize=True,   # same run in CI
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
    print(dict(TOTALS))
    # the run exercised what it claims: thousands of checked steps, every fault, hits from both tiers
    # and from the other process's files
    assert TOTALS["steps"] >= 20 * EXAMPLES
    for what in ("write_errors", "read_errors", "directories_removed", "hook_failures", "rollbacks_after_taking_pages",
                 "host_hits", "disk_hits", "spills_disk", "foreign_hits"):
        assert TOTALS[what] > 0, (what, dict(TOTALS))
