"""Properties dense attention keeps in every impl, drawn by hypothesis: non-contiguous views give
the reference's answer on contiguous copies, every float dtype its tolerance (float64 refused by
the Triton kernel), empty inputs give zeros and ``-inf`` lse, and GQA reads K/V without a copy.
Shared settings and checks: :mod:`tests.support.properties`."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.support.devices import generator, randn
from tests.support.properties import (IMPLS, PROPERTY, assert_close, assert_same_lse, dtypes, impl_outputs,
                                      relayout_all, seeds)
from minimax_lab.attention import attention


@PROPERTY
@given(data=st.data(), B=st.integers(1, 2), S=st.integers(1, 20), Skv=st.integers(1, 24), Hkv=st.integers(1, 2),
       group=st.integers(1, 2), D=st.sampled_from([16, 24]), causal=st.booleans(), dtype=dtypes, seed=seeds)
def test_attention_layouts_and_dtypes(data, B, S, Skv, Hkv, group, D, causal, dtype, seed):
    g = generator(seed)
    ins = {"q": randn(B, S, Hkv * group, D, gen=g, dtype=dtype), "k": randn(B, Skv, Hkv, D, gen=g, dtype=dtype),
           "v": randn(B, Skv, Hkv, D, gen=g, dtype=dtype)}
    want, want_lse = attention(**ins, causal=causal, impl="reference", return_lse=True)
    views = relayout_all(data, ins)
    for impl, (o, lse) in impl_outputs(IMPLS, dtype, lambda impl: attention(**views, causal=causal, impl=impl,
                                                                            return_lse=True)):
        assert o.dtype == dtype and o.shape == want.shape
        assert_close(o, want, dtype, f"attention {impl}")
        assert_same_lse(lse, want_lse, dtype, f"attention lse {impl}")


@pytest.mark.parametrize("impl", IMPLS)
def test_attention_empty_inputs(impl):
    g = generator(1)
    q, k = randn(1, 3, 2, 16, gen=g), randn(1, 5, 1, 16, gen=g)
    for qq, kk in ((q[:0], k[:0]), (q[:, :0], k), (q, k[:, :0])):
        o, lse = attention(qq, kk, kk, impl=impl, return_lse=True)
        assert o.shape == qq.shape and lse.shape == (qq.shape[0], 2, qq.shape[1])
        assert torch.equal(o, torch.zeros_like(o)) and bool((lse == float("-inf")).all())


def test_flash_gqa_reads_kv_without_a_copy():
    # dense.py: "no K/V copy in 'triton'" -- GQA maps query heads to kv heads by pointer arithmetic
    from tests.support.operator_inputs import DeviceWork

    g = generator(5)
    q, k, v = randn(1, 4, 8, 16, gen=g), randn(1, 96, 1, 16, gen=g), randn(1, 96, 1, 16, gen=g)
    with torch.no_grad(), DeviceWork() as work:
        o = attention(q, k, v, impl="triton")
    assert work.largest_new < k.numel() * 2, f"allocated {work.largest_new} elements (K has {k.numel()})"
    assert_close(o, attention(q, k, v, impl="reference"), torch.float32, "attention triton GQA")
