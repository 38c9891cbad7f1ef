"""The notebooks' "measured now vs recorded on the H200" picture and table pair the right records."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from minimax_lab.viz import live_vs_recorded as lvr  # noqa: E402


def rec(case, impl, tflops, commit="580080af7a88", torch_version="2.11.0+cu130"):
    return {"suite": "attention", "case": case, "impl": impl, "tflops": tflops, "ms": 1.0, "commit": commit,
            "torch": torch_version, "triton": "3.6.0"}


MEASURED = [rec("c16k", "triton", 500.0, None), rec("c16k", "sdpa_flash", 300.0, None), rec("c16k", "mine_only", 1.0, None)]
RECORDED = [rec("c16k", "triton", 547.0), rec("c16k", "sdpa_cudnn", 577.0, "fcf000c", "2.12.0+cu130"),
            rec("c64k", "triton", 564.0, "0ld0ld0")]


def test_rows_pair_by_case_and_impl_and_keep_only_measured_cases():
    rows = lvr.pair_rows(MEASURED, RECORDED, "tflops")
    got = {(r["case"], r["impl"]): (r["measured"], r["recorded"]) for r in rows}
    assert got == {("c16k", "triton"): (500.0, 547.0), ("c16k", "sdpa_flash"): (300.0, None),
                   ("c16k", "mine_only"): (1.0, None), ("c16k", "sdpa_cudnn"): (None, 577.0)}
    assert lvr.commits_label(RECORDED) == "commits 0ld0ld0, 580080a, fcf000c"
    assert lvr.commits_label([rec("c", "i", 1.0, None)]) == "commit unknown"
    with pytest.raises(ValueError, match="metric"):
        lvr.pair_rows(MEASURED, RECORDED, "flops")


def test_table_and_plot_say_which_number_is_which():
    text = lvr.format_rows(MEASURED, RECORDED, "tflops", device_now="NVIDIA GeForce RTX 4090")
    assert "measured now on NVIDIA GeForce RTX 4090" in text and "recorded on NVIDIA H200" in text
    assert "0.91" in text                                        # 500 / 547 for the paired row
    ax = lvr.plot(MEASURED, RECORDED, "tflops", device_now="NVIDIA GeForce RTX 4090")
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["recorded on NVIDIA H200 (torch 2.11.0+cu130, triton 3.6.0; torch 2.12.0+cu130, triton 3.6.0)",
                      "measured now on NVIDIA GeForce RTX 4090"]
    assert "580080a" not in text and "fcf000c" not in text           # no commit reaches what a learner reads
    only_64k = [rec("c16k", "triton", 1.0, None)], [rec("c64k", "triton", 564.0)]
    assert "(no record at these shapes)" in lvr.format_rows(*only_64k, "tflops")
    widths = sorted(p.get_width() for p in ax.patches if p.get_width() > 0)
    assert widths == [1.0, 300.0, 500.0, 547.0, 577.0]
    with pytest.raises(ValueError, match="nothing to compare"):
        lvr.plot(MEASURED[1:], RECORDED, "tflops", device_now="x")
