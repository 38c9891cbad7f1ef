"""Bench suite ``engine``, cases ``load`` and ``preemption``: arrival-rate sweeps, served on the
wall clock (a GPU; the day's step prices are then fitted to the steps it measured) and replayed on
a simulated clock, each rate's tail latency and goodput under the sweep's SLO recorded.
"""
from __future__ import annotations

import dataclasses
import statistics

from minimax_lab import runtime
from minimax_lab.engine.arrivals import mooncake_arrivals, poisson_arrivals
from minimax_lab.engine.clock import SimulatedClock, StepCost, StepShape, chunk_pairs
from minimax_lab.engine.config import M3Config, kv_bytes_per_token
from minimax_lab.engine.model_m3 import M3Model
from minimax_lab.engine.options import day_options
from minimax_lab.engine.load import SLO, load_metrics, serve_arrivals
from minimax_lab.bench.suite_engine_days import (_base_extra, _emit, _engine, _free, _impl, _record, _rehearsal,
                                               _rehearses)
from minimax_lab.bench.suite_engine_prices import fit_step_cost, host_bandwidth_gbps, one_at_a_time_rate, sweep_prices


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
    """The ``load`` or ``preemption`` case (:mod:`minimax_lab.bench.suite_engine`) on ``days``; the records (each day's
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
