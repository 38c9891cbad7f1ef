"""Bench suite ``engine``: the day-by-day waterfall of the M3-shaped model, and the engine under load.

``run(preset, cases=..., days=...)`` builds the model once (random weights, seed 0) and serves the
device cases day by day (:data:`minimax_lab.engine.options.DAYS`), each on engines built from that
day's options (on a GPU warmed up: kernels compiled, graphs captured, statistics reset); then it
simulates the load sweeps at the step prices the days measured.

**Rehearsal.** Triton compiles a kernel the first time it meets a new specialization, and a
process's compile cache then serves every later engine, so an unrehearsed day's times depend on
which days ran before it. With ``rehearse`` (the default on a GPU, for every day, day 0
included) a day first serves the same workload untimed; then it is timed. The untimed run's
times are kept as the **first-call** columns (``first_call_*``: what the same work cost the first
time in this process). Every record says ``rehearsed``; :func:`day_ratio` refuses to compare a
rehearsed record with an unrehearsed one (:class:`MixedRehearsal`). **Repeats**: every timed
measurement is made ``repeats`` times (default 3); a record holds the median, each repeat's own
numbers in ``repeats``.

Cases and records (``ms`` is the value named; ``extra`` holds the rest):

* ``prices`` -- what one step costs on the day (:mod:`.suite_engine_prices`): record ``step_cost``,
  ms = the median decode step of the largest batch at the longest context, ``step_costs`` one
  fitted :class:`~minimax_lab.engine.clock.StepCost` per repeat; on the FP8 day also each FP8 store
  alone on top of day 6 (``variant``).
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
  bandwidth they imply), ``.itl`` (p50 inter-token latency, p99 beside it), ``.ttft_followup``
  (the next turn, a tool result appended). The FP8 day stores in FP8 only what pays at these
  shapes (``fp8_choice``), judged by this run's prices.
* ``load`` -- Mooncake's trace scaled to the model (:func:`~minimax_lab.engine.arrivals.mooncake_arrivals`)
  at each rate, and ``preemption`` -- decode-heavy Poisson arrivals into a tight KV pool on the days
  with continuous batching (reserve up front vs preemption by recompute vs by swap): simulated
  sweeps (:mod:`.suite_engine_load`), every day priced by its own steps, ``repeats`` slices of the
  workload; ``<case>_<arrivals>.r<rate>``, ms = p99 TTFT.

Every record carries the day's number, switch and label, the options, the model's size and the
workload's. ``python -m minimax_lab.bench engine [--preset P] [--cases ...] [--days ...] [--repeats N]
[--deadline-s S] [--rehearse | --no-rehearse] [--out FILE] [--no-record]`` (the command line writes
each day's records as soon as that day is done). The GPU recording of every day is
``python -m minimax_lab.bench engine --preset gpu --deadline-s 270``; ``--preset cpu`` runs the
same cases at the CPU sizes (the tiny model in Triton's interpreter) end to end.

The cases live in modules of their own: :mod:`.suite_engine_days` (sizes, each day's engine,
rehearsal, the records' common fields, :func:`~.suite_engine_days.day_ratio`),
:mod:`.suite_engine_prices` (step prices: measured, recorded, modelled),
:mod:`.suite_engine_sessions` (``chat``, ``agent``), :mod:`.suite_engine_agent_long`,
:mod:`.suite_engine_load` (``load``, ``preemption``) and :mod:`.suite_engine_timeline` (a simulated
run, step by step).
"""
from __future__ import annotations

import argparse
import time

from minimax_lab import runtime
from minimax_lab.engine.arrivals import Arrival
from minimax_lab.engine.config import m3_config, param_count
from minimax_lab.engine.model_m3 import M3Model
from minimax_lab.engine.options import DAYS, day_index, fp8_choice
from minimax_lab.bench.suite_engine_agent_long import decode_batch, run_long
from minimax_lab.bench.suite_engine_days import _emit, _sync, sizes_for, smoke_sizes
from minimax_lab.bench.suite_engine_load import FP8_DAY, run_load, served_ms
from minimax_lab.bench.suite_engine_prices import VARIANTS, host_bandwidth_gbps, measure_prices, prices_from_records
from minimax_lab.bench.suite_engine_sessions import run_workload


