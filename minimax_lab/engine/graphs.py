"""CUDA graphs for decode steps: capture the whole model once per batch-size bucket, replay each step.

An eager decode step of this model launches a few hundred small kernels; at small batch the GPU
waits on the CPU launching them. A CUDA graph records the launches once and replays them with a
single call. A graph replays fixed shapes and fixed addresses, so:

* every input lives in a **static buffer** (token ids, positions, slots, block table, lengths),
  sized for the largest bucket and the longest sequence (``max_pages`` columns);
* one graph per **bucket** of batch sizes (1, 2, 4, 8, 16, 24, 32, ... up to ``max_batch``); a step
  of ``B`` sequences runs the smallest bucket ``>= B`` and fills the extra rows with padding that
  writes and reads only the cache's scratch page (length 1) -- its logits are ignored;
* nothing inside may read a tensor back to the host: the Triton kernels run with
  ``check_values=False`` and the MoE alignment is a device kernel (hence the options demand
  ``impl="triton"`` for graphs); with an FP8 cache the scales live in the cache's own tensors
  (fixed addresses) and the index keys are quantized on the device.

The graphs share one memory pool (captured largest first, as usual) and are captured on a side
stream after two eager warm-up runs (which also compile the Triton kernels).
"""
from __future__ import annotations

import torch

from minimax_lab.engine.paged_attention import StepAttention, StepBatch


def graph_buckets(max_batch: int) -> list[int]:
    """Batch sizes that get a graph: 1, 2, 4, 8, then every 8 up to ``max_batch`` (and ``max_batch``)."""
    out = [b for b in (1, 2, 4, 8) if b < max_batch]
    out += list(range(16, max_batch, 8))
    return sorted(set(out + [max_batch]))


class DecodeGraphs:
    """Captured decode steps of ``model`` over ``cache`` (see the module docstring)."""

    def __init__(self, model, cache, *, max_batch: int, max_pages: int, msa_impl: str, paged_impl: str,
                 moe_impl: str, expert_fp8: bool = False):
        self.model, self.cache = model, cache
        self.max_pages = max_pages
        self.buckets = graph_buckets(max_batch)
        dev = cache.pages.k.device
        B = self.buckets[-1]
        ps = cache.page_size
        self.input_ids = torch.zeros(B, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(B, dtype=torch.int64, device=dev)
        self.slots = torch.full((B,), cache.scratch_page * ps, dtype=torch.int64, device=dev)
        self.block_table = torch.full((B, max_pages), -1, dtype=torch.int32, device=dev)
        self.block_table[:, 0] = cache.scratch_page
        self.seq_lens = torch.ones(B, dtype=torch.int32, device=dev)
        self.logits = torch.zeros(B, model.cfg.vocab_size, dtype=torch.float32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._impls = dict(msa_impl=msa_impl, paged_impl=paged_impl)
        self._moe = dict(moe_impl=moe_impl, expert_fp8=expert_fp8)
        pool = None
        for bs in reversed(self.buckets):
            graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._forward(bs)
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(graph, pool=pool):
                self._forward(bs)
            pool = graph.pool() if pool is None else pool
            self.graphs[bs] = graph
        torch.cuda.synchronize()

    def _forward(self, bs: int) -> None:
        batch = StepBatch(input_ids=self.input_ids[:bs], positions=self.positions[:bs], slots=self.slots[:bs],
                          n_decode=bs, decode_block_table=self.block_table[:bs], decode_seq_lens=self.seq_lens[:bs])
        attend = StepAttention(self.model.cfg, self.cache, batch, **self._impls)
        self.logits[:bs] = self.model(batch, attend, **self._moe)

    def bucket(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"a decode batch of {n} exceeds the largest graph ({self.buckets[-1]})")

    @torch.no_grad()
    def run(self, input_ids, positions, slots, block_table, seq_lens) -> torch.Tensor:
        """One decode step for ``n`` sequences: copy the inputs (device tensors, ``block_table``
        ``[n, <= max_pages]``) into the static buffers, pad to the bucket, replay; ``[n, vocab]`` logits."""
        n = input_ids.shape[0]
        bs = self.bucket(n)
        if block_table.shape[1] > self.max_pages:
            raise ValueError(f"block table of {block_table.shape[1]} pages > the graphs' {self.max_pages}")
        scratch = self.cache.scratch_page
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slots[:n].copy_(slots)
        self.seq_lens[:n].copy_(seq_lens)
        self.block_table[:n].fill_(-1)
        self.block_table[:n, :block_table.shape[1]].copy_(block_table)
        if bs > n:   # padding rows: scratch page only
            self.input_ids[n:bs].zero_()
            self.positions[n:bs].zero_()
            self.slots[n:bs].fill_(scratch * self.cache.page_size)
            self.seq_lens[n:bs].fill_(1)
            self.block_table[n:bs].fill_(-1)
            self.block_table[n:bs, 0] = scratch
        self.graphs[bs].replay()
        return self.logits[:n]
