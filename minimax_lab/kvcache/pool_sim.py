"""A shared KV pool at scale, by simulation: replay a Mooncake-format trace over 1-64 replicas.

Four ways to serve the same trace (``MODES``), every one with the **same memory**: each replica
caches ``capacity_tokens`` (an LRU of 512-token blocks by default), and nothing else exists.

* ``isolated_rr`` -- each replica sees only its own cache; requests go round-robin;
* ``isolated_aware`` -- own caches; each request goes where queue + prefill is cheapest
  (``routing.choose_replica`` with an empty pool): cache-aware routing, the baseline Mooncake's
  evaluation compares its global cache with;
* ``pool_rr`` -- the replicas' caches together are the shared pool (Mooncake's global cache:
  every node keeps its own capacity but may fetch from all): a replica serves the prefix it holds
  itself, fetches the rest of the longest prefix held anywhere when that beats recomputing it
  (``routing.PrefillCost.plan``), computes the remainder, and keeps every block of the request in
  its own cache (a fetched block is copied, as Mooncake replicates hot blocks); round-robin;
* ``pool_priced`` -- the same pool, and routing by the cheaper of "go there" and "fetch here".

Caches follow the replay contract of ``trace.replay_trace`` (blocks of ``block_tokens``, a hit is
the longest cached prefix). Each replica prefills one request at a time in arrival order
(timestamps in ms), so **TTFT = waiting for the replica + fetching + computing**, priced by
``PrefillCost`` (decode and the first token's own step are left out: the model is of the prefill).
``compute_s_mean`` is the mean prefill compute time per request (Mooncake's "prefill GPU time").

``mooncake_comparison(doc)`` sets a recorded replay beside what Mooncake publishes
(``MOONCAKE_PUBLISHED``). The recorded replay (Mooncake's shipped synthetic trace, LLaMA3-70B on
8xA800-like nodes: the setting of Mooncake's FAST'25 evaluation) is written by
``python -m minimax_lab.bench.kvstore_sims pool``.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from tqdm.auto import tqdm

from minimax_lab.kvcache.routing import PrefillCost, choose_replica
from minimax_lab.kvcache.cost import LLAMA3_70B
from minimax_lab.kvcache.trace import BlockCache, _as_requests, check_cache_size
from minimax_lab.validate import check_choice, check_positive_int

MODES = ("isolated_rr", "isolated_aware", "pool_rr", "pool_priced")
#: 8 x A800 (312 dense bf16 TFLOP/s each) at half of peak; 8 x 100 Gbps NICs = 100 GB/s of link.
MOONCAKE_NODE = PrefillCost(LLAMA3_70B, link_gbps=100.0, tflops=8 * 312.0, mfu=0.5)

#: What Mooncake publishes for its synthetic trace (Qin et al., "Mooncake: Trading More Storage for
#: Less Computation", FAST'25, Sec. 5.3). Fig. 10 (10 prefill nodes, 3M tokens of cache each; the
#: local baseline's "global scheduler is programmed to direct requests to nodes with higher prefix
#: match ratios"): cache hit rate ~26% with local caches and ~62% with the global cache (bar heights,
#: read off the figure), labelled 2.36x; prefill GPU time labelled 0.52x (the text: "a reduction of
#: up to 48%"). Fig. 9 (one cache, requests only): at 3M tokens the synthetic trace reaches 46% of its
#: maximum hit rate, which is ~0.66 (read off the figure).
MOONCAKE_PUBLISHED = dict(source="Qin et al., FAST'25 (Mooncake), Fig. 9 and Fig. 10, synthetic trace",
                          replicas=10, capacity_tokens=3_000_000, local_hit=0.26, global_hit=0.62,
                          hit_gain=2.36, prefill_time_ratio=0.52, one_cache_share_of_max=0.46, max_hit=0.66)


@dataclass
class PoolSimResult:
    mode: str
    replicas: int
    capacity_tokens: int | None    # each replica's cache; the pool modes share them, nothing more
    requests: int
    input_tokens: int
    local_hit_tokens: int          # served from the replica's own cache
    fetched_tokens: int            # fetched from another replica's cache (the pool)
    recomputed_tokens: int
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p90_s: float
    compute_s_mean: float          # prefill compute per request (the model's "GPU time")
    fetch_s_mean: float            # fetching per request
    trace_s: float                 # from the first request's arrival to the last's

    @property
    def load(self) -> float:
        """Seconds of work (fetch + compute) each replica is asked for per second of the trace;
        above 1 its queue grows without bound and TTFT is mostly waiting."""
        busy = (self.compute_s_mean + self.fetch_s_mean) * self.requests
        return busy / (self.trace_s * self.replicas) if self.trace_s > 0 else 0.0

    @property
    def hit_ratio(self) -> float:
        """Tokens not recomputed / input tokens."""
        return 1 - self.recomputed_tokens / self.input_tokens if self.input_tokens else 0.0

    def as_dict(self) -> dict:
        return dict(asdict(self), hit_ratio=self.hit_ratio, load=self.load)


def _pool_prefix(caches: list[BlockCache], hash_ids) -> int:
    """Leading blocks of ``hash_ids`` each held by at least one cache."""
    n = 0
    for h in hash_ids:
        if not any(h in c.cached for c in caches):
            break
        n += 1
    return n


def simulate_pool(trace, *, replicas: int, mode: str, cost: PrefillCost = MOONCAKE_NODE,
                  capacity_tokens: int | None, block_tokens: int = 512, policy="lru") -> PoolSimResult:
    """Replay ``trace`` over ``replicas`` replicas of ``capacity_tokens`` each in ``mode`` (module
    docstring). Raises ``ValueError``/``TypeError`` for a bad argument or request (as ``replay_trace``)."""
    check_positive_int(replicas, "replicas")
    check_choice(mode, "mode", MODES)
    cap = check_cache_size(capacity_tokens, block_tokens)
    reqs = _as_requests(trace)
    caches = [BlockCache(cap, policy) for _ in range(replicas)]
    shared = mode.startswith("pool")
    free_at = [0.0] * replicas
    local_hit = fetched = recomputed = total = 0
    compute_s = fetch_s = 0.0
    ttfts = []
    for i, r in enumerate(reqs):
        t, n = r.timestamp / 1e3, r.input_length
        total += n
        pool_tok = min(_pool_prefix(caches, r.hash_ids) * block_tokens, n) if shared else 0
        if mode.endswith("_rr"):
            j = i % replicas
            loc = min(caches[j].prefix(r.hash_ids) * block_tokens, n)
            sec, fetch, comp = cost.plan(n, loc, pool_tok)
        else:
            local = [min(c.prefix(r.hash_ids) * block_tokens, n) for c in caches]
            queue = [max(0.0, f - t) for f in free_at]
            j, sec, fetch, comp = choose_replica(n, local, pool_tok, queue, cost)
            loc = local[j]
        local_hit += loc
        fetched += fetch
        recomputed += comp
        fetch_s += cost.fetch_s(fetch)
        compute_s += sec - cost.fetch_s(fetch)
        free_at[j] = max(t, free_at[j]) + sec
        ttfts.append(free_at[j] - t)
        caches[j].serve(r.hash_ids)                # computed and fetched blocks stay on the replica
    q = statistics.quantiles(ttfts, n=10) if len(ttfts) > 1 else ttfts * 9
    k = max(len(reqs), 1)
    span = (reqs[-1].timestamp - reqs[0].timestamp) / 1e3 if reqs else 0.0
    return PoolSimResult(mode, replicas, capacity_tokens, len(reqs), total, local_hit, fetched, recomputed,
                         statistics.fmean(ttfts) if ttfts else 0.0, statistics.median(ttfts) if ttfts else 0.0,
                         q[8], compute_s / k, fetch_s / k, span)


def pool_sweep(trace, replica_counts=(1, 2, 4, 8, 16, 32, 64), modes=MODES, *, capacity_tokens: int,
               progress: bool = True, **kw) -> list[PoolSimResult]:
    """``simulate_pool`` for every mode at every replica count, ``capacity_tokens`` per replica."""
    reqs = _as_requests(trace)
    runs = [(n, m) for n in replica_counts for m in modes]
    return [simulate_pool(reqs, replicas=n, mode=m, capacity_tokens=capacity_tokens, **kw)
            for n, m in tqdm(runs, desc="replay", disable=not progress)]


def mooncake_comparison(doc: dict, replicas: int = MOONCAKE_PUBLISHED["replicas"]) -> dict:
    """A recorded replay (``main``'s JSON) beside ``MOONCAKE_PUBLISHED``, like for like: cache-aware
    routing over own caches (``isolated_aware``) against the shared pool (``pool_priced``) at
    ``replicas`` replicas, and one cache's hit ratio as a share of the trace's ceiling (an unbounded
    cache). Raises ``ValueError`` when the record lacks those rows."""
    at = {r["mode"]: r for r in doc["rows"] if r["replicas"] == replicas}
    one = {r["mode"]: r for r in doc["rows"] if r["replicas"] == 1}
    if "isolated_aware" not in at or "pool_priced" not in at or "isolated_rr" not in one:
        raise ValueError(f"the record has no isolated_aware and pool_priced rows at {replicas} replicas "
                         "and no row at 1 replica")
    local, pool = at["isolated_aware"], at["pool_priced"]
    paper = MOONCAKE_PUBLISHED
    return dict(replicas=replicas, capacity_tokens=doc["capacity_tokens"],
                sim_local_hit=local["hit_ratio"], sim_pool_hit=pool["hit_ratio"],
                sim_hit_gain=pool["hit_ratio"] / local["hit_ratio"],
                sim_recomputed_ratio=pool["recomputed_tokens"] / local["recomputed_tokens"],
                sim_prefill_time_ratio=pool["compute_s_mean"] / local["compute_s_mean"],
                sim_one_cache_hit=one["isolated_rr"]["hit_ratio"], sim_max_hit=doc["ceiling_hit_ratio"],
                sim_one_cache_share_of_max=one["isolated_rr"]["hit_ratio"] / doc["ceiling_hit_ratio"],
                paper=paper, baseline_vs_paper=local["hit_ratio"] / paper["local_hit"])
