"""Bench suite ``msa``, case groups ``prefill``, ``flex``, ``query`` and ``1m``: end-to-end sparse
prefill (index scores + top-k + sparse attention) and its two parts, beside dense attention on
cuDNN, SDPA's flash backend, our dense Triton kernel, FlexAttention computing the same output and
SGLang's kernels where fetched; the 1M-token prefill; and the CPU preset's prefill check.
"""
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from minimax_lab import measure, runtime
from minimax_lab.attention.dense_triton import DEFAULT_CONFIG, flash_attention
from minimax_lab.attention.msa import msa_attention, msa_select
from minimax_lab.attention.msa_compare import FP8_TIE_TOLERANCE, selection_overlap, selection_score_gap
from minimax_lab.attention.msa_index_fp8 import dequantize_index_keys
from minimax_lab.bench import suite_msa_peer as msa_bench_peer
from minimax_lab.bench.suite_msa_inputs import (CPU, FP8_INDEX_NOTE, SUITE, _agree, checked_cpu_record,
                                                dense_causal_flops, fp8_index_inputs, prefill_inputs, selected_pairs)


def check_prefill(s: dict, dev, dtype, S: int) -> dict:
    """Triton vs torch on the GPU at length ``S`` (ragged): selection agreement and output error."""
    ins = prefill_inputs(s, S, dev, dtype, seed=123)
    kw = dict(block_size=s["Bk"], topk=s["topk"])
    sel_t = msa_select(ins["q_idx"], ins["k_idx"], impl="triton", **kw)
    sel_r = msa_select(ins["q_idx"].float(), ins["k_idx"].float(), impl="torch", **kw)
    agree = _agree(sel_t, sel_r)
    ref = msa_attention(*(ins[n].float() for n in ("q", "k", "v", "q_idx", "k_idx")), impl="torch",
                        selected=sel_t, **kw)
    errs = {}
    for sched in ("kv", "query"):
        o = msa_attention(**ins, impl="triton", schedule=sched, selected=sel_t, **kw)
        errs[sched] = measure.relative_error(o, ref)
    # FP8 index tensors: the kernel against the exact fp32 ranking of the same (dequantized) tensors;
    # near-ties may swap (FP8 tensor cores sum with fewer bits): checked by the score gap
    idx8 = fp8_index_inputs(ins["q_idx"], ins["k_idx"])
    sel8 = msa_select(**idx8, impl="triton", **kw)
    agree8 = _agree(sel8, msa_select(**idx8, impl="torch", **kw))
    gap8 = selection_score_gap(sel8, dequantize_index_keys(idx8["q_idx"], idx8["q_idx_scale"]),
                               dequantize_index_keys(idx8["k_idx"], idx8["k_idx_scale"]), **kw)
    out = {"S": S, "selection_rows_equal": round(agree, 6), "fp8_selection_rows_equal": round(agree8, 6),
           "fp8_selection_score_gap": gap8, "rel_err": errs}
    print(f"  check prefill S={S}: selection rows equal to torch(fp32) {agree:.5f}; FP8 index: rows equal to "
          f"torch(fp32) on the same tensors {agree8:.5f}, largest score gap {gap8:.3g} of the row's scale; rel err {errs}")
    if agree < 0.99 or gap8 > FP8_TIE_TOLERANCE or max(errs.values()) > measure.tolerance_for(dtype):
        raise AssertionError(f"MSA prefill check failed: {out}")
    return out


def _sdpa_peers(s, dev):
    rep = s["Hq"] // s["G"]

    def cudnn(q, k, v, q_idx, k_idx):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=True, enable_gqa=True)

    def flash(q, k, v, q_idx, k_idx):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            kr = k.transpose(1, 2).repeat_interleave(rep, dim=1)
            vr = v.transpose(1, 2).repeat_interleave(rep, dim=1)
            return F.scaled_dot_product_attention(q.transpose(1, 2), kr, vr, is_causal=True)

    def triton_flash(q, k, v, q_idx, k_idx):
        return flash_attention(q, k, v, causal=True, config=DEFAULT_CONFIG)  # fixed config: no autotune per S

    return {"sdpa_cudnn": cudnn, "sdpa_flash": flash, "triton_flash_dense": triton_flash}


