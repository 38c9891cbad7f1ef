"""Bench suite ``engine``: the day-by-day waterfall of the M3-shaped model, and the engine under load.

``run(preset, cases=..., days=...)`` builds the model once (random weights, seed 0) and, for each
case and each day (:data:`minimax_lab.engine.options.DAYS`), a fresh :class:`Engine` with that
day's options (on a GPU warmed up: kernels compiled, graphs captured, statistics reset).

**Rehearsal.** Triton compiles a kernel the first time it meets a new specialization, and a
process's compile cache then serves every later engine, so an unrehearsed day's times depend on
which days ran before it. With ``rehearse`` (the default on a GPU, for every day, day 0
included) a day first serves the same workload on a throwaway engine, untimed; then a fresh
engine (its prefix cache empty) serves it timed. The throwaway run's times are kept as the
**first-call** columns (``first_call_*``: what the same work cost the first time in this
process). Every record says ``rehearsed``; :func:`day_ratio` refuses to compare a rehearsed
record with an unrehearsed one (:class:`MixedRehearsal`).

Cases and records (``ms`` is the value named; ``extra`` holds the rest):

* ``chat``, ``agent`` -- sessions served turn by turn (:mod:`minimax_lab.engine.workloads`):
  ``<case>.ttft`` (mean time to first token), ``<case>.itl`` (mean inter-token latency),
  ``<case>.e2e`` (wall time of the workload). Every day after day 0 answers with day 0's tokens
  (forced), so its logits are compared on the same contexts: ``logits_rel_err`` (pooled),
  ``token_err_p50`` / ``token_err_max`` (one token's logits), ``top1_agreement``. On the FP8
  day ``chat.e2e`` also carries ``fp8_breakdown`` (:func:`minimax_lab.engine.quality.fp8_breakdown`).
* ``agent_long`` -- one agent on a ``codebase_tokens`` context: ``.ttft_first`` (the first turn,
  the whole context prefilled), ``.decode`` (median step of the day's decode batch at that
  context: the session forked ``batch - 1`` times, forks counting against the day's batch limit,
  so a day that serves one request at a time decodes one sequence; ``extra`` holds
  ``decode_batch``, the step's bytes and FLOPs (:mod:`minimax_lab.engine.traffic`) and the
  bandwidth they imply), ``.ttft_followup`` (the next turn, a tool result appended).
* ``load`` -- Mooncake's trace scaled to the model (:func:`~minimax_lab.engine.arrivals.mooncake_arrivals`)
  at each rate: ``load_mooncake.r<rate>``, ms = p99 TTFT, ``extra`` all of
  :func:`~minimax_lab.engine.load.load_metrics` under the stated ``slo`` (how it was set:
  ``slo_rule``). A GPU serves it on the wall clock, then fits the day's
  :class:`~minimax_lab.engine.clock.StepCost` to the steps it
  measured (record ``step_cost``, ms = one batch-1 decode step's price) and replays the sweep on a
  simulated clock at those prices (impl suffix ``_sim``) -- a check of the simulation against the
  real run. The CPU preset only simulates: with the day's recorded H200 step prices when they
  exist (the GPU-size model, on the ``meta`` device), else with prices fitted to this machine's
  steps of the PyTorch (day 0) model, the same for every day (``prices`` says which).
* ``preemption`` -- decode-heavy Poisson arrivals into a tight KV pool, on the days with
  continuous batching: reserve up front vs preemption by recompute vs by swap
  (``preempt_poisson.r<rate>``, impl ``d<day>_<switch>_<policy>``).

Every record carries the day's number, switch and label, the options, the model's size and the
workload's. ``python -m minimax_lab.bench engine [--preset P] [--cases ...] [--days ...] [--rehearse
| --no-rehearse] [--out FILE] [--no-record]`` (the command line writes each day's records as soon
as that day is done).
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import time

import torch

from minimax_lab import measure, runtime
from minimax_lab.engine.arrivals import mooncake_arrivals, poisson_arrivals
from minimax_lab.engine.clock import SimulatedClock, StepCost, StepShape, chunk_pairs
from minimax_lab.engine.config import GPU, M3Config, kv_bytes_per_token, m3_config, param_count
from minimax_lab.engine.engine import Engine
from minimax_lab.engine.model_m3 import M3Model
from minimax_lab.engine.options import DAY_LABELS, DAYS, day_index, day_options
from minimax_lab.engine.quality import fp8_breakdown, turns_to_rescore
from minimax_lab.engine.sampling import SamplingParams
from minimax_lab.engine.sequence import Status
from minimax_lab.engine.traffic import decode_step_bytes, decode_step_flops
from minimax_lab.engine.load import SLO, load_metrics, serve_arrivals
from minimax_lab.engine.workloads import (RunResult, TurnResult, agent_sessions, chat_sessions, quality, serve,
                                          summarize)
from minimax_lab.bench.suite_kvcache_tiers import measure_host_device_bandwidth

SUITE = "engine"
CASES = ("chat", "agent", "agent_long", "load", "preemption")
PRICE_DEVICE = "NVIDIA H200"


#: what the bench report checks in this suite's records (``minimax_lab.bench.report.evaluate_targets``):
#: the bf16 days give day 0's answers; the FP8 day stays close
TARGETS = (
    {"what": "chat, continuous batching: top-1 = day 0", "case": "chat.e2e", "impl": "d6_continuous_batching",
     "metric": "top1_agreement", "at_least": 0.99},
    {"what": "agent, continuous batching: top-1 = day 0", "case": "agent.e2e", "impl": "d6_continuous_batching",
     "metric": "top1_agreement", "at_least": 0.99},
    {"what": "chat, FP8: median token's logits error vs day 0", "case": "chat.e2e", "impl": "d7_fp8",
     "metric": "token_err_p50", "at_most": 0.05},
)


class MixedRehearsal(ValueError):
    """Two engine records, one rehearsed and one not, asked to be compared."""


def _day(text: str):
    return int(text) if text.isdigit() else text


#: options of :func:`run` as ``python -m minimax_lab.bench engine`` arguments
OPTIONS = {"days": dict(type=_day, nargs="+", metavar="DAY", help="day numbers or names (default: all)"),
           "rehearse": dict(action=argparse.BooleanOptionalAction,
                            help="serve each day once untimed before timing it (default: on a GPU)")}

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


# ---------------------------------------------------------------------------------------------- engines


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


def _forced(run: RunResult) -> dict:
    return {(t.session, t.turn): tuple(t.output) for t in run.turns}


# ---------------------------------------------------------------------------------------------- chat, agent


def run_workload(case: str, model: M3Model, days: list, sizes: dict, *, verbose: bool = True, sink=None,
                 rehearse: bool | None = None) -> list[dict]:
    """Serve ``case`` (``"chat"`` or ``"agent"``) on every day in ``days``; the records (each day's
    also handed to ``sink`` as soon as that day is done, if given)."""
    cfg = model.cfg
    w = sizes[case]
    sessions = chat_sessions(cfg, **w) if case == "chat" else agent_sessions(cfg, **w)
    longest = max(sum(len(t.text) + t.max_tokens for t in s.turns) for s in sessions)
    kv_tokens = len(sessions) * (longest + 2 * cfg.block_size) + 4 * cfg.block_size * sizes["engine"]["max_batch"]
    max_seq_len = min(cfg.max_seq_len, longest + 64)
    rehearsed = _rehearses(model, rehearse)
    records, ref, forced = [], None, None
    for day in days:
        build = lambda: _engine(model, day, sizes, kv_tokens=kv_tokens, max_seq_len=max_seq_len)  # noqa: E731
        first = _rehearsal(build, lambda e: summarize(serve(e, sessions, forced=forced), e)) if rehearsed else {}
        eng = build()
        run = serve(eng, sessions, forced=forced)
        s = summarize(run, eng)
        if day == 0:
            ref, forced = run, _forced(run)
        if ref is not None:
            s.update(quality(run, ref))
        extra = {**_base_extra(model, day, eng, w, rehearsed), **s,
                 **{f"first_call_{k}": first.get(k) for k in ("ttft_mean_ms", "itl_mean_ms", "wall_s") if first}}
        if case == "chat" and eng.options.kv_dtype is not None and ref is not None:
            extra["fp8_breakdown"] = chat_breakdown(model, sizes, forced=forced)
        metrics = [("ttft", s.get("ttft_mean_ms")), ("itl", s.get("itl_mean_ms")), ("e2e", run.wall_s * 1e3)]
        records += _emit([r for m, ms in metrics for r in _record(f"{case}.{m}", _impl(day), ms, extra,
                                                                   cfg.torch_dtype)], sink)
        if verbose:
            print(f"[engine] {case:10s} d{day} {DAYS[day][0]:20s} TTFT {s.get('ttft_mean_ms', 0):9.2f} ms  "
                  f"ITL {s.get('itl_mean_ms') or 0:8.2f} ms  decode {s.get('decode_tok_s') or 0:8.1f} tok/s  "
                  f"cached {s['cached_tokens']:7d}/{s['prompt_tokens']:7d}  wall {run.wall_s:7.2f} s  "
                  f"top1 {s.get('top1_agreement', float('nan')):.4f}", flush=True)
        del eng
        _free(next(model.parameters()).device)
    return records


def chat_breakdown(model: M3Model, sizes: dict, *, forced: dict | None = None) -> list[dict]:
    """:func:`~minimax_lab.engine.quality.fp8_breakdown` of the ``chat`` workload's turns, served on
    day 0 (answers ``forced`` where given)."""
    cfg = model.cfg
    sessions = chat_sessions(cfg, **sizes["chat"])
    longest = max(sum(len(t.text) + t.max_tokens for t in s.turns) for s in sessions)
    eng = Engine(model, day_options(0), kv_tokens=len(sessions) * (longest + 2 * cfg.block_size),
                 max_seq_len=min(cfg.max_seq_len, longest + 64), record_logits=True)
    return fp8_breakdown(model, turns_to_rescore(serve(eng, sessions, forced=forced), eng))


# ---------------------------------------------------------------------------------------------- agent_long


def _run_until(eng: Engine, done) -> None:
    while not done():
        eng.step()


def _serve_long(eng: Engine, t0, t1, B: int, M: int, forced: dict):
    """One ``agent_long`` session on ``eng``: the first turn, ``B - 1`` forks decoding beside it, the
    follow-up turn. Returns ``(seq0, seq1, ttft_first_s, decode step times in ms at batch B)``."""
    first = eng.add_request(t0.text, sampling=SamplingParams(max_tokens=M, forced_tokens=forced.get(0)),
                            request_id="turn0")
    seq0 = eng.sequences[first]
    _run_until(eng, lambda: seq0.status is not Status.PREFILL and seq0.status is not Status.WAITING)
    ttft_first = seq0.first_token - seq0.arrival
    for i in range(B - 1):
        eng.fork(first, ("fork", i))
    n_before = len(eng.step_times)
    _run_until(eng, lambda: not eng.has_work())
    step_ms = [st.seconds * 1e3 for st in eng.step_times[n_before:] if st.decodes == B and st.tokens == B]
    prompt1 = seq0.prompt + seq0.output + t1.text
    follow = eng.add_request(prompt1, images=t1.images, sampling=SamplingParams(max_tokens=M,
                                                                                  forced_tokens=forced.get(1)),
                             request_id="turn1")
    eng.run()
    return seq0, eng.sequences[follow], ttft_first, step_ms


def decode_batch(model: M3Model, day: int, sizes: dict) -> int:
    """The ``agent_long`` decode batch of ``day``: the workload's, within the day's batch limit
    (one sequence at a time without continuous batching)."""
    opts = _options(model, day, sizes)
    return min(sizes["agent_long"]["batch"], opts.max_batch if opts.continuous_batching else 1)


def run_long(model: M3Model, days: list, sizes: dict, *, verbose: bool = True, sink=None,
             rehearse: bool | None = None) -> list[dict]:
    """The ``agent_long`` case (module docstring) on every day in ``days``; the records (each day's
    also handed to ``sink`` as soon as that day is done, if given)."""
    cfg = model.cfg
    w = sizes["agent_long"]
    M = w["max_tokens"]
    if M < 2 or w["batch"] < 1:
        raise ValueError(f"agent_long needs max_tokens >= 2 (a first token, then decode steps) and batch >= 1, got {w}")
    sess = agent_sessions(cfg, sessions=1, turns=2, codebase_tokens=w["codebase_tokens"],
                          tool_tokens=w["tool_tokens"], task_words=w["task_words"], max_tokens=M)[0]
    t0, t1 = sess.turns
    longest = len(t0.text) + M + len(t1.text) + M
    kv_tokens = longest + w["batch"] * (M + 2 * cfg.block_size) + 8 * cfg.block_size
    max_seq_len = min(cfg.max_seq_len, longest + 64)
    rehearsed = _rehearses(model, rehearse)
    records, ref, forced = [], None, {}
    for day in days:
        B = decode_batch(model, day, sizes)
        build = lambda: _engine(model, day, sizes, kv_tokens=kv_tokens, max_seq_len=max_seq_len)  # noqa: E731

        def once(e, B=B):
            s0, s1, ttft, steps = _serve_long(e, t0, t1, B, M, forced)
            return {"ttft_first_ms": ttft * 1e3, "ttft_followup_ms": (s1.first_token - s1.arrival) * 1e3,
                    "decode_ms": statistics.median(steps) if steps else None}
        first = _rehearsal(build, once) if rehearsed else {}
        eng = build()
        seq0, seq1, ttft_first, step_ms = _serve_long(eng, t0, t1, B, M, forced)
        run = RunResult([TurnResult(0, k, s.seq_id, s.prompt_len, s.cached_tokens, list(s.output),
                                    s.first_token - s.arrival, [], torch.stack(s.logits[:M]))
                         for k, s in enumerate((seq0, seq1))])
        if day == 0:
            ref, forced = run, {0: tuple(seq0.output), 1: tuple(seq1.output)}
        q = quality(run, ref) if ref is not None else {}
        step = statistics.median(step_ms) if step_ms else None
        context = len(t0.text) + M // 2
        traffic = decode_step_bytes(cfg, batch=B, context=context, kv_dtype=eng.options.kv_dtype,
                                    expert_dtype=eng.options.expert_dtype)
        flops = decode_step_flops(cfg, batch=B, context=context)
        extra = {**_base_extra(model, day, eng, {**w, "context_tokens": len(t0.text)}, rehearsed), **q,
                 "ttft_first_ms": ttft_first * 1e3, "ttft_followup_ms": (seq1.first_token - seq1.arrival) * 1e3,
                 "followup_cached_tokens": seq1.cached_tokens, "followup_prompt_tokens": seq1.prompt_len,
                 "decode_batch": B, "decode_steps_timed": len(step_ms), "decode_context": context,
                 "decode_tok_s": B / (step * 1e-3) if step else None, "kv_cache_gib": eng.kv_bytes() / 2**30,
                 "decode_bytes_per_step": traffic["total"], "decode_weight_bytes": traffic["weights"],
                 "decode_kv_bytes": traffic["kv"], "decode_flops_per_step": flops,
                 "decode_gbps": traffic["total"] / (step * 1e-3) / 1e9 if step else None,
                 **{f"first_call_{k}": v for k, v in first.items()}}
        if eng.device.type == "cuda":
            extra["peak_memory_gib"] = torch.cuda.max_memory_allocated(eng.device) / 2**30
        metrics = [("ttft_first", ttft_first * 1e3), ("decode", step), ("ttft_followup", extra["ttft_followup_ms"])]
        records += _emit([r for m, ms in metrics for r in _record(f"agent_long.{m}", _impl(day), ms, extra,
                                                                   cfg.torch_dtype)], sink)
        if verbose:
            print(f"[engine] agent_long d{day} {DAYS[day][0]:20s} TTFT first {ttft_first * 1e3:10.1f} ms  "
                  f"follow-up {extra['ttft_followup_ms']:9.1f} ms (cached {seq1.cached_tokens})  decode B={B} "
                  f"{(step or 0):7.2f} ms/step  top1 {q.get('top1_agreement', float('nan')):.4f}", flush=True)
        del eng
        _free(next(model.parameters()).device)
    return records


# ---------------------------------------------------------------------------------------------- load


def fit_step_cost(step_times: list, *, host_gbps: float | None = None, source: str = "") -> StepCost:
    """The :class:`StepCost` that fits an engine's measured ``step_times``."""
    return StepCost.fit([(st.shape, st.seconds * 1e3) for st in step_times], host_gbps=host_gbps, source=source)


