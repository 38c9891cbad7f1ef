"""Bench suite ``msa``: MiniMax Sparse Attention kernels against dense attention and FlexAttention.

Shape (GPU): MSA's public one -- bf16, Hq=64, Hkv=G=4, D=128, D_idx=128, Bk=128, topk=16, B=1
for prefill. Every GPU case first checks the Triton kernels against the ``torch`` impl on the
same GPU (selection exact where scores are distinct; outputs within bf16 tolerance), then times
ours and the peers in the same process with :func:`minimax_lab.bench.time_fn`.

Cases and what is counted:

* ``prefill_s{S}`` (S = 32k, 64k, 128k): end to end = index scores + top-k + sparse attention,
  from ``q, k, v, q_idx, k_idx``. Peers: dense causal SDPA on cuDNN (GQA), SDPA's flash backend
  (K/V repeated to Hq heads, as it needs), our dense Triton FlashAttention, and -- at 64k --
  FlexAttention computing the **same output** (``mask_mod`` from our selection, block mask
  built with ``_compile=True`` outside the timed region; its output is compared with ours).
  FLOPs: the dense causal count, so ``tflops`` of ours reads as "dense-equivalent" rate.
  ``triton_kv_fp8idx``: the same with FP8 index tensors (``q_idx`` and ``k_idx`` quantized to
  e4m3 inside the timed call, one power-of-two scale per vector); its records carry how many
  selection rows equal the bf16 indexer's and the share of selected blocks both keep.
* ``index_s{S}`` / ``sparse_attn_s{S}``: the two parts alone (``index_s{S}`` also with FP8
  index tensors, quantization included: ``triton_fused_topk_fp8idx``). The sparse part's ``tflops`` is
  the **effective** rate over the tokens actually selected (``4 * Hq * D`` per (query, key)
  pair, causal inside the local block), to be read against the dense kernel's rate.
* ``prefill_s1048576``: ours (time and peak memory) and dense cuDNN SDPA timed once (one call,
  ~30 s on an H200; the record says so), beside the estimate from the 128k cuDNN time x 64
  (quadratic scaling).
* ``decode_b{B}_ctx{L}`` (B = 32, 64; L = 32k, 64k, 128k; one query token, page = Bk = 128, pages
  of each sequence scattered at random over the cache): end-to-end paged sparse decode (index
  scores over all pages + top-k + attention) and the attention part alone, against a dense
  paged decode (our own split-K paged kernel with every page selected: the same code, so the
  ratio is the sparsity's) and gather-pages + SDPA where memory allows. ``bytes_moved`` of the
  attention part = the selected pages' K and V; end to end adds the index keys of every page.

* ``decode_fp8kv_b{B}_ctx{L}`` (B = 32, L = 128k, the decode inputs above): end-to-end
  ``msa_decode_paged(impl="triton")`` on the bf16 K/V cache and on FP8 (e4m3) K/V caches with
  per-token and per-page scales (the index keys stay bf16), eager and under CUDA graphs; checked
  first against the torch impl on the same FP8 pages. ``bytes_moved``: the selected pages' K/V at
  their width (plus their scales) and the index keys of every page.

* ``backward_s{S}`` (S = :data:`LENGTHS`, or ``lengths``): training's attention step at MSA's
  shape, checked first (at S = 4,173, against the torch backward in fp32 over the same
  selection). ``triton_fwd_bwd``: ``msa_attention(impl="triton")`` under autograd, selection +
  forward (saving ``lse``) + backward, from ``q, k, v, q_idx, k_idx`` and ``do``; ``triton_bwd``:
  the backward kernels alone from the saved ``o``, ``lse`` and selection. Peers: dense causal
  forward + backward through SDPA on cuDNN (GQA) and on FlashAttention-2 (K/V repeated). FLOPs:
  FlashAttention-2's dense count (backward = 2.5 x forward), so ours reads as a dense-equivalent
  rate; its records carry the selected pairs per head.

Peer SGLang (``sglang_triton``): when the folder ``tools/fetch_peers.py`` lays out is present
(:mod:`minimax_lab.bench.peers`), SGLang's Triton MSA kernels run beside ours in the prefill and decode
cases (end to end, index + top-k alone, attention alone; decode also under CUDA graphs), after
:mod:`.msa_bench_peer` checked them against ours and a float64 brute force on sampled rows; their
records carry ``peer_sglang_version``. Without the folder the suite says so and every record
carries ``peer_notes.sglang_triton = "absent: <why>"``.

Case groups (:data:`CASES`, ``run(cases=...)`` or ``--cases``; all by default): ``prefill`` (the
prefill, index and sparse-attention cases at :data:`LENGTHS`), ``1m``, ``decode`` (at
:data:`DECODE_SIZES`), ``flex`` (the FlexAttention peer at 64k, with ``prefill``), ``query`` (the
query-schedule kernel up to 64k, with ``prefill``), ``fp8kv`` (at :data:`FP8KV_SIZES`), ``backward``
(at :data:`LENGTHS`). Options
(:data:`OPTIONS`): ``lengths``, ``decode_sizes``, ``fp8kv_sizes`` pick the sizes; ``dense=False``
(``--no-dense``) leaves out the dense prefill peers (cuDNN, flash, dense Triton) and the gather
decode peer to save time; ``partial=FILE`` appends each case's records to ``FILE`` as soon as it
is done (a run cut short keeps them).

    python -m minimax_lab.bench msa --cases prefill --lengths 131072 --no-dense

At ``preset="cpu"`` the shapes are tiny (interpreter, fp32) and it runs in seconds: only the
``prefill`` and ``backward`` groups have a CPU version (the other groups add nothing there); the
CPU ``backward`` checks ours and the torch impl's autograd against float64 autograd through the
reference.
"""
from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from minimax_lab import measure, runtime
from minimax_lab.attention.dense_triton import DEFAULT_CONFIG, flash_attention
from minimax_lab.attention.msa import MSA_SHAPE, MSA_SHAPE_CPU, msa_attention, msa_decode_paged, msa_select
from minimax_lab.attention.msa_backward_reference import msa_attention_backward_reference
from minimax_lab.attention.msa_backward_torch import msa_attention_backward_torch
from minimax_lab.attention.msa_backward_triton import msa_attention_backward_triton
from minimax_lab.attention.msa_compare import FP8_TIE_TOLERANCE, selection_overlap, selection_score_gap
from minimax_lab.attention.msa_index_fp8 import dequantize_index_keys, quantize_index_keys
from minimax_lab.attention.msa_torch import block_scores_torch, msa_decode_paged_torch, select_from_scores
from minimax_lab.attention.msa_triton_decode import (decode_attention_pages, msa_decode_paged_triton,
                                                     msa_decode_select_triton, paged_index_scores_triton)
