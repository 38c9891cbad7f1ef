"""The engine bench suite on the CPU: records, rehearsal and its refusal of mixed comparisons, the
honest decode batch, the load and preemption sweeps; and what its pictures read from records."""
import warnings

import matplotlib
import pytest
import torch

from minimax_lab import measure
from minimax_lab.bench import suite_engine as engine_bench
from minimax_lab.bench import (suite_engine_agent_long, suite_engine_days, suite_engine_load, suite_engine_prices,
                               suite_engine_sessions)
from minimax_lab.engine import DAYS, M3Model, day_options, m3_config, param_count
from minimax_lab.engine.clock import StepCost
from minimax_lab.engine.config import GPU
from minimax_lab.engine.options import DAY_LABELS
from minimax_lab.engine.traffic import decode_step_bytes, decode_step_flops, experts_touched
from minimax_lab.viz import engine as veng
from minimax_lab.viz.engine.records import _days_text

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SMALL = {**suite_engine_days.CPU_SIZES,
         "chat": dict(users=1, turns=1, system_tokens=8, message_words=(1, 1), max_tokens=2),
         "agent_long": dict(codebase_tokens=20, tool_tokens=(2, 3), task_words=(1, 1), max_tokens=3, batch=3),
         "load": dict(requests=8, block_tokens=16, max_tokens=6, kv_tokens=2048, rates=(1, 8), relative=True,
                      engine=dict(max_batch=8, step_tokens=128)),
         "preemption": dict(requests=10, prompt_tokens=(16, 48), max_tokens=(16, 64), kv_tokens=256, rates=(4, 32),
                            relative=True, days=(6,), engine=dict(max_batch=16, step_tokens=128)),
         "calibrate": dict(batches=(1, 4), decode_steps=2, prompt_tokens=(16, 64))}


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(engine_bench, "sizes_for", lambda preset: SMALL)
    monkeypatch.setattr(suite_engine_prices, "recorded_step_costs", lambda: {})
    return SMALL


def test_bench_records_day_by_day(small):
    handed = []
    recs = engine_bench.run("cpu", cases=["chat", "agent_long"], days=[0], verbose=False, sink=handed.append)
    # the sink gets each (case, day)'s records as soon as they exist, so a cut-short run keeps them
    assert [len(h) for h in handed] == [3, 3] and [r for h in handed for r in h] == recs
    assert {r["case"] for r in recs} == {"chat.ttft", "chat.itl", "chat.e2e", "agent_long.ttft_first",
                                         "agent_long.decode", "agent_long.ttft_followup"}
    assert all(r["suite"] == "engine" and r["ms"] > 0 and r["impl"] == "d0_day0" for r in recs)
    e2e = next(r for r in recs if r["case"] == "chat.e2e")
    assert e2e["top1_agreement"] == 1.0 and e2e["model"]["params"] == param_count(m3_config("cpu"))
    assert e2e["rehearsed"] is False and "first_call_wall_s" not in e2e
    dec = next(r for r in recs if r["case"] == "agent_long.decode")
    assert dec["decode_batch"] == 1                 # day 0 serves one request at a time: no forks beside it
    assert dec["decode_bytes_per_step"] > dec["decode_kv_bytes"] > 0 and dec["decode_gbps"] > 0
    with pytest.raises(ValueError, match="case"):
        engine_bench.run("cpu", cases=["nope"])


def test_forks_count_against_the_days_batch_limit():
    m = M3Model.create(m3_config("cpu"), "meta")
    batches = [suite_engine_agent_long.decode_batch(m, d, SMALL) for d in range(len(DAYS))]
    assert batches == [1] * 6 + [3, 3]


def test_rehearsal_runs_on_a_throwaway_engine_and_records_the_first_call(small, monkeypatch):
    built = []
    real = suite_engine_days._engine
    for module in (suite_engine_sessions, suite_engine_agent_long):  # where each case builds its engines
        monkeypatch.setattr(module, "_engine", lambda *a, **kw: built.append(real(*a, **kw)) or built[-1])
    recs = engine_bench.run("cpu", cases=["chat", "agent_long"], days=[0, 6], verbose=False, rehearse=True)
    assert len(built) == 8 and all(e.steps > 0 for e in built)      # (throwaway, timed) per case and day
    assert built[1].blocks is not built[0].blocks
    assert {r["impl"] for r in recs} == {"d0_day0", "d6_continuous_batching"} and all(r["rehearsed"] for r in recs)
    long6 = next(r for r in recs if r["case"] == "agent_long.ttft_first" and r["day"] == 6)
    assert long6["first_call_ttft_first_ms"] > 0 and long6["first_call_ttft_followup_ms"] > 0
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
    # the interpreter compiles nothing: its records compare without a rehearsal
    live = {"interpreter": True, "rehearsed": False}
    assert veng.change((4.0, {**a, **live}), (2.0, {**b, **live}), False) == (2.0, "")


