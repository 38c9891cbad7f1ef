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


#: the GPU preset's sizes: small enough that every day, rehearsed and repeated three times, fits about
#: five minutes of one H100 (``python -m minimax_lab.bench engine --preset gpu``)
GPU_SIZES = {
    "chat": dict(users=8, turns=2, system_tokens=4096, message_words=(10, 60), max_tokens=32),
    "agent": dict(sessions=2, turns=3, codebase_tokens=32_768, tool_tokens=(200, 2000), task_words=(20, 60),
                  max_tokens=32),
    "agent_long": dict(codebase_tokens=8192, tool_tokens=(1000, 2000), task_words=(20, 60), max_tokens=32, batch=32),
    # decode steps of 1, 8 and 32 sequences at two contexts, and prompts prefilled as the day prefills them
    "prices": dict(contexts=(1024, 8192), batches=(1, 8, 32), decode_steps=5, prompts=(512, 2048)),
    # one trace block (512 tokens) becomes 64 tokens: prompts of about 1.7k tokens
    "load": dict(requests=16, block_tokens=64, max_tokens=32, kv_tokens=262_144,
                 rates=(0.25, 0.5, 1, 2, 4, 8, 16, 32, 64), relative=False, slo=(1.0, 0.05), wall_rates=(1, 4, 16),
                 engine=dict(max_batch=32, step_tokens=8192)),
    # long answers into a pool of 64 pages: reserving every answer's pages up front runs few requests at once
    "preemption": dict(requests=16, prompt_tokens=(256, 1024), max_tokens=(128, 512), kv_tokens=4096,
                       rates=(1, 2, 4, 8, 16), relative=False, slo=(1.0, 0.05), wall_rates=(4, 16), days=(6, 7),
                       engine=dict(max_batch=32, step_tokens=8192)),
    "engine": dict(max_batch=32, step_tokens=16_384),
    "cases": ("prices", "agent_long", "load", "preemption"),
}
#: the CPU preset's sizes: the tiny model in Triton's interpreter (every key of the GPU preset's)
CPU_SIZES = {
    "chat": dict(users=2, turns=1, system_tokens=28, message_words=(2, 3), max_tokens=2),
    "agent": dict(sessions=1, turns=2, codebase_tokens=36, tool_tokens=(3, 5), task_words=(1, 2), max_tokens=2),
    "agent_long": dict(codebase_tokens=40, tool_tokens=(3, 5), task_words=(1, 2), max_tokens=3, batch=2),
    "prices": dict(contexts=(24, 48), batches=(1, 2, 4), decode_steps=2, prompts=(16,)),
    # rates are multiples of the rate one-at-a-time serving sustains (the simulated runs need no GPU time)
    "load": dict(requests=16, block_tokens=16, max_tokens=16, kv_tokens=8192, rates=(0.5, 1, 2, 4, 8, 16, 32),
                 relative=True, slo=None, wall_rates=(50, 100), engine=dict(max_batch=16, step_tokens=96)),
    "preemption": dict(requests=32, prompt_tokens=(16, 128), max_tokens=(32, 256), kv_tokens=1024,
                       rates=(1, 2, 4, 8, 16, 32), relative=True, slo=None, wall_rates=(50, 100), days=(6, 7),
                       engine=dict(max_batch=32, step_tokens=256)),
    "engine": dict(max_batch=4, step_tokens=24),
    "cases": ("prices", "agent_long", "load", "preemption"),
}


def sizes_for(preset: str) -> dict:
    """The preset's sizes (:data:`GPU_SIZES` or :data:`CPU_SIZES`: the same keys, every level)."""
    return GPU_SIZES if runtime.resolve_preset(preset) == "gpu" else CPU_SIZES


def smoke_sizes(sizes: dict) -> dict:
    """``sizes`` cut to the least that still runs every code path of every case (one short context,
    batches of 1 and 2, one decode step each, two answer tokens, four requests at two rates): a
    check that the command runs end to end, not a measurement."""
    s = {k: (dict(v) if isinstance(v, dict) else v) for k, v in sizes.items()}
    s["prices"].update(contexts=sizes["prices"]["contexts"][:1], batches=(1, 2), decode_steps=1,
                       prompts=sizes["prices"]["prompts"][:1])
    s["agent_long"].update(max_tokens=2, batch=2)
    for case in ("load", "preemption"):
        s[case].update(requests=4, rates=sizes[case]["rates"][:2], wall_rates=sizes[case]["wall_rates"][:1])
    return s


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
            record_logits: bool = True, clock=None, engine: dict | None = None, options=None,
            **overrides) -> Engine:
    """``day``'s engine (``options``, where given, instead of the day's), warmed up on a GPU."""
    dev = next(model.parameters()).device
    options = _options(model, day, sizes, engine=engine, **overrides) if options is None else options
    eng = Engine(model, options, kv_tokens=kv_tokens, max_seq_len=max_seq_len, record_logits=record_logits,
                 clock=clock)
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
