"""Bench suite ``engine``: the day-by-day waterfall of the M3-shaped model on chat and agent workloads.

``run(preset, cases=..., days=...)`` builds the model once (random weights, seed 0) and, for each
case and each day (:data:`minimax_lab.engine.options.DAYS`), a fresh :class:`Engine` with that
day's options; on a GPU it warms the engine up (kernels compiled, graphs captured, statistics
reset); it serves the workload and records:

* ``<case>.ttft`` -- ms = mean time to first token (submission to first token; one request at a
  time, a turn also waits for the turns queued before it);
* ``<case>.itl`` -- ms = mean inter-token latency;
* ``<case>.e2e`` -- ms = wall time of the whole workload; ``extra`` holds decode tokens/s (tokens
  of decode-only steps over their time, one GPU), output tokens/s, prompt tokens computed and
  served by the prefix cache, the KV pool's bytes (``kv_cache_gib``), the weights' (``weights_gib``:
  the experts counted in FP8 on the FP8 day) and the peak allocated memory, and the quality
  against day 0: every day after day 0 answers with day 0's tokens (forced), so its logits are
  compared on the same contexts -- ``logits_rel_err`` and ``top1_agreement`` (the FP8 day's are
  what FP8 costs; the other days' are rounding-order noise), and ``rehearsed`` (below).

Case ``agent_long``: one agent session on a ``codebase_tokens`` context (128k on the GPU):
``.ttft_first`` (the first turn: the whole context prefilled), ``.decode_b<B>`` (ms = median step
of ``B`` sequences decoding at that context, ``max_tokens - 1`` steps: the session forked ``B - 1``
times after its first token -- forks share the context's pages, each kernel still reads every
sequence's context through its own block table; shared pages may stay in L2 where distinct ones
would not), ``.ttft_followup`` (the next turn: a tool result appended; with prefix caching only
the new tokens are computed).

Sizes (:data:`GPU_SIZES`, :data:`CPU_SIZES`). GPU: chat = 8 users x 2 turns on a 4,096-token system
prompt; agent = 2 sessions x 3 turns on a 32,768-token codebase (tool results of 200-2,000
tokens); agent_long = 131,072 tokens, batch 32; answers of 32 tokens; continuous batching with
16,384-token steps. On an H200 ``agent_long`` takes about 5 minutes over all days (4.6 without
rehearsals; day 0's PyTorch prefill of the 128k context, twice, is half of it) and ``chat`` plus
``agent`` about as long, so ``--cases``/``--days`` run it in parts that fit a time limit. CPU:
the same workloads scaled down to a few dozen tokens per prompt and 2- or 3-token answers (Triton's
interpreter costs a fraction of a second per kernel launch); about two minutes on two cores for
every day and case.

Compilation is not served time: Triton compiles a kernel the first time it meets a new
specialization (a new chunk length can pick a new split of the decode kernel, a new token count a
new MoE tile), which a server that has run for a while has long done. So on a GPU every day that
runs Triton kernels first **rehearses**: it serves the same workload once on a throwaway engine,
untimed, and only then on the fresh engine whose times are recorded (``rehearse=False`` turns this
off; day 0 runs PyTorch only and is never rehearsed). The throwaway engine's pages are freed
first, so the timed engine starts with an empty prefix cache.

Every record carries the day's number, switch and label (``"day 14: FP8 KV cache + FP8 experts"``),
the options, the model's size and the workload's. By default every day runs.
``python -m minimax_lab.bench engine [--preset P] [--cases ...] [--days ...] [--out FILE] [--no-record]``
(the command line writes each day's records as soon as that day is done).
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import time

import torch

from minimax_lab import bench, runtime
from minimax_lab.engine.config import M3Config, kv_bytes_per_token, m3_config, param_count
from minimax_lab.engine.engine import Engine
from minimax_lab.engine.model_m3 import M3Model
from minimax_lab.engine.options import DAY_LABELS, DAYS, day_index, day_options
from minimax_lab.engine.sampling import SamplingParams
from minimax_lab.engine.sequence import Status
from minimax_lab.engine.workloads import (RunResult, TurnResult, agent_sessions, chat_sessions, quality, serve,
                                          summarize)

SUITE = "engine"
CASES = ("chat", "agent", "agent_long")


def _day(text: str):
    return int(text) if text.isdigit() else text


#: options of :func:`run` as ``python -m minimax_lab.bench engine`` arguments
OPTIONS = {"days": dict(type=_day, nargs="+", metavar="DAY", help="day numbers or names (default: all)")}

GPU_SIZES = {
    "chat": dict(users=8, turns=2, system_tokens=4096, message_words=(10, 60), max_tokens=32),
    "agent": dict(sessions=2, turns=3, codebase_tokens=32_768, tool_tokens=(200, 2000), max_tokens=32),
    "agent_long": dict(codebase_tokens=131_072, tool_tokens=(1000, 2000), task_words=(20, 60), max_tokens=32, batch=32),
    "engine": dict(max_batch=32, step_tokens=16_384),
    "cases": ("chat", "agent", "agent_long"),
}
CPU_SIZES = {
    "chat": dict(users=2, turns=1, system_tokens=28, message_words=(2, 3), max_tokens=2),
    "agent": dict(sessions=1, turns=2, codebase_tokens=36, tool_tokens=(3, 5), task_words=(1, 2), max_tokens=2),
    "agent_long": dict(codebase_tokens=40, tool_tokens=(3, 5), task_words=(1, 2), max_tokens=3, batch=2),
    "engine": dict(max_batch=4, step_tokens=24),
    "cases": ("chat", "agent", "agent_long"),
}


def sizes_for(preset: str) -> dict:
    return GPU_SIZES if runtime.resolve_preset(preset) == "gpu" else CPU_SIZES


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _engine(model: M3Model, day: int, sizes: dict, *, kv_tokens: int, max_seq_len: int | None = None) -> Engine:
    dev = next(model.parameters()).device
    opts = day_options(day, cuda_graphs_available=dev.type == "cuda", max_batch=sizes["engine"]["max_batch"])
    if opts.continuous_batching:
        opts = dataclasses.replace(opts, step_tokens=sizes["engine"]["step_tokens"])
    eng = Engine(model, opts, kv_tokens=kv_tokens, max_seq_len=max_seq_len, record_logits=True)
    if dev.type == "cuda":   # compile the kernels, capture the graphs (the interpreter compiles nothing)
        eng.warmup()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    return eng


def _rehearses(model: M3Model, day: int, rehearse: bool | None) -> bool:
    """Whether ``day`` serves its workload once untimed first (module docstring): by default on a
    GPU for every day whose options run a Triton kernel."""
    if rehearse is not None:
        return rehearse
    opts = day_options(day)
    uses_triton = "triton" in (opts.msa_impl, opts.moe_impl, opts.paged_impl)
    return next(model.parameters()).device.type == "cuda" and uses_triton


def _rehearse(build, serve_once) -> None:
    """Serve once, untimed, on a throwaway engine (``build()``), then free its page pool before the
    timed engine allocates its own."""
    eng = build()
    serve_once(eng)
    dev = eng.device
    del eng
    gc.collect()             # the engine and its sequences refer to each other
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def _base_extra(model: M3Model, day: int, eng: Engine, workload: dict) -> dict:
    cfg: M3Config = model.cfg
    return {"day": day, "switch": DAYS[day][0], "label": DAY_LABELS[day], "options": eng.options.to_dict(),
            "weights_gib": eng.weight_bytes() / 2**30,
            "model": {"params": param_count(cfg), "activated_params": param_count(cfg, activated=True),
                      "layers": cfg.n_layers, "dense_layers": list(cfg.dense_layers), "d_model": cfg.d_model,
                      "heads": f"{cfg.n_heads}q/{cfg.n_kv_heads}kv x {cfg.head_dim}", "msa": f"Bk={cfg.block_size} "
                      f"topk={cfg.topk} D_idx={cfg.d_idx}", "experts": f"{cfg.top_k} of {cfg.n_experts}, "
                      f"f={cfg.d_expert}", "kv_bytes_per_token": kv_bytes_per_token(cfg)},
            "workload": workload}


def _record(case: str, metric: str, day: int, ms: float | None, extra: dict, dtype) -> list[dict]:
    if ms is None or not ms > 0:
        return []
    return [bench.make_record(SUITE, f"{case}.{metric}", f"d{day}_{DAYS[day][0]}", ms, dtype=dtype, extra=extra)]


def _day_records(case: str, day: int, metrics, extra: dict, dtype, sink) -> list[dict]:
    """The records of one case and day, one per ``(metric, ms)`` that holds a time; handed to
    ``sink`` (if given) as soon as they exist."""
    out = [r for metric, ms in metrics for r in _record(case, metric, day, ms, extra, dtype)]
    if sink is not None and out:
        sink(out)
    return out


def _forced(run: RunResult) -> dict:
    return {(t.session, t.turn): tuple(t.output) for t in run.turns}


def run_workload(case: str, model: M3Model, days: list, sizes: dict, *, verbose: bool = True, sink=None,
                 rehearse: bool | None = None) -> list[dict]:
    """Serve ``case`` (``"chat"`` or ``"agent"``) on every day in ``days``; the records (each day's
    also handed to ``sink`` as soon as that day is done, if given). ``rehearse``: see the module
    docstring (``None``: on a GPU, for the Triton days)."""
    cfg = model.cfg
    w = sizes[case]
    sessions = chat_sessions(cfg, **w) if case == "chat" else agent_sessions(cfg, **w)
    longest = max(sum(len(t.text) + t.max_tokens for t in s.turns) for s in sessions)
    kv_tokens = len(sessions) * (longest + 2 * cfg.block_size) + 4 * cfg.block_size * sizes["engine"]["max_batch"]
    records, ref, forced = [], None, None
    max_seq_len = min(cfg.max_seq_len, longest + 64)
    for day in days:
        if _rehearses(model, day, rehearse):
            _rehearse(lambda: _engine(model, day, sizes, kv_tokens=kv_tokens, max_seq_len=max_seq_len),
                      lambda e: serve(e, sessions, forced=forced))
        eng = _engine(model, day, sizes, kv_tokens=kv_tokens, max_seq_len=max_seq_len)
        run = serve(eng, sessions, forced=forced)
        s = summarize(run, eng)
        if day == 0:
            ref, forced = run, _forced(run)
        if ref is not None:
            s.update(quality(run, ref))
        extra = {**_base_extra(model, day, eng, w), **s, "rehearsed": _rehearses(model, day, rehearse)}
        records += _day_records(case, day, [("ttft", s.get("ttft_mean_ms")), ("itl", s.get("itl_mean_ms")),
                                            ("e2e", run.wall_s * 1e3)], extra, cfg.torch_dtype, sink)
        if verbose:
            print(f"[engine] {case:10s} d{day} {DAYS[day][0]:20s} TTFT {s.get('ttft_mean_ms', 0):9.2f} ms  "
                  f"ITL {s.get('itl_mean_ms') or 0:8.2f} ms  decode {s.get('decode_tok_s') or 0:8.1f} tok/s  "
                  f"cached {s['cached_tokens']:7d}/{s['prompt_tokens']:7d}  wall {run.wall_s:7.2f} s  "
                  f"top1 {s.get('top1_agreement', float('nan')):.4f}", flush=True)
        del eng
    return records


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
    step_ms = [dt * 1e3 for dt, nd, n in eng.step_times[n_before:] if nd == B and n == B]
    prompt1 = seq0.prompt + seq0.output + t1.text
    follow = eng.add_request(prompt1, images=t1.images, sampling=SamplingParams(max_tokens=M,
                                                                                  forced_tokens=forced.get(1)),
                             request_id="turn1")
    eng.run()
    return seq0, eng.sequences[follow], ttft_first, step_ms


def run_long(model: M3Model, days: list, sizes: dict, *, verbose: bool = True, sink=None,
             rehearse: bool | None = None) -> list[dict]:
    """The ``agent_long`` case (module docstring) on every day in ``days``; the records (each day's
    also handed to ``sink`` as soon as that day is done, if given). ``rehearse``: as in
    :func:`run_workload`."""
    cfg = model.cfg
    w = sizes["agent_long"]
    B, M = w["batch"], w["max_tokens"]
    if M < 2 or B < 1:
        raise ValueError(f"agent_long needs max_tokens >= 2 (a first token, then decode steps) and batch >= 1, got {w}")
    sess = agent_sessions(cfg, sessions=1, turns=2, codebase_tokens=w["codebase_tokens"],
                          tool_tokens=w["tool_tokens"], task_words=w["task_words"],
                          max_tokens=M)[0]
    t0, t1 = sess.turns
    longest = len(t0.text) + M + len(t1.text) + M
    kv_tokens = longest + B * (M + 2 * cfg.block_size) + 8 * cfg.block_size
    max_seq_len = min(cfg.max_seq_len, longest + 64)
    records, ref, forced = [], None, {}
    for day in days:
        if _rehearses(model, day, rehearse):
            _rehearse(lambda: _engine(model, day, sizes, kv_tokens=kv_tokens, max_seq_len=max_seq_len),
                      lambda e: _serve_long(e, t0, t1, B, M, forced))
        eng = _engine(model, day, sizes, kv_tokens=kv_tokens, max_seq_len=max_seq_len)
        seq0, seq1, ttft_first, step_ms = _serve_long(eng, t0, t1, B, M, forced)
        run = RunResult([TurnResult(0, k, s.seq_id, s.prompt_len, s.cached_tokens, list(s.output),
                                    s.first_token - s.arrival, [], torch.stack(s.logits[:M]))
                         for k, s in enumerate((seq0, seq1))])
        if day == 0:
            ref, forced = run, {0: tuple(seq0.output), 1: tuple(seq1.output)}
        q = quality(run, ref) if ref is not None else {}
        step = statistics.median(step_ms) if step_ms else None
        extra = {**_base_extra(model, day, eng, {**w, "context_tokens": len(t0.text)}), **q,
                 "ttft_first_ms": ttft_first * 1e3, "ttft_followup_ms": (seq1.first_token - seq1.arrival) * 1e3,
                 "followup_cached_tokens": seq1.cached_tokens, "followup_prompt_tokens": seq1.prompt_len,
                 "decode_batch": B, "decode_steps_timed": len(step_ms),
                 "decode_tok_s": B / (step * 1e-3) if step else None, "kv_cache_gib": eng.kv_bytes() / 2**30,
                 "rehearsed": _rehearses(model, day, rehearse)}
        if eng.device.type == "cuda":
            extra["peak_memory_gib"] = torch.cuda.max_memory_allocated(eng.device) / 2**30
        records += _day_records("agent_long", day, [("ttft_first", ttft_first * 1e3), (f"decode_b{B}", step),
                                                    ("ttft_followup", extra["ttft_followup_ms"])],
                                extra, cfg.torch_dtype, sink)
        if verbose:
            print(f"[engine] agent_long d{day} {DAYS[day][0]:20s} TTFT first {ttft_first * 1e3:10.1f} ms  "
                  f"follow-up {extra['ttft_followup_ms']:9.1f} ms (cached {seq1.cached_tokens})  decode B={B} "
                  f"{(step or 0):7.2f} ms/step  top1 {q.get('top1_agreement', float('nan')):.4f}", flush=True)
        del eng
    return records


def run(preset: str = "auto", cases=None, *, days=None, sizes: dict | None = None, verbose: bool = True,
        sink=None, rehearse: bool | None = None) -> list[dict]:
    """The suite: ``cases`` (default: the preset's; any of :data:`CASES`) on ``days`` (default all,
    numbers or names), at the preset's sizes (:data:`GPU_SIZES`, :data:`CPU_SIZES`) or ``sizes``
    (a dict of the same keys). Returns the records; ``sink`` (a callable), if given, receives each
    day's records as soon as that day is done -- the CLI writes them there, so a run cut short keeps
    the days it finished. ``rehearse``: see the module docstring."""
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
        print(f"[engine] M3-shaped model: {param_count(cfg) / 1e9:.3f} B parameters, {cfg.dtype} on {dev} "
              f"(built in {time.perf_counter() - t0:.1f} s); days {days}; cases {cases}", flush=True)
    records: list[dict] = []
    for c in cases:
        t = time.perf_counter()
        records += run_long(model, days, sizes, verbose=verbose, sink=sink, rehearse=rehearse) \
            if c == "agent_long" else run_workload(c, model, days, sizes, verbose=verbose, sink=sink, rehearse=rehearse)
        if verbose:
            print(f"[engine] case {c}: {time.perf_counter() - t:.1f} s", flush=True)
    return records
