"""Bench suite ``engine``, cases ``load`` and ``preemption``: arrival-rate sweeps, each rate's p50 and
p99 TTFT and inter-token latency, throughput and goodput under the sweep's SLO.

**Simulated** (:func:`simulate_sweep`, the default): the engine's own scheduler and page pool serve
the arrivals on a simulated clock that prices every step with *that day's* price
(:class:`~minimax_lab.bench.suite_engine_prices.Prices`: measured in this run, recorded by a GPU
run, or modelled), so the days differ by their kernels' prices and by how they schedule. Each rate
is served ``repeats`` times: repeat ``r`` serves a slice of the trace of its own (Poisson
arrivals: a seed of its own) priced with the ``r``-th measured price, so the spread covers the
workload and the measurement. The FP8 day stores in FP8 only what pays at the shapes the sweep
serves (:func:`fp8_overrides`).

**On the wall clock** (:func:`wall_clock_sweep`, a GPU): the day's engine serves each rate for real,
first rehearsed once at the highest rate untimed (its numbers kept as ``first_call_*``), and a
price is fitted to the steps it measured (record ``step_cost``, variant ``"load steps"``) -- a
check of the prices against a real run.

Records: ``<case>_<arrivals>.r<rate>``, impl ``d<day>_<switch>[_<policy>]_sim`` (simulated) or
without ``_sim`` (wall clock); ``ms`` = p99 TTFT; ``extra`` the medians over the repeats of every
:func:`~minimax_lab.engine.load.load_metrics` value, each repeat's own (``repeats``), the SLO and
how it was set (``slo_rule``), and what priced the steps (``prices``).
"""
from __future__ import annotations

import copy
import dataclasses
import statistics
import time

from minimax_lab import runtime
from minimax_lab.engine.arrivals import Arrival, mooncake_arrivals, poisson_arrivals
from minimax_lab.engine.clock import SimulatedClock, StepCost, StepShape, chunk_pairs
from minimax_lab.engine.config import M3Config, kv_bytes_per_token
from minimax_lab.engine.load import SLO, load_metrics, serve_arrivals
from minimax_lab.engine.model_m3 import M3Model
from minimax_lab.kvcache.trace import find_trace, read_trace
from minimax_lab.engine.options import day_options, fp8_choice
from minimax_lab.bench.suite_engine_days import (GPU_SIZES, _base_extra, _emit, _engine, _free, _impl, _record,
                                                 _rehearsal, _rehearses)
from minimax_lab.bench.suite_engine_prices import (Prices, fit_load_steps, gpu_prices, host_bandwidth_gbps,
                                                   one_at_a_time_rate)

FP8_DAY = 7
METRICS = ("throughput_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "slo_attainment",
           "goodput_rps", "preemptions", "swap_bytes", "steps", "duration_s", "cached_share")


def cached_share(result) -> float:
    """The share of a served load's prompt tokens the prefix cache served."""
    prompt = sum(s.prompt_len for s in result.sequences)
    return sum(s.cached_tokens for s in result.sequences) / prompt if prompt else 0.0


def base_arrivals(cfg: M3Config, w: dict, case: str, repeat: int, *, trace=None) -> list[Arrival]:
    """Repeat ``repeat``'s requests at one request per second: a slice of Mooncake's trace of its
    own (``load``; ``trace``: the trace's requests, default the shipped trace) or Poisson arrivals
    of a seed of its own (``preemption``)."""
    if case == "load":
        return mooncake_arrivals(cfg, w["requests"], rate=1.0, block_tokens=w["block_tokens"],
                                 max_tokens=w["max_tokens"], start=repeat * w["requests"], trace=trace)
    return poisson_arrivals(cfg, w["requests"], 1.0, prompt_tokens=w["prompt_tokens"], max_tokens=w["max_tokens"],
                            seed=repeat)


def at_rate(arrivals: list, rate: float) -> list[Arrival]:
    """``arrivals`` (made at one request per second) at ``rate``: the same requests, every time divided
    by the rate (both processes scale so: Mooncake's timestamps are stretched, Poisson gaps are
    exponential draws over the rate). The prompts were checked once when made and are shared."""
    out = []
    for a in arrivals:
        b = copy.copy(a)
        object.__setattr__(b, "time_s", a.time_s / rate)     # a frozen dataclass: only the time changes
        out.append(b)
    return out