def host_bandwidth_gbps(device) -> float:
    """The measured bandwidth of copying pages to and from the host: pinned host <-> GPU on a GPU,
    a host memory copy (read + write) on the CPU."""
    if device.type == "cuda":
        bw = measure_host_device_bandwidth(device=device)
        return min(bw["h2d_pinned"], bw["d2h_pinned"])
    src = torch.randn(16 * 2**20)
    dst = torch.empty_like(src)
    t = measure.time_fn(lambda a, b: b.copy_(a), inputs={"a": src, "b": dst}, reps=10, rotate=False)
    return src.nbytes / (t.ms * 1e-3) / 1e9


def _timed_steps(model: M3Model, opts, prompts: list, max_tokens: int, repeats: int) -> list:
    """``(shape, ms)`` of every step of serving ``prompts`` (all present at the start) on the wall
    clock, each step's time its fastest of ``repeats`` runs (the same plan every time; the fastest
    is the least disturbed by other work on the machine)."""
    runs = []
    for _ in range(repeats):
        eng = Engine(model, opts, kv_tokens=4 * model.cfg.block_size * (len(prompts) + sum(map(len, prompts))))
        for i, p in enumerate(prompts):
            eng.add_request(p, sampling=SamplingParams(max_tokens=max_tokens), request_id=i)
        eng.run()
        runs.append(eng.step_times)
    return [(steps[0].shape, min(st.seconds for st in steps) * 1e3) for steps in zip(*runs)]


