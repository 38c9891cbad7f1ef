"""KV-cache kernels (paged decode, write_kv, paged prefill): every impl against the fp32
``reference`` on fresh random block tables (non-contiguous pages, ragged lengths, lengths that
end mid-page, length 1, several page sizes, GQA 1 and 4), the reference against a hand loop,
and bad input. Inputs live on the kernel device: the Triton interpreter at tiny sizes on the CPU
(fp32/fp16), the compiled kernels on a GPU (fp32 dots in TF32 there, hence its tolerance)."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.devices import DEVICE, ON_GPU, generator, randn, tol

from minimax_lab import runtime
from minimax_lab.measure import relative_error
from minimax_lab.bench.suite_kvcache import random_block_table
from minimax_lab.paged_kv.decode import paged_decode
from minimax_lab.paged_kv.decode_triton import choose_num_splits
from minimax_lab.paged_kv.prefill import paged_prefill
from minimax_lab.paged_kv.write import write_kv


def _paged(lengths, page, Hkv, D, *, spare=3, dtype=torch.float32, seed=None):
    g = generator(seed)
    pages = sum(-(-n // page) for n in lengths) + spare
    kc = randn(pages, page, Hkv, D, gen=g, dtype=dtype)
    vc = randn(pages, page, Hkv, D, gen=g, dtype=dtype)
    bt = random_block_table(lengths, page, pages, DEVICE, g)
    return kc, vc, bt, torch.tensor(lengths, dtype=torch.int32, device=DEVICE), g


TRITON_TOL = tol(torch.float32)              # fp32 inputs: TF32 dots on a GPU
TORCH_TOL = tol(torch.float32, tf32=False)   # SDPA / einsum keep fp32


def _loop_decode(q, kc, vc, bt, lens):
    """Token by token through the block table, float64 on the CPU: an independent check of the reference."""
    q, kc, vc, bt, lens = (t.cpu() for t in (q, kc, vc, bt, lens))
    B, Hq, D = q.shape
    ps, Hkv = kc.shape[1], kc.shape[2]
    out = torch.zeros(B, Hq, D, dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            s, vs = [], []
            for t in range(int(lens[b])):
                page, off = int(bt[b, t // ps]), t % ps
                s.append(float(q[b, h].double() @ kc[page, off, hk].double()) / math.sqrt(D))
                vs.append(vc[page, off, hk].double())
            if s:
                mx = max(s)
                w = [math.exp(x - mx) for x in s]
                out[b, h] = sum(wi * vi for wi, vi in zip(w, vs)) / sum(w)
    return out


def test_decode_reference_matches_loop():
    kc, vc, bt, lens, g = _paged([1, 7, 19], 4, 2, 8, seed=3)
    q = randn(3, 4, 8, gen=g)
    out = paged_decode(q, kc, vc, bt, lens, impl="reference")
    assert out.device.type == DEVICE.type
    assert relative_error(out.cpu(), _loop_decode(q, kc, vc, bt, lens)) < 1e-6


@pytest.mark.parametrize("page,G,lengths", [
    (16, 1, [1, 17, 40]),     # length 1, mid-page, several pages; no GQA
    (16, 4, [16, 33, 5, 48]),  # exactly a page; GQA 4
    (32, 4, [1, 31, 70]),
    (64, 1, [65, 3]),
    (128, 4, [129, 1]),
])
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_decode_matches_reference(page, G, lengths, impl):
    Hkv, D = 2, 16
    kc, vc, bt, lens, g = _paged(lengths, page, Hkv, D)
    q = randn(len(lengths), Hkv * G, D, gen=g)
    ref = paged_decode(q, kc, vc, bt, lens, impl="reference")
    bound = TRITON_TOL if impl == "triton" else TORCH_TOL
    assert relative_error(paged_decode(q, kc, vc, bt, lens, impl=impl), ref) < bound


@pytest.mark.parametrize("splits", [2, 3, 7])
def test_decode_split_k_matches_reference(splits):
    """Forced splits, including more splits than a short sequence has tiles (empty splits)."""
    kc, vc, bt, lens, g = _paged([1, 45, 100], 16, 1, 32)
    q = randn(3, 4, 32, gen=g)
    ref = paged_decode(q, kc, vc, bt, lens, impl="reference")
    assert relative_error(paged_decode(q, kc, vc, bt, lens, impl="triton", num_splits=splits), ref) < TRITON_TOL


def test_decode_fp16_odd_head_dim_and_empty_sequence():
    kc, vc, bt, lens, g = _paged([0, 23], 16, 2, 24, dtype=torch.float16)
    q = randn(2, 4, 24, gen=g, dtype=torch.float16)
    ref = paged_decode(q, kc, vc, bt, lens, impl="reference")
    out = paged_decode(q, kc, vc, bt, lens, impl="triton", num_splits=2)
    assert out.dtype == torch.float16 and relative_error(out, ref) < tol(torch.float16)
    assert torch.equal(out[0], torch.zeros_like(out[0]))  # no cached token: zeros, not NaN


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 50), min_size=1, max_size=3), page=st.sampled_from([16, 32]),
       G=st.sampled_from([1, 4]), splits=st.sampled_from([None, 2]), seed=st.integers(0, 2**20))
def test_decode_property_random_tables(lengths, page, G, splits, seed):
    kc, vc, bt, lens, g = _paged(lengths, page, 1, 16, seed=seed)
    q = randn(len(lengths), G, 16, gen=g)
    ref = paged_decode(q, kc, vc, bt, lens, impl="reference")
    assert relative_error(paged_decode(q, kc, vc, bt, lens, impl="triton", num_splits=splits), ref) < TRITON_TOL


def test_choose_num_splits():
    # B=64 x 8 kv heads already fill 132 SMs twice over; B=8 needs splits; short contexts cap them
    assert choose_num_splits(64, 8, 8192, sms=132, block_n=64) == 1
    s = choose_num_splits(8, 8, 131072, sms=132, block_n=64)
    assert 4 <= s <= 64 and 8 * 8 * s >= 132 * 2
    assert choose_num_splits(8, 8, 600, sms=132, block_n=64) == 1
    # the H200 sweep's best split count at B=8, 32k and 128k (results/notes_kvcache.md) is 8
    assert choose_num_splits(8, 8, 32768, sms=132, block_n=64) == 8 == choose_num_splits(8, 8, 131072, sms=132, block_n=64)


# --------------------------------------------------------------------------- write_kv


@pytest.mark.parametrize("impl", ["reference", "torch", "triton"])
@pytest.mark.parametrize("page", [16, 64])
def test_write_kv_lands_in_slots(impl, page):
    P, Hkv, D, T = 5, 2, 16, 23
    g = generator()
    kc, vc = randn(P, page, Hkv, D, gen=g), randn(P, page, Hkv, D, gen=g)
    k0, v0 = kc.clone(), vc.clone()
    slots = torch.randperm(P * page, generator=g)[:T]
    slots[4] = -1  # padding: writes nothing
    slots = slots.to(DEVICE)
    kn, vn = randn(T, Hkv, D, gen=g), randn(T, Hkv, D, gen=g)
    write_kv(kn, vn, kc, vc, slots, impl=impl)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(kc[s // page, s % page], kn[i]) and torch.equal(vc[s // page, s % page], vn[i])
    untouched = torch.ones(P * page, dtype=torch.bool, device=DEVICE)
    untouched[slots[slots >= 0]] = False
    assert torch.equal(kc.view(P * page, Hkv, D)[untouched], k0.view(P * page, Hkv, D)[untouched])
    assert torch.equal(vc.view(P * page, Hkv, D)[untouched], v0.view(P * page, Hkv, D)[untouched])


def test_write_then_decode_sees_new_token():
    """The engine's step: append a token's K/V through write_kv, then decode reads it."""
    kc, vc, bt, lens, g = _paged([20, 16], 16, 2, 16, spare=4)
    bt = torch.cat([bt, torch.full((2, 1), -1, dtype=torch.int32, device=DEVICE)], 1)
    bt[1, 1] = kc.shape[0] - 1  # sequence 1 is page-aligned: its new token opens a fresh page
    slots = torch.tensor([int(bt[b, n // 16]) * 16 + n % 16 for b, n in enumerate(lens.tolist())], device=DEVICE)
    kn, vn = randn(2, 2, 16, gen=g), randn(2, 2, 16, gen=g)
    write_kv(kn, vn, kc, vc, slots, impl="triton")
    lens = lens + 1
    q = randn(2, 4, 16, gen=g)
    ref = paged_decode(q, kc, vc, bt, lens, impl="reference")
    assert relative_error(paged_decode(q, kc, vc, bt, lens, impl="triton"), ref) < TRITON_TOL


# --------------------------------------------------------------------------- prefill


def test_prefill_last_row_is_decode():
    """The last new token of a prefill sees exactly what a decode of that length sees."""
    kc, vc, bt, lens, g = _paged([37, 5], 16, 2, 16)
    q = randn(2, 5, 4, 16, gen=g)
    pre = paged_prefill(q, kc, vc, bt, lens, impl="reference")
    dec = paged_decode(q[:, -1].contiguous(), kc, vc, bt, lens, impl="reference")
    assert relative_error(pre[:, -1], dec) < 1e-6


@pytest.mark.parametrize("page,G,lengths,S,q_lens", [
    (16, 1, [1, 40, 18], 1, None),          # S=1, a length-1 sequence that is all new
    (16, 4, [33, 21, 50], 17, [17, 1, 9]),   # ragged new-token counts, mid-page ends
    (32, 4, [20, 64], 20, [0, 20]),          # a sequence with no new tokens; prefix 0
    (64, 1, [70, 130], 33, None),
])
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_prefill_matches_reference(page, G, lengths, S, q_lens, impl):
    Hkv, D = 2, 16
    kc, vc, bt, lens, g = _paged(lengths, page, Hkv, D)
    q = randn(len(lengths), S, Hkv * G, D, gen=g)
    ql = torch.tensor(q_lens, dtype=torch.int32, device=DEVICE) if q_lens is not None else None
    ref = paged_prefill(q, kc, vc, bt, lens, q_lens=ql, impl="reference")
    out = paged_prefill(q, kc, vc, bt, lens, q_lens=ql, impl=impl)
    assert relative_error(out, ref) < (TRITON_TOL if impl == "triton" else TORCH_TOL)
    if ql is not None:
        for b, n in enumerate(q_lens):
            assert torch.equal(out[b, n:], torch.zeros_like(out[b, n:]))  # padding rows are zeros


# --------------------------------------------------------------------------- bad input


def test_bad_input_raises_clearly():
    kc, vc, bt, lens, g = _paged([5, 20], 16, 2, 16)
    q = randn(2, 4, 16, gen=g)
    on = dict(device=DEVICE)  # every tensor on the kernel device: each error below is the one named
    with pytest.raises(ValueError, match="impl"):
        paged_decode(q, kc, vc, bt, lens, impl="cuda")
    with pytest.raises(ValueError, match="block_table"):
        paged_decode(q, kc, vc, bt.long(), lens)
    with pytest.raises(ValueError, match="seq_lens"):
        paged_decode(q, kc, vc, bt, torch.tensor([5, 9999], dtype=torch.int32, **on))
    with pytest.raises(ValueError, match="-1"):
        bad = bt.clone()
        bad[1, 0] = -1
        paged_decode(q, kc, vc, bad, lens)
    with pytest.raises(ValueError, match="page ids"):
        bad = bt.clone()
        bad[0, 0] = kc.shape[0]
        paged_decode(q, kc, vc, bad, lens)
    with pytest.raises(ValueError, match="multiple"):
        paged_decode(torch.randn(2, 3, 16, **on), kc, vc, bt, lens)
    with pytest.raises(ValueError, match="head_dim"):
        paged_decode(torch.randn(2, 4, 8, **on), kc, vc, bt, lens)
    with pytest.raises(ValueError, match="v_cache"):
        paged_decode(q, kc, vc[:, :8], bt, lens)
    with pytest.raises(TypeError, match="q"):
        paged_decode(q.cpu().numpy(), kc, vc, bt, lens)
    with pytest.raises(ValueError, match="one device"):
        paged_decode(q.to("meta"), kc, vc, bt, lens)
    with pytest.raises(ValueError, match="needs tensors on"):  # the Triton kernel refuses other devices
        paged_decode(*(t.to("meta") for t in (q, kc, vc, bt, lens)), impl="triton", check_values=False)
    with pytest.raises(ValueError, match="q_lens"):
        paged_prefill(torch.randn(2, 6, 4, 16, **on), kc, vc, bt, lens)  # 6 new tokens > seq_lens[0] = 5
    with pytest.raises(ValueError, match="slot_mapping"):
        write_kv(torch.randn(2, 2, 16, **on), torch.randn(2, 2, 16, **on), kc, vc,
                 torch.tensor([0, 1], dtype=torch.int32, **on))
    with pytest.raises(ValueError, match="slot_mapping"):
        write_kv(torch.randn(2, 2, 16, **on), torch.randn(2, 2, 16, **on), kc, vc,
                 torch.tensor([0, kc.shape[0] * 16], **on))
    with pytest.raises(ValueError, match="k_new"):
        write_kv(torch.randn(2, 3, 16, **on), torch.randn(2, 3, 16, **on), kc, vc, torch.tensor([0, 1], **on))


# --------------------------------------------------------------------------- bench suite


def test_bench_suite_cpu_records():
    from minimax_lab.bench import suite_kvcache as bench_suite

    recs = bench_suite.run(preset="cpu")
    by_case = {}
    for r in recs:
        assert r["suite"] == "kvcache" and r["ms"] > 0
        by_case.setdefault(r["case"], set()).add(r["impl"])
    decode = [c for c in by_case if c.startswith("decode_")]
    assert len(decode) == len(bench_suite.cases("cpu")["decode"])
    assert all({"triton", "gather_sdpa", "sdpa_contiguous"} <= by_case[c] for c in decode)
    assert any(c.startswith("write_kv_") for c in by_case) and any(c.startswith("prefill_") for c in by_case)
    ours = next(r for r in recs if r["case"] in decode and r["impl"] == "triton")
    assert set(ours["speedup_vs"]) == {"gather_sdpa", "sdpa_contiguous"} and ours["ceiling"] == "copy"
    dtype = runtime.compute_dtype() if ON_GPU else torch.float32  # the suite's dtype on this device
    assert ours["dtype"] == str(dtype).replace("torch.", "")
    assert max(ours["check_rel_err"].values()) < tol(dtype, exact=1e-3)
