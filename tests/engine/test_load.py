"""Arrivals, the simulated clock and its prices, and the load metrics."""
import dataclasses
import math

import numpy as np
import pytest
import torch
from tests.support.devices import DEVICE

from minimax_lab.engine import Engine, EngineOptions, M3Model, day_options, m3_config
from minimax_lab.engine.arrivals import Arrival, mooncake_arrivals, poisson_arrivals, poisson_times
from minimax_lab.engine.clock import SimulatedClock, StepCost, StepShape, WallClock, chunk_pairs
from minimax_lab.engine.load import SLO, load_metrics, max_goodput_rate, percentile, serve_arrivals, sweep
from minimax_lab.kvcache.trace import Request

CFG = m3_config("cpu")
COST = StepCost(fixed_ms=3.0, decode_ms=0.2, prefill_token_ms=0.05, attend_ms_per_mpair=10.0, host_gbps=5.0)
BATCHED = dataclasses.replace(day_options(6, cuda_graphs_available=False), max_batch=8, step_tokens=64)


@pytest.fixture(scope="module")
def shell():
    return M3Model.create(CFG, "meta")


def simulate(model, arrivals, opts=BATCHED, cost=COST, kv_tokens=4096):
    eng = Engine(model, opts, kv_tokens=kv_tokens, clock=SimulatedClock(cost))
    return eng, serve_arrivals(eng, arrivals)


def percentiles(result):
    m = load_metrics(result, SLO(0.2, 0.02))
    return {k: m[k] for k in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "throughput_tok_s")}


def test_a_poisson_load_at_a_fixed_seed_gives_the_same_percentiles_twice(shell):
    arrivals = lambda seed: poisson_arrivals(CFG, 40, 50.0, prompt_tokens=(16, 120), max_tokens=(4, 24), seed=seed)  # noqa: E731
    first, second = percentiles(simulate(shell, arrivals(7))[1]), percentiles(simulate(shell, arrivals(7))[1])
    assert first == second and all(v > 0 for v in first.values())
    assert percentiles(simulate(shell, arrivals(8))[1]) != first


def test_the_model_computing_changes_no_time_on_a_simulated_clock():
    """The same load with real weights (tokens computed) and without (placeholders): same times."""
    model = M3Model.create(CFG, DEVICE)
    arrivals = poisson_arrivals(CFG, 6, 30.0, prompt_tokens=(10, 40), max_tokens=(2, 5), seed=3)
    opts = dataclasses.replace(EngineOptions(), continuous_batching=True, max_batch=4, step_tokens=32)
    real = percentiles(simulate(model, arrivals, opts)[1])
    assert real == percentiles(simulate(M3Model.create(CFG, "meta"), arrivals, opts)[1])


def test_poisson_arrivals_come_at_the_rate_and_are_distinct():
    times = poisson_times(4000, 20.0, seed=1)
    gaps = np.diff([0.0] + times)
    assert abs(gaps.mean() - 1 / 20) < 0.05 / 20 and abs(gaps.std() / gaps.mean() - 1) < 0.1   # exponential: cv 1
    arr = poisson_arrivals(CFG, 30, 5.0, prompt_tokens=(20, 40), max_tokens=(3, 9), shared_prefix=8, seed=2)
    assert len({a.prompt for a in arr}) == 30 and len({a.prompt[:8] for a in arr}) == 1
    assert all(20 <= len(a.prompt) <= 40 and 3 <= a.max_tokens <= 9 for a in arr)
    assert arr == poisson_arrivals(CFG, 30, 5.0, prompt_tokens=(20, 40), max_tokens=(3, 9), shared_prefix=8, seed=2)
    for bad in (dict(rate=0.0), dict(rate=float("inf")), dict(prompt_tokens=(5, 2)), dict(shared_prefix=30)):
        with pytest.raises(ValueError):
            poisson_arrivals(CFG, 3, **{"rate": 1.0, "prompt_tokens": (20, 40), **bad})


def test_mooncake_arrivals_keep_the_traces_sharing_and_scale_it():
    trace = [Request(0, 1024, 5, [0, 1]), Request(500, 1500, 300, [0, 1, 2]), Request(1500, 700, 2, [7, 8])]
    arr = mooncake_arrivals(CFG, 3, rate=4.0, block_tokens=16, max_tokens=64, trace=trace)
    assert [len(a.prompt) for a in arr] == [32, 47, 22] and [a.max_tokens for a in arr] == [5, 64, 2]
    assert arr[1].prompt[:32] == arr[0].prompt and arr[2].prompt[:16] != arr[0].prompt[:16]
    assert arr[-1].time_s == pytest.approx(2 / 4.0) and arr[0].time_s == 0.0       # 3 requests at 4/s: 0.5 s
    own = mooncake_arrivals(CFG, 3, block_tokens=16, trace=trace)
    assert [a.time_s for a in own] == [0.0, 0.5, 1.5]
    shipped = mooncake_arrivals(CFG, 50, rate=10.0)
    assert len(shipped) == 50 and all(1 <= len(a.prompt) <= CFG.max_seq_len for a in shipped)
    with pytest.raises(ValueError, match="within the trace"):
        mooncake_arrivals(CFG, 4, trace=trace)