from minimax_lab.bench import suite_msa_peer as msa_bench_peer
from minimax_lab.fp8 import quantize_fp8

SUITE = "msa"
GPU, CPU = MSA_SHAPE, MSA_SHAPE_CPU

#: case groups (see the module doc); all run by default
CASES = ("prefill", "1m", "decode", "flex", "query", "fp8kv", "backward")
LENGTHS = (32768, 65536, 131072)
DECODE_SIZES = ((32, 32768), (32, 65536), (32, 131072), (64, 32768), (64, 65536), (64, 131072))
FP8KV_SIZES = ((32, 131072),)


def batch_context(text: str) -> tuple[int, int]:
    """``"B:context"`` (e.g. ``"32:131072"``) -> ``(32, 131072)``."""
    try:
        b, c = (int(x) for x in str(text).split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected B:context such as 32:131072, got {text!r}") from None
    if b < 1 or c < 1:
        raise argparse.ArgumentTypeError(f"expected positive B:context, got {text!r}")
    return b, c


#: options of :func:`run` as ``python -m minimax_lab.bench msa`` arguments (``--decode-sizes`` ...)
OPTIONS = {
    "lengths": dict(type=int, nargs="+", metavar="S",
                    help=f"prefill and backward lengths (default {' '.join(map(str, LENGTHS))})"),
    "decode_sizes": dict(type=batch_context, nargs="+", metavar="B:CTX",
                         help="decode batch:context pairs (default " + " ".join(f"{b}:{c}" for b, c in DECODE_SIZES)
                              + ")"),
    "fp8kv_sizes": dict(type=batch_context, nargs="+", metavar="B:CTX",
                        help="FP8 K/V decode batch:context pairs (default "
                             + " ".join(f"{b}:{c}" for b, c in FP8KV_SIZES) + ")"),
    "dense": dict(action=argparse.BooleanOptionalAction,
                  help="time the dense prefill peers and the gather decode peer (default: yes)"),
    "partial": dict(metavar="FILE", help="append each case's records to FILE as soon as it is done"),
}


def prefill_inputs(s: dict, S: int, dev, dtype, seed: int, B: int = 1) -> dict:
    g = torch.Generator(device=dev).manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, device=dev, generator=g).to(dtype)  # noqa: E731
    return {"q": r(B, S, s["Hq"], s["D"]), "k": r(B, S, s["G"], s["D"]), "v": r(B, S, s["G"], s["D"]),
            "q_idx": r(B, S, s["G"], s["Didx"]), "k_idx": r(B, S, s["Didx"])}


def selected_pairs(S: int, Bk: int, topk: int) -> int:
    """(query, key) pairs one head attends over: per query t, all t+1 keys when it sees at most
    ``topk`` blocks, else ``(topk-1) * Bk`` full blocks plus ``t % Bk + 1`` keys of the local one."""
    t = torch.arange(S, dtype=torch.int64)
    n = t // Bk + 1
    return int(torch.where(n <= topk, t + 1, (topk - 1) * Bk + t % Bk + 1).sum())


def dense_causal_flops(S: int, Hq: int, D: int, B: int = 1) -> float:
    return 4.0 * B * Hq * D * S * (S + 1) / 2


def _agree(sel_a, sel_b) -> float:
    return float((sel_a == sel_b).all(-1).float().mean())


#: what the FP8-index records say about their index tensors
FP8_INDEX_NOTE = "float8_e4m3fn, one power-of-two scale per vector, quantized in the timed call"


