"""GPU helper for the MSA kernels: a smoke check of every kernel at small sizes, then a small
sweep of the KV-outer prefill and decode launch configs.

    python tools/tune_msa.py smoke        # compile + check each kernel against the torch impl
    python tools/tune_msa.py tune [S]     # staged sweep of the KV-outer configs at S (default 131072), then profile
    python tools/tune_msa.py profile [S]  # where the KV-outer prefill's time goes
    python tools/tune_msa.py select [S]   # launch configs of the block-score + top-k kernel
    python tools/tune_msa.py ties         # Triton vs fp32 torch selection ids (fp32 and bf16 index inputs)

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


def _time_sparse(ins, sel, cfg, kw, reps=5):
    from minimax_lab.attention.msa_triton_prefill import msa_attention_triton

    fn = lambda **a: msa_attention_triton(**a, selected=sel, schedule="kv", cfg=cfg, **kw)  # noqa: E731
    return fn, bench.time_fn(fn, inputs=ins, reps=reps, warmup=1, rotate=False).ms


def tune(S: int = 131072) -> None:
    """Staged sweep of the KV-outer prefill at S: L2 sub-chunk size, then the kernel's launch
    config, then the combine's warps; each stage keeps the previous stage's winner."""
    from minimax_lab.attention.msa_triton_prefill import config

    dev, dtype, s = runtime.kernel_device(), runtime.compute_dtype(), mb.GPU
    kw = dict(block_size=s["Bk"], topk=s["topk"])
    ins = mb.prefill_inputs(s, S, dev, dtype, seed=0)
    sel = msa_select(ins["q_idx"], ins["k_idx"], impl="triton", **kw)
    want = msa_attention(**ins, impl="triton", selected=sel, schedule="query", **kw)
    flops = 4.0 * s["Hq"] * s["D"] * mb.selected_pairs(S, s["Bk"], s["topk"])
    best = config()

    def trial(stage, change):
        c = {**best, **change}
        try:
            fn, ms = _time_sparse(ins, sel, c, kw)
            err = bench.relative_error(fn(**ins), want)
        except Exception as e:  # noqa: BLE001 - a config that does not compile is reported, skipped
            print(f"[tune] {stage} {change}: FAILED {type(e).__name__}: {str(e)[:160]}", flush=True)
            return None
        ok = err < bench.tolerance_for(dtype)
        print(f"[tune] S={S} {stage} {change}: {ms:8.3f} ms  {flops / ms / 1e9:6.0f} eff TFLOP/s  err {err:.1e}"
              f"{'' if ok else '  WRONG'}", flush=True)
        return ms if ok else None

    stages = {
        "l2": [dict(L2_TOKENS=n) for n in (0, 8192)],
        "kernel": [dict(BLOCK_M=bm, TOKENS_PER_PROG=tp, num_warps=w, num_stages=st)
                   for bm, tp, w, st in [(64, 128, 4, 2), (64, 256, 4, 2), (64, 64, 4, 2), (64, 128, 4, 1),
                                         (64, 128, 8, 2), (32, 128, 4, 2), (32, 128, 2, 2), (32, 64, 4, 3),
                                         (128, 256, 8, 2)]],
        "combine": [dict(COMBINE_WARPS=w) for w in (4, 8, 16)],
    }
    for stage, changes in stages.items():
        timed = [(trial(stage, ch), ch) for ch in changes]
        timed = [(ms, ch) for ms, ch in timed if ms is not None]
        if timed:
            ms, ch = min(timed, key=lambda x: x[0])
            best = {**best, **ch}
            print(f"[tune] S={S} {stage} best {ch}: {ms:.3f} ms", flush=True)
    print(f"[tune] S={S} chosen config: {best}", flush=True)
    t = bench.time_fn(lambda **a: msa_attention(**a, impl="triton", schedule="query", selected=sel,
                                                check_selected=False, **kw),
                      inputs=ins, reps=3, warmup=1, rotate=False)
    print(f"[tune] S={S} query-outer: {t.ms:8.3f} ms  {flops / t.ms / 1e9:6.0f} eff TFLOP/s", flush=True)
    del ins, sel, want
    torch.cuda.empty_cache()
    profile(S, best)


def tune_select(S: int = 131072) -> None:
    """Launch configs of the fused block-score + top-k kernel at S; each must select exactly
    what the default config selects."""
    from minimax_lab.attention.msa_triton_select import GPU_CONFIG, msa_select_triton

    dev, dtype, s = runtime.kernel_device(), runtime.compute_dtype(), mb.GPU
    kw = dict(block_size=s["Bk"], topk=s["topk"])
    ins = mb.prefill_inputs(s, S, dev, dtype, seed=0)
    qi, ki = ins["q_idx"], ins["k_idx"]
    want = msa_select_triton(qi, ki, **kw)
    flops = 2.0 * s["G"] * s["Didx"] * S * S / 2
    for bm, w, st in [(128, 8, 3), (128, 8, 2), (128, 8, 4), (128, 4, 3), (64, 4, 3), (64, 4, 4),
                      (256, 8, 3), (256, 8, 2)]:
        c = dict(BLOCK_M=bm, num_warps=w, num_stages=st)
        try:
            fn = lambda q_idx, k_idx: msa_select_triton(q_idx, k_idx, cfg=c, **kw)  # noqa: E731
            same = bool((fn(qi, ki) == want).all())
            t = bench.time_fn(fn, inputs={"q_idx": qi, "k_idx": ki}, reps=5, warmup=1, rotate=False)
            print(f"[select] S={S} {c}: {t.ms:8.3f} ms {flops / t.ms / 1e9:6.0f} TFLOP/s same={same}"
                  f"{' (default)' if c == GPU_CONFIG else ''}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"[select] {c}: FAILED {type(e).__name__}: {str(e)[:160]}", flush=True)


def ties() -> None:
    """Triton vs fp32 torch selection where the kernelbench harness saw 0.1% of ids differ:
    fp32 index inputs (B=2, S=4096, G=4, D_idx=128, Bk=16, topk=4), and bf16 at the MSA shape."""
    dev = runtime.kernel_device()
    g = torch.Generator(device=dev).manual_seed(0)
    for dtype, bs, k in ((torch.float32, 16, 4), (torch.bfloat16, 16, 4), (torch.bfloat16, 128, 16)):
        qi = torch.randn(2, 4096, 4, 128, device=dev, generator=g).to(dtype)
        ki = torch.randn(2, 4096, 128, device=dev, generator=g).to(dtype)
        a = msa_select(qi, ki, block_size=bs, topk=k, impl="triton")
        b = msa_select(qi.float(), ki.float(), block_size=bs, topk=k, impl="torch")
        diff = int((a != b).sum())
        print(f"[ties] {dtype} Bk={bs} topk={k}: ids differing {diff} of {a.numel()}", flush=True)


def profile(S: int = 131072, cfg: dict | None = None) -> None:
    """Where the KV-outer prefill's time goes: inverted index, KV-outer kernel, combine (CUDA events)."""
    import math

    from minimax_lab.attention import msa_triton_prefill as pf

    dev, dtype, s = runtime.kernel_device(), runtime.compute_dtype(), mb.GPU
    kw = dict(block_size=s["Bk"], topk=s["topk"])
    ins = mb.prefill_inputs(s, S, dev, dtype, seed=0)
    sel = msa_select(ins["q_idx"], ins["k_idx"], impl="triton", **kw)
    for budget in (16 * 2**30,):
        t = bench.time_fn(lambda **a: pf.msa_attention_triton(**a, selected=sel, partial_budget_bytes=budget,
                                                              cfg=cfg, **kw),
                          inputs=ins, reps=5, warmup=1, rotate=False)
        print(f"[profile] S={S} budget {budget >> 30} GiB: sparse part {t.ms:.2f} ms")
    q, k, v = ins["q"], ins["k"], ins["v"]
    B, _, Hq, D = q.shape
    G, topk, hpg = s["G"], s["topk"], Hq // s["G"]
    cfg = {**pf.config(), **(cfg or {})}
    nb = math.ceil(S / s["Bk"])
    bt = cfg["BLOCK_M"] // 16
    tpp = cfg["TOKENS_PER_PROG"]
    chunk = 65536
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    acc = {"index": 0.0, "fill": 0.0, "kv": 0.0, "combine": 0.0}
    o = torch.empty_like(q)
    po = torch.empty(chunk * G * topk * hpg * D, dtype=dtype, device=dev)
    plse = torch.empty(chunk * G * topk * hpg, dtype=torch.float32, device=dev)
    for c0 in range(0, S, chunk):
        Sc = min(S, c0 + chunk) - c0
        e = [ev() for _ in range(5)]
        e[0].record()
        ent, tg, ts, tl_ = pf.inverted_index(sel[:, c0:c0 + Sc], nb, tpp, cfg["L2_TOKENS"])
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
        pf.combine_partials(po_c, plse_c, o, None, Sc=Sc, t0=c0, G=G, hpg=hpg, num_warps=cfg["COMBINE_WARPS"])
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
    elif mode == "ties":
        ties()
    elif mode == "select":
        tune_select(int(sys.argv[2]) if len(sys.argv) > 2 else 131072)
    else:
        tune(int(sys.argv[2]) if len(sys.argv) > 2 else 131072)
