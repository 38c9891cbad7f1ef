"""Every Triton kernel against its fp32 reference at production shapes, on the GPU.

The interpreter never runs what a GPU compiles (TMA descriptors, wgmma, software pipelining,
autotuned block shapes), so these ``gpu`` tests are the only check of the compiled paths:

* MSA prefill at 16k tokens, Hq=64 / Hkv=4 / D=128, Bk=128, topk=16: the index kernel's selection
  and both schedules (KV-outer -- also in several memory chunks -- and query-outer);
* dense FlashAttention at 16k: autotuned, TMA loads and pointer loads;
* MoE experts E=128, k=8, d=2048, f=768 at decode (T=64, 512) and prefill (T=4096) sizes, both
  MMA orientations and both one-launch alignment kernels;
* paged decode and MSA paged decode at 128k context, paged prefill over an 8k prefix, write_kv.

bf16 inputs (the GPU's compute dtype), bf16 tolerances. References on sampled query rows keep
them to seconds (see ``tests/production_checks.py``). The ``test_check_*`` tests below run the
same checks at tiny shapes on any device, with the real kernels (they must pass) and with broken
ones (they must fail): the checks themselves are tested where the GPU tests cannot run.
"""
from __future__ import annotations

import pytest
import torch
from tests.support.devices import DEVICE, ON_GPU, gpu_only
from tests.support.production_checks import (assert_selection_matches, block_scores_rows, check_dense_prefill, check_moe,
                               check_msa_decode, check_msa_prefill, check_paged_decode, check_paged_prefill,
                               check_write_kv, dense_rows_reference, msa_rows_reference, sample_rows)

from minimax_lab import runtime
from minimax_lab.attention import attention, msa_attention, msa_decode_paged, msa_select
from minimax_lab.attention.msa_reference import msa_attention_reference, select_from_scores_reference
from minimax_lab.paged_kv.decode import paged_decode
from minimax_lab.paged_kv.prefill import paged_prefill
from minimax_lab.paged_kv.write import write_kv
from minimax_lab.moe.experts_triton import experts_triton

BF16 = torch.bfloat16
MSA = dict(Hq=64, G=4, D=128, Didx=128, Bk=128, topk=16)           # MiniMax's public MSA shape
MOE = dict(E=128, k=8, d=2048, f=768)                               # the MoE bench's first GPU shape
CTX = 131072                                                        # 128k tokens of context


# --------------------------------------------------------------------------- kernels under test


def msa_select_triton(Bk, topk):
    return lambda q_idx, k_idx: msa_select(q_idx, k_idx, block_size=Bk, topk=topk, impl="triton")


def msa_schedules(Bk, topk, *, chunk_bytes=None):
    """The MSA prefill kernels given a selection: ``{name: fn(q, k, v, q_idx, k_idx, sel) -> (o, lse)}``."""
    from minimax_lab.attention.msa_triton_prefill import msa_attention_triton
    kw = dict(block_size=Bk, topk=topk, return_lse=True)
    fns = {s: (lambda s: lambda q, k, v, qi, ki, sel: msa_attention(q, k, v, qi, ki, impl="triton", schedule=s,
                                                                    selected=sel, **kw))(s)
           for s in ("kv", "query")}
    # end to end: the kernel selects for itself (deterministic: the same blocks as `sel`)
    fns["end_to_end"] = lambda q, k, v, qi, ki, sel: msa_attention(q, k, v, qi, ki, impl="triton", **kw)
    if chunk_bytes:  # KV-outer with its partial results in several query chunks
        fns["kv_chunked"] = lambda q, k, v, qi, ki, sel: msa_attention_triton(
            q, k, v, qi, ki, selected=sel, partial_budget_bytes=chunk_bytes, **kw)
    return fns


def flash(config=None):
    from minimax_lab.attention.dense_triton import flash_attention
    return lambda q, k, v: flash_attention(q, k, v, causal=True, return_lse=True, config=config)


# --------------------------------------------------------------------------- GPU, production shapes


@gpu_only
@pytest.mark.parametrize("S", [16384, 16384 - 37], ids=["s16k", "s16k_ragged"])
def test_msa_prefill_16k(S):
    err = check_msa_prefill(B=1, S=S, **MSA, dtype=BF16, n_rows=64, select=msa_select_triton(MSA["Bk"], MSA["topk"]),
                            attend=msa_schedules(MSA["Bk"], MSA["topk"], chunk_bytes=2**30))
    print(err)


@gpu_only
@pytest.mark.parametrize("S", [16384, 16000], ids=["s16k", "s16k_ragged"])
@pytest.mark.parametrize("variant", ["autotuned", "tma", "pointers"])
def test_dense_attention_16k(variant, S):
    from minimax_lab.attention.dense_triton import DEFAULT_CONFIG, _tma_ok
    hopper = torch.cuda.get_device_capability(DEVICE)[0] >= 9
    if variant == "tma":
        # the layout takes a TMA descriptor on Hopper or newer, so this config really loads by TMA
        assert _tma_ok(torch.empty(1, 16, 4, 128, dtype=BF16, device=DEVICE)) == hopper
    config = {"autotuned": None, "tma": dict(DEFAULT_CONFIG, USE_TMA=True),
              "pointers": dict(DEFAULT_CONFIG, USE_TMA=False)}[variant]
    print(check_dense_prefill(B=1, S=S, Hq=64, Hkv=4, D=128, dtype=BF16, n_rows=64, attention=flash(config)))