def test_load_and_preemption_sweeps_on_the_cpu(small):
    recs = engine_bench.run("cpu", cases=["load", "preemption"], days=[5, 6], verbose=False)
    load = [r for r in recs if r["case"].startswith("load_mooncake.")]
    assert {r["impl"] for r in load} == {"d5_prefix_caching_sim", "d6_continuous_batching_sim"}
    assert all(r["clock"] == "simulated" and r["ms"] == pytest.approx(r["ttft_p99_ms"]) and r["requests"] == 8
               for r in load)
    assert all("day 0 (PyTorch) steps" in r["prices"] for r in load)
    pre = [r for r in recs if r["case"].startswith("preempt")]
    assert {r["policy"] for r in pre} == {"reserve", "recompute", "swap"} and {r["day"] for r in pre} == {6}
    assert sum(r["preemptions"] for r in pre if r["policy"] == "reserve") == 0
    curves = veng.sweep_curves(recs, case="preemption")
    assert {k[1] for k in curves} == {"reserve", "recompute", "swap"}
    assert len(veng.goodput_sentences(recs, case="preemption", by="policy")) == 3
    assert veng.goodput_sentences(recs, case="preemption", by="policy")[0].startswith("reserve up front")
    compared = veng.curve_comparison(recs, case="preemption", by="policy")
    assert len(compared) == 2 and all("than reserve up front" in c or "gives the same numbers" in c for c in compared)
    fig, axes = plt.subplots(1, 3)
    veng.plot_preemption(recs, axes=axes)
    assert len(axes[0].get_lines()) == 3 and len(axes[1].get_lines()) == 3      # tail latency, ITL, SLO
    plt.close(fig)
    said = veng.sweep_lines(recs, case="preemption")
    assert len(said) == 1 and said[0].startswith("Poisson arrivals, 10 requests per rate; simulated clock")
    assert "set from the step prices" in said[0] and "90% of requests" in said[0]
    assert all(r["slo_rule"] == suite_engine_load.slo_rule(SMALL["preemption"]) for r in pre)
    with pytest.raises(ValueError, match="no load sweep records"):
        veng.plot_sweep(pre, case="load")


def test_load_on_the_wall_clock_fits_and_records_the_step_prices(small, monkeypatch):
    model = M3Model.create(m3_config("cpu"), torch.device("cpu"))
    sizes = {**SMALL, "load": {**SMALL["load"], "rates": (50.0, 100.0), "relative": False, "sim_rates": (50.0,),
                               "slo": (1.0, 0.1)}}
    recs = suite_engine_load.run_load(model, [0], sizes, verbose=False, wall_clock=True, rehearse=False)
    wall = [r for r in recs if r["case"].startswith("load_") and r["clock"] == "wall"]
    assert [r["rate"] for r in wall] == [50.0, 100.0] and {r["impl"] for r in wall} == {"d0_day0"}
    assert all(r["requests"] == 8 for r in wall)             # the second rate on the same engine: fresh requests
    assert {r["impl"] for r in recs if r.get("clock") == "simulated"} == {"d0_day0_sim"}
    cost = next(r for r in recs if r["case"] == "step_cost")
    assert StepCost.from_dict(cost["step_cost"]).fixed_ms >= 0 and cost["ms"] > 0


def test_sweeps_price_with_recorded_step_costs_when_there_are_some(monkeypatch):
    cost = StepCost(1.0, 0.1, 0.01, 0.5, host_gbps=50.0)
    monkeypatch.setattr(suite_engine_prices, "recorded_step_costs", lambda: {6: cost})
    cfg, prices, sizes = suite_engine_prices.sweep_prices(M3Model.create(m3_config("cpu"), "meta"), SMALL)
    assert cfg == GPU and prices == {6: cost} and sizes is suite_engine_days.GPU_SIZES