def calibrate_cpu(model: M3Model, sizes: dict, *, repeats: int = 3) -> StepCost:
    """Prices of this machine's steps of ``model`` in PyTorch (day 0's kernels): decode-only steps
    at batches of ``sizes["calibrate"]["batches"]`` and whole prompts of ``prompt_tokens`` tokens,
    timed on the wall clock (fastest of ``repeats``), then fitted."""
    c = sizes["calibrate"]
    vocab = model.cfg.vocab_size - 1
    samples = []
    for b in c["batches"]:
        opts = dataclasses.replace(day_options(0), continuous_batching=True, max_batch=b, step_tokens=8 * b + 1)
        prompts = [[(7 * i + j) % vocab for j in range(8)] for i in range(b)]
        samples += _timed_steps(model, opts, prompts, c["decode_steps"] + 1, repeats)
    for n in c["prompt_tokens"]:
        samples += _timed_steps(model, day_options(0), [[(3 * j) % vocab for j in range(n)]], 1, repeats)
    return StepCost.fit(samples, host_gbps=host_bandwidth_gbps(torch.device("cpu")),
                        source=f"{runtime.device_name()}: day 0 (PyTorch) steps, every day")


def recorded_step_costs() -> dict:
    """``{day: StepCost}`` from the recorded H200 ``step_cost`` records (empty if none)."""
    out = {}
    for r in measure.load_records(PRICE_DEVICE, suite=SUITE):
        if r.get("case") == "step_cost" and isinstance(r.get("day"), int) and r.get("step_cost"):
            out[r["day"]] = StepCost.from_dict({**r["step_cost"], "source": f"{PRICE_DEVICE}: day {r['day']}'s steps"})
    return out


