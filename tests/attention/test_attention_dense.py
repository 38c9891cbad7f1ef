"""Dense attention: the reference against a hand-written loop, and every impl against the
reference on fresh random inputs (ragged sizes, S=1, GQA 1/4/16, causal and not, S > Skv).
Inputs live on the runtime's kernel device; fp32 Triton outputs on a GPU are held to the TF32
tolerance (the kernel's fp32 dots run in TF32 there)."""
from __future__ import annotations

import math

import pytest
import torch

from tests.support.devices import DEVICE, generator, randn, tol
from minimax_lab import runtime
from minimax_lab.attention import attention
from minimax_lab.attention.dense_reference import attention_reference
from minimax_lab.attention.dense_triton import flash_attention
from minimax_lab.measure import relative_error


def _inputs(B, S, Skv, Hq, Hkv, D, dtype=torch.float32, seed=None):
    g = generator(seed)
    return randn(B, S, Hq, D, gen=g, dtype=dtype), randn(B, Skv, Hkv, D, gen=g, dtype=dtype), \
        randn(B, Skv, Hkv, D, gen=g, dtype=dtype)


def _loop_attention(q, k, v, causal, scale):
    """Row by row, in float64 on the CPU, the textbook way: an independent check of the reference."""
    q, k, v = (t.cpu() for t in (q, k, v))
    B, S, Hq, D = q.shape
    Skv, Hkv = k.shape[1], k.shape[2]
    out = torch.zeros(B, S, Hq, D, dtype=torch.float64)
    lse = torch.full((B, Hq, S), -math.inf, dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            for i in range(S):
                last = i + Skv - S if causal else Skv - 1
                if last < 0:
                    continue
                s = [float(q[b, i, h].double() @ k[b, j, hk].double()) * scale for j in range(last + 1)]
                mx = max(s)
                w = [math.exp(x - mx) for x in s]
                tot = sum(w)
                lse[b, h, i] = mx + math.log(tot)
                out[b, i, h] = sum(wj * v[b, j, hk].double() for j, wj in enumerate(w)) / tot
    return out, lse


@pytest.mark.parametrize("S,Skv,Hq,Hkv,causal", [(5, 5, 4, 2, True), (3, 6, 2, 1, True), (6, 3, 2, 2, True),
                                                  (4, 7, 2, 2, False)])
def test_reference_matches_loop(S, Skv, Hq, Hkv, causal):
    q, k, v = _inputs(2, S, Skv, Hq, Hkv, 8)
    o, lse = attention_reference(q, k, v, causal=causal, scale=0.3, return_lse=True)
    ro, rl = _loop_attention(q, k, v, causal, 0.3)
    o, lse = o.cpu(), lse.cpu()
    assert torch.allclose(o.double(), ro, atol=1e-5)
    assert torch.equal(torch.isinf(lse), torch.isinf(rl))
    fin = torch.isfinite(rl)
    assert torch.allclose(lse.double()[fin], rl[fin], atol=1e-5)


SHAPES = [  # B, S, Skv, Hq, Hkv, D, causal
    (1, 37, 37, 4, 1, 32, True),     # ragged S, GQA 4
    (2, 1, 1, 2, 2, 64, True),       # S = 1
    (1, 1, 29, 4, 4, 64, True),      # decode-like: one query sees everything
    (1, 21, 45, 4, 4, 64, True),     # S < Skv: bottom-right causal
    (1, 45, 19, 2, 2, 16, True),     # S > Skv: first 26 rows see nothing -> zeros
    (1, 33, 50, 2, 1, 24, False),    # non-causal, head_dim not a power of two
    (1, 19, 19, 16, 1, 16, True),    # GQA 16
    (1, 18, 18, 16, 16, 128, False),  # Hq = Hkv = 16, D = 128
]


def _check_against_reference(impl, shape, dtype=torch.float32, **kw):
    """``impl`` (or ``flash_attention(**kw)``) against the fp32 reference; the tolerance follows
    ``dtype`` and, for fp32 Triton on a GPU, TF32."""
    B, S, Skv, Hq, Hkv, D, causal = shape
    bound = tol(dtype, tf32=impl == "triton")
    q, k, v = _inputs(B, S, Skv, Hq, Hkv, D, dtype)
    o, lse = (attention(q, k, v, causal=causal, impl=impl, return_lse=True) if not kw else
              flash_attention(q, k, v, causal=causal, return_lse=True, **kw))
    r, rl = attention_reference(q.float(), k.float(), v.float(), causal=causal, return_lse=True)
    assert o.shape == (B, S, Hq, D) and o.dtype == dtype
    assert lse.shape == (B, Hq, S) and lse.dtype == torch.float32
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    assert o.device.type == DEVICE.type
    assert relative_error(o, r) < bound, (impl, shape, relative_error(o, r), bound)
    assert torch.equal(torch.isinf(lse), torch.isinf(rl))
    fin = torch.isfinite(rl)
    assert torch.allclose(lse[fin], rl[fin], atol=bound)
    if causal and S > Skv:  # fully masked rows give exact zeros
        assert torch.count_nonzero(o[:, : S - Skv]) == 0


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_impl_matches_reference(impl, shape):
    _check_against_reference(impl, shape)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_triton_low_precision(dtype):
    _check_against_reference("triton", (1, 30, 30, 4, 2, 32, True), dtype=dtype)


@pytest.mark.parametrize("config", [{"BLOCK_M": 32, "BLOCK_N": 16}, {"BLOCK_M": 16, "BLOCK_N": 32}],
                         ids=["diag-spans-2-tiles", "kv-tile-wider"])
def test_triton_block_shapes(config):
    # BLOCK_M != BLOCK_N moves the split between the unmasked and the masked loop.
    _check_against_reference("triton", (1, 70, 70, 2, 1, 16, True), config=config)
    _check_against_reference("triton", (1, 40, 75, 2, 2, 16, True), config=config)


@pytest.mark.parametrize("use_tma", [True, False], ids=["tma", "pointers"])
@pytest.mark.parametrize("shape", [(2, 37, 37, 4, 2, 32, True),   # B=2: TMA rows of batch 1 start at Skv
                                   (2, 21, 45, 4, 1, 16, True),   # S < Skv, GQA 4
                                   (2, 33, 50, 2, 2, 32, False)], ids=str)
def test_triton_tma_and_pointer_loads_agree(shape, use_tma):
    # The unmasked loop reads K/V through a TMA descriptor of the [B*Skv, Hkv*D] view or by pointers.
    _check_against_reference("triton", shape, config={"BLOCK_M": 16, "BLOCK_N": 16, "USE_TMA": use_tma})


def test_tma_path_only_where_the_layout_allows_it():
    from minimax_lab.attention.dense_triton import _tma_ok

    q, k, v = _inputs(2, 8, 8, 4, 2, 32)
    # TMA needs Hopper or newer on a GPU; the interpreter emulates it
    has_tma = runtime.is_interpreter() or torch.cuda.get_device_capability(DEVICE)[0] >= 9
    assert _tma_ok(k) == has_tma
    assert not _tma_ok(k.transpose(1, 2).contiguous().transpose(1, 2))  # head-major storage
    assert not _tma_ok(_inputs(1, 8, 8, 2, 2, 24)[1])                    # D not a power of two
    # a head-major view still computes correctly (pointer path) with USE_TMA requested
    qh, kh, vh = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    o = flash_attention(qh, kh, vh, config={"BLOCK_M": 16, "BLOCK_N": 16, "USE_TMA": True})
    assert relative_error(o, attention_reference(q, k, v)) < tol(torch.float32)


def test_triton_strided_inputs_and_scale():
    # [B, S=23, H=4, D] views of [B, H, S, D] tensors, as a model with a head-major layout would pass
    q, k, v = (t.transpose(1, 2) for t in _inputs(1, 4, 4, 23, 23, 16))
    assert not q.is_contiguous()
    o = attention(q, k, v, causal=True, scale=0.07, impl="triton")
    r = attention(q, k, v, causal=True, scale=0.07, impl="reference")
    assert relative_error(o, r) < tol(torch.float32)
    assert relative_error(attention(q, k, v, causal=True, impl="triton"), r) > 10 * tol(torch.float32)  # scale matters


def test_lse_optional_and_default_impl():
    q, k, v = _inputs(1, 9, 9, 2, 2, 16)
    o = attention(q, k, v)
    assert isinstance(o, torch.Tensor) and o.shape == q.shape and o.device == q.device
    assert relative_error(o, attention_reference(q, k, v)) < 1e-5


@pytest.mark.parametrize("bad,err", [
    (lambda q, k, v: attention(q[0], k, v), ValueError),
    (lambda q, k, v: attention(q, k[:, :, :3], v[:, :, :3]), ValueError),   # Hq=4 not a multiple of 3
    (lambda q, k, v: attention(q, k.half(), v.half()), ValueError),
    (lambda q, k, v: attention(q, k, v[:, :-1]), ValueError),
    (lambda q, k, v: attention(q, k, v, impl="cuda"), ValueError),
    (lambda q, k, v: attention(q, k, v, scale="0.1"), TypeError),
    (lambda q, k, v: attention(q.cpu().numpy(), k, v), TypeError),
    (lambda q, k, v: attention(q, k.to("meta"), v.to("meta")), ValueError),          # two devices
    (lambda q, k, v: attention(*(t.to("meta") for t in (q, k, v)), impl="triton"), ValueError),  # not the kernel device
    (lambda q, k, v: attention(q, k, v, causal=1), TypeError),
])
def test_bad_input_raises(bad, err):
    q, k, v = _inputs(1, 6, 6, 4, 4, 8)
    with pytest.raises(err):
        bad(q, k, v)


@pytest.mark.parametrize("block_n", [1, 8, 64])
def test_online_softmax_matches_reference(block_n):
    from minimax_lab.attention.online_softmax import online_attention

    q, k, v = _inputs(1, 23, 17, 4, 2, 16)
    o, lse = online_attention(q, k, v, causal=True, block_n=block_n)
    r, rl = attention_reference(q, k, v, causal=True, return_lse=True)
    assert relative_error(o, r) < 1e-5
    assert torch.equal(torch.isinf(lse), torch.isinf(rl))


@pytest.mark.parametrize("S,Skv,bm,bn", [(300, 300, 64, 32), (100, 250, 32, 64), (250, 90, 16, 16)])
def test_tile_schedule_covers_exactly_the_visible_pairs(S, Skv, bm, bn):
    from minimax_lab.attention.dense_reference import causal_mask
    from minimax_lab.attention.dense_triton import tile_schedule

    grid = torch.as_tensor(tile_schedule(S, Skv, bm, bn, causal=True))
    vis = causal_mask(S, Skv)
    tile_of = grid.repeat_interleave(bm, 0)[:S].repeat_interleave(bn, 1)[:, :Skv]
    assert not (vis & (tile_of == 0)).any()           # nothing visible is skipped
    for m in range(grid.shape[0]):
        for n in range(grid.shape[1]):
            block = vis[m * bm:(m + 1) * bm, n * bn:(n + 1) * bn]
            if grid[m, n] == 1:
                assert block.all() and block.shape == (min(bm, S - m * bm), bn)  # unmasked = all visible
            if grid[m, n] == 0:
                assert not block.any()


@pytest.mark.parametrize("group_h", [1, 4, 1024])
def test_triton_launch_order_covers_every_tile(group_h):
    # 2 batches x 3 heads = 6 (batch, head) pairs: GROUP_H=4 leaves a short last group of 2.
    _check_against_reference("triton", (2, 40, 40, 3, 1, 16, True),
                             config={"BLOCK_M": 16, "BLOCK_N": 16, "GROUP_H": group_h})


@pytest.mark.parametrize("n_heads,tiles_m,group_h", [(6, 5, 4), (3, 7, 1), (4, 4, 1024)])
def test_launch_order_is_a_permutation_longest_first_per_group(n_heads, tiles_m, group_h):
    from minimax_lab.attention.dense_triton import launch_order

    order = launch_order(n_heads, tiles_m, group_h)
    assert sorted(map(tuple, order)) == [(h, m) for h in range(n_heads) for m in range(tiles_m)]
    for h in range(n_heads):  # each head's tiles start longest (last) first
        tiles = [m for hh, m in order if hh == h]
        assert tiles == sorted(tiles, reverse=True)
    if group_h == 1:  # FlashAttention's order: all tiles of one head before the next
        assert list(order[:tiles_m, 0]) == [0] * tiles_m


def test_entry_point_dispatches_to_the_plain_implementations():
    # the layout: dense.py holds the entry point, each impl is a plain function in its own module
    from minimax_lab.attention import dense, dense_reference, dense_torch, dense_triton

    assert dense.attention_reference is dense_reference.attention_reference
    assert dense.attention_torch is dense_torch.attention_torch
    assert dense.flash_attention is dense_triton.flash_attention
    q, k, v = _inputs(1, 5, 9, 4, 2, 16, seed=3)
    o, lse = attention(q, k, v, causal=True, scale=0.25, return_lse=True)   # default impl: "torch"
    ot, lset = dense_torch.attention_torch(q, k, v, causal=True, scale=0.25, return_lse=True)
    assert torch.equal(o, ot) and torch.equal(lse, lset)
    assert relative_error(o, attention_reference(q, k, v, scale=0.25)) < tol(torch.float32)