def fp8_index_inputs(q_idx, k_idx) -> dict:
    """The index tensors in FP8 with their scales, as ``msa_select``/``msa_attention`` take them
    (no host read: this runs inside timed calls)."""
    (q8, qs), (k8, ks) = (quantize_index_keys(x, check_values=False) for x in (q_idx, k_idx))
    return {"q_idx": q8, "k_idx": k8, "q_idx_scale": qs, "k_idx_scale": ks}


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


# --------------------------------------------------------------------------- decode


#: (pages per program, warps, stages) of the index pass timed as tuning data in the decode cases
INDEX_SWEEP = [(8, 4, 3), (16, 4, 3), (8, 8, 3), (16, 8, 4), (4, 4, 4), (8, 4, 5), (32, 8, 3)]


def decode_inputs(s: dict, B: int, L: int, dev, dtype, seed: int, T: int = 1) -> dict:
    """A paged cache holding B sequences of length L (pages scattered at random), and queries."""
    g = torch.Generator(device=dev).manual_seed(seed)
    ps = s["Bk"]
    maxp = math.ceil(L / ps)
    P = B * maxp
    r = lambda *shape: torch.randn(*shape, device=dev, generator=g).to(dtype)  # noqa: E731
    perm = torch.randperm(P, device=dev, generator=g).to(torch.int32)
    return {"q": r(B, T, s["Hq"], s["D"]), "k_cache": r(P, ps, s["G"], s["D"]), "v_cache": r(P, ps, s["G"], s["D"]),
            "block_table": perm.view(B, maxp).contiguous(), "seq_lens": torch.full((B,), L, dtype=torch.int32, device=dev),
            "q_idx": r(B, T, s["G"], s["Didx"]), "k_idx_cache": r(P, ps, s["Didx"])}


