"""MSA kernels against the fp32 reference at tiny sizes, on the kernel device (the interpreter on
the CPU, compiled kernels on a GPU, where fp32 attention dots run in TF32: its tolerance; the
index kernels ask for full fp32, so selections stay exact there too).

Index inputs are drawn from a coarse grid (multiples of 1/4, D_idx = 16 or 64) so every dot
product and the 1/sqrt(D_idx) scaling are exact in fp32: scores tie often and exactly, and the
selection must then match the reference bit for bit, ties broken to the lower block id.
"""
from __future__ import annotations

import zlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.devices import DEVICE, generator, randn, tol, to_device

from minimax_lab import measure
from minimax_lab.attention import msa_attention, msa_decode_paged, msa_select

# (B, S, G, hpg, D_idx, block_size, topk): ragged S, S < Bk, S <= topk*Bk (select all), batch > 1,
# several groups
CASES = {
    "ragged": (1, 45, 2, 2, 16, 16, 2),
    "s_lt_bk": (1, 9, 2, 1, 16, 16, 3),
    "select_all": (1, 40, 1, 2, 16, 16, 3),
    "batch_groups": (2, 37, 3, 1, 64, 16, 2),
}


TRITON_TOL = tol(torch.float32)              # fp32 inputs: TF32 attention dots on a GPU
TORCH_TOL = tol(torch.float32, tf32=False)


def coarse(*shape, gen):
    return to_device(torch.randint(-2, 3, shape, generator=gen).float() / 4)


def make(case, seed, D=16):
    B, S, G, hpg, Di, bs, k = case
    g = generator(seed)
    return dict(q=randn(B, S, G * hpg, D, gen=g), k=randn(B, S, G, D, gen=g),
                v=randn(B, S, G, D, gen=g), q_idx=coarse(B, S, G, Di, gen=g),
                k_idx=coarse(B, S, Di, gen=g)), dict(block_size=bs, topk=k)


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("name", list(CASES))
def test_select_matches_reference_exactly(impl, name):
    ins, kw = make(CASES[name], seed=zlib.crc32(name.encode()) % 1000)
    want = msa_select(ins["q_idx"], ins["k_idx"], impl="reference", **kw)
    got = msa_select(ins["q_idx"], ins["k_idx"], impl=impl, **kw)
    assert got.dtype == torch.int32 and got.shape == want.shape and got.device.type == DEVICE.type
    assert torch.equal(got, want)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_select_all_ties_go_to_lower_ids(impl):
    # every block scores the same: the topk-1 earliest blocks, then the local one
    S, bs, k = 70, 16, 3
    q_idx = torch.ones(1, S, 1, 16, device=DEVICE)
    k_idx = torch.ones(1, S, 16, device=DEVICE)
    got = msa_select(q_idx, k_idx, block_size=bs, topk=k, impl=impl)
    assert got[0, 69, 0].tolist() == [0, 1, 4]
    assert got[0, 20, 0].tolist() == [0, 1, -1]
    assert torch.equal(got, msa_select(q_idx, k_idx, block_size=bs, topk=k, impl="reference"))


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_select_exact_on_distinct_scores(impl):
    g = generator(3)
    q_idx, k_idx = randn(1, 90, 2, 16, gen=g), randn(1, 90, 16, gen=g)
    want = msa_select(q_idx, k_idx, block_size=16, topk=3, impl="reference")
    assert torch.equal(msa_select(q_idx, k_idx, block_size=16, topk=3, impl=impl), want)
    # the rule itself: local block last, earlier picks in descending score
    assert bool((want[0, 89, :, -1] == 5).all())


@settings(max_examples=12, deadline=None)
@given(S=st.integers(1, 60), G=st.integers(1, 3), bs=st.sampled_from([16, 32]), topk=st.integers(1, 4),
       seed=st.integers(0, 10_000))
