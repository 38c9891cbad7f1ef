"""Properties every public operator keeps, for every impl -- drawn by hypothesis, not hand-picked:

* **layout**: non-contiguous views (strided in the last dim, stored transposed, sliced out of a
  NaN-poisoned buffer) give the answer of contiguous copies -- each impl on the views is checked
  against the reference on contiguous inputs;
* **dtype**: every dtype the contract accepts gives the reference's answer within the tolerance
  of the dtype computed in (:func:`devices.tol`), or a clear error (float64 in the Triton kernels);
* **empty**: empty batches and zero-length sequences give the contract's empty or zero outputs,
  the same in every impl;
* **out of range**: indices out of range raise ``ValueError``.

Inputs live on the kernel device (the GPU, or the CPU under the Triton interpreter). The example
counts keep the file under a minute on two CPU cores; the GPU run draws more (:data:`EXAMPLES`).
"""
from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.devices import DEVICE, ON_GPU, generator, randn, relative_error, tol
from minimax_lab.attention import attention, msa_attention, msa_decode_paged, msa_select
from minimax_lab.paged_kv.decode import paged_decode
from minimax_lab.paged_kv.prefill import paged_prefill
from minimax_lab.paged_kv.write import write_kv
from minimax_lab.moe import MoEFFN, align_tokens, moe_experts, route_sigmoid_bias, route_softmax
from tests.support.operator_inputs import LAYOUTS, coarse, paged_cache, relayout

IMPLS = ("reference", "torch", "triton")
MOE_IMPLS = ("reference", "loop", "torch", "triton")
FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
#: examples per property: a few on the CPU (the interpreter is slow), a few more on a GPU (there
#: each new shape/dtype compiles, and dense attention autotunes per length bucket); the environment
#: variable MINIMAX_LAB_PROPERTY_EXAMPLES overrides both (a longer hunt)
EXAMPLES = int(os.environ.get("MINIMAX_LAB_PROPERTY_EXAMPLES", 8 if ON_GPU else 5))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

layouts = st.sampled_from(LAYOUTS)
dtypes = st.sampled_from(FLOATS)
seeds = st.integers(0, 2**31 - 1)


def _relayout_all(data, tensors: dict) -> dict:
    """Each tensor in a layout drawn for it."""
    return {name: relayout(t, data.draw(layouts, label=f"layout of {name}")) for name, t in tensors.items()}


def _outputs(impls, dtype, run):
    """``(impl, run(impl))`` for each impl whose contract takes ``dtype``; on the way, checks that
    the Triton kernels (fp16/bf16/fp32) refuse float64 with a clear error."""
    for impl in impls:
        if impl == "triton" and dtype == torch.float64:
            with pytest.raises(ValueError, match="float64"):
                run(impl)
            continue
        yield impl, run(impl)


def _close(got, want, dtype, what):
    err = relative_error(got, want)
    assert err <= tol(dtype), f"{what}: relative error {err:.3g} > {tol(dtype):.3g}"


def _same_lse(got, want, dtype, what):
    """lse rows: -inf in the same places, the finite ones close."""
    inf = torch.isinf(want)
    assert torch.equal(torch.isinf(got), inf), f"{what}: -inf rows differ"
    if (~inf).any():
        _close(got[~inf].to(want.dtype), want[~inf], dtype, what)


# --------------------------------------------------------------------------- dense attention


@PROPERTY
@given(data=st.data(), B=st.integers(1, 2), S=st.integers(1, 20), Skv=st.integers(1, 24), Hkv=st.integers(1, 2),
       group=st.integers(1, 2), D=st.sampled_from([16, 24]), causal=st.booleans(), dtype=dtypes, seed=seeds)
def test_attention_layouts_and_dtypes(data, B, S, Skv, Hkv, group, D, causal, dtype, seed):
    g = generator(seed)
    ins = {"q": randn(B, S, Hkv * group, D, gen=g, dtype=dtype), "k": randn(B, Skv, Hkv, D, gen=g, dtype=dtype),
           "v": randn(B, Skv, Hkv, D, gen=g, dtype=dtype)}
    want, want_lse = attention(**ins, causal=causal, impl="reference", return_lse=True)
    views = _relayout_all(data, ins)
    for impl, (o, lse) in _outputs(IMPLS, dtype, lambda impl: attention(**views, causal=causal, impl=impl,
                                                                        return_lse=True)):
        assert o.dtype == dtype and o.shape == want.shape
        _close(o, want, dtype, f"attention {impl}")
        _same_lse(lse, want_lse, dtype, f"attention lse {impl}")


