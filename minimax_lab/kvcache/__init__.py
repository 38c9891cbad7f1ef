"""Paged KV cache for agentic workloads (notebook 05).

* :mod:`.blocks` -- page pool, block tables, reference counts, chained content hashes (``BlockManager``, ``KVPages``)
* :mod:`.eviction` -- LRU, the agent-aware policy, Belady's offline optimum
* :mod:`.trace` -- Mooncake-format traces and ``replay_trace``
* :mod:`.tiers` -- GPU pages -> pinned host memory -> checksummed files on disk
* :mod:`.workloads` -- reproducible chat and coding-agent workloads
* :mod:`.routing` -- round-robin vs cache-aware routing over replicas
* kernels: ``paged_decode`` (:mod:`.decode`), ``write_kv`` (:mod:`.write`),
  ``paged_prefill`` (:mod:`.prefill`); each takes FP8 (e4m3) caches with ``k_scale``/``v_scale``
  (:mod:`.paged`: ``check_kv_scales``, ``dequantize_kv``)
"""
from __future__ import annotations

from minimax_lab.kvcache.blocks import BlockManager, KVPages, PoolExhausted, page_hash
from minimax_lab.kvcache.decode import paged_decode
from minimax_lab.kvcache.eviction import POLICIES, AgentPolicy, BeladyPolicy, EvictionPolicy, LRUPolicy, make_policy
from minimax_lab.kvcache.paged import check_kv_scales, dequantize_kv
from minimax_lab.kvcache.prefill import paged_prefill
from minimax_lab.kvcache.trace import ReplayResult, Request, find_trace, read_trace, replay_trace, write_trace
from minimax_lab.kvcache.write import write_kv

__all__ = ["BlockManager", "KVPages", "PoolExhausted", "page_hash", "POLICIES", "AgentPolicy", "BeladyPolicy",
           "EvictionPolicy", "LRUPolicy", "make_policy", "ReplayResult", "Request", "find_trace", "read_trace",
           "replay_trace", "write_trace", "paged_decode", "write_kv", "paged_prefill", "check_kv_scales",
           "dequantize_kv"]
