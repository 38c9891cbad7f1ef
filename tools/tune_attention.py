"""One GPU call for the attention chapter: correctness at GPU sizes, a config sweep, the suite.

    MINIMAX_LAB_COMMIT=... python tools/tune_attention.py --out $OUT

1. checks the Triton kernel against the fp32 reference in bf16 at GPU sizes (ragged S, S=1,
   GQA 1/4/16, causal and not, S > Skv with fully masked rows);
   (``--check-only`` stops here: run it before ``python -m minimax_lab.bench attention``);
2. sweeps fixed configs at the 16k case (warp specialization last: run it under ``timeout``) and
   writes ``tune_attention.json``;
3. writes the ceilings and every ``attention`` suite case to ``attention.json`` case by case
   (so a run cut short still returns what it finished).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minimax_lab import bench, runtime  # noqa: E402
from minimax_lab.attention import bench_suite  # noqa: E402
from minimax_lab.attention.flash import DEFAULT_CONFIG, flash_attention  # noqa: E402
from minimax_lab.attention.flash import INTERPRETER_CONFIG as INTERP  # noqa: E402
from minimax_lab.attention.reference import attention_reference  # noqa: E402

def _cfg(bm, bn, w, s, tma, g, ws=False):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s, "USE_TMA": tma, "GROUP_H": g,
            **({"WARP_SPEC": True} if ws else {})}


# GROUP_H=1024: every head at one query tile before the next tile (the launch order before the
# L2-grouped one); GROUP_H=1: all query tiles of one head, then the next head (FlashAttention's).
SWEEP = [
    _cfg(128, 128, 8, 3, False, 1024), _cfg(128, 128, 8, 3, False, 1), _cfg(128, 128, 8, 3, True, 1024),
    _cfg(128, 128, 8, 3, True, 1), _cfg(128, 128, 8, 3, True, 4), _cfg(128, 128, 8, 3, True, 16),
    _cfg(128, 128, 8, 2, True, 1), _cfg(128, 64, 8, 3, True, 1), _cfg(128, 64, 8, 4, True, 1),
    _cfg(128, 128, 8, 3, True, 1, ws=True),
]
PTR_CONFIG = _cfg(128, 64, 8, 3, False, 1)


def correctness(smoke: bool = False) -> list[dict]:
    """Triton vs the fp32 reference at GPU sizes with the fixed TMA default (the suite checks the
    autotuned kernel per case); the pointer-load config on the last two shapes, head_dim 80 and a
    head-major view, which cannot take the TMA path."""
    dev, dt = runtime.kernel_device(), runtime.compute_dtype()
    shapes = [(1, 20, 33, 4, 1, 32, True), (1, 33, 20, 2, 2, 24, True)] if smoke else [
        (2, 1000, 1000, 16, 16, 128, True), (1, 1, 1, 4, 4, 64, True), (1, 777, 2049, 16, 1, 128, True),
        (1, 2049, 777, 16, 4, 64, True), (2, 513, 513, 4, 1, 64, False), (1, 1, 4000, 16, 4, 128, True),
        (1, 300, 300, 8, 8, 80, True), (2, 700, 700, 8, 2, 128, True)]
    configs = [INTERP, {**INTERP, "USE_TMA": False}] if smoke else [DEFAULT_CONFIG, PTR_CONFIG]
    out = []
    for i, (B, S, Skv, Hq, Hkv, D, causal) in enumerate(shapes):
        q = torch.randn(B, S, Hq, D, device=dev, dtype=dt)
        k, v = (torch.randn(B, Skv, Hkv, D, device=dev, dtype=dt) for _ in range(2))
        if i == len(shapes) - 1:  # [B, H, S, D] storage seen as [B, S, H, D]: pointer path only
            q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
        r, rl = attention_reference(q, k, v, causal=causal, return_lse=True)
        for cfg in (configs if i >= len(shapes) - 2 or smoke else configs[:1]):  # pointers: D=80, head-major
            o, lse = flash_attention(q, k, v, causal=causal, return_lse=True, config=cfg)
            err = bench.relative_error(o, r)
            fin = torch.isfinite(rl)
            lse_err = (lse[fin] - rl[fin]).abs().max().item() if fin.any() else 0.0
            ok = err <= bench.tolerance_for(dt) and lse_err < 1e-2 and not torch.isnan(o).any() \
                and torch.equal(torch.isinf(lse), torch.isinf(rl))
            out.append(dict(shape=[B, S, Skv, Hq, Hkv, D, causal], config=cfg or "autotuned", rel_err=err,
                            lse_err=lse_err, ok=bool(ok)))
            print(f"check {out[-1]}", flush=True)
    return out


QUICK = {"a_128x128_w8_s3": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3},
         "b_256x64_w8_s2": {"BLOCK_M": 256, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2}}


def quick(out: Path) -> int:
    """Second, short call: a few fixed configs against the peers at the 16k case, same run."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    c = bench_suite.cases("gpu")[0]
    dev, dt = runtime.kernel_device(), runtime.compute_dtype()
    shape = dict(B=c["B"], S=c["S"], Hq=c["Hq"], Hkv=c["Hkv"], D=c["D"], causal=True)
    flops = bench_suite.attention_flops(c["B"], c["S"], c["S"], c["Hq"], c["D"], True)
    mk = lambda seed: {n: torch.randn(c["B"], c["S"], c["Hq"], c["D"], device=dev, dtype=dt) for n in "qkv"}  # noqa: E731
    mkp = lambda seed: {n: t.transpose(1, 2).contiguous() for n, t in mk(seed).items()}  # noqa: E731
    mask = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, c["S"], c["S"], device=dev)
    flex = torch.compile(flex_attention, dynamic=False)
    peers = {}

    def flash_peer(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    recs = []
    for label, cfg in QUICK.items():
        q, k, v = (torch.randn(1, 1000, 16, 128, device=dev, dtype=dt) for _ in range(3))
        err = bench.relative_error(flash_attention(q, k, v, config=cfg), attention_reference(q, k, v))
        t = bench.time_fn(lambda q, k, v: flash_attention(q, k, v, config=cfg), mk, reps=10, warmup=3)
        print(f"{label}: check rel err {err:.1e}, {t.ms:.3f} ms, {flops / t.ms / 1e9:.1f} TFLOP/s", flush=True)
        if err > bench.tolerance_for(dt):
            continue
        recs.append((label, cfg, t, err))
    for name, fn in (("flex_compiled", lambda q, k, v: flex(q, k, v, block_mask=mask)), ("sdpa_flash", flash_peer)):
        peers[name] = bench.time_fn(fn, mkp, reps=10, warmup=3).ms
        print(f"{name}: {peers[name]:.3f} ms, {flops / peers[name] / 1e9:.1f} TFLOP/s", flush=True)
    records = [bench.make_record("attention", bench_suite.case_name(c), f"triton_{label}", t, shape=shape, dtype=dt,
                                 flops=flops, peers=peers, extra={"config": cfg, "check_rel_err": err,
                                                                  "note": "quick config run"})
               for label, cfg, t, err in recs]
    bench.append_records(records, out / "attention.json")
    print(bench.format_table(records))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, for a CPU dry run of the script")
    ap.add_argument("--quick", action="store_true", help="only the QUICK configs vs peers at 16k")
    ap.add_argument("--check-only", action="store_true",
                    help="only the GPU-size correctness checks (then run `python -m minimax_lab.bench attention`)")
    ap.add_argument("--no-sweep", action="store_true",
                    help="checks, then the ceilings and the whole suite case by case (records flushed per case)")
    args = ap.parse_args()
    if args.quick:
        return quick(Path(args.out))
    preset = "cpu" if args.smoke else "gpu"
    sweep_configs = [] if args.no_sweep else SWEEP
    if args.smoke and not args.no_sweep:
        sweep_configs = [INTERP, {**INTERP, "USE_TMA": False, "GROUP_H": 1024}]
    out = Path(args.out)
    t0 = time.time()
    checks = correctness(args.smoke)
    (out / "tune_attention.json").write_text(json.dumps({"checks": checks}, indent=1))
    print(f"[{time.time() - t0:.0f}s] {sum(c['ok'] for c in checks)}/{len(checks)} checks passed", flush=True)
    if not all(c["ok"] for c in checks):
        print("CORRECTNESS FAILED; not timing")
        return 1
    if args.check_only:
        return 0
    case = bench_suite.cases(preset)[0]
    dev, dt = runtime.kernel_device(), runtime.compute_dtype()
    dt = dt if dev.type == "cuda" else torch.float32
    mk = lambda seed: {n: torch.randn(case["B"], case["S"], case["Hq"], case["D"], device=dev, dtype=dt)  # noqa: E731
                       for n in "qkv"}
    flops = bench_suite.attention_flops(case["B"], case["S"], case["S"], case["Hq"], case["D"], True)
    sweep = []
    for cfg in sweep_configs:
        try:
            t = bench.time_fn(lambda q, k, v: flash_attention(q, k, v, config=cfg), mk, reps=10, warmup=3)
            sweep.append(dict(config=cfg, ms=t.ms, tflops=flops / t.ms / 1e9))
        except Exception as e:  # noqa: BLE001 - a config that does not compile is a result too
            sweep.append(dict(config=cfg, error=f"{type(e).__name__}: {e}"[:300]))
        print(f"sweep {sweep[-1]}  [{time.time() - t0:.0f}s]", flush=True)
        (out / "tune_attention.json").write_text(json.dumps({"checks": checks, "sweep_case": case, "sweep": sweep},
                                                            indent=1))
    records = bench.ceilings_suite()
    bench.append_records(records, out / "attention.json")
    for i, c in enumerate(bench_suite.cases(preset)):
        recs = bench_suite.run_case(c, reps=20 if preset == "gpu" else 3,
                                    configs=bench_suite.STEP_CONFIGS[preset] if i == 0 else None)
        bench.append_records(recs, out / "attention.json")
        print(f"[{time.time() - t0:.0f}s] case {i} done", flush=True)
    print(bench.format_table(json.loads((out / "attention.json").read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
