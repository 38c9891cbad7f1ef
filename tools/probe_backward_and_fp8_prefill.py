"""Profiling probe for two slow GPU paths, in one command: MSA's backward and FP8 paged prefill.

    python tools/probe_backward_and_fp8_prefill.py --out DIR [--budget-s 420] [--parts bwd prefill]
    python tools/probe_backward_and_fp8_prefill.py --out DIR --cpu-smoke   # the prefill part, toy sizes

* **bwd** -- MSA's Triton backward at ``MSA_SHAPE``: each launch config of a grid checked against the
  torch backward in fp32 (S = 4,096 + 77), then timed at S = 32,768 (backward alone from the saved
  forward); the compiled kernels' registers and spills; the fastest config and the default then
  timed at 16k / 64k / 128k (forward + backward), with a per-kernel breakdown (torch.profiler),
  beside dense causal forward + backward through SDPA (cuDNN, FlashAttention-2).
* **prefill** -- paged prefill at B=2, 2,048 new tokens over an 8k prefix, 32/8 heads, page 16, and
  at the engine's prefill (one sequence, 64/4 heads, 16k-token chunks: the first and the second
  of a prompt): bf16 and each FP8 tile step (per-token scales; ``TILE_STEP`` ``fp16``,
  ``q_dtype``, ``dequantize``) over a small grid of launch configs (:data:`PREFILL_GRID`), each
  config checked on a small ragged batch against the fp32 reference over the stored values
  first; the compiled kernels' registers and spills; per shape the best of each variant and
  FP8's speed against bf16's best. ``--budget-s`` stops adding configs past that many seconds.

Every result is a JSON line in ``DIR/probe.jsonl`` as soon as it exists; a table is printed last.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from minimax_lab import measure  # noqa: E402  (before triton: minimax_lab picks the interpreter)
from minimax_lab.attention import msa_attention, msa_select  # noqa: E402
from minimax_lab.attention import msa_backward_triton as bwd_mod  # noqa: E402
from minimax_lab.attention.msa import MSA_SHAPE  # noqa: E402
from minimax_lab.attention.msa_backward_torch import msa_attention_backward_torch  # noqa: E402
from minimax_lab.bench import suite_kvcache as kv  # noqa: E402
from minimax_lab.bench import suite_msa_backward, suite_msa_inputs  # noqa: E402
from minimax_lab.paged_kv import prefill_triton  # noqa: E402
from minimax_lab.paged_kv.layout import paged_triton_operands  # noqa: E402
from minimax_lab.paged_kv.prefill import paged_prefill  # noqa: E402
from minimax_lab.paged_kv.prefill_reference import paged_prefill_reference  # noqa: E402

import triton  # noqa: E402

T0 = time.time()
ROWS: list[tuple] = []


def write(out: Path, rec: dict) -> None:
    rec["t"] = round(time.time() - T0, 1)
    with open(out / "probe.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")


def med(fn, rep_ms=300, warm_ms=60) -> float:
    return triton.testing.do_bench(fn, warmup=warm_ms, rep=rep_ms, return_mode="median")


def compiled_stats(jit_fn) -> list[dict]:
    """Registers and spills of every compiled variant of a jit function (best effort)."""
    out = []
    try:
        for cache in jit_fn.device_caches.values():
            kernels = cache[0] if isinstance(cache, tuple) else cache
            for k in kernels.values():
                try:
                    k._init_handles()
                except Exception:  # noqa: BLE001
                    pass
                out.append(dict(n_regs=getattr(k, "n_regs", None), n_spills=getattr(k, "n_spills", None),
                                shared=getattr(getattr(k, "metadata", None), "shared", None),
                                num_warps=getattr(getattr(k, "metadata", None), "num_warps", None)))
    except Exception as e:  # noqa: BLE001
        out.append(dict(error=str(e)[:200]))
    return out


def kernel_breakdown(fn, steps=3) -> dict:
    """CUDA kernel time per kernel name (ms per call), from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t:
            totals[e.key[:60]] = totals.get(e.key[:60], 0.0) + t / 1000 / steps
    return dict(sorted(totals.items(), key=lambda kv_: -kv_[1])[:12])


# --------------------------------------------------------------------------- MSA backward