def test_decode_traffic():
    fp8 = decode_step_bytes(GPU, batch=32, context=131_072, kv_dtype="fp8_e4m3", expert_dtype="fp8_e4m3")
    bf16 = decode_step_bytes(GPU, batch=32, context=131_072)
    assert 0.5 < fp8["kv"] / bf16["kv"] < 0.56 and fp8["total"] < bf16["total"]
    one = decode_step_bytes(GPU, batch=1, context=131_072)
    assert one["per_token"] > bf16["per_token"]            # batching shares the weight reads
    assert experts_touched(GPU, 1) == pytest.approx(8) and experts_touched(GPU, 10**4) == pytest.approx(128)
    assert decode_step_flops(GPU, batch=2, context=4096) > decode_step_flops(GPU, batch=1, context=4096)
    with pytest.raises(ValueError):
        decode_step_bytes(GPU, batch=0, context=10)


def fake_records(days, *, rehearsed=True, scale=1.0, batch_before_day6=1):
    recs = []
    for d in days:
        opts = day_options(d).to_dict()
        extra = {"day": d, "switch": DAYS[d][0], "label": DAY_LABELS[d], "weights_gib": 5.0 - 0.1 * d,
                 "kv_cache_gib": 1.0 / (d + 1), "decode_tok_s": 100.0 * (d + 1) * scale,
                 "decode_batch": batch_before_day6 if d < 6 else 32,
                 "logits_rel_err": 1e-3 * d, "token_err_p50": 5e-4 * d, "top1_agreement": 1.0 - 0.01 * d,
                 "compared_tokens": 64, "rehearsed": rehearsed, "options": opts,
                 "workload": {"context_tokens": 131_072, "max_tokens": 32},
                 **({"first_call_ttft_first_ms": 5000.0, "first_call_ttft_followup_ms": 900.0} if rehearsed else {})}
        impl = f"d{d}_{DAYS[d][0]}"
        for case, ms in (("agent_long.ttft_first", 2000.0 * (1 + (d == 6))), ("agent_long.ttft_followup", 1000.0 / (d + 1)),
                         ("agent_long.decode", 50.0), ("agent.itl", 20.0 / (d + 1)), ("agent.e2e", 900.0)):
            recs.append(measure.make_record("engine", case, impl, ms * scale, extra=extra))
    return recs


def test_day_table_and_ledger_read_the_records():
    recs = fake_records([0, 5, 6])
    v = veng.day_values(recs)
    assert v["ttft_followup"][6][0] == pytest.approx(1000 / 7) and v["batch"] == {0: 1, 5: 1, 6: 32}
    table = veng.day_table(recs)
    assert "day 6: continuous batching" in table and "(32)" in table and "5,000 / 900" in table
    assert "TTFT first (ms)" in table and "rehearsed (agent_long / agent)" in table and "first call:" in table
    ledger = veng.day_ledger(recs)
    assert len(ledger) == 2 and "TTFT, first agent turn rose from 2 s to 4 s (2.00x)" in ledger[1]
    assert ledger[1].index("Costs:") < ledger[1].index("first agent turn rose")
    mixed = fake_records([5], rehearsed=False) + fake_records([6])
    assert "Not compared (one rehearsed, the other not): TTFT, first agent turn;" in veng.day_ledger(mixed)[0]
    assert veng.unrehearsed(mixed) == {"agent": [5], "agent_long": [5]}
    cold = veng.day_ledger(fake_records([0, 6], rehearsed=False))[0]
    assert "TTFT" not in cold.split("Not compared")[0] and "inter-token" not in cold.split("Not compared")[0]
    assert "Not compared (neither record rehearsed" in cold and "weights + KV pool" in cold  # memory is no time
    assert "first call:" not in veng.day_table(fake_records([0], rehearsed=False)).replace("first call: first", "")
    assert "median token err" in veng.format_quality(recs) and veng.quality_rows([]) == []


def test_decode_records_made_before_forks_counted_are_left_out_and_said_so():
    old = fake_records(range(len(DAYS)), rehearsed=False, batch_before_day6=32)
    assert veng.breaks_batch_rule(next(r for r in old if r["case"] == "agent_long.decode" and r["day"] == 0))
    v = veng.day_values(old)
    assert sorted(v["decode_tok_s"]) == [6, 7] and v["old_batch"] == {d: 32 for d in range(6)}
    assert [p["day"] for p in veng.decode_points(old)] == [6, 7]
    assert "left out (32)" in veng.day_table(old)
    lines = veng.gpu_story_lines(old, copy_gbps=4000.0)
    assert any("The decode records of days 0-5 decoded 32 sequences at once" in x for x in lines), lines
    assert any(x.startswith("Not rehearsed") and "agent_long on days 0-6 and 14" in x for x in lines), lines
    assert any("wall-clock load sweep, a preemption sweep or step prices" in x for x in lines), lines
    assert veng.gpu_story_lines([])[0].startswith("The NVIDIA H200 has no H200 record yet")
    new = fake_records(range(len(DAYS)))
    assert not any("decoded" in x or "Not rehearsed" in x for x in veng.gpu_story_lines(new, copy_gbps=4000.0))
    assert _days_text([0, 7]) == "days 0 and 14" and _days_text([6]) == "day 6"