def _slo(w: dict, cost: StepCost, arrivals: list) -> SLO:
    """The sweep's SLO: the sizes' ``slo`` (seconds) where given, else from the price: TTFT within 10x
    the median prompt's prefill alone, time per token within 2x the price of a full step (a
    ``step_tokens`` prompt chunk beside ``max_batch`` decodes, at the median prompt's context)."""
    if w.get("slo"):
        return SLO(*w["slo"])
    prompts = sorted(len(a.prompt) for a in arrivals)
    n = prompts[len(prompts) // 2]
    pairs = chunk_pairs(0, n)
    prefill = cost.ms(StepShape(prefill_tokens=n, attended=pairs, prefill_pairs=pairs)) / 1e3
    e = w["engine"]
    chunk = chunk_pairs(n, n + e["step_tokens"])
    full = cost.ms(StepShape(decodes=e["max_batch"], prefill_tokens=e["step_tokens"],
                             attended=e["max_batch"] * n + chunk, prefill_pairs=chunk)) / 1e3
    return SLO(10 * prefill, 2 * full)


def slo_rule(w: dict) -> str:
    """How :func:`_slo` set a sweep's SLO, in words (recorded as ``slo_rule``)."""
    if w.get("slo"):
        return "fixed for the model's size"
    return ("set from the step prices: TTFT within 10x the median prompt's prefill alone, time per token "
            "within 2x a full step")


def _kv_tokens(cfg: M3Config, base: int, kv_dtype: str | None) -> int:
    """``base`` tokens of the model's dtype, as many FP8 tokens as the same bytes hold."""
    return base * kv_bytes_per_token(cfg) // kv_bytes_per_token(cfg, kv_dtype) if kv_dtype else base


def served_ms(cost: StepCost, arrivals: list, *, batch: int, step_tokens: int | None) -> float:
    """Milliseconds the requests' own steps cost at ``cost``: each prompt prefilled in chunks of
    ``step_tokens`` (None: whole), each answer token a ``batch``-th of a decode step of ``batch``
    sequences at its context -- the shapes a day serves, without the queueing."""
    total = 0.0
    for a in arrivals:
        n = len(a.prompt)
        size = step_tokens or n
        for s in range(0, n, size):
            pairs = chunk_pairs(s, min(n, s + size))
            total += cost.ms(StepShape(prefill_tokens=min(n, s + size) - s, attended=pairs, prefill_pairs=pairs))
        total += sum(cost.ms(StepShape(decodes=batch, attended=batch * (n + i))) for i in range(1, a.max_tokens)) / batch
    return total


def fp8_overrides(prices: Prices, repeat: int, arrivals: list, w: dict, cfg: M3Config) -> tuple[dict, StepCost, dict]:
    """What the FP8 day stores in FP8 at the shapes ``arrivals`` need (:func:`~minimax_lab.engine.options.fp8_choice`):
    ``(options, its price, why)``. Candidates are the priced ones: day 6 (none), the FP8 day (both),
    and each store alone where the prices hold it; the pool fills when ``max_batch`` of the longest
    requests outgrow it in the model's dtype."""
    pick = lambda costs: costs[repeat % len(costs)]  # noqa: E731
    cands = {(): pick(prices.by_day[6]), ("kv", "experts"): pick(prices.by_day[FP8_DAY])}
    for name, stores in (("fp8_kv", ("kv",)), ("fp8_experts", ("experts",))):
        if prices.variants.get(name):
            cands[stores] = pick(prices.variants[name])
    e = w["engine"]
    times = {c: served_ms(cost, arrivals, batch=e["max_batch"], step_tokens=e["step_tokens"]) for c, cost in cands.items()}
    longest = max(len(a.prompt) + a.max_tokens for a in arrivals)
    fills = e["max_batch"] * longest > w["kv_tokens"]
    opts = fp8_choice(times, pool_fills=fills)
    chosen = tuple(s for s, o in (("kv", "kv_dtype"), ("experts", "expert_dtype")) if opts[o])
    why = {"candidates_ms": {"+".join(c) or "none": t for c, t in times.items()}, "pool_fills": fills,
           "chosen": "+".join(chosen) or "none"}
    return opts, cands[chosen], why


def _medians(rows: list) -> dict:
    out = {}
    for k in METRICS:
        vals = [r[k] for r in rows if r.get(k) is not None]
        out[k] = statistics.median(vals) if vals else None
    return out


def simulate_sweep(prices: Prices, days: list, sizes: dict, *, case: str = "load", repeats: int = 3,
                   verbose: bool = True, sink=None, deadline: float | None = None, policies=None) -> list[dict]:
    """The ``load`` or ``preemption`` sweep (module docstring) of the model ``prices`` price, on those
    of ``days`` it prices, at ``sizes``; the records (each day's also handed to ``sink``). Stops
    starting days once ``time.perf_counter()`` passes ``deadline``. ``policies`` (``preemption``):
    ``{day: (policy, ...)}`` (default every day all three: ``"reserve"``, ``"recompute"``, ``"swap"``)."""
    cfg, w = prices.cfg, sizes[case]
    if case == "preemption":
        days = [d for d in days if d in w["days"]]
    shell = M3Model.create(cfg, "meta")
    path = find_trace() if case == "load" else None
    trace = read_trace(path) if path else None       # read once for every repeat (None: mooncake_arrivals says why)
    bases = [base_arrivals(cfg, w, case, r, trace=trace) for r in range(repeats)]
    longest = max(len(a.prompt) + a.max_tokens for b in bases for a in b)
    max_seq_len = min(cfg.max_seq_len, longest + 64)
    rates = list(w["rates"])
    if w.get("relative"):   # multiples of what the median priced day sustains one request at a time
        mus = sorted(one_at_a_time_rate(c[0], bases[0]) for c in prices.by_day.values())
        rates = [r * mus[len(mus) // 2] for r in rates]
    records = []
    for day in days:
        mine = ((policies or {}).get(day, ("reserve", "recompute", "swap")) if case == "preemption" else ("reserve",))
        if day not in prices.by_day:
            if verbose:
                print(f"[engine] {case}: no step price for day {day}; skipped", flush=True)
            continue
        if deadline is not None and time.perf_counter() > deadline:
            print(f"[engine] {case}: deadline passed; day {day} and later not simulated", flush=True)
            break
        for policy in [None if p == "reserve" else p for p in mine]:
            suffix = "" if case == "load" else f"_{policy or 'reserve'}"
            rows: dict = {rate: [] for rate in rates}
            for r, base in enumerate(bases):
                cost, why, overrides = prices.by_day[day][r % len(prices.by_day[day])], None, {}
                if day == FP8_DAY and 6 in prices.by_day:
                    overrides, cost, why = fp8_overrides(prices, r, base, w, cfg)
                kv_dtype = overrides.get("kv_dtype", day_options(day).kv_dtype)
                kv_tokens = _kv_tokens(cfg, w["kv_tokens"], kv_dtype)
                slo = _slo(w, cost, base)
                for rate in rates:
                    eng = _engine(shell, day, sizes, kv_tokens=kv_tokens, max_seq_len=max_seq_len, record_logits=False,
                                  clock=SimulatedClock(cost), engine=w["engine"], preemption=policy, **overrides)
                    served = serve_arrivals(eng, at_rate(base, rate))
                    m = {**load_metrics(served, slo), "cached_share": cached_share(served)}
                    rows[rate].append({**m, "slo": dataclasses.asdict(slo), "kv_tokens": kv_tokens, "fp8_choice": why,
                                       "step_cost": cost.to_dict(), "options": eng.options.to_dict()})
            out = []
            for rate, reps in rows.items():
                first = reps[0]
                extra = {**_base_extra(shell, day, eng, w, True), **_medians(reps),   # a simulation compiles nothing
                         "rate": rate, "repeats": [{k: x[k] for k in METRICS} for x in reps],
                         "arrivals": "mooncake" if case == "load" else "poisson", "policy": policy or "reserve",
                         "requests": w["requests"], "clock": "simulated", "prices": prices.label(),
                         "prices_kind": prices.kind, "prices_device": prices.device, "prices_versions": prices.versions,
                         "slo": first["slo"], "slo_rule": slo_rule(w), "kv_tokens": first["kv_tokens"],
                         "options": first["options"], "fp8_choice": first["fp8_choice"],
                         "step_cost": first["step_cost"]}
                out += _record(f"{case}_{extra['arrivals']}.r{rate:.4g}", _impl(day, suffix + "_sim"),
                               extra["ttft_p99_ms"], extra, cfg.torch_dtype)
                if verbose:
                    print(f"[engine] {case:10s} d{day} {suffix:11s} rate {rate:8.3g}/s  TTFT p50/p99 "
                          f"{extra['ttft_p50_ms']:9.1f}/{extra['ttft_p99_ms']:9.1f} ms  ITL p50/p99 "
                          f"{extra['itl_p50_ms'] or 0:7.2f}/{extra['itl_p99_ms'] or 0:7.2f} ms  goodput "
                          f"{extra['goodput_rps'] or 0:7.3g}/s  preemptions {extra['preemptions']}", flush=True)
            records += _emit(out, sink)
    return records


def wall_clock_sweep(model: M3Model, days: list, sizes: dict, *, case: str = "load", verbose: bool = True,
                     sink=None, rehearse: bool | None = None) -> list[dict]:
    """The sweep served for real on each of ``days`` (module docstring): one record per rate, the
    rehearsal's numbers at the highest rate kept as ``first_call_*``, and the ``step_cost`` fitted to
    the load's steps."""
    cfg, w = model.cfg, sizes[case]
    dev = next(model.parameters()).device
    host_gbps = host_bandwidth_gbps(dev)
    if case == "preemption":
        days = [d for d in days if d in w["days"]]
    policies = (None, "recompute", "swap") if case == "preemption" else (None,)
    base = base_arrivals(cfg, w, case, 0)
    max_seq_len = min(cfg.max_seq_len, max(len(a.prompt) + a.max_tokens for a in base) + 64)
    rates = list(w["wall_rates"])
    records = []
    for day in days:
        for policy in policies:
            suffix = "" if case == "load" else f"_{policy or 'reserve'}"
            kv_tokens = _kv_tokens(cfg, w["kv_tokens"], day_options(day).kv_dtype)
            build = lambda: _engine(model, day, sizes, kv_tokens=kv_tokens, max_seq_len=max_seq_len,  # noqa: E731
                                    record_logits=False, engine=w["engine"], preemption=policy)
            slo = SLO(*w["slo"]) if w.get("slo") else SLO(10.0, 1.0)
            rehearsed = _rehearses(model, rehearse)
            first = (_rehearsal(build, lambda e: load_metrics(serve_arrivals(e, at_rate(base, max(rates))), slo))
                     if rehearsed else {})
            eng = build()
            rows = []
            for rate in rates:   # one engine (kernels compiled, graphs captured), its prefix cache emptied per rate
                eng.blocks.evict(len(eng.blocks.policy))
                rows.append((rate, load_metrics(serve_arrivals(eng, at_rate(base, rate), tag=("r", rate)), slo)))
            cost = fit_load_steps(eng.step_times, host_gbps=host_gbps,
                                  source=f"{runtime.device_name()}: day {day}'s load steps")
            extra = {**_base_extra(model, day, eng, w, rehearsed), "arrivals": "mooncake" if case == "load" else "poisson",
                     "policy": policy or "reserve", "kv_tokens": kv_tokens, "requests": w["requests"], "clock": "wall",
                     "slo": dataclasses.asdict(slo), "slo_rule": slo_rule(w), "step_cost": cost.to_dict(),
                     **{f"first_call_{k}": v for k, v in first.items()},
                     "first_call_rate": max(rates) if first else None}
            out = []
            for rate, m in rows:
                out += _record(f"{case}_{extra['arrivals']}.r{rate:g}", _impl(day, suffix), m["ttft_p99_ms"],
                               {**extra, **m, "rate": rate}, cfg.torch_dtype)
            if case == "load":
                out += _record("step_cost", _impl(day, "_load_steps"), cost.ms(StepShape(decodes=1, attended=1024)),
                               {**extra, "variant": "load steps"}, cfg.torch_dtype)
            del eng
            _free(dev)
            records += _emit(out, sink)
            if verbose:
                print(f"[engine] {case} d{day}{suffix} on the wall clock: {len(out)} records", flush=True)
    return records


def run_load(model: M3Model | None, days: list, sizes: dict | None = None, *, case: str = "load",
             prices: Prices | None = None, repeats: int = 3, verbose: bool = True, sink=None,
             rehearse: bool | None = None, wall_clock: bool = False, deadline: float | None = None,
             policies: dict | None = None) -> list[dict]:
    """The ``load`` or ``preemption`` case: :func:`wall_clock_sweep` of ``model`` with ``wall_clock``,
    else :func:`simulate_sweep` at ``prices`` (default: the GPU-size model's, recorded or modelled,
    :func:`~.suite_engine_prices.gpu_prices`) and ``sizes`` (default: the GPU preset's)."""
    if wall_clock:
        return wall_clock_sweep(model, days, sizes, case=case, verbose=verbose, sink=sink, rehearse=rehearse)
    if prices is None or sizes is None:
        prices, sizes = prices or gpu_prices(), sizes or GPU_SIZES
        if prices is None:
            raise ValueError("no step prices: none measured, recorded or modelled (the recorded engine records "
                             "are missing)")
    return simulate_sweep(prices, days, sizes, case=case, repeats=repeats, verbose=verbose, sink=sink,
                          deadline=deadline, policies=policies)