def saved_forward(s, S, dev, dtype, seed):
    ins = suite_msa_inputs.backward_inputs(s, S, dev, dtype, seed)
    kw = dict(block_size=s["Bk"], topk=s["topk"])
    with torch.no_grad():
        sel = msa_select(ins["q_idx"], ins["k_idx"], impl="triton", **kw)
        o, lse = msa_attention(*(ins[n].detach() for n in ("q", "k", "v", "q_idx", "k_idx")), impl="triton",
                               selected=sel, return_lse=True, **kw)
    return dict(q=ins["q"].detach(), k=ins["k"].detach(), v=ins["v"].detach(), o=o, lse=lse,
                do=ins["do"], selected=sel), ins


def bwd_grid():
    dkdv = [dict(BLOCK_M=m, BLOCK_KN=kn, num_warps=w, num_stages=st)
            for m, kn, w, st in [(32, 0, 4, 1), (32, 0, 8, 1), (32, 64, 4, 1), (32, 64, 4, 2), (32, 64, 8, 2),
                                 (64, 64, 8, 1), (64, 64, 8, 2), (64, 0, 8, 1), (16, 64, 4, 2), (32, 32, 4, 2),
                                 (64, 32, 4, 2), (128, 64, 8, 2)]]
    dq = [dict(Q_WARPS=w, Q_STAGES=st) for w, st in [(4, 1), (4, 2), (4, 3), (2, 2), (8, 2)]]
    return dkdv, dq


def run_bwd(out: Path, budget_s: float) -> None:
    dev, dtype, s = torch.device("cuda"), torch.bfloat16, MSA_SHAPE
    S_check, S_sweep = 4096 + 77, 32768
    check_in, check_raw = saved_forward(s, S_check, dev, dtype, 11)
    f32 = {n: check_in[n].float() for n in ("q", "k", "v", "do")}
    with torch.no_grad():
        o32, lse32 = msa_attention(f32["q"], f32["k"], f32["v"], check_raw["q_idx"], check_raw["k_idx"], impl="torch",
                                   selected=check_in["selected"], return_lse=True, block_size=s["Bk"], topk=s["topk"])
    want = msa_attention_backward_torch(f32["q"], f32["k"], f32["v"], o32, lse32, f32["do"], check_in["selected"],
                                        block_size=s["Bk"])
    sweep_in, _ = saved_forward(s, S_sweep, dev, dtype, 12)
    base = dict(bwd_mod.GPU_CONFIG)
    dkdv, dq = bwd_grid()
    results = []
    for part, grid in (("dkdv", dkdv), ("dq", dq)):
        best_so_far = min(results, key=lambda r: r["ms"])["cfg"] if results else base
        for c in grid:
            if time.time() - T0 > budget_s * 0.35:
                print("bwd sweep: budget", flush=True)
                break
            cfg = {**base, **(best_so_far if part == "dq" else {}), **c}
            try:
                got = bwd_mod.msa_attention_backward_triton(**check_in, block_size=s["Bk"], config=cfg)
                errs = {n: measure.relative_error(a, b) for n, a, b in zip(("dq", "dk", "dv"), got, want)}
                ms = med(lambda: bwd_mod.msa_attention_backward_triton(**sweep_in, block_size=s["Bk"], config=cfg))
                rec = dict(part="bwd_sweep", S=S_sweep, cfg=cfg, ms=ms, err=errs)
            except Exception as e:  # noqa: BLE001
                rec = dict(part="bwd_sweep", S=S_sweep, cfg=cfg, error=f"{type(e).__name__}: {str(e)[:300]}")
            write(out, rec)
            print(json.dumps(rec), flush=True)
            if "ms" in rec and max(rec["err"].values()) < 2e-2:
                results.append(rec)
    write(out, dict(part="bwd_kernels", dq=compiled_stats(bwd_mod._dq_kernel),
                    dkdv=compiled_stats(bwd_mod._dkdv_kernel)))
    best = min(results, key=lambda r: r["ms"])["cfg"] if results else base
    ROWS.append(("bwd", f"S={S_sweep} default", next((r["ms"] for r in results if r["cfg"] == base), float("nan"))))
    ROWS.append(("bwd", f"S={S_sweep} best {best}", min((r["ms"] for r in results), default=float("nan"))))
    sweep_in = check_in = None  # free the sweep's inputs before the long runs
    torch.cuda.empty_cache()
    for S in (16384, 65536, 131072):
        if time.time() - T0 > budget_s * 0.6:
            break
        saved, ins = saved_forward(s, S, dev, dtype, 13)
        rec = dict(part="bwd_len", S=S)
        for name, cfg in (("default", base), ("best", best)):
            rec[f"bwd_{name}_ms"] = med(lambda: bwd_mod.msa_attention_backward_triton(
                **saved, block_size=s["Bk"], config=cfg), rep_ms=400)
        rec["breakdown_best"] = kernel_breakdown(lambda: bwd_mod.msa_attention_backward_triton(
            **saved, block_size=s["Bk"], config=best))
        fwd_bwd = suite_msa_backward.msa_forward_backward(s)
        args = {n: ins[n] for n in ("q", "k", "v", "q_idx", "k_idx", "do")}
        rec["fwd_bwd_default_ms"] = med(lambda: fwd_bwd(**args), rep_ms=500)
        rec["fwd_breakdown"] = kernel_breakdown(lambda: fwd_bwd(**args), steps=2)
        for name, fn in suite_msa_backward._dense_backward_peers(s).items():
            try:
                rec[f"{name}_ms"] = med(lambda: fn(**args), rep_ms=300 if S < 131072 else 1, warm_ms=1 if S > 65536 else 50)
            except Exception as e:  # noqa: BLE001
                rec[f"{name}_error"] = str(e)[:200]
            torch.cuda.empty_cache()
        write(out, rec)
        print(json.dumps(rec), flush=True)
        dense = min(v for k, v in rec.items() if k.startswith("sdpa") and k.endswith("_ms"))
        ROWS.append(("fwd+bwd", f"S={S}", f"ours {rec['fwd_bwd_default_ms']:.1f} ms (bwd default "
                     f"{rec['bwd_default_ms']:.1f}, best {rec['bwd_best_ms']:.1f}); dense best {dense:.1f} ms"))
        saved = ins = args = None  # free this length's inputs before the next
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- FP8 prefill

