"""Measurements for the tier ladder and the engine slice, as ``kvcache`` bench records: the case
groups ``bandwidth`` and ``engine`` of the ``kvcache`` suite (:mod:`minimax_lab.bench.suite_kvcache`)::

    python -m minimax_lab.bench kvcache --cases bandwidth engine

* ``bandwidth`` (a GPU only): ``h2d_pinned``, ``d2h_pinned``, ``h2d_pageable``, ``d2h_pageable`` --
  256 MiB copies, GB/s;
* ``engine``: ``engine_ttft_cached`` / ``engine_ttft_nocache`` -- the engine slice on a multi-turn
  agent task (:func:`minimax_lab.engine.slice.run_agent_session`): mean time to first token per turn
  (ms), with the prefill tokens computed and the cached tokens in ``extra``.

The functions here return records; the suite's run writes none itself (the CLI does).
"""
from __future__ import annotations

import time

import torch

from minimax_lab import measure, runtime
from minimax_lab.engine.slice import PagedEngine, agent_session_chunks, run_agent_session
from minimax_lab.model import TinyMultimodalModel, preset_config

SUITE = "kvcache"


def measure_host_device_bandwidth(nbytes: int = 256 * 2**20, *, repeats: int = 10, device="cuda") -> dict:
    """Median GB/s of host->device and device->host copies, pinned and pageable host memory.

    Uses CUDA events around ``copy_`` with ``non_blocking`` for pinned buffers; returns
    ``{"h2d_pinned": GB/s, "d2h_pinned": ..., "h2d_pageable": ..., "d2h_pageable": ...}``.
    Raises ``RuntimeError`` without a GPU.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("measuring host<->device bandwidth needs a CUDA GPU")
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out = {}
    for kind in ("pinned", "pageable"):
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=(kind == "pinned"))
        for direction in ("h2d", "d2h"):
            times = []
            for i in range(repeats + 2):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                if direction == "h2d":
                    dev.copy_(host, non_blocking=(kind == "pinned"))
                else:
                    host.copy_(dev, non_blocking=(kind == "pinned"))
                e.record()
                e.synchronize()
                if i >= 2:
                    times.append(s.elapsed_time(e) / 1e3)
            times.sort()
            out[f"{direction}_{kind}"] = nbytes / times[len(times) // 2] / 1e9
    return out


def bandwidth_records(nbytes: int = 256 * 2**20) -> list[dict]:
    """The four host<->device copy bandwidths (pinned and pageable, each way) as records."""
    bw = measure_host_device_bandwidth(nbytes)
    recs = []
    for case, gbps in bw.items():
        ms = nbytes / (gbps * 1e9) * 1e3
        recs.append(measure.make_record(SUITE, case, "torch.copy_", ms, shape=dict(bytes=nbytes), dtype="uint8",
                                        bytes_moved=nbytes, extra=dict(kind="host_device_bandwidth")))
    return recs


def engine_records(preset: str = "auto", *, n_turns: int | None = None, page_size: int = 16,
                   new_tokens: int = 8, verbose: bool = True) -> tuple[list[dict], dict]:
    """Run the agent's task with and without prefix caching; records + the raw results."""
    dev = runtime.device()
    cfg = preset_config(preset)
    torch.manual_seed(0)
    model = TinyMultimodalModel(cfg).to(dev).eval()
    gpu = runtime.resolve_preset(preset) == "gpu"
    n_turns = n_turns or (12 if gpu else 6)
    base, turns = agent_session_chunks(n_turns, vocab_size=cfg.vocab_size, base_tokens=1024 if gpu else 384,
                                       turn_tokens=(40, 70))
    num_pages = cfg.max_seq_len // page_size * 2
    # warm-up (kernels, allocator) on a throwaway engine
    run_agent_session(PagedEngine(model, num_pages=num_pages, page_size=page_size), base, turns[:2], new_tokens=2)
    res = {}
    variants = [("cached", True, "torch"), ("nocache", False, "torch")]
    if gpu:
        variants.append(("cached_triton", True, "triton"))
    for name, pc, impl in variants:
        eng = PagedEngine(model, num_pages=num_pages, page_size=page_size, prefix_caching=pc, impl=impl)
        t0 = time.perf_counter()
        res[name] = run_agent_session(eng, base, turns, new_tokens=new_tokens)
        res[name]["wall_s"] = time.perf_counter() - t0
    same = res["cached"]["outputs"] == res["nocache"]["outputs"]
    recs = []
    for name, r in res.items():
        ttft_ms = [1e3 * t for t in r["ttft_s"]]
        recs.append(measure.make_record(
            SUITE, f"engine_ttft_{name}", "engine", sum(ttft_ms) / len(ttft_ms),
            shape=dict(turns=n_turns, base_tokens=len(base), final_length=r["final_length"], page_size=page_size,
                       d_model=cfg.d_model, n_layers=cfg.n_layers),
            dtype=next(model.parameters()).dtype,
            extra=dict(prefill_tokens=r["prefill_tokens"], cached_tokens=r["cached_tokens"],
                       ttft_ms_per_turn=[round(t, 3) for t in ttft_ms],
                       identical_outputs=r["outputs"] == res["nocache"]["outputs"],
                       session_wall_s=round(r["wall_s"], 3))))
        if verbose:
            print(f"[engine] {name:8s} prefill {r['prefill_tokens']:6d} tokens, cached {r['cached_tokens']:6d}, "
                  f"mean TTFT {sum(ttft_ms) / len(ttft_ms):7.2f} ms, last turn {ttft_ms[-1]:7.2f} ms")
    if verbose:
        print(f"[engine] identical outputs with and without prefix caching: {same}")
    return recs, res
