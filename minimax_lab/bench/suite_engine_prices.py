"""Bench suite ``engine``: the prices of engine steps that a simulated clock charges -- fitted to the
steps a GPU run measured, read from the recorded H200 ``step_cost`` records, or measured now on
this machine (:func:`calibrate_cpu`) -- and the rate one-at-a-time serving sustains at a price.
"""
from __future__ import annotations

import dataclasses

import torch

from minimax_lab import measure, runtime
from minimax_lab.engine.clock import StepCost, StepShape, chunk_pairs
from minimax_lab.engine.config import GPU
from minimax_lab.engine.engine import Engine
from minimax_lab.engine.model_m3 import M3Model
from minimax_lab.engine.options import DAYS, day_options
from minimax_lab.engine.sampling import SamplingParams
from minimax_lab.bench.suite_kvcache_tiers import measure_host_device_bandwidth
from minimax_lab.bench.suite_engine_days import GPU_SIZES, SUITE


PRICE_DEVICE = "NVIDIA H200"


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