def sweep_prices(model: M3Model, sizes: dict) -> tuple:
    """``(config, {day: StepCost}, sizes)`` a simulated sweep uses: the GPU-size model and
    workloads (:data:`GPU_SIZES`) at the recorded H200 prices where there are any, else
    ``model``'s own size and ``sizes`` at prices measured now on this machine
    (:func:`calibrate_cpu`, the same for every day)."""
    prices = recorded_step_costs()
    if prices:
        return GPU, prices, GPU_SIZES
    cost = calibrate_cpu(model, sizes)
    return model.cfg, {d: cost for d in range(len(DAYS))}, sizes


def timeline(cfg: M3Config, cost: StepCost, day: int, arrivals: list, *, kv_tokens: int, max_batch: int,
             step_tokens: int, preemption: str | None = None) -> dict:
    """Serve ``arrivals`` on a simulated engine of ``day`` and return its steps, each
    ``{start, end, decodes, prefills, preempted}`` (request indices), with each request's arrival
    and finish -- the events a timeline draws."""
    shell = M3Model.create(cfg, "meta")
    opts = day_options(day, cuda_graphs_available=False, max_batch=max_batch, preemption=preemption)
    if opts.continuous_batching:
        opts = dataclasses.replace(opts, step_tokens=step_tokens)
    eng = Engine(shell, opts, kv_tokens=kv_tokens, clock=SimulatedClock(cost),
                 max_seq_len=max(len(a.prompt) + a.max_tokens for a in arrivals) + 64)
    steps = []

    def on_step(e):
        p, st = e.last_plan, e.step_times[-1]
        end = e.clock.now()
        steps.append({"start": end - st.seconds, "end": end, "decodes": [s.seq_id[-1] for s in p.decodes],
                      "prefills": [s.seq_id[-1] for s, _, _ in p.prefills],
                      "preempted": [s.seq_id[-1] for s in p.preempted]})
    res = serve_arrivals(eng, arrivals, on_step=on_step)
    return {"steps": steps, "arrivals": [s.arrival for s in res.sequences],
            "finished": [s.finished for s in res.sequences], "preemptions": res.preemptions}


