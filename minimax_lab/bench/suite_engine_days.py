"""Bench suite ``engine``: what every case shares -- the workload sizes per preset, each day's engine
(built from the day's options, warmed up on a GPU), the rehearsal that serves a workload once
untimed before the timed engine serves it, the fields every record carries, and comparing two
days' records (:func:`day_ratio`, which refuses a rehearsed record beside an unrehearsed one).
"""
from __future__ import annotations

import dataclasses
import gc

import torch

from minimax_lab import measure, runtime
from minimax_lab.engine.config import M3Config, kv_bytes_per_token, param_count
from minimax_lab.engine.engine import Engine
from minimax_lab.engine.model_m3 import M3Model
from minimax_lab.engine.options import DAY_LABELS, DAYS, day_options


SUITE = "engine"


class MixedRehearsal(ValueError):
    """Two engine records, one rehearsed and one not, asked to be compared."""


GPU_SIZES = {
    "chat": dict(users=8, turns=2, system_tokens=4096, message_words=(10, 60), max_tokens=32),
    "agent": dict(sessions=2, turns=3, codebase_tokens=32_768, tool_tokens=(200, 2000), max_tokens=32),
    "agent_long": dict(codebase_tokens=131_072, tool_tokens=(1000, 2000), task_words=(20, 60), max_tokens=32, batch=32),
    "load": dict(requests=32, block_tokens=128, max_tokens=64, kv_tokens=262_144, rates=(0.5, 1, 2, 4, 8, 16),
                 sim_rates=(0.25, 0.5, 1, 2, 4, 8, 16, 32, 64), slo=(1.0, 0.05),
                 engine=dict(max_batch=32, step_tokens=8192)),
    "preemption": dict(requests=48, prompt_tokens=(512, 2048), max_tokens=(128, 512), kv_tokens=32_768,
                       rates=(2, 4, 8, 16), days=(6, 7), slo=(1.0, 0.05), engine=dict(max_batch=32, step_tokens=8192)),
    "engine": dict(max_batch=32, step_tokens=16_384),
    "cases": ("chat", "agent", "agent_long", "load", "preemption"),
}
CPU_SIZES = {
    "chat": dict(users=2, turns=1, system_tokens=28, message_words=(2, 3), max_tokens=2),
    "agent": dict(sessions=1, turns=2, codebase_tokens=36, tool_tokens=(3, 5), task_words=(1, 2), max_tokens=2),
    "agent_long": dict(codebase_tokens=40, tool_tokens=(3, 5), task_words=(1, 2), max_tokens=3, batch=2),
    # rates are multiples of the rate one-at-a-time serving sustains (the simulated runs need no GPU time)
    "load": dict(requests=48, block_tokens=16, max_tokens=32, kv_tokens=8192, rates=(0.5, 1, 2, 4, 8, 16, 32),
                 relative=True, engine=dict(max_batch=16, step_tokens=96)),
    "preemption": dict(requests=64, prompt_tokens=(16, 128), max_tokens=(32, 256), kv_tokens=1024,
                       rates=(1, 2, 4, 8, 16, 32), relative=True, days=(6, 7),
                       engine=dict(max_batch=32, step_tokens=256)),
    "engine": dict(max_batch=4, step_tokens=24),
    "calibrate": dict(batches=(1, 2, 4, 8), decode_steps=4, prompt_tokens=(16, 64, 160, 320)),
    "cases": ("chat", "agent", "agent_long"),
}


def sizes_for(preset: str) -> dict:
    return GPU_SIZES if runtime.resolve_preset(preset) == "gpu" else CPU_SIZES


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device) -> None:
    gc.collect()             # engines and their sequences refer to each other
    if device.type == "cuda":
        torch.cuda.empty_cache()


