"""Regression tests for inputs a new user hands the paged KV kernels (decode, prefill, write): each
test is one finding that used to give a silent wrong answer, a crash or a cryptic error, and now
gives the right answer or a clear ``TypeError``/``ValueError``. Inputs live on the kernel device
(the GPU, or the CPU under the Triton interpreter); tolerances follow the dtype actually computed.
Findings that hold for several operators at once: ``tests/core/test_hostile_inputs.py``."""
from __future__ import annotations

import pytest
import torch

from minimax_lab.paged_kv.decode import paged_decode
from minimax_lab.paged_kv.prefill import paged_prefill
from minimax_lab.paged_kv.write import write_kv
from tests.support.devices import DEVICE, generator, randn, relative_error, tol
from tests.support.operator_inputs import paged_cache, relayout

IMPLS = ("reference", "torch", "triton")


@pytest.mark.parametrize("impl", IMPLS)
def test_paged_kernels_cache_strided_in_last_dim(impl):
    g = generator(2)
    ins = paged_cache([40, 7], page=16, Hkv=2, D=16, gen=g)
    strided = {n: relayout(ins[n], "last_dim_strided") for n in ("k_cache", "v_cache")}
    q = randn(2, 4, 16, gen=g)
    want = paged_decode(q, **ins, impl=impl)
    assert relative_error(paged_decode(q, **{**ins, **strided}, impl=impl), want) < 1e-5
    q2 = randn(2, 3, 4, 16, gen=g)
    assert relative_error(paged_prefill(q2, **{**ins, **strided}, impl=impl), paged_prefill(q2, **ins, impl=impl)) < 1e-5
    kc, vc = (t.clone() for t in strided.values())
    k_new, v_new = randn(2, 2, 16, gen=g), randn(2, 2, 16, gen=g)
    slots = torch.tensor([5, 17], device=DEVICE)
    write_kv(k_new, v_new, kc, vc, slots, impl=impl)  # in place through the strided views
    assert torch.equal(kc[0, 5], k_new[0]) and torch.equal(vc[1, 1], v_new[1])


@pytest.mark.parametrize("q_dtype,cache_dtype", [(torch.float32, torch.float16), (torch.float16, torch.float32),
                                                 (torch.bfloat16, torch.float32)])
def test_paged_kernels_query_and_cache_dtypes_may_differ(q_dtype, cache_dtype):
    # finding (property hunt): impl="torch" failed with SDPA's raw "Expected query, key, and value to have
    # the same dtype" when q and the cache differed; the reference and Triton accepted them
    g = generator(12)
    ins = paged_cache([20, 7], page=16, Hkv=1, D=16, gen=g, dtype=cache_dtype)
    q, q2 = randn(2, 2, 16, gen=g, dtype=q_dtype), randn(2, 3, 2, 16, gen=g, dtype=q_dtype)
    want, want2 = paged_decode(q, **ins, impl="reference"), paged_prefill(q2, **ins, impl="reference")
    loose = max(tol(q_dtype), tol(cache_dtype))
    for impl in ("torch", "triton"):
        got, got2 = paged_decode(q, **ins, impl=impl), paged_prefill(q2, **ins, impl=impl)
        assert got.dtype == q_dtype and got2.dtype == q_dtype
        assert relative_error(got, want) < loose and relative_error(got2, want2) < loose