def timeline_example(model: M3Model, sizes: dict, *, requests: int = 10, seed: int = 2) -> dict:
    """A small run to draw (:func:`timeline`): ``requests`` Poisson arrivals (prompts of 1-6 pages,
    answers of 2-4 pages) on day 6 with preemption by recompute, in a pool of 16 pages, at about
    three times the rate one-at-a-time serving sustains, priced as the sweeps are (:func:`sweep_prices`)."""
    cfg, prices, _ = sweep_prices(model, sizes)
    day = max(prices) if 6 not in prices else 6
    ps = cfg.block_size
    probe = poisson_arrivals(cfg, requests, 1.0, prompt_tokens=(ps, 6 * ps), max_tokens=(2 * ps, 4 * ps), seed=seed)
    rate = 3 * one_at_a_time_rate(prices[day], probe)
    arrivals = poisson_arrivals(cfg, requests, rate, prompt_tokens=(ps, 6 * ps), max_tokens=(2 * ps, 4 * ps),
                                seed=seed)
    out = timeline(cfg, prices[day], day, arrivals, kv_tokens=16 * ps, max_batch=8, step_tokens=4 * ps,
                   preemption="recompute")
    return {**out, "day": day, "prices": prices[day].source}


def one_at_a_time_rate(cost: StepCost, arrivals: list) -> float:
    """Requests per second one-at-a-time serving sustains at ``cost``: one over a request's mean
    time alone (its prompt in one step, then a decode step per further token)."""
    total = 0.0
    for a in arrivals:
        n = len(a.prompt)
        t = cost.ms(StepShape(prefill_tokens=n, attended=chunk_pairs(0, n)))
        t += sum(cost.ms(StepShape(decodes=1, attended=n + i)) for i in range(1, a.max_tokens))
        total += t
    return len(arrivals) / (total / 1e3)