def test_step_cost_fit_recovers_the_prices():
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(60):
        shape = StepShape(int(rng.integers(0, 32)), int(rng.integers(0, 500)), int(rng.integers(0, 10**6)))
        samples.append((shape, COST.ms(shape)))
    fit = StepCost.fit(samples)
    for name in ("fixed_ms", "decode_ms", "prefill_token_ms", "attend_ms_per_mpair"):
        assert getattr(fit, name) == pytest.approx(getattr(COST, name), rel=1e-6)
    decodes_only = StepCost.fit([(StepShape(decodes=b), 2.0 + 0.5 * b) for b in (1, 2, 4, 8)])
    assert decodes_only.prefill_token_ms == 0 and decodes_only.decode_ms == pytest.approx(0.5)
    negative = StepCost.fit([(StepShape(decodes=b), 10.0 - b) for b in (1, 2, 4, 8)])   # would fit a negative slope
    assert negative.decode_ms == 0 and negative.fixed_ms > 0
    assert StepCost.from_dict(COST.to_dict()) == COST
    assert COST.ms(StepShape(swap_bytes=5 * 10**6)) == pytest.approx(3.0 + 1.0)      # 5 MB at 5 GB/s
    with pytest.raises(ValueError):
        StepCost(-1.0, 0, 0, 0)
    with pytest.raises(ValueError):
        StepCost.fit([])
    assert chunk_pairs(0, 4) == 10 and chunk_pairs(4, 6) == 11


def test_simulated_time_is_the_sum_of_step_prices(shell):
    eng, res = simulate(shell, poisson_arrivals(CFG, 1, 1.0, prompt_tokens=(50, 50), max_tokens=(5, 5), seed=0))
    prices = [COST.ms(st.shape) / 1e3 for st in eng.step_times]
    seq = res.sequences[0]
    assert seq.finished - seq.arrival == pytest.approx(sum(prices))
    assert seq.first_token - seq.arrival == pytest.approx(prices[0])          # the whole prompt in one step
    assert [st.shape.prefill_tokens for st in eng.step_times] == [50, 0, 0, 0, 0]
    assert eng.step_times[1].shape.attended == 51


def test_ttft_counts_the_wait_behind_the_running_request(shell):
    one_at_a_time = day_options(5, cuda_graphs_available=False)
    arrivals = [Arrival(0.0, tuple(range(1, 40)), 10), Arrival(0.001, tuple(range(2, 30)), 3)]
    eng, res = simulate(shell, arrivals, one_at_a_time)
    a, b = res.sequences
    assert b.first_token > a.finished and b.first_token - b.arrival > a.finished - a.arrival - 0.001


def test_load_metrics_and_goodput(shell):
    arrivals = poisson_arrivals(CFG, 30, 20.0, prompt_tokens=(16, 64), max_tokens=(4, 12), seed=4)
    _, res = simulate(shell, arrivals)
    m = load_metrics(res, SLO(10.0, 1.0))
    assert m["requests"] == 30 and m["slo_attainment"] == 1.0 and m["goodput_rps"] == pytest.approx(30 / m["duration_s"])
    assert m["output_tokens"] == sum(a.max_tokens for a in arrivals)
    strict = load_metrics(res, SLO(1e-6, 1e-6))
    assert strict["slo_attainment"] == 0.0 and strict["goodput_rps"] == 0.0
    rows = sweep(lambda r: simulate(shell, poisson_arrivals(CFG, 30, r, prompt_tokens=(16, 64), max_tokens=(4, 12),
                                                             seed=4))[1], [5.0, 500.0], SLO(0.05, 0.01))
    assert rows[0]["ttft_p99_ms"] < rows[1]["ttft_p99_ms"] and rows[0]["rate"] == 5.0
    assert max_goodput_rate(rows) == (5.0 if rows[0]["slo_attainment"] >= 0.9 else None)
    for q in (0, 10, 50, 99, 100):
        xs = [3.0, 1.0, 7.0, 2.0, 9.5]
        assert percentile(xs, q) == pytest.approx(np.percentile(xs, q))
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        SLO(0.0, 1.0)


def test_a_model_without_weights_needs_a_simulated_clock(shell):
    with pytest.raises(ValueError, match="SimulatedClock"):
        Engine(shell, EngineOptions(), kv_tokens=256)
    with pytest.raises(TypeError):
        Engine(shell, EngineOptions(), kv_tokens=256, clock="fast")
    assert not WallClock().simulated and SimulatedClock(COST).now() == 0.0
    with pytest.raises(ValueError, match="sorted"):
        serve_arrivals(Engine(shell, EngineOptions(), kv_tokens=256, clock=SimulatedClock(COST)),
                       [Arrival(1.0, (1, 2), 2), Arrival(0.5, (1, 2), 2)])