def day_ratio(before: dict, after: dict, *, field: str = "ms") -> float:
    """``before[field] / after[field]`` (how many times less ``after`` takes); raises
    :class:`MixedRehearsal` when one record was rehearsed and the other not, ``ValueError``
    when a value is missing."""
    if bool(before.get("rehearsed")) != bool(after.get("rehearsed")):
        which = {True: "rehearsed", False: "not rehearsed"}
        raise MixedRehearsal(f"{before.get('case')} day {before.get('day')} was {which[bool(before.get('rehearsed'))]}"
                             f", day {after.get('day')} {which[bool(after.get('rehearsed'))]}: one time includes "
                             f"compiling kernels and the other does not; re-record both the same way")
    a, b = before.get(field), after.get(field)
    if not a or not b:
        raise ValueError(f"both records need a positive {field!r}, got {a!r} and {b!r}")
    return a / b


def _options(model: M3Model, day: int, sizes: dict, *, engine: dict | None = None, **overrides):
    """``day``'s options with the batch limit and (with continuous batching) the step budget of
    ``engine`` (default ``sizes["engine"]``)."""
    engine = sizes["engine"] if engine is None else engine
    dev = next(model.parameters()).device
    opts = day_options(day, cuda_graphs_available=dev.type == "cuda", max_batch=engine["max_batch"], **overrides)
    if opts.continuous_batching:
        opts = dataclasses.replace(opts, step_tokens=engine["step_tokens"])
    return opts


def _engine(model: M3Model, day: int, sizes: dict, *, kv_tokens: int, max_seq_len: int | None = None,
            record_logits: bool = True, clock=None, engine: dict | None = None, **overrides) -> Engine:
    dev = next(model.parameters()).device
    eng = Engine(model, _options(model, day, sizes, engine=engine, **overrides), kv_tokens=kv_tokens,
                 max_seq_len=max_seq_len, record_logits=record_logits, clock=clock)
    if dev.type == "cuda":   # compile the kernels, capture the graphs (the interpreter compiles nothing)
        eng.warmup()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    return eng


def _rehearses(model: M3Model, rehearse: bool | None) -> bool:
    """Whether each day serves its workload once untimed first: ``rehearse``, by default on a GPU."""
    if rehearse is not None:
        return rehearse
    return next(model.parameters()).device.type == "cuda"


def _rehearsal(build, serve_once):
    """Serve once, untimed, on a throwaway engine (``build()``); free its page pool before the timed
    engine allocates its own. Returns what ``serve_once`` returned."""
    eng = build()
    out = serve_once(eng)
    dev = eng.device
    del eng
    _free(dev)
    return out


def _base_extra(model: M3Model, day: int, eng: Engine, workload: dict, rehearsed: bool) -> dict:
    cfg: M3Config = model.cfg
    return {"day": day, "switch": DAYS[day][0], "label": DAY_LABELS[day], "options": eng.options.to_dict(),
            "weights_gib": eng.weight_bytes() / 2**30, "rehearsed": rehearsed,
            "model": {"params": param_count(cfg), "activated_params": param_count(cfg, activated=True),
                      "layers": cfg.n_layers, "dense_layers": list(cfg.dense_layers), "d_model": cfg.d_model,
                      "heads": f"{cfg.n_heads}q/{cfg.n_kv_heads}kv x {cfg.head_dim}", "msa": f"Bk={cfg.block_size} "
                      f"topk={cfg.topk} D_idx={cfg.d_idx}", "experts": f"{cfg.top_k} of {cfg.n_experts}, "
                      f"f={cfg.d_expert}", "kv_bytes_per_token": kv_bytes_per_token(cfg)},
            "workload": workload}


def _impl(day: int, suffix: str = "") -> str:
    return f"d{day}_{DAYS[day][0]}{suffix}"


def _record(case: str, impl: str, ms: float | None, extra: dict, dtype) -> list[dict]:
    if ms is None or not ms > 0:
        return []
    return [measure.make_record(SUITE, case, impl, ms, dtype=dtype, extra=extra)]


def _emit(records: list, sink) -> list[dict]:
    if sink is not None and records:
        sink(records)
    return records
