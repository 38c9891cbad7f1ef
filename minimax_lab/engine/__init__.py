"""Engines, above the model and the kernels: one M3-shaped model served end to end, every
optimization a switch (notebook 07), and the tiny model's engine slice (notebook 05).

* :mod:`.config` -- ``M3Config`` (GPU and CPU sizes, parameter and KV-byte counts)
* :mod:`.model_m3` -- ``M3Model``: early fusion, MSA and dense attention layers, MoE FFN, random weights
* :mod:`.options` -- ``EngineOptions`` and the ``DAYS`` that turn the switches on one by one (the
  last, "day 14", stores the KV cache and the experts in FP8)
* :mod:`.precision` -- what FP8 storage gives back (``fake_quantize``)
* :mod:`.paged_attention` -- the paged KV cache and each step's attention through the package's kernels
* :mod:`.scheduler` -- admission, chunked prefill, continuous batching over the block manager
* :mod:`.sampling` -- greedy and temperature/top-p sampling from seeded generators
* :mod:`.graphs` -- CUDA graphs for decode steps, one per batch-size bucket
* :mod:`.engine` -- ``Engine``: requests in, tokens out, one step at a time
* :mod:`.workloads` -- chat and agent sessions served turn by turn, with their measurements
* :mod:`.bench` -- the day-by-day waterfall as bench records (``python -m minimax_lab.bench engine``)
* :mod:`.slice` -- ``PagedEngine``: the tiny model's generate loop on the paged, prefix-shared cache
"""
from minimax_lab.engine.config import M3Config, kv_bytes_per_token, m3_config, param_count
from minimax_lab.engine.engine import Engine
from minimax_lab.engine.model_m3 import M3Model
from minimax_lab.engine.options import DAY_LABELS, DAY_NAMES, DAYS, EngineOptions, day_options
from minimax_lab.engine.sampling import SamplingParams

__all__ = ["M3Config", "kv_bytes_per_token", "m3_config", "param_count", "Engine", "M3Model", "DAY_LABELS", "DAY_NAMES",
           "DAYS", "EngineOptions", "day_options", "SamplingParams"]
