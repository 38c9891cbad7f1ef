"""How much of the LRU -> Belady gap each eviction policy closes, per cache capacity.

``gap_table(requests, capacities)`` replays the requests (``trace.replay_trace``) with every
policy of ``POLICY_ORDER`` and returns one row per capacity: each policy's hit ratio and its share
of the gap, ``(hit - hit_LRU) / (hit_Belady - hit_LRU)`` (None where the gap is under 0.1% of the
tokens: nothing to close). ``python -m minimax_lab.kvcache.policy_gap --out FILE`` writes it for
Mooncake's synthetic trace and the generated agent workload.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm.auto import tqdm

from minimax_lab.kvcache.trace import _as_requests, find_trace, read_trace, replay_trace
from minimax_lab.kvcache.workloads import agent_workload

POLICY_ORDER = ("lru", "lfu", "s3fifo", "arc", "agent", "chain", "reuse", "adaptive", "belady")


def gap_table(requests, capacities, policies=POLICY_ORDER, *, progress: bool = False) -> list[dict]:
    """Rows ``{capacity_tokens, hit: {policy: ratio}, gap_closed: {policy: share or None}}``."""
    reqs = _as_requests(requests)
    rows = []
    for cap in tqdm(capacities, desc="capacities", disable=not progress):
        hit = {p: replay_trace(reqs, capacity_tokens=cap, policy=p).hit_ratio for p in policies}
        gap = hit.get("belady", 0.0) - hit.get("lru", 0.0)
        closed = {p: (h - hit["lru"]) / gap if gap > 1e-3 else None for p, h in hit.items()}
        rows.append(dict(capacity_tokens=cap, hit=hit, gap_closed=closed))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="The LRU->Belady gap each eviction policy closes.")
    p.add_argument("--out", default="results/kvstore_policy_gap.json")
    a = p.parse_args(argv)
    path = find_trace()
    if path is None:
        print("policy_gap: Mooncake's synthetic trace is not installed with the package", file=sys.stderr)
        return 2
    doc = dict(synthetic=gap_table(read_trace(path), (100_000, 1_000_000, 3_000_000, 10_000_000), progress=True),
               agent=gap_table(agent_workload(4, 60).requests, (50_000, 200_000, 400_000), progress=True))
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    for name, rows in doc.items():
        for r in rows:
            print(name, r["capacity_tokens"], " ".join(
                f"{k} {v:.0%}" if v is not None else f"{k} -" for k, v in r["gap_closed"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
