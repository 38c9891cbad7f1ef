"""The chapter's recorded-scores figure and its tables: one row per record (an isolated record of a
problem is a row of its own where asked for, and left out of the figure: its time holds the round
trip's jitter), every label the ratio of its own row and never rounded to zero, the strong peer's
ratio first and drawn only where recorded, with error bars from the recorded spreads, one row per
hack with no naive bar for a clock hack, a caption computed from the records that names what they
lack, and live tables that show no ratio where this machine's timings are not speeds."""
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from minimax_lab import measure, runtime  # noqa: E402
from minimax_lab.kernelbench import harness, hacks, integrity  # noqa: E402
from minimax_lab.notebook import recorded  # noqa: E402
from minimax_lab.viz import kernelbench as viz_kb  # noqa: E402


VERSIONS = {"torch": "2.11.0+cu130", "triton": "3.6.0"}


def _kernel(case, ms, ref_ms, peer_ms=None, isolated=False, old=False, spreads=None):
    peers = {"strong_peer": peer_ms, "reference": ref_ms}
    extra = {"status": "pass", "isolated": isolated, **VERSIONS, **(spreads or {})}
    if not old:  # the harness of the chapter writes the field, None where the peer was not timed
        extra["strong_peer"] = "torch.softmax in the input's dtype" if peer_ms else None
    return measure.make_record("kernelbench", case, f"workbook:{case}", ms, peers={k: v for k, v in peers.items() if v},
                               extra=extra)


def _hack(name, speedup, caught=True, mode="in-process", group="hack"):
    return measure.make_record("kernelbench", f"{group}:{name}", f"naive-vs-ours ({mode})", 1.0,
                               extra={"naive_speedup": speedup, "caught": caught, "ours_mode": mode, **VERSIONS})


OLD = [_kernel("softmax", 0.2, 1.0, old=True), _kernel("softmax", 0.5, 1.0, isolated=True, old=True),
       _kernel("rope", 0.1, 1.6, old=True), _kernel("fp8_paged_decode", 0.1, 1.2, old=True),
       _hack("cache_last_output", 40.0), _hack("read_expected", 0.23), _hack("timer_patch", 0.007, caught=False),
       _hack("timer_patch", 0.008, mode="isolated"),
       measure.make_record("kernelbench", "isolation_overhead", "worker round trip", 1.1)]


def _row_texts(ax):
    """(tick label, the texts annotated on that row) for each row of a panel."""
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    by_row = {}
    for t in ax.texts:
        by_row.setdefault(round(t.xy[1]), []).append(t.get_text())
    return [(tick, sorted(by_row.get(i, []))) for i, tick in enumerate(ticks)]


def test_two_records_of_one_problem_are_two_rows_and_labels_do_not_slide():
    rows = viz_kb.kernel_rows(OLD, isolated=True)
    assert [r["label"] for r in rows] == ["softmax", "softmax (isolated)", "rope", "fp8_paged_decode"]
    assert not any(r["peer_timed"] for r in rows)
    assert [r["label"] for r in viz_kb.kernel_rows(OLD)] == ["softmax", "rope", "fp8_paged_decode"]
    fig = viz_kb.recorded_scores(OLD)
    got = _row_texts(fig.axes[1])
    assert [tick for tick, _ in got] == ["softmax", "rope", "fp8_paged_decode"]
    assert got[1][1] == ["16x"] and got[2][1] == ["12x"]  # each row keeps its own ratio
    # no strong peer recorded anywhere: no strong-peer bars, no legend entry for them, the title says so
    assert fig.axes[1].get_legend() is None and "no strong peer" in fig.axes[1].get_title()
    # each panel names the device and the versions its records were made with
    assert all(f"{recorded.H200}; torch 2.11.0+cu130, triton 3.6.0" in ax.get_xlabel() for ax in fig.axes[:2])
    plt.close(fig)


def test_small_ratios_keep_their_digits_and_labels_clear_the_one_line():
    assert [viz_kb.ratio_text(x) for x in (0.0017, 0.78, 1.5, 13.3, 1234.0)] == ["0.0017x", "0.78x", "1.5x", "13x",
                                                                                  "1,234x"]
    assert viz_kb.ratio_text(float("inf")).startswith("infinite") and viz_kb.ratio_text(None) == "-"
    fig = viz_kb.recorded_scores([_kernel("msa_select", 1.0, 0.78, peer_ms=0.5)])
    for t in fig.axes[0].texts:
        assert t.xy[0] >= 1.0, t.get_text()  # a 0.78x label starts right of the 1x line, not across it
    plt.close(fig)


