"""Paged KV cache for agentic workloads (notebook 05).

* :mod:`.blocks` -- page pool, block tables, reference counts, chained content hashes (``BlockManager``, ``KVPages``)
* :mod:`.eviction` -- LRU, the agent-aware policy, Belady's offline optimum
* :mod:`.trace` -- Mooncake-format traces and ``replay_trace``
* :mod:`.tiers` -- GPU pages -> pinned host memory -> checksummed files on disk
* :mod:`.workloads` -- reproducible chat and coding-agent workloads
* :mod:`.routing` -- round-robin vs cache-aware routing over replicas
* :mod:`.engine` -- the tiny model's generate loop on the paged cache
* kernels (loaded on first use): ``paged_decode`` (:mod:`.decode`), ``write_kv`` (:mod:`.write`),
  ``paged_prefill`` (:mod:`.prefill`); each takes FP8 (e4m3) caches with ``k_scale``/``v_scale``
  (:mod:`.paged`: ``check_kv_scales``, ``dequantize_kv``)
"""
from __future__ import annotations

import importlib

from minimax_lab.kvcache.blocks import BlockManager, KVPages, PoolExhausted, page_hash
from minimax_lab.kvcache.eviction import POLICIES, AgentPolicy, BeladyPolicy, EvictionPolicy, LRUPolicy, make_policy
from minimax_lab.kvcache.trace import ReplayResult, Request, find_trace, read_trace, replay_trace, write_trace

_LAZY = {
    "paged_decode": "minimax_lab.kvcache.decode",
    "write_kv": "minimax_lab.kvcache.write",
    "paged_prefill": "minimax_lab.kvcache.prefill",
    "check_kv_scales": "minimax_lab.kvcache.paged",
    "dequantize_kv": "minimax_lab.kvcache.paged",
}

__all__ = ["BlockManager", "KVPages", "PoolExhausted", "page_hash", "POLICIES", "AgentPolicy", "BeladyPolicy",
           "EvictionPolicy", "LRUPolicy", "make_policy", "ReplayResult", "Request", "find_trace", "read_trace",
           "replay_trace", "write_trace", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'minimax_lab.kvcache' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
