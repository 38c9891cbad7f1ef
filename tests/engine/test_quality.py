"""Where FP8 moves the M3 model's logits (per layer and component), and accuracy changes with an interval."""
import pytest
import torch
from tests.support.devices import DEVICE

from minimax_lab.bench import suite_engine_days
from minimax_lab.engine import Engine, EngineOptions, M3Model, m3_config
from minimax_lab.engine.quality import _compare, format_rows, fp8_breakdown, paired_change, rescore, turns_to_rescore
from minimax_lab.viz.engine import breakdown_lines, format_breakdown
from minimax_lab.engine.workloads import chat_sessions, serve


@pytest.fixture(scope="module")
def served():
    # weights drawn on the CPU, then moved: a CUDA generator draws other numbers from the same seed,
    # and the near-tie this test follows is one model's, not every model's
    model = M3Model.create(m3_config("cpu"), "cpu").to(DEVICE)
    eng = Engine(model, EngineOptions(), kv_tokens=4096, record_logits=True)
    run = serve(eng, chat_sessions(model.cfg, **suite_engine_days.CPU_SIZES["chat"]))
    return model, eng, run


def test_rescoring_a_served_turn_gives_the_engines_logits(served):
    model, eng, run = served
    logits, attends = rescore(model, turns_to_rescore(run, eng))
    assert _compare(logits, [t.logits for t in run.turns])["logits_rel_err"] < 1e-5
    layer = model.cfg.sparse_layers[0]
    assert attends[0].selected[layer].shape[-1] == model.cfg.topk


def test_breakdown_names_the_component_behind_the_chat_error(served):
    """The chat case's FP8 error: one layer's K/V rounding moves a later layer's MSA selection
    across a near-tie; the breakdown shows the flip and its margin, and a pooled error far above
    the median token's."""
    model, eng, run = served
    rows = fp8_breakdown(model, turns_to_rescore(run, eng))
    cfg = model.cfg
    assert len(rows) == cfg.n_layers * 2 + len(cfg.sparse_layers) + 1 and rows[-1]["component"] == "everything"
    worst = max(rows[:-1], key=lambda r: r["logits_rel_err"])
    assert worst["component"] == "K and V" and worst["layer"] == cfg.dense_layers[0]
    assert worst["selection_flips"] >= 1 and 0 <= worst["closest_margin"] < 0.01
    assert worst["token_err_max"] > 5 * worst["token_err_p50"]
    experts = [r for r in rows if r["component"] == "experts"]
    assert all(r["selection_flips"] == 0 and r["logits_rel_err"] < 0.01 for r in experts)
    assert "K and V, layer 0" in format_breakdown(rows)
    # the flips carry the error: the same rounding with the full-precision selections kept is far smaller
    assert worst["err_selections_kept"] < 0.5 * worst["logits_rel_err"]
    assert all(r["err_selections_kept"] is None for r in rows if not r["selection_flips"])
    lines = breakdown_lines(rows)
    assert lines[0].startswith("Every selection that changed had two blocks within")
    said = next(line for line in lines if line.startswith("K and V, layer 0:"))
    assert "fell from" in said and "the flipped selections, not the rounding, carry the error" in said, said


def test_breakdown_lines_say_when_the_rounding_carries_the_error():
    row = {"component": "K and V", "layer": 0, "logits_rel_err": 0.02, "selection_flips": 1, "closest_margin": 0.001,
           "widest_margin": 0.001, "err_selections_kept": 0.018}
    lines = breakdown_lines([row])
    assert "within 0.10% of each other" in lines[0] and "the rounding itself carries most of the error" in lines[1]
    assert breakdown_lines([{**row, "selection_flips": 0, "err_selections_kept": None}])[0].startswith("No FP8")
    assert "did not move" in breakdown_lines([{**row, "logits_rel_err": 0.0, "err_selections_kept": 0.0}])[1]


def test_accuracy_table_names_its_columns():
    row = {"variant": "fp8 KV", "accuracy": 0.9, "change": -0.002, "low": -0.006, "high": 0.0, "turned_right": 0,
           "turned_wrong": 1, "logits_rel_err": 0.01, "top1_agreement": 0.998}
    head, line = format_rows([row]).splitlines()
    assert "turned right" in head and "turned wrong" in head and "/" not in line


def test_paired_change_interval():
    before = torch.tensor([True] * 90 + [False] * 10)
    after = before.clone()
    after[:3] = False                                             # three answers turned wrong
    r = paired_change(before, after, seed=1)
    assert r["change"] == pytest.approx(-0.03) and r["turned_wrong"] == 3 and r["turned_right"] == 0
    assert r["low"] < r["change"] <= r["high"] <= 0.0
    assert paired_change(before, before) == {"change": 0.0, "low": 0.0, "high": 0.0, "turned_right": 0,
                                             "turned_wrong": 0}
    assert paired_change(before, after, seed=1) == r
    with pytest.raises(ValueError):
        paired_change(before, after[:5])