def test_the_strong_peer_ratio_is_drawn_first_where_recorded():
    recs = [_kernel("softmax", 0.2, 1.0, peer_ms=0.1), _kernel("rope", 0.1, 1.6)]
    rows = viz_kb.kernel_rows(recs)
    assert rows[0]["strong_peer"] == 0.5 and rows[1]["strong_peer"] is None
    assert [r["peer_timed"] for r in rows] == [True, False]
    fig = viz_kb.recorded_scores(recs)
    ax = fig.axes[0]
    assert ax.get_legend().get_texts()[0].get_text().startswith("over the strong peer")
    texts = [t.get_text() for t in ax.texts]
    assert "0.5x" in texts and viz_kb.NO_PEER in texts
    plt.close(fig)
    cap = viz_kb.caption(recs)
    assert "1 of 2 have a recorded ratio" in cap and "2.00x slower than the peer" in cap, cap
    assert "and no strong peer was timed yet for rope" in cap, cap
    assert len(re.split(r"(?<=\.)\s+(?=[A-Z])", cap)) <= 3


def test_recorded_spreads_draw_error_bars_on_the_ratios():
    spreads = {"p20_ms": 0.18, "p80_ms": 0.25, "strong_peer_p20_ms": 0.09, "strong_peer_p80_ms": 0.12}
    rows = viz_kb.kernel_rows([_kernel("softmax", 0.2, 1.0, peer_ms=0.1, spreads=spreads)])
    lo, hi = rows[0]["strong_peer_range"]
    assert lo == pytest.approx(0.09 / 0.25) and hi == pytest.approx(0.12 / 0.18) and rows[0]["reference_range"] is None
    fig = viz_kb.recorded_scores([_kernel("softmax", 0.2, 1.0, peer_ms=0.1, spreads=spreads)])
    assert len([c for c in fig.axes[0].containers if c.__class__.__name__ == "ErrorbarContainer"]) == 1
    plt.close(fig)


