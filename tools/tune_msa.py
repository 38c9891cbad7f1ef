"""GPU helper for the MSA kernels: a smoke check of every kernel at small sizes, then a small
sweep of the KV-outer prefill and decode launch configs.

    python tools/tune_msa.py smoke        # compile + check each kernel against the torch impl
    python tools/tune_msa.py tune [S]     # time KV-outer configs at S (default 32768)

Prints a table; writes nothing (the bench suite ``msa`` records the numbers that count).
"""
from __future__ import annotations

import sys
import traceback

import torch

from minimax_lab import bench, runtime
from minimax_lab.attention import msa_bench as mb
from minimax_lab.attention.msa import msa_attention, msa_decode_paged, msa_select


def smoke() -> bool:
    dev, dtype = runtime.kernel_device(), runtime.compute_dtype()
    s = mb.GPU
    ok = True
    steps = {
        "prefill check": lambda: mb.check_prefill(s, dev, dtype, S=3000),
        "prefill check S<topk*Bk": lambda: mb.check_prefill(s, dev, dtype, S=1500),
        "decode check": lambda: mb.check_decode(s, dev, dtype),
    }
    for name, fn in steps.items():
        try:
            fn()
            print(f"[smoke] {name}: ok")
        except Exception:  # noqa: BLE001
            ok = False
            print(f"[smoke] {name}: FAILED")
            traceback.print_exc()
    return ok


def tune(S: int = 32768) -> None:
    from minimax_lab.attention.msa_triton_prefill import msa_attention_triton

    dev, dtype, s = runtime.kernel_device(), runtime.compute_dtype(), mb.GPU
    kw = dict(block_size=s["Bk"], topk=s["topk"])
    ins = mb.prefill_inputs(s, S, dev, dtype, seed=0)
    sel = msa_select(ins["q_idx"], ins["k_idx"], impl="triton", **kw)
    want = msa_attention(**ins, impl="triton", selected=sel, **kw)
    pairs = mb.selected_pairs(S, s["Bk"], s["topk"])
    flops = 4.0 * s["Hq"] * s["D"] * pairs
    cands = [dict(BLOCK_M=bm, TOKENS_PER_PROG=tp, num_warps=w, num_stages=st)
             for bm, tp, w, st in [(128, 32, 8, 2), (128, 64, 8, 2), (128, 128, 8, 2), (64, 32, 4, 2),
                                   (64, 64, 4, 3), (128, 32, 4, 2), (128, 64, 8, 3), (256, 64, 8, 2)]]
    for c in cands:
        try:
            fn = lambda **a: msa_attention_triton(**a, selected=sel, schedule="kv", cfg=c, **kw)  # noqa: E731
            err = bench.relative_error(fn(**ins), want)
            t = bench.time_fn(fn, inputs=ins, reps=10, warmup=2, rotate=False)
            print(f"[tune] S={S} {c}: {t.ms:8.3f} ms  {flops / t.ms / 1e9:6.0f} eff TFLOP/s  err {err:.1e}")
        except Exception as e:  # noqa: BLE001
            print(f"[tune] {c}: FAILED {type(e).__name__}: {str(e)[:200]}")
    t = bench.time_fn(lambda **a: msa_attention(**a, impl="triton", schedule="query", selected=sel, **kw),
                      inputs=ins, reps=5, warmup=1, rotate=False)
    print(f"[tune] S={S} query-outer: {t.ms:8.3f} ms  {flops / t.ms / 1e9:6.0f} eff TFLOP/s")
    del ins
    for B, L in ((32, 131072),):
        ins = mb.decode_inputs(s, B, L, dev, dtype, seed=0)
        t = bench.time_fn(lambda **a: msa_decode_paged(**a, topk=s["topk"], impl="triton"), inputs=ins,
                          reps=20, warmup=3, rotate=False)
        print(f"[tune] decode B={B} L={L}: {t.ms:.3f} ms")


def profile(S: int = 131072) -> None:
    """Where the KV-outer prefill's time goes: inverted index, KV-outer kernel, combine (CUDA events)."""
    import math

    from minimax_lab.attention import msa_triton_prefill as pf

    dev, dtype, s = runtime.kernel_device(), runtime.compute_dtype(), mb.GPU
    kw = dict(block_size=s["Bk"], topk=s["topk"])
    ins = mb.prefill_inputs(s, S, dev, dtype, seed=0)
    sel = msa_select(ins["q_idx"], ins["k_idx"], impl="triton", **kw)
    for budget in (4 * 2**30, 16 * 2**30):
        t = bench.time_fn(lambda **a: pf.msa_attention_triton(**a, selected=sel, partial_budget_bytes=budget, **kw),
                          inputs=ins, reps=5, warmup=1, rotate=False)
        print(f"[profile] S={S} budget {budget >> 30} GiB: sparse part {t.ms:.2f} ms")
    q, k, v = ins["q"], ins["k"], ins["v"]
    B, _, Hq, D = q.shape
    G, topk, hpg = s["G"], s["topk"], Hq // s["G"]
    cfg = pf.config()
    nb = math.ceil(S / s["Bk"])
    bt = cfg["BLOCK_M"] // 16
    tpp = cfg["TOKENS_PER_PROG"]
    chunk = 16384
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    acc = {"index": 0.0, "fill": 0.0, "kv": 0.0, "combine": 0.0}
    o = torch.empty_like(q)
    po = torch.empty(chunk * G * topk * hpg * D, dtype=dtype, device=dev)
    plse = torch.empty(chunk * G * topk * hpg, dtype=torch.float32, device=dev)
    for c0 in range(0, S, chunk):
        Sc = min(S, c0 + chunk) - c0
        e = [ev() for _ in range(5)]
        e[0].record()
        ent, tg, ts, tl_ = pf.inverted_index(sel[:, c0:c0 + Sc], nb, tpp)
        e[1].record()
        plse_c = plse[: Sc * G * topk * hpg].view(Sc * G, topk, hpg)
        po_c = po[: Sc * G * topk * hpg * D].view(Sc * G, topk, hpg, D)
        plse_c.fill_(float("-inf"))
        e[2].record()
        pf._kv_outer_kernel[(tg.numel(),)](
            q, k, v, ent, tg, ts, tl_, po_c, plse_c, *pf._strides(q, k, v), S, Sc, c0, nb, 0.1,
            G=G, TOPK=topk, HPG=hpg, HPG_P=16, BT=bt, HEAD_DIM=D, BLOCK_D=128, BLOCK_N=s["Bk"],
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
        e[3].record()
        pf.combine_partials(po_c, plse_c, o, None, Sc=Sc, t0=c0, G=G, hpg=hpg)
        e[4].record()
        torch.cuda.synchronize()
        for i, name in enumerate(acc):
            acc[name] += e[i].elapsed_time(e[i + 1])
    print(f"[profile] S={S} per stage (ms, summed over chunks of {chunk}): "
          + ", ".join(f"{n} {v:.2f}" for n, v in acc.items()))


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "smoke"
    if mode == "smoke":
        sys.exit(0 if smoke() else 1)
    elif mode == "profile":
        profile(int(sys.argv[2]) if len(sys.argv) > 2 else 131072)
    else:
        tune(int(sys.argv[2]) if len(sys.argv) > 2 else 32768)
