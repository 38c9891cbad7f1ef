"""Chapter 02's helpers for the kernels it grows in cells: the edit shown between two versions names
only real changes, the checks catch a kernel that is wrong, the launch-order waves follow the
kernel's index math, and the recorded figure and provenance say where their numbers come from."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402

from minimax_lab import runtime  # noqa: E402
from minimax_lab.attention.dense_reference import attention_reference  # noqa: E402
from minimax_lab.viz import flash, flash_checks, flash_steps  # noqa: E402


def softmax_rows(x, block):  # noqa: D103 - the versions an edit is shown between
    m = x.max()   # the row max
    return (x - m).exp() / (x - m).exp().sum()


def softmax_rows_v2(x, block):  # noqa: D103
    m = x.max()           # a comment that changed
    e = (x - m).exp()
    return e / e.sum()


def test_an_edit_shows_the_changed_lines_not_the_rename_or_the_comments():
    edit = flash.show_edit(softmax_rows, softmax_rows_v2)
    assert edit.names == ("softmax_rows", "softmax_rows_v2")
    assert "+    e = (x - m).exp()" in edit.lines and "-    return (x - m).exp() / (x - m).exp().sum()" in edit.lines
    assert not any(line[0] in "+-" and "def " in line for line in edit.lines)   # the rename is no change
    assert not any(line[0] in "+-" and "m = x.max()" in line for line in edit.lines)  # nor a new comment
    assert (edit.added, edit.removed) == (2, 1) and "```diff" in edit._repr_markdown_()
    with pytest.raises(TypeError, match="Python source"):
        flash.show_edit(len, softmax_rows)


def test_the_checks_inputs_are_ragged_batched_and_strided():
    x = flash_checks.strided_inputs(3, S=37, Skv=45, D=16)
    assert x["q"].shape == (2, 37, 2, 16) and x["k"].shape == (2, 45, 1, 16)
    assert not any(t.is_contiguous() for t in x.values()) and x["k"].stride() == x["v"].stride()
    assert x["q"].device.type == runtime.kernel_device().type
    again = flash_checks.strided_inputs(3, S=37, Skv=45, D=16)
    assert torch.equal(x["q"], again["q"])                       # fixed seeds: a rerun repeats


def reference(q, k, v, CAUSAL=True):
    return attention_reference(q, k, v, causal=CAUSAL).to(q.dtype)


def test_a_right_kernel_passes_the_check_and_a_wrong_one_is_named(capsys):
    flash_checks.check(reference, lengths=(21, 30))
    assert capsys.readouterr().out.count("PASS") == 2
    with pytest.raises(AssertionError, match="not causal"):      # causal mask applied where it must not be
        flash_checks.check(lambda q, k, v, CAUSAL: reference(q, k, v, True), lengths=(21, 30))

    def drops_the_ragged_tail(q, k, v, CAUSAL):                   # only whole 16-key tiles
        n = k.shape[1] // 16 * 16
        return reference(q, k[:, :n], v[:, :n], CAUSAL=False)
    with pytest.raises(AssertionError):
        flash_checks.check(drops_the_ragged_tail, lengths=(21, 30), causal=(False,))
    with pytest.raises(ValueError, match="lengths"):
        flash_checks.check(reference, lengths=(40, 30))


def test_a_step_prints_its_checks_and_its_record_and_checks_every_candidate(capsys):
    flash_steps.step("v3", reference, "auto", {}, lengths=(21, 30))
    out = capsys.readouterr().out
    assert out.count("PASS") == 2 and "recorded on the NVIDIA H200, Triton 3.6.0" in out and "from v2" in out
    if runtime.is_interpreter():   # the autotuner cannot time here: every candidate is checked instead
        flash_steps.step("v6", None, "cpu", {}, lengths=(21, 30), candidates=[reference, reference])
        assert capsys.readouterr().out.count("PASS") == 2


@pytest.mark.skipif(not runtime.is_interpreter(), reason="on a GPU the helper times: no timed unit tests")
def test_nothing_is_timed_in_the_interpreter():
    assert flash_checks.time_on_gpu(reference) is None


def test_the_waves_follow_the_kernels_order():
    heads_fastest = flash_steps.launch_waves(8, 4, heads_together=8, resident=8)
    assert (heads_fastest[:, -1] == 0).all() and (heads_fastest[:, 0] == 3).all()   # the last tiles first
    one_head = flash_steps.launch_waves(8, 4, heads_together=1, resident=8)
    assert one_head[0].tolist() == [0, 0, 0, 0] and one_head[2].tolist() == [1, 1, 1, 1]


def test_the_recorded_figure_has_error_bars_a_legend_and_the_versions():
    fig = flash_steps.plot_recorded()
    ax = fig.axes[0]
    assert sum(isinstance(c, ErrorbarContainer) for c in ax.containers) == len(ax.get_yticklabels())
    assert "NVIDIA H200, Triton 3.6.0, torch 2.11.0" in ax.get_title()
    assert all(t.get_text() for t in ax.get_legend().get_texts())
    here = {"v0": dict(ms=20.0, p20_ms=19.8, p80_ms=20.3, tflops=220.0, reps=20, device="GPU X", triton="3.9.0",
                       torch="2.12")}
    ax = flash_steps.plot_recorded(here).axes[0]
    assert "v0 grown in section 3 (here)" in [t.get_text() for t in ax.get_yticklabels()]
    assert any("measured now on GPU X" in t.get_text() for t in ax.get_legend().get_texts())
    assert "from v0 measured now" not in flash_steps.live_lines("v0", here)


def test_the_provenance_names_the_records_and_how_they_are_judged():
    text = flash_steps.provenance("cpu", 12.0)
    assert text.startswith("<details>") and "NVIDIA H200, Triton 3.6.0" in text and "p20-p80" in text
