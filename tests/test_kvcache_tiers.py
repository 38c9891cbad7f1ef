"""Host/disk tiers: atomic checksummed files; corrupt, truncated or foreign files are misses."""
import os

import pytest
import torch

from minimax_lab.kvcache.blocks import page_hash
from minimax_lab.kvcache.tiers import (MINIMAX_M2, TieredStore, break_even, read_block_file, tiny_model_shape,
                                       write_block_file)


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
