"""Host/disk tiers: atomic checksummed files; corrupt, truncated or foreign files are misses."""
import os

import pytest
import torch

from minimax_lab.kvcache.blocks import page_hash
from minimax_lab.kvcache.block_file import read_block_file, write_block_file
from minimax_lab.kvcache.cost import LLAMA3_70B, M3_LAYER, MINIMAX_M2, break_even
from minimax_lab.kvcache.tiers import TieredStore
from minimax_lab.model.config import tiny_model_shape


def _blocks(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {page_hash(None, [i, seed]): torch.randn(2, 3, 4, 2, 8, generator=g) for i in range(n)}


def test_roundtrip_and_spill_order(tmp_path):
    blocks = _blocks(5)
    st = TieredStore(host_blocks=2, disk_dir=tmp_path, model="test", pin_memory=False)
    for n, t in blocks.items():
        st.spill(n, t)
    assert len(st.host) == 2 and st.stats.spills_disk == 3
    assert len(list(tmp_path.glob("*.kv"))) == 3 and not list(tmp_path.glob("*.tmp"))
    st.prefetch(list(blocks))
    for n, t in blocks.items():
        got = st.fetch(n)
        assert got is not None and torch.equal(got, t)
    assert st.stats.host_hits == 2 and st.stats.disk_hits == 3
    assert st.fetch(page_hash(None, [99])) is None
    st.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign", "garbage", "empty"])
def test_damaged_file_is_a_miss(tmp_path, damage):
    blocks = _blocks(3, seed=1)
    names = list(blocks)
    st = TieredStore(host_blocks=0, disk_dir=tmp_path, model="test", pin_memory=False)
    for n, t in blocks.items():
        st.spill(n, t)
    victim = st.path_for(names[1])
    data = bytearray(victim.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) - 17]
    elif damage == "foreign":                  # a valid file, but for another block
        data = bytearray(st.path_for(names[0]).read_bytes())
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    else:
        data = bytearray()
    victim.write_bytes(bytes(data))
    assert read_block_file(victim, names[1], model="test") is None
    st.prefetch(names)
    got = [st.fetch(n) for n in names]
    assert got[1] is None and st.stats.rejected_files == 1 and st.stats.misses == 1
    assert torch.equal(got[0], blocks[names[0]]) and torch.equal(got[2], blocks[names[2]])
    assert not victim.exists()               # the bad file was dropped
    assert st.fetch(names[1]) is None        # and stays a miss
    st.close()


def test_write_is_atomic_and_dtypes(tmp_path):
    n = page_hash(None, [1])
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        t = torch.randn(3, 5).to(dt)
        write_block_file(tmp_path / "x.kv", n, t)
        got = read_block_file(tmp_path / "x.kv", n)
        assert got.dtype == dt and torch.equal(got, t)
    assert not list(tmp_path.glob("*.tmp"))


def test_break_even_numbers():
    m2 = break_even(MINIMAX_M2, link_gbps=55, gpu_tflops=700, context=32_768)
    # 2 (K,V) * 62 layers * 8 heads * 128 * 2 bytes = 253,952 bytes per token
    assert m2["kv_bytes_per_token"] == 253_952
    assert m2["t_fetch_s"] == pytest.approx(253_952 / 55e9)
    tiny = break_even(tiny_model_shape(), link_gbps=55, gpu_tflops=700)
    assert tiny["kv_bytes_per_token"] < m2["kv_bytes_per_token"]
    assert m2["fetch_wins"] and m2["ratio"] > tiny["ratio"]


def test_host_tier_is_lru_and_keeps_copies(tmp_path):
    st = TieredStore(host_blocks=2, disk_dir=tmp_path, model="test", pin_memory=False)
    a, b, c = (page_hash(None, [i]) for i in range(3))
    ta = torch.ones(3)
    st.spill(a, ta)
    st.spill(b, torch.zeros(3))
    ta += 1                                          # the store kept a copy
    assert torch.equal(st.fetch(a), torch.ones(3))   # a is now the most recently used
    st.spill(c, torch.full((3,), 2.0))               # so b is the one written to disk
    assert list(st.host) == [a, c] and st.path_for(b).exists() and not st.path_for(a).exists()
    assert torch.equal(st.fetch(b), torch.zeros(3)) and st.stats.disk_hits == 1
    st.close()


def test_prefetch_reads_in_the_background(tmp_path, monkeypatch):
    import builtins
    import threading

    import minimax_lab.kvcache.tiers as tiers
    st = TieredStore(host_blocks=0, disk_dir=tmp_path, model="test", pin_memory=False)
    n = page_hash(None, [1])
    st.spill(n, torch.arange(6.0))
    started, release = threading.Event(), threading.Event()

    def slow_open(f, mode="r", *a, **k):             # a disk that answers only when told to
        if "r" in mode:
            started.set()
            assert release.wait(10)
        return builtins.open(f, mode, *a, **k)

    monkeypatch.setattr(tiers, "open", slow_open, raising=False)
    st.prefetch([n])                                 # returns while the read waits
    assert started.wait(10) and not release.is_set()
    release.set()
    assert torch.equal(st.fetch(n), torch.arange(6.0)) and st.stats.disk_hits == 1
    st.close()


def test_threads_share_a_store(tmp_path):
    """Four threads spill and fetch overlapping blocks: every hit is the block spilled under its name."""
    import threading
    st = TieredStore(host_blocks=3, disk_dir=tmp_path, model="test", pin_memory=False)
    names = [page_hash(None, [i]) for i in range(12)]
    value = {n: torch.full((2, 4), float(i)) for i, n in enumerate(names)}
    errors, spilled = [], set()

    def work(seed):
        import random
        rng = random.Random(seed)
        try:
            for _ in range(150):
                n = rng.choice(names)
                if rng.random() < 0.5:
                    st.spill(n, value[n])
                    spilled.add(n)
                else:
                    got = st.fetch(n)
                    assert got is None or torch.equal(got, value[n])
        except Exception as e:                       # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert st.stats.write_errors == 0 and st.stats.rejected_files == 0
    for n in spilled:                                # nothing spilled was lost
        assert torch.equal(st.fetch(n), value[n])
    st.close()