CASES = ("prices", "chat", "agent", "agent_long", "load", "preemption")
#: the cases the model serves on the device, day by day; the sweeps then simulate
DEVICE_CASES = ("prices", "chat", "agent", "agent_long")
#: share of ``deadline_s`` kept for the simulated sweeps when they follow the device's days
SWEEP_SHARE = 0.2


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


def _day(text: str):
    return int(text) if text.isdigit() else text


#: options of :func:`run` as ``python -m minimax_lab.bench engine`` arguments
OPTIONS = {"days": dict(type=_day, nargs="+", metavar="DAY", help="day numbers or names (default: all)"),
           "rehearse": dict(action=argparse.BooleanOptionalAction,
                            help="serve each day once untimed before timing it (default: on a GPU)"),
           "repeats": dict(type=int, metavar="N", help="timed repeats of every measurement and sweep (default 3)"),
           "deadline_s": dict(type=float, metavar="S", help="start no new work after S seconds: no new day after "
                              "80%% of S when sweeps follow (they get the rest), no new sweep day after S; what "
                              "finished is kept (records are written as each day completes)"),
           "smoke": dict(action="store_true", help="the preset's sizes cut to the least that runs every case and "
                         "day, rehearsed: a check that the command runs end to end, not a measurement")}


def check_options(*, days=None, rehearse=None, repeats=None, deadline_s=None, smoke=False) -> None:
    """Raise ``ValueError`` for an option :func:`run` cannot take (before anything runs)."""
    for d in days or ():
        day_index(d)
    if repeats is not None and (isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1):
        raise ValueError(f"--repeats must be an integer >= 1, got {repeats!r}")
    if deadline_s is not None and not deadline_s > 0:
        raise ValueError(f"--deadline-s must be a positive number of seconds, got {deadline_s!r}")


