"""Bench suite ``engine``, case ``agent_long``: one agent on a long codebase context -- the first
turn's TTFT (the whole context prefilled), the median decode step at the day's batch (the session
forked, forks counting against the day's batch limit) with its bytes and FLOPs, the inter-token
latency of the decoding sequences (p50 and p99), and the follow-up turn's TTFT; each the median of
``repeats`` runs, the first call's beside it.
"""
from __future__ import annotations

import statistics

import torch

from minimax_lab.engine.engine import Engine
from minimax_lab.engine.load import percentile
from minimax_lab.engine.model_m3 import M3Model
from minimax_lab.engine.options import DAYS
from minimax_lab.engine.sampling import SamplingParams
from minimax_lab.engine.sequence import Status
from minimax_lab.engine.traffic import decode_step_bytes, decode_step_flops
from minimax_lab.engine.workloads import RunResult, TurnResult, agent_sessions, quality
from minimax_lab.bench.suite_engine_days import (_base_extra, _emit, _engine, _free, _impl, _options, _record,
                                               _rehearsal, _rehearses)


def _run_until(eng: Engine, done) -> None:
    while not done():
        eng.step()


def _serve_long(eng: Engine, t0, t1, B: int, M: int, forced: dict, tag=None):
    """One ``agent_long`` session on ``eng`` (request ids under ``tag``): the first turn, ``B - 1``
    forks decoding beside it, the follow-up turn. Returns ``(seq0, seq1, ttft_first_s, decode step
    times in ms at batch B, the gaps in ms between the decoding sequences' tokens)``."""
    first = eng.add_request(t0.text, sampling=SamplingParams(max_tokens=M, forced_tokens=forced.get(0)),
                            request_id=(tag, "turn0"))
    seq0 = eng.sequences[first]
    _run_until(eng, lambda: seq0.status is not Status.PREFILL and seq0.status is not Status.WAITING)
    ttft_first = seq0.first_token - seq0.arrival
    forks = [eng.sequences[eng.fork(first, (tag, "fork", i))] for i in range(B - 1)]
    n_before, t_fork = len(eng.step_times), seq0.token_times[-1]
    _run_until(eng, lambda: not eng.has_work())
    step_ms = [st.seconds * 1e3 for st in eng.step_times[n_before:] if st.decodes == B and st.tokens == B]
    gaps = [(b - a) * 1e3 for s in [seq0, *forks] for a, b in zip(s.token_times, s.token_times[1:]) if a >= t_fork]
    prompt1 = seq0.prompt + seq0.output + t1.text
    follow = eng.add_request(prompt1, images=t1.images, sampling=SamplingParams(max_tokens=M,
                                                                                  forced_tokens=forced.get(1)),
                             request_id=(tag, "turn1"))
    eng.run()
    return seq0, eng.sequences[follow], ttft_first, step_ms, gaps


def decode_batch(model: M3Model, day: int, sizes: dict) -> int:
    """The ``agent_long`` decode batch of ``day``: the workload's, within the day's batch limit
    (one sequence at a time without continuous batching)."""
    opts = _options(model, day, sizes)
    return min(sizes["agent_long"]["batch"], opts.max_batch if opts.continuous_batching else 1)


def _numbers(seq0, seq1, ttft_first: float, step_ms: list, gaps: list, B: int) -> dict:
    step = statistics.median(step_ms) if step_ms else None
    return {"ttft_first_ms": ttft_first * 1e3, "ttft_followup_ms": (seq1.first_token - seq1.arrival) * 1e3,
            "decode_ms": step, "decode_tok_s": B / (step * 1e-3) if step else None,
            "itl_p50_ms": percentile(gaps, 50), "itl_p99_ms": percentile(gaps, 99),
            "itl_mean_ms": statistics.fmean(gaps) if gaps else None}


