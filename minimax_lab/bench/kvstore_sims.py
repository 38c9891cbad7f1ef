"""The KV store's simulations, recorded: the shared pool at 1-64 replicas and the eviction policies'
share of the LRU -> Belady gap, each written as one JSON file that chapter 07 reads.

    python -m minimax_lab.bench.kvstore_sims pool --out results/kvstore_replay.json
    python -m minimax_lab.bench.kvstore_sims policy-gap --out results/kvstore_policy_gap.json

``pool`` replays Mooncake's shipped synthetic trace with :func:`minimax_lab.kvcache.pool_sim.pool_sweep`
(LLaMA3-70B on 8xA800-like nodes, the setting of Mooncake's FAST'25 evaluation), and again at the
rates measured on this machine (``--bandwidth``: the tiny model's prefill and the remote tier's
signed gets decide fetch or recompute per request). ``policy-gap`` runs
:func:`minimax_lab.kvcache.policy_gap.gap_table` and ``lru_savings`` on that trace, the generated
agent workload and two generated conversation traces (``gap_traces``), with a continuation
predictor trained on one of them. Both are simulations (no GPU). A mistake on the command line is
answered in one line.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from minimax_lab.bench.parsing import Parser
from minimax_lab.kvcache.eviction import ConversationPolicy
from minimax_lab.kvcache.policy_gap import POLICY_ORDER, gap_table, lru_savings
from minimax_lab.kvcache.pool_sim import MOONCAKE_NODE, mooncake_comparison, pool_sweep
from minimax_lab.kvcache.routing import PrefillCost
from minimax_lab.model.config import tiny_model_shape
from minimax_lab.kvcache.reuse_model import FEATURES, ContinuationOracle, auc, fit, log_loss, turn_examples
from minimax_lab.kvcache.trace import find_trace, read_trace, replay_trace
from minimax_lab.kvcache.workloads import CONVERSATION_SOURCES, agent_workload, conversation_workload


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


def measured_cost(bandwidth: dict) -> PrefillCost:
    """Prices from one machine's record (``suite_kvstore``'s document): the workbook's tiny model
    (fp32 KV) recomputing at the prefill rate measured there, fetching at the rate the remote
    tier's signed gets measured there (``link_gbps``)."""
    if "link_gbps" not in bandwidth or "cpu_prefill_tflops" not in bandwidth:
        raise ValueError("the bandwidth record has no tier rate (link_gbps) or CPU prefill rate: "
                         "record it with python -m minimax_lab.bench.suite_kvstore")
    shape = replace(tiny_model_shape(), dtype_bytes=4)
    return PrefillCost(shape, link_gbps=bandwidth["link_gbps"], tflops=bandwidth["cpu_prefill_tflops"], mfu=1.0)


def record_pool(out: str, capacity: int, counts: tuple[int, ...], bandwidth: str | None = None) -> dict:
    """Replay the synthetic trace at ``counts`` replicas in every mode, write the document to ``out``;
    with ``bandwidth`` (a ``suite_kvstore`` record) also at the rates measured there, where the
    tier's measured get rate decides fetch or recompute per request (``measured``)."""
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
    if bandwidth is not None:
        cost = measured_cost(json.loads(Path(bandwidth).read_text()))
        reqs = read_trace(trace)
        measured_counts = tuple(n for n in counts if n <= 10)
        # the CPU prefills far slower than 8 A800s: stretch the arrival times so that the most replicas
        # replayed, with no cache at all, would be busy half of the time (queues stay finite)
        work = sum(cost.compute_s(0, r.input_length) for r in reqs)
        span = (reqs[-1].timestamp - reqs[0].timestamp) / 1e3
        stretch = max(1.0, work / (0.5 * max(measured_counts) * span))
        slow = [replace(r, timestamp=int(r.timestamp * stretch)) for r in reqs]
        mrows = pool_sweep(slow, measured_counts, capacity_tokens=capacity, cost=cost)
        doc["measured"] = dict(model=cost.shape.name, kv_bytes_per_token=cost.shape.kv_bytes_per_token(),
                               link_gbps=cost.link_gbps, tflops=cost.tflops, source=str(bandwidth),
                               time_stretch=stretch,
                               note="both rates measured on the CPU machine: the tiny model's prefill and the remote "
                                    "tier's signed get (not the raw client's); arrival times stretched by time_stretch "
                                    f"so that {max(measured_counts)} replicas without a cache would be busy half the time",
                               rows=[r.as_dict() for r in mrows])
        for r in mrows:
            print(f"measured {r.replicas:>3} {r.mode:<15} hit {r.hit_ratio:6.1%}  fetched "
                  f"{r.fetched_tokens / r.input_tokens:6.1%}  TTFT mean {r.ttft_mean_s:10.2f} s")
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    _write(out, doc)
    for r in rows:
        print(f"{r.replicas:>3} {r.mode:<15} hit {r.hit_ratio:6.1%}  fetched {r.fetched_tokens / r.input_tokens:6.1%}  "
              f"TTFT mean {r.ttft_mean_s:8.2f} s  p90 {r.ttft_p90_s:8.2f} s  compute {r.compute_s_mean:6.3f} s")
    print(f"ceiling (one unbounded cache): {ceiling:.1%}")
    if 10 in counts and 1 in counts:
        print(json.dumps(mooncake_comparison(doc), indent=1))
    return doc


#: the traces of the policy-gap record: Mooncake's synthetic trace, the coding-agent workload, and
#: two generated conversation traces (``a`` trains the learned predictor, ``b`` tests it)
GAP_CAPACITIES = (1_000_000, 3_000_000, 10_000_000)


