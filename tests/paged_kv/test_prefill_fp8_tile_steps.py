"""FP8 paged prefill, each of its tile steps (``TILE_STEP`` of the ``paged_prefill_fp8`` launch
block): ``"fp16"`` (tiles in fp16, query rows moved into fp16's range), ``"q_dtype"`` (tiles in the
query's dtype, scales on the score and P columns) and ``"dequantize"`` (the pages dequantized into a
scratch cache, then the kernel of unquantized caches) -- every one against the fp32 reference on the
stored values: ragged prefixes and new-token counts, an empty sequence, both scale layouts, every
query dtype, non-contiguous queries, GQA groups up to 16, values that strain 16-bit ranges,
unchecked tables. Also the scratch of ``"dequantize"`` itself, and the rows a tile packs."""
from __future__ import annotations

import pytest
import torch

from tests.paged_kv.test_paged_fp8 import (LAYOUTS, QDTYPES, ROW_BOUND, _adversarial, _bound, _fp8_paged,
                                           _noncontiguous, _quantized, _row_error)
from tests.support.devices import DEVICE, generator, randn

from minimax_lab.bench.suite_kvcache import random_block_table
from minimax_lab.measure import relative_error
from minimax_lab.paged_kv import prefill_triton
from minimax_lab.paged_kv.layout import dequantize_kv, paged_triton_operands
from minimax_lab.paged_kv.prefill import paged_prefill

STEPS = list(prefill_triton.TILE_STEPS)


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", QDTYPES)
def test_every_tile_step_matches_the_reference(step, layout, dtype):
    g = generator()
    G, Hkv, D, page, S = 2, 2, 16, 16, 7
    lengths = [7, 45, 18, 0]
    k8, v8, ks, vs, bt, lens = _fp8_paged(lengths, page, Hkv, D, layout, g=g)
    q_lens = torch.tensor([7, 5, 1, 0], dtype=torch.int32, device=DEVICE)
    q = _noncontiguous(randn(len(lengths), S, Hkv * G, D, gen=g, dtype=dtype))
    ref = paged_prefill(q.float(), k8, v8, bt, lens, q_lens=q_lens, impl="reference", k_scale=ks, v_scale=vs)
    for block_n in (16, 32):  # tiles inside one page; tiles across pages (one table load per token)
        out = paged_prefill(q, k8, v8, bt, lens, q_lens=q_lens, impl="triton", k_scale=ks, v_scale=vs,
                            config={"TILE_STEP": step, "BLOCK_N": block_n})
        assert out.dtype == dtype and out.shape == q.shape
        assert not out[3].float().any() and not out[1, 5:].float().any()  # padding rows are zeros
        err = relative_error(out.float(), ref)
        assert err < _bound(dtype), (step, layout, dtype, block_n, err)


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("kind,dtype", [("large_queries", torch.bfloat16), ("quiet_token", torch.bfloat16),
                                        ("tiny_values", torch.bfloat16), ("quiet_token", torch.float16)])
def test_every_tile_step_keeps_16_bit_ranges(step, kind, dtype):
    """bf16 queries past fp16's range, a quiet value the output leans on (``2**-32`` of its
    neighbours: far below fp16's subnormals once P is scaled by it; with fp16 queries ``2**-12``, so
    the fp16 output still holds it but P times its scale is an fp16 subnormal), values around
    ``2**-40``: per row within the 16-bit output's rounding of the reference, GQA group 4."""
    g = generator()
    Hkv, G, D, page, S = 2, 4, 32, 16, 6
    lengths = [3 * page + 2, page + 4, 6]
    q1, k, v = _adversarial(kind, page, lengths, Hkv, G, D, g, quiet=2.0 ** (-12 if dtype == torch.float16 else -32))
    k8, v8, ks, vs = _quantized(k, v, "token")
    bt = random_block_table(lengths, page, k.shape[0], DEVICE, g)
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    q_lens = torch.tensor([6, 4, 6], dtype=torch.int32, device=DEVICE)
    # the chunk's queries near the adversarial ones (the quiet key lies along the group's mean query)
    q = (q1[:, None] * (1 + 0.05 * torch.randn(len(lengths), S, 1, 1, generator=g))).to(DEVICE, dtype)
    ref = paged_prefill(q.float(), k8, v8, bt, lens, q_lens=q_lens, impl="reference", k_scale=ks, v_scale=vs)
    assert bool(torch.isfinite(ref).all())
    out = paged_prefill(q, k8, v8, bt, lens, q_lens=q_lens, impl="triton", k_scale=ks, v_scale=vs,
                        config={"TILE_STEP": step})
    assert _row_error(out, ref) < ROW_BOUND[dtype], (step, kind, dtype)


