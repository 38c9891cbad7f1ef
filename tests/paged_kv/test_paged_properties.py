"""Properties the paged KV kernels (decode, prefill, write) keep in every impl, drawn by
hypothesis: non-contiguous views give the reference's answer on contiguous copies, every float
dtype its tolerance (float64 refused by the Triton compute kernels; the copy kernel takes every
dtype), and empty batches, empty sequences and padding rows give the contract's empty or zero
outputs. Shared settings and checks: :mod:`tests.support.properties`."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.support.devices import DEVICE, generator, randn
from tests.support.operator_inputs import paged_cache
from tests.support.properties import IMPLS, PROPERTY, assert_close, dtypes, impl_outputs, relayout_all, seeds
from minimax_lab.paged_kv.decode import paged_decode
from minimax_lab.paged_kv.prefill import paged_prefill
from minimax_lab.paged_kv.write import write_kv


@PROPERTY
@given(data=st.data(), lengths=st.lists(st.integers(0, 50), min_size=1, max_size=3), page=st.sampled_from([4, 16]),
       Hkv=st.integers(1, 2), group=st.integers(1, 4), D=st.sampled_from([16, 24]),
       num_splits=st.sampled_from([None, 1, 3]), dtype=dtypes, seed=seeds)
def test_paged_decode_layouts_and_dtypes(data, lengths, page, Hkv, group, D, num_splits, dtype, seed):
    g = generator(seed)
    ins = paged_cache(lengths, page=page, Hkv=Hkv, D=D, gen=g, dtype=dtype)
    ins["q"] = randn(len(lengths), Hkv * group, D, gen=g, dtype=dtype)
    want = paged_decode(**ins, impl="reference")
    for b, n in enumerate(lengths):  # a sequence with no token gives zeros
        if n == 0:
            assert torch.equal(want[b], torch.zeros_like(want[b]))
    views = relayout_all(data, ins)
    def run(impl):
        return paged_decode(**views, impl=impl, **({"num_splits": num_splits} if impl == "triton" else {}))
    for impl, got in impl_outputs(IMPLS, dtype, run):
        assert got.dtype == dtype
        assert_close(got, want, dtype, f"paged_decode {impl}")


@PROPERTY
@given(data=st.data(), lengths=st.lists(st.integers(1, 40), min_size=1, max_size=2), S=st.integers(1, 6),
       ragged=st.booleans(), Hkv=st.integers(1, 2), group=st.integers(1, 2), dtype=dtypes, seed=seeds)
def test_paged_prefill_layouts_and_dtypes(data, lengths, S, ragged, Hkv, group, dtype, seed):
    g = generator(seed)
    S = min(S, min(lengths))
    ins = paged_cache(lengths, page=16, Hkv=Hkv, D=16, gen=g, dtype=dtype)
    ins["q"] = randn(len(lengths), S, Hkv * group, 16, gen=g, dtype=dtype)
    if ragged:
        ins["q_lens"] = torch.randint(0, S + 1, (len(lengths),), generator=g).to(DEVICE, torch.int32)
    want = paged_prefill(**ins, impl="reference")
    views = relayout_all(data, ins)
    for impl, got in impl_outputs(IMPLS, dtype, lambda impl: paged_prefill(**views, impl=impl)):
        assert got.dtype == dtype
        assert_close(got, want, dtype, f"paged_prefill {impl}")
        if ragged:  # padding rows are zeros
            for b, n in enumerate(ins["q_lens"].tolist()):
                assert torch.equal(got[b, n:], torch.zeros_like(got[b, n:])), impl


@PROPERTY
@given(data=st.data(), T=st.integers(1, 6), page=st.sampled_from([4, 16]), Hkv=st.integers(1, 2),
       D=st.sampled_from([16, 24]), new_dtype=dtypes, cache_dtype=dtypes, seed=seeds)
def test_write_kv_layouts_and_dtypes(data, T, page, Hkv, D, new_dtype, cache_dtype, seed):
    g = generator(seed)
    P = 3
    slots = torch.randperm(P * page, generator=g)[:T]
    slots[torch.rand(T, generator=g) < 0.25] = -1  # padding tokens write nothing
    k_new, v_new = randn(T, Hkv, D, gen=g, dtype=new_dtype), randn(T, Hkv, D, gen=g, dtype=new_dtype)
    k0, v0 = randn(P, page, Hkv, D, gen=g, dtype=cache_dtype), randn(P, page, Hkv, D, gen=g, dtype=cache_dtype)
    want_k, want_v = k0.clone(), v0.clone()
    write_kv(k_new, v_new, want_k, want_v, slots.to(DEVICE), impl="reference")
    for impl in IMPLS:
        views = relayout_all(data, {"k_new": k_new, "v_new": v_new, "k_cache": k0.clone(), "v_cache": v0.clone(),
                                     "slot_mapping": slots.to(DEVICE)})
        write_kv(**views, impl=impl)  # a copy kernel: every float dtype, through any strides
        assert torch.equal(views["k_cache"], want_k) and torch.equal(views["v_cache"], want_v), impl


@pytest.mark.parametrize("impl", IMPLS)
def test_paged_kernels_empty_inputs(impl):
    g = generator(2)
    ins = paged_cache([0, 20], page=16, Hkv=1, D=16, gen=g)
    o = paged_decode(randn(2, 2, 16, gen=g), **ins, impl=impl)
    assert torch.equal(o[0], torch.zeros_like(o[0]))  # a sequence with no token
    empty = {"block_table": ins["block_table"][:0], "seq_lens": ins["seq_lens"][:0]}
    kv = {"k_cache": ins["k_cache"], "v_cache": ins["v_cache"]}
    assert paged_decode(randn(0, 2, 16, gen=g), **kv, **empty, impl=impl).shape == (0, 2, 16)
    assert paged_prefill(randn(0, 3, 2, 16, gen=g), **kv, **empty, impl=impl).shape == (0, 3, 2, 16)
    assert paged_prefill(randn(2, 0, 2, 16, gen=g), **ins, impl=impl).shape == (2, 0, 2, 16)
    full = paged_cache([5, 20], page=16, Hkv=1, D=16, gen=g)
    o = paged_prefill(randn(2, 1, 2, 16, gen=g), **full, q_lens=torch.tensor([0, 0], dtype=torch.int32, device=DEVICE),
                      impl=impl)
    assert torch.equal(o, torch.zeros_like(o))  # no real row: all padding
    k, v = ins["k_cache"].clone(), ins["v_cache"].clone()
    write_kv(randn(0, 1, 16, gen=g), randn(0, 1, 16, gen=g), k, v, torch.zeros(0, dtype=torch.int64, device=DEVICE),
             impl=impl)
    assert torch.equal(k, ins["k_cache"]) and torch.equal(v, ins["v_cache"])
