"""Bench suite ``msa``, case group ``decode``: paged sparse decode end to end and in parts (index
pass, attention over the selected pages), beside a dense paged decode of the same kernel, gather +
SDPA and SGLang's kernels where fetched, eager and under CUDA graphs; the index pass's launch
configs timed as tuning data.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from minimax_lab import measure
from minimax_lab.attention.msa import msa_decode_paged
from minimax_lab.attention.msa_compare import selection_overlap
from minimax_lab.attention.msa_index_fp8 import quantize_index_keys
from minimax_lab.attention.msa_torch import msa_decode_paged_torch
from minimax_lab.attention.msa_triton_decode import (decode_attention_pages, msa_decode_paged_triton,
                                                     msa_decode_select_triton, paged_index_scores_triton)
from minimax_lab.bench import suite_msa_peer as msa_bench_peer
from minimax_lab.bench.suite_msa_inputs import SUITE, _agree, decode_inputs


#: (pages per program, warps, stages) of the index pass timed as tuning data in the decode cases
INDEX_SWEEP = [(8, 4, 3), (16, 4, 3), (8, 8, 3), (16, 8, 4), (4, 4, 4), (8, 4, 5), (32, 8, 3)]


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
