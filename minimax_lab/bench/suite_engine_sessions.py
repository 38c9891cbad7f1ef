"""Bench suite ``engine``, cases ``chat`` and ``agent``: sessions served turn by turn on every day,
each later day answering with day 0's tokens so that its logits are compared on the same contexts,
and the FP8 breakdown of the ``chat`` turns (:func:`chat_breakdown`).
"""
from __future__ import annotations

from minimax_lab.engine.engine import Engine
from minimax_lab.engine.model_m3 import M3Model
from minimax_lab.engine.options import DAYS, day_options
from minimax_lab.engine.quality import fp8_breakdown, turns_to_rescore
from minimax_lab.engine.workloads import RunResult, agent_sessions, chat_sessions, quality, serve, summarize
from minimax_lab.bench.suite_engine_days import (_base_extra, _emit, _engine, _free, _impl, _record, _rehearsal,
                                                 _rehearses)


def _forced(run: RunResult) -> dict:
    return {(t.session, t.turn): tuple(t.output) for t in run.turns}


def run_workload(case: str, model: M3Model, days: list, sizes: dict, *, verbose: bool = True, sink=None,
                 rehearse: bool | None = None, state: dict | None = None) -> list[dict]:
    """Serve ``case`` (``"chat"`` or ``"agent"``) on every day in ``days``; the records (each day's
    also handed to ``sink`` as soon as that day is done, if given). ``state`` (a dict) carries day
    0's answers and logits from one call to the next (the days served one call at a time)."""
    cfg = model.cfg
    w = sizes[case]
    sessions = chat_sessions(cfg, **w) if case == "chat" else agent_sessions(cfg, **w)
    longest = max(sum(len(t.text) + t.max_tokens for t in s.turns) for s in sessions)
    kv_tokens = len(sessions) * (longest + 2 * cfg.block_size) + 4 * cfg.block_size * sizes["engine"]["max_batch"]
    max_seq_len = min(cfg.max_seq_len, longest + 64)
    rehearsed = _rehearses(model, rehearse)
    state = {} if state is None else state
    records = []
    for day in days:
        ref, forced = state.get("ref"), state.get("forced")
        build = lambda: _engine(model, day, sizes, kv_tokens=kv_tokens, max_seq_len=max_seq_len)  # noqa: E731
        first = _rehearsal(build, lambda e: summarize(serve(e, sessions, forced=forced), e)) if rehearsed else {}
        eng = build()
        run = serve(eng, sessions, forced=forced)
        s = summarize(run, eng)
        if day == 0:
            ref, forced = run, _forced(run)
            state["ref"], state["forced"] = ref, forced
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
