"""Properties MSA keeps in every impl, drawn by hypothesis: selection, prefill (any valid
caller selection, empty rows included) and paged decode give the reference's answer on
non-contiguous views and in every float dtype (float64 refused by the Triton kernels); ``topk``
and the number of blocks stay in their documented bounds. Shared settings and checks:
:mod:`tests.support.properties`."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.support.devices import DEVICE, generator, randn
from tests.support.operator_inputs import coarse, paged_cache
from tests.support.properties import (IMPLS, PROPERTY, assert_close, assert_same_lse, dtypes, impl_outputs,
                                      relayout_all, seeds)
from minimax_lab.attention import msa_attention, msa_decode_paged, msa_select


def _random_selection(B, S, G, topk, block_size, g):
    """A valid caller selection: per row a random subset (possibly empty) of the visible blocks, in
    random slot order, ``-1`` elsewhere."""
    nb = math.ceil(S / block_size)
    local = torch.arange(S) // block_size
    r = torch.rand(B, S, G, nb, generator=g)
    r = r.masked_fill(torch.arange(nb)[None, None, None, :] > local[None, :, None, None], 2.0)
    order = r.argsort(dim=-1)
    if nb < topk:
        order = torch.cat([order, order.new_full((B, S, G, topk - nb), -1)], dim=-1)
    order = order[..., :topk]
    keep = torch.minimum(torch.randint(0, topk + 1, (B, S, G, 1), generator=g), (local + 1)[None, :, None, None])
    sel = torch.where(torch.arange(topk) < keep, order, -1)
    shuffle = torch.rand(B, S, G, topk, generator=g).argsort(dim=-1)
    return sel.gather(-1, shuffle).to(torch.int32).to(DEVICE)


@PROPERTY
@given(data=st.data(), B=st.integers(1, 2), S=st.integers(1, 50), G=st.integers(1, 2), topk=st.integers(1, 4),
       dtype=dtypes, seed=seeds)
def test_msa_select_layouts_and_dtypes(data, B, S, G, topk, dtype, seed):
    g = generator(seed)
    ins = {"q_idx": coarse(B, S, G, 16, gen=g, dtype=dtype), "k_idx": coarse(B, S, 16, gen=g, dtype=dtype)}
    want = msa_select(**ins, block_size=16, topk=topk, impl="reference")
    views = relayout_all(data, ins)
    for impl, got in impl_outputs(IMPLS, dtype, lambda impl: msa_select(**views, block_size=16, topk=topk, impl=impl)):
        assert got.dtype == torch.int32 and torch.equal(got, want), impl


@PROPERTY
@given(data=st.data(), B=st.integers(1, 2), S=st.integers(1, 40), G=st.integers(1, 2), hpg=st.integers(1, 2),
       topk=st.integers(1, 3), schedule=st.sampled_from(["query", "kv"]), own_selection=st.booleans(),
       dtype=dtypes, seed=seeds)
def test_msa_attention_layouts_dtypes_and_any_valid_selection(data, B, S, G, hpg, topk, schedule, own_selection,
                                                              dtype, seed):
    g = generator(seed)
    ins = {"q": randn(B, S, G * hpg, 16, gen=g, dtype=dtype), "k": randn(B, S, G, 16, gen=g, dtype=dtype),
           "v": randn(B, S, G, 16, gen=g, dtype=dtype), "q_idx": coarse(B, S, G, 16, gen=g, dtype=dtype),
           "k_idx": coarse(B, S, 16, gen=g, dtype=dtype)}
    kw = dict(block_size=16, topk=topk, return_lse=True)
    if own_selection:  # any valid selection (empty rows included) is served identically
        kw["selected"] = _random_selection(B, S, G, topk, 16, g)
    want, want_lse = msa_attention(**ins, **kw, impl="reference")
    views = relayout_all(data, ins)
    def run(impl):
        return msa_attention(**views, **kw, impl=impl, **({"schedule": schedule} if impl == "triton" else {}))
    for impl, (o, lse) in impl_outputs(IMPLS, dtype, run):
        assert o.dtype == dtype
        assert_close(o, want, dtype, f"msa_attention {impl}")
        assert_same_lse(lse, want_lse, dtype, f"msa_attention lse {impl}")


@PROPERTY
@given(data=st.data(), lengths=st.lists(st.integers(2, 60), min_size=1, max_size=2), T=st.integers(1, 2),
       G=st.integers(1, 2), hpg=st.integers(1, 2), topk=st.integers(1, 4), squeeze=st.booleans(), dtype=dtypes,
       seed=seeds)
def test_msa_decode_paged_layouts_and_dtypes(data, lengths, T, G, hpg, topk, squeeze, dtype, seed):
    g = generator(seed)
    B = len(lengths)
    ins = paged_cache(lengths, page=16, Hkv=G, D=16, gen=g, dtype=dtype, d_idx=16)
    ins["q"] = randn(B, T, G * hpg, 16, gen=g, dtype=dtype)
    ins["q_idx"] = coarse(B, T, G, 16, gen=g, dtype=dtype)
    if squeeze and T == 1:  # the 3-D query form
        ins["q"], ins["q_idx"] = ins["q"][:, 0], ins["q_idx"][:, 0]
    want, want_sel = msa_decode_paged(**ins, topk=topk, impl="reference", return_selected=True)
    views = relayout_all(data, ins)
    for impl, (o, sel) in impl_outputs(IMPLS, dtype, lambda impl: msa_decode_paged(**views, topk=topk, impl=impl,
                                                                                  return_selected=True)):
        assert o.shape == want.shape and o.dtype == dtype and torch.equal(sel, want_sel), impl
        assert_close(o, want, dtype, f"msa_decode_paged {impl}")


@pytest.mark.parametrize("impl", IMPLS)
def test_msa_topk_bounds(impl):
    # msa.py: 1 <= topk <= MAX_TOPK (256); unused slots are -1
    from minimax_lab.attention.msa import MAX_TOPK

    g = generator(6)
    q_idx, k_idx = coarse(1, 20, 1, 16, gen=g), coarse(1, 20, 16, gen=g)
    sel = msa_select(q_idx, k_idx, block_size=16, topk=MAX_TOPK, impl=impl)
    assert sel.shape == (1, 20, 1, MAX_TOPK) and bool((sel[..., 2:] == -1).all())
    for bad in (0, MAX_TOPK + 1):
        with pytest.raises(ValueError, match="topk"):
            msa_select(q_idx, k_idx, block_size=16, topk=bad, impl=impl)


def test_msa_refuses_more_blocks_than_its_ranking_keys_hold():
    # msa.py: at most 2**20 blocks per sequence (checked on shapes only: stride-0 views, no memory)
    q_idx = torch.zeros(1, 1, 1, 16, device=DEVICE).expand(1, 2**20 * 16 + 1, 1, 16)
    k_idx = torch.zeros(1, 1, 16, device=DEVICE).expand(1, 2**20 * 16 + 1, 16)
    for impl in IMPLS:
        with pytest.raises(ValueError, match="blocks"):
            msa_select(q_idx, k_idx, block_size=16, topk=2, impl=impl)