#: the shapes timed: the issue's (B=2, 2,048 new tokens over an 8k prefix, 32/8 heads) and the
#: engine's dense-layer prefill (one sequence per call, 64/4 heads, 16k-token chunks: the first
#: chunk of a prompt and the next one over it)
PREFILL_SHAPES = {
    "B2_prefix8k_S2k_32x8": dict(B=2, prefix=8192, S=2048, Hq=32, Hkv=8, D=128, page=16),
    "engine_first_chunk_S16k_64x4": dict(B=1, prefix=0, S=16384, Hq=64, Hkv=4, D=128, page=16),
    "engine_second_chunk_prefix16k_S16k_64x4": dict(B=1, prefix=16384, S=16384, Hq=64, Hkv=4, D=128, page=16),
}
SMOKE_SHAPES = {
    "smoke_B2_prefix20_S16_4x2": dict(B=2, prefix=20, S=16, Hq=4, Hkv=2, D=16, page=16),
    "smoke_engine_B1_prefix0_S32_8x1": dict(B=1, prefix=0, S=32, Hq=8, Hkv=1, D=16, page=16),
}


def _cfgs(rows) -> list[dict]:
    return [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=st) for m, n, w, st in rows]


#: what each variant tries (kept small: every config compiles once per GQA group size). bf16: the
#: 1.34 ms winner and the shipped H200 config of the earlier H100 sweep, and two between; the FP8
#: steps: that sweep's FP8 winner (16/128/4/2) and tiles that compile without spills on the CPU
#: check of registers (q_dtype at 32/128/8/3 spills 176 bytes, fp16 there 804)
PREFILL_GRID = {
    "bf16": _cfgs([(64, 128, 8, 3), (32, 128, 8, 3), (64, 64, 8, 3), (16, 64, 4, 3)]),
    "fp8_fp16": _cfgs([(16, 128, 4, 2), (16, 64, 4, 3), (32, 128, 8, 3)]),
    "fp8_q_dtype": _cfgs([(16, 128, 4, 2), (16, 64, 4, 3), (32, 128, 8, 3), (64, 64, 8, 3)]),
    "fp8_dequantize": _cfgs([(64, 128, 8, 3), (32, 128, 8, 3), (16, 64, 4, 3)]),
}
SMOKE_GRID = {name: _cfgs([(16, 16, 1, 1)]) for name in PREFILL_GRID}
#: an FP8 variant's TILE_STEP (prefill_triton.TILE_STEPS)
STEP = {"fp8_fp16": "fp16", "fp8_q_dtype": "q_dtype", "fp8_dequantize": "dequantize"}


