"""One GPU call for the paged-decode kernel: a config sweep, a split sweep, then (``--bench``) the suite.

    MINIMAX_LAB_COMMIT=... python tools/tune_kvcache.py --out $OUT [--bench]

1. At B=64, 8k context, page 16 (the issue's main case) sweeps ``BLOCK_N`` / warps / stages at
   the heuristic's split count; every config's output is checked against the gather + SDPA peer
   first (a wrong config is dropped, not timed).
0. Sweeps the prefill kernel's ``BLOCK_M`` / ``BLOCK_N`` / warps / stages (``--prefill-only``: only that).
2. With the best config sweeps ``num_splits`` on every decode case of the suite, and picks the
   ``programs_per_sm`` for :func:`minimax_lab.kvcache.decode.choose_num_splits` whose choices
   lose least against each case's best measured split count.
3. Writes ``tune_kvcache.json``; with ``--bench`` puts the winners into ``decode.GPU_CONFIG`` (in
   this process) and runs ``python -m minimax_lab.bench kvcache --out OUT/kv.json``. The records
   carry the config they ran with.

Timing: CUDA-graph replay (kernel time without launch gaps), 2 rotating input sets, medians.
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
from minimax_lab.kvcache import bench_suite as bs  # noqa: E402
from minimax_lab.kvcache import decode, prefill  # noqa: E402

CONFIGS = [dict(BLOCK_N=n, num_warps=w, num_stages=s) for n, w, s in [
    (32, 4, 2), (32, 4, 3), (32, 4, 4), (64, 4, 2), (64, 4, 3), (64, 4, 4), (64, 8, 2), (64, 8, 3),
    (128, 4, 2), (128, 4, 3), (128, 8, 2), (128, 8, 3)]]
PROGRAMS_PER_SM = (1, 2, 3, 4)
PREFILL_CONFIGS = [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=st) for m, n, w, st in [
    (16, 64, 4, 3), (16, 64, 4, 2), (16, 128, 4, 2), (32, 64, 8, 3), (32, 64, 8, 2), (32, 128, 8, 2),
    (32, 64, 4, 2), (64, 64, 8, 2)]]


def sweep_prefill(dev, dtype, gpu: bool) -> tuple[dict, dict]:
    """Time each prefill config (output checked against the gather + masked-SDPA peer first)."""
    c = bs.GPU_PREFILL[0] if gpu else bs.CPU_PREFILL[0]
    configs = PREFILL_CONFIGS if gpu else [prefill.INTERPRETER_CONFIG]
    sets = [bs.make_prefill_inputs(c, dev, dtype, s) for s in range(2)]
    want = prefill.paged_prefill_torch(**sets[0])
    table = {}
    for cfg in configs:
        name = f"m{cfg['BLOCK_M']}_n{cfg['BLOCK_N']}_w{cfg['num_warps']}_s{cfg['num_stages']}"
        fn = lambda **kw: prefill.paged_prefill_triton(**kw, config=cfg)  # noqa: E731
        try:
            err = bench.relative_error(fn(**sets[0]), want)
            if not err < 2e-2:
                print(f"  prefill {name}: WRONG (rel err {err:.2e})")
                continue
            table[name] = bench.time_fn(fn, lambda i: sets[i % 2], reps=10, cuda_graph=gpu, max_sets=2).ms
        except Exception as e:  # noqa: BLE001
            print(f"  prefill {name}: FAILED {type(e).__name__}: {str(e)[:100]}")
            continue
        print(f"  prefill {name:<16} {table[name]:.3f} ms  {bs.prefill_flops(c) / table[name] / 1e9:.0f} TFLOP/s",
              flush=True)
    best = min(table, key=table.get)
    return next(x for x in configs if f"m{x['BLOCK_M']}_n{x['BLOCK_N']}_w{x['num_warps']}_s{x['num_stages']}" == best), table


def _time(c, cfg, splits, ins_sets, want):
    fn = lambda **kw: decode.paged_decode_triton(**kw, num_splits=splits, config=cfg)  # noqa: E731
    got = fn(**ins_sets[0])
    err = bench.relative_error(got, want)
    if not err < 2e-2:
        return None, err
    t = bench.time_fn(fn, inputs=None, make_inputs=lambda i: ins_sets[i % len(ins_sets)], reps=20, cuda_graph=True,
                      max_sets=len(ins_sets))
    return t.ms, err


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--prefill-only", action="store_true", help="skip the decode sweeps (keep decode.GPU_CONFIG)")
    args = ap.parse_args()
    out = Path(args.out)
    gpu = runtime.kernel_device().type == "cuda"
    dev, dtype = runtime.kernel_device(), (torch.bfloat16 if gpu else torch.float32)
    cases = bs.GPU_DECODE if gpu else bs.CPU_DECODE  # CPU: a dry run of this script at tiny sizes
    configs = CONFIGS if gpu else [dict(BLOCK_N=16, num_warps=1, num_stages=1)]
    sms = decode.sm_count()
    report = {"sms": sms, "config_sweep_ms": {}, "split_sweep_ms": {}}
    t0 = time.perf_counter()

    best_prefill, report["prefill_sweep_ms"] = sweep_prefill(dev, dtype, gpu)
    report["prefill_chosen"] = best_prefill
    print(f"prefill chosen {best_prefill} ({time.perf_counter() - t0:.0f} s)")
    if args.prefill_only:
        configs, cases = [], []
    main_case = cases[0] if cases else None
    if main_case is not None:
        sets = [bs.make_decode_inputs(main_case, dev, dtype, s) for s in range(2)]
        want = bs.gather_sdpa(**sets[0])
        base_splits = decode.choose_num_splits(main_case["B"], main_case["Hkv"], main_case["L"], sms=sms, block_n=64)
    for cfg in configs:
        name = f"n{cfg['BLOCK_N']}_w{cfg['num_warps']}_s{cfg['num_stages']}"
        try:
            ms, err = _time(main_case, {**decode.GPU_CONFIG, **cfg}, base_splits, sets, want)
        except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: skip with a note
            print(f"  {name:<14} FAILED {type(e).__name__}: {str(e)[:100]}")
            continue
        if ms is None:
            print(f"  {name:<14} WRONG (rel err {err:.2e})")
            continue
        report["config_sweep_ms"][name] = ms
        print(f"  {name:<14} {ms:.4f} ms  (splits {base_splits}, err {err:.1e})", flush=True)
    if configs:
        best_name = min(report["config_sweep_ms"], key=report["config_sweep_ms"].get)
        best = next(c for c in configs if f"n{c['BLOCK_N']}_w{c['num_warps']}_s{c['num_stages']}" == best_name)
        print(f"best config {best_name}: {report['config_sweep_ms'][best_name]:.4f} ms ({time.perf_counter() - t0:.0f} s)")
        del sets, want
    else:
        best = {k: decode.GPU_CONFIG[k] for k in ("BLOCK_N", "num_warps", "num_stages")}
    if gpu:
        torch.cuda.empty_cache()

    for c in cases:
        name = bs.decode_case_name(c)
        sets = [bs.make_decode_inputs(c, dev, dtype, s) for s in range(2)]
        want = bs.gather_sdpa(**sets[0])
        heur = {p: decode.choose_num_splits(c["B"], c["Hkv"], c["L"], sms=sms, block_n=best["BLOCK_N"],
                                            programs_per_sm=p) for p in PROGRAMS_PER_SM}
        cands = sorted(set(heur.values()) | ({1, 2, 3, 4} if c["B"] >= 32 else {4, 8, 16, 32}))
        table = {}
        for s in cands:
            try:
                ms, err = _time(c, {**decode.GPU_CONFIG, **best}, s, sets, want)
            except Exception as e:  # noqa: BLE001
                print(f"  {name} splits {s}: FAILED {type(e).__name__}: {str(e)[:100]}")
                continue
            if ms is not None:
                table[s] = ms
        kv_bytes = 2.0 * c["B"] * c["L"] * c["Hkv"] * c["D"] * 2
        report["split_sweep_ms"][name] = {"table": table, "heuristic": heur}
        print(f"  {name}: " + "  ".join(f"s{s} {ms:.4f} ({kv_bytes / ms / 1e6:.0f} GB/s)" for s, ms in table.items())
              + f"  | heuristic {heur}", flush=True)
        del sets, want
        if gpu:
            torch.cuda.empty_cache()

    def loss(p):  # mean slowdown of the heuristic's pick vs the best measured split count
        tot = 0.0
        for rep in report["split_sweep_ms"].values():
            t = rep["table"]
            tot += t.get(rep["heuristic"][p], max(t.values())) / min(t.values())
        return tot / max(1, len(report["split_sweep_ms"]))
    pps = min(PROGRAMS_PER_SM, key=loss) if report["split_sweep_ms"] else decode.GPU_CONFIG["programs_per_sm"]
    report["programs_per_sm"] = {p: round(loss(p), 4) for p in PROGRAMS_PER_SM}
    report["chosen"] = {**best, "programs_per_sm": pps}
    print(f"chosen {report['chosen']} (mean slowdown vs best split: {report['programs_per_sm']}); "
          f"{time.perf_counter() - t0:.0f} s")
    (out / "tune_kvcache.json").write_text(json.dumps(report, indent=1, default=str))
    if args.bench:
        decode.GPU_CONFIG.update(report["chosen"])
        prefill.GPU_CONFIG.update(best_prefill)
        return bench.main(["kvcache", "--out", str(out / "kv.json")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