def test_select_torch_property(S, G, bs, topk, seed):
    g = generator(seed)
    q_idx, k_idx = coarse(1, S, G, 16, gen=g), coarse(1, S, 16, gen=g)
    got = msa_select(q_idx, k_idx, block_size=bs, topk=topk, impl="torch")
    assert torch.equal(got, msa_select(q_idx, k_idx, block_size=bs, topk=topk, impl="reference"))
    t = torch.arange(S, device=DEVICE)
    assert bool((got[0, :, :, :].max(-1).values.long() == (t // bs)[:, None]).all())  # local block always in


@pytest.mark.parametrize("impl,schedule", [("torch", "kv"), ("triton", "kv"), ("triton", "query")])
@pytest.mark.parametrize("name", ["ragged", "s_lt_bk", "batch_groups"])
def test_attention_matches_reference(impl, schedule, name):
    ins, kw = make(CASES[name], seed=7)
    o_ref, lse_ref = msa_attention(**ins, impl="reference", return_lse=True, **kw)
    o, lse = msa_attention(**ins, impl=impl, schedule=schedule, return_lse=True, **kw)
    assert o.shape == o_ref.shape and lse.shape == lse_ref.shape
    bound = TRITON_TOL if impl == "triton" else TORCH_TOL
    assert measure.relative_error(o, o_ref) < bound
    assert measure.relative_error(lse, lse_ref) < bound


@pytest.mark.parametrize("l2_tokens,budget", [(8, None), (5, 3000), (0, 3000)])
def test_kv_outer_sub_chunks_and_memory_chunks_match_reference(l2_tokens, budget):
    # the KV-outer work order (L2 sub-chunks of 8 or a ragged 5 tokens) and the partial-memory
    # chunking (a budget of a few tokens) only reorder work: the output must not change
    from minimax_lab.attention.msa_triton_prefill import PARTIAL_BUDGET_BYTES, msa_attention_triton

    ins, kw = make(CASES["batch_groups"], seed=11)
    o_ref, lse_ref = msa_attention(**ins, impl="reference", return_lse=True, **kw)
    o, lse = msa_attention_triton(**ins, return_lse=True, config={"L2_TOKENS": l2_tokens},
                                  partial_budget_bytes=budget or PARTIAL_BUDGET_BYTES, **kw)
    assert measure.relative_error(o, o_ref) < TRITON_TOL
    assert measure.relative_error(lse, lse_ref) < TRITON_TOL


@pytest.mark.parametrize("tokens_per_prog", [1, 3, 64])
def test_kv_outer_runs_of_one_or_many_tiles_match_reference(tokens_per_prog):
    # a KV-outer program prefetches the next tile's query rows and the entries after them: runs of
    # one tile, of a few, and of many (more than a block has in this case) must give the same output
    from minimax_lab.attention.msa_triton_prefill import msa_attention_triton

    ins, kw = make(CASES["batch_groups"], seed=13)
    o_ref = msa_attention(**ins, impl="reference", **kw)
    o = msa_attention_triton(**ins, config={"TOKENS_PER_PROG": tokens_per_prog}, **kw)
    assert measure.relative_error(o, o_ref) < TRITON_TOL


def fp8_index(ins, seed):
    """The case's index tensors in FP8 with one power-of-two scale per vector; the vectors are first
    spread by powers of two (2**-3 .. 2**3) so the scales differ from token to token and a kernel
    that ignored a key's scale would rank differently. Coarse inputs stay exact in e4m3."""
    from minimax_lab.attention.msa_index_fp8 import quantize_index_keys

    g = generator(seed)
    spread = lambda x: x * (2.0 ** torch.randint(-3, 4, x.shape[:-1], generator=g)).to(DEVICE)[..., None]  # noqa: E731
    q8, qs = quantize_index_keys(spread(ins["q_idx"]))
    k8, ks = quantize_index_keys(spread(ins["k_idx"]))
    return q8, k8, qs, ks


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("name", ["ragged", "select_all", "batch_groups"])
def test_select_with_fp8_index_ranks_the_dequantized_tensors(impl, name):
    from minimax_lab.attention.msa_index_fp8 import dequantize_index_keys

    ins, kw = make(CASES[name], seed=17)
    q8, k8, qs, ks = fp8_index(ins, seed=5)
    assert q8.element_size() == 1 and len(set(ks.flatten().tolist())) > 1
    want = msa_select(dequantize_index_keys(q8, qs), dequantize_index_keys(k8, ks), impl="reference", **kw)
    got = msa_select(q8, k8, q_idx_scale=qs, k_idx_scale=ks, impl=impl, **kw)
    assert torch.equal(got, want)
    # a non-contiguous view of the keys (every other token of a longer tensor) ranks the same
    k8_wide = torch.stack([k8, k8], dim=2).flatten(1, 2)[:, ::2]
    assert not k8_wide.is_contiguous()
    assert torch.equal(msa_select(q8, k8_wide, q_idx_scale=qs, k_idx_scale=ks, impl=impl, **kw), want)


@pytest.mark.parametrize("impl,schedule", [("torch", "kv"), ("triton", "kv"), ("triton", "query")])
def test_attention_with_fp8_index_matches_reference(impl, schedule):
    from minimax_lab.attention.msa_index_fp8 import dequantize_index_keys

    ins, kw = make(CASES["batch_groups"], seed=19)
    q8, k8, qs, ks = fp8_index(ins, seed=6)
    deq = {**ins, "q_idx": dequantize_index_keys(q8, qs), "k_idx": dequantize_index_keys(k8, ks)}
    o_ref = msa_attention(**deq, impl="reference", **kw)
    o = msa_attention(**{**ins, "q_idx": q8, "k_idx": k8}, q_idx_scale=qs, k_idx_scale=ks, impl=impl,
                      schedule=schedule, **kw)
    assert measure.relative_error(o, o_ref) < (TRITON_TOL if impl == "triton" else TORCH_TOL)


def test_selection_score_gap_is_zero_for_exact_and_grows_with_a_worse_pick():
    # the FP8 checks of the bench and tuner accept swaps of near-tied blocks only
    from minimax_lab.attention import msa_compare as mb
    from minimax_lab.attention.msa_torch import block_scores_torch

    g = generator(4)
    q_idx, k_idx = randn(2, 200, 2, 16, gen=g), randn(2, 200, 16, gen=g)
    kw = dict(block_size=16, topk=3)
    sel = msa_select(q_idx, k_idx, impl="reference", **kw)
    assert mb.selection_score_gap(sel, q_idx, k_idx, **kw) == 0.0
    scores = block_scores_torch(q_idx, k_idx, 16)[1, 199, 1, :12]  # row (b=1, t=199, g=1): local block 12
    worst = int(scores.argmin())
    bad = sel.clone()
    bad[1, 199, 1, 0] = worst  # its best earlier block replaced by its worst one
    gap = mb.selection_score_gap(bad, q_idx, k_idx, **kw)
    cut = scores[sel[1, 199, 1, :2].long()].min()
    assert gap == pytest.approx(float((cut - scores[worst]) / scores.abs().max()), rel=1e-5) and gap > 0.1
    bad[1, 199, 1, 0] = 13  # a block past the local one: cannot be seen
    assert mb.selection_score_gap(bad, q_idx, k_idx, **kw) == float("inf")
    fewer = sel.clone()
    fewer[0, 100, 0, 0] = -1
    assert mb.selection_score_gap(fewer, q_idx, k_idx, **kw) == float("inf")


def test_fp8_index_pair_refuses_bad_scales():
    ins, kw = make(CASES["ragged"], seed=1)
    q8, k8, qs, ks = fp8_index(ins, seed=1)
    with pytest.raises(ValueError, match="need q_idx_scale"):
        msa_select(q8, k8, k_idx_scale=ks, **kw)
    with pytest.raises(ValueError, match="only for float8_e4m3fn"):
        msa_select(ins["q_idx"], ins["k_idx"], q_idx_scale=qs, k_idx_scale=ks, **kw)
    with pytest.raises(ValueError, match="k_idx_scale must have shape"):
        msa_select(q8, k8, q_idx_scale=qs, k_idx_scale=ks[:, :3], **kw)
    with pytest.raises(ValueError, match="q_idx_scale must have dtype"):
        msa_select(q8, k8, q_idx_scale=qs.double(), k_idx_scale=ks, impl="triton", **kw)
    with pytest.raises(ValueError, match="k_idx"):  # one dtype for both index tensors
        msa_select(q8, ins["k_idx"], q_idx_scale=qs, k_idx_scale=ks, **kw)


def test_attention_select_all_equals_dense_causal():
    # S <= topk * Bk: every block is selected, so MSA is plain causal attention
    ins, kw = make(CASES["select_all"], seed=5)
    from minimax_lab.attention.dense_reference import attention_reference
    dense = attention_reference(ins["q"], ins["k"], ins["v"], causal=True)
    assert measure.relative_error(msa_attention(**ins, impl="triton", **kw), dense) < TRITON_TOL


def paged(B, T, G, hpg, D, Di, ps, lens, extra_pages, seed):
    g = generator(seed)
    n_pages = [(L + ps - 1) // ps for L in lens]
    P = sum(n_pages) + extra_pages
    maxp = max(n_pages) + 1
    perm = torch.randperm(P, generator=g)
    table = torch.full((B, maxp), -1, dtype=torch.int32)
    i = 0
    for b, n in enumerate(n_pages):
        table[b, :n] = perm[i:i + n].int()
        i += n
    return dict(q=randn(B, T, G * hpg, D, gen=g), k_cache=randn(P, ps, G, D, gen=g),
                v_cache=randn(P, ps, G, D, gen=g), block_table=to_device(table),
                seq_lens=torch.tensor(lens, dtype=torch.int32, device=DEVICE), q_idx=coarse(B, T, G, Di, gen=g),
                k_idx_cache=coarse(P, ps, Di, gen=g))


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("T,lens,topk", [(1, [70, 5, 33], 3), (2, [100, 17], 2)])
def test_decode_paged_matches_reference(impl, T, lens, topk):
    ins = paged(len(lens), T, 2, 2, 16, 16, 16, lens, extra_pages=3, seed=sum(lens))
    o_ref, sel_ref = msa_decode_paged(**ins, topk=topk, impl="reference", return_selected=True)
    o, sel = msa_decode_paged(**ins, topk=topk, impl=impl, return_selected=True)
    assert torch.equal(sel, sel_ref)
    assert measure.relative_error(o, o_ref) < (TRITON_TOL if impl == "triton" else TORCH_TOL)


@pytest.mark.parametrize("seed", range(4))
def test_decode_selection_kernel_is_the_torch_rule(seed):
    """The decode selection kernel against :func:`select_from_scores` on adversarial scores: many
    exact ties, ``-inf`` and ``-0.0``, negative scores, rows shorter than topk blocks, positions
    before the first token and past the table (unchecked inputs), ragged row counts."""
    from minimax_lab.attention.msa_torch import select_from_scores
    from minimax_lab.attention.msa_triton_decode import select_from_scores_triton

    g = torch.Generator().manual_seed(1000 + seed)
    for _ in range(3):
        B, T, G = (int(torch.randint(1, 4, (1,), generator=g)) for _ in range(3))
        nb, ps, topk = int(torch.randint(1, 45, (1,), generator=g)), 4, int(torch.randint(1, 10, (1,), generator=g))
        scores = torch.randint(-3, 4, (B, T, G, nb), generator=g).float() * 0.75
        scores[torch.rand(scores.shape, generator=g) < 0.2] = float("-inf")
        scores[torch.rand(scores.shape, generator=g) < 0.1] = -0.0
        lens = torch.randint(T - 1, nb * ps + 6, (B,), generator=g).int()
        pos = lens.long()[:, None] - T + torch.arange(T)
        want = select_from_scores(scores, pos[:, :, None], ps, topk)
        got = select_from_scores_triton(to_device(scores), to_device(lens), ps, topk)
        assert torch.equal(got.cpu(), want), (B, T, G, nb, topk, lens.tolist())


@pytest.mark.parametrize("impl", ["reference", "torch", "triton"])
@pytest.mark.parametrize("T,lens,topk", [(1, [70, 5, 33], 3), (2, [100, 17], 2)])
def test_decode_with_fp8_index_keys_ranks_the_dequantized_keys(impl, T, lens, topk):
    """FP8 index keys (power-of-two scale per token): every impl selects exactly what the reference
    selects on the dequantized keys, and attends alike; the keys really are stored in 1 byte."""
    from minimax_lab.attention.msa_index_fp8 import dequantize_index_keys, quantize_index_keys

    ins = paged(len(lens), T, 2, 2, 16, 16, 16, lens, extra_pages=3, seed=7 * sum(lens))
    ins["k_idx_cache"] = ins["k_idx_cache"] * 37.0  # keys far from e4m3's range: the scale matters
    k8, scale = quantize_index_keys(ins["k_idx_cache"])
    assert k8.element_size() == 1 and torch.all(torch.log2(scale) == torch.round(torch.log2(scale)))
    want_o, want_sel = msa_decode_paged(**{**ins, "k_idx_cache": dequantize_index_keys(k8, scale)}, topk=topk,
                                        impl="reference", return_selected=True)
    o, sel = msa_decode_paged(**{**ins, "k_idx_cache": k8}, k_idx_scale=scale, topk=topk, impl=impl,
                              return_selected=True)
    assert torch.equal(sel, want_sel)
    assert measure.relative_error(o, want_o) < (TRITON_TOL if impl == "triton" else TORCH_TOL)


@pytest.mark.parametrize("pages", [1, 3, 16])
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16])
def test_fp8_index_pass_with_16_bit_queries_scores_like_fp32(pages, q_dtype):
    """The index pass on FP8 keys with bf16/fp16 queries (its fp16-dot path, each query row moved
    into fp16's range by a power of two) against the fp32 scores of the dequantized keys: rows far
    above fp16's range (1e6) and far below it (1e-6), unused table entries, ragged lengths, a run
    of pages per program that does and does not divide the table, a non-contiguous query view."""
    from minimax_lab.attention.msa_index_fp8 import dequantize_index_keys, quantize_index_keys
    from minimax_lab.attention.msa_torch import paged_block_scores_torch
    from minimax_lab.attention.msa_triton_decode import paged_index_scores_triton

    ins = paged(3, 2, 2, 2, 16, 32, 16, [70, 5, 100], extra_pages=3, seed=pages)
    spread = 2.0 ** torch.randint(-6, 7, ins["k_idx_cache"].shape[:2], generator=generator(pages)).to(DEVICE)
    k8, scale = quantize_index_keys(ins["k_idx_cache"] * 37.0 * spread[..., None])  # scales differ per token
    q_wide = randn(3, 2, 2, 64, gen=generator(pages + 1))
    q_wide[0, :, 0] *= 1e6 if q_dtype == torch.bfloat16 else 1.5e4  # fp16 input near its top (65504)
    q_wide[1, :, 1] *= 1e-6
    q_idx = q_wide.to(q_dtype)[..., ::2]  # every other column: a view with a strided last dim
    assert not q_idx.is_contiguous() and torch.isfinite(q_idx).all()
    got = paged_index_scores_triton(q_idx, k8, ins["block_table"], ins["seq_lens"], scale, config={"PAGES": pages})
    want = paged_block_scores_torch(q_idx.float(), dequantize_index_keys(k8, scale), ins["block_table"],
                                    ins["seq_lens"])
    assert torch.equal(torch.isfinite(got), torch.isfinite(want))
    fin = torch.isfinite(want)
    row_max = want.masked_fill(~fin, 0).abs().amax(-1, keepdim=True).expand_as(want)[fin]
    assert ((got[fin] - want[fin]).abs() <= 1e-5 * row_max + 1e-30).all()


def test_fp8_index_keys_quantize_within_e4m3_rounding_and_refuse_bad_pairs():
    from minimax_lab.attention.msa_index_fp8 import dequantize_index_keys, quantize_index_keys

    g = generator(3)
    k = randn(5, 8, 32, gen=g) * torch.logspace(-3, 3, 5, device=DEVICE)[:, None, None]
    k[0, 0] = 0.0
    k8, scale = quantize_index_keys(k)
    back = dequantize_index_keys(k8, scale)
    assert scale[0, 0] == 1.0 and torch.all(back[0, 0] == 0)
    assert ((back - k).abs() <= k.abs() * 2.0 ** -4 + scale[..., None] * 2.0 ** -9).all()
    ins = paged(1, 1, 2, 2, 16, 16, 16, [40], extra_pages=1, seed=1)
    k8, scale = quantize_index_keys(ins["k_idx_cache"])
    with pytest.raises(ValueError, match="need k_idx_scale"):
        msa_decode_paged(**{**ins, "k_idx_cache": k8}, topk=2)
    with pytest.raises(ValueError, match="only for float8_e4m3fn"):
        msa_decode_paged(**ins, k_idx_scale=scale, topk=2)
    with pytest.raises(ValueError, match="k_idx_scale must have shape"):
        msa_decode_paged(**{**ins, "k_idx_cache": k8}, k_idx_scale=scale[:, :3], topk=2)
    with pytest.raises(ValueError, match="k_idx_scale must have dtype"):
        msa_decode_paged(**{**ins, "k_idx_cache": k8}, k_idx_scale=scale.double(), topk=2)


def test_decode_3d_query_and_prefill_agree():
    # decoding the last token of a paged sequence = the last row of prefill on the unpaged one
    ins = paged(1, 1, 2, 2, 16, 16, 16, [50], extra_pages=2, seed=1)
    o = msa_decode_paged(ins["q"][:, 0], ins["k_cache"], ins["v_cache"], ins["block_table"], ins["seq_lens"],
                         ins["q_idx"][:, 0], ins["k_idx_cache"], topk=2, impl="triton")
    assert o.shape == (1, 4, 16)
    from minimax_lab.attention.msa_reference import unpage
    k = unpage(ins["k_cache"], ins["block_table"], 0, 50)[None]
    v = unpage(ins["v_cache"], ins["block_table"], 0, 50)[None]
    ki = unpage(ins["k_idx_cache"], ins["block_table"], 0, 50)[None]
    q = torch.zeros(1, 50, 4, 16, device=DEVICE)
    q[:, -1] = ins["q"][:, 0]
    qi = torch.zeros(1, 50, 2, 16, device=DEVICE)
    qi[:, -1] = ins["q_idx"][:, 0]
    full = msa_attention(q, k, v, qi, ki, block_size=16, topk=2, impl="reference")
    assert measure.relative_error(o, full[:, -1]) < TRITON_TOL


def test_bad_input_raises():
    ins, kw = make(CASES["ragged"], seed=1)
    with pytest.raises(ValueError, match="multiple"):
        msa_attention(ins["q"][:, :, :3], ins["k"], ins["v"], ins["q_idx"], ins["k_idx"], **kw)
    with pytest.raises(ValueError, match="topk"):
        msa_select(ins["q_idx"], ins["k_idx"], block_size=16, topk=0)
    for bad in (48, 8, 256):
        with pytest.raises(ValueError, match="block_size"):
            msa_select(ins["q_idx"], ins["k_idx"], block_size=bad, topk=2)
    with pytest.raises(ValueError, match="k_idx"):
        msa_select(ins["q_idx"], ins["k_idx"][..., :8], **kw)
    with pytest.raises(ValueError, match="impl"):
        msa_select(ins["q_idx"], ins["k_idx"], impl="fast", **kw)
    with pytest.raises(TypeError):
        msa_select(ins["q_idx"].cpu().numpy(), ins["k_idx"], **kw)
    with pytest.raises(ValueError, match="one device"):
        msa_select(ins["q_idx"], ins["k_idx"].to("meta"), **kw)
    with pytest.raises(ValueError, match="needs tensors on"):  # the Triton kernels refuse other devices
        msa_select(ins["q_idx"].to("meta"), ins["k_idx"].to("meta"), impl="triton", **kw)
    with pytest.raises(ValueError, match="needs tensors on"):
        msa_attention(*(ins[n].to("meta") for n in ("q", "k", "v", "q_idx", "k_idx")), impl="triton", **kw)
    with pytest.raises(ValueError, match="groups"):
        msa_attention(ins["q"], ins["k"], ins["v"], ins["q_idx"][:, :, :1], ins["k_idx"], **kw)
    d = paged(1, 1, 2, 2, 16, 16, 16, [40], extra_pages=0, seed=2)
    with pytest.raises(ValueError, match="seq_lens"):
        msa_decode_paged(**{**d, "seq_lens": torch.tensor([999], dtype=torch.int32, device=DEVICE)}, topk=2)
    with pytest.raises(ValueError, match="block_table"):
        msa_decode_paged(**{**d, "block_table": d["block_table"].long()}, topk=2)
    with pytest.raises(ValueError, match="k_idx_cache"):
        msa_decode_paged(**{**d, "k_idx_cache": d["k_idx_cache"][..., :8]}, topk=2)


def test_index_pass_config_rejects_unknown_keys():
    from minimax_lab.attention.msa_triton_decode import paged_index_scores_triton
    q_idx = torch.zeros(1, 1, 1, 16, device=DEVICE)
    k_idx = torch.zeros(2, 16, 16, device=DEVICE)
    table = torch.zeros(1, 2, dtype=torch.int32, device=DEVICE)
    lens = torch.full((1,), 20, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="config keys"):
        paged_index_scores_triton(q_idx, k_idx, table, lens, config={"BLOCK": 4})
    table[0, 1] = 1
    out = paged_index_scores_triton(q_idx, k_idx, table, lens, config={"PAGES": 16})
    assert out.shape == (1, 1, 1, 2) and torch.equal(out, torch.zeros_like(out))