@pytest.mark.parametrize("impl", IMPLS)
def test_attention_empty_inputs(impl):
    g = generator(1)
    q, k = randn(1, 3, 2, 16, gen=g), randn(1, 5, 1, 16, gen=g)
    for qq, kk in ((q[:0], k[:0]), (q[:, :0], k), (q, k[:, :0])):
        o, lse = attention(qq, kk, kk, impl=impl, return_lse=True)
        assert o.shape == qq.shape and lse.shape == (qq.shape[0], 2, qq.shape[1])
        assert torch.equal(o, torch.zeros_like(o)) and bool((lse == float("-inf")).all())


# --------------------------------------------------------------------------- MSA


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
    views = _relayout_all(data, ins)
    for impl, got in _outputs(IMPLS, dtype, lambda impl: msa_select(**views, block_size=16, topk=topk, impl=impl)):
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
    views = _relayout_all(data, ins)
    def run(impl):
        return msa_attention(**views, **kw, impl=impl, **({"schedule": schedule} if impl == "triton" else {}))
    for impl, (o, lse) in _outputs(IMPLS, dtype, run):
        assert o.dtype == dtype
        _close(o, want, dtype, f"msa_attention {impl}")
        _same_lse(lse, want_lse, dtype, f"msa_attention lse {impl}")


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
    views = _relayout_all(data, ins)
    for impl, (o, sel) in _outputs(IMPLS, dtype, lambda impl: msa_decode_paged(**views, topk=topk, impl=impl,
                                                                              return_selected=True)):
        assert o.shape == want.shape and o.dtype == dtype and torch.equal(sel, want_sel), impl
        _close(o, want, dtype, f"msa_decode_paged {impl}")