def _slo(w: dict, cost: StepCost, arrivals: list) -> SLO:
    """The sweep's SLO: the sizes' ``slo`` (seconds) where given, else scaled from the prices: TTFT
    within 10x the median prompt's prefill alone, time per token within 2x the price of a full step
    (a ``step_tokens`` prompt chunk beside ``max_batch`` decodes, at the median prompt's context)."""
    if "slo" in w:
        return SLO(*w["slo"])
    prompts = sorted(len(a.prompt) for a in arrivals)
    n = prompts[len(prompts) // 2]
    prefill = cost.ms(StepShape(prefill_tokens=n, attended=chunk_pairs(0, n))) / 1e3
    e = w["engine"]
    full = cost.ms(StepShape(decodes=e["max_batch"], prefill_tokens=e["step_tokens"],
                             attended=e["max_batch"] * n + chunk_pairs(n, n + e["step_tokens"]))) / 1e3
    return SLO(10 * prefill, 2 * full)


def slo_rule(w: dict) -> str:
    """How :func:`_slo` set a sweep's SLO, in words (recorded as ``slo_rule``)."""
    if "slo" in w:
        return "fixed by the bench for the GPU-size model"
    return ("set from the step prices: TTFT within 10x the median prompt's prefill alone, time per token "
            "within 2x a full step")


def _kv_tokens(cfg: M3Config, base: int, kv_dtype: str | None) -> int:
    """``base`` tokens of the model's dtype, as many FP8 tokens as the same bytes hold."""
    return base * kv_bytes_per_token(cfg) // kv_bytes_per_token(cfg, kv_dtype) if kv_dtype else base


def _load_record(case: str, impl: str, m: dict, extra: dict, dtype) -> list[dict]:
    return _record(case, impl, m["ttft_p99_ms"], {**extra, **m}, dtype)


def run_load(model: M3Model, days: list, sizes: dict, *, verbose: bool = True, sink=None,
             rehearse: bool | None = None, case: str = "load", wall_clock: bool | None = None) -> list[dict]:
    """The ``load`` or ``preemption`` case (module docstring) on ``days``; the records (each day's
    also handed to ``sink``). ``wall_clock``: serve on the wall clock and fit the prices to it
    (default: on a GPU), else simulate only."""
    dev = next(model.parameters()).device
    real = dev.type == "cuda" if wall_clock is None else wall_clock
    if real:
        cfg, prices, host_gbps = model.cfg, {}, host_bandwidth_gbps(dev)
    else:
        cfg, prices, sizes = sweep_prices(model, sizes)
    w = sizes[case]
    if case == "preemption":
        days = [d for d in days if d in w["days"]]
    policies = (None, "recompute", "swap") if case == "preemption" else (None,)
    shell = M3Model.create(cfg, "meta")
    records = []
    for day in days:
        if not real and day not in prices:
            if verbose:
                print(f"[engine] {case}: no step prices for day {day}; skipped", flush=True)
            continue

        def arrivals_at(rate, cfg=cfg):
            if case == "load":
                return mooncake_arrivals(cfg, w["requests"], rate=rate, block_tokens=w["block_tokens"],
                                         max_tokens=w["max_tokens"])
            return poisson_arrivals(cfg, w["requests"], rate, prompt_tokens=w["prompt_tokens"],
                                    max_tokens=w["max_tokens"])
        probe = arrivals_at(1.0)      # prompts and answer lengths do not depend on the rate
        for policy in policies:
            suffix = "" if case == "load" else f"_{policy or 'reserve'}"
            kv_dtype = day_options(day).kv_dtype
            kv_tokens = _kv_tokens(cfg, w["kv_tokens"], kv_dtype)
            max_seq_len = min(cfg.max_seq_len, max(len(a.prompt) + a.max_tokens for a in probe) + 64)
            base = {"arrivals": "mooncake" if case == "load" else "poisson", "policy": policy or "reserve",
                    "kv_tokens": kv_tokens, "requests": w["requests"]}
            if real:
                build = lambda: _engine(model, day, sizes, kv_tokens=kv_tokens, max_seq_len=max_seq_len,  # noqa: E731
                                        record_logits=False, engine=w.get("engine"), preemption=policy)
                rates = w["rates"]
                rehearsed = _rehearses(model, rehearse)
                if rehearsed:
                    _rehearsal(build, lambda e: serve_arrivals(e, arrivals_at(max(rates))))
                eng = build()
                slo = SLO(*w["slo"])
                rows = []
                for rate in rates:   # one engine (kernels compiled, graphs captured), its prefix cache emptied per rate
                    eng.blocks.evict(len(eng.blocks.policy))
                    res = serve_arrivals(eng, arrivals_at(rate), tag=("r", rate))
                    rows.append((rate, load_metrics(res, slo)))
                cost = fit_step_cost(eng.step_times, host_gbps=host_gbps, source=f"{runtime.device_name()}: "
                                     f"this day's load steps")
                extra = {**_base_extra(model, day, eng, w, rehearsed), **base, "clock": "wall",
                         "slo": dataclasses.asdict(slo), "slo_rule": slo_rule(w), "step_cost": cost.to_dict()}
                out = []
                for rate, m in rows:
                    out += _load_record(f"{case}_{base['arrivals']}.r{rate:g}", _impl(day, suffix), m,
                                        {**extra, "rate": rate}, cfg.torch_dtype)
                if case == "load":
                    ref_shape = StepShape(decodes=1, attended=int(statistics.median(len(a.prompt) for a in probe)))
                    out += _record("step_cost", _impl(day), cost.ms(ref_shape),
                                   {**extra, "reference_step": dataclasses.asdict(ref_shape)}, cfg.torch_dtype)
                del eng
                _free(dev)
            else:
                cost, out, rehearsed = prices[day], [], False
            sim_rates = w.get("sim_rates", w["rates"])
            if w.get("relative"):
                mu = one_at_a_time_rate(cost, probe)
                sim_rates = [r * mu for r in w["rates"]]
            slo = _slo(w, cost, probe)
            for rate in sim_rates:
                eng_sim = _engine(shell, day, sizes, kv_tokens=kv_tokens, max_seq_len=max_seq_len,
                                  record_logits=False, clock=SimulatedClock(cost), engine=w.get("engine"),
                                  preemption=policy)
                m = load_metrics(serve_arrivals(eng_sim, arrivals_at(rate)), slo)
                extra = {**_base_extra(shell, day, eng_sim, w, rehearsed), **base, "clock": "simulated",
                         "prices": cost.source, "slo": dataclasses.asdict(slo), "slo_rule": slo_rule(w),
                         "step_cost": cost.to_dict(), "rate": rate}
                out += _load_record(f"{case}_{base['arrivals']}.r{rate:.4g}", _impl(day, suffix + "_sim"), m, extra,
                                    cfg.torch_dtype)
                if verbose:
                    print(f"[engine] {case:10s} d{day} {suffix or '':11s} rate {rate:8.3g}/s  throughput "
                          f"{m['throughput_tok_s'] or 0:9.1f} tok/s  TTFT p50 {m['ttft_p50_ms']:9.2f} p99 "
                          f"{m['ttft_p99_ms']:9.2f} ms  ITL p99 {m['itl_p99_ms'] or 0:8.2f} ms  SLO met "
                          f"{m['slo_attainment']:.0%}  preemptions {m['preemptions']}", flush=True)
            records += _emit(out, sink)
    return records


# ---------------------------------------------------------------------------------------------- the suite


def run(preset: str = "auto", cases=None, *, days=None, sizes: dict | None = None, verbose: bool = True,
        sink=None, rehearse: bool | None = None) -> list[dict]:
    """The suite: ``cases`` (default: the preset's; any of :data:`CASES`) on ``days`` (default all,
    numbers or names), at the preset's sizes (:data:`GPU_SIZES`, :data:`CPU_SIZES`) or ``sizes``
    (a dict of the same keys). Returns the records; ``sink`` (a callable), if given, receives each
    day's records as soon as that day is done -- the CLI writes them there, so a run cut short keeps
    the days it finished. ``rehearse``: see the module docstring (``None``: on a GPU)."""
    sizes = sizes_for(preset) if sizes is None else sizes
    cases = list(sizes["cases"] if cases is None else cases)
    for c in cases:
        if c not in CASES:
            raise ValueError(f"unknown case {c!r}; choose from {CASES}")
    if days is None:
        days = list(range(len(DAYS)))
    days = sorted({day_index(d) for d in days})
    cfg = m3_config(preset)
    dev = runtime.kernel_device()
    t0 = time.perf_counter()
    model = M3Model.create(cfg, dev)
    _sync(dev)
    if verbose:
        print(f"[engine] M3-shaped model: {param_count(cfg):,} parameters, {cfg.dtype} on {dev} "
              f"(built in {time.perf_counter() - t0:.1f} s); days {days}; cases {cases}", flush=True)
    records: list[dict] = []
    for c in cases:
        t = time.perf_counter()
        kw = dict(verbose=verbose, sink=sink, rehearse=rehearse)
        if c == "agent_long":
            records += run_long(model, days, sizes, **kw)
        elif c in ("load", "preemption"):
            records += run_load(model, days, sizes, case=c, **kw)
        else:
            records += run_workload(c, model, days, sizes, **kw)
        if verbose:
            print(f"[engine] case {c}: {time.perf_counter() - t:.1f} s", flush=True)
    return records