MOE_VARIANTS = {  # (T, config override, decode alignment kernel)
    "decode_t64": (64, None, "sort"),
    "decode_t64_unswapped": (64, {"SWAP_AB": False, "DOWN_SWAP_AB": False}, "sort"),
    "decode_t64_chunked_align": (64, None, "chunked"),
    "decode_wide_t512": (512, None, "sort"),
    "prefill_t4096": (4096, None, "sort"),
    "prefill_t4096_tma_grouped": (4096, {"USE_TMA": True, "GROUP_M": 8, "BLOCK_N": 128}, "sort"),
}


@gpu_only
@pytest.mark.parametrize("variant", list(MOE_VARIANTS))
def test_moe_experts_production(variant, monkeypatch):
    from minimax_lab.moe import experts_triton as et
    T, config, align = MOE_VARIANTS[variant]
    monkeypatch.setattr(et, "DECODE_ALIGN", align)
    print(check_moe(T=T, **MOE, dtype=BF16, experts=lambda *a: et.experts_triton(*a, config=config)))


@gpu_only
@pytest.mark.parametrize("T,block_m", [(64, 16), (512, 32)])
def test_moe_alignment_kernels_production(T, block_m):
    from minimax_lab.moe.align import align_decode, align_tokens_triton, align_tokens_unchecked
    g = torch.Generator(device=DEVICE).manual_seed(T)
    ids = torch.randint(0, MOE["E"], (T, MOE["k"]), generator=g, device=DEVICE)
    want = align_tokens_unchecked(ids, MOE["E"], block_m)
    for fn in (align_decode, align_tokens_triton):
        got = fn(ids, MOE["E"], block_m)
        assert torch.equal(got.sorted_ids, want.sorted_ids) and torch.equal(got.block_expert, want.block_expert)
        assert int(got.num_rows) == int(want.num_rows) and torch.equal(got.counts.long(), want.counts.long())


@gpu_only
@pytest.mark.parametrize("T,E,block_m", [(4096, 128, 128), (16384, 128, 128), (16384, 256, 64), (3001, 37, 128),
                                         (131072, 256, 128)])
def test_moe_prefill_alignment_production(T, E, block_m, monkeypatch):
    """align_prefill at prefill sizes (compiled, default chunk) equals the torch chain; and the
    experts take it (not the torch chain) above 4096 slots."""
    from minimax_lab.moe import experts_triton as et
    from minimax_lab.moe.align import align_prefill, align_tokens_unchecked
    g = torch.Generator(device=DEVICE).manual_seed(T)
    ids = torch.randint(0, E, (T, 8), generator=g, device=DEVICE)
    want = align_tokens_unchecked(ids, E, block_m)
    got = align_prefill(ids, E, block_m)
    assert torch.equal(got.sorted_ids, want.sorted_ids) and torch.equal(got.block_expert, want.block_expert)
    assert int(got.num_rows) == int(want.num_rows) and torch.equal(got.counts.long(), want.counts.long())
    assert et.PREFILL_ALIGN == "triton"
    monkeypatch.setattr(et, "align_tokens_unchecked", lambda *a: pytest.fail("the experts took the torch chain"))
    assert torch.equal(et._align(ids, E, block_m).sorted_ids, want.sorted_ids)


@gpu_only
@pytest.mark.parametrize("page,splits", [(16, None), (128, None), (16, 1)], ids=["p16", "p128", "p16_one_split"])
def test_paged_decode_128k(page, splits):
    lengths = [CTX, CTX - 37, 65537, 1]
    print(check_paged_decode(lengths=lengths, Hq=32, Hkv=8, D=128, page=page, dtype=BF16,
                             decode=lambda *a: paged_decode(*a, impl="triton", num_splits=splits)))


@gpu_only
def test_msa_decode_paged_128k():
    decode = lambda *a: msa_decode_paged(*a, topk=MSA["topk"], impl="triton", return_selected=True)  # noqa: E731
    print(check_msa_decode(lengths=[CTX, CTX - 100], T=1, Hq=MSA["Hq"], G=MSA["G"], D=MSA["D"], Didx=MSA["Didx"],
                           page=MSA["Bk"], topk=MSA["topk"], dtype=BF16, decode=decode))


@gpu_only
def test_paged_prefill_production():
    prefill = lambda q, kc, vc, bt, lens, ql: paged_prefill(q, kc, vc, bt, lens, q_lens=ql, impl="triton")  # noqa: E731
    print(check_paged_prefill(prefix_lens=[8192, 8192 - 5], S=2048, Hq=32, Hkv=8, D=128, page=16, dtype=BF16,
                              prefill=prefill))


@gpu_only
def test_write_kv_production():
    assert check_write_kv(T=8192, pages=8192, page=16, Hkv=8, D=128, dtype=BF16,
                          write=lambda *a: write_kv(*a, impl="triton")) == 8191


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
