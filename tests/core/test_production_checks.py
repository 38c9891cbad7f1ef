"""The checks that hold every Triton kernel to its fp32 reference at production shapes on a GPU
(:mod:`tests.support.production_checks`; each operator's ``test_*_production.py`` runs them there),
run here at tiny shapes on any device: with the real kernels they must pass, with broken ones they
must fail. So the checks themselves are tested where the GPU tests cannot run. They span every
operator because they test the shared checks, not an operator.
"""
from __future__ import annotations

import pytest
import torch
from tests.support.devices import DEVICE, ON_GPU
from tests.support.production_checks import (assert_selection_matches, block_scores_rows, check_dense_prefill, check_moe,
                                             check_msa_decode, check_msa_prefill, check_paged_decode,
                                             check_paged_prefill, check_write_kv, dense_rows_reference, flash,
                                             msa_rows_reference, msa_schedules, msa_select_triton, sample_rows)

from minimax_lab import runtime
from minimax_lab.attention import attention, msa_attention, msa_decode_paged, msa_select
from minimax_lab.attention.msa_reference import msa_attention_reference, select_from_scores_reference
from minimax_lab.paged_kv.decode import paged_decode
from minimax_lab.paged_kv.prefill import paged_prefill
from minimax_lab.paged_kv.write import write_kv
from minimax_lab.moe.experts_triton import experts_triton


# --------------------------------------------------------------------------- the checks themselves, tiny


F32 = torch.float32
TINY_MSA = dict(Hq=4, G=2, D=16, Didx=16, Bk=16, topk=3)


def test_sample_rows_cover_the_edges():
    rows = sample_rows(300, 20, block_size=16, seed=1)
    assert rows.device.type == DEVICE.type and rows.numel() == 20
    assert {0, 15, 16, 31, 32, 287, 288, 299} <= set(rows.tolist())
    assert rows.tolist() == sorted(set(rows.tolist())) and 0 <= int(rows.min()) and int(rows.max()) < 300


def test_row_references_equal_the_full_references():
    g = torch.Generator().manual_seed(0)
    mk = lambda *s: torch.randn(*s, generator=g).to(DEVICE)  # noqa: E731
    q, k, v = mk(2, 50, 4, 16), mk(2, 50, 2, 16), mk(2, 50, 2, 16)
    rows = sample_rows(50, 9, block_size=16, seed=2)
    o, lse = attention(q, k, v, impl="reference", return_lse=True)
    ro, rl = dense_rows_reference(q, k, v, rows)
    assert torch.allclose(ro, o[:, rows], atol=1e-5) and torch.allclose(rl, lse[:, :, rows], atol=1e-5)
    qi, ki = mk(2, 50, 2, 8), mk(2, 50, 8)
    o, lse = msa_attention_reference(q, k, v, qi, ki, block_size=16, topk=2, return_lse=True)
    sel = msa_select(qi, ki, block_size=16, topk=2, impl="reference")
    scores = block_scores_rows(qi[:, rows], ki, rows, 16)
    assert torch.equal(select_from_scores_reference(scores, rows[None, :, None], 16, 2), sel[:, rows])
    ro, rl = msa_rows_reference(q[:, rows], k, v, sel[:, rows], rows, block_size=16)
    assert torch.allclose(ro, o[:, rows], atol=1e-5) and torch.allclose(rl, lse[:, :, rows], atol=1e-5)


def _tiny(name):
    """(check function, keyword arguments) of each check at a tiny shape, with the real kernels."""
    return {
        "dense": (check_dense_prefill, dict(B=2, S=70, Hq=4, Hkv=2, D=16, dtype=F32, n_rows=12, attention=flash())),
        "msa_prefill": (check_msa_prefill, dict(B=1, S=70, **TINY_MSA, dtype=F32, n_rows=12,
                                                select=msa_select_triton(16, 3), attend=msa_schedules(16, 3))),
        "moe": (check_moe, dict(T=9, E=8, k=2, d=32, f=24, dtype=F32, experts=experts_triton)),
        "paged_decode": (check_paged_decode, dict(lengths=[70, 33, 1], Hq=4, Hkv=2, D=16, page=16, dtype=F32,
                                                  decode=lambda *a: paged_decode(*a, impl="triton"))),
        "msa_decode": (check_msa_decode, dict(lengths=[70, 40], T=2, Hq=4, G=2, D=16, Didx=16, page=16, topk=3,
                                              dtype=F32, decode=lambda *a: msa_decode_paged(
                                                  *a, topk=3, impl="triton", return_selected=True))),
        "paged_prefill": (check_paged_prefill, dict(prefix_lens=[20, 3], S=9, Hq=4, Hkv=2, D=16, page=16,
                                                    dtype=F32, prefill=lambda q, kc, vc, bt, lens, ql: paged_prefill(
                                                        q, kc, vc, bt, lens, q_lens=ql, impl="triton"))),
        "write_kv": (check_write_kv, dict(T=9, pages=4, page=16, Hkv=2, D=16, dtype=F32,
                                          write=lambda *a: write_kv(*a, impl="triton"))),
    }[name]


