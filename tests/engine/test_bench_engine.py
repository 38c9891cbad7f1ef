"""The engine bench suite on the CPU: records, rehearsal and its refusal of mixed comparisons, the
honest decode batch, step prices (measured, recorded, modelled), the simulated sweeps priced day by
day, the recording command end to end; and what its pictures and sentences read from records."""
import dataclasses
import json
import warnings

import matplotlib
import pytest
import torch
from tests.support.devices import DEVICE

from minimax_lab import measure
from minimax_lab.bench import cli
from minimax_lab.bench import suite_engine as engine_bench
from minimax_lab.bench import (suite_engine_agent_long, suite_engine_days, suite_engine_load, suite_engine_prices,
                               suite_engine_sessions)
from minimax_lab.engine import DAYS, M3Model, day_options, m3_config, param_count
from minimax_lab.engine.clock import SimulatedClock, StepCost, StepShape, chunk_pairs
from minimax_lab.engine.config import GPU
from minimax_lab.engine.options import DAY_LABELS, fp8_choice
from minimax_lab.engine.traffic import decode_step_bytes, decode_step_flops, experts_touched, prefill_flops
from minimax_lab.viz import engine as veng
from minimax_lab.viz.engine.records import _days_text

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SMALL = {**suite_engine_days.CPU_SIZES,
         "chat": dict(users=1, turns=1, system_tokens=8, message_words=(1, 1), max_tokens=2),
         "agent_long": dict(codebase_tokens=20, tool_tokens=(2, 3), task_words=(1, 1), max_tokens=3, batch=3),
         "prices": dict(contexts=(20, 36), batches=(1, 3), decode_steps=2, prompts=(16,)),
         "load": dict(suite_engine_days.CPU_SIZES["load"], requests=8, rates=(1, 8), wall_rates=(50.0, 100.0)),
         "preemption": dict(suite_engine_days.CPU_SIZES["preemption"], requests=10, prompt_tokens=(16, 48),
                            max_tokens=(16, 64), kv_tokens=256, rates=(4, 32), days=(6,))}
#: a price for the tiny model's steps on every day (simulated sweeps need no measurement)
TINY = StepCost(2.0, 0.2, 0.02, 5.0, host_gbps=5.0, prefill_attend_ms_per_mpair=1.0)


def tiny_prices(**changes):
    by_day = {d: [TINY, StepCost(2.2, 0.2, 0.02, 5.0, host_gbps=5.0, prefill_attend_ms_per_mpair=1.0)]
              for d in range(len(DAYS))}
    return suite_engine_prices.Prices(by_day, "measured", "a test device", "torch 9.9, Triton 9.9", m3_config("cpu"),
                                      **changes)


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(engine_bench, "sizes_for", lambda preset: SMALL)
    return SMALL


def _keys(d, path=""):
    out = set()
    for k, v in d.items():
        out.add(f"{path}{k}")
        if isinstance(v, dict):
            out |= _keys(v, f"{path}{k}.")
    return out


def test_every_preset_has_every_size_key():
    """A key one preset lacks fails only on the machines that use it (a GPU): compare them here."""
    assert _keys(suite_engine_days.GPU_SIZES) == _keys(suite_engine_days.CPU_SIZES)
    assert _keys(suite_engine_days.smoke_sizes(suite_engine_days.GPU_SIZES)) == _keys(suite_engine_days.GPU_SIZES)
    assert engine_bench.sizes_for("cpu") is suite_engine_days.CPU_SIZES


def test_bench_records_day_by_day(small):
    handed = []
    recs = engine_bench.run("cpu", cases=["chat", "agent_long"], days=[0], verbose=False, sink=handed.append,
                            rehearse=False, repeats=2)
    # the sink gets each (case, day)'s records as soon as they exist, so a cut-short run keeps them
    assert [len(h) for h in handed] == [3, 4] and [r for h in handed for r in h] == recs
    assert {r["case"] for r in recs} == {"chat.ttft", "chat.itl", "chat.e2e", "agent_long.ttft_first",
                                         "agent_long.decode", "agent_long.itl", "agent_long.ttft_followup"}
    assert all(r["suite"] == "engine" and r["ms"] > 0 and r["impl"] == "d0_day0" for r in recs)
    e2e = next(r for r in recs if r["case"] == "chat.e2e")
    assert e2e["top1_agreement"] == 1.0 and e2e["model"]["params"] == param_count(m3_config("cpu"))
    assert e2e["rehearsed"] is False and "first_call_wall_s" not in e2e
    dec = next(r for r in recs if r["case"] == "agent_long.decode")
    assert dec["decode_batch"] == 1                 # day 0 serves one request at a time: no forks beside it
    assert dec["decode_bytes_per_step"] > dec["decode_kv_bytes"] > 0 and dec["decode_gbps"] > 0
    assert len(dec["repeats"]) == 2 and dec["ms"] == pytest.approx(sorted(x["decode_ms"] for x in dec["repeats"])[0]
                                                                   / 2 + sorted(x["decode_ms"] for x in dec["repeats"])[1] / 2)
    itl = next(r for r in recs if r["case"] == "agent_long.itl")
    assert 0 < itl["itl_p50_ms"] <= itl["itl_p99_ms"] and itl["ms"] == pytest.approx(itl["itl_p50_ms"])
    with pytest.raises(ValueError, match="case"):
        engine_bench.run("cpu", cases=["nope"])
    with pytest.raises(ValueError, match="repeats"):
        engine_bench.run("cpu", cases=["chat"], repeats=0)


