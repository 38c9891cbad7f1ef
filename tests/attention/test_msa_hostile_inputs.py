"""Regression tests for inputs a new user hands MSA (selection, prefill, paged decode): each test is
one finding that used to give a silent wrong answer, a crash or a cryptic error, and now gives the
right answer or a clear ``TypeError``/``ValueError``. Inputs live on the kernel device (the GPU, or
the CPU under the Triton interpreter); tolerances follow the dtype actually computed. Findings that
hold for several operators at once: ``tests/core/test_hostile_inputs.py``."""
from __future__ import annotations

import pytest
import torch

from minimax_lab.attention import msa_attention, msa_decode_paged, msa_select
from tests.support.devices import DEVICE, relative_error, tol
from tests.support.operator_inputs import msa_decode_inputs, msa_prefill_inputs, relayout

IMPLS = ("reference", "torch", "triton")


@pytest.mark.parametrize("impl", IMPLS)
def test_msa_decode_paged_cache_strided_in_last_dim(impl):
    # finding: impl="triton" read K/V as if unit-stride along head_dim (0.55 relative error)
    ins = msa_decode_inputs([70, 33], seed=1)
    want = msa_decode_paged(**ins, topk=3, impl=impl)
    strided = {n: relayout(ins[n], "last_dim_strided") for n in ("k_cache", "v_cache", "k_idx_cache", "q", "q_idx")}
    got = msa_decode_paged(**{**ins, **strided}, topk=3, impl=impl)
    assert relative_error(got, want) < 1e-5


def _reference_selection(ins, **kw):
    return msa_select(ins["q_idx"], ins["k_idx"], impl="reference", **kw)


@pytest.mark.parametrize("impl", IMPLS)
def test_msa_selected_with_duplicates_or_bad_ids_raises(impl):
    # finding: duplicate block ids were double-counted (the block's keys entered the softmax twice)
    ins = msa_prefill_inputs(B=1, S=45)
    kw = dict(block_size=16, topk=3)
    sel = _reference_selection(ins, **kw)
    dup = sel.clone()
    dup[0, 40, 0, 1] = dup[0, 40, 0, 0]  # row 40 sees blocks 0..2: a repeated id
    with pytest.raises(ValueError, match="duplicate"):
        msa_attention(**ins, **kw, impl=impl, selected=dup)
    future = sel.clone()
    future[0, 5, 1, 1] = 2  # token 5 lies in block 0: block 2 is in its future
    with pytest.raises(ValueError, match="causal"):
        msa_attention(**ins, **kw, impl=impl, selected=future)
    for bad in (-2, 3, 2**30):
        wrong = sel.clone()
        wrong[0, 44, 0, 0] = bad
        with pytest.raises(ValueError, match="selected"):
            msa_attention(**ins, **kw, impl=impl, selected=wrong)
    with pytest.raises(ValueError, match="selected"):
        msa_attention(**ins, **kw, impl=impl, selected=sel.long())


@pytest.mark.parametrize("impl", IMPLS)
def test_msa_empty_selection_rows_give_zero_output_and_minus_inf_lse(impl):
    # finding: an all -1 row gave NaN in two impls and 0 in the third; the contract is now 0 and
    # lse -inf (as dense attention's rows that see no key), the other rows untouched
    ins = msa_prefill_inputs(B=2, S=45)
    kw = dict(block_size=16, topk=3)
    sel = _reference_selection(ins, **kw)
    want_o, want_lse = msa_attention(**ins, **kw, impl="reference", selected=sel, return_lse=True)
    empty = sel.clone()
    empty[1, 30] = -1          # both groups of one token
    empty[0, 7, 1] = -1        # one group of another
    o, lse = msa_attention(**ins, **kw, impl=impl, selected=empty, return_lse=True)
    assert torch.isfinite(o).all()
    assert torch.equal(o[1, 30], torch.zeros_like(o[1, 30]))
    assert torch.equal(o[0, 7, 2:], torch.zeros_like(o[0, 7, 2:]))  # heads 2, 3 = group 1
    assert bool((lse[1, :, 30] == float("-inf")).all()) and bool((lse[0, 2:, 7] == float("-inf")).all())
    keep = torch.ones(2, 45, 4, dtype=torch.bool, device=DEVICE)
    keep[1, 30] = False
    keep[0, 7, 2:] = False
    assert relative_error(o[keep], want_o[keep]) < tol(torch.float32)  # TF32 dots for impl="triton" on a GPU