def run_long(model: M3Model, days: list, sizes: dict, *, verbose: bool = True, sink=None,
             rehearse: bool | None = None, repeats: int = 1, state: dict | None = None,
             overrides: dict | None = None) -> list[dict]:
    """The ``agent_long`` case (:mod:`minimax_lab.bench.suite_engine`) on every day in ``days``; the
    records (each day's also handed to ``sink`` as soon as that day is done, if given). A rehearsed
    day first serves the session on a throwaway engine (its numbers kept as ``first_call_*``); then
    one engine serves it ``repeats`` times, its prefix cache emptied before each: every record's
    value is the median over the repeats, each repeat's own numbers kept in ``repeats``. ``state``
    (a dict) carries day 0's answers and logits from one call to the next (the days served one call
    at a time); ``overrides`` maps a day to options of its own (the FP8 day's choice)."""
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
    state = {} if state is None else state
    records = []
    for day in days:
        B = decode_batch(model, day, sizes)
        mine = (overrides or {}).get(day, {})
        build = lambda: _engine(model, day, sizes, kv_tokens=kv_tokens, max_seq_len=max_seq_len, **mine)  # noqa: E731
        forced = state.get("forced", {})
        first = (_rehearsal(build, lambda e: _numbers(*_serve_long(e, t0, t1, B, M, forced, "first"), B))
                 if rehearsed else {})
        eng = build()
        runs = []
        for r in range(repeats):
            eng.blocks.evict(len(eng.blocks.policy))       # the prefix cache empty, as on a fresh engine
            served = _serve_long(eng, t0, t1, B, M, forced, r)
            runs.append(_numbers(*served, B))
            if r == 0:
                seq0, seq1 = served[:2]
        run = RunResult([TurnResult(0, k, s.seq_id, s.prompt_len, s.cached_tokens, list(s.output),
                                    s.first_token - s.arrival, [], torch.stack(s.logits[:M]))
                         for k, s in enumerate((seq0, seq1))])
        if day == 0:
            state["ref"], state["forced"] = run, {0: tuple(seq0.output), 1: tuple(seq1.output)}
        q = quality(run, state["ref"]) if state.get("ref") is not None else {}
        med = {k: statistics.median(x[k] for x in runs) if all(x[k] is not None for x in runs) else None
               for k in runs[0]}
        context = len(t0.text) + M // 2
        traffic = decode_step_bytes(cfg, batch=B, context=context, kv_dtype=eng.options.kv_dtype,
                                    expert_dtype=eng.options.expert_dtype)
        flops = decode_step_flops(cfg, batch=B, context=context)
        step = med["decode_ms"]
        extra = {**_base_extra(model, day, eng, {**w, "context_tokens": len(t0.text)}, rehearsed), **q, **med,
                 "repeats": runs, "followup_cached_tokens": seq1.cached_tokens, "followup_prompt_tokens": seq1.prompt_len,
                 "decode_batch": B, "decode_context": context, "kv_cache_gib": eng.kv_bytes() / 2**30,
                 "decode_bytes_per_step": traffic["total"], "decode_weight_bytes": traffic["weights"],
                 "decode_kv_bytes": traffic["kv"], "decode_flops_per_step": flops,
                 "decode_gbps": traffic["total"] / (step * 1e-3) / 1e9 if step else None,
                 **{f"first_call_{k}": v for k, v in first.items()}, **({"fp8_choice": mine} if mine else {})}
        if eng.device.type == "cuda":
            extra["peak_memory_gib"] = torch.cuda.max_memory_allocated(eng.device) / 2**30
        metrics = [("ttft_first", med["ttft_first_ms"]), ("decode", step), ("itl", med["itl_p50_ms"]),
                   ("ttft_followup", med["ttft_followup_ms"])]
        records += _emit([r for m, ms in metrics for r in _record(f"agent_long.{m}", _impl(day), ms, extra,
                                                                   cfg.torch_dtype)], sink)
        if verbose:
            print(f"[engine] agent_long d{day} {DAYS[day][0]:20s} TTFT first {med['ttft_first_ms']:10.1f} ms  "
                  f"follow-up {med['ttft_followup_ms']:9.1f} ms (cached {seq1.cached_tokens})  decode B={B} "
                  f"{(step or 0):7.2f} ms/step  ITL p50/p99 {med['itl_p50_ms'] or 0:.2f}/{med['itl_p99_ms'] or 0:.2f} "
                  f"ms  top1 {q.get('top1_agreement', float('nan')):.4f}", flush=True)
        del eng
        _free(next(model.parameters()).device)
    return records