def test_forks_count_against_the_days_batch_limit():
    m = M3Model.create(m3_config("cpu"), "meta")
    batches = [suite_engine_agent_long.decode_batch(m, d, SMALL) for d in range(len(DAYS))]
    assert batches == [1] * 6 + [3, 3]


def test_rehearsal_runs_on_a_throwaway_engine_and_records_the_first_call(small, monkeypatch):
    built = []
    real = suite_engine_days._engine
    for module in (suite_engine_sessions, suite_engine_agent_long):  # where each case builds its engines
        monkeypatch.setattr(module, "_engine", lambda *a, **kw: built.append(real(*a, **kw)) or built[-1])
    recs = engine_bench.run("cpu", cases=["chat", "agent_long"], days=[0, 6], verbose=False, rehearse=True, repeats=1)
    assert len(built) == 8 and all(e.steps > 0 for e in built)      # (throwaway, timed) per case and day
    assert built[1].blocks is not built[0].blocks
    assert {r["impl"] for r in recs} == {"d0_day0", "d6_continuous_batching"} and all(r["rehearsed"] for r in recs)
    long6 = next(r for r in recs if r["case"] == "agent_long.ttft_first" and r["day"] == 6)
    assert long6["first_call_ttft_first_ms"] > 0 and long6["first_call_ttft_followup_ms"] > 0
    assert long6["first_call_itl_p99_ms"] > 0
    chat6 = next(r for r in recs if r["case"] == "chat.e2e" and r["day"] == 6)
    assert chat6["top1_agreement"] == 1.0 and chat6["first_call_wall_s"] > 0
    m = M3Model.create(m3_config("cpu"), "meta")
    assert not suite_engine_days._rehearses(m, None) and suite_engine_days._rehearses(m, True)


def test_rehearsal_refuses_mixed_comparisons():
    a = {"case": "agent_long.ttft_followup", "day": 5, "ms": 1300.0, "rehearsed": False}
    b = {"case": "agent_long.ttft_followup", "day": 6, "ms": 77.0, "rehearsed": True}
    with pytest.raises(suite_engine_days.MixedRehearsal, match="re-record"):
        suite_engine_days.day_ratio(a, b)
    assert suite_engine_days.day_ratio({**a, "rehearsed": True}, b) == pytest.approx(1300 / 77)
    assert suite_engine_days.day_ratio(a, {**b, "rehearsed": False}) == pytest.approx(1300 / 77)
    with pytest.raises(ValueError, match="positive"):
        suite_engine_days.day_ratio({**a, "ms": None}, {**b, "rehearsed": False})
    assert veng.change((1300.0, a), (77.0, b), False) == (None, "mixed rehearsal")
    # two unrehearsed GPU records: each may hold a different amount of compiling, so no ratio either
    cold = {**b, "rehearsed": False}
    assert veng.change((1300.0, a), (77.0, cold), False) == (None, "not rehearsed")
    assert veng.change((1300.0, a), (77.0, cold), False, timed=False)[0] == pytest.approx(1300 / 77)
    # the interpreter compiles nothing, nor does a day running PyTorch alone: their records compare
    live = {"interpreter": True, "rehearsed": False}
    assert veng.change((4.0, {**a, **live}), (2.0, {**b, **live}), False) == (2.0, "")
    torch_only = {**a, "options": day_options(0).to_dict()}
    assert veng.comparable(torch_only, b) is None and veng.comparable({**torch_only, "day": 0}, torch_only) is None
    assert veng.comparable(torch_only, cold) == "mixed rehearsal"