def test_a_tile_packs_at_most_what_its_warps_hold():
    """``BLOCK_M`` tokens x the group's heads, capped at 32 rows per warp at head_dim 128 (an fp32
    accumulator of 128 registers per thread), at least 16 rows."""
    tokens = prefill_triton.tile_tokens
    assert tokens(64, 4, num_warps=8, block_d=128) == 64    # 32/8 heads: 256 rows in 8 warps
    assert tokens(64, 16, num_warps=8, block_d=128) == 16   # 64/4 heads: the same 256 rows
    assert tokens(16, 16, num_warps=4, block_d=128) == 8    # 128 rows in 4 warps
    assert tokens(16, 16, num_warps=4, block_d=64) == 16    # half the head dim, twice the rows
    assert tokens(16, 1, num_warps=4, block_d=128) == 16 and tokens(1, 4, num_warps=4, block_d=128) == 4
    assert tokens(16, 512, num_warps=4, block_d=128) == 1


@pytest.mark.parametrize("step", STEPS)
def test_a_large_group_matches_the_reference(step):
    """GQA 16 (the engine's 64/4 heads) with ``BLOCK_M=64``: the tile shrinks (one warp: 16 tokens,
    256 rows at head_dim 16), and the output still matches the reference."""
    g = generator()
    Hkv, G, D, page, S = 1, 16, 16, 16, 20
    lengths = [40, 20]
    k8, v8, ks, vs, bt, lens = _fp8_paged(lengths, page, Hkv, D, "token", g=g)
    q = randn(2, S, Hkv * G, D, gen=g)
    q_lens = torch.tensor([20, 20], dtype=torch.int32, device=DEVICE)
    ref = paged_prefill(q, k8, v8, bt, lens, q_lens=q_lens, impl="reference", k_scale=ks, v_scale=vs)
    out = paged_prefill(q, k8, v8, bt, lens, q_lens=q_lens, impl="triton", k_scale=ks, v_scale=vs,
                        config={"TILE_STEP": step, "BLOCK_M": 64})
    assert relative_error(out, ref) < _bound(torch.float32), step


@pytest.mark.parametrize("layout", LAYOUTS)
def test_dequantize_pages_writes_the_stored_values_of_the_pages_read(layout):
    """The scratch holds ``cache * scale`` of every token below each sequence's length, through a
    table of its own; a cache strided inside its pool and head-major scales are read in place."""
    g = generator()
    Hkv, D, page = 2, 16, 16
    lengths = [37, 0, 16, 5]
    k8, v8, ks, vs, bt, lens = _fp8_paged(lengths, page, Hkv, D, layout, g=g)
    wide = torch.zeros(*k8.shape[:-1], 2 * D, dtype=k8.dtype, device=DEVICE)
    wide[..., D:] = k8
    k8s = wide[..., D:]
    ks_t = ks.transpose(-1, -2).contiguous().transpose(-1, -2)
    q = randn(len(lengths), 1, 2 * Hkv, D, gen=g)
    _, k8o, v8o, bto, lenso = paged_triton_operands(q, k8s, v8, bt, lens)
    k, v, table = prefill_triton.dequantize_pages(k8o, v8o, ks_t, vs, bto, lenso, torch.float32)
    assert table.dtype == torch.int32 and table.shape == bt.shape and k.shape[0] == bt.numel()
    for cache, scratch, scale in ((k8, k, ks), (v8, v, vs)):
        want = dequantize_kv(cache, scale)
        for b, n in enumerate(lengths):
            for t in range(n):
                got = scratch[table[b, t // page], t % page]
                assert torch.equal(got, want[bt[b, t // page], t % page]), (b, t)


@pytest.mark.parametrize("step", STEPS)
def test_unchecked_out_of_range_tables_stay_in_the_cache(step):
    """``check_values=False`` with page ids past the pool, negative ones and lengths past the table:
    each tile step clamps them; the output is finite (unspecified) and nothing is read outside."""
    g = generator()
    k8, v8, ks, vs, bt, lens = _fp8_paged([40, 20], 16, 2, 16, "token", g=g)
    bt = bt.clone()
    bt[0, 0], bt[1, 1] = k8.shape[0] + 100, -7
    lens = torch.tensor([10_000, 33], dtype=torch.int32, device=DEVICE)
    q = randn(2, 5, 4, 16, gen=g, dtype=torch.bfloat16)
    for k_scale, v_scale in ((ks, vs), (ks[:, 0], vs[:, 0])):
        out = paged_prefill(q, k8, v8, bt, lens, impl="triton", k_scale=k_scale, v_scale=v_scale, check_values=False,
                            config={"TILE_STEP": step, "BLOCK_N": 32})
        assert bool(torch.isfinite(out.float()).all()), step


def test_an_unknown_tile_step_is_refused():
    g = generator()
    k8, v8, ks, vs, bt, lens = _fp8_paged([5], 16, 1, 16, "token", g=g)
    q = randn(1, 2, 2, 16, gen=g)
    with pytest.raises(ValueError, match=r"TILE_STEP must be one of \['dequantize', 'fp16', 'q_dtype'\]"):
        paged_prefill(q, k8, v8, bt, lens, impl="triton", k_scale=ks, v_scale=vs, config={"TILE_STEP": "bf16"})
    with pytest.raises(ValueError, match="unknown config keys"):
        paged_prefill(q.half(), k8.half(), v8.half(), bt, lens, impl="triton", config={"TILE_STEP": "fp16"})
