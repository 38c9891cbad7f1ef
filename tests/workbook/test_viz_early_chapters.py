"""The helpers of chapters 00-02 say what their numbers say: every comparison word follows the numbers
it compares, CPU and H200 numbers are drawn apart, and a record lookup that finds nothing says so."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from minimax_lab.measure.timing import Ceilings, Timing  # noqa: E402
from minimax_lab.notebook import recorded  # noqa: E402
from minimax_lab.viz import flash_steps, pitfalls, roofline, step_zero  # noqa: E402

MiB = 2**20


def demo(input_mib, cache_mib, **ms):
    times = dict(no_sync_ms=1.0, first_call_ms=50.0, single_runs_ms=[1.1, 0.9, 1.3], honest_ms=1.0,
                 cache_resident_ms=0.01, cache_rotating_ms=0.02)
    times.update(ms)
    return {"device": "CPU x86_64", "input_bytes": input_mib * MiB, "bytes": 2 * input_mib * MiB,
            "cache_bytes": 2 * MiB, "device_cache_bytes": cache_mib * MiB, "device_cache": "CPU L3",
            "copy_gbps": 2 * input_mib * MiB / 1e-3 / 1e9, "threads": None, "honest_method": "wall clock", **times}


def test_the_cache_sentence_says_whether_the_input_overflows_the_cache():
    assert "no call finds it in the cache" in pitfalls.cache_sentence(demo(64, 32))
    assert "2.00x larger than the CPU L3" in pitfalls.cache_sentence(demo(64, 32))
    held = pitfalls.cache_sentence(demo(128, 300))
    assert "this machine's cache holds it" in held and "2.34x smaller than" in held
    assert "not all" in pitfalls.cache_sentence(demo(48, 32))


def test_the_timing_bars_start_at_the_ceiling_and_print_the_tables_percentages():
    d = demo(64, 32, honest_ms=1.0 / 0.096)
    fig = pitfalls.plot_now(d).figure
    ax = fig.axes[0]
    lefts = {round(p.get_x(), 6) for p in ax.patches}
    ends = sorted(round(p.get_x() + p.get_width(), 6) for p in ax.patches)
    assert all(min(p.get_x(), p.get_x() + p.get_width()) <= 100 <= max(p.get_x(), p.get_x() + p.get_width())
               for p in ax.patches), (lefts, ends)
    labels = {t.get_text() for t in ax.texts}
    assert "9.6%" in labels and "9.6%" in pitfalls.table(pitfalls.rows_now(d), d["copy_gbps"])
    assert roofline.pct_text(184.4) == "184%" and roofline.pct_text(9.64) == "9.6%"


def test_the_two_copies_of_chapter_00_are_compared_and_their_gap_called_noise():
    d = {**demo(64, 32), "n": 16 * MiB, "threads": 1}
    same = pitfalls.describe_now(d, earlier_copy_gbps=d["copy_gbps"] * 1.01)
    assert "about as high as the roof" in same and "moves on this machine" not in same
    twice = pitfalls.describe_now(d, earlier_copy_gbps=d["copy_gbps"] / 2)
    assert "2.00x higher than the roof" in twice and "moves on this machine" in twice


def test_rows_past_the_copy_line_are_named_and_the_harness_among_them_is_owned_up_to():
    d = demo(64, 32)
    rows = pitfalls.rows_now(d)
    assert len(rows) == len(pitfalls.CASES) == 7
    past = pitfalls.past_ceiling_sentence(rows, d["copy_gbps"])
    assert "3. cache-resident input (small)" in past and "harness median" not in past
    slow_copy = pitfalls.past_ceiling_sentence(rows, d["copy_gbps"] / 2)
    assert "harness median (200%)" in slow_copy and "harness's own way" in slow_copy
    assert pitfalls.past_ceiling_sentence(rows, d["copy_gbps"] * 1000) == "No row claims more than the copy ceiling here."


def test_the_recorded_pitfalls_summary_follows_the_records(monkeypatch):
    rows = pitfalls.recorded_rows()
    assert rows is not None and [r[0] for r in rows] == [label for label, _ in pitfalls.CASES.values()]
    summary = pitfalls.recorded_summary()
    assert summary.count(". ") <= 3 and "faster than the same size rotated" in summary
    monkeypatch.setattr(recorded, "all_of", lambda *a, **k: [])
    assert pitfalls.recorded_rows() is None and pitfalls.plot_recorded() is None
    assert pitfalls.recorded_summary().startswith("No `pitfalls` records")


def test_rooflines_draw_each_machine_in_its_own_panel_and_say_which_side_of_its_ridge():
    cpu = Ceilings(copy_gbps=9.0, gemm_tflops=0.04, gemm_dtype="float32", device="CPU x86_64", method="m")
    ms = roofline.machines(cpu)
    assert [m["label"] for m in ms] == ["measured now on CPU x86_64", "recorded on the NVIDIA H200"]
    ops = [roofline.operator("decode", 4.0, 1.0, "x"), roofline.operator("gemm", 3000.0, 1.0, "x")]
    lines = roofline.bound_lines(ops, ms).splitlines()
    assert "memory-bound: decode; compute-bound: gemm" in lines[1]         # H200 ridge ~188
    slow = roofline.bound_lines(ops, [{**ms[0], "gemm_tflops": 0.027}])     # ridge 3 on this CPU
    assert "memory-bound: none; compute-bound: decode, gemm" in slow
    fig = roofline.plot_machines(ms, ops)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0].startswith("measured now on CPU x86_64") and titles[1].startswith("recorded on the NVIDIA H200")
    with pytest.raises(ValueError, match="positive"):
        roofline.operator("empty", 0, 1, "x")


def _with_runs(monkeypatch, **changes):
    """The H200 attention records with the newest run of each named step or library changed."""
    recs = [dict(r) for r in flash_steps._attention_records()]
    case = flash_steps.steps_case()
    for name, fields in changes.items():
        runs = [r for r in recs if r["case"] == case and r["impl"] == flash_steps.impl_of(name)]
        for r in runs:
            r.update(fields)
    monkeypatch.setattr(flash_steps, "_attention_records", lambda: tuple(recs))


def test_the_steps_summary_judges_each_step_against_the_spread_of_every_run(monkeypatch):
    text = flash_steps.summary()
    # v3's runs span 10.17-10.39 ms and FlexAttention's 10.30-10.40: overlapping, so level, not past
    assert "first step measurably past FlexAttention is v4" in text and "v3 is level with it" in text
    assert "behind cuDNN at every recorded size" in text and text.count(". ") <= 3
    assert "NVIDIA H200, Triton 3.6.0" in text
    flex = flash_steps.envelope("flex_compiled")
    _with_runs(monkeypatch, v4={"p20_ms": flex["p20_ms"], "p80_ms": flex["p80_ms"], "ms": flex["ms"]})
    assert "first step measurably past FlexAttention is v5" in flash_steps.summary()


def test_a_step_is_called_a_change_only_outside_the_spread_of_every_run():
    v3, flex = flash_steps.envelope("v3"), flash_steps.envelope("flex_compiled")
    assert v3["n_runs"] >= 2 and v3["p20_ms"] <= min(r["p20_ms"] for r in flash_steps.runs("v3"))
    assert "no measurable change" in flash_steps.moved_words(flex, v3)
    assert "rose from" in flash_steps.moved_words(flash_steps.envelope("v1"), flash_steps.envelope("v2"))
    assert "not recorded" in flash_steps.recorded_lines("v0")
    assert "from v4, the recorded throughput rose" in flash_steps.recorded_lines("v5")


def test_the_autotuners_pick_is_explained_by_its_own_timings():
    v5, v6 = flash_steps.envelope("v5"), flash_steps.envelope("v6")
    line = flash_steps.autotune_pick_line(v6, v5)
    assert "8.075 ms and 8.086 ms" in line and "a pick between equals, made by noise" in line
    far = {**v6, "autotune_ms": {**v6["autotune_ms"], "128x128_w8_s3_g1_tma": 9.0}}
    assert "a pick the timings support" in flash_steps.autotune_pick_line(far, v5)
    same = {**v6, "config": dict(flash_steps.suite_attention.STEP_CONFIGS["gpu"]["v5_tma"])}
    assert "two timings of one kernel" in flash_steps.autotune_pick_line(same, v5)


def test_the_launch_order_figure_draws_the_shape_its_lines_speak_of():
    fig = flash_steps.plot_launch_order()
    B, S, H = flash_steps.STEPS_SHAPE
    assert fig.axes[0].images[0].get_array().shape == (B * H, S // flash_steps.STEPS_BLOCK_M)
    assert f"{B * H} (batch, head) rows" in fig._suptitle.get_text()
    assert f"all {B * H} heads" in flash_steps.l2_lines()
    assert [t.get_text() for t in fig.legends[0].get_texts()][0].startswith("wave 0: the first 132 programs")


def test_the_step_zero_lines_follow_the_experiments_numbers():
    def schedule(acc, grounding):
        return {"test_acc": {"colour": acc, "count": acc, "left": acc, "all": acc}, "best_grounding": grounding,
                "history": {"loss": [1.0] * 10 + [3.0] * 10, "val_step": [10], "val_acc": [acc]}}
    exp = {"steps": 20, "text_first_frac": 0.5, "mixed": schedule(0.6, 2.0), "text_first": schedule(0.4, 4.0)}
    text = step_zero.schedule_lines(exp)
    assert "500 held-out image questions (colour 172, count 168, left 160)" in text
    assert "mixed ahead (a gap of 20.0 points, more than two standard errors" in text
    assert "object-attention ratio: the sharper head is in the text first model (2.00x higher than the mixed model's)" in text
    assert "best object-attention ratio 2.0" in text           # a record without the key: the older measure
    assert "best grounding ratio 4.0" in step_zero.schedule_lines({**exp, "grounding_measure": "within_image"})
    assert "rose from 1 nats to 2 nats" in text          # the trailing mean of 25 steps
    assert "left 40% (below guessing)" in text and "colour 60% (above guessing)" in text
    close = {**exp, "text_first": schedule(0.58, 4.0)}
    assert "no measurable difference (a gap of 2.0 points, inside two standard errors" in step_zero.schedule_lines(close)


def test_copy_lines_give_each_copy_as_a_share_of_the_ceiling_and_what_was_rotated():
    t = {"torch copy_": Timing(ms=1.0, p20_ms=0.9, p80_ms=1.1, reps=10, method="wall clock", input_sets=4)}
    text = pitfalls.copy_lines(t, bytes_per_call=16 * MiB, set_bytes=16 * MiB, ceiling_gbps=16 * MiB / 1e-3 / 1e9 / 2)
    row = text.splitlines()[1]
    assert "200%" in row and "15.25-18.64" in row          # 16 MiB per ms = 16.8 GB/s, twice the ceiling
    assert "rotated 4 input sets of 16 MiB, 64 MiB in all" in text


def test_each_mistake_is_read_from_its_numbers_and_judged_against_their_spread():
    gpu = {**demo(64, 32, no_sync_ms=0.7, single_runs_ms=[1.2, 1.25, 1.3], cache_resident_ms=0.010,
                  cache_rotating_ms=0.016), "gpu": True, "honest_p20_ms": 0.95, "honest_p80_ms": 1.05,
           "cache_resident_p20_ms": 0.009, "cache_resident_p80_ms": 0.011,
           "cache_rotating_p20_ms": 0.015, "cache_rotating_p80_ms": 0.017}
    lines = pitfalls.reading(gpu).splitlines()
    assert [ln.split(",")[0] for ln in lines] == [f"Mistake {i}" for i in (1, 2, 3, 4)]
    assert "returned before its work was done" in lines[0] and "more than memory can deliver" in lines[0]
    assert "50x the harness's median" in lines[1] and "compiling the Triton kernel" in lines[1]
    assert "1.60x faster than the same size rotated" in lines[2]
    assert "all slower than the harness's median" in lines[3] and "CUDA events" in lines[3]
    # the same numbers on a CPU: nothing runs asynchronously, so a fast reading is one reading
    cpu = pitfalls.reading({**gpu, "gpu": False}).splitlines()
    assert "below the harness's p20-p80 range" in cpu[0] and "returned before" not in cpu[0]
    # overlapping spreads are no difference
    level = pitfalls.reading({**gpu, "cache_rotating_p20_ms": 0.0105})
    assert "level with the same size rotated" in level and "did not flatter it" in level
    # without spreads the single runs' own distance is the noise, and the line says so
    bare = {k: v for k, v in gpu.items() if not k.endswith(("_p20_ms", "_p80_ms"))}
    assert "no spread recorded: judged against the 8%" in pitfalls.reading(bare)


def test_the_recorded_run_is_read_like_the_live_one_with_its_versions(monkeypatch):
    d = pitfalls.recorded_demo()
    assert d is not None and d["gpu"] and "torch " in d["versions"] and "triton " in d["versions"]
    summary = pitfalls.recorded_summary()
    assert summary.splitlines()[0].startswith(f"Recorded on the {recorded.H200} ({d['versions']})")
    assert len(summary.splitlines()) == 5
    ax = pitfalls.plot_recorded()
    assert d["versions"] in ax.get_title()


def test_timing_bars_carry_the_medians_spreads_as_error_bars_and_labels_clear_them():
    d = {**demo(64, 32), "honest_p20_ms": 0.8, "honest_p80_ms": 1.25, "copy_p20_ms": 0.9, "copy_p80_ms": 1.1}
    ax = pitfalls.plot_now(d)
    bars = [c for c in ax.containers if c.__class__.__name__ == "ErrorbarContainer"]
    assert len(bars) == 1                                   # the harness median's, the only row with a spread here
    (lo, hi), = [seg[:, 0] for seg in bars[0].lines[2][0].get_segments()]
    assert lo == pytest.approx(80.0) and hi == pytest.approx(125.0)
    row = list(pitfalls.CASES).index("honest")
    label = next(t for t in ax.texts if t.get_text() == "100%" and t.xy[1] == row)
    assert label.xy[0] >= hi                                # the percentage sits past the error bar
    assert "p20-p80" in ax.get_xlabel()


def test_chapter_00_provenance_is_one_collapsed_cell():
    here = Ceilings(copy_gbps=9.0, gemm_tflops=0.04, gemm_dtype="float32", device="CPU x86_64", method="wall clock")
    text = pitfalls.provenance("cpu", here)
    assert text.startswith("<details>") and text.rstrip().endswith("</details>")
    assert "python -m minimax_lab.bench ceilings pitfalls" in text and "p20-p80" in text
