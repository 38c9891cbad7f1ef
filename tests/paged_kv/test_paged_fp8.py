"""FP8 (e4m3) KV cache: ``write_kv`` quantizes new tokens per head exactly as ``quantize_fp8`` does,
and every reader -- ``paged_decode``, ``paged_prefill``, ``msa_decode_paged`` -- matches its fp32
``reference`` on FP8 caches with per-token and per-page scales (fresh random block tables, ragged
lengths, empty sequences, an all-zero page, a page of tied scales, non-contiguous queries, GQA).
Bad scales raise. Inputs live on the kernel device: the Triton interpreter on the CPU (fp8 loads
and their upcast run there: no fp8 ``tl.dot`` is needed), the compiled kernels on a GPU."""
from __future__ import annotations

import math

import pytest
import torch

from tests.support.devices import DEVICE, ON_GPU, generator, randn, tol

from minimax_lab.attention.msa import msa_decode_paged
from minimax_lab.measure import relative_error
from minimax_lab.fp8 import FP8, dequantize_fp8, quantize_fp8
from minimax_lab.bench.suite_kvcache import FP8_LAYOUTS, fp8_accuracy, random_block_table
from minimax_lab.paged_kv.decode import paged_decode
from minimax_lab.paged_kv.layout import check_kv_scales, dequantize_kv
from minimax_lab.paged_kv.prefill import paged_prefill
from minimax_lab.paged_kv.write import write_kv

LAYOUTS = list(FP8_LAYOUTS)  # "token": [num_pages, page_size, Hkv] scales; "page": [num_pages, Hkv]
QDTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _bound(dtype) -> float:
    """fp32 queries: the dots see exact e4m3 values, so only fp32 (TF32 on a GPU) rounding is left."""
    return tol(dtype, exact=1e-4)


