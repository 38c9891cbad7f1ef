"""Bench suite ``msa``, case group ``backward``: training's attention step -- selection, the Triton
forward saving ``lse`` and the Triton backward, end to end and the backward alone -- against dense
causal forward + backward through SDPA (cuDNN, FlashAttention-2); at the CPU preset, checked
against float64 autograd through the reference.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from minimax_lab import measure, runtime
from minimax_lab.attention.msa import msa_attention, msa_select
from minimax_lab.attention.msa_backward_reference import msa_attention_backward_reference
from minimax_lab.attention.msa_backward_torch import msa_attention_backward_torch
from minimax_lab.attention.msa_backward_triton import msa_attention_backward_triton
from minimax_lab.bench.suite_msa_inputs import (CPU, SUITE, backward_inputs, checked_cpu_record, dense_causal_flops,
                                                selected_pairs)


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