def check_decode(s: dict, dev, dtype) -> dict:
    """Triton vs torch decode on a ragged batch with a random page table."""
    ins = decode_inputs(s, 3, 5 * s["Bk"] * max(1, s["topk"] // 2) + 7, dev, dtype, seed=11, T=1)
    ins["seq_lens"] = torch.tensor([ins["block_table"].shape[1] * s["Bk"] - 3, s["Bk"] + 1, 40],
                                   dtype=torch.int32, device=dev)
    o, sel = msa_decode_paged(**ins, topk=s["topk"], impl="triton", return_selected=True)
    f = {n: (t.float() if t.is_floating_point() else t) for n, t in ins.items()}
    o_r, sel_r = msa_decode_paged(**f, topk=s["topk"], impl="torch", return_selected=True)
    o_same = msa_decode_paged_torch(f["q"], f["k_cache"], f["v_cache"], f["block_table"], f["seq_lens"], sel)
    out = {"selection_rows_equal": round(_agree(sel, sel_r), 6), "rel_err": measure.relative_error(o, o_same)}
    print(f"  check decode: {out}")
    if out["selection_rows_equal"] < 0.95 or out["rel_err"] > measure.tolerance_for(dtype):
        raise AssertionError(f"MSA decode check failed: {out}")
    return out


def _gather_sdpa(s):
    def fn(q, k_cache, v_cache, block_table, seq_lens, **_):
        B, T, Hq, D = q.shape
        k = k_cache[block_table.long()].flatten(1, 2)  # [B, L, G, D]
        v = v_cache[block_table.long()].flatten(1, 2)
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              enable_gqa=True)
    return fn


def run_decode(s: dict, B: int, L: int, dev, dtype, *, reps: int, check: dict, gather_peer: bool,
               peer: dict | None = None) -> list[dict]:
    ins = decode_inputs(s, B, L, dev, dtype, seed=1)
    topk, ps, G, D = s["topk"], s["Bk"], s["G"], s["D"]
    maxp = ins["block_table"].shape[1]
    elt = torch.empty(0, dtype=dtype).element_size()
    sel = msa_decode_select_triton(ins["q_idx"], ins["k_idx_cache"], ins["block_table"], ins["seq_lens"], topk=topk)
    all_pages = torch.arange(maxp, device=dev, dtype=torch.int32).expand(B, 1, G, maxp).contiguous()
    # dense peer correctness: same kernel, every page; vs gather + SDPA below when it runs
    fns = {
        "triton_sparse": lambda **a: msa_decode_paged(**a, topk=topk, impl="triton"),
        # what a decode loop calls once its tables are validated (the peer checks no values either)
        "triton_sparse_unchecked": lambda **a: msa_decode_paged(**a, topk=topk, impl="triton", check_values=False),
        "triton_sparse_attn_only": lambda q, k_cache, v_cache, block_table, seq_lens, **_: decode_attention_pages(
            q, k_cache, v_cache, block_table, seq_lens, sel),
        "dense_paged_triton": lambda q, k_cache, v_cache, block_table, seq_lens, **_: decode_attention_pages(
            q, k_cache, v_cache, block_table, seq_lens, all_pages),
        "triton_index_only": lambda q_idx, k_idx_cache, block_table, seq_lens, **_: msa_decode_select_triton(
            q_idx, k_idx_cache, block_table, seq_lens, topk=topk),
    }
    # FP8 index keys (per-token power-of-two scales): how often the selection changes, and the time
    k8, k8_scale = quantize_index_keys(ins["k_idx_cache"])
    sel8 = msa_decode_select_triton(ins["q_idx"], k8, ins["block_table"], ins["seq_lens"], topk=topk,
                                    k_idx_scale=k8_scale)
    same_rows, overlap = selection_overlap(sel8, sel)
    fp8_check = {"selection_rows_equal_vs_bf16": round(same_rows, 6), "selected_blocks_shared_vs_bf16": round(overlap, 6)}
    fns["triton_sparse_fp8idx"] = lambda **a: msa_decode_paged(**{**a, "k_idx_cache": k8}, k_idx_scale=k8_scale,
                                                               topk=topk, impl="triton", check_values=False)
    fns["triton_index_only_fp8idx"] = lambda q_idx, block_table, seq_lens, **_: msa_decode_select_triton(
        q_idx, k8, block_table, seq_lens, topk=topk, k_idx_scale=k8_scale)
    # tuning data: the index pass's launch configs, bf16 and FP8 keys (FP8 keys halve the bytes per
    # page, so they may want more pages in flight per program than the bf16 default)
    for pages, warps, stages in INDEX_SWEEP:
        cfg = {"PAGES": pages, "num_warps": warps, "num_stages": stages}
        tag = f"p{pages}w{warps}s{stages}"
        fns[f"index_scores_bf16_{tag}"] = (lambda c: lambda q_idx, k_idx_cache, block_table, seq_lens, **_:
                                           paged_index_scores_triton(q_idx, k_idx_cache, block_table, seq_lens,
                                                                     config=c))(cfg)
        fns[f"index_scores_fp8idx_{tag}"] = (lambda c: lambda q_idx, block_table, seq_lens, **_:
                                             paged_index_scores_triton(q_idx, k8, block_table, seq_lens, k8_scale,
                                                                       config=c))(cfg)
    notes = {}
    if gather_peer:
        fns["gather_sdpa"] = _gather_sdpa(s)
    times = {}
    for name, fn in fns.items():
        try:
            times[name] = measure.time_fn(fn, inputs=ins, reps=reps, warmup=3, rotate=False)
        except Exception as e:  # noqa: BLE001
            notes[name] = f"{type(e).__name__}: {e}"[:200]
        torch.cuda.empty_cache()
    # launch-bound at these sizes: also replay CUDA graphs (how a decode engine runs), ours and the peer,
    # through the kernels' own entry points (the public one validates seq_lens on the host: a sync)
    graphed = {
        "triton_sparse_cudagraph": lambda q, k_cache, v_cache, block_table, seq_lens, q_idx, k_idx_cache:
            msa_decode_paged_triton(q, k_cache, v_cache, block_table, seq_lens, q_idx, k_idx_cache, topk=topk)[0],
        "dense_paged_triton_cudagraph": fns["dense_paged_triton"],
        "triton_sparse_attn_only_cudagraph": fns["triton_sparse_attn_only"],
        "triton_index_only_cudagraph": fns["triton_index_only"],
        "triton_sparse_fp8idx_cudagraph": lambda q, k_cache, v_cache, block_table, seq_lens, q_idx, k_idx_cache:
            msa_decode_paged_triton(q, k_cache, v_cache, block_table, seq_lens, q_idx, k8, topk=topk,
                                    k_idx_scale=k8_scale)[0],
        "triton_index_only_fp8idx_cudagraph": fns["triton_index_only_fp8idx"],
    }
    for name, fn in graphed.items():
        try:
            times[name] = measure.time_fn(fn, inputs=ins, reps=reps, warmup=3, rotate=False, cuda_graph=True)
        except Exception as e:  # noqa: BLE001
            notes[name] = f"{type(e).__name__}: {e}"[:200]
    if "gather_sdpa" in times:
        dense = fns["dense_paged_triton"](**ins)
        notes["dense_paged_triton_rel_err_vs_gather_sdpa"] = measure.relative_error(
            dense, fns["gather_sdpa"](**ins).transpose(1, 2))
    sgl_extra = {}
    if peer is None or not peer["available"]:
        notes[msa_bench_peer.PEER] = "absent: " + (peer["reason"] if peer else "not requested")
    else:
        try:
            o_ours = msa_decode_paged(**ins, topk=topk, impl="triton")
            res = msa_bench_peer.decode_peer(ins, topk=topk, sel_ours=sel, o_ours=o_ours, reps=reps)
            times.update(res["times"])
            notes.update(res.get("notes", {}))
            sgl_extra = {"peer_sglang_version": peer["sglang"], "peer_check": res["check"],
                         "peer_settings": "SGLang M3 path on CUDA: 0 init, 1 local block, max score, score-only "
                                          "indexer, page 128, Triton two-stage top-k, autotuned per case"}
        except Exception as e:  # noqa: BLE001 - a failing peer is recorded, ours still count
            notes[msa_bench_peer.PEER] = f"{type(e).__name__}: {e}"[:400]
    sel_bytes = B * G * topk * ps * D * 2 * elt
    idx_bytes = B * maxp * ps * s["Didx"] * elt
    idx8_bytes = B * maxp * ps * (s["Didx"] + 4)  # one byte per key value, a 4-byte scale per token
    dense_bytes = B * maxp * ps * G * D * 2 * elt
    shape = dict(B=B, ctx=L, T=1, page_size=ps, **s)
    peers = {n: times[n].ms for n in ("dense_paged_triton", "gather_sdpa") if n in times}
    case = f"decode_b{B}_ctx{L}"
    extra = {"check": check, **({"notes": notes} if notes else {})}
    recs = []
    P = msa_bench_peer.PEER
    sgl_peer_of = {"triton_sparse": P, "triton_sparse_attn_only": P + "_attn", "triton_index_only": P + "_index",
                   "triton_sparse_unchecked": P, "triton_sparse_fp8idx": P, "triton_index_only_fp8idx": P + "_index"}
    sgl_peer_of.update({k + "_cudagraph": v + "_cudagraph" for k, v in list(sgl_peer_of.items())})
    for name, t in times.items():
        kind = "index" if "index" in name else "attn" if "attn" in name else \
            "sparse" if name.startswith(("triton_sparse", P)) else "dense"
        idx = idx8_bytes if "fp8idx" in name else idx_bytes
        nbytes = {"sparse": sel_bytes + idx, "attn": sel_bytes, "index": idx, "dense": dense_bytes}[kind]
        counted = {"sparse": "selected K/V pages + index keys of every page", "attn": "selected K/V pages",
                   "index": "index keys of every page", "dense": "all K/V pages"}[kind]
        rec_peers = None
        if name.startswith("triton_sparse") and name.endswith("_cudagraph") and "dense_paged_triton_cudagraph" in times:
            rec_peers = {"dense_paged_triton_cudagraph": times["dense_paged_triton_cudagraph"].ms}
        elif name.startswith("triton_sparse"):
            rec_peers = dict(peers)
        if name in sgl_peer_of and sgl_peer_of[name] in times:
            rec_peers = {**(rec_peers or {}), sgl_peer_of[name]: times[sgl_peer_of[name]].ms}
        rec_extra = {**extra, "bytes_counted": counted, **(sgl_extra if name.startswith(P) else {}),
                     **(fp8_check if "fp8idx" in name else {})}
        recs.append(measure.make_record(SUITE, case, name, t, shape=shape, dtype=dtype, bytes_moved=nbytes,
                                        ceiling="copy", peers=rec_peers, extra=rec_extra))
    print(f"  {case}: " + "  ".join(f"{r['impl']} {r['ms']:.3f} ms ({r['pct_of_ceiling']:.0f}% copy)" for r in recs)
          + (f" notes {notes}" if notes else ""))
    del ins
    torch.cuda.empty_cache()
    return recs


def run_decode_fp8kv(s: dict, B: int, L: int, dev, dtype, *, reps: int) -> list[dict]:
    """``msa_decode_paged(impl="triton")`` with bf16 K/V vs FP8 K/V (per-token and per-page scales)."""
    layouts = {"token": (-1,), "page": (1, 3)}
    # check: the FP8 Triton output against the torch impl on the same FP8 pages and selection (ragged)
    chk = decode_inputs(s, 3, 5 * s["Bk"] * max(1, s["topk"] // 2) + 7, dev, dtype, seed=12)
    chk["seq_lens"] = torch.tensor([chk["block_table"].shape[1] * s["Bk"] - 3, s["Bk"] + 1, 40],
                                   dtype=torch.int32, device=dev)
    check = {}
    for layout, dims in layouts.items():
        k8, ks = quantize_fp8(chk["k_cache"], dims=dims)
        v8, vs = quantize_fp8(chk["v_cache"], dims=dims)
        o, sel = msa_decode_paged(**{**chk, "k_cache": k8, "v_cache": v8}, k_scale=ks, v_scale=vs, topk=s["topk"],
                                  impl="triton", return_selected=True)
        o_same = msa_decode_paged_torch(chk["q"].float(), k8, v8, chk["block_table"], chk["seq_lens"], sel,
                                        k_scale=ks, v_scale=vs)
        check[layout] = measure.relative_error(o, o_same)
    print(f"  check decode fp8 K/V (rel err vs torch on the same pages): {check}")
    if max(check.values()) > measure.tolerance_for(dtype):
        raise AssertionError(f"MSA decode fp8 K/V check failed: {check}")
    del chk

    ins = decode_inputs(s, B, L, dev, dtype, seed=1)
    topk, ps, G, D = s["topk"], s["Bk"], s["G"], s["D"]
    maxp = ins["block_table"].shape[1]
    elt = torch.empty(0, dtype=dtype).element_size()
    variants = {"triton_bf16kv": {}}
    for layout, dims in layouts.items():
        k8, ks = quantize_fp8(ins["k_cache"], dims=dims, check_values=False)
        v8, vs = quantize_fp8(ins["v_cache"], dims=dims, check_values=False)
        variants[f"triton_fp8kv_{layout}"] = {"k_cache": k8, "v_cache": v8, "k_scale": ks, "v_scale": vs}
    times, notes = {}, {}
    for name, over in variants.items():
        a = {**ins, **over}
        try:
            times[name] = measure.time_fn(lambda **x: msa_decode_paged(**x, topk=topk, impl="triton", check_values=False),
                                          inputs=a, reps=reps, warmup=3, rotate=False)
            times[name + "_cudagraph"] = measure.time_fn(
                lambda **x: msa_decode_paged_triton(**x, topk=topk)[0], inputs=a, reps=reps, warmup=3, rotate=False,
                cuda_graph=True)
        except Exception as e:  # noqa: BLE001
            notes[name] = f"{type(e).__name__}: {e}"[:200]
        torch.cuda.empty_cache()
    idx_bytes = B * maxp * ps * s["Didx"] * elt
    sel_rows = B * G * topk * ps  # (token, group) rows of the selected pages
    nbytes = {"triton_bf16kv": sel_rows * D * 2 * elt + idx_bytes,
              "triton_fp8kv_token": sel_rows * (D + 4) * 2 + idx_bytes,
              "triton_fp8kv_page": sel_rows * D * 2 + B * G * topk * 4 * 2 + idx_bytes}
    case = f"decode_fp8kv_b{B}_ctx{L}"
    shape = dict(B=B, ctx=L, T=1, page_size=ps, **s)
    recs = []
    for name, t in times.items():
        base = name.replace("_cudagraph", "")
        plain = "triton_bf16kv" + ("_cudagraph" if name.endswith("_cudagraph") else "")
        peers = {plain: times[plain].ms} if base != "triton_bf16kv" and plain in times else None
        extra = {"check_rel_err_vs_torch": check, "kv_dtype": "bfloat16" if base == "triton_bf16kv" else "float8_e4m3fn",
                 "bytes_counted": "selected K/V pages at their width (+ their scales) + index keys of every page",
                 **({"notes": notes} if notes else {})}
        recs.append(measure.make_record(SUITE, case, name, t, shape=shape, dtype=dtype, bytes_moved=nbytes[base],
                                        ceiling="copy", peers=peers, extra=extra))
    print(f"  {case}: " + "  ".join(f"{r['impl']} {r['ms']:.3f} ms" for r in recs) + (f" notes {notes}" if notes else ""))
    del ins, variants
    torch.cuda.empty_cache()
    return recs


# --------------------------------------------------------------------------- backward


def backward_inputs(s: dict, S: int, dev, dtype, seed: int, B: int = 1) -> dict:
    """Prefill inputs with ``q, k, v`` requiring grad, and the output's gradient ``do``."""
    ins = prefill_inputs(s, S, dev, dtype, seed, B)
    g = torch.Generator(device=dev).manual_seed(seed + 1)
    ins["do"] = torch.randn(ins["q"].shape, device=dev, generator=g).to(dtype)
    for n in ("q", "k", "v"):
        ins[n].requires_grad_(True)
    return ins


def _grads(o, q, k, v, do):
    return torch.autograd.grad(o, (q, k, v), do)


def msa_forward_backward(s: dict, **kw):
    """Ours, timed end to end: selection, the Triton forward saving ``lse``, the Triton backward."""
    def fn(q, k, v, q_idx, k_idx, do):
        with torch.enable_grad():
            o = msa_attention(q, k, v, q_idx, k_idx, impl="triton", block_size=s["Bk"], topk=s["topk"], **kw)
            return _grads(o, q, k, v, do)
    return fn


def _dense_backward_peers(s: dict) -> dict:
    """Dense causal attention forward + backward through SDPA: cuDNN (GQA) and FlashAttention-2
    (K/V repeated to Hq heads, as it needs; the repeat's backward sums the heads' gradients)."""
    rep = s["Hq"] // s["G"]

    def sdpa(backend, gqa):
        def fn(q, k, v, q_idx, k_idx, do):
            with torch.enable_grad(), sdpa_kernel(backend):
                kk, vv = k.transpose(1, 2), v.transpose(1, 2)
                if not gqa:
                    kk, vv = kk.repeat_interleave(rep, dim=1), vv.repeat_interleave(rep, dim=1)
                o = F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, is_causal=True, enable_gqa=gqa)
                return _grads(o.transpose(1, 2), q, k, v, do)
        return fn
    return {"sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION, True), "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION, False)}


def check_backward(s: dict, dev, dtype, S: int) -> dict:
    """Ours (Triton forward + backward, ``dtype``) against the torch backward in fp32 over the same
    selection, from the fp32 torch forward: relative error of dq, dk, dv."""
    ins = backward_inputs(s, S, dev, dtype, seed=321)
    kw = dict(block_size=s["Bk"], topk=s["topk"])
    sel = msa_select(ins["q_idx"], ins["k_idx"], impl="triton", **kw)
    got = msa_forward_backward(s, selected=sel)(**ins)
    f32 = {n: ins[n].detach().float() for n in ("q", "k", "v", "do")}
    o, lse = msa_attention(f32["q"], f32["k"], f32["v"], ins["q_idx"], ins["k_idx"], impl="torch", selected=sel,
                           return_lse=True, **kw)
    want = msa_attention_backward_torch(f32["q"], f32["k"], f32["v"], o, lse, f32["do"], sel, block_size=s["Bk"])
    errs = {n: measure.relative_error(a, b) for n, a, b in zip(("dq", "dk", "dv"), got, want)}
    out = {"S": S, "rel_err": errs}
    print(f"  check backward S={S}: rel err vs torch (fp32) {errs}")
    if max(errs.values()) > measure.tolerance_for(dtype):
        raise AssertionError(f"MSA backward check failed: {out}")
    return out


def run_backward(s: dict, S: int, dev, dtype, *, reps: int, check: dict, dense_peers: bool = True,
                 peers_reps: int = 3) -> list[dict]:
    """Case ``backward_s{S}``: forward + backward (``triton_fwd_bwd``, selection included) and the
    backward alone from the saved ``o``, ``lse`` and selection (``triton_bwd``), against dense
    causal forward + backward through SDPA (cuDNN, FlashAttention-2)."""
    kw = dict(block_size=s["Bk"], topk=s["topk"])
    mk = lambda seed: backward_inputs(s, S, dev, dtype, seed)  # noqa: E731
    times, notes = {"triton_fwd_bwd": measure.time_fn(msa_forward_backward(s), mk, reps=reps, warmup=2)}, {}

    def saved(seed):  # what the forward leaves for the backward
        ins = mk(seed)
        with torch.no_grad():
            sel = msa_select(ins["q_idx"], ins["k_idx"], impl="triton", **kw)
            o, lse = msa_attention(**{n: ins[n].detach() for n in ("q", "k", "v", "q_idx", "k_idx")}, impl="triton",
                                   selected=sel, return_lse=True, **kw)
        return {**{n: ins[n].detach() for n in ("q", "k", "v", "do")}, "o": o, "lse": lse, "selected": sel}
    times["triton_bwd"] = measure.time_fn(lambda **a: msa_attention_backward_triton(**a, block_size=s["Bk"]), saved,
                                          reps=reps, warmup=2)
    if dense_peers and dev.type == "cuda":
        for name, fn in _dense_backward_peers(s).items():
            try:
                times[name] = measure.time_fn(fn, mk, reps=peers_reps, warmup=1)
            except Exception as e:  # noqa: BLE001 - a missing peer is a note
                notes[name] = f"{type(e).__name__}: {e}"[:200]
            torch.cuda.empty_cache()
    dense = dense_causal_flops(S, s["Hq"], s["D"])
    flops = {"triton_fwd_bwd": 3.5 * dense, "triton_bwd": 2.5 * dense}  # FlashAttention-2's count: bwd = 2.5 fwd
    pairs = selected_pairs(S, s["Bk"], s["topk"])
    shape = dict(B=1, S=S, **s)
    peer_ms = {n: t.ms for n, t in times.items() if n.startswith("sdpa")}
    extra = {"check": check, **({"peer_notes": notes} if notes else {}), "selected_pairs_per_head": pairs,
             "flops_counted": "dense causal, FlashAttention-2's count (forward 4*Hq*D*S*(S+1)/2, backward 2.5x "
                              "that): ours reads as a dense-equivalent rate",
             "effective_tflops_note": "ours over the selected pairs: scale tflops by selected_pairs_per_head / "
                                      "(S*(S+1)/2)"}
    recs = [measure.make_record(SUITE, f"backward_s{S}", name, t, shape=shape, dtype=dtype,
                                flops=flops.get(name, 3.5 * dense), ceiling="gemm",
                                peers=peer_ms if name == "triton_fwd_bwd" else None, extra=extra)
            for name, t in times.items()]
    print(f"  backward S={S:>7}: " + "  ".join(f"{n} {t.ms:8.2f} ms" for n, t in times.items())
          + (f" notes {notes}" if notes else ""))
    return recs


def run_backward_cpu() -> list[dict]:
    """The backward at the CPU preset (interpreter, fp32): ours (forward + backward through
    ``msa_attention``) checked against float64 autograd through the reference, then timed (not a
    speed figure), beside the torch impl's autograd."""
    dev = runtime.kernel_device()
    s, S, dtype = CPU, 40, torch.float32 if dev.type == "cpu" else runtime.compute_dtype()
    kw = dict(block_size=s["Bk"], topk=s["topk"])
    mk = lambda seed: backward_inputs(s, S, dev, dtype, seed)  # noqa: E731

    def reference(q, k, v, q_idx, k_idx, do):
        sel = msa_select(q_idx.float(), k_idx.float(), impl="reference", **kw)
        return msa_attention_backward_reference(q, k, v, sel, do, block_size=s["Bk"])

    recs = []
    for impl in ("triton", "torch"):
        def fn(q, k, v, q_idx, k_idx, do, impl=impl):
            with torch.enable_grad():
                return _grads(msa_attention(q, k, v, q_idx, k_idx, impl=impl, **kw), q, k, v, do)
        recs.append(checked_cpu_record(fn, reference, mk, case=f"backward_s{S}", impl=f"{impl}_fwd_bwd",
                                       shape=dict(B=1, S=S, **s), dtype=dtype, reps=2))
    return recs


def checked_cpu_record(fn, reference, mk, *, case: str, impl: str, shape: dict, dtype, reps: int,
                       reference_dtype: torch.dtype = torch.float64) -> dict:
    """``fn`` checked against ``reference`` on one fresh input (raises ``AssertionError`` when it
    fails), then timed: its record, carrying the check's error (a CPU run: not a speed figure)."""
    res = measure.check(fn, reference, mk, trials=1, name=impl, reference_dtype=reference_dtype)
    print(res.summary())
    if not res.passed:
        raise AssertionError(res.summary())
    t = measure.time_fn(fn, mk, reps=reps, warmup=1)
    return measure.make_record(SUITE, case, impl, t, shape=shape, dtype=dtype, extra={"check_rel_err": res.max_error})


# --------------------------------------------------------------------------- CPU preset


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


def run(preset: str = "auto", cases=None, *, lengths=None, decode_sizes=None, fp8kv_sizes=None,
        dense: bool = True, partial: str | None = None) -> list[dict]:
    """The case groups ``cases`` (default all of :data:`CASES`) with the options of the module doc;
    returns the records (the CLI writes them)."""
    parts = set(measure.select_cases(cases, CASES))
    lengths = [int(x) for x in (LENGTHS if lengths is None else lengths)]
    decode_sizes = [batch_context(x) if isinstance(x, str) else tuple(x)
                    for x in (DECODE_SIZES if decode_sizes is None else decode_sizes)]
    fp8kv_sizes = [batch_context(x) if isinstance(x, str) else tuple(x)
                   for x in (FP8KV_SIZES if fp8kv_sizes is None else fp8kv_sizes)]

    def save(recs):
        if partial and recs:
            measure.append_records(recs, partial)

    if runtime.resolve_preset(preset) != "gpu":
        recs = (run_cpu() if "prefill" in parts else []) + (run_backward_cpu() if "backward" in parts else [])
        save(recs)
        return recs
    dev, dtype, s = runtime.kernel_device(), runtime.compute_dtype(), GPU
    records: list[dict] = []
    peer = msa_bench_peer.peer_status()
    print(f"  peer {msa_bench_peer.PEER}: {'present' if peer['available'] else 'ABSENT, skipped'} -- {peer['reason']}")
    check = check_prefill(s, dev, dtype, S=4096 + 77)
    dense_128k = None
    if "prefill" in parts:
        for S in lengths:
            try:
                recs = run_prefill(s, S, dev, dtype, reps=10, check=check, with_flex="flex" in parts and S == 65536,
                                   with_query="query" in parts and S <= 65536, peer=peer, dense_peers=dense)
            except Exception as e:  # noqa: BLE001 - keep the other cases' numbers
                print(f"  prefill S={S} FAILED: {type(e).__name__}: {e}")
                continue
            dense_128k = next((r["ms"] for r in recs if r["impl"] == "sdpa_cudnn" and S == 131072), dense_128k)
            records += recs
            save(recs)
            torch.cuda.empty_cache()
    if "1m" in parts:
        if dense_128k is None:  # a run of the 1M case alone: the 128k cuDNN time of the latest recorded run
            prev = [r for r in measure.load_records(suite=SUITE) if r["case"] == "prefill_s131072"
                    and r["impl"] == "sdpa_cudnn"]
            dense_128k = prev[-1]["ms"] if prev else None
        try:
            recs = run_prefill_1m(s, dev, dtype, dense_128k)
            records += recs
            save(recs)
        except Exception as e:  # noqa: BLE001
            print(f"  prefill S=1M FAILED: {type(e).__name__}: {e}")
    if "decode" in parts:
        dcheck = check_decode(s, dev, dtype)
        for B, L in decode_sizes:
            try:
                recs = run_decode(s, B, L, dev, dtype, reps=30, check=dcheck, gather_peer=L <= 65536 and dense,
                                  peer=peer)
            except Exception as e:  # noqa: BLE001
                print(f"  decode B={B} L={L} FAILED: {type(e).__name__}: {e}")
                continue
            records += recs
            save(recs)
    if "backward" in parts:
        bcheck = check_backward(s, dev, dtype, S=4096 + 77)
        for S in lengths:
            try:
                recs = run_backward(s, S, dev, dtype, reps=5, check=bcheck, dense_peers=dense)
            except Exception as e:  # noqa: BLE001 - keep the other cases' numbers
                print(f"  backward S={S} FAILED: {type(e).__name__}: {e}")
                continue
            records += recs
            save(recs)
            torch.cuda.empty_cache()
    if "fp8kv" in parts:
        for B, L in fp8kv_sizes:
            try:
                recs = run_decode_fp8kv(s, B, L, dev, dtype, reps=30)
            except Exception as e:  # noqa: BLE001
                print(f"  decode fp8 K/V B={B} L={L} FAILED: {type(e).__name__}: {e}")
                continue
            records += recs
            save(recs)
    return records
