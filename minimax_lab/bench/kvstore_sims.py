"""The KV store's simulations, recorded: the shared pool at 1-64 replicas and the eviction policies'
share of the LRU -> Belady gap, each written as one JSON file that chapter 07 reads.

    python -m minimax_lab.bench.kvstore_sims pool --out results/kvstore_replay.json
    python -m minimax_lab.bench.kvstore_sims policy-gap --out results/kvstore_policy_gap.json

``pool`` replays Mooncake's shipped synthetic trace with :func:`minimax_lab.kvcache.pool_sim.pool_sweep`
(LLaMA3-70B on 8xA800-like nodes, the setting of Mooncake's FAST'25 evaluation); ``policy-gap``
runs :func:`minimax_lab.kvcache.policy_gap.gap_table` on that trace and on the generated agent
workload. Both are simulations (no GPU). A mistake on the command line is answered in one line.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from minimax_lab.bench.parsing import Parser
from minimax_lab.kvcache.policy_gap import gap_table
from minimax_lab.kvcache.pool_sim import MOONCAKE_NODE, mooncake_comparison, pool_sweep
from minimax_lab.kvcache.trace import find_trace, read_trace, replay_trace
from minimax_lab.kvcache.workloads import agent_workload


def _trace() -> Path:
    trace = find_trace()
    if trace is None:
        raise ValueError("Mooncake's synthetic trace is not installed with the package")
    return trace


def _write(out: str, doc: dict) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(out).with_name(Path(out).name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out)


def record_pool(out: str, capacity: int, counts: tuple[int, ...]) -> dict:
    """Replay the synthetic trace at ``counts`` replicas in every mode, write the document to ``out``."""
    trace = _trace()
    t0 = time.perf_counter()
    rows = pool_sweep(trace, counts, capacity_tokens=capacity)
    ceiling = replay_trace(trace, capacity_tokens=None).hit_ratio
    doc = dict(trace=trace.name, model=MOONCAKE_NODE.shape.name, link_gbps=MOONCAKE_NODE.link_gbps,
               tflops=MOONCAKE_NODE.tflops, mfu=MOONCAKE_NODE.mfu, capacity_tokens=capacity,
               memory="equal in every mode: capacity_tokens per replica; the pool modes share the replicas' caches",
               ceiling_hit_ratio=ceiling, seconds=round(time.perf_counter() - t0, 1),
               note="simulation (no GPU): the TTFT model prices fetch and prefill; run on a CPU machine",
               rows=[r.as_dict() for r in rows])
    _write(out, doc)
    for r in rows:
        print(f"{r.replicas:>3} {r.mode:<15} hit {r.hit_ratio:6.1%}  fetched {r.fetched_tokens / r.input_tokens:6.1%}  "
              f"TTFT mean {r.ttft_mean_s:8.2f} s  p90 {r.ttft_p90_s:8.2f} s  compute {r.compute_s_mean:6.3f} s")
    print(f"ceiling (one unbounded cache): {ceiling:.1%}")
    if 10 in counts and 1 in counts:
        print(json.dumps(mooncake_comparison(doc), indent=1))
    return doc


def record_policy_gap(out: str) -> dict:
    """The gap table on the synthetic trace and the agent workload, written to ``out``."""
    doc = dict(synthetic=gap_table(read_trace(_trace()), (100_000, 1_000_000, 3_000_000, 10_000_000), progress=True),
               agent=gap_table(agent_workload(4, 60).requests, (50_000, 200_000, 400_000), progress=True))
    _write(out, doc)
    for name, rows in doc.items():
        for r in rows:
            print(name, r["capacity_tokens"], " ".join(
                f"{k} {v:.0%}" if v is not None else f"{k} -" for k, v in r["gap_closed"].items()))
    return doc


def main(argv=None) -> int:
    p = Parser(prog="python -m minimax_lab.bench.kvstore_sims", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True, parser_class=Parser)
    pool = sub.add_parser("pool", help="Mooncake's synthetic trace over a shared KV pool at 1-64 replicas")
    pool.add_argument("--out", default="results/kvstore_replay.json", help="JSON file to write")
    pool.add_argument("--capacity", type=int, default=3_000_000,
                      help="tokens each replica caches, in every mode (Mooncake's evaluation: 3M per node)")
    pool.add_argument("--replicas", default="1,2,4,8,10,16,32,64", help="comma-separated replica counts")
    gap = sub.add_parser("policy-gap", help="the share of the LRU->Belady gap each eviction policy closes")
    gap.add_argument("--out", default="results/kvstore_policy_gap.json", help="JSON file to write")
    a = p.parse_args(argv)
    try:
        if a.what == "pool":
            try:
                counts = tuple(int(x) for x in a.replicas.split(","))
            except ValueError:
                raise ValueError(f"--replicas takes comma-separated integers, got {a.replicas!r}") from None
            record_pool(a.out, a.capacity, counts)
        else:
            record_policy_gap(a.out)
    except (ValueError, TypeError, OSError) as e:
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
