"""Paged KV cache for agents (chapter 06) and the KV cache as a distributed store (chapter 07).

* :mod:`.blocks` -- page pool, block tables, reference counts, chained content hashes (``BlockManager``, ``KVPages``)
* :mod:`.eviction` -- LRU, LFU, S3-FIFO, ARC, the agent-aware, chain and conversation policies, Belady's
  offline optimum; :mod:`.turn_stats` -- what the conversation policy learns online about returning
  conversations; :mod:`.reuse_model` -- a learned continuation predictor
* :mod:`.trace` -- Mooncake-format traces and ``replay_trace``
* :mod:`.tiers` -- GPU pages -> pinned host memory -> checksummed files on disk -> the remote pool
* :mod:`.store` -- Mooncake Store on 127.0.0.1 (master, metadata server, pool node); why it cannot start
* :mod:`.remote` -- the remote tier: content-addressed, signed blocks in the shared pool, moved with
  the client's zero-copy calls; :mod:`.pool_value` -- a block's value in the pool
* :mod:`.block_file` -- one KV block as self-describing, checksummed bytes (what a disk tier's file holds)
* :mod:`.cost` -- what a token of KV costs: the bytes it leaves in the cache and the FLOPs that recompute it
* :mod:`.pool_sim` -- a shared pool at 1-64 replicas, by trace replay; :mod:`.policy_gap` -- the
  LRU -> Belady gap each eviction policy closes
* :mod:`.workloads` -- reproducible chat, coding-agent and conversation workloads
* :mod:`.routing` -- round-robin vs cache-aware routing over replicas; pricing fetch against recompute

The kernels that read and write the pages are an operator of their own, :mod:`minimax_lab.paged_kv`;
the engine replicas that share the pool, and the pool's injected faults, live in
:mod:`minimax_lab.engine.replicas` and :mod:`minimax_lab.engine.store_faults`.
"""
from __future__ import annotations

from minimax_lab.kvcache.blocks import BlockManager, KVPages, PoolExhausted, page_hash
from minimax_lab.kvcache.eviction import (POLICIES, AgentPolicy, ARCPolicy, BeladyPolicy, ChainPolicy,
                                         ConversationPolicy, EvictionPolicy, LFUPolicy, LRUPolicy, S3FIFOPolicy,
                                         make_policy)
from minimax_lab.kvcache.trace import ReplayResult, Request, find_trace, read_trace, replay_trace, write_trace

__all__ = ["BlockManager", "KVPages", "PoolExhausted", "page_hash", "POLICIES", "AgentPolicy", "BeladyPolicy",
           "EvictionPolicy", "LRUPolicy", "LFUPolicy", "S3FIFOPolicy", "ARCPolicy", "ChainPolicy", "ConversationPolicy", "make_policy", "ReplayResult", "Request", "find_trace", "read_trace",
           "replay_trace", "write_trace"]