def gap_traces() -> dict:
    """``{name: requests}`` of the policy-gap record (``GAP_CAPACITIES`` on each)."""
    return dict(synthetic=read_trace(_trace()), agent=agent_workload(24, 40).requests,
                conversations_a=conversation_workload(6000, seed=1).requests,
                conversations_b=conversation_workload(6000, seed=2).requests)


_TRACES: dict = {}          # the traces and the model, set before the worker processes fork


def _gap_one(job) -> tuple[str, int, dict, dict]:
    """One trace at one capacity: the gap row (with the learned and the oracle continuation) and
    the cache the conversation policy needs for LRU's hit ratio."""
    name, cap = job
    reqs, model = _TRACES[name], _TRACES["_model"]
    oracle = ContinuationOracle(reqs)
    policies = list(POLICY_ORDER[:-1]) + [("learned", lambda: ConversationPolicy(continuation=model)),
                                          ("knows_whether", lambda: ConversationPolicy(continuation=oracle)),
                                          "belady"]
    row = gap_table(reqs, [cap], policies)[0]
    saving = lru_savings(reqs, [cap], "conversation", hits={cap: (row["hit"]["lru"], row["hit"]["conversation"])})[0]
    return name, cap, row, saving


def record_policy_gap(out: str, processes: int | None = None) -> dict:
    """The gap table, the learned predictor and the cache savings on every trace of ``gap_traces`` at
    every capacity of ``GAP_CAPACITIES``, written to ``out`` (one process per trace and capacity, up
    to ``processes``, by default the machine's cores)."""
    t0 = time.perf_counter()
    traces = gap_traces()
    X, y = turn_examples(traces["conversations_a"])
    model = fit(X, y)
    _TRACES.clear()
    _TRACES.update(traces, _model=model)
    jobs = [(name, cap) for name in traces for cap in GAP_CAPACITIES]
    with multiprocessing.get_context("fork").Pool(processes or min(len(jobs), os.cpu_count() or 1)) as pool:
        done = pool.map(_gap_one, jobs, chunksize=1)
    per = {name: dict(rows=[], savings=[]) for name in traces}
    for name, cap, row, saving in done:
        per[name]["rows"].append(row)
        per[name]["savings"].append(saving)
    for name, reqs in traces.items():
        Xt, yt = turn_examples(reqs)
        per[name].update(requests=len(reqs), input_tokens=sum(r.input_length for r in reqs),
                         ceiling_hit_ratio=replay_trace(reqs, capacity_tokens=None).hit_ratio,
                         learned=dict(auc=auc(model, Xt, yt), log_loss=log_loss(model, Xt, yt),
                                      continue_share=float(yt.mean())))
    doc = dict(policies=[*POLICY_ORDER[:-1], "learned", "knows_whether", "belady"],
               capacities=list(GAP_CAPACITIES), chosen="conversation",
               learned_model=dict(trained_on="conversations_a", features=list(FEATURES),
                                  weights=[float(w) for w in model.weights / model.scale]),
               notes=dict(knows_whether="not online: the conversation policy told from the future whether each "
                                        "conversation comes back (not when) -- a bound on what predicting "
                                        "continuation can buy",
                          learned="the conversation policy with a logistic-regression continuation guess trained on "
                                  "conversations_a (in-sample there, held out on the others)",
                          conversations=CONVERSATION_SOURCES),
               traces=per, seconds=round(time.perf_counter() - t0, 1), cores=os.cpu_count())
    _write(out, doc)
    for name, d in doc["traces"].items():
        for r in d["rows"]:
            print(name, f"{r['capacity_tokens']:,}", " ".join(
                f"{k} {r['hit'][k]:.3f}/{v:.0%}" if v is not None else f"{k} {r['hit'][k]:.3f}/-"
                for k, v in r["gap_closed"].items()))
        print(name, "learned AUC", round(d["learned"]["auc"], 3), "savings vs LRU:",
              [None if s["saved"] is None else round(s["saved"], 3) for s in d["savings"]])
    print(f"{doc['seconds']} s on {doc['cores']} cores")
    return doc


def main(argv=None) -> int:
    p = Parser(prog="python -m minimax_lab.bench.kvstore_sims", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True, parser_class=Parser)
    pool = sub.add_parser("pool", help="Mooncake's synthetic trace over a shared KV pool at 1-64 replicas")
    pool.add_argument("--out", default="results/kvstore_replay.json", help="JSON file to write")
    pool.add_argument("--capacity", type=int, default=3_000_000,
                      help="tokens each replica caches, in every mode (Mooncake's evaluation: 3M per node)")
    pool.add_argument("--replicas", default="1,2,4,8,10,16,32,64", help="comma-separated replica counts")
    pool.add_argument("--bandwidth", default="results/kvstore_bandwidth.json",
                      help="a suite_kvstore record: also replay at its measured tier and prefill rates ('' to skip)")
    gap = sub.add_parser("policy-gap", help="the share of the LRU->Belady gap each eviction policy closes")
    gap.add_argument("--out", default="results/kvstore_policy_gap.json", help="JSON file to write")
    gap.add_argument("--processes", type=int, default=None, help="worker processes (default: the cores)")
    a = p.parse_args(argv)
    try:
        if a.what == "pool":
            try:
                counts = tuple(int(x) for x in a.replicas.split(","))
            except ValueError:
                raise ValueError(f"--replicas takes comma-separated integers, got {a.replicas!r}") from None
            record_pool(a.out, a.capacity, counts, a.bandwidth or None)
        else:
            if a.processes is not None and a.processes < 1:
                raise ValueError(f"--processes must be at least 1, got {a.processes}")
            record_policy_gap(a.out, a.processes)
    except (ValueError, TypeError, OSError) as e:
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
