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

The cases live in modules of their own: :mod:`.suite_engine_days` (sizes, each day's engine,
rehearsal, the records' common fields, :func:`~.suite_engine_days.day_ratio`),
:mod:`.suite_engine_sessions` (``chat``, ``agent``), :mod:`.suite_engine_agent_long`,
:mod:`.suite_engine_load` (``load``, ``preemption``) with the step prices of
:mod:`.suite_engine_prices`, and :mod:`.suite_engine_timeline` (a simulated run, step by step).
"""
from __future__ import annotations

import argparse
import time

from minimax_lab import runtime
from minimax_lab.engine.config import m3_config, param_count
from minimax_lab.engine.model_m3 import M3Model
from minimax_lab.engine.options import DAYS, day_index
from minimax_lab.bench.suite_engine_agent_long import run_long
from minimax_lab.bench.suite_engine_days import _sync, sizes_for
from minimax_lab.bench.suite_engine_load import run_load
from minimax_lab.bench.suite_engine_sessions import run_workload


CASES = ("chat", "agent", "agent_long", "load", "preemption")


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
                            help="serve each day once untimed before timing it (default: on a GPU)")}


def run(preset: str = "auto", cases=None, *, days=None, sizes: dict | None = None, verbose: bool = True,
        sink=None, rehearse: bool | None = None) -> list[dict]:
    """The suite: ``cases`` (default: the preset's; any of :data:`CASES`) on ``days`` (default all,
    numbers or names), at the preset's sizes (:data:`~.suite_engine_days.GPU_SIZES`,
    :data:`~.suite_engine_days.CPU_SIZES`) or ``sizes`` (a dict of the same keys). Returns the
    records; ``sink`` (a callable), if given, receives each day's records as soon as that day is
    done -- the CLI writes them there, so a run cut short keeps the days it finished. ``rehearse``: see the module docstring (``None``: on a GPU)."""
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
