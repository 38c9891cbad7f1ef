#!/usr/bin/env python
"""Ours against SGLang's Triton MSA and fused MoE, at the shapes of the MSA and MoE peer tables, in one run.

    python tools/fetch_peers.py                                  # once, with network: lays out peers/
    python tools/bench_peers.py --out OUT.json [--quick] [--only msa|msa-decode|moe] [--budget-s 420]

Needs a CUDA GPU and the peers folder (``peers/`` or ``$MINIMAX_LAB_PEERS``). Runs the ``msa`` and
``moe`` bench suites' own case functions -- every case checks ours and SGLang against each other and
the references before timing -- and appends each case's records to ``--out`` as soon as it is done
(a run cut short keeps what it finished). Then prints a compact table: ours and SGLang side by side.

Cases and their planned cost (``warmup + reps`` per timed function; estimates include compiling
and SGLang's autotuning at each shape, on a cold Triton cache, H200):

=========================================  ============  =========================  =========
case                                       full          --quick                    est. s
=========================================  ============  =========================  =========
MSA checks (ours at 4,173 tokens)          once          once                       60
MSA prefill S = 32k / 64k / 128k (B=1)     2+10 ours,    32k only, 2+5 / 2+3,       40/50/70
                                           2+5 SGLang    no dense peers
MSA decode B = 32 / 64 at 128k context     3+30 each     B=32 only                  40/50
MoE E=128 d=2048 f=768 k=8                 T = 1, 16,    T = 1, 256, 4096           40 + 8/T
                                           64, 256,
                                           4096, 16384
MoE E=256 d=3072 f=1536 k=8                T = 4096,     --                         50 + 15/T
                                           16384
=========================================  ============  =========================  =========

Full: about 7 minutes; ``--quick``: about 3. A case that would end past ``--budget-s`` (default 420 s
from the start) is skipped and the table says so, so the run stays inside one 8-minute device call.
The dense prefill peers (cuDNN, flash, dense Triton) run in the full mode only.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from minimax_lab import measure, runtime  # noqa: E402

MSA_LENGTHS = {"full": [32768, 65536, 131072], "quick": [32768]}
MSA_DECODE = {"full": [(32, 131072), (64, 131072)], "quick": [(32, 131072)]}
MOE_CASES = {"full": [(dict(E=128, k=8, d=2048, f=768), [1, 16, 64, 256, 4096, 16384]),
                      (dict(E=256, k=8, d=3072, f=1536), [4096, 16384])],
             "quick": [(dict(E=128, k=8, d=2048, f=768), [1, 256, 4096])]}
EST_S = {"msa_checks": 60, "prefill": {32768: 40, 65536: 50, 131072: 70}, "decode": {32: 40, 64: 50},
         "moe_shape": {128: 40, 256: 50}, "moe_T": {128: 8, 256: 15}}

#: (suite, case prefix, ours impl, SGLang impl, label) rows of the summary table.
PAIRS = [
    ("msa", "prefill_s", "triton_kv", "sglang_triton", "prefill end to end"),
    ("msa", "index_s", "triton_fused_topk", "sglang_triton", "prefill index + top-k"),
    ("msa", "sparse_attn_s", "triton_kv", "sglang_triton", "prefill attention"),
    ("msa", "decode_b", "triton_sparse", "sglang_triton", "decode end to end, eager (ours checks values)"),
    ("msa", "decode_b", "triton_sparse_unchecked", "sglang_triton", "decode end to end, eager, no value check"),
    ("msa", "decode_b", "triton_sparse_cudagraph", "sglang_triton_cudagraph", "decode end to end, graphs"),
    ("msa", "decode_b", "triton_index_only", "sglang_triton_index", "decode index + top-k, eager"),
    ("msa", "decode_b", "triton_index_only_cudagraph", "sglang_triton_index_cudagraph", "decode index + top-k, graphs"),
    ("msa", "decode_b", "triton_sparse_fp8idx", "sglang_triton", "decode, eager, FP8 index keys"),
    ("msa", "decode_b", "triton_sparse_fp8idx_cudagraph", "sglang_triton_cudagraph", "decode, graphs, FP8 index keys"),
    ("msa", "decode_b", "triton_index_only_fp8idx_cudagraph", "sglang_triton_index_cudagraph",
     "decode index + top-k, graphs, FP8 keys"),
    ("msa", "decode_b", "triton_sparse_attn_only", "sglang_triton_attn", "decode attention, eager"),
    ("msa", "decode_b", "triton_sparse_attn_only_cudagraph", "sglang_triton_attn_cudagraph", "decode attention, graphs"),
    ("moe", "E", "triton", "sglang_triton", "fused MoE, eager"),
    ("moe", "E", "triton_cudagraph", "sglang_triton_cudagraph", "fused MoE, graphs"),
    ("moe", "E", "torch_grouped_mm", "sglang_triton", "SGLang vs torch._grouped_mm, eager"),
]


class Budget:
    """Wall-clock budget from the start of the run; :meth:`allows` skips a case that would overrun."""

    def __init__(self, seconds: float):
        self.seconds, self.t0, self.skipped = seconds, time.perf_counter(), []

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def allows(self, what: str, estimate_s: float) -> bool:
        if self.elapsed() + estimate_s <= self.seconds:
            print(f"[{self.elapsed():6.0f} s] {what} (est. {estimate_s:.0f} s)", flush=True)
            return True
        self.skipped.append(what)
        print(f"[{self.elapsed():6.0f} s] SKIPPED {what}: est. {estimate_s:.0f} s would pass the {self.seconds:.0f} s "
              "budget", flush=True)
        return False


def run_msa(mode: str, budget: Budget, out: Path) -> list[dict]:
    from minimax_lab.bench import suite_msa_decode, suite_msa_inputs, suite_msa_peer, suite_msa_prefill

    s, dev, dtype = suite_msa_inputs.GPU, runtime.kernel_device(), runtime.compute_dtype()
    peer = suite_msa_peer.peer_status()
    records: list[dict] = []
    if not budget.allows("msa checks", EST_S["msa_checks"]):
        return records
    check = suite_msa_prefill.check_prefill(s, dev, dtype, S=4096 + 77)
    dcheck = suite_msa_decode.check_decode(s, dev, dtype)
    reps = 10 if mode == "full" else 5
    for S in MSA_LENGTHS[mode]:
        if budget.allows(f"msa prefill S={S}", EST_S["prefill"][S]):
            recs = suite_msa_prefill.run_prefill(s, S, dev, dtype, reps=reps, check=check, with_flex=False,
                                                 with_query=False, peer=peer, dense_peers=mode == "full")
            measure.append_records(recs, out)
            records += recs
            torch.cuda.empty_cache()
    for B, L in MSA_DECODE[mode]:
        if budget.allows(f"msa decode B={B} ctx={L}", EST_S["decode"][B]):
            recs = suite_msa_decode.run_decode(s, B, L, dev, dtype, reps=30, check=dcheck, gather_peer=False,
                                               peer=peer)
            measure.append_records(recs, out)
            records += recs
    return records


def run_moe(mode: str, budget: Budget, out: Path) -> list[dict]:
    from minimax_lab.bench import suite_moe as ms

    records: list[dict] = []
    for shape, tokens in MOE_CASES[mode]:
        est = EST_S["moe_shape"][shape["E"]] + EST_S["moe_T"][shape["E"]] * len(tokens)
        if budget.allows(f"moe {ms.case_name(shape, 0)[:-3]} T={tokens}", est):
            recs = ms.run_shape(shape, tokens, reps=20, sweep=False, with_loop=False)
            measure.append_records(recs, out)
            records += recs
            torch.cuda.empty_cache()
    return records


def summary(records: list[dict]) -> str:
    """One row per (case, pair) where both sides were measured: ours ms, SGLang ms, SGLang / ours."""
    by = {(r["suite"], r["case"], r["impl"]): r for r in records}
    cases = []
    for r in records:
        if (r["suite"], r["case"]) not in cases:
            cases.append((r["suite"], r["case"]))
    lines = [f"{'case':<28} {'what':<44} {'ours ms':>10} {'SGLang ms':>10} {'SGLang/ours':>12}", "-" * 98]
    for suite, case in cases:
        for p_suite, prefix, ours, theirs, label in PAIRS:
            a, b = by.get((suite, case, ours)), by.get((suite, case, theirs))
            if p_suite == suite and case.startswith(prefix) and a and b:
                lines.append(f"{case:<28} {label:<44} {a['ms']:>10.3f} {b['ms']:>10.3f} {b['ms'] / a['ms']:>11.2f}x")
    notes = {r["case"]: r["peer_notes"] for r in records if r.get("peer_notes")}
    if notes:
        lines.append(f"peer notes: {notes}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="records file (JSON list; appended to)")
    ap.add_argument("--quick", action="store_true", help="a few cases only (about 3 minutes)")
    ap.add_argument("--only", choices=("msa", "msa-decode", "moe"), default=None,
                    help="one part (msa-decode: the MSA checks and decode cases, no prefill)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="skip cases that would end later than this")
    args = ap.parse_args(argv)
    if runtime.resolve_preset("auto") != "gpu":
        print("bench_peers needs a CUDA GPU (compiled Triton kernels); this machine has none")
        return 2
    from minimax_lab.bench import peers

    ok, why = peers.status()
    print(f"[bench_peers] {runtime.device_name()} torch {torch.__version__}; peers: {why}")
    if not ok:
        return 2
    mode = "quick" if args.quick else "full"
    budget = Budget(args.budget_s)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    if args.only == "msa-decode":
        MSA_LENGTHS[mode] = []
    for part, fn in (("msa", run_msa), ("moe", run_moe)):
        if args.only in (None, part) or (part == "msa" and args.only == "msa-decode"):
            try:
                records += fn(mode, budget, args.out)
            except Exception as e:  # noqa: BLE001 - keep the other part's numbers
                import traceback

                traceback.print_exc()
                print(f"[bench_peers] {part} FAILED: {type(e).__name__}: {e}")
    print(summary(records))
    print(f"[bench_peers] {len(records)} records in {args.out}; {budget.elapsed():.0f} s"
          + (f"; skipped for the budget: {budget.skipped}" if budget.skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
