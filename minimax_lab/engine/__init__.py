"""Engines, above the model and the kernels: one M3-shaped model served end to end, every
optimization a switch (chapter 09), and the tiny model's engine slice (chapter 06).

* :mod:`.config` -- ``M3Config`` (GPU and CPU sizes, parameter and KV-byte counts)
* :mod:`.model_m3` -- ``M3Model``: early fusion, MSA and dense attention layers, MoE FFN, random weights
* :mod:`.options` -- ``EngineOptions`` and the ``DAYS`` that turn the switches on one by one (the
  last, "day 14", stores the KV cache and the experts in FP8)
* :mod:`.precision` -- what FP8 storage gives back (``fake_quantize``)
* :mod:`.paged_attention` -- the paged KV cache and each step's attention through the package's kernels
* :mod:`.scheduler` -- admission, chunked prefill, continuous batching, preemption over the block manager
* :mod:`.sequence` -- a request inside the engine
* :mod:`.sampling` -- greedy and temperature/top-p sampling from seeded generators
* :mod:`.graphs` -- CUDA graphs for decode steps, one per batch-size bucket
* :mod:`.clock` -- the engine's clock: wall time, or simulated time that prices each step
* :mod:`.engine` -- ``Engine``: requests in, tokens out, one step at a time
* :mod:`.workloads` -- chat and agent sessions served turn by turn, with their measurements
* :mod:`.arrivals` -- requests arriving over time: Poisson, or Mooncake's trace scaled to the model
* :mod:`.load` -- serving arrivals, tail latency and goodput under an SLO, rate sweeps
* :mod:`.traffic` -- the bytes and FLOPs of a decode step (its place on the roofline)
* :mod:`.quality` -- where FP8 moves the logits, and what it costs a trained model's accuracy
* :mod:`.slice` -- ``PagedEngine``: the tiny model's generate loop on the paged, prefix-shared cache

The day-by-day bench is ``minimax_lab.bench.suite_engine`` (``python -m minimax_lab.bench engine``).
"""
from minimax_lab.engine.config import M3Config, kv_bytes_per_token, m3_config, param_count
from minimax_lab.engine.engine import Engine
from minimax_lab.engine.model_m3 import M3Model
from minimax_lab.engine.options import DAY_LABELS, DAY_NAMES, DAYS, EngineOptions, day_options
from minimax_lab.engine.sampling import SamplingParams

__all__ = ["M3Config", "kv_bytes_per_token", "m3_config", "param_count", "Engine", "M3Model", "DAY_LABELS", "DAY_NAMES",
           "DAYS", "EngineOptions", "day_options", "SamplingParams"]
