"""Sweep the fused MoE's launch configs on the GPU and print the best per (shape, T).

    python tools/tune_moe.py [--tokens 64 16384] [--out sweep.json]

For each of the bench suite's shapes and each T it checks every candidate config against
``torch._grouped_mm``'s output (rel. err < 2e-2, else the config is dropped), times it with
``bench.time_fn`` and prints ms, GB/s of used-expert weights, TFLOP/s and the ratio to
``torch._grouped_mm`` timed in the same run. The winners go into
``minimax_lab/moe/experts_triton.py:GPU_CONFIGS`` by hand, with the numbers in
``results/notes_moe.md``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parent.parent))
from minimax_lab import bench, runtime
from minimax_lab.moe import bench_suite as bs
from minimax_lab.moe.experts_torch import experts_grouped_mm
from minimax_lab.moe.experts_triton import experts_triton


def cfg(bm, bn, bk, w, s, dbn=None, dbk=None, dw=None, ds=None):
    c = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "num_stages": s,
         "DOWN_BLOCK_N": dbn or bn, "DOWN_BLOCK_K": dbk or bk}
    if dw:
        c["DOWN_num_warps"] = dw
    if ds:
        c["DOWN_num_stages"] = ds
    return c


DECODE = {
    "d16_64_128_w4s4": cfg(16, 64, 128, 4, 4),
    "d16_32_256_w4s4": cfg(16, 32, 256, 4, 4),
    "d16_128_128_w4s3": cfg(16, 128, 128, 4, 3),
    "d16_64_256_w4s3": cfg(16, 64, 256, 4, 3),
    "d16_64_128_w4s6": cfg(16, 64, 128, 4, 6),
    "d16_32_128_w2s5": cfg(16, 32, 128, 2, 5),
    "d32_64_128_w4s4": cfg(32, 64, 128, 4, 4),
    "d32_128_128_w4s3": cfg(32, 128, 128, 4, 3),
    "d64_64_128_w4s3": cfg(64, 64, 128, 4, 3),
}
PREFILL = {
    "p128_64_64_w8s3": cfg(128, 64, 64, 8, 3, 128, 64),
    "p128_128_64_w8s3": cfg(128, 128, 64, 8, 3),
    "p64_128_64_w4s4": cfg(64, 128, 64, 4, 4),
    "p128_64_64_w4s4": cfg(128, 64, 64, 4, 4, 128, 64, 8, 4),
    "p128_128_32_w8s4": cfg(128, 128, 32, 8, 4),
    "p64_64_64_w4s4": cfg(64, 64, 64, 4, 4, 128, 64),
    "p128_64_64_w8s4": cfg(128, 64, 64, 8, 4, 256, 64, 8, 3),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[64, 256, 16384])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if runtime.is_interpreter():
        print("tune_moe needs a GPU")
        return 1
    dev, dtype = runtime.kernel_device(), runtime.compute_dtype()
    rows = []
    for s in bs.GPU_SHAPES:
        wgu, wd = bs.make_weights(s, dev, dtype)
        for T in args.tokens:
            mk = (lambda T: lambda seed: bs.make_tokens(s, T, dev, dtype, seed))(T)
            ins = mk(123)
            want = experts_grouped_mm(ins["x"], wgu, wd, ins["weights"], ins["ids"])
            flops, nbytes = bs.moe_flops(s, T), bs.moe_bytes(s, T, ins["ids"], 2)
            t_peer = bench.time_fn(lambda x, weights, ids: experts_grouped_mm(x, wgu, wd, weights, ids), mk,
                                   reps=args.reps).ms
            cands = DECODE if T <= bs.DECODE_MAX_T else PREFILL
            print(f"{bs.case_name(s, T)}: torch_grouped_mm {t_peer:.3f} ms", flush=True)
            for name, c in cands.items():
                t0 = time.perf_counter()
                try:
                    got = experts_triton(ins["x"], wgu, wd, ins["weights"], ins["ids"], config=c)
                    err = bench.relative_error(got, want)
                    if not err < 2e-2:
                        print(f"   {name:<22} WRONG rel err {err:.2e}")
                        continue
                    t = bench.time_fn(lambda x, weights, ids: experts_triton(x, wgu, wd, weights, ids, config=c),
                                      mk, reps=args.reps).ms
                except Exception as e:  # noqa: BLE001 - a config that does not compile is skipped
                    print(f"   {name:<22} FAILED {type(e).__name__}: {str(e)[:120]}")
                    continue
                row = dict(shape=bs.case_name(s, T), config=name, ms=t, gbps=nbytes / t / 1e6,
                           tflops=flops / t / 1e9, vs_grouped_mm=t_peer / t, peer_ms=t_peer, cfg=c)
                rows.append(row)
                print(f"   {name:<22} {t:8.3f} ms {row['gbps']:7.0f} GB/s {row['tflops']:6.1f} TFLOP/s "
                      f"{row['vs_grouped_mm']:5.2f}x  (err {err:.1e}, {time.perf_counter() - t0:.1f} s)", flush=True)
            best = min((r for r in rows if r["shape"] == bs.case_name(s, T)), key=lambda r: r["ms"], default=None)
            if best:
                print(f"   BEST {best['config']} {best['ms']:.3f} ms {best['vs_grouped_mm']:.2f}x", flush=True)
        del wgu, wd
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
