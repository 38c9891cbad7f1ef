"""The chapter's recorded-scores figure: one row per record (two records of one problem -- in this
process and isolated -- stay two rows), every label the ratio of its own row, the strong peer's
ratio first and said to be missing where a record has none, and a caption computed from them."""
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from minimax_lab import bench  # noqa: E402
from minimax_lab.notebook import recorded  # noqa: E402
from minimax_lab.viz import kernelbench as viz_kb  # noqa: E402


def _kernel(case, ms, ref_ms, peer_ms=None, isolated=False):
    peers = {"strong_peer": peer_ms, "reference": ref_ms}
    return bench.make_record("kernelbench", case, f"workbook:{case}", ms, peers={k: v for k, v in peers.items() if v},
                             extra={"status": "pass", "isolated": isolated,
                                    "strong_peer": "torch.softmax in the input's dtype" if peer_ms else None})


def _hack(name, speedup, caught=True):
    return bench.make_record("kernelbench", f"hack:{name}", "naive-vs-ours (in-process)", 1.0,
                             extra={"naive_speedup": speedup, "caught": caught, "ours_mode": "in-process"})


RECORDS = [_kernel("softmax", 0.2, 1.0), _kernel("softmax", 0.5, 1.0, isolated=True),
           _kernel("rope", 0.1, 1.6), _kernel("fp8_paged_decode", 0.1, 1.2), _hack("cache_last_output", 40.0),
           bench.make_record("kernelbench", "isolation_overhead", "worker round trip", 1.1)]


def _labels(ax):
    """(tick label, the texts annotated on that row's bars) for each row of a kernels panel."""
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    by_row = {}
    for t in ax.texts:
        by_row.setdefault(round(t.xy[1]), []).append(t.get_text())
    return [(tick, sorted(by_row[i])) for i, tick in enumerate(ticks)]


def test_two_records_of_one_problem_are_two_rows_and_labels_do_not_slide():
    rows = viz_kb.kernel_rows(RECORDS)
    assert [r["label"] for r in rows] == ["softmax", "softmax (isolated)", "rope", "fp8_paged_decode"]
    fig = viz_kb.recorded_scores(RECORDS)
    kernels_ax = fig.axes[1]
    got = _labels(kernels_ax)
    assert [tick for tick, _ in got] == ["softmax", "softmax (isolated)", "rope", "fp8_paged_decode"]
    assert got[1][1] == sorted([viz_kb.NO_PEER, "2.00x"])  # softmax isolated: 1.0 / 0.5
    assert got[3][1] == sorted([viz_kb.NO_PEER, "12.00x"])  # fp8_paged_decode keeps its own ratio
    plt.close(fig)


def test_the_strong_peer_ratio_is_drawn_first_where_recorded():
    recs = [_kernel("softmax", 0.2, 1.0, peer_ms=0.1), _kernel("rope", 0.1, 1.6)]
    rows = viz_kb.kernel_rows(recs)
    assert rows[0]["strong_peer"] == 0.5 and rows[1]["strong_peer"] is None
    fig = viz_kb.recorded_scores(recs)
    ax = fig.axes[0]
    assert ax.get_legend().get_texts()[0].get_text().startswith("over the strong peer")
    assert "0.50x" in [t.get_text() for t in ax.texts] and viz_kb.NO_PEER in [t.get_text() for t in ax.texts]
    plt.close(fig)
    cap = viz_kb.caption(recs)
    assert "1 of 2 have a recorded ratio" in cap and "2.00x slower than the peer" in cap, cap
    assert len(re.split(r"(?<=\.)\s+(?=[A-Z])", cap)) <= 3  # at most three sentences


def test_caption_says_the_strong_peer_ratio_is_missing_and_counts_the_hacks():
    cap = viz_kb.caption(RECORDS)
    assert viz_kb.NO_PEER in cap and "passed the 1 hacks recorded" in cap, cap
    assert "failed 1 of them in the candidate's process and 0 more" in cap and "missed" not in cap, cap
    assert "up to 40x" in cap


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
