"""Bench suite ``msa``, case group ``fp8kv``: paged sparse decode on a bf16 K/V cache and on FP8
(e4m3) K/V caches with per-token and per-page scales, eager and under CUDA graphs, checked first
against the torch impl on the same FP8 pages.
"""
from __future__ import annotations

import torch

from minimax_lab import measure
from minimax_lab.attention.msa import msa_decode_paged
from minimax_lab.attention.msa_torch import msa_decode_paged_torch
from minimax_lab.attention.msa_triton_decode import msa_decode_paged_triton
from minimax_lab.bench.suite_msa_inputs import SUITE, decode_inputs
from minimax_lab.fp8 import quantize_fp8


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
