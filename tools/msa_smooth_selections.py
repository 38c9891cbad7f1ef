#!/usr/bin/env python
"""MSA prefill with smooth selections (neighbouring queries choosing the same blocks) as well as
random ones: ours against SGLang's Triton MSA on the same inputs, checked before timing.

    python tools/fetch_peers.py                               # once, with network: lays out peers/
    python tools/msa_smooth_selections.py --out OUT.json [--length 131072] [--runs 1 16 128] [--reps 5]

Random index vectors give every query its own selection: the KV-outer schedule then finds short
runs of queries per KV block, and the query-outer schedule gathers different blocks for each query.
A trained indexer selects smoothly: neighbouring queries mostly agree. Here each index query is
held constant over runs of ``R`` tokens (``R = 1``: random; ``R = 16, 128``: smooth), the keys stay
random, and on each input set we time, at MSA's production shape (``MSA_SHAPE``, bf16):

* ours end to end (index + top-k + KV-outer sparse attention), the KV-outer sparse part alone and
  the query-outer sparse part alone (both on the precomputed selection);
* SGLang end to end, its index + top-k alone and its sparse attention alone, after its selections
  and outputs are checked against ours and, on sampled rows, a float64 brute force
  (:func:`minimax_lab.bench.suite_msa_peer.prefill_peer`).

Each case's records (suite ``msa``, case ``smooth_r<R>_s<S>``) are appended to ``--out`` as soon as
it is done. Needs a CUDA GPU (``--cpu-smoke`` runs the machinery at a toy size in fp16 on the CPU
interpreter, where SGLang's kernels fail in bf16) and, for SGLang, the peers folder.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from minimax_lab import measure, runtime  # noqa: E402
from minimax_lab.attention import MSA_SHAPE, MSA_SHAPE_CPU, msa_attention, msa_select  # noqa: E402
from minimax_lab.attention.msa_compare import selection_overlap  # noqa: E402
from minimax_lab.bench import suite_msa_inputs  # noqa: E402
from minimax_lab.bench import suite_msa_peer as peer  # noqa: E402


def smooth_inputs(shape: dict, S: int, R: int, dev, dtype, seed: int) -> dict:
    """The msa suite's random prefill inputs, with each index query held constant over runs of ``R``
    tokens (``R = 1``: unchanged)."""
    ins = suite_msa_inputs.prefill_inputs(shape, S, dev, dtype, seed)
    if R > 1:
        first = (torch.arange(S, device=dev) // R) * R
        ins["q_idx"] = ins["q_idx"][:, first].contiguous()
    return ins


def neighbour_agreement(sel: torch.Tensor) -> float:
    """Share of (token, group) rows whose selected set equals the previous token's."""
    rows, _ = selection_overlap(sel[:, 1:], sel[:, :-1])
    return rows


def run_case(shape: dict, S: int, R: int, dev, dtype, *, reps: int, with_peer: bool) -> list[dict]:
    kw = dict(block_size=shape["Bk"], topk=shape["topk"])
    mk = lambda seed: smooth_inputs(shape, S, R, dev, dtype, seed)  # noqa: E731
    ins0 = mk(0)
    sel0 = msa_select(ins0["q_idx"], ins0["k_idx"], impl="triton", **kw)
    o0 = msa_attention(**ins0, impl="triton", schedule="kv", selected=sel0, **kw)
    o_query = msa_attention(**ins0, impl="triton", schedule="query", selected=sel0, **kw)
    err = measure.relative_error(o_query, o0)
    if not err <= measure.tolerance_for(dtype):
        raise AssertionError(f"R={R}: query-outer and KV-outer disagree (rel err {err:.2e})")
    sel_in = lambda seed: {**mk(seed), "selected": sel0}  # noqa: E731
    times = {
        "triton_kv": measure.time_fn(lambda **a: msa_attention(**a, impl="triton", schedule="kv", **kw), mk,
                                     reps=reps, warmup=2),
        "triton_kv_sparse": measure.time_fn(lambda **a: msa_attention(**a, impl="triton", schedule="kv",
                                                                      check_selected=False, **kw),
                                          sel_in, reps=reps, warmup=2),
        "triton_query_sparse": measure.time_fn(lambda **a: msa_attention(**a, impl="triton", schedule="query",
                                                                         check_selected=False, **kw),
                                             sel_in, reps=reps, warmup=2),
    }
    extra = {"run_length": R, "neighbour_rows_equal": round(neighbour_agreement(sel0), 6),
             "inputs": "index queries constant over runs of R tokens, keys random"}
    status = peer.peer_status()
    if with_peer and status["available"]:
        got = peer.prefill_peer(ins0, mk, sel_ours=sel0, o_ours=o0, reps=reps, **kw)
        times.update(got["times"])
        extra["peer_check"] = got["check"]
    else:
        extra["peer_absent"] = status["reason"] if not status["available"] else "not asked for"
    shape_rec = dict(B=1, S=S, **shape)
    flops = suite_msa_inputs.dense_causal_flops(S, shape["Hq"], shape["D"])
    peers_ms = {n: t.ms for n, t in times.items()}
    recs = []
    for name, t in times.items():
        others = {n: ms for n, ms in peers_ms.items() if n != name}
        recs.append(measure.make_record("msa", f"smooth_r{R}_s{S}", name, t, shape=shape_rec, dtype=dtype, flops=flops,
                                        peers=others if name.startswith("triton") else None, extra=extra))
    print(f"R={R:>4} S={S}: neighbours equal {extra['neighbour_rows_equal']:.3f}  " +
          "  ".join(f"{n} {t.ms:.2f} ms" for n, t in times.items()), flush=True)
    return recs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python tools/msa_smooth_selections.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="records file (JSON list; appended to)")
    p.add_argument("--length", type=int, default=131072, help="prefill length S (default 131072)")
    p.add_argument("--runs", type=int, nargs="+", default=[1, 16, 128], help="run lengths R (default 1 16 128)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--no-peer", action="store_true", help="time ours only")
    p.add_argument("--cpu-smoke", action="store_true", help="toy size, fp16, Triton interpreter (no timing meaning)")
    a = p.parse_args(argv)
    if any(r < 1 for r in a.runs) or a.length < 1 or a.reps < 1:
        p.error("--length, --runs and --reps must be positive")
    if a.cpu_smoke:
        shape, dtype, S = MSA_SHAPE_CPU, torch.float16, min(a.length, 80)
    elif runtime.DEVICE != "cuda":
        p.error("needs a CUDA GPU (or --cpu-smoke)")
    else:
        shape, dtype, S = MSA_SHAPE, torch.bfloat16, a.length
    dev = runtime.kernel_device()
    out = Path(a.out)
    for R in a.runs:
        measure.append_records(run_case(shape, S, R, dev, dtype, reps=a.reps, with_peer=not a.no_peer), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