def prefill_inputs(c: dict, lengths, q_lens, dev, dtype, seed: int) -> dict:
    """Paged prefill inputs, bf16 and FP8 (per-token scales, as the engine writes them): queries
    ``[B, S, Hq, D]``, ``lengths`` cached tokens per sequence (its new ones included), ``q_lens``
    new ones. The pool and the table's width are multiples of 16 pages, so the checked and the
    timed inputs compile to the same kernels (Triton specialises integers divisible by 16)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    pages = sum(-(-n // c["page"]) for n in lengths)
    pool = -(-(pages + 3) // 16) * 16
    width = -(-max(-(-n // c["page"]) for n in lengths) // 16) * 16
    table = torch.full((len(lengths), width), -1, dtype=torch.int32)
    narrow = kv.random_block_table(lengths, c["page"], pool, "cpu", g)
    table[:, :narrow.shape[1]] = narrow
    shape = (pool, c["page"], c["Hkv"], c["D"])
    k = torch.randn(shape, generator=g).to(dev, dtype)
    v = torch.randn(shape, generator=g).to(dev, dtype)
    ins = dict(q=torch.randn(len(lengths), c["S"], c["Hq"], c["D"], generator=g).to(dev, dtype), k_cache=k,
               v_cache=v, block_table=table.to(dev), seq_lens=torch.tensor(lengths, dtype=torch.int32, device=dev),
               q_lens=torch.tensor(q_lens, dtype=torch.int32, device=dev))
    k8, ks = kv.quantize_cache(k, "token")
    v8, vs = kv.quantize_cache(v, "token")
    return dict(bf16=ins, fp8={**ins, "k_cache": k8, "v_cache": v8, "k_scale": ks, "v_scale": vs})


def check_inputs(c: dict, dev, dtype) -> dict:
    """A small ragged batch of ``c``'s heads and page size: three sequences, 256, 1 and 177 new
    tokens over prefixes of 700, 299 and 1,000 (toy sizes: a few tokens), with the timed shapes'
    divisibility by 16."""
    if c["S"] > 32:
        return prefill_inputs({**c, "S": 256}, [956, 300, 1177], [256, 1, 177], dev, dtype, 5)
    return prefill_inputs(c, [c["S"] + 20, 5, 16], [c["S"], 1, 7], dev, dtype, 5)


def fp32_reference(ins: dict) -> torch.Tensor:
    """The fp32 reference on the stored values (an FP8 cache dequantized: exact in fp32)."""
    k, v = ins["k_cache"].float(), ins["v_cache"].float()
    if "k_scale" in ins:
        k, v = k * ins["k_scale"][..., None], v * ins["v_scale"][..., None]
    return paged_prefill_reference(ins["q"].float(), k, v, ins["block_table"], ins["seq_lens"], q_lens=ins["q_lens"])


def _timer(smoke: bool):
    if not smoke:
        return lambda fn: med(fn, rep_ms=100, warm_ms=25)

    def once(fn) -> float:  # the interpreter: one call, to see the path runs (no speed)
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return once


def run_prefill(out: Path, budget_s: float, smoke: bool = False) -> None:
    """Every variant of PREFILL_GRID at every shape of PREFILL_SHAPES: each config checked on a small
    ragged batch against the fp32 reference on the stored values first, then timed; a table last."""
    dev = torch.device("cuda") if not smoke else torch.device("cpu")
    dtype = torch.bfloat16
    shapes, grid = (SMOKE_SHAPES, SMOKE_GRID) if smoke else (PREFILL_SHAPES, PREFILL_GRID)
    timer = _timer(smoke)
    for shape_name, c in shapes.items():
        if time.time() - T0 > budget_s:
            print(f"prefill: budget reached before {shape_name}", flush=True)
            break
        flops = kv.prefill_flops(c)
        chk = check_inputs(c, dev, dtype)
        want = {"fp8": fp32_reference(chk["fp8"]), "bf16": fp32_reference(chk["bf16"])}
        timed = prefill_inputs(c, [c["prefix"] + c["S"]] * c["B"], [c["S"]] * c["B"], dev, dtype, 0)
        best: dict[str, tuple[float, dict]] = {}
        for variant, cfgs in grid.items():
            for cfg in cfgs:
                if time.time() - T0 > budget_s:
                    break
                fp8 = variant.startswith("fp8")
                config = {**cfg, "TILE_STEP": STEP[variant]} if fp8 else cfg
                rec = dict(part="prefill", shape=shape_name, case=c, variant=variant, cfg=config,
                           tile_rows=_tile_rows(c, cfg))
                try:
                    got = paged_prefill(**chk["fp8" if fp8 else "bf16"], impl="triton", config=config)
                    rec["check_err"] = measure.relative_error(got.float(), want["fp8" if fp8 else "bf16"])
                    if not rec["check_err"] < 1e-2:
                        raise AssertionError(f"check failed: relative error {rec['check_err']:.3g} >= 1e-2")
                    ins = timed["fp8" if fp8 else "bf16"]
                    rec["ms"] = timer(lambda: paged_prefill(**ins, impl="triton", check_values=False, config=config))
                    rec["tflops"] = flops / rec["ms"] / 1e9
                    if variant == "fp8_dequantize":  # its first pass alone
                        rec["dequantize_ms"] = timer(lambda: _dequantize_only(ins))
                except Exception as e:  # noqa: BLE001
                    rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                write(out, rec)
                print(json.dumps({k: v for k, v in rec.items() if k != "case"}), flush=True)
                if "ms" in rec and (variant not in best or rec["ms"] < best[variant][0]):
                    best[variant] = (rec["ms"], config)
        if not smoke:
            write(out, dict(part="prefill_kernels", shape=shape_name,
                            bf16=compiled_stats(prefill_triton._paged_prefill_kernel),
                            fp8=compiled_stats(prefill_triton._paged_prefill_fp8_kernel)))
        summary = dict(part="prefill_best", shape=shape_name, best={v: dict(ms=ms, cfg=cfg) for v, (ms, cfg) in
                                                                     best.items()})
        if "bf16" in best:
            summary["fp8_speed_vs_bf16"] = {v: best["bf16"][0] / ms for v, (ms, _) in best.items() if v != "bf16"}
        write(out, summary)
        for v, (ms, cfg) in best.items():
            ratio = f", {best['bf16'][0] / ms:.2f}x bf16" if "bf16" in best and v != "bf16" else ""
            ROWS.append(("prefill " + shape_name, f"{v} best {cfg}", f"{ms:.3f} ms, {flops / ms / 1e9:.0f} TFLOP/s"
                         + ratio))
        del chk, timed
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def _tile_rows(c: dict, cfg: dict) -> int:
    """The packed (token, query head) rows of one tile of ``cfg`` at shape ``c`` (prefill_triton.tile_tokens)."""
    g, d = triton.next_power_of_2(c["Hq"] // c["Hkv"]), max(16, triton.next_power_of_2(c["D"]))
    return prefill_triton.tile_tokens(cfg["BLOCK_M"], g, num_warps=cfg["num_warps"], block_d=d) * g


def _dequantize_only(ins: dict):
    """The dequantize variant's first pass alone: its pages into the bf16 scratch."""
    q, k8, v8, table, lens = paged_triton_operands(ins["q"], ins["k_cache"], ins["v_cache"], ins["block_table"],
                                                   ins["seq_lens"])
    return prefill_triton.dequantize_pages(k8, v8, ins["k_scale"], ins["v_scale"], table, lens, q.dtype)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--parts", nargs="+", default=["bwd", "prefill"], choices=["bwd", "prefill"])
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="the prefill part at toy sizes in Triton's interpreter (checks the tool runs; no speeds)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.cpu_smoke:
        print(f"cpu smoke: the prefill part at toy sizes (torch {torch.__version__}, triton {triton.__version__})",
              flush=True)
        parts = {"prefill": lambda out, budget: run_prefill(out, budget, smoke=True)}
    else:
        if not torch.cuda.is_available():
            print("probe: no CUDA GPU here; --cpu-smoke runs the prefill part at toy sizes", file=sys.stderr)
            return 2
        print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), flush=True)
        parts = {"prefill": run_prefill, "bwd": run_bwd}
    rc = 0
    for part in a.parts:
        if part not in parts:
            print(f"{part}: not run with --cpu-smoke", flush=True)
            continue
        try:
            parts[part](a.out, a.budget_s)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            rc = 1
    print("\n=== summary ===")
    for r in ROWS:
        print(" | ".join(str(x) for x in r))
    return rc


if __name__ == "__main__":
    sys.exit(main())
