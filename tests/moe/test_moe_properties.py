"""Properties the MoE operator keeps in every impl, drawn by hypothesis: the experts and the layer
give the reference's answer on non-contiguous views and in every float dtype (float64 refused by
the Triton kernels), empty batches included; the routers pick the exact top-k; token alignment
takes any integer dtype and layout and refuses ids out of range; expert counts never read back to
the host. Shared settings and checks: :mod:`tests.support.properties`."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.support.devices import DEVICE, generator, randn, relative_error, tol
from tests.support.operator_inputs import relayout
from tests.support.properties import (MOE_IMPLS, PROPERTY, assert_close, dtypes, impl_outputs, layouts, relayout_all,
                                      seeds)
from minimax_lab.moe import MoEFFN, align_tokens, moe_experts, route_sigmoid_bias, route_softmax


@PROPERTY
@given(data=st.data(), T=st.integers(1, 12), d=st.integers(4, 40), f=st.integers(4, 40), E=st.integers(1, 5),
       k=st.integers(1, 3), dtype=dtypes, seed=seeds)
def test_moe_experts_layouts_and_dtypes(data, T, d, f, E, k, dtype, seed):
    g = generator(seed)
    k = min(k, E)
    ins = {"x": randn(T, d, gen=g, dtype=dtype), "w_gate_up": (randn(E, 2 * f, d, gen=g) / d ** 0.5).to(dtype),
           "w_down": (randn(E, d, f, gen=g) / f ** 0.5).to(dtype),
           "weights": torch.rand(T, k, generator=g).to(DEVICE, dtype),
           "ids": torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(DEVICE)}
    want = moe_experts(**ins, impl="reference")
    views = relayout_all(data, ins)
    for impl, got in impl_outputs(MOE_IMPLS, dtype, lambda impl: moe_experts(**views, impl=impl)):
        assert got.dtype == dtype
        assert_close(got, want, dtype, f"moe_experts {impl}")


@PROPERTY
@given(data=st.data(), router=st.sampled_from(["softmax", "sigmoid_bias"]), shared=st.booleans(),
       impl=st.sampled_from(MOE_IMPLS), lead=st.sampled_from([(0,), (5,), (2, 3)]),
       dtype=dtypes, seed=seeds)
def test_moeffn_layouts_dtypes_and_empty(data, router, shared, impl, lead, dtype, seed):
    torch.manual_seed(seed)
    ffn = MoEFFN(24, 20, 4, 2, router=router, shared_expert=shared, impl=impl).to(DEVICE, dtype).eval()
    ref = MoEFFN(24, 20, 4, 2, router=router, shared_expert=shared, impl="reference").to(DEVICE, dtype).eval()
    ref.load_state_dict(ffn.state_dict())
    x = relayout(randn(*lead, 24, gen=generator(seed), dtype=dtype), data.draw(layouts))
    with torch.no_grad():
        want = ref(x)
        for _, got in impl_outputs([impl], dtype, lambda _: ffn(x)):
            assert got.shape == x.shape and got.dtype == dtype
            if x.numel():
                assert_close(got, want, dtype, f"MoEFFN {impl}")
                assert torch.equal(ffn.last_ids, ref.last_ids)


def _distinct_logits(T, E, g, dtype):
    """Per row a permutation of 0, 0.25, ..., (E-1)/4: distinct and exact in every float dtype, so
    the chosen ids are defined without ties."""
    rows = [torch.randperm(E, generator=g) for _ in range(T)]
    return ((torch.stack(rows) if rows else torch.empty(0, E)).double() / 4).to(DEVICE, dtype)


@PROPERTY
@given(data=st.data(), T=st.integers(0, 10), E=st.integers(1, 8), k=st.integers(1, 8), renormalize=st.booleans(),
       with_bias=st.booleans(), dtype=dtypes, seed=seeds)
def test_routers_layouts_dtypes_and_empty(data, T, E, k, renormalize, with_bias, dtype, seed):
    g = generator(seed)
    k = min(k, E)
    logits = _distinct_logits(T, E, g, dtype)
    view = relayout(logits, data.draw(layouts))
    exact = logits.double()
    w, ids = route_softmax(view, k, renormalize=renormalize)
    p = torch.softmax(exact, -1)
    want_ids = p.topk(k, -1).indices
    want_w = p.gather(-1, want_ids)
    want_w = want_w / want_w.sum(-1, keepdim=True) if renormalize else want_w
    assert w.shape == (T, k) and w.dtype == torch.float32 and ids.dtype == torch.int64
    assert torch.equal(ids, want_ids) and relative_error(w, want_w) <= tol(torch.float32)
    bias = (torch.randperm(E, generator=g).double() / 64).to(DEVICE, dtype) if with_bias else None
    w, ids = route_sigmoid_bias(view, k, None if bias is None else relayout(bias, data.draw(layouts)),
                                renormalize=renormalize)
    s = torch.sigmoid(exact)
    want_ids = (s + (0 if bias is None else bias.double())).topk(k, -1).indices
    want_w = s.gather(-1, want_ids)
    want_w = want_w / want_w.sum(-1, keepdim=True) if renormalize else want_w
    assert torch.equal(ids, want_ids) and relative_error(w, want_w) <= tol(torch.float32)


@PROPERTY
@given(data=st.data(), T=st.integers(0, 20), E=st.integers(1, 6), k=st.integers(1, 3), block_m=st.sampled_from([1, 4, 16]),
       int_dtype=st.sampled_from([torch.int64, torch.int32, torch.int16, torch.uint8]), seed=seeds)
def test_align_tokens_layouts_dtypes_and_range(data, T, E, k, block_m, int_dtype, seed):
    g = generator(seed)
    k = min(k, E)
    ids = torch.randint(0, E, (T, k), generator=g).to(DEVICE)
    want = align_tokens(ids, E, block_m)
    got = align_tokens(relayout(ids.to(int_dtype), data.draw(layouts)), E, block_m)
    for field in ("sorted_ids", "block_expert", "num_rows", "counts"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    if T:
        bad = ids.clone()
        bad[data.draw(st.integers(0, T - 1)), data.draw(st.integers(0, k - 1))] = data.draw(
            st.sampled_from([E, E + 3, -1]))
        with pytest.raises(ValueError, match="ids"):
            align_tokens(bad, E, block_m)
        for impl in MOE_IMPLS:
            with pytest.raises(ValueError, match="ids must lie"):
                moe_experts(randn(T, 8, gen=g), randn(E, 8, 8, gen=g), randn(E, 8, 4, gen=g),
                            torch.rand(T, k, generator=g).to(DEVICE), bad, impl=impl)


def test_expert_counts_never_synchronises():
    # router.py: expert_counts is written with scatter_add_ so it never reads back to the host
    from minimax_lab.moe import expert_counts
    from tests.support.operator_inputs import DeviceWork

    ids = torch.randint(0, 6, (9, 2), generator=generator(7)).to(DEVICE)
    with DeviceWork() as work:
        counts = expert_counts(ids, 6)
    assert not work.syncs and torch.equal(counts.cpu(), torch.bincount(ids.cpu().reshape(-1), minlength=6))