def test_step_prices_tell_a_decode_rows_context_from_a_chunks_pairs():
    """A decode row reads its context, a chunk computes its pairs: priced apart, both are recovered."""
    truth = StepCost(1.0, 0.05, 0.01, 2.0, prefill_attend_ms_per_mpair=0.1)
    shapes = [StepShape(decodes=b, attended=b * c) for b in (1, 8, 32) for c in (1000, 16000)]
    shapes += [StepShape(prefill_tokens=n, attended=chunk_pairs(0, n), prefill_pairs=chunk_pairs(0, n))
               for n in (512, 2048, 8192)]
    fit = StepCost.fit([(s, truth.ms(s)) for s in shapes])
    for name in ("fixed_ms", "decode_ms", "prefill_token_ms", "attend_ms_per_mpair", "prefill_attend_ms_per_mpair"):
        assert getattr(fit, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    lumped = StepCost(1.0, 0.05, 0.01, 2.0)                   # no chunk price: pairs priced as before
    assert lumped.ms(shapes[-1]) == pytest.approx(1.0 + 0.01 * 8192 + 2.0 * chunk_pairs(0, 8192) / 1e6)
    assert StepCost.from_dict(truth.to_dict()) == truth
    m = M3Model.create(m3_config("cpu"), "meta")
    eng = suite_engine_days._engine(m, 6, SMALL, kv_tokens=512, clock=SimulatedClock(truth))
    eng.add_request(list(range(30)), request_id="a")
    eng.step()
    first = eng.step_times[0].shape
    assert first.prefill_pairs == first.attended == chunk_pairs(0, first.prefill_tokens)


def test_prices_are_measured_per_day_with_repeats_and_a_first_call(small):
    m = M3Model.create(m3_config("cpu"), DEVICE)
    rec, = suite_engine_prices.measure_prices(m, 0, SMALL, repeats=2, rehearse=True, host_gbps=10.0)
    least = suite_engine_days.smoke_sizes(SMALL)          # a Triton day in the interpreter: the least that runs
    assert rec["case"] == "step_cost" and rec["impl"] == "d0_day0" and rec["rehearsed"] is True
    assert len(rec["step_costs"]) == 2 and len(rec["decode_tok_s_repeats"]) == 2
    assert set(rec["first_call_decode_ms"]) == {"20x1", "20x3", "36x1", "36x3"} and rec["first_call_prefill_ms"]
    assert rec["decode_batch"] == 3 and rec["decode_context"] == 36
    samples = rec["repeats"][0]["samples"]
    assert any(s[0] == 3 for s in samples) and any(s[1] > 0 and s[3] > 0 for s in samples)   # decodes, chunks
    prices = suite_engine_prices.prices_from_records([rec], cfg=m.cfg)
    assert prices.by_day[0][0] == StepCost.from_dict(rec["step_costs"][0]) and prices.repeats() == 2
    variant, = suite_engine_prices.measure_prices(m, 7, least, repeats=1, rehearse=False, host_gbps=10.0,
                                                  variant="fp8_kv")
    assert variant["impl"] == "d7_fp8_fp8_kv" and variant["options"]["kv_dtype"] == "fp8_e4m3"
    assert variant["options"]["expert_dtype"] is None and variant["options"]["continuous_batching"]
    both = suite_engine_prices.prices_from_records([rec, variant], cfg=m.cfg)
    assert set(both.by_day) == {0} and set(both.variants) == {"fp8_kv"}


def test_recorded_prices_come_from_the_device_that_priced_most_days(monkeypatch):
    def rec(device, day, when):
        return {"suite": "engine", "case": "step_cost", "impl": f"d{day}_{DAYS[day][0]}", "day": day, "device": device,
                "torch": "2.11.0+cu130", "triton": "3.6.0", "when": when, "step_costs": [TINY.to_dict()] * 3}
    recs = [rec("GPU A", 0, "2027-01-01"), rec("GPU B", 0, "2027-01-02"), rec("GPU B", 6, "2027-01-02")]
    monkeypatch.setattr(measure, "load_records", lambda device=None, suite=None, **kw: recs)
    got = suite_engine_prices.recorded_prices()
    assert got.device == "GPU B" and set(got.by_day) == {0, 6} and got.kind == "recorded"
    assert got.label() == "each day's steps measured on the GPU B, torch 2.11, Triton 3.6" and got.repeats() == 3


def test_modelled_prices_price_every_day_from_the_h200_records():
    prices = suite_engine_prices.modelled_prices()
    assert prices is not None and set(prices.by_day) == set(range(len(DAYS))), "the shipped H200 records are gone"
    assert prices.kind == "modelled" and "model of NVIDIA H200 steps" in prices.label() and "Triton 3.6" in prices.label()
    one = {d: c[0] for d, c in prices.by_day.items()}
    same = lambda c: dataclasses.replace(c, source="")  # noqa: E731
    assert same(one[4]) == same(one[5]) == same(one[6])     # scheduling switches run their kernels' price
    b32 = lambda c: c.ms(StepShape(decodes=32, attended=32 * 131_072))  # noqa: E731
    for day in range(len(DAYS)):                         # the model reproduces the recorded decode of 32 at 131k
        rec = measure.load_records("NVIDIA H200", suite="engine")
        r = next(x for x in rec if x["case"].startswith("agent_long.decode") and x["day"] == day)
        assert b32(one[day]) == pytest.approx(r["ms"], rel=0.15), day
    assert b32(one[0]) > 4 * b32(one[1]) and b32(one[3]) > 2 * b32(one[4])
    assert all(c.host_gbps and c.prefill_attend_ms_per_mpair for c in one.values())


def test_fp8_switches_on_only_what_pays():
    times = {(): 10.0, ("kv", "experts"): 11.0, ("kv",): 9.0, ("experts",): 10.5}
    assert fp8_choice(times) == {"kv_dtype": "fp8_e4m3", "expert_dtype": None}
    assert fp8_choice({(): 10.0, ("kv", "experts"): 11.0}) == {"kv_dtype": None, "expert_dtype": None}
    assert fp8_choice({(): 10.0, ("kv", "experts"): 11.0}, pool_fills=True) == {"kv_dtype": "fp8_e4m3",
                                                                                "expert_dtype": "fp8_e4m3"}
    assert fp8_choice({(): 10.0, ("kv",): 10.0}) == {"kv_dtype": None, "expert_dtype": None}   # a tie: no change
    with pytest.raises(ValueError, match="candidate"):
        fp8_choice({("disk",): 1.0})
    bf16 = StepCost(1.0, 0.04, 0.005, 0.8)
    cheaper_kv = StepCost(1.1, 0.05, 0.005, 0.5)         # costs more per step, less per context token read
    where, L = veng.fp8_break_even(bf16, cheaper_kv, batch=32)
    assert where == "above" and bf16.ms(StepShape(decodes=32, attended=32 * int(L * 1.01))) > cheaper_kv.ms(
        StepShape(decodes=32, attended=32 * int(L * 1.01)))
    assert veng.fp8_break_even(bf16, StepCost(1.1, 0.05, 0.005, 0.9)) == ("never", None)
    assert veng.fp8_break_even(bf16, StepCost(0.9, 0.03, 0.005, 0.5)) == ("always", None)
    lines = veng.fp8_threshold_lines(tiny_prices(variants={"fp8_kv": [cheaper_kv]}))
    assert len(lines) == 2 and lines[1].startswith("the KV cache alone in FP8")


def test_the_fp8_day_in_a_sweep_stores_only_what_pays():
    w = SMALL["preemption"]
    prices = tiny_prices()
    slow = StepCost(3.0, 0.3, 0.03, 6.0, host_gbps=5.0)
    prices.by_day[7] = [slow, slow]
    base = suite_engine_load.base_arrivals(prices.cfg, w, "preemption", 0)
    opts, cost, why = suite_engine_load.fp8_overrides(prices, 0, base, {**w, "kv_tokens": 10**6}, prices.cfg)
    assert opts == {"kv_dtype": None, "expert_dtype": None} and cost == TINY and why["chosen"] == "none"
    opts, cost, why = suite_engine_load.fp8_overrides(prices, 0, base, w, prices.cfg)    # 256 tokens: it fills
    assert opts["kv_dtype"] == "fp8_e4m3" and why["pool_fills"] and cost == slow


def test_simulated_sweeps_price_every_day_by_its_own_steps():
    prices = tiny_prices()
    prices.by_day[1] = [StepCost(20.0, 2.0, 0.2, 50.0, host_gbps=5.0)] * 2       # a slow day
    recs = suite_engine_load.simulate_sweep(prices, [0, 1, 6], SMALL, case="load", repeats=3, verbose=False)
    load = [r for r in recs if r["case"].startswith("load_mooncake.")]
    assert {r["impl"] for r in load} == {"d0_day0_sim", "d1_triton_msa_sim", "d6_continuous_batching_sim"}
    assert all(r["clock"] == "simulated" and r["ms"] == pytest.approx(r["ttft_p99_ms"]) and len(r["repeats"]) == 3
               for r in load)
    assert all(r["prices"] == prices.label() and r["prices_kind"] == "measured" for r in load)
    itl = {r["day"]: r["itl_p50_ms"] for r in load if r["rate"] == min(x["rate"] for x in load)}
    assert itl[1] > 5 * itl[0]                                        # the slow day's own price shows
    # repeat r serves slice r of the trace with the r-th price
    assert load[0]["repeats"][0] != load[0]["repeats"][1]
    led = veng.sweep_ledger(recs)
    assert [r["day"] for r in led] == [0, 1, 6] and all(len(r["itl_p50_ms"]) == 3 for r in led)
    said = veng.ledger_sentences(led)
    assert said[0].startswith("day 1: Triton MSA: ") and "costs" in said[0] and "ITL p50 rose" in said[0]
    assert "TTFT p50 (ms)" in veng.format_ledger(led)
    fig_axes = veng.plot_sweep(recs)
    assert len(fig_axes) == 6 and len(fig_axes[0].get_lines()) >= 3
    legend = [t.get_text() for t in fig_axes[0].figure.legends[0].get_texts()]
    assert legend[:3] == [DAY_LABELS[0], DAY_LABELS[1], DAY_LABELS[6]]
    plt.close(fig_axes[0].figure)


def test_preemption_sweep_compares_policies(small):
    recs = suite_engine_load.simulate_sweep(tiny_prices(), [6, 7], SMALL, case="preemption", repeats=2, verbose=False,
                                            policies={7: ("recompute",)})
    pre = [r for r in recs if r["case"].startswith("preempt")]
    assert {(r["day"], r["policy"]) for r in pre} == {(6, "reserve"), (6, "recompute"), (6, "swap")}  # 7: not in days
    assert sum(r["preemptions"] for r in pre if r["policy"] == "reserve") == 0
    curves = veng.sweep_curves(recs, case="preemption")
    assert [k[1] for k in curves] == ["reserve", "recompute", "swap"]
    said = veng.goodput_sentences(recs, case="preemption", by="policy")
    assert len(said) == 3 and said[0].startswith("reserve up front: at most")
    compared = veng.curve_comparison(recs, case="preemption", by="policy")
    assert len(compared) == 2 and all("reserve up front" in c for c in compared)
    axes = veng.plot_preemption(recs)
    assert len(axes) == 6
    plt.close(axes[0].figure)
    lines = veng.sweep_lines(recs, case="preemption")
    assert len(lines) == 1 and lines[0].startswith("Poisson arrivals, 10 requests per rate, 2 repeats")
    assert "set from the step prices" in lines[0]
    with pytest.raises(ValueError, match="no load sweep records"):
        veng.plot_sweep(pre, case="load")


@pytest.mark.parametrize("case", ["load", "preemption"])
def test_wall_clock_sweeps_keep_the_rehearsals_first_call(small, case):
    """The rehearsal's numbers are kept as first-call columns, not thrown away."""
    model = M3Model.create(m3_config("cpu"), DEVICE)
    sizes = {**SMALL, case: {**SMALL[case], "slo": (1.0, 0.1), "requests": 4, "days": (0,)}}
    recs = suite_engine_load.run_load(model, [0], sizes, case=case, verbose=False, wall_clock=True, rehearse=True)
    wall = [r for r in recs if r["case"].startswith(f"{case}_") and r["clock"] == "wall"]
    assert wall and all(r["rehearsed"] and r["first_call_ttft_p99_ms"] > 0 and r["first_call_rate"] == 100.0
                        and r["first_call_requests"] == 4 for r in wall)
    if case == "load":
        cost = next(r for r in recs if r["case"] == "step_cost")
        assert StepCost.from_dict(cost["step_cost"]).fixed_ms >= 0 and cost["variant"] == "load steps"


def test_the_recording_command_runs_end_to_end_at_preset_cpu(small, tmp_path):
    """The GPU recording command, at the CPU preset (smoke sizes), through the command line: records
    written as each day completes, the sweeps priced by the days it measured."""
    out = tmp_path / "engine.json"
    status = cli.main(["engine", "--preset", "cpu", "--smoke", "--days", "0", "--repeats", "2", "--deadline-s", "600",
                       "--out", str(out)])
    recs = json.loads(out.read_text())
    assert status == 0
    price, = [r for r in recs if r["case"] == "step_cost"]
    assert price["rehearsed"] and len(price["step_costs"]) == 2 and price["first_call_decode_ms"]
    long = [r for r in recs if r["case"].startswith("agent_long.")]
    assert len(long) == 4 and all(len(r["repeats"]) == 2 and r["first_call_ttft_first_ms"] > 0 for r in long)
    sims = [r for r in recs if r.get("clock") == "simulated"]
    assert sims and all(r["prices_kind"] == "measured" and len(r["repeats"]) == 2 for r in sims)
    assert {r["case"].split("_")[0] for r in sims} == {"load"}            # preemption: not on day 0
    with pytest.raises(SystemExit):
        cli.main(["engine", "--preset", "cpu", "--repeats", "0"])


def test_a_deadline_starts_no_new_day(small, capsys):
    recs = engine_bench.run("cpu", cases=["agent_long"], days=[0, 1], deadline_s=1e-9, verbose=False)
    assert recs == [] and "days from 0 on not started" in capsys.readouterr().out


@pytest.mark.slow
def test_the_recording_command_prices_every_kind_of_day_at_preset_cpu(tmp_path):
    """Day 0 (PyTorch), a Triton day with batching, and the FP8 day with its stores priced alone, through
    the command line: the step prices and the long agent session that chooses the FP8 stores from them
    (the load sweep and the short sessions run in the Python tests above)."""
    out = tmp_path / "engine.json"
    assert cli.main(["engine", "--preset", "cpu", "--smoke", "--days", "0", "6", "7", "--repeats", "1",
                     "--cases", "prices", "agent_long", "--out", str(out)]) == 0
    recs = json.loads(out.read_text())
    prices = {r["impl"] for r in recs if r["case"] == "step_cost"}
    assert prices == {"d0_day0", "d6_continuous_batching", "d7_fp8", "d7_fp8_fp8_kv", "d7_fp8_fp8_experts"}
    fp8 = next(r for r in recs if r["case"] == "agent_long.ttft_first" and r["day"] == 7)
    assert set(fp8["fp8_choice"]) == {"kv_dtype", "expert_dtype"} and fp8["top1_agreement"] is not None


@pytest.mark.slow
def test_the_recording_command_preempts_by_every_policy_at_preset_cpu(tmp_path):
    """The preemption case through the command line on the FP8 day: reserving, recomputing and swapping."""
    out = tmp_path / "engine.json"
    assert cli.main(["engine", "--preset", "cpu", "--smoke", "--days", "7", "--repeats", "1",
                     "--cases", "preemption", "--out", str(out)]) == 0
    recs = json.loads(out.read_text())
    assert {r["policy"] for r in recs if r["case"].startswith("preemption_")} == {"reserve", "recompute", "swap"}


def test_decode_and_prefill_traffic():
    fp8 = decode_step_bytes(GPU, batch=32, context=131_072, kv_dtype="fp8_e4m3", expert_dtype="fp8_e4m3")
    bf16 = decode_step_bytes(GPU, batch=32, context=131_072)
    assert 0.5 < fp8["kv"] / bf16["kv"] < 0.56 and fp8["total"] < bf16["total"]
    one = decode_step_bytes(GPU, batch=1, context=131_072)
    assert one["per_token"] > bf16["per_token"]            # batching shares the weight reads
    assert experts_touched(GPU, 1) == pytest.approx(8) and experts_touched(GPU, 10**4) == pytest.approx(128)
    assert decode_step_flops(GPU, batch=2, context=4096) > decode_step_flops(GPU, batch=1, context=4096)
    with pytest.raises(ValueError):
        decode_step_bytes(GPU, batch=0, context=10)
    p = prefill_flops(GPU, tokens=1000, pairs=chunk_pairs(0, 1000))
    assert p["total"] == pytest.approx(1000 * p["per_token"] + chunk_pairs(0, 1000) * p["per_pair"])
    assert p["per_token"] > 2 * param_count(GPU, activated=True) * 0.5     # about two FLOPs per weight read
    with pytest.raises(ValueError):
        prefill_flops(GPU, tokens=-1, pairs=0)


def fake_records(days, *, rehearsed=True, scale=1.0, batch_before_day6=1, device="NVIDIA H200", repeats=True):
    recs = []
    for d in days:
        opts = day_options(d).to_dict()
        reps = [{"ttft_first_ms": 2000.0 * (1 + (d == 6)) * s, "ttft_followup_ms": 1000.0 / (d + 1) * s, "itl_p50_ms": 20.0 / (d + 1) * s,
                 "itl_p99_ms": 30.0 / (d + 1) * s, "decode_ms": 50.0 * s} for s in (0.99, 1.0, 1.01)] if repeats else []
        extra = {"day": d, "switch": DAYS[d][0], "label": DAY_LABELS[d], "weights_gib": 5.0 - 0.1 * d,
                 "kv_cache_gib": 1.0 / (d + 1), "decode_tok_s": 100.0 * (d + 1) * scale,
                 "decode_batch": batch_before_day6 if d < 6 else 32, "device": device, "torch": "2.11.0+cu130",
                 "triton": "3.6.0", "logits_rel_err": 1e-3 * d, "token_err_p50": 5e-4 * d,
                 "top1_agreement": 1.0 - 0.01 * d, "compared_tokens": 64, "rehearsed": rehearsed, "options": opts,
                 "workload": {"context_tokens": 131_072, "max_tokens": 32}, "repeats": reps,
                 "itl_p50_ms": 20.0 / (d + 1) * scale, "itl_p99_ms": 30.0 / (d + 1) * scale,
                 **({"first_call_ttft_first_ms": 5000.0, "first_call_ttft_followup_ms": 900.0} if rehearsed else {})}
        impl = f"d{d}_{DAYS[d][0]}"
        for case, ms in (("agent_long.ttft_first", 2000.0 * (1 + (d == 6))), ("agent_long.ttft_followup", 1000.0 / (d + 1)),
                         ("agent_long.decode", 50.0), ("agent_long.itl", 20.0 / (d + 1)), ("agent.e2e", 900.0)):
            recs.append({**measure.make_record("engine", case, impl, ms * scale, extra=extra), "device": device})
        recs.append({**measure.make_record("engine", "step_cost", impl, 10.0, extra={
            **extra, "decode_batch": 32, "decode_tok_s": 3200.0 * (d + 1), "decode_context": 16_384,
            "decode_tok_s_repeats": [3100.0 * (d + 1), 3200.0 * (d + 1), 3300.0 * (d + 1)],
            "step_costs": [TINY.to_dict()] * 3}), "device": device})
    return recs


def test_day_table_and_ledger_read_the_records():
    recs = fake_records([0, 5, 6])
    v = veng.day_values(recs)
    assert v["ttft_followup"][6][0] == pytest.approx(1000 / 7) and v["batch"] == {0: 1, 5: 1, 6: 32}
    assert len(v["itl"][6][2]) == 3 and v["decode_b32"][6][0] == pytest.approx(3200 * 7)
    table = veng.day_table(recs)
    assert "day 6: continuous batching" in table and "5,000 / 900" in table and "(21,700-23,100)" in table and "4,000 (3,960-4,040)" in table
    assert "TTFT first (ms)" in table and "ITL p99 (ms)" in table and "first call:" in table
    ledger = veng.day_ledger(recs)
    assert len(ledger) == 2 and "TTFT, first agent turn rose from 2 s to 4 s (2.00x)" in ledger[1]
    assert ledger[1].index("Costs:") < ledger[1].index("first agent turn rose")
    mixed = fake_records([5], rehearsed=False) + fake_records([6])
    assert "Not compared (one rehearsed, the other not): TTFT, first agent turn;" in veng.day_ledger(mixed)[0]
    assert veng.unrehearsed(mixed)["TTFT, first agent turn"] == [5]
    cold = veng.day_ledger(fake_records([0, 6], rehearsed=False))[0]
    assert "Not compared (one rehearsed, the other not)" in cold             # day 0 compiles nothing
    assert "first call:" not in veng.day_table(fake_records([0], rehearsed=False)).replace("first call: first", "")
    assert "median token err" in veng.format_quality(recs) and veng.quality_rows([]) == []
    flat = fake_records([5, 6], repeats=False)                                # values measured once: 3% rule
    assert "No change beyond the spread (or 3%): weights + KV pool" in veng.day_ledger(flat)[0]


def test_decode_records_made_before_forks_counted_are_left_out_and_said_so():
    old = [r for r in fake_records(range(len(DAYS)), rehearsed=False, batch_before_day6=32) if r["case"] != "step_cost"]
    assert veng.breaks_batch_rule(next(r for r in old if r["case"] == "agent_long.decode" and r["day"] == 0))
    v = veng.day_values(old)
    assert sorted(v["decode_b32"]) == [6, 7] and v["old_batch"] == {d: 32 for d in range(6)}
    lines = veng.gpu_story_lines(old)
    assert any("decode records of days 0-5 decoded 32 sequences at once" in x for x in lines), lines
    assert any("left out, not rehearsed" in x and "days 1-6 and 14" in x for x in lines), lines
    assert any("No GPU run has recorded every day's step prices" in x for x in lines), lines
    assert veng.gpu_story_lines([])[0].startswith("There is no GPU record yet")
    new = fake_records(range(len(DAYS)))
    assert not any("decoded" in x or "left out" in x or "No GPU run" in x for x in veng.gpu_story_lines(new))
    assert _days_text([0, 7]) == "days 0 and 14" and _days_text([6]) == "day 6"


def test_gpu_story_draws_every_recorded_device_with_no_unrehearsed_bar():
    recs = fake_records(range(len(DAYS))) + fake_records([0, 6, 7], device="NVIDIA H100 80GB HBM3")
    with warnings.catch_warnings():
        warnings.simplefilter("error")                           # the roofline lays out no figure it did not make
        fig = veng.plot_gpu_story(recs, ceilings=lambda device: (4000.0, 800.0) if device == "NVIDIA H200" else (None, None))
    titles = [t.get_text() for ax in fig.axes for t in ax.texts if t.get_text().startswith("recorded on")]
    assert titles == ["recorded on the NVIDIA H200 (torch 2.11, Triton 3.6)",
                      "recorded on the NVIDIA H100 80GB HBM3 (torch 2.11, Triton 3.6)"]
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("143 ms  0.86x" in t for t in texts)               # day 6's follow-up TTFT over day 5's: after/before
    assert not any(ax.get_title().endswith("no ratio)") for ax in fig.axes)
    plt.close(fig)
    cold = [r for r in fake_records(range(len(DAYS)), rehearsed=False)]
    fig = veng.plot_gpu_story(cold, ceilings=lambda device: (None, None))
    # of the times only day 0 (PyTorch, compiles nothing) could be drawn: a panel compares days, so none is
    assert [ax.get_title() for ax in fig.axes if ax.get_visible()] == ["weights + KV pool"]
    plt.close(fig)
    assert veng.plot_gpu_story([]) is None
    pts = veng.decode_points(fake_records(range(len(DAYS))))
    assert [p["batch"] for p in pts] == [32] * len(DAYS) and all(p["gbps"] > 0 for p in pts)


def test_fp8_verdict_says_which_recorded_time_it_loses_and_what_it_saves():
    recs = fake_records([6, 7])
    for r in recs:                                               # the FP8 day slower per token, as on the H200
        if r["day"] == 7 and r["case"] == "agent_long.itl":
            r["ms"] = r["itl_p50_ms"] = 2.12
            r["repeats"] = [{**x, "itl_p50_ms": v} for x, v in zip(r["repeats"], (2.1, 2.12, 2.14))]
        if r["day"] == 6 and r["case"] == "agent_long.itl":
            r["ms"] = r["itl_p50_ms"] = 1.73
            r["repeats"] = [{**x, "itl_p50_ms": v} for x, v in zip(r["repeats"], (1.71, 1.73, 1.75))]
    said = veng.fp8_verdict(recs)
    assert said.startswith("On the NVIDIA H200 (torch 2.11, Triton 3.6), the FP8 day (its KV cache and experts in FP8)")
    assert "inter-token latency, p50 2.12 ms against 1.73 ms" in said and "GiB against" in said
    assert said.count(".") >= 1 and "KV 8,960 -> " in said
    assert veng.fp8_verdict([]).startswith("No GPU record")


def test_memory_lines_name_the_model_they_are_for():
    lines = veng.memory_lines()
    assert lines[0] == f"at the size of the GPU model ({param_count(GPU) / 1e9:.1f} B parameters, bfloat16):"


def test_target_rows_read_ratios_from_the_records():
    recs = fake_records([0, 1, 7])      # follow-up TTFT 1000 -> 125 ms: 8x (goal 20x: not met)
    kv = "fp8_decode_B32_L131072_Hq32_Hkv8_D128_p16"
    recs += [measure.make_record("kvcache", kv, "triton_bf16_cudagraph", 4.0),
             {**measure.make_record("kvcache", kv, "triton_fp8_token_cudagraph", 2.0), "pct_of_ceiling": 85.0}]
    rows = {r["target"]: r for r in veng.target_rows(recs)}
    ttft = rows["agent follow-up TTFT, day 0 / day 14"]
    assert ttft["value"] == pytest.approx(8.0) and ttft["met"] is False
    assert rows["FP8 KV paged decode vs bf16 (CUDA graphs)"]["met"] is True
    assert rows["FP8 fused MoE prefill vs bf16"]["value"] is None
    assert "NO" in veng.format_targets(recs)


def test_provenance_says_what_priced_the_sweeps_and_how_to_record_again():
    ch = veng.Chapter("cpu", torch.device("cpu"), m3_config("cpu"), None, tiny_prices(), fake_records([0, 6]), 0.0)
    text = veng.provenance(ch, seconds=12.0)
    assert text.startswith("<details>") and "each day's steps measured now on the a test device" in text
    assert "recorded on the NVIDIA H200: torch 2.11, Triton 3.6" in text and veng.COMMAND in text