def _fp8_paged(lengths, page, Hkv, D, layout, *, g, spare=3):
    """FP8 caches (+ scales in ``layout``) for ``lengths``: random K/V over a wide range of
    magnitudes, with the first used page all zeros and the second one's rows all of one amax (tied
    scales); returns ``(k8, v8, k_scale, v_scale, block_table, seq_lens)``."""
    pages = sum(-(-n // page) for n in lengths) + spare
    kv = []
    for _ in range(2):
        x = randn(pages, page, Hkv, D, gen=g) * torch.exp2(torch.randint(-6, 7, (pages, page, Hkv, 1), generator=g)
                                                           .float()).to(DEVICE)
        kv.append(x)
    bt = random_block_table(lengths, page, pages, DEVICE, g)
    used = bt[bt >= 0].long().unique()
    if used.numel() >= 2:
        for x in kv:
            x[used[0]] = 0.0  # an all-zero page: scale 1, zeros back
            row = x[used[1]]
            x[used[1]] = row / row.abs().amax(-1, keepdim=True).clamp_min(1e-30) * 3.0  # every row's amax is 3
    (k8, ks), (v8, vs) = (quantize_fp8(x, dims=FP8_LAYOUTS[layout]) for x in kv)
    if used.numel() >= 2:
        zero_scale = ks[used[0]]
        assert bool((zero_scale == 1.0).all()) and not bool(k8[used[0]].float().any())
    return k8, v8, ks, vs, bt, torch.tensor(lengths, dtype=torch.int32, device=DEVICE)


def _noncontiguous(x: torch.Tensor) -> torch.Tensor:
    """The same values as a non-contiguous view (every other element of a wider last dimension)."""
    wide = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype, device=x.device)
    wide[..., ::2] = x
    view = wide[..., ::2]
    assert not view.is_contiguous()
    return view


# --------------------------------------------------------------------------- the format's checks


def test_reference_is_the_fp32_rule_on_the_dequantized_cache():
    g = generator()
    k8, v8, ks, vs, bt, lens = _fp8_paged([5, 37, 16], 16, 2, 16, "token", g=g)
    q = randn(3, 4, 16, gen=g)
    want = paged_decode(q, dequantize_fp8(k8, ks), dequantize_fp8(v8, vs), bt, lens, impl="reference")
    got = paged_decode(q, k8, v8, bt, lens, impl="reference", k_scale=ks, v_scale=vs)
    assert torch.equal(got, want)
    # per-page scales dequantize through a zero-stride view: the same values as dims=(1, 3)
    k8p, ksp = quantize_fp8(dequantize_fp8(k8, ks), dims=(1, 3))
    assert torch.equal(dequantize_kv(k8p, ksp), dequantize_fp8(k8p, ksp, dims=(1, 3)))


# --------------------------------------------------------------------------- paged decode


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("dtype", QDTYPES)
def test_decode_fp8_matches_reference(layout, impl, dtype):
    g = generator()
    G, Hkv, D, page = 2, 2, 16, 16
    lengths = [0, 1, 17, 40, 33]  # an empty sequence, one token, mid-page, several pages
    k8, v8, ks, vs, bt, lens = _fp8_paged(lengths, page, Hkv, D, layout, g=g)
    q = _noncontiguous(randn(len(lengths), Hkv * G, D, gen=g, dtype=dtype))
    ref = paged_decode(q.float(), k8, v8, bt, lens, impl="reference", k_scale=ks, v_scale=vs)
    for splits in ((None, 3) if impl == "triton" else (None,)):
        kw = {"num_splits": splits} if impl == "triton" else {}
        out = paged_decode(q, k8, v8, bt, lens, impl=impl, k_scale=ks, v_scale=vs, **kw)
        assert out.dtype == dtype and out.shape == q.shape
        assert not out[0].float().any()  # the empty sequence
        err = relative_error(out.float(), ref)
        assert err < _bound(dtype), (layout, impl, dtype, splits, err)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_decode_fp8_gqa4_page64_unchecked(layout):
    """GQA 4, page 64, pages scattered; check_values=False (the hot-loop setting) gives the same output."""
    g = generator()
    k8, v8, ks, vs, bt, lens = _fp8_paged([65, 3, 130], 64, 2, 32, layout, g=g)
    q = randn(3, 8, 32, gen=g)
    ref = paged_decode(q, k8, v8, bt, lens, impl="reference", k_scale=ks, v_scale=vs)
    out = paged_decode(q, k8, v8, bt, lens, impl="triton", k_scale=ks, v_scale=vs, check_values=False)
    assert relative_error(out, ref) < _bound(torch.float32)


# --------------------------------------------------------------------------- paged prefill


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("dtype", QDTYPES)
def test_prefill_fp8_matches_reference(layout, impl, dtype):
    g = generator()
    G, Hkv, D, page, S = 2, 2, 16, 16, 6
    lengths = [6, 40, 17, 0]
    k8, v8, ks, vs, bt, lens = _fp8_paged(lengths, page, Hkv, D, layout, g=g)
    q_lens = torch.tensor([6, 3, 1, 0], dtype=torch.int32, device=DEVICE)  # ragged new tokens, one sequence empty
    q = _noncontiguous(randn(len(lengths), S, Hkv * G, D, gen=g, dtype=dtype))
    ref = paged_prefill(q.float(), k8, v8, bt, lens, q_lens=q_lens, impl="reference", k_scale=ks, v_scale=vs)
    out = paged_prefill(q, k8, v8, bt, lens, q_lens=q_lens, impl=impl, k_scale=ks, v_scale=vs)
    assert out.dtype == dtype and out.shape == q.shape
    err = relative_error(out.float(), ref)
    assert err < _bound(dtype), (layout, impl, dtype, err)


# --------------------------------------------------------------------------- MSA paged decode


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_msa_decode_fp8_matches_reference(layout, impl, dtype):
    g = generator()
    G, hpg, D, Didx, page, T, topk = 2, 2, 16, 16, 16, 2, 3
    lengths = [7 * page + 5, page + 1, 2]
    k8, v8, ks, vs, bt, lens = _fp8_paged(lengths, page, G, D, layout, g=g)
    q = _noncontiguous(randn(len(lengths), T, G * hpg, D, gen=g, dtype=dtype))
    q_idx = randn(len(lengths), T, G, Didx, gen=g, dtype=dtype)
    k_idx = randn(k8.shape[0], page, Didx, gen=g, dtype=dtype)
    kw = dict(topk=topk, k_scale=ks, v_scale=vs, return_selected=True)
    ref, sel_ref = msa_decode_paged(q.float(), k8, v8, bt, lens, q_idx.float(), k_idx.float(), impl="reference", **kw)
    out, sel = msa_decode_paged(q, k8, v8, bt, lens, q_idx, k_idx, impl=impl, **kw)
    assert out.dtype == dtype and out.shape == q.shape
    if dtype == torch.float32:
        assert torch.equal(sel, sel_ref)
    else:  # fp16 index scores may rank near-ties differently: compare on the same selection
        from minimax_lab.attention.msa_torch import msa_decode_paged_torch
        ref = msa_decode_paged_torch(q.float(), k8, v8, bt, lens, sel, k_scale=ks, v_scale=vs)
    err = relative_error(out.float(), ref)
    assert err < _bound(dtype), (layout, impl, dtype, err)


@pytest.mark.parametrize("reader", ["decode", "prefill"])
def test_fp32_queries_on_large_fp8_keys_are_not_rounded_to_tf32(reader):
    """Two keys of scale 2**14 whose fp32 scores differ by 2 logits; TF32 (10 mantissa bits) would
    round the query entry 1 + 2**-11 to 1 or 1 + 2**-10 and move that gap to 0 or 4 logits. The
    Triton readers run fp32 dots in full precision, so they match the fp32 reference."""
    ps, D = 16, 16
    k8 = torch.zeros(1, ps, 1, D)
    k8[0, 0, 0, 0], k8[0, 1, 0, 1] = 1.0, 1.0
    v8 = torch.zeros(1, ps, 1, D)
    v8[0, 0, 0, :], v8[0, 1, 0, :] = 1.0, -1.0
    k_scale = torch.full((1, ps, 1), 2.0 ** 14)
    v_scale = torch.ones(1, ps, 1)
    q = torch.zeros(1, 1, D)
    q[0, 0, 0], q[0, 0, 1] = 1.0 + 2.0 ** -11, 1.0
    table = torch.zeros(1, 1, dtype=torch.int32)
    lens = torch.tensor([2], dtype=torch.int32)
    k8, v8, k_scale, v_scale, q, table, lens = (t.to(DEVICE) for t in (k8.to(FP8), v8.to(FP8), k_scale, v_scale, q,
                                                                        table, lens))
    want = torch.tanh(torch.tensor(1.0))  # weights e^2 : 1 over values +1, -1 (scores / sqrt(D) = 4098, 4096)
    if reader == "decode":
        got = paged_decode(q, k8, v8, table, lens, impl="triton", k_scale=k_scale, v_scale=v_scale)[0, 0]
    else:
        got = paged_prefill(q[:, None], k8, v8, table, lens, impl="triton", k_scale=k_scale, v_scale=v_scale)[0, 0, 0]
    assert (got.cpu() - want).abs().max() < 1e-3, got  # TF32 gives 0 or tanh(2) = 0.96


# --------------------------------------------------------------------------- write_kv


@pytest.mark.parametrize("impl", ["reference", "torch", "triton"])
@pytest.mark.parametrize("dtype", QDTYPES)
def test_write_kv_fp8_is_quantize_fp8_and_decodes_back(impl, dtype):
    g = generator()
    P, ps, Hkv, D, T = 6, 16, 3, 24, 30
    wide = lambda *s: torch.exp2(torch.randint(-12, 13, s, generator=g).float()).to(DEVICE)  # noqa: E731
    k_new = (randn(T, Hkv, D, gen=g) * wide(T, Hkv, 1)).to(dtype)
    v_new = _noncontiguous((randn(T, Hkv, D, gen=g) * wide(T, Hkv, 1)).to(dtype))
    k_new[4] = 0.0  # an all-zero token: scale 1
    slots = torch.randperm(P * ps, generator=g)[:T].to(DEVICE)
    slots[7] = -1  # padding: nothing written
    k_cache = torch.zeros(P, ps, Hkv, D, dtype=FP8, device=DEVICE)
    v_cache = torch.zeros(P, ps, Hkv, D + 8, dtype=FP8, device=DEVICE)[..., :D]  # a strided pool
    k_scale = torch.full((P, ps, Hkv), -1.0, device=DEVICE)
    v_scale = torch.full((P, ps, Hkv), -1.0, device=DEVICE)
    write_kv(k_new, v_new, k_cache, v_cache, slots, impl=impl, k_scale=k_scale, v_scale=v_scale)

    keep = slots >= 0
    s = slots[keep]
    for new, cache, scale in ((k_new, k_cache, k_scale), (v_new, v_cache, v_scale)):
        want8, want_scale = quantize_fp8(new[keep])
        assert torch.equal(cache[s // ps, s % ps].float(), want8.float()), impl  # bit for bit (as values)
        assert torch.equal(scale[s // ps, s % ps], want_scale), impl
        untouched = torch.ones(P * ps, dtype=torch.bool, device=DEVICE)
        untouched[s] = False
        assert bool((scale.view(P * ps, Hkv)[untouched] == -1.0).all())
        assert not cache.reshape(P * ps, Hkv, D)[untouched].float().any()
    assert bool((k_scale[s[4] // ps, s[4] % ps] == 1.0).all())

    # decode the written tokens back: one sequence per page run, every impl on the stored values
    bt = torch.arange(P, dtype=torch.int32, device=DEVICE).view(2, P // 2)
    lens = torch.tensor([(P // 2) * ps, ps + 3], dtype=torch.int32, device=DEVICE)
    q = randn(2, 2 * Hkv, D, gen=g)
    ref = paged_decode(q, dequantize_fp8(k_cache, k_scale.clamp_min(0)), dequantize_fp8(v_cache, v_scale.clamp_min(0)),
                       bt, lens, impl="reference")
    out = paged_decode(q, k_cache, v_cache, bt, lens, impl="triton", k_scale=k_scale.clamp_min(0),
                       v_scale=v_scale.clamp_min(0))
    assert relative_error(out, ref) < _bound(torch.float32)


def test_write_kv_fp8_empty_and_unchecked():
    g = generator()
    kc = torch.zeros(2, 16, 2, 16, dtype=FP8, device=DEVICE)
    vc, ks, vs = kc.clone(), torch.zeros(2, 16, 2, device=DEVICE), torch.zeros(2, 16, 2, device=DEVICE)
    empty = torch.zeros(0, 2, 16, device=DEVICE)
    for impl in ("reference", "torch", "triton"):
        write_kv(empty, empty, kc, vc, torch.zeros(0, dtype=torch.int64, device=DEVICE), impl=impl, k_scale=ks,
                 v_scale=vs)
    assert not kc.float().any() and not ks.any()
    # unchecked: a slot past the pool is skipped by the kernel, the valid one lands
    new = randn(2, 2, 16, gen=g)
    write_kv(new, new, kc, vc, torch.tensor([3, 2 * 16 + 5], device=DEVICE), impl="triton", k_scale=ks, v_scale=vs,
             check_values=False)
    want8, want_scale = quantize_fp8(new[0])
    assert torch.equal(kc[0, 3].float(), want8.float()) and torch.equal(ks[0, 3], want_scale)


# --------------------------------------------------------------------------- bad input


def test_bad_scales_raise_clearly():
    g = generator()
    k8, v8, ks, vs, bt, lens = _fp8_paged([5, 20], 16, 2, 16, "token", g=g)
    kp, vp = ks[:, 0], vs[:, 0]  # per-page shaped [num_pages, Hkv]
    q = randn(2, 4, 16, gen=g)
    q4 = randn(2, 3, 4, 16, gen=g)
    qi, ki = randn(2, 2, 8, gen=g), randn(k8.shape[0], 16, 8, gen=g)
    readers = {
        "decode": lambda kc, vc, **kw: paged_decode(q, kc, vc, bt, lens, **kw),
        "prefill": lambda kc, vc, **kw: paged_prefill(q4, kc, vc, bt, lens, **kw),
        "msa": lambda kc, vc, **kw: msa_decode_paged(q, kc, vc, bt, lens, qi, ki, topk=2, **kw),
    }
    for name, read in readers.items():
        for impl in ("reference", "torch", "triton"):
            with pytest.raises(ValueError, match="need k_scale and v_scale"):
                read(k8, v8, impl=impl)
            with pytest.raises(ValueError, match="need k_scale and v_scale"):
                read(k8, v8, impl=impl, k_scale=ks)
        with pytest.raises(ValueError, match="only for float8_e4m3fn"):
            read(k8.float(), v8.float(), k_scale=ks, v_scale=vs)
        with pytest.raises(ValueError, match=r"k_scale must have shape \[num_pages=\d+, page_size=16, Hkv=2\] or"):
            read(k8, v8, k_scale=ks[:, :8], v_scale=vs)
        with pytest.raises(ValueError, match="dtype"):
            read(k8, v8, k_scale=ks.half(), v_scale=vs.half())
        with pytest.raises(ValueError, match="share one layout"):
            read(k8, v8, k_scale=ks, v_scale=vp)
        with pytest.raises(ValueError, match="device"):
            read(k8, v8, k_scale=ks.to("meta"), v_scale=vs.to("meta"))
        with pytest.raises(TypeError, match="k_scale"):
            read(k8, v8, k_scale=ks.tolist(), v_scale=vs)
        with pytest.raises(ValueError, match="v_cache"):  # fp8 K with a bf16 V
            read(k8, v8.to(torch.bfloat16), k_scale=ks, v_scale=vs)
        read(k8, v8, k_scale=kp, v_scale=vp, impl="reference")  # per-page scales are fine for readers
    on = dict(device=DEVICE)
    new, slots = randn(2, 2, 16, gen=g), torch.tensor([0, 1], **on)
    for impl in ("reference", "torch", "triton"):
        with pytest.raises(ValueError, match="per page .* one scale per token"):
            write_kv(new, new, k8, v8, slots, impl=impl, k_scale=kp, v_scale=vp)
        with pytest.raises(ValueError, match="need k_scale and v_scale"):
            write_kv(new, new, k8, v8, slots, impl=impl)
        with pytest.raises(ValueError, match="only for float8_e4m3fn"):
            write_kv(new, new, k8.float(), v8.float(), slots, impl=impl, k_scale=ks, v_scale=vs)
        with pytest.raises(ValueError, match="inf or NaN"):
            write_kv(new * float("inf"), new, k8, v8, slots, impl=impl, k_scale=ks, v_scale=vs)
    with pytest.raises(ValueError, match=r"fp32 \[num_pages=\d+, page_size=16, Hkv=2\] \(one scale per token"):
        check_kv_scales(k8, v8, None, None, per_page=False)
    with pytest.raises(ValueError, match="q's dtype"):  # MSA: a non-fp8 cache must still match q
        msa_decode_paged(q, k8.half(), v8.half(), bt, lens, qi, ki, topk=2)


# --------------------------------------------------------------------------- per token vs per page


def test_fp8_accuracy_per_token_vs_per_page():
    """The measured choice: on random and outlier-heavy K/V both layouts round each value to
    e4m3's 3 mantissa bits (a power-of-two scale does not change the relative rounding), so they
    agree; a quiet value the output leans on, in a page of loud ones, falls into e4m3's
    subnormals under a per-page scale and only there does per-token win."""
    acc = fp8_accuracy(DEVICE, B=2, L=256, Hq=4, Hkv=2, D=32, seed=int(torch.randint(0, 2**30, (1,))))
    assert set(acc) == {"random", "k_channel_outliers_x100", "token_outliers_x1000", "small_token_in_loud_page"}
    assert 0 < acc["random"]["token"] < 0.1  # e4m3 keeps values to ~2**-5 relative on average
    for kind in ("random", "k_channel_outliers_x100", "token_outliers_x1000"):
        assert abs(acc[kind]["token"] - acc[kind]["page"]) <= 0.05 * acc[kind]["token"] + 1e-4, (kind, acc[kind])
    quiet = acc["small_token_in_loud_page"]
    assert quiet["page"] > 1.3 * quiet["token"], quiet


def test_bench_suite_fp8_cpu_records():
    from minimax_lab.bench import suite_kvcache as bench_suite

    recs = bench_suite.run(preset="cpu", cases=["fp8"])
    plain = "triton_" + ("bf16" if ON_GPU else "fp32")
    assert {r["impl"] for r in recs} >= {plain, "triton_fp8_token", "triton_fp8_page"}
    assert all(r["case"].startswith("fp8_decode_") and r["ceiling"] == "copy" for r in recs)
    fp8 = [r for r in recs if r["impl"].startswith("triton_fp8_") and "cudagraph" not in r["impl"]]
    assert all(set(r["speedup_vs"]) == {plain} for r in fp8)
    assert all(set(r["accuracy_rel_err_vs_unquantized"]["random"]) == {"token", "page"} for r in fp8)
    by = {r["impl"]: r for r in recs}
    # bytes each impl must read: fp8 half of the 16-bit cache plus its scales (fp32 reads 4x)
    c = bench_suite.cases("cpu")["fp8"][0]
    n = c["B"] * c["L"] * c["Hkv"]
    assert by["triton_fp8_token"]["bytes_moved"] == 2 * n * (c["D"] + 4)
    assert by["triton_fp8_page"]["bytes_moved"] < by["triton_fp8_token"]["bytes_moved"]


# --------------------------------------------------------------------------- the fp16-dot read path
# 16-bit queries on FP8 caches take the fp16-dot path (each query row moved into fp16's range by a
# power of two, scales kept out of the K/V tiles). bf16 queries reach it on the CPU too: the
# interpreter holds them in fp32, and the kernel still converts each row to fp16. Each check
# below is per row -- every (sequence, query head) -- so a single bad head cannot hide in a norm.


def _row_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest ``|out_row - ref_row| / |ref_row|`` over the rows (the last dim is the row);
    rows whose reference is zero count ``|out_row|``."""
    o, r = out.double().reshape(-1, out.shape[-1]), ref.double().reshape(-1, ref.shape[-1]).to(out.device)
    num, den = (o - r).norm(dim=-1), r.norm(dim=-1)
    return float(torch.where(den > 0, num / den.clamp_min(1e-300), num).max())


#: per-row bound for a 16-bit output (its rounding: 2**-9 relative for bf16, 2**-12 for fp16)
ROW_BOUND = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-4}


def _quantized(k, v, layout):
    dims = FP8_LAYOUTS[layout]
    (k8, ks), (v8, vs) = quantize_fp8(k, dims=dims), quantize_fp8(v, dims=dims)
    return k8, v8, ks, vs


#: (page, BLOCK_N, GATHER, GQA group, scale layout): tiles inside one page (one table load per
#: tile), whole pages per tile (one per page), one per token (pages smaller than a tile, page
#: sizes that are no power of two); GQA groups 1 to 8; page sizes 8 to 128
GATHER_CASES = [(16, 16, "token", 4, "token"), (128, 32, "token", 8, "page"), (64, 16, "token", 1, "token"),
                (16, 32, "page", 2, "token"), (16, 64, "page", 8, "page"), (32, 64, "page", 3, "token"),
                (8, 32, "token", 5, "page"), (16, 32, "token", 6, "token"), (24, 16, "page", 4, "page")]


@pytest.mark.parametrize("page,block_n,gather,G,layout", GATHER_CASES)
def test_decode_fp8_every_gather_page_size_and_group(page, block_n, gather, G, layout):
    g = generator()
    Hkv, D = 2, 32
    dtype = torch.bfloat16 if G % 2 == 0 else torch.float16
    lengths = [0, 1, page + 1, 3 * page + 5, 2 * block_n]
    k8, v8, ks, vs, bt, lens = _fp8_paged(lengths, page, Hkv, D, layout, g=g)
    q = _noncontiguous(randn(len(lengths), Hkv * G, D, gen=g, dtype=dtype))
    ref = paged_decode(q.float(), k8, v8, bt, lens, impl="reference", k_scale=ks, v_scale=vs)
    for splits in (None, 3):
        out = paged_decode(q, k8, v8, bt, lens, impl="triton", k_scale=ks, v_scale=vs, num_splits=splits,
                           config={"BLOCK_N": block_n, "GATHER": gather})
        assert out.dtype == dtype and not out[0].float().any()
        err = _row_error(out, ref)
        assert err < ROW_BOUND[dtype], (page, block_n, gather, G, layout, splits, err)


def _adversarial(kind: str, page: int, lengths, Hkv: int, G: int, D: int, g, *, quiet: float = 2.0 ** -32):
    """``(q fp32 [B, Hq, D], k, v [P, page, Hkv, D])`` of one adversarial kind, scores O(1):

    * ``binades`` -- key ``t`` lives in channel ``t % D`` at scale ``2**b`` with ``b`` in [-12, 12]
      per channel, and the query's entry of that channel is ``2**-b`` times O(1): key and query
      entries span 24 binades each (within one row of q), the scores do not;
    * ``tiny_values`` -- values around ``2**-40`` (far below fp16's subnormals), every token;
    * ``quiet_token`` -- in every page, slot 0's value is ``quiet`` times its neighbours' and its
      key takes nearly all of its group's weight (the output leans on it);
    * ``large_queries`` -- queries around ``3e5`` (past fp16's 65504) on keys around ``2**-18``;
    * ``small_queries`` -- queries around ``1e-7`` on keys around ``2**23``."""
    B = len(lengths)
    pages = sum(-(-n // page) for n in lengths) + 3
    k = torch.randn(pages, page, Hkv, D, generator=g)
    v = torch.randn(pages, page, Hkv, D, generator=g)
    q = torch.randn(B, Hkv * G, D, generator=g)
    if kind == "binades":
        b = torch.randint(-12, 13, (D,), generator=g).float()
        chan = torch.arange(pages * page).remainder(D).view(pages, page)
        onehot = torch.nn.functional.one_hot(chan, D).float()[:, :, None, :]  # [P, page, 1, D]
        k = (3.0 * onehot + 0.01 * k) * torch.exp2(b)
        q = q * torch.exp2(-b)
    elif kind == "tiny_values":
        v = v * 2.0 ** -40
    elif kind == "quiet_token":
        v = v * 4.0
        v[:, 0] = v[:, 0] * quiet
        k[:, 0] = q.view(B, Hkv, G, D).mean((0, 2))[None, :, :] * 40.0  # along every group's mean query
    elif kind == "large_queries":
        q, k = q * 3e5, k * 2.0 ** -18
    elif kind == "small_queries":
        q, k = q * 1e-7, k * 2.0 ** 23
    return q, k.to(DEVICE), v.to(DEVICE)


ADVERSARIAL = ["binades", "tiny_values", "quiet_token", "large_queries", "small_queries"]


@pytest.mark.parametrize("page,block_n", [(64, 16), (16, 32)])  # one table load per tile; one per token
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ADVERSARIAL)
def test_decode_fp8_adversarial_scales(kind, layout, page, block_n):
    """bf16 queries on FP8 caches whose scales span many binades, values below fp16's range, a
    quiet value the output leans on, queries past fp16's range or far below 1: every row within
    the bf16 output's rounding of the fp32 reference on the same stored values. (A per-page scale
    stores a value ``2**-32`` of its page's loudest as zero, so the quiet value is ``2**-6`` there.)"""
    g = generator()
    Hkv, G, D = 2, 4, 32
    lengths = [3 * page + 7, 2 * page, 5]
    q, k, v = _adversarial(kind, page, lengths, Hkv, G, D, g, quiet=2.0 ** -32 if layout == "token" else 2.0 ** -6)
    k8, v8, ks, vs = _quantized(k, v, layout)
    bt = random_block_table(lengths, page, k.shape[0], DEVICE, g)
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    q = q.to(DEVICE, torch.bfloat16)
    ref = paged_decode(q.float(), k8, v8, bt, lens, impl="reference", k_scale=ks, v_scale=vs)
    assert bool(torch.isfinite(ref).all())
    out = paged_decode(q, k8, v8, bt, lens, impl="triton", k_scale=ks, v_scale=vs,
                       config={"BLOCK_N": block_n, "GATHER": "token"})
    err = _row_error(out, ref)
    assert err < ROW_BOUND[torch.bfloat16], (kind, layout, page, err)


def test_quiet_token_needs_the_row_normalised_p():
    """The case the value scales' handling is for: P times a value scale ``2**-32`` of the
    largest in its tile sits below fp16's subnormals; P scaled by the tile's largest value scale
    would lose the token the output leans on. The kernel's row-normalised P keeps it."""
    g = generator()
    Hkv, G, D, page = 1, 2, 16, 16
    q, k, v = _adversarial("quiet_token", page, [page], Hkv, G, D, g)
    k8, v8, ks, vs = _quantized(k, v, "token")
    bt = torch.zeros(1, 1, dtype=torch.int32, device=DEVICE)
    bt[0, 0] = 2
    lens = torch.tensor([page], dtype=torch.int32, device=DEVICE)
    q = q.to(DEVICE, torch.bfloat16)
    ref = paged_decode(q.float(), k8, v8, bt, lens, impl="reference", k_scale=ks, v_scale=vs)
    # the output is the quiet value's: ~2**-32 of the loud ones
    assert float(ref.abs().max()) < 2.0 ** -25
    out = paged_decode(q, k8, v8, bt, lens, impl="triton", k_scale=ks, v_scale=vs)
    assert _row_error(out, ref) < ROW_BOUND[torch.bfloat16]
    # what P * (value scale / the tile's largest one) in fp16 would give: the quiet token flushed
    vsc = vs[2, :, 0].double()
    p = torch.softmax(torch.einsum("hd,td->ht", q[0].double(), (k8[2, :, 0].double() * ks[2, :, 0, None]))
                      / math.sqrt(D), -1)
    flushed = (p * vsc / vsc.max()).to(torch.float16).double()
    assert float(flushed[:, 0].abs().max()) == 0.0


def test_decode_fp8_noncontiguous_caches_and_scales():
    """Caches strided inside the pool and head-major scales (``[P, Hkv, page]`` seen through a
    transpose) are read in place; per-page scales as a transposed view too."""
    g = generator()
    page, Hkv, G, D = 16, 2, 4, 32
    lengths = [40, 17, 64]
    q, k, v = _adversarial("binades", page, lengths, Hkv, G, D, g)
    bt = random_block_table(lengths, page, k.shape[0], DEVICE, g)
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    q = q.to(DEVICE, torch.bfloat16)
    for layout in LAYOUTS:
        k8, v8, ks, vs = _quantized(k, v, layout)
        ref = paged_decode(q.float(), k8, v8, bt, lens, impl="reference", k_scale=ks, v_scale=vs)
        wide = torch.zeros(*k8.shape[:-1], 2 * D, dtype=FP8, device=DEVICE)
        wide[..., D:] = k8
        k8s = wide[..., D:]  # strided pages: the head rows are 2D apart
        if layout == "token":
            ks_t = ks.transpose(1, 2).contiguous().transpose(1, 2)  # head-major storage
            vs_t = vs.transpose(1, 2).contiguous().transpose(1, 2)
        else:
            ks_t, vs_t = ks.t().contiguous().t(), vs.t().contiguous().t()
        assert not (k8s.is_contiguous() or ks_t.is_contiguous())
        for cfg in ({"BLOCK_N": 16}, {"BLOCK_N": 32, "GATHER": "page"}, {"BLOCK_N": 32, "GATHER": "token"}):
            out = paged_decode(q, k8s, v8, bt, lens, impl="triton", k_scale=ks_t, v_scale=vs_t, config=cfg)
            assert _row_error(out, ref) < ROW_BOUND[torch.bfloat16], (layout, cfg)


def test_decode_fp8_unchecked_out_of_range_tables_stay_in_the_cache():
    """``check_values=False`` with page ids past the pool, negative ones and lengths past the
    table: every gather clamps them, the output is finite (unspecified) and nothing is read outside."""
    g = generator()
    k8, v8, ks, vs, bt, lens = _fp8_paged([40, 20], 16, 2, 16, "token", g=g)
    bt = bt.clone()
    bt[0, 0], bt[1, 1] = k8.shape[0] + 100, -7
    lens = torch.tensor([10_000, 33], dtype=torch.int32, device=DEVICE)
    q = randn(2, 4, 16, gen=g, dtype=torch.bfloat16)
    for cfg in ({"BLOCK_N": 16}, {"BLOCK_N": 32, "GATHER": "page"}, {"BLOCK_N": 32, "GATHER": "token"}):
        for k_scale, v_scale in ((ks, vs), (ks[:, 0], vs[:, 0])):
            out = paged_decode(q, k8, v8, bt, lens, impl="triton", k_scale=k_scale, v_scale=v_scale,
                               check_values=False, config=cfg)
            assert bool(torch.isfinite(out.float()).all()), cfg


def test_fp8_launch_block_and_gather_choice():
    from minimax_lab import configs
    from minimax_lab.paged_kv import decode_triton as dt

    assert dt.gather_mode(128, 64) == dt.GATHER_TILE and dt.gather_mode(16, 16, "page") == dt.GATHER_TILE
    assert dt.gather_mode(16, 64, "page") == dt.GATHER_PAGE and dt.gather_mode(16, 64) == dt.GATHER_TOKEN
    assert dt.gather_mode(24, 16, "page") == dt.GATHER_TOKEN  # pages of 24 tokens: no whole pages per tile
    with pytest.raises(ValueError, match="GATHER must be one of"):
        dt.gather_mode(16, 32, "pages")
    assert dt.FP8_LAUNCH.op == "paged_decode_fp8" and set(dt.FP8_LAUNCH.keys) == set(dt.LAUNCH.keys) | {"GATHER"}
    for cand in dt.FP8_LAUNCH.candidates_for(None):
        cfg = configs.merge(dt.FP8_LAUNCH, configs.launch_config(dt.FP8_LAUNCH), cand)
        assert dt.gather_mode(16, cfg["BLOCK_N"], cfg["GATHER"]) in (dt.GATHER_TILE, dt.GATHER_PAGE, dt.GATHER_TOKEN)
    g = generator()
    k8, v8, ks, vs, bt, lens = _fp8_paged([5], 16, 1, 16, "token", g=g)
    q = randn(1, 2, 16, gen=g)
    with pytest.raises(ValueError, match="GATHER must be one of"):
        paged_decode(q, k8, v8, bt, lens, impl="triton", k_scale=ks, v_scale=vs, config={"GATHER": "x"})
    with pytest.raises(ValueError, match="unknown config keys"):
        paged_decode(q, k8, v8, bt, lens, impl="triton", k_scale=ks, v_scale=vs, config={"BLOCK_K": 16})


@pytest.mark.parametrize("page,block_n,layout", [(16, 16, "token"), (16, 32, "page"), (64, 16, "page"),
                                                 (8, 16, "token")])
@pytest.mark.parametrize("kind", ["random", "large_queries", "quiet_token"])
def test_prefill_fp8_fp16_dots(kind, page, block_n, layout):
    """The prefill's FP8 path on bf16 queries: tiles inside a page, per-token gathers, both
    layouts, ragged prefixes and new-token counts (one sequence empty), the diagonal tiles."""
    g = generator()
    Hkv, G, D, S = 2, 2, 32, 9
    lengths = [9, 3 * page + 2, page + 4, 0]
    q_lens = torch.tensor([9, 5, 1, 0], dtype=torch.int32, device=DEVICE)
    q1, k, v = _adversarial("quiet_token" if kind == "quiet_token" else "large_queries", page, lengths, Hkv, G, D, g,
                            quiet=2.0 ** -32 if layout == "token" else 2.0 ** -6)
    if kind == "random":
        k, v = randn(*k.shape, gen=g), randn(*v.shape, gen=g)
    k8, v8, ks, vs = _quantized(k, v, layout)
    bt = random_block_table(lengths, page, k.shape[0], DEVICE, g)
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    scale_q = float(q1.abs().max()) / 3.0 if kind == "large_queries" else 1.0
    q = (randn(len(lengths), S, Hkv * G, D, gen=g) * scale_q).to(torch.bfloat16)
    ref = paged_prefill(q.float(), k8, v8, bt, lens, q_lens=q_lens, impl="reference", k_scale=ks, v_scale=vs)
    out = paged_prefill(q, k8, v8, bt, lens, q_lens=q_lens, impl="triton", k_scale=ks, v_scale=vs,
                        config={"BLOCK_N": block_n})
    err = _row_error(out, ref)
    assert err < ROW_BOUND[torch.bfloat16], (kind, page, block_n, layout, err)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["random", "large_queries", "tiny_values"])
@pytest.mark.parametrize("page", [16, 32])
def test_msa_decode_fp8_kv_with_bf16_queries(kind, layout, page):
    """MSA's sparse decode attention on FP8 K/V pages with bf16 queries (fp16 dots): the same
    selection as the reference's, every row within bf16 rounding of it."""
    from minimax_lab.attention.msa_torch import msa_decode_paged_torch

    g = generator()
    G, hpg, D, Didx, T, topk = 2, 4, 32, 16, 2, 3
    lengths = [6 * page + 5, page + 1, 3]
    q, k, v = _adversarial("large_queries" if kind == "large_queries" else kind, page, lengths, G, hpg, D, g)
    k8, v8, ks, vs = _quantized(k, v, layout)
    bt = random_block_table(lengths, page, k.shape[0], DEVICE, g)
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    qT = (q[:, None].expand(-1, T, -1, -1) * (1 + 0.1 * torch.randn(len(lengths), T, 1, 1, generator=g))).to(
        DEVICE, torch.bfloat16)
    q_idx = randn(len(lengths), T, G, Didx, gen=g, dtype=torch.bfloat16)
    k_idx = randn(k8.shape[0], page, Didx, gen=g, dtype=torch.bfloat16)
    out, sel = msa_decode_paged(qT, k8, v8, bt, lens, q_idx, k_idx, topk=topk, k_scale=ks, v_scale=vs,
                                impl="triton", return_selected=True)
    ref = msa_decode_paged_torch(qT.float(), k8, v8, bt, lens, sel, k_scale=ks, v_scale=vs)
    assert _row_error(out, ref) < ROW_BOUND[torch.bfloat16], (kind, layout, page)
