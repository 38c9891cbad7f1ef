"""MoE: routers (ids/weights exact where scores are distinct), the bias-update rule, the balance
loss, token alignment, every expert implementation against the fp32 reference (experts with no
token, all tokens on one expert, T=1, d/f not multiples of the block sizes), the layer, and
clear errors on bad input. Inputs live on the kernel device; fp32 Triton outputs on a GPU are held
to the TF32 tolerance (the kernels' fp32 dots run in TF32 there)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.devices import DEVICE, generator, randn, tol, to_device
from tests.support.operator_inputs import moe_case

from minimax_lab.measure import relative_error
from minimax_lab.moe import (MoEFFN, align_tokens, expert_counts, load_balance_loss, moe_experts,
                             route_sigmoid_bias, route_softmax, update_bias)
from minimax_lab.moe.align_torch import capacity_for
from minimax_lab.moe.align_triton import align_decode, align_prefill, align_tokens_triton
from minimax_lab.moe.experts_reference import swiglu_expert
from minimax_lab.moe.experts_torch import experts_padded_bmm


_gen = generator
TRITON_TOL = tol(torch.float32, exact=1e-5)   # fp32 inputs: TF32 dots on a GPU


def _naive_moe(x, wgu, wd, weights, ids):
    """Token by token, slot by slot, in float64 on the CPU: an independent check of the reference."""
    x, wgu, wd, weights, ids = (t.cpu() for t in (x, wgu, wd, weights, ids))
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            out[t] += float(weights[t, j]) * swiglu_expert(x[t:t + 1].double(), wgu[e].double(), wd[e].double())[0]
    return out


# ---------------------------------------------------------------------------------------------- routers

@settings(max_examples=25, deadline=None)
@given(T=st.integers(1, 9), E=st.integers(1, 12), data=st.data())
def test_route_softmax_matches_a_sort(T, E, data):
    k = data.draw(st.integers(1, E))
    logits = randn(T, E, gen=_gen(data.draw(st.integers(0, 2**30))), dtype=torch.float64).float()
    w, ids = route_softmax(logits, k)
    p = torch.softmax(logits.double(), -1)
    for t in range(T):              # random logits are distinct: the order is unique
        want = sorted(range(E), key=lambda e: -float(p[t, e]))[:k]
        assert ids[t].tolist() == want
        kept = p[t, want]
        torch.testing.assert_close(w[t].double(), kept / kept.sum(), rtol=1e-6, atol=1e-7)
    w_raw, ids_raw = route_softmax(logits, k, renormalize=False)
    assert torch.equal(ids_raw, ids)
    torch.testing.assert_close(w_raw.double(), p.gather(1, ids), rtol=1e-6, atol=1e-7)
    assert w.dtype == torch.float32 and ids.dtype == torch.int64 and w.shape == (T, k)


def test_route_sigmoid_bias_chooses_with_bias_weights_without():
    g = _gen(1)
    logits = randn(64, 8, gen=g)
    bias = torch.zeros(8, device=DEVICE)
    bias[5] = 10.0                  # expert 5 is chosen by every token
    w, ids = route_sigmoid_bias(logits, 3, bias)
    assert (ids == 5).any(dim=1).all()
    s = torch.sigmoid(logits)
    for t in range(64):
        want = sorted(range(8), key=lambda e: -float(s[t, e] + bias[e]))[:3]
        assert ids[t].tolist() == want
        kept = s[t, want]
        torch.testing.assert_close(w[t], kept / kept.sum())       # unbiased scores, renormalised
    w0, ids0 = route_sigmoid_bias(logits, 3)
    assert torch.equal(ids0, torch.topk(s, 3).indices)
    w_scaled, _ = route_sigmoid_bias(logits, 3, scale=2.5)
    torch.testing.assert_close(w_scaled, 2.5 * w0)


def test_update_bias_rule():
    bias = torch.zeros(4, device=DEVICE)
    counts = to_device(torch.tensor([10, 2, 4, 4]))          # mean 5
    update_bias(bias, counts, rate=0.1)
    want = to_device(torch.tensor([-0.1, 0.1, 0.1, 0.1]))
    torch.testing.assert_close(bias, want)
    update_bias(bias, to_device(torch.tensor([5, 5, 5, 5])), rate=0.1)      # balanced: sign(0) = 0, no move
    torch.testing.assert_close(bias, want)


def test_bias_balancing_evens_out_a_skewed_router():
    g = _gen(3)
    logits = randn(512, 8, gen=g) + torch.linspace(2, -2, 8, device=DEVICE)      # expert 0 favoured
    bias = torch.zeros(8, device=DEVICE)
    spread = []
    for _ in range(300):
        _, ids = route_sigmoid_bias(logits, 2, bias)
        c = expert_counts(ids, 8)
        spread.append(int(c.max() - c.min()))
        update_bias(bias, c, rate=0.01)
    assert spread[-1] < spread[0] / 3


def test_expert_counts_and_load_balance_loss():
    on = dict(device=DEVICE)
    ids = torch.tensor([[0, 1], [2, 3], [0, 2], [1, 3]], **on)
    assert expert_counts(ids, 5).tolist() == [2, 2, 2, 2, 0]
    probs = torch.full((4, 4), 0.25, requires_grad=True, **on)
    loss = load_balance_loss(probs, ids)
    torch.testing.assert_close(loss, torch.tensor(1.0, **on))          # perfect balance
    loss.backward()
    assert probs.grad is not None
    onehot = torch.zeros(6, 4, **on)
    onehot[:, 2] = 1.0
    torch.testing.assert_close(load_balance_loss(onehot, torch.full((6, 1), 2, **on)), torch.tensor(4.0, **on))   # = E
    assert float(load_balance_loss(torch.zeros(0, 4, **on), torch.zeros(0, 2, dtype=torch.long, **on))) == 0.0


@pytest.mark.parametrize("fn", [route_softmax, route_sigmoid_bias])
def test_router_bad_input(fn):
    on = dict(device=DEVICE)
    with pytest.raises(ValueError, match="top_k"):
        fn(torch.randn(3, 4, **on), 5)
    with pytest.raises(ValueError):
        fn(torch.randn(3, 4, 2, **on), 1)
    with pytest.raises(TypeError):
        fn([[1.0, 2.0]], 1)
    with pytest.raises(ValueError):
        fn(torch.zeros(3, 4, dtype=torch.long, **on), 1)


def test_sigmoid_bias_shape_error():
    with pytest.raises(ValueError, match="bias"):
        route_sigmoid_bias(torch.randn(3, 4, device=DEVICE), 2, torch.zeros(5, device=DEVICE))


# ---------------------------------------------------------------------------------------------- alignment

@settings(max_examples=15, deadline=None)
@given(T=st.integers(1, 20), E=st.integers(1, 9), bm=st.sampled_from([1, 4, 16]), data=st.data())
def test_align_tokens_layout(T, E, bm, data):
    k = data.draw(st.integers(1, E))
    ids = to_device(torch.randint(0, E, (T, k), generator=_gen(data.draw(st.integers(0, 2**30)))))
    al = align_tokens(ids, E, bm)
    assert al.sorted_ids.device.type == DEVICE.type
    n = T * k
    assert al.capacity == capacity_for(n, E, bm)
    rows = int(al.num_rows)
    real = al.sorted_ids[al.sorted_ids < n]
    assert sorted(real.tolist()) == list(range(n))               # every slot exactly once
    assert (al.sorted_ids[rows:] == n).all()
    flat = ids.reshape(-1)
    for b in range(rows // bm):
        blk = al.sorted_ids[b * bm:(b + 1) * bm]
        e = int(al.block_expert[b])
        assert all(int(flat[s]) == e for s in blk.tolist() if s < n)
    assert (al.block_expert[rows // bm:] == -1).all()
    assert al.counts.tolist() == expert_counts(ids, E).tolist()


@pytest.mark.parametrize("kernel", ["chunked", "sort"])
@pytest.mark.parametrize("T,E,k,bm,routing", [
    (1, 8, 2, 16, "random"), (13, 5, 3, 4, "random"), (40, 16, 2, 16, "random"), (64, 128, 8, 32, "random"),
    (300, 6, 1, 16, "random"), (33, 8, 1, 16, "one_expert"), (9, 64, 2, 16, "few_experts")])
def test_align_triton_kernels_equal_torch(kernel, T, E, k, bm, routing):
    """Both one-launch alignments (align_triton.py's chunked scan and its one sort) give
    align_tokens' layout element for element."""
    g = _gen()
    if routing == "one_expert":
        ids = torch.full((T, k), E - 1)
    elif routing == "few_experts":
        ids = torch.randint(0, 2, (T, k), generator=g)
    else:
        ids = torch.randint(0, E, (T, k), generator=g)
    ids = to_device(ids)
    a = align_tokens(ids, E, bm)
    b = (align_tokens_triton if kernel == "chunked" else align_decode)(ids, E, bm)
    assert torch.equal(a.sorted_ids, b.sorted_ids)
    assert torch.equal(a.block_expert, b.block_expert)
    assert int(a.num_rows) == int(b.num_rows)
    assert a.counts.tolist() == b.counts.tolist()


@pytest.mark.parametrize("T,E,k,bm,chunk,routing", [
    (300, 6, 3, 16, 64, "random"), (257, 37, 8, 32, 128, "random"), (1000, 8, 2, 64, 256, "random"),
    (5, 4, 2, 16, 16, "random"), (640, 3, 1, 16, 64, "one_expert"), (200, 64, 2, 16, 32, "few_experts"),
    (64, 8, 2, 16, 128, "random")])     # the last: one chunk, part empty
def test_align_prefill_equals_torch(T, E, k, bm, chunk, routing):
    """The many-program alignment (per-chunk histograms, offsets, per-chunk sort and scatter) gives
    align_tokens' layout element for element: ragged last chunks, experts with no slot, one expert
    with all of them, E not a power of two."""
    g = _gen()
    if routing == "one_expert":
        ids = torch.full((T, k), E - 1)
    elif routing == "few_experts":
        ids = torch.randint(0, 2, (T, k), generator=g) * (E - 1)
    else:
        ids = torch.randint(0, E, (T, k), generator=g)
    ids = to_device(ids)
    a = align_tokens(ids, E, bm)
    b = align_prefill(ids, E, bm, chunk=chunk)
    assert torch.equal(a.sorted_ids, b.sorted_ids)
    assert torch.equal(a.block_expert, b.block_expert)
    assert int(a.num_rows) == int(b.num_rows)
    assert a.counts.tolist() == b.counts.tolist()


def test_align_prefill_limits():
    from minimax_lab.moe.align_triton import ALIGN_PREFILL_MAX_CHUNK, prefill_chunk
    assert prefill_chunk(131072, 128) == 4096 and prefill_chunk(1 << 20, 256) == 16384
    assert prefill_chunk(1 << 22, 256) is None and prefill_chunk(1000, 1 << 14) is None
    assert prefill_chunk(1 << 20, 1) <= ALIGN_PREFILL_MAX_CHUNK
    ids = torch.zeros(4, 2, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match="power of two"):
        align_prefill(ids, 8, 16, chunk=48)
    with pytest.raises(ValueError, match="exceed the offsets kernel"):
        align_prefill(torch.zeros(1000, 2, dtype=torch.long, device=DEVICE), 256, 16, chunk=16)
    with pytest.raises(ValueError, match="needs tensors on"):
        align_prefill(torch.zeros(4, 2, dtype=torch.long, device="meta"), 8, 16)


def test_align_bad_ids():
    with pytest.raises(ValueError, match="ids must lie"):
        align_tokens(torch.tensor([[0, 4]], device=DEVICE), 4, 16)


@pytest.mark.parametrize("kernel", ["chunked", "sort"])
def test_align_kernels_refuse_other_devices(kernel):
    """A tensor off the kernel device (here ``meta``; on a GPU machine, a CPU tensor) gets a clear
    error before any launch, not a pointer fault."""
    fn = align_tokens_triton if kernel == "chunked" else align_decode
    with pytest.raises(ValueError, match="needs tensors on"):
        fn(torch.zeros(4, 2, dtype=torch.long, device="meta"), 8, 16)


def test_experts_triton_refuses_other_devices_before_its_alignment_kernel():
    """Wrong-device inputs raise a clear error before the alignment kernel runs."""
    from minimax_lab.moe import experts_triton as et
    x, wgu, wd, w, ids = (t.to("meta") for t in moe_case(4, 4, 2, 16, 16, _gen()))
    with pytest.raises(ValueError, match="needs tensors on"):
        et.experts_triton(x, wgu, wd, w, ids)
    with pytest.raises(ValueError, match="needs tensors on"):
        moe_experts(x, wgu, wd, w, ids, impl="triton", check_ids=False)


# ---------------------------------------------------------------------------------------------- experts



def test_reference_equals_naive_float64_loop():
    g = _gen(7)
    x, wgu, wd, w, ids = moe_case(5, 6, 2, 12, 10, g)
    got = moe_experts(x, wgu, wd, w, ids, impl="reference")
    assert got.device.type == DEVICE.type
    torch.testing.assert_close(got.double().cpu(), _naive_moe(x, wgu, wd, w, ids), rtol=1e-5, atol=1e-6)


CASES = [  # (T, E, k, d, f, routing): ragged d/f (not multiples of 16), T=1, empty experts, one expert
    (1, 8, 2, 32, 16, "random"),
    (13, 6, 2, 40, 24, "random"),
    (9, 8, 2, 24, 20, "few_experts"),
    (11, 4, 1, 20, 36, "one_expert"),
    (37, 8, 3, 48, 40, "random"),
]


@pytest.mark.parametrize("impl", ["loop", "torch", "triton"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"T{c[0]}_E{c[1]}_k{c[2]}_d{c[3]}_f{c[4]}_{c[5]}")
def test_impl_matches_reference(impl, case):
    T, E, k, d, f, routing = case
    x, wgu, wd, w, ids = moe_case(T, E, k, d, f, _gen(), routing=routing)
    want = moe_experts(x, wgu, wd, w, ids, impl="reference")
    got = moe_experts(x, wgu, wd, w, ids, impl=impl)
    assert got.shape == (T, d) and got.dtype == x.dtype and got.device == x.device
    bound = TRITON_TOL if impl == "triton" else 1e-5   # loop and torch keep fp32
    assert relative_error(got, want) < bound, (impl, relative_error(got, want))


def test_triton_fp16_and_other_block_sizes():
    g = _gen()
    x, wgu, wd, w, ids = moe_case(21, 8, 2, 40, 24, g)
    want = moe_experts(x, wgu, wd, w, ids, impl="reference")
    got = moe_experts(x.half(), wgu.half(), wd.half(), w.half(), ids, impl="triton")
    assert got.dtype == torch.float16 and relative_error(got.float(), want) < tol(torch.float16)
    cfg = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "num_warps": 4, "num_stages": 1,
           "DOWN_BLOCK_N": 16, "DOWN_BLOCK_K": 32}
    assert relative_error(moe_experts(x, wgu, wd, w, ids, impl="triton", config=cfg), want) < TRITON_TOL


SWAP_CONFIGS = [  # the decode path: weight tile as the MMA's M operand, gathered rows as N
    {"SWAP_AB": True, "DOWN_SWAP_AB": True},
    {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "DOWN_BLOCK_N": 16, "DOWN_BLOCK_K": 32,
     "SWAP_AB": True, "DOWN_SWAP_AB": False},
    {"SWAP_AB": False, "DOWN_SWAP_AB": True},
]


@pytest.mark.parametrize("slot_blocks_max", [0, 64], ids=["aligned", "slot_blocks"])
@pytest.mark.parametrize("config", SWAP_CONFIGS, ids=["swap_both", "swap_gate_up_bm32", "swap_down"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"T{c[0]}_E{c[1]}_k{c[2]}_d{c[3]}_f{c[4]}_{c[5]}")
def test_triton_swap_ab_matches_reference(config, case, slot_blocks_max):
    """SWAP_AB kernels (fp32 in the interpreter: its bf16 tl.dot is wrong) on ragged d/f, T=1,
    experts with no token and all tokens on one expert; over the aligned blocks and, where
    ``T * k <= 64``, over one-slot blocks without an alignment."""
    from minimax_lab.moe.experts_triton import experts_triton
    T, E, k, d, f, routing = case
    x, wgu, wd, w, ids = moe_case(T, E, k, d, f, _gen(), routing=routing)
    want = moe_experts(x, wgu, wd, w, ids, impl="reference")
    got = experts_triton(x, wgu, wd, w, ids, config={**config, "SLOT_BLOCKS_MAX": slot_blocks_max})
    assert got.shape == (T, d) and torch.isfinite(got).all()
    assert relative_error(got, want) < TRITON_TOL, (config, relative_error(got, want))


ORDER_CONFIGS = {  # weight tiles through TMA descriptors and the grouped launch order, in both layouts
    "tma": {"USE_TMA": True, "SLOT_BLOCKS_MAX": 0},
    "grouped": {"GROUP_M": 3, "SLOT_BLOCKS_MAX": 0},
    "tma_grouped_swapped": {"USE_TMA": True, "GROUP_M": 2, "SWAP_AB": True, "DOWN_SWAP_AB": True, "SLOT_BLOCKS_MAX": 0},
    "tma_gate_up_only": {"USE_TMA": True, "DOWN_USE_TMA": False, "DOWN_GROUP_M": 4, "SLOT_BLOCKS_MAX": 0},
    "tma_swapped_slot_blocks": {"USE_TMA": True, "SWAP_AB": True, "DOWN_SWAP_AB": True, "SLOT_BLOCKS_MAX": 64},
}


@pytest.mark.parametrize("name", ORDER_CONFIGS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"T{c[0]}_E{c[1]}_k{c[2]}_d{c[3]}_f{c[4]}_{c[5]}")
def test_triton_tma_and_launch_order_match_reference(name, case):
    """TMA weight loads (rows past an expert's tile are masked at the store, columns past d or f
    are zero-filled) and the grouped launch order cover every output tile exactly as the plain
    kernels do; shapes whose rows are not 16-byte multiples fall back to pointer loads."""
    from minimax_lab.moe.experts_triton import experts_triton
    T, E, k, d, f, routing = case
    x, wgu, wd, w, ids = moe_case(T, E, k, d, f, _gen(), routing=routing)
    got = experts_triton(x, wgu, wd, w, ids, config=ORDER_CONFIGS[name])
    assert got.shape == (T, d) and torch.isfinite(got).all()
    assert relative_error(got, moe_experts(x, wgu, wd, w, ids, impl="reference")) < TRITON_TOL, name


def test_slot_blocks_need_no_alignment_and_match_reference(monkeypatch):
    """Up to ``SLOT_BLOCKS_MAX_SLOTS`` routed slots the fused experts run without an alignment
    launch: slots that share an expert (here every slot, across tokens), ids and weights given as
    non-contiguous views, a caller's alignment still honoured, larger batches still aligned."""
    from minimax_lab.moe import experts_triton as et
    from minimax_lab.moe.align import align_tokens
    T, E, k, d, f = 3, 4, 2, 40, 24
    x, wgu, wd, w, ids = moe_case(T, E, k, d, f, _gen(), routing="few_experts")  # experts 0 and 1 only
    want = moe_experts(x, wgu, wd, w, ids, impl="reference")
    al = align_tokens(ids, E, et.pick_config(T * k, E, d, f)["BLOCK_M"])

    def no_alignment(*a, **kw):
        raise AssertionError("the alignment ran for a tiny batch")
    monkeypatch.setattr(et, "_align", no_alignment)
    ids_view = ids.t().contiguous().t()          # same values, column-major storage
    w_view = w.t().contiguous().t()
    assert not ids_view.is_contiguous() and not w_view.is_contiguous()
    for cfg in (None, {"SWAP_AB": True, "DOWN_SWAP_AB": True}):
        got = et.experts_triton(x, wgu, wd, w_view, ids_view, config=cfg)
        assert relative_error(got, want) < TRITON_TOL, (cfg, relative_error(got, want))
    assert relative_error(et.experts_triton(x, wgu, wd, w, ids, alignment=al), want) < TRITON_TOL
    big = et.SLOT_BLOCKS_MAX_SLOTS // k + 1       # one token past the limit: aligned
    xb, wgub, wdb, wb, idsb = moe_case(big, E, k, d, f, _gen())
    with pytest.raises(AssertionError, match="alignment ran"):
        et.experts_triton(xb, wgub, wdb, wb, idsb)


def test_weight_tma_ok_needs_16_byte_rows():
    from minimax_lab.moe.experts_triton import weight_tma_ok
    w = torch.zeros(3, 8, 40, device=DEVICE)
    assert weight_tma_ok(w) == (DEVICE.type != "cuda" or torch.cuda.get_device_capability(DEVICE)[0] >= 9)
    assert not weight_tma_ok(torch.zeros(3, 8, 37, device=DEVICE))        # 148-byte rows
    assert not weight_tma_ok(torch.zeros(3, 40, 8, device=DEVICE).transpose(1, 2))   # not contiguous


def test_triton_swap_ab_every_slot_written():
    """Into NaN-poisoned outputs, the transposed stores write every routed row of the intermediate
    and every slot of ``y``, equal to the unswapped kernels'."""
    from minimax_lab.moe.align import align_tokens
    from minimax_lab.moe.experts_triton import LAUNCH, launch_down, launch_gate_up
    g = _gen()
    T, E, k, d, f = 9, 8, 2, 40, 24
    x, wgu, wd, w, ids = moe_case(T, E, k, d, f, g, routing="few_experts")
    al = align_tokens(ids, E, 16)
    outs = []
    for swap in (False, True):
        c = {**LAUNCH.interpreter, "SWAP_AB": swap}
        inter = launch_gate_up(x, wgu, al.sorted_ids, al.block_expert, k, c,
                               out=torch.full((al.capacity, f), float("nan"), device=DEVICE))
        routed = al.sorted_ids < T * k
        assert torch.isfinite(inter[routed]).all() and torch.isnan(inter[~routed]).all()
        y = launch_down(inter, wd, al.sorted_ids, al.block_expert, w.reshape(-1).contiguous(), c,
                        out=torch.full((T * k, d), float("nan"), device=DEVICE))
        assert torch.isfinite(y).all()
        outs.append(y)
    assert relative_error(outs[1], outs[0]) < tol(torch.float32, exact=1e-6)


def test_torch_paths_and_gradients_match_reference():
    g = _gen()
    x, wgu, wd, w, ids = moe_case(10, 5, 2, 16, 12, g)
    want = moe_experts(x, wgu, wd, w, ids, impl="reference")
    assert relative_error(experts_padded_bmm(x, wgu, wd, w, ids), want) < 1e-5
    assert relative_error(moe_experts(x.bfloat16(), wgu.bfloat16(), wd.bfloat16(), w.bfloat16(), ids,
                                      impl="torch").float(), want) < 3e-2
    leaves = [t.clone().requires_grad_() for t in (x, wgu, wd, w)]
    ref = [t.clone().requires_grad_() for t in (x, wgu, wd, w)]
    moe_experts(*leaves, ids, impl="torch").square().sum().backward()
    moe_experts(*ref, ids, impl="reference").square().sum().backward()
    for a, b in zip(leaves, ref):
        assert relative_error(a.grad, b.grad) < 1e-5


def test_empty_batch_and_triton_refuses_grad():
    g = _gen()
    x, wgu, wd, w, ids = moe_case(4, 4, 2, 16, 16, g)
    for impl in ("reference", "torch", "triton"):
        out = moe_experts(x[:0], wgu, wd, w[:0], ids[:0], impl=impl)
        assert out.shape == (0, 16)
    with pytest.raises(ValueError, match="no backward"):
        moe_experts(x.requires_grad_(), wgu, wd, w, ids, impl="triton")


def test_expert_bad_input():
    g = _gen()
    x, wgu, wd, w, ids = moe_case(4, 4, 2, 16, 12, g)
    on = dict(device=DEVICE)  # every tensor on one device: each error below is the one named
    with pytest.raises(ValueError, match="ids must lie"):
        moe_experts(x, wgu, wd, w, torch.tensor([[0, 4]] * 4, **on))
    with pytest.raises(ValueError, match="ids must lie"):
        moe_experts(x, wgu, wd, w, torch.tensor([[-1, 0]] * 4, **on))
    with pytest.raises(ValueError, match="w_down"):
        moe_experts(x, wgu, wd[:, :, :-1], w, ids)
    with pytest.raises(ValueError, match="w_gate_up"):
        moe_experts(x, wgu[:, :, :-1], wd, w, ids)
    with pytest.raises(ValueError, match="top_k"):
        moe_experts(x, wgu, wd, torch.rand(4, 5, **on), torch.zeros(4, 5, dtype=torch.long, **on))
    with pytest.raises(ValueError, match="weights"):
        moe_experts(x, wgu, wd, w[:, :1], ids)
    with pytest.raises(ValueError, match="ids"):
        moe_experts(x, wgu, wd, w[:3], ids[:3])
    with pytest.raises(ValueError, match="dtype"):
        moe_experts(x.double(), wgu, wd, w, ids)
    with pytest.raises(ValueError, match="impl"):
        moe_experts(x, wgu, wd, w, ids, impl="fast")
    with pytest.raises(TypeError):
        moe_experts(x.cpu().numpy(), wgu, wd, w, ids)
    with pytest.raises(ValueError, match="one device"):
        moe_experts(x.to("meta"), wgu, wd, w, ids)


# ---------------------------------------------------------------------------------------------- layer

def test_moe_ffn_layer():
    torch.manual_seed(0)
    layer = MoEFFN(16, 12, 6, 2, router="sigmoid_bias", shared_expert=True, bias_update_rate=0.05).to(DEVICE)
    x = randn(2, 7, 16, gen=_gen())
    y = layer(x)
    assert y.shape == x.shape
    assert layer.last_ids.shape == (14, 2) and layer.last_weights.shape == (14, 2)
    assert layer.aux_loss.ndim == 0 and float(layer.aux_loss.detach()) > 0
    assert layer.expert_bias.abs().sum() > 0                # training mode moved the bias
    y.sum().backward()
    assert layer.w_gate_up.grad is not None and layer.gate.weight.grad is not None
    layer.eval()
    b = layer.expert_bias.clone()
    with torch.no_grad():
        want = layer(x)
        layer.impl = "triton"
        got = layer(x)
    assert torch.equal(layer.expert_bias, b)                 # eval: bias frozen
    assert relative_error(got, want) < TRITON_TOL
    with pytest.raises(ValueError, match="d_model"):
        layer(torch.randn(3, 15, device=DEVICE))
    with pytest.raises(ValueError, match="top_k"):
        MoEFFN(16, 12, 2, 3)
    with pytest.raises(ValueError, match="router"):
        MoEFFN(16, 12, 4, 2, router="hash")


def test_bench_suite_helpers():
    from minimax_lab.bench import suite_moe as bs
    sweeps = {64: ({"BLOCK_M": 16}, {"a": 1.0}), 256: ({"BLOCK_M": 32}, {"b": 2.0})}
    assert bs.decode_config_for(1, sweeps)[0]["BLOCK_M"] == 16
    assert bs.decode_config_for(100, sweeps)[0]["BLOCK_M"] == 32
    assert bs.decode_config_for(300, sweeps) == (None, {})
    s = dict(E=8, k=2, d=4, f=3)
    ids = torch.tensor([[0, 1], [1, 2]])
    assert bs.moe_bytes(s, 2, ids, 2) == 3 * (3 * 4 * 3 * 2) + 2 * 2 * 4 * 2
    assert bs.moe_flops(s, 2) == 2 * 2 * 2 * 3 * 4 * 3


def test_viz_moe_draws():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from minimax_lab.viz import moe as vmoe
    loads = torch.randint(0, 20, (12, 4))
    assert vmoe.load_heatmap(loads, title="t") is not None
    assert vmoe.imbalance_curve({"a": [2.0, 1.5, 1.1]}) is not None
    assert vmoe.modality_routing(torch.tensor([0.5, 0.5, 0, 0]), torch.full((4,), 0.25)) is not None
    al = align_tokens(torch.tensor([[0, 1], [1, 2]]), 3, 4)
    assert vmoe.alignment_strip(al.sorted_ids, al.block_expert, 4, 4, 2) is not None
    rec = lambda T, impl, ms: {"suite": "moe", "impl": impl, "shape": {"E": 8, "d": 4, "f": 4, "T": T}, "ms": ms,  # noqa: E731
                               "gbps": 100.0 / ms, "tflops": T / ms, "ceiling": "copy" if T <= 256 else "gemm",
                               "pct_of_ceiling": 10.0 / ms}
    fig = vmoe.recorded_comparison([rec(T, i, ms) for T in (1, 64, 4096) for i, ms in (("triton", 1.0), ("torch_grouped_mm", 2.0))])
    assert len(fig.axes) == 2
    with pytest.raises(ValueError):
        vmoe.load_heatmap(torch.zeros(3))
    with pytest.raises(ValueError):
        vmoe.recorded_comparison([])
    plt.close("all")


def test_tuner_candidates_plot_ranks_by_the_tuners_score():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from minimax_lab.viz import tuner as vtuner
    base = "BLOCK_M=128,BLOCK_N=64,BLOCK_K=64,num_warps=8,num_stages=3,DOWN_BLOCK_N=128,DOWN_BLOCK_K=64"
    timings = {base: {"a": 2.0, "b": 4.0}, base + ",USE_TMA=True": {"a": 1.0, "b": 4.4},
               base + ",GROUP_M=8": {"a": 3.0, "b": 3.0}}
    fig = vtuner.tuner_candidates(timings, base + ",USE_TMA=True")
    ax = fig.axes[0]
    widths = [b.get_width() for b in ax.patches]
    assert widths == sorted(widths) and abs(widths[0] - 100 * ((4.4 / 3.0) ** 0.5 - 1)) < 1e-9
    assert "TMA" in ax.get_yticklabels()[0].get_text() and ax.patches[0].get_linewidth() == 2
    with pytest.raises(ValueError, match="no tuner timings"):
        vtuner.tuner_candidates({}, base)
    plt.close("all")