def test_for_pages_round_trip_on_the_runtime_device(tmp_path):
    """Blocks of a pool on the runtime's device (a GPU when there is one) spill and come back exactly;
    with a GPU present the host tier uses pinned memory."""
    from minimax_lab.kvcache.blocks import BlockManager, KVPages
    from minimax_lab.runtime import device
    kv = KVPages.allocate(2, 3, 4, 2, 8, dtype=torch.bfloat16, device=device())
    kv.k.normal_()
    kv.v.normal_()
    st = TieredStore.for_pages(kv, host_blocks=1, disk_dir=tmp_path, model="test")
    assert st.dtype == torch.bfloat16 and st.block_shape == kv.block_shape
    assert st.pin == torch.cuda.is_available()
    m = BlockManager(3, 4, kv=kv, on_evict=st.on_evict_hook(kv))
    blocks = {}
    for i in range(3):                                # three prompts with one full page each
        m.allocate(i, [i] * 4 + [9])
        blocks[page_hash(None, [i] * 4)] = kv.page_block(m.seqs[i].pages[0]).cpu()
        m.free(i)
    m.evict(len(m.policy))                            # every cached page spilled: 1 on the host, 2 on disk
    assert st.stats.spills_host == 3 and st.stats.spills_disk == 2
    for n, b in blocks.items():
        got = st.fetch(n)
        assert got is not None and torch.equal(got, b) and got.device.type == "cpu"
        if n in st.host:
            assert got.is_pinned() == torch.cuda.is_available()
        kv.load_block(0, got.to(kv.k.device))
        assert torch.equal(kv.page_block(0).cpu(), b)
    with pytest.raises(ValueError, match="shape"):
        st.spill(page_hash(None, [7]), torch.zeros(2, 2, 4, 2, 7, dtype=torch.bfloat16))
    st.close()


def test_bandwidth_needs_a_gpu():
    from minimax_lab.bench.suite_kvcache_tiers import measure_host_device_bandwidth
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            measure_host_device_bandwidth()
        return
    got = measure_host_device_bandwidth(8 * 2**20, repeats=2)
    assert sorted(got) == ["d2h_pageable", "d2h_pinned", "h2d_pageable", "h2d_pinned"]
    assert all(v > 0 for v in got.values())


def test_prefill_flops_and_break_even_by_hand():
    from minimax_lab.kvcache.cost import LayerShape
    s = LayerShape("toy", n_layers=1, d_model=4, n_heads=2, n_kv_heads=1, head_dim=2, ffn_flops_per_token=10,
                   dtype_bytes=2)
    # projections 2*4*(2*2 + 2*1*2) + 2*2*2*4 = 96, attention 2*2*2*2*3 = 48, FFN 10
    assert s.prefill_flops_per_token(3) == 96 + 48 + 10
    assert s.kv_bytes_per_token() == 2 * 1 * 1 * 2 * 2
    r = break_even(MINIMAX_M2, link_gbps=20, gpu_tflops=500, context=4096, mfu=0.4)
    at = break_even(MINIMAX_M2, link_gbps=r["break_even_gbps"], gpu_tflops=500, context=4096, mfu=0.4)
    assert at["t_fetch_s"] == pytest.approx(at["t_recompute_s"])       # the two cost the same there
    assert r["ratio"] == pytest.approx(r["t_recompute_s"] / r["t_fetch_s"])
    assert r["fetch_wins"] == (r["t_fetch_s"] < r["t_recompute_s"])


def test_fetch_prefix_walks_host_then_disk_and_stops_at_the_first_miss(tmp_path):
    shape = (2, 1, 4, 1, 2)
    st = TieredStore(1, tmp_path, model="m", dtype=torch.float32, block_shape=shape)
    names = [page_hash(None, [i]) for i in range(4)]
    blocks = [torch.full(shape, float(i)) for i in range(4)]
    for n, b in zip(names[:3], blocks[:3]):
        st.spill(n, b)                                    # host holds the last; disk the first two
    got = st.fetch_prefix(names[:2] + names[3:] + names[2:3])
    assert [int(t[0, 0, 0, 0, 0]) for t in got] == [0, 1]  # names[3] was never spilled: stop there
    assert st.publish(names, blocks) == 0                 # no remote pool: nothing published
    assert st.stats.disk_hits == 2 and st.stats.misses == 1


def test_span_flops_sum_the_per_token_flops_and_sparse_attention_caps_them():
    for shape in (LLAMA3_70B, M3_LAYER, MINIMAX_M2):
        for a, b in ((0, 1), (5, 300), (1000, 5000)):
            want = sum(shape.prefill_flops_per_token(p) for p in range(a, b))
            assert shape.prefill_flops(a, b) == pytest.approx(want, rel=1e-9)
        assert shape.prefill_flops(7, 7) == 0
    assert LLAMA3_70B.kv_bytes_per_token() == 320 * 1024                 # Mooncake's Table 1
    # past its 2,048 attended tokens, an M3 layer's token costs the same attention (plus the indexer)
    step = M3_LAYER.prefill_flops_per_token(9000) - M3_LAYER.prefill_flops_per_token(8000)
    assert step == 2 * M3_LAYER.n_kv_heads * M3_LAYER.index_dim * 1000
