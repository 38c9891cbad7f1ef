"""Bench suite ``engine``: a small simulated run recorded step by step -- which requests each step
prefills, decodes and preempts, and when each arrives and finishes -- the events chapter 09's
timeline draws (:func:`minimax_lab.viz.engine.timeline.plot_timeline`).
"""
from __future__ import annotations

import dataclasses

from minimax_lab.engine.arrivals import poisson_arrivals
from minimax_lab.engine.clock import SimulatedClock, StepCost
from minimax_lab.engine.config import M3Config
from minimax_lab.engine.engine import Engine
from minimax_lab.engine.model_m3 import M3Model
from minimax_lab.engine.options import day_options
from minimax_lab.engine.load import serve_arrivals
from minimax_lab.bench.suite_engine_prices import Prices, gpu_prices, one_at_a_time_rate


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


def timeline_example(prices: Prices | None = None, *, requests: int = 10, seed: int = 2) -> dict:
    """A small run to draw (:func:`timeline`): ``requests`` Poisson arrivals (prompts of 1-6 pages,
    answers of 2-4 pages) on day 6 with preemption by recompute, in a pool of 16 pages, at about
    three times the rate one-at-a-time serving sustains, priced as the sweeps are (default
    :func:`~.suite_engine_prices.gpu_prices`: the GPU-size model)."""
    prices = gpu_prices() if prices is None else prices
    cfg, prices = prices.cfg, {d: costs[0] for d, costs in prices.by_day.items()}
    day = max(prices) if 6 not in prices else 6
    ps = cfg.block_size
    probe = poisson_arrivals(cfg, requests, 1.0, prompt_tokens=(ps, 6 * ps), max_tokens=(2 * ps, 4 * ps), seed=seed)
    rate = 3 * one_at_a_time_rate(prices[day], probe)
    arrivals = poisson_arrivals(cfg, requests, rate, prompt_tokens=(ps, 6 * ps), max_tokens=(2 * ps, 4 * ps),
                                seed=seed)
    out = timeline(cfg, prices[day], day, arrivals, kv_tokens=16 * ps, max_batch=8, step_tokens=4 * ps,
                   preemption="recompute")
    return {**out, "day": day, "prices": prices[day].source}