def _flex_peer(s, ins, sel, dev):
    """FlexAttention with MSA's per-token selection as ``mask_mod``; returns (fn, build seconds)."""
    B, S, G, topk = sel.shape
    Bk, hpg = s["Bk"], s["Hq"] // s["G"]
    nb = math.ceil(S / Bk)
    hit = torch.zeros(B, G, S, nb, dtype=torch.bool, device=dev)
    idx = sel.permute(0, 2, 1, 3).long()
    hit.scatter_(3, idx.clamp(min=0), (idx >= 0))

    def mask_mod(b, h, q_i, kv_i):
        return hit[b, h // hpg, q_i, kv_i // Bk] & (kv_i <= q_i)

    t0 = time.perf_counter()
    bm = create_block_mask(mask_mod, B, s["Hq"], S, S, device=dev, _compile=True)
    compiled = torch.compile(flex_attention, dynamic=False)

    def fn(q, k, v, q_idx, k_idx):
        return compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=bm, enable_gqa=True)

    out = fn(**ins)  # compile here, outside the timing
    torch.cuda.synchronize()
    return fn, out, time.perf_counter() - t0


def run_prefill(s: dict, S: int, dev, dtype, *, reps: int, check: dict, with_flex: bool,
                with_query: bool, peers_reps: int = 3, peer: dict | None = None, dense_peers: bool = True) -> list[dict]:
    kw = dict(block_size=s["Bk"], topk=s["topk"])
    mk = lambda seed: prefill_inputs(s, S, dev, dtype, seed)  # noqa: E731
    shape = dict(B=1, S=S, **s)
    flops = dense_causal_flops(S, s["Hq"], s["D"])
    pairs = selected_pairs(S, s["Bk"], s["topk"])
    sparse_flops = 4.0 * s["Hq"] * s["D"] * pairs
    index_flops = 2.0 * s["G"] * s["Didx"] * (S // s["Bk"]) * s["Bk"] * S / 2  # visited earlier blocks, ~half
    times, notes = {}, {}
    ours = {"triton_kv": lambda **a: msa_attention(**a, impl="triton", schedule="kv", **kw),
            "triton_kv_fp8idx": lambda q_idx, k_idx, **a: msa_attention(
                **a, **fp8_index_inputs(q_idx, k_idx), impl="triton", schedule="kv", **kw)}
    if with_query:
        ours["triton_query"] = lambda **a: msa_attention(**a, impl="triton", schedule="query", **kw)
    for name, fn in ours.items():
        times[name] = measure.time_fn(fn, mk, reps=reps, warmup=2)
    peers = _sdpa_peers(s, dev) if dev.type == "cuda" and dense_peers else {}
    for name, fn in peers.items():
        try:
            times[name] = measure.time_fn(fn, mk, reps=peers_reps, warmup=1)
        except Exception as e:  # noqa: BLE001 - a missing peer is a note
            notes[name] = f"{type(e).__name__}: {e}"[:200]
    ins0 = mk(0)
    sel0 = msa_select(ins0["q_idx"], ins0["k_idx"], impl="triton", **kw)
    flex_extra = {}
    if with_flex and dev.type == "cuda":
        try:
            fn, out_flex, build_s = _flex_peer(s, ins0, sel0, dev)
            mine = msa_attention(**ins0, impl="triton", selected=sel0, **kw)
            flex_extra = {"flex_rel_err_vs_ours": measure.relative_error(mine, out_flex.transpose(1, 2)),
                          "flex_mask_build_and_compile_s": round(build_s, 1)}
            times["flex_msa_mask"] = measure.time_fn(fn, inputs=ins0, reps=2, warmup=1)
        except Exception as e:  # noqa: BLE001
            notes["flex_msa_mask"] = f"{type(e).__name__}: {e}"[:300]
    # the parts alone
    idx_in = lambda seed: {n: mk(seed)[n] for n in ("q_idx", "k_idx")}  # noqa: E731
    t_index = measure.time_fn(lambda q_idx, k_idx: msa_select(q_idx, k_idx, impl="triton", **kw), idx_in,
                              reps=reps, warmup=2)
    t_index8 = measure.time_fn(lambda q_idx, k_idx: msa_select(**fp8_index_inputs(q_idx, k_idx), impl="triton", **kw),
                               idx_in, reps=reps, warmup=2)
    rows8, kept8 = selection_overlap(msa_select(**fp8_index_inputs(ins0["q_idx"], ins0["k_idx"]), impl="triton",
                                                **kw), sel0)
    fp8_extra = {"index_tensors": FP8_INDEX_NOTE,
                 "selection_rows_equal_vs_bf16": round(rows8, 6), "selected_blocks_shared_vs_bf16": round(kept8, 6)}
    sel_in = lambda seed: {**mk(seed), "selected": sel0}  # noqa: E731
    t_sparse = measure.time_fn(lambda **a: msa_attention(**a, impl="triton", schedule="kv", check_selected=False, **kw),
                               sel_in, reps=reps, warmup=2)  # sel0 comes from msa_select: its check is not timed
    sgl_times, sgl_extra = _sglang_prefill(peer, ins0, mk, sel0, kw, reps=max(peers_reps, reps // 2), notes=notes)
    times.update({n: t for n, t in sgl_times.items() if n == msa_bench_peer.PEER})
    peer_ms = {n: t.ms for n, t in times.items() if n not in ours}
    extra = {"check": check, **({"peer_notes": notes} if notes else {}), **flex_extra,
             "flops_counted": "dense causal (4*Hq*D*S*(S+1)/2): ours reads as a dense-equivalent rate",
             "selected_pairs_per_head": pairs}
    recs = []
    for name in ours:
        recs.append(measure.make_record(SUITE, f"prefill_s{S}", name, times[name], shape=shape, dtype=dtype,
                                        flops=flops, ceiling="gemm", peers=peer_ms,
                                        extra={**extra, **(fp8_extra if "fp8idx" in name else {})}))
    for name in peer_ms:
        recs.append(measure.make_record(SUITE, f"prefill_s{S}", name, times[name], shape=shape, dtype=dtype,
                                        flops=flops, ceiling="gemm",
                                        extra=sgl_extra if name == msa_bench_peer.PEER else None))
    dense_rate = {n: round(flops / (t * 1e-3) / 1e12, 1) for n, t in peer_ms.items() if n != "flex_msa_mask"}
    sparse_extra = {"flops_counted": "effective: 4*Hq*D per selected (query, key) pair"}
    index_extra = {"flops_counted": "2*G*D_idx per (query, earlier-block key) pair"}
    sgl_attn, sgl_index = sgl_times.get(msa_bench_peer.PEER + "_attn"), sgl_times.get(msa_bench_peer.PEER + "_index")
    recs.append(measure.make_record(SUITE, f"sparse_attn_s{S}", "triton_kv", t_sparse, shape=shape, dtype=dtype,
                                    flops=sparse_flops, ceiling="gemm",
                                    peers={msa_bench_peer.PEER: sgl_attn.ms} if sgl_attn else None,
                                    extra={**sparse_extra, "dense_peer_tflops": dense_rate}))
    recs.append(measure.make_record(SUITE, f"index_s{S}", "triton_fused_topk", t_index, shape=shape, dtype=dtype,
                                    flops=index_flops, ceiling="gemm",
                                    peers={msa_bench_peer.PEER: sgl_index.ms} if sgl_index else None,
                                    extra=index_extra))
    recs.append(measure.make_record(SUITE, f"index_s{S}", "triton_fused_topk_fp8idx", t_index8, shape=shape,
                                    dtype=dtype, flops=index_flops, ceiling="gemm",
                                    peers={"triton_fused_topk": t_index.ms, **({msa_bench_peer.PEER: sgl_index.ms}
                                                                             if sgl_index else {})},
                                  extra={**index_extra, **fp8_extra}))
    for case, t, flop, ex in ((f"sparse_attn_s{S}", sgl_attn, sparse_flops, sparse_extra),
                              (f"index_s{S}", sgl_index, index_flops, index_extra)):
        if t is not None:
            recs.append(measure.make_record(SUITE, case, msa_bench_peer.PEER, t, shape=shape, dtype=dtype, flops=flop,
                                            ceiling="gemm", extra={**ex, **sgl_extra}))
    line = "  ".join(f"{n} {t.ms:8.2f} ms" for n, t in times.items())
    print(f"  prefill S={S:>7}: {line} | index {t_index.ms:.2f} ms (FP8 {t_index8.ms:.2f} ms; rows equal to bf16 "
          f"{rows8:.3f}, blocks shared {kept8:.3f}), sparse {t_sparse.ms:.2f} ms "
          f"({sparse_flops / (t_sparse.ms * 1e-3) / 1e12:.0f} eff. TFLOP/s) {flex_extra}"
          f"{' notes ' + str(notes) if notes else ''}")
    if sgl_times:
        print(f"    {msa_bench_peer.PEER}: " + "  ".join(f"{n} {t.ms:.2f} ms" for n, t in sgl_times.items()))
    for r in recs:
        if r["impl"] == "triton_kv" and r.get("speedup_vs"):
            print(f"    speedups {r['case']}: {r['speedup_vs']}")
    return recs


def _sglang_prefill(peer, ins0, mk, sel0, kw, *, reps, notes) -> tuple[dict, dict]:
    """SGLang's prefill beside ours (checked first): ``({impl: Timing}, extra for its records)``;
    ``({}, {})`` with a note when the peer is absent or fails."""
    if peer is None or not peer["available"]:
        notes[msa_bench_peer.PEER] = "absent: " + (peer["reason"] if peer else "not requested")
        return {}, {}
    try:
        o0 = msa_attention(**ins0, impl="triton", selected=sel0, **kw)
        res = msa_bench_peer.prefill_peer(ins0, mk, sel_ours=sel0, o_ours=o0, reps=reps, **kw)
    except Exception as e:  # noqa: BLE001 - a failing peer is recorded, ours still count
        notes[msa_bench_peer.PEER] = f"{type(e).__name__}: {e}"[:400]
        return {}, {}
    return res["times"], {"peer_sglang_version": peer["sglang"], "peer_check": res["check"],
                          "peer_settings": "SGLang M3 path on CUDA: 0 init, 1 local block, max score, "
                                           "score-only indexer, block_size_q=1, autotuned per case"}


def run_prefill_1m(s: dict, dev, dtype, dense_128k_ms: float | None, *, measure_dense: bool = True) -> list[dict]:
    S = 1 << 20
    kw = dict(block_size=s["Bk"], topk=s["topk"])
    torch.cuda.empty_cache()
    ins = prefill_inputs(s, S, dev, dtype, seed=5)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    t = measure.time_fn(lambda **a: msa_attention(**a, impl="triton", schedule="kv", **kw), inputs=ins,
                        reps=2, warmup=1, rotate=False)
    peak = torch.cuda.max_memory_allocated()
    t_index = measure.time_fn(lambda q_idx, k_idx: msa_select(q_idx, k_idx, impl="triton", **kw),
                              inputs={"q_idx": ins["q_idx"], "k_idx": ins["k_idx"]}, reps=2, warmup=1, rotate=False)
    t8 = measure.time_fn(lambda q_idx, k_idx, **a: msa_attention(**a, **fp8_index_inputs(q_idx, k_idx), impl="triton",
                                                                 schedule="kv", **kw),
                       inputs=ins, reps=2, warmup=1, rotate=False)
    t_index8 = measure.time_fn(lambda q_idx, k_idx: msa_select(**fp8_index_inputs(q_idx, k_idx), impl="triton", **kw),
                               inputs={"q_idx": ins["q_idx"], "k_idx": ins["k_idx"]}, reps=2, warmup=1, rotate=False)
    extra = {"peak_mem_gib": round(peak / 2**30, 2), "inputs_gib": round(base / 2**30, 2),
             "index_ms": round(t_index.ms, 2)}
    extra8 = {"index_ms": round(t_index8.ms, 2),
              "index_tensors": FP8_INDEX_NOTE}
    peers = {}
    if dense_128k_ms:
        extra["dense_cudnn_estimate_ms"] = round(dense_128k_ms * 64, 1)
        extra["dense_estimate_note"] = "ESTIMATE: SDPA cuDNN time at 128k x 64 (quadratic in S)"
        peers["sdpa_cudnn_estimated_x64"] = dense_128k_ms * 64
    if measure_dense:  # one call (~30 s on an H200), timed with CUDA events; it includes cuDNN's plan build
        cudnn = _sdpa_peers(s, dev)["sdpa_cudnn"]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = cudnn(**ins)
        end.record()
        torch.cuda.synchronize()
        del out
        peers["sdpa_cudnn"] = start.elapsed_time(end)
        extra["dense_cudnn_ms"] = round(peers["sdpa_cudnn"], 1)
        extra["dense_cudnn_note"] = "MEASURED once (one call, CUDA events, includes cuDNN's plan build)"
    peers = peers or None
    recs = [measure.make_record(SUITE, f"prefill_s{S}", name, tm, shape=dict(B=1, S=S, **s), dtype=dtype,
                                flops=dense_causal_flops(S, s["Hq"], s["D"]), ceiling="gemm", peers=peers, extra=ex)
            for name, tm, ex in (("triton_kv", t, extra),
                                 ("triton_kv_fp8idx", t8, {"inputs_gib": extra["inputs_gib"], **extra8}))]
    print(f"  prefill S=1M: {t.ms:.1f} ms (index {t_index.ms:.1f} ms); FP8 index {t8.ms:.1f} ms (index "
          f"{t_index8.ms:.1f} ms); peak {extra['peak_mem_gib']} GiB "
          f"(inputs {extra['inputs_gib']} GiB); dense cuDNN {extra.get('dense_cudnn_ms')} ms measured, "
          f"{extra.get('dense_cudnn_estimate_ms')} ms estimated")
    del ins
    torch.cuda.empty_cache()
    return recs


def run_cpu() -> list[dict]:
    """Tiny shapes (the CPU preset) on the kernel device -- the interpreter on the CPU, fp32; a GPU in
    its compute dtype: every impl checked against the reference, then timed (not a speed figure)."""
    dev = runtime.kernel_device()
    s, S, dtype = CPU, 40, torch.float32 if dev.type == "cpu" else runtime.compute_dtype()
    kw = dict(block_size=s["Bk"], topk=s["topk"])
    mk = lambda seed: prefill_inputs(s, S, dev, dtype, seed)  # noqa: E731
    recs = []
    for impl, sched in (("torch", "kv"), ("triton", "kv"), ("triton", "query")):
        fn = (lambda impl, sched: lambda **a: msa_attention(**a, impl=impl, schedule=sched, **kw))(impl, sched)
        recs.append(checked_cpu_record(fn, lambda **a: msa_attention(**a, impl="reference", **kw), mk,
                                       case=f"prefill_s{S}", impl=f"{impl}_{sched}", shape=dict(B=1, S=S, **s),
                                       dtype=dtype, reps=3, reference_dtype=torch.float32))
    t = measure.time_fn(lambda **a: msa_attention(**a, impl="reference", **kw), mk, reps=3, warmup=1)
    recs.append(measure.make_record(SUITE, f"prefill_s{S}", "reference", t, shape=dict(B=1, S=S, **s), dtype=dtype))
    peer = msa_bench_peer.peer_status()
    note = ("absent: " + peer["reason"]) if not peer["available"] else \
        "timed on GPU runs only (SGLang's kernels take bf16/fp16; the interpreter needs minutes)"
    print(f"  peer {msa_bench_peer.PEER}: {note}")
    for r in recs:
        r["peer_notes"] = {msa_bench_peer.PEER: note}
    return recs
