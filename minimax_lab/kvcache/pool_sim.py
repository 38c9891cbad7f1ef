"""A shared KV pool at scale, by simulation: replay a Mooncake-format trace over 1-64 replicas.

Four ways to serve the same trace (``MODES``):

* ``isolated_rr`` -- each replica has its own cache; requests go round-robin;
* ``isolated_aware`` -- own caches; each request goes where queue + prefill is cheapest
  (``routing.choose_replica`` with an empty pool): the cache-aware routing of today;
* ``pool_rr`` -- own caches plus a shared pool every replica writes its blocks to and may fetch
  from (the fetch-or-recompute rule of ``routing.PrefillCost.plan``); round-robin;
* ``pool_priced`` -- own caches, the pool, and routing by the cheaper of "go there" and "fetch here".

Caches follow the replay contract of ``trace.replay_trace`` (blocks of ``block_tokens``, a hit is
the longest cached prefix). Each replica prefills one request at a time in arrival order
(timestamps in ms), so **TTFT = waiting for the replica + fetching + computing**, priced by
``PrefillCost`` (decode and the first token's own step are left out: the model is of the prefill).
The pool's capacity is a parameter; Mooncake's pool is the replicas' DRAM lent to all of them, so
the recorded run gives it ``replicas x`` a replica's local capacity.

``python -m minimax_lab.kvcache.pool_sim --out results/kvstore_replay.json`` replays Mooncake's
shipped synthetic trace with LLaMA3-70B on 8xA800-like nodes (the setting of Mooncake's FAST'25
evaluation) and writes every row.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm.auto import tqdm

from minimax_lab.kvcache.routing import PrefillCost, choose_replica
from minimax_lab.kvcache.tiers import LLAMA3_70B
from minimax_lab.kvcache.trace import BlockCache, _as_requests, check_cache_size, find_trace
from minimax_lab.validate import check_choice, check_positive_int

MODES = ("isolated_rr", "isolated_aware", "pool_rr", "pool_priced")
#: 8 x A800 (312 dense bf16 TFLOP/s each) at half of peak; 8 x 100 Gbps NICs = 100 GB/s of link.
MOONCAKE_NODE = PrefillCost(LLAMA3_70B, link_gbps=100.0, tflops=8 * 312.0, mfu=0.5)


@dataclass
class PoolSimResult:
    mode: str
    replicas: int
    local_capacity_tokens: int | None
    pool_capacity_tokens: int | None
    requests: int
    input_tokens: int
    local_hit_tokens: int          # served from the replica's own cache
    fetched_tokens: int            # fetched from the pool
    recomputed_tokens: int
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p90_s: float

    @property
    def hit_ratio(self) -> float:
        """Tokens not recomputed / input tokens."""
        return 1 - self.recomputed_tokens / self.input_tokens if self.input_tokens else 0.0

    def as_dict(self) -> dict:
        return dict(asdict(self), hit_ratio=self.hit_ratio)


def simulate_pool(trace, *, replicas: int, mode: str, cost: PrefillCost = MOONCAKE_NODE,
                  local_capacity_tokens: int | None, pool_capacity_tokens: int | None = None,
                  block_tokens: int = 512, policy="lru") -> PoolSimResult:
    """Replay ``trace`` over ``replicas`` replicas in ``mode`` (module docstring). Raises
    ``ValueError``/``TypeError`` for a bad argument or request (as ``replay_trace``)."""
    check_positive_int(replicas, "replicas")
    check_choice(mode, "mode", MODES)
    local_cap = check_cache_size(local_capacity_tokens, block_tokens)
    pool_cap = check_cache_size(pool_capacity_tokens, block_tokens)
    reqs = _as_requests(trace)
    caches = [BlockCache(local_cap, policy) for _ in range(replicas)]
    pool = BlockCache(pool_cap, "lru") if mode.startswith("pool") else None
    free_at = [0.0] * replicas
    local_hit = fetched = recomputed = total = 0
    ttfts = []
    for i, r in enumerate(reqs):
        t, n = r.timestamp / 1e3, r.input_length
        total += n
        pool_tok = min(pool.prefix(r.hash_ids) * block_tokens, n) if pool is not None else 0
        if mode.endswith("_rr"):
            j = i % replicas
            loc = min(caches[j].prefix(r.hash_ids) * block_tokens, n)
            sec, fetch, comp = cost.plan(n, loc, pool_tok)
        else:
            local = [min(c.prefix(r.hash_ids) * block_tokens, n) for c in caches]
            queue = [max(0.0, f - t) for f in free_at]
            j, sec, fetch, comp = choose_replica(n, local, pool_tok, queue, cost)
            loc = local[j]
        local_hit += min(loc, n)
        fetched += fetch
        recomputed += comp
        free_at[j] = max(t, free_at[j]) + sec
        ttfts.append(free_at[j] - t)
        caches[j].serve(r.hash_ids)
        if pool is not None:
            pool.serve(r.hash_ids)                 # the replica writes its blocks to the pool
    q = statistics.quantiles(ttfts, n=10) if len(ttfts) > 1 else ttfts * 9
    return PoolSimResult(mode, replicas, local_capacity_tokens, pool_capacity_tokens, len(reqs), total, local_hit,
                         fetched, recomputed, statistics.fmean(ttfts) if ttfts else 0.0,
                         statistics.median(ttfts) if ttfts else 0.0, q[8])


def pool_sweep(trace, replica_counts=(1, 2, 4, 8, 16, 32, 64), modes=MODES, *, local_capacity_tokens: int,
               pool_per_replica: bool = True, progress: bool = True, **kw) -> list[PoolSimResult]:
    """``simulate_pool`` for every mode at every replica count; the pool holds ``replicas x
    local_capacity_tokens`` when ``pool_per_replica`` (else ``kw['pool_capacity_tokens']``)."""
    reqs = _as_requests(trace)
    runs = [(n, m) for n in replica_counts for m in modes]
    out = []
    for n, m in tqdm(runs, desc="replay", disable=not progress):
        pool_cap = n * local_capacity_tokens if pool_per_replica else kw.get("pool_capacity_tokens")
        extra = {k: v for k, v in kw.items() if k != "pool_capacity_tokens"}
        out.append(simulate_pool(reqs, replicas=n, mode=m, local_capacity_tokens=local_capacity_tokens,
                                 pool_capacity_tokens=pool_cap, **extra))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Replay Mooncake's synthetic trace with a shared KV pool at 1-64 replicas.")
    p.add_argument("--out", default="results/kvstore_replay.json", help="JSON file to write")
    p.add_argument("--local-capacity", type=int, default=3_000_000,
                   help="tokens each replica caches (Mooncake's evaluation: 3M per node)")
    p.add_argument("--replicas", default="1,2,4,8,10,16,32,64", help="comma-separated replica counts")
    a = p.parse_args(argv)
    try:
        counts = tuple(int(x) for x in a.replicas.split(","))
        trace = find_trace()
        if trace is None:
            raise ValueError("Mooncake's synthetic trace is not installed with the package")
        t0 = time.perf_counter()
        rows = pool_sweep(trace, counts, local_capacity_tokens=a.local_capacity)
    except (ValueError, TypeError, OSError) as e:
        print(f"pool_sim: {e}", file=sys.stderr)
        return 2
    doc = dict(trace=trace.name, model=MOONCAKE_NODE.shape.name, link_gbps=MOONCAKE_NODE.link_gbps,
               tflops=MOONCAKE_NODE.tflops, mfu=MOONCAKE_NODE.mfu, local_capacity_tokens=a.local_capacity,
               pool_capacity="replicas x local capacity", seconds=round(time.perf_counter() - t0, 1),
               note="simulation (no GPU): the TTFT model prices fetch and prefill; measured on a CPU machine",
               rows=[r.as_dict() for r in rows])
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    for r in rows:
        print(f"{r.replicas:>3} {r.mode:<15} hit {r.hit_ratio:6.1%}  fetched {r.fetched_tokens / r.input_tokens:6.1%}  "
              f"TTFT mean {r.ttft_mean_s:8.2f} s  p90 {r.ttft_p90_s:8.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