@pytest.mark.parametrize("name", ["dense", "msa_prefill", "moe", "paged_decode", "msa_decode", "paged_prefill",
                                  "write_kv"])
def test_check_passes_the_real_kernel_at_a_tiny_shape(name):
    check, kw = _tiny(name)
    check(**kw)


def _reversed_picks(sel):
    """A wrong selection: every row's earlier picks in reverse order (ascending score, or ids out
    of their ascending order where a row selects all its blocks)."""
    return torch.cat([sel[..., :-1].flip(-1), sel[..., -1:]], dim=-1)


def _without_local_block(sel):
    """A wrong selection: each row's local block (its largest id) dropped."""
    return torch.where(sel == sel.amax(-1, keepdim=True), -1, sel)


def _broken(name):
    """The same check handed a kernel with one plausible bug (torch impls, so it is quick): it must fail."""
    from minimax_lab.moe import moe_experts
    check, kw = _tiny(name.replace("_attention", ""))
    torch_select = lambda qi, ki: msa_select(qi, ki, block_size=16, topk=3, impl="torch")  # noqa: E731
    bugs = {
        "dense": dict(attention=lambda q, k, v: attention(q, k, v, impl="torch", return_lse=True, scale=0.3)),
        "msa_prefill": dict(select=lambda qi, ki: _reversed_picks(torch_select(qi, ki))),
        "msa_prefill_attention": dict(select=torch_select, attend={"no_local": lambda q, k, v, qi, ki, sel: msa_attention(
            q, k, v, qi, ki, block_size=16, topk=3, impl="torch", return_lse=True, selected=_without_local_block(sel))}),
        "moe": dict(experts=lambda x, wgu, wd, w, ids: moe_experts(  # every token's second expert dropped
            x, wgu, wd, w * (torch.arange(w.shape[1], device=w.device) == 0), ids, impl="torch")),
        "paged_decode": dict(decode=lambda q, kc, vc, bt, lens: paged_decode(  # the newest token not read
            q, kc, vc, bt, (lens - 1).clamp_min(0), impl="torch")),
        "msa_decode": dict(decode=lambda *a: (lambda o, sel: (o, _reversed_picks(sel)))(
            *msa_decode_paged(*a, topk=3, impl="torch", return_selected=True))),
        "paged_prefill": dict(prefill=lambda q, kc, vc, bt, lens, ql: paged_prefill(  # queries shifted by one
            torch.cat([q[:, 1:], q[:, :1]], 1), kc, vc, bt, lens, q_lens=ql, impl="torch")),
        "write_kv": dict(write=lambda kn, vn, kc, vc, slots: write_kv(  # the last token not written
            kn[:-1], vn[:-1], kc, vc, slots[:-1], impl="torch")),
    }
    return check, {**kw, **bugs[name]}


@pytest.mark.parametrize("name", ["dense", "msa_prefill", "msa_prefill_attention", "moe", "paged_decode",
                                  "msa_decode", "paged_prefill", "write_kv"])
def test_check_fails_a_broken_kernel(name):
    check, kw = _broken(name)
    with pytest.raises(AssertionError):
        check(**kw)


def test_selection_check_tolerates_only_near_ties():
    """Two blocks whose scores differ by less than eps may swap; anything more is a failure."""
    pos = torch.tensor([40], device=DEVICE)                    # block 2 of Bk=16: blocks 0, 1 earlier
    scores = torch.tensor([[[[1.0, 1.0 + 1e-5, 0.0]]]], device=DEVICE)
    ref = select_from_scores_reference(scores, pos[None, :, None], 16, 2)   # picks block 1, then local 2
    swapped = torch.tensor([[[[0, 2]]]], dtype=torch.int32, device=DEVICE)
    assert assert_selection_matches(swapped, ref, scores, topk=2, positions=pos, block_size=16) == 1
    with pytest.raises(AssertionError):
        assert_selection_matches(swapped, ref, scores + torch.tensor([0.0, 0.1, 0.0], device=DEVICE), topk=2,
                                 positions=pos, block_size=16)
    with pytest.raises(AssertionError):  # the local block must come last
        assert_selection_matches(torch.tensor([[[[2, 1]]]], dtype=torch.int32, device=DEVICE), ref, scores,
                                 topk=2, positions=pos, block_size=16)


def test_gpu_tests_are_skipped_only_without_a_gpu():
    """The production tests skip exactly when this run has no GPU running compiled kernels."""
    assert ON_GPU == (DEVICE.type == "cuda") == (not runtime.is_interpreter())