@pytest.mark.parametrize("policy", ["recompute", "swap"])
def test_arrivals_into_a_small_pool_preempt_and_give_the_unpreempted_tokens(policy):
    """A fuzz through serve_arrivals: Poisson loads on a pool too small for them all, preempting by
    ``policy``; every run ends, and every request gets the tokens of a run with ample memory."""
    model = M3Model.create(CFG, DEVICE)
    opts = EngineOptions(continuous_batching=True, max_batch=4, step_tokens=48, preemption=policy)
    preempted = 0
    for seed in range(8):
        arrivals = poisson_arrivals(CFG, 5, 200.0, prompt_tokens=(16, 48), max_tokens=(8, 24), seed=seed)
        eng, res = simulate(model, arrivals, opts, kv_tokens=6 * CFG.block_size)
        _, ample = simulate(model, arrivals, dataclasses.replace(opts, preemption=None))
        assert [s.output for s in res.sequences] == [s.output for s in ample.sequences], seed
        assert all(len(s.output) == a.max_tokens for s, a in zip(res.sequences, arrivals))
        eng.blocks.check_invariants()
        assert not eng.blocks.seqs and res.preemptions == eng.scheduler.preemptions
        preempted += res.preemptions > 0
        assert (res.swap_bytes > 0) == (policy == "swap" and res.preemptions > 0)
    assert preempted >= 4, f"only {preempted} of 8 runs preempted"


@pytest.mark.parametrize("time_s", [float("nan"), float("inf"), -0.5, "1", True])
def test_an_arrival_at_no_real_time_is_refused(shell, time_s):
    """NaN would never be reached (serve_arrivals used to spin), +inf gave NaN percentiles, a
    negative time counted into TTFT: each is refused when the Arrival is made."""
    with pytest.raises((TypeError, ValueError), match="time_s"):
        Arrival(time_s, (1, 2, 3), 2)


@pytest.mark.parametrize("kw, match", [(dict(prompt=()), "prompt"), (dict(prompt=(1, -2)), "prompt"),
                                       (dict(prompt=(1.5,)), "prompt"), (dict(max_tokens=0), "max_tokens"),
                                       (dict(max_tokens=2.0), "max_tokens")])
def test_an_arrival_without_a_prompt_or_an_answer_is_refused(kw, match):
    with pytest.raises((TypeError, ValueError), match=match):
        Arrival(**{"time_s": 0.0, "prompt": (1, 2, 3), "max_tokens": 2, **kw})


def test_the_clocks_refuse_to_wait_for_no_real_time():
    clock = SimulatedClock(COST)
    for t in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(ValueError, match="finite"):
            clock.wait_until(t)
        with pytest.raises(ValueError, match="finite"):
            WallClock().wait_until(t)
    clock.wait_until(2.5)
    assert clock.now() == 2.5
    with pytest.raises(ValueError, match="finite"):
        SimulatedClock(COST, start=float("nan"))


@pytest.mark.parametrize("rate", [float("nan"), -1.0, 0.0, 0, float("inf"), "2"])
@pytest.mark.parametrize("stamps", [(0, 500, 1500), (0,), (700, 700, 700)], ids=["spread", "one", "equal"])
def test_mooncake_arrivals_check_the_rate_whatever_the_slice(rate, stamps):
    """The rate is checked even where the slice spans no time (one request, equal stamps)."""
    trace = [Request(t, 64, 4, [i]) for i, t in enumerate(stamps)]
    with pytest.raises(ValueError, match="rate"):
        mooncake_arrivals(CFG, len(trace), rate=rate, block_tokens=16, trace=trace)


def test_mooncake_arrivals_at_equal_stamps_come_at_the_rate():
    trace = [Request(700, 64, 4, [i]) for i in range(3)]
    arr = mooncake_arrivals(CFG, 3, rate=4.0, block_tokens=16, trace=trace)
    assert [a.time_s for a in arr] == [0.0, 0.25, 0.5]


def test_serving_arrivals_stamps_and_checks_a_finite_arrival(shell):
    eng = Engine(shell, BATCHED, kv_tokens=1024, clock=SimulatedClock(COST))
    with pytest.raises(ValueError, match="arrival"):
        eng.add_request([1, 2, 3], arrival=float("nan"))
    res = serve_arrivals(eng, [Arrival(0.0, (1, 2, 3), 2), Arrival(5.0, (4, 5), 3)])
    m = load_metrics(res, SLO(1.0, 1.0))
    assert m["requests"] == 2 and all(math.isfinite(m[k]) for k in ("ttft_p50_ms", "ttft_p99_ms", "duration_s"))
    assert res.sequences[1].arrival == pytest.approx(5.0) and res.sequences[1].first_token > 5.0