def test_plots_draw_with_and_without_records():
    recs = fake_records(range(len(DAYS)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")                           # the roofline lays out no figure it did not make
        fig = veng.plot_gpu_story(recs, copy_gbps=4000.0, gemm_tflops=800.0)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("143 ms  0.86x" in t for t in texts)               # day 6's follow-up TTFT over day 5's: after/before
    assert len(fig.axes) == 5                                     # four day panels and the roofline: no empty axes
    legend = [t.get_text() for t in fig.axes[-1].get_legend().get_texts()]
    assert legend[-1] == "day 14, B=32"
    plt.close(fig)
    cold = veng.plot_gpu_story(fake_records(range(len(DAYS)), rehearsed=False))
    assert not any(t.get_text().rstrip().endswith("x") for ax in cold.axes for t in ax.texts)  # no ratio drawn
    plt.close(cold)
    assert veng.plot_gpu_story([]) is None
    wall = [{**r, "clock": "wall"} for r in _sweep_records()]
    fig = veng.plot_gpu_story(recs + wall, copy_gbps=4000.0, gemm_tflops=800.0)
    assert len(fig.axes) == 4 + 3 + 1
    plt.close(fig)
    pts = veng.decode_points(recs)
    assert [p["batch"] for p in pts] == [1] * 6 + [32, 32] and all(p["gbps"] > 0 for p in pts)
    assert len(veng.roofline_sentences(recs, 4000.0)) == len(DAYS) and veng.roofline_sentences(recs, None) == []


def _sweep_records():
    extra = {"day": 6, "switch": DAYS[6][0], "label": DAY_LABELS[6], "clock": "simulated", "prices": "test prices",
             "slo": {"ttft_s": 0.1, "tpot_s": 0.01, "attain": 0.9}, "arrivals": "mooncake", "requests": 4,
             "preemptions": 0, "policy": "reserve"}
    recs = []
    for i, rate in enumerate((1.0, 2.0, 4.0)):
        m = {"rate": rate, "throughput_tok_s": 100.0 * rate, "ttft_p99_ms": 10.0 * (i + 1), "itl_p99_ms": 5.0 + i,
             "slo_attainment": (1.0, 0.95, 0.5)[i], "goodput_rps": rate * (1.0, 0.95, 0.5)[i]}
        recs.append(measure.make_record("engine", f"load_mooncake.r{rate:g}", "d6_continuous_batching_sim", m["ttft_p99_ms"],
                                        extra={**extra, **m}))
    return recs


def test_sweep_sentences_say_how_it_was_made_and_name_twin_curves():
    day6 = _sweep_records()
    day7 = [{**r, "day": 7, "switch": DAYS[7][0], "impl": "d7_fp8_sim"} for r in day6]
    said = veng.goodput_sentences(day6 + day7)
    assert said[0].startswith("day 6: continuous batching: sustains up to 2 requests/s (goodput 1.9 requests/s, "
                              "p99 inter-token latency 6 ms)"), said
    assert veng.curve_comparison(day6 + day7) == [
        "day 14: FP8 KV cache + FP8 experts gives the same numbers as day 6: continuous batching at every rate"]
    slower = [{**r, "itl_p99_ms": 2 * r["itl_p99_ms"]} for r in day7]
    assert "2.00x more than day 6: continuous batching's 6 ms" in veng.curve_comparison(day6 + slower)[0]
    assert veng.sweep_lines(day6)[0].startswith("Mooncake's trace, its timestamps scaled to each rate, 4 requests")
    axes = veng.plot_sweep(day6)
    assert "test prices" in axes[0].figure._suptitle.get_text()
    plt.close(axes[0].figure)


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
    assert rows["decode tokens/s, day 14 / day 0"]["value"] == pytest.approx(8.0)
    assert rows["FP8 KV paged decode vs bf16 (CUDA graphs)"]["met"] is True
    assert rows["FP8 fused MoE prefill vs bf16"]["value"] is None
    mixed = fake_records([0], rehearsed=False) + fake_records([7])
    assert {r["target"]: r for r in veng.target_rows(mixed)}["agent follow-up TTFT, day 0 / day 14"]["value"] is None
    assert "NO" in veng.format_targets(recs)