def _fp8_for_agent_long(model: M3Model, sizes: dict, measured: list) -> dict:
    """The FP8 day's stores for the ``agent_long`` shapes (a prompt of the codebase's length prefilled as the
    day prefills it, then its answer decoded at the day's batch), from this run's day-6, FP8-day and
    single-store prices; ``{}`` (the day as defined) where they were not measured."""
    prices = prices_from_records(measured, cfg=model.cfg)
    if prices is None or not {6, FP8_DAY} <= set(prices.by_day):
        return {}
    w, cfg = sizes["agent_long"], model.cfg
    probe = [Arrival(0.0, tuple([1] * w["codebase_tokens"]), w["max_tokens"])]
    cands = {(): prices.by_day[6], ("kv", "experts"): prices.by_day[FP8_DAY]}
    for name, stores in (("fp8_kv", ("kv",)), ("fp8_experts", ("experts",))):
        if prices.variants.get(name):
            cands[stores] = prices.variants[name]
    batch = decode_batch(model, FP8_DAY, sizes)
    step_tokens = sizes["engine"]["step_tokens"]
    times = {c: sorted(served_ms(x, probe, batch=batch, step_tokens=step_tokens) for x in costs)[len(costs) // 2]
             for c, costs in cands.items()}
    return fp8_choice(times)


def run(preset: str = "auto", cases=None, *, days=None, sizes: dict | None = None, verbose: bool = True,
        sink=None, rehearse: bool | None = None, repeats: int | None = None,
        deadline_s: float | None = None, smoke: bool = False) -> list[dict]:
    """The suite: ``cases`` (default: the preset's; any of :data:`CASES`) on ``days`` (default all,
    numbers or names), at the preset's sizes (:data:`~.suite_engine_days.GPU_SIZES`,
    :data:`~.suite_engine_days.CPU_SIZES`) or ``sizes`` (a dict of the same keys). Returns the
    records; ``sink`` (a callable), if given, receives each day's records as soon as that day is
    done -- the CLI writes them there, so a run cut short keeps the days it finished.

    The device cases (:data:`DEVICE_CASES`) run day by day, every case of a day before the next day;
    on the FP8 day ``prices`` also prices each FP8 store alone, and ``agent_long`` stores in FP8 only
    what pays at its shapes. Then ``load`` and ``preemption`` simulate their sweeps at the prices
    this run measured (none measured: the GPU-size model at recorded or modelled GPU prices).
    ``repeats`` (default 3): timed repeats of every measurement and sweep. ``deadline_s``: no day
    starts after ``(1 - SWEEP_SHARE) * deadline_s`` seconds when sweeps follow (else after
    ``deadline_s``), no sweep's day after ``deadline_s``. ``rehearse``: see the module docstring
    (``None``: on a GPU). ``smoke``: :func:`~.suite_engine_days.smoke_sizes`, rehearsed unless
    ``rehearse`` says otherwise."""
    check_options(days=days, repeats=repeats, deadline_s=deadline_s)
    sizes = sizes_for(preset) if sizes is None else sizes
    if smoke:
        sizes, rehearse = smoke_sizes(sizes), (True if rehearse is None else rehearse)
    cases = list(sizes["cases"] if cases is None else cases)
    for c in cases:
        if c not in CASES:
            raise ValueError(f"unknown case {c!r}; choose from {CASES}")
    repeats = 3 if repeats is None else repeats
    days = sorted({day_index(d) for d in (range(len(DAYS)) if days is None else days)})
    t0 = time.perf_counter()
    sweeps = [c for c in cases if c in ("load", "preemption")]
    on_device = [c for c in cases if c in DEVICE_CASES]
    end = t0 + deadline_s if deadline_s else None
    days_end = (t0 + (1 - SWEEP_SHARE) * deadline_s if sweeps else end) if deadline_s else None
    records: list[dict] = []
    model = None
    measured: list[dict] = []
    if on_device:
        cfg = m3_config(preset)
        dev = runtime.kernel_device()
        model = M3Model.create(cfg, dev)
        _sync(dev)
        if verbose:
            print(f"[engine] M3-shaped model: {param_count(cfg):,} parameters, {cfg.dtype} on {dev} "
                  f"(built in {time.perf_counter() - t0:.1f} s); days {days}; cases {cases}; {repeats} repeats",
                  flush=True)
        host = host_bandwidth_gbps(dev) if "prices" in on_device else None
        states = {c: {} for c in on_device}
        kw = dict(verbose=verbose, sink=sink, rehearse=rehearse)
        for day in days:
            if days_end is not None and time.perf_counter() > days_end:
                print(f"[engine] deadline: days from {day} on not started ({time.perf_counter() - t0:.0f} s)", flush=True)
                break
            t = time.perf_counter()
            if "prices" in on_device:
                variants = list(VARIANTS) if day == FP8_DAY and any(r["day"] == 6 for r in measured) else []
                for variant in [None, *variants]:
                    recs = measure_prices(model, day, sizes, repeats=repeats, rehearse=rehearse, host_gbps=host,
                                          variant=variant)
                    measured += recs
                    records += _emit(recs, sink)
            for c in on_device:
                if c == "agent_long":
                    mine = {FP8_DAY: _fp8_for_agent_long(model, sizes, measured)} if day == FP8_DAY else {}
                    records += run_long(model, [day], sizes, repeats=repeats, state=states[c], overrides=mine, **kw)
                elif c in ("chat", "agent"):
                    records += run_workload(c, model, [day], sizes, state=states[c], **kw)
            if verbose:
                print(f"[engine] day {day}: {time.perf_counter() - t:.1f} s", flush=True)
    prices = prices_from_records(measured, cfg=model.cfg) if measured else None
    for c in sweeps:
        if end is not None and time.perf_counter() > end:
            print(f"[engine] deadline: sweep {c} not started", flush=True)
            continue
        t = time.perf_counter()
        records += run_load(model, days, sizes, case=c, prices=prices, repeats=repeats, verbose=verbose, sink=sink,
                            deadline=end)
        if verbose:
            print(f"[engine] case {c}: {time.perf_counter() - t:.1f} s", flush=True)
    return records