@pytest.mark.parametrize("impl", IMPLS)
def test_msa_decode_paged_checks_the_block_table(impl):
    # findings: page ids were never checked (out of range -> NaN, 10**6 -> segfault), and a -1
    # inside a sequence's length gave three different answers in the three impls
    ins = msa_decode_inputs([70, 33], seed=8)
    P = ins["k_cache"].shape[0]
    for bad in (P, 10**6, -2):
        table = ins["block_table"].clone()
        table[0, 1] = bad
        with pytest.raises(ValueError, match="page ids"):
            msa_decode_paged(**{**ins, "block_table": table}, topk=3, impl=impl)
    hole = ins["block_table"].clone()
    hole[1, 2] = -1  # sequence 1 has 33 tokens: pages 0..2
    with pytest.raises(ValueError, match="-1"):
        msa_decode_paged(**{**ins, "block_table": hole}, topk=3, impl=impl)
    for lens in ([-1, 33], [0, 33], [70, 10**6]):
        with pytest.raises(ValueError, match="seq_lens"):
            msa_decode_paged(**{**ins, "seq_lens": torch.tensor(lens, dtype=torch.int32, device=DEVICE)}, topk=3,
                             impl=impl)
    with pytest.raises(ValueError, match="seq_lens"):
        msa_decode_paged(**{**ins, "seq_lens": ins["seq_lens"].long()}, topk=3, impl=impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_msa_select_rejects_absurd_topk_and_empty_groups(impl):
    # findings: topk=2**31 tried to allocate tens of GB; G=0 -> ZeroDivisionError
    ins = msa_prefill_inputs(B=1, S=20)
    with pytest.raises(ValueError, match="topk"):
        msa_select(ins["q_idx"], ins["k_idx"], block_size=16, topk=2**31, impl=impl)
    with pytest.raises(ValueError, match="group"):
        msa_select(ins["q_idx"][:, :, :0], ins["k_idx"], block_size=16, topk=2, impl=impl)
    with pytest.raises(ValueError, match="group"):
        msa_attention(ins["q"][:, :, :0], ins["k"][:, :, :0], ins["v"][:, :, :0], ins["q_idx"][:, :, :0],
                      ins["k_idx"], block_size=16, topk=2, impl=impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_msa_empty_batch_and_empty_sequence(impl):
    # finding: B=0 -> ZeroDivisionError in impl="triton"; the contract: empty in, empty out
    ins = msa_prefill_inputs(B=2, S=20)
    for sl in (slice(0, 0), slice(None)):
        for tok in (slice(0, 0), slice(None)):
            part = {n: t[sl][:, tok] for n, t in ins.items()}
            o, lse = msa_attention(**part, block_size=16, topk=2, impl=impl, return_lse=True)
            assert o.shape == part["q"].shape and lse.shape == (o.shape[0], 4, o.shape[1])
            sel = msa_select(part["q_idx"], part["k_idx"], block_size=16, topk=2, impl=impl)
            assert sel.shape == (*part["q_idx"].shape[:3], 2) and sel.dtype == torch.int32
    d = msa_decode_inputs([])
    assert msa_decode_paged(**d, topk=2, impl=impl).shape == (0, 1, 4, 16)


@pytest.mark.parametrize("impl", IMPLS)
def test_msa_scale_must_be_a_finite_number(impl):
    ins = msa_prefill_inputs(B=1, S=20)
    d = msa_decode_inputs([20])
    for bad, err in ((float("nan"), ValueError), (float("inf"), ValueError), ("0.1", TypeError), (True, TypeError)):
        with pytest.raises(err, match="scale"):
            msa_attention(**ins, block_size=16, topk=2, impl=impl, scale=bad)
        with pytest.raises(err, match="scale"):
            msa_decode_paged(**d, topk=2, impl=impl, scale=bad)