# --------------------------------------------------------------------------- paged KV kernels


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
    views = _relayout_all(data, ins)
    def run(impl):
        return paged_decode(**views, impl=impl, **({"num_splits": num_splits} if impl == "triton" else {}))
    for impl, got in _outputs(IMPLS, dtype, run):
        assert got.dtype == dtype
        _close(got, want, dtype, f"paged_decode {impl}")


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
    views = _relayout_all(data, ins)
    for impl, got in _outputs(IMPLS, dtype, lambda impl: paged_prefill(**views, impl=impl)):
        assert got.dtype == dtype
        _close(got, want, dtype, f"paged_prefill {impl}")
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
        views = _relayout_all(data, {"k_new": k_new, "v_new": v_new, "k_cache": k0.clone(), "v_cache": v0.clone(),
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


@PROPERTY
@given(data=st.data(), bad=st.sampled_from(["page_id", "hole", "long", "negative_len"]), lengths=st.lists(
    st.integers(1, 40), min_size=1, max_size=3), seed=seeds)
def test_paged_kernels_out_of_range_raise(data, bad, lengths, seed):
    g = generator(seed)
    ins = paged_cache(lengths, page=16, Hkv=1, D=16, gen=g, d_idx=16)
    P, maxp = ins["k_cache"].shape[0], ins["block_table"].shape[1]
    b = data.draw(st.integers(0, len(lengths) - 1), label="sequence")
    used = -(-lengths[b] // 16)
    table, lens = ins["block_table"].clone(), ins["seq_lens"].clone()
    if bad == "page_id":
        table[b, data.draw(st.integers(0, maxp - 1))] = data.draw(st.sampled_from([P, P + 7, 10**6, -2, -10**6]))
        match = "page ids"
    elif bad == "hole":
        table[b, data.draw(st.integers(0, used - 1))] = -1
        match = "-1"
    elif bad == "long":
        lens[b] = maxp * 16 + data.draw(st.integers(1, 10**6))
        match = "seq_lens"
    else:
        lens[b] = data.draw(st.integers(-10**6, -1))
        match = "seq_lens"
    B = len(lengths)
    kw = dict(k_cache=ins["k_cache"], v_cache=ins["v_cache"], block_table=table, seq_lens=lens)
    for impl in IMPLS:
        with pytest.raises(ValueError, match=match):
            paged_decode(randn(B, 2, 16, gen=g), **kw, impl=impl)
        with pytest.raises(ValueError, match=match):
            paged_prefill(randn(B, 1, 2, 16, gen=g), **kw, impl=impl)
        with pytest.raises(ValueError, match=match):
            msa_decode_paged(randn(B, 2, 16, gen=g), **kw, q_idx=coarse(B, 1, 16, gen=g),
                             k_idx_cache=ins["k_idx_cache"], topk=2, impl=impl)
        with pytest.raises(ValueError, match="slot_mapping"):
            write_kv(randn(1, 1, 16, gen=g), randn(1, 1, 16, gen=g), ins["k_cache"], ins["v_cache"],
                     torch.tensor([P * 16 + data.draw(st.integers(0, 10**6))], device=DEVICE), impl=impl)


# --------------------------------------------------------------------------- MoE


@PROPERTY
@given(data=st.data(), T=st.integers(1, 12), d=st.integers(4, 40), f=st.integers(4, 40), E=st.integers(1, 5),
       k=st.integers(1, 3), dtype=dtypes, seed=seeds)
def test_moe_experts_layouts_and_dtypes(data, T, d, f, E, k, dtype, seed):
    g = generator(seed)
    k = min(k, E)
    ins = {"x": randn(T, d, gen=g, dtype=dtype), "w_gate_up": (randn(E, 2 * f, d, gen=g) / d ** 0.5).to(dtype),
           "w_down": (randn(E, d, f, gen=g) / f ** 0.5).to(dtype),
           "weights": torch.rand(T, k, generator=g).to(DEVICE, dtype),
           "ids": torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(DEVICE)}
    want = moe_experts(**ins, impl="reference")
    views = _relayout_all(data, ins)
    for impl, got in _outputs(MOE_IMPLS, dtype, lambda impl: moe_experts(**views, impl=impl)):
        assert got.dtype == dtype
        _close(got, want, dtype, f"moe_experts {impl}")


@PROPERTY
@given(data=st.data(), router=st.sampled_from(["softmax", "sigmoid_bias"]), shared=st.booleans(),
       impl=st.sampled_from(MOE_IMPLS), lead=st.sampled_from([(0,), (5,), (2, 3)]),
       dtype=dtypes, seed=seeds)
def test_moeffn_layouts_dtypes_and_empty(data, router, shared, impl, lead, dtype, seed):
    torch.manual_seed(seed)
    ffn = MoEFFN(24, 20, 4, 2, router=router, shared_expert=shared, impl=impl).to(DEVICE, dtype).eval()
    ref = MoEFFN(24, 20, 4, 2, router=router, shared_expert=shared, impl="reference").to(DEVICE, dtype).eval()
    ref.load_state_dict(ffn.state_dict())
    x = relayout(randn(*lead, 24, gen=generator(seed), dtype=dtype), data.draw(layouts))
    with torch.no_grad():
        want = ref(x)
        for _, got in _outputs([impl], dtype, lambda _: ffn(x)):
            assert got.shape == x.shape and got.dtype == dtype
            if x.numel():
                _close(got, want, dtype, f"MoEFFN {impl}")
                assert torch.equal(ffn.last_ids, ref.last_ids)


def _distinct_logits(T, E, g, dtype):
    """Per row a permutation of 0, 0.25, ..., (E-1)/4: distinct and exact in every float dtype, so
    the chosen ids are defined without ties."""
    rows = [torch.randperm(E, generator=g) for _ in range(T)]
    return ((torch.stack(rows) if rows else torch.empty(0, E)).double() / 4).to(DEVICE, dtype)


@PROPERTY
@given(data=st.data(), T=st.integers(0, 10), E=st.integers(1, 8), k=st.integers(1, 8), renormalize=st.booleans(),
       with_bias=st.booleans(), dtype=dtypes, seed=seeds)
def test_routers_layouts_dtypes_and_empty(data, T, E, k, renormalize, with_bias, dtype, seed):
    g = generator(seed)
    k = min(k, E)
    logits = _distinct_logits(T, E, g, dtype)
    view = relayout(logits, data.draw(layouts))
    exact = logits.double()
    w, ids = route_softmax(view, k, renormalize=renormalize)
    p = torch.softmax(exact, -1)
    want_ids = p.topk(k, -1).indices
    want_w = p.gather(-1, want_ids)
    want_w = want_w / want_w.sum(-1, keepdim=True) if renormalize else want_w
    assert w.shape == (T, k) and w.dtype == torch.float32 and ids.dtype == torch.int64
    assert torch.equal(ids, want_ids) and relative_error(w, want_w) <= tol(torch.float32)
    bias = (torch.randperm(E, generator=g).double() / 64).to(DEVICE, dtype) if with_bias else None
    w, ids = route_sigmoid_bias(view, k, None if bias is None else relayout(bias, data.draw(layouts)),
                                renormalize=renormalize)
    s = torch.sigmoid(exact)
    want_ids = (s + (0 if bias is None else bias.double())).topk(k, -1).indices
    want_w = s.gather(-1, want_ids)
    want_w = want_w / want_w.sum(-1, keepdim=True) if renormalize else want_w
    assert torch.equal(ids, want_ids) and relative_error(w, want_w) <= tol(torch.float32)


@PROPERTY
@given(data=st.data(), T=st.integers(0, 20), E=st.integers(1, 6), k=st.integers(1, 3), block_m=st.sampled_from([1, 4, 16]),
       int_dtype=st.sampled_from([torch.int64, torch.int32, torch.int16, torch.uint8]), seed=seeds)
def test_align_tokens_layouts_dtypes_and_range(data, T, E, k, block_m, int_dtype, seed):
    g = generator(seed)
    k = min(k, E)
    ids = torch.randint(0, E, (T, k), generator=g).to(DEVICE)
    want = align_tokens(ids, E, block_m)
    got = align_tokens(relayout(ids.to(int_dtype), data.draw(layouts)), E, block_m)
    for field in ("sorted_ids", "block_expert", "num_rows", "counts"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    if T:
        bad = ids.clone()
        bad[data.draw(st.integers(0, T - 1)), data.draw(st.integers(0, k - 1))] = data.draw(
            st.sampled_from([E, E + 3, -1]))
        with pytest.raises(ValueError, match="ids"):
            align_tokens(bad, E, block_m)
        for impl in MOE_IMPLS:
            with pytest.raises(ValueError, match="ids must lie"):
                moe_experts(randn(T, 8, gen=g), randn(E, 8, 8, gen=g), randn(E, 8, 4, gen=g),
                            torch.rand(T, k, generator=g).to(DEVICE), bad, impl=impl)


# --------------------------------------------------------------------------- claims the docstrings make


def _unchecked_fast_paths(g):
    """The ``check_values=False`` paths a decode loop or a CUDA graph runs, on valid inputs:
    ``{name: call}``, each returning the tensor it produced."""
    ins = paged_cache([40, 20], page=16, Hkv=2, D=16, gen=g, d_idx=16)
    kv = {n: ins[n] for n in ("k_cache", "v_cache", "block_table", "seq_lens")}
    q, q4, q_idx = randn(2, 4, 16, gen=g), randn(2, 3, 4, 16, gen=g), coarse(2, 2, 16, gen=g)
    k_new, slots = randn(2, 2, 16, gen=g), torch.tensor([3, 40], device=DEVICE)
    k_cache, v_cache = ins["k_cache"].clone(), ins["v_cache"].clone()

    def write():
        write_kv(k_new, k_new, k_cache, v_cache, slots, impl="triton", check_values=False)
        return k_cache
    return {
        "paged_decode": lambda: paged_decode(q, **kv, impl="triton", check_values=False),
        "paged_prefill": lambda: paged_prefill(q4, **kv, impl="triton", check_values=False),
        "msa_decode_paged": lambda: msa_decode_paged(q, **kv, q_idx=q_idx, k_idx_cache=ins["k_idx_cache"], topk=2,
                                                     impl="triton", check_values=False),
        "write_kv": write,
    }


def test_unchecked_fast_paths_read_nothing_back_to_the_host():
    # paged.py / msa.py / write.py: check_values=False skips every host read (CUDA graphs need that)
    from tests.support.operator_inputs import DeviceWork

    for name, call in _unchecked_fast_paths(generator(3)).items():
        with torch.no_grad(), DeviceWork() as work:
            call()
        assert not work.syncs, f"{name} synchronised with the host: {work.syncs}"


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (CUDA graphs); the CPU run checks the ops instead")
def test_unchecked_fast_paths_capture_in_a_cuda_graph():
    # a host sync inside capture raises; replaying the graph must give the eager answer
    for name, call in _unchecked_fast_paths(generator(4)).items():
        with torch.no_grad():
            eager = call().clone()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                call()  # warm-up: compile and autotune outside the capture
            torch.cuda.current_stream().wait_stream(stream)
            with torch.cuda.graph(graph):
                out = call()
            graph.replay()
            torch.cuda.synchronize()
        assert torch.equal(out, eager), name


def test_flash_gqa_reads_kv_without_a_copy():
    # dense.py: "no K/V copy in 'triton'" -- GQA maps query heads to kv heads by pointer arithmetic
    from tests.support.operator_inputs import DeviceWork

    g = generator(5)
    q, k, v = randn(1, 4, 8, 16, gen=g), randn(1, 96, 1, 16, gen=g), randn(1, 96, 1, 16, gen=g)
    with torch.no_grad(), DeviceWork() as work:
        o = attention(q, k, v, impl="triton")
    assert work.largest_new < k.numel() * 2, f"allocated {work.largest_new} elements (K has {k.numel()})"
    _close(o, attention(q, k, v, impl="reference"), torch.float32, "attention triton GQA")


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


def test_expert_counts_never_synchronises():
    # router.py: expert_counts is written with scatter_add_ so it never reads back to the host
    from minimax_lab.moe import expert_counts
    from tests.support.operator_inputs import DeviceWork

    ids = torch.randint(0, 6, (9, 2), generator=generator(7)).to(DEVICE)
    with DeviceWork() as work:
        counts = expert_counts(ids, 6)
    assert not work.syncs and torch.equal(counts.cpu(), torch.bincount(ids.cpu().reshape(-1), minlength=6))