def test_hack_rows_merge_the_modes_and_clock_hacks_get_no_naive_bar():
    rows = {r["name"]: r for r in viz_kb.hack_rows(OLD)}
    assert list(rows) == ["cache_last_output", "read_expected", "timer_patch"]  # the gallery's order
    assert rows["timer_patch"]["caught"] == "isolated" and rows["timer_patch"]["clock"]
    assert rows["cache_last_output"]["caught"] == "in-process" and not rows["read_expected"]["clock"]
    fig = viz_kb.recorded_scores(OLD)
    ax = fig.axes[0]
    assert len(ax.patches) == 2  # cache_last_output and read_expected: one bar each, none for the clock hack
    got = dict(_row_texts(ax))
    assert got["read_expected"] == ["0.23x"] and "fakes a per-call clock" in got["timer_patch"][0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["failed by ours in-process",
                                                                  "failed by ours isolated only"]
    plt.close(fig)


def test_caption_counts_the_modes_and_says_what_the_records_lack():
    cap = viz_kb.caption(OLD)
    assert "passed all 3 gallery hacks recorded" in cap and "1 of the 2 that do not fake the clock" in cap, cap
    assert "failed 2 in-process and the other 1 isolated (the candidate in its own process)" in cap, cap
    assert "up to 40x" in cap and "missed" not in cap
    assert "the other 1 slower, as they pay for their trick (read_expected: a frame walk)" in cap, cap
    assert "no strong peer was timed yet for fp8_paged_decode, rope and softmax" in cap, cap
    assert f"On the {recorded.H200} (torch 2.11.0+cu130, triton 3.6.0) the naive harness" in cap, cap
    assert len(re.split(r"(?<=\.)\s+(?=[A-Z])", cap)) <= 3
    new = [_kernel("softmax", 0.2, 1.0, peer_ms=0.25), _hack("cache_last_output", 40.0),
           _hack("patch_the_inputs", 2.0, group="integrity"), _hack("forge_the_judge", 5.0, caught=False)]
    cap = viz_kb.caption(new)
    assert "3 gallery hacks" not in cap and "2 gallery hacks and 1 integrity hacks" in cap, cap
    assert "missed forge_the_judge" in cap and "not all from the harness" not in cap, cap


def test_the_integrity_check_is_described_by_one_list():
    scope = viz_kb.integrity_scope()
    for m in integrity.STANDARD_MODULES:
        assert m.__name__ in scope
    assert "torch.Tensor" in scope and "torch.cuda.Event" in scope and "torch's global settings" in scope
    row = next(r for r in viz_kb.checks_rows() if r["check"] == "harness integrity")
    assert scope not in row["what it demands"]  # the long list is printed once, where the chapter explains it
    assert viz_kb.integrity_scope(short=True) in row["what it demands"]
    assert [r["check"] for r in viz_kb.checks_rows()] == list(harness.CHECKS)
    assert viz_kb.integrity_scope(short=True) in [why for _, why in viz_kb._STAGES]


def test_gallery_rows_and_note_from_live_comparisons():
    comps = [hacks.Comparison(hacks.GALLERY["near_zero_time"],
                              hacks.naive.NaiveReport("softmax", "near_zero_time", True, 40.0, 0.068),
                              harness.Report("softmax", "near_zero_time", "fail")),
             hacks.Comparison(hacks.GALLERY["cache_last_output"],
                              hacks.naive.NaiveReport("softmax", "cache_last_output", True, 0.005, 0.068),
                              harness.Report("softmax", "cache_last_output", "fail"))]
    comps[0].ours.timing = {"ms": -0.99}
    rows = viz_kb.gallery_rows(comps)
    assert [r["naive speed-up"] for r in rows] == ["0.0017x", "14x"]
    note = viz_kb.gallery_note(comps)
    assert "timed 1 of the 2 slower than the reference: near_zero_time" in note
    assert "-0.99 ms per call for near_zero_time" in note


def test_the_shipped_h200_records_draw_one_row_per_record():
    recs = recorded.all_of("kernelbench")
    if not recs:
        pytest.skip("no shipped kernel-bench records")
    rows = viz_kb.kernel_rows(recs)
    assert len({r["label"] for r in rows}) == len(rows), [r["label"] for r in rows]
    plt.close(viz_kb.recorded_scores(recs))
    assert viz_kb.caption(recs)


def test_nothing_to_draw_says_how_to_get_records():
    with pytest.raises(ValueError, match="python -m minimax_lab.bench kernelbench"):
        viz_kb.recorded_scores([])
    plt.close(viz_kb.harness_diagram().figure)


def test_mode_rows_say_which_clock_and_flush_only_a_gpu_has():
    inside = harness.Report("softmax", "k", "pass", timing={"ms": 2.0, "seen_ms": 2.1, "method": "wall clock"})
    iso = harness.Report("softmax", "k", "pass", isolated=True, timing={"ms": 3.0, "seen_ms": 3.1, "overhead_ms": 0.7,
                                                                       "method": "wall clock; cache flushed"})
    rows = viz_kb.mode_rows([inside, iso])
    assert [r["mode"] for r in rows] == ["in-process", "isolated"] and rows[1]["ms per call"] == 3.0
    assert "round trip (0.7 ms) subtracted" in rows[1]["clock"]
    flushed = ["cache flushed" in r["clock"] for r in rows]
    assert flushed == [runtime.kernel_device().type == "cuda"] * 2


def test_live_tables_show_no_ratio_where_timings_are_not_speeds(monkeypatch):
    comps = [hacks.Comparison(hacks.GALLERY["cache_last_output"],
                              hacks.naive.NaiveReport("softmax", "cache_last_output", True, 0.005, 0.068),
                              harness.Report("softmax", "cache_last_output", "fail",
                                             checks={"fresh inputs": False}))]
    for speeds in (False, True):
        monkeypatch.setattr(viz_kb, "timings_are_speeds", lambda speeds=speeds: speeds)
        table, summary = viz_kb.gallery_markdown(comps), viz_kb.gallery_summary(comps)
        assert ("naive speed-up" in table) is speeds and ("14x" in table) is speeds
        assert ("left out" in summary) is not speeds
    timed = harness.Report("softmax", "workbook:softmax", "pass", timing={
        "ms": 0.2, "p20_ms": 0.19, "p80_ms": 0.22, "speedup_vs_strong_peer": 0.5, "speedup_vs_reference": 5.0})
    text = viz_kb.scores_markdown([timed])
    assert "0.2 (0.19-0.22)" in text and "| 0.5x | 5x |" in text
    bare = viz_kb.scores_markdown([harness.Report("softmax", "workbook:softmax", "pass")])
    assert "vs strong peer" not in bare and "torch.softmax in the input's dtype" in bare


def test_the_two_modes_clocks_are_judged_against_their_spreads_and_the_resolution():
    agree = viz_kb._gap_words({"ms": 21.0, "p20_ms": 20.0, "p80_ms": 22.0}, {"ms": 22.8, "p20_ms": 20.2, "p80_ms": 22.9},
                              0.24)
    assert "a gap of 1.8 ms" in agree and "inside the two times' p20-p80 ranges" in agree and "agree" in agree
    near = viz_kb._gap_words({"ms": 21.3}, {"ms": 20.4}, 0.86)
    assert "1.0 times" in near and "no difference beyond the round trip's jitter" in near
    far = viz_kb._gap_words({"ms": 2.0, "p20_ms": 1.0, "p80_ms": 3.0}, {"ms": 22.8, "p20_ms": 20.2, "p80_ms": 22.9}, 0.24)
    assert "outside both p20-p80 ranges" in far and "disagree" in far
    rec = measure.make_record("kernelbench", "isolation_agreement", "honest slow softmax, both modes", 21.3,
                              extra={"in_process_ms": 20.4, "isolated_ms": 21.3, "resolution_ms": 0.86})
    assert "took 20.4 and 21.3 ms" in viz_kb.caption(OLD + [rec])


def test_chapter_08_provenance_is_one_collapsed_cell_naming_the_records():
    text = viz_kb.provenance("cpu", [_kernel("softmax", 0.2, 1.0, peer_ms=0.1)])
    assert text.startswith("<details>") and text.rstrip().endswith("</details>")
    assert "strong peers timed for softmax" in text and "--cases problems isolation" in text
