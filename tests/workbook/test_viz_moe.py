"""Chapter 05's bookkeeping: the routing log its training runs keep, the sentences on balance and on
the sign rule (computed from the numbers, either way they point), the H200 records widened over
repeated runs, the FP8 byte count and the provenance cell."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from minimax_lab.data import collate, make_examples  # noqa: E402
from minimax_lab.model import TinyMultimodalModel, preset_config  # noqa: E402
from minimax_lab.moe import quantize_experts  # noqa: E402
from minimax_lab.viz import moe as vmoe  # noqa: E402
from minimax_lab.viz import moe_records  # noqa: E402


def tiny_moe_model(rate: float):
    torch.manual_seed(0)
    cfg = preset_config("cpu", ffn="moe", n_experts=4, moe_top_k=2, router="sigmoid_bias", d_model=32, n_layers=2,
                        n_heads=2, n_kv_heads=1, head_dim=16, d_ff=32)
    model = TinyMultimodalModel(cfg)
    for blk in model.blocks:
        blk.ffn.bias_update_rate = rate
    return model


def test_routing_log_records_loads_biases_and_which_steps_held_images():
    model = tiny_moe_model(rate=0.1).train()
    log = vmoe.RoutingLog(model)
    image, text = collate(make_examples("train", 3, seed=1)), collate(make_examples("train", 3, seed=2, with_image=False))
    with torch.no_grad():
        for b in (image, text, image):
            model(b.tokens, b.images)
        model.eval()
        model(image.tokens, image.images)          # evaluation forwards are not training steps
    assert log.image_steps.tolist() == [True, False, True]
    for layer, (loads, bias) in enumerate(zip(log.loads, log.bias)):
        assert loads.shape == bias.shape == (3, 4)
        moved = torch.diff(torch.cat([torch.zeros(1, 4), bias]), dim=0).abs()
        assert torch.allclose(moved[moved > 0], torch.full_like(moved[moved > 0], 0.1))   # sign rule: +-rate
    result = log.result()
    assert set(result) == {"loads", "bias", "image_steps"}


def test_routing_log_counts_exactly_the_non_padding_slots():
    from minimax_lab.data import TOKENIZER

    model = tiny_moe_model(rate=0.0).train()
    log = vmoe.RoutingLog(model)
    b = collate(make_examples("train", 4, seed=3))
    with torch.no_grad():
        model(b.tokens, b.images)
    real = int((b.tokens != TOKENIZER.pad_id).sum())
    assert [int(l.sum()) for l in log.loads] == [2 * real, 2 * real]
    assert all(float(x.abs().sum()) == 0.0 for x in log.bias)      # rate 0: the bias never moves


def run_of(image_loads, text_loads, steps=10, rate=0.01, bias_moves=None):
    loads = torch.stack([torch.tensor(image_loads if s % 2 == 0 else text_loads) for s in range(steps)])
    moves = bias_moves or [(-rate if s % 2 == 0 else rate) for s in range(steps)]
    bias = torch.zeros(steps, len(image_loads))
    bias[:, 0] = torch.tensor(moves).cumsum(0)
    return {"loads": [loads], "bias": [bias], "image_steps": torch.tensor([s % 2 == 0 for s in range(steps)])}


def test_sign_rule_words_say_what_the_bias_did_and_only_then_explain():
    zigzag = run_of([6, 1, 1, 0], [1, 3, 2, 2])       # expert 0: 3x the mean on image steps, 0.5x on text
    text = vmoe.sign_rule_words(zigzag, rate=0.01)
    assert "Layer 0's expert 0" in text and "on image steps 3.00x the mean" in text and "on text steps 0.50x" in text
    assert "down 5 times and up 5 times" in text and "ending at +0.000" in text
    assert "stayed near where it began" in text
    drifting = run_of([6, 1, 1, 0], [1, 3, 2, 2], bias_moves=[-0.01] * 10)   # pushed down at every step
    said = vmoe.sign_rule_words(drifting, rate=0.01)
    assert "down 10 times and up 0 times" in said and "ending at -0.100" in said
    assert "stayed near where it began" not in said


def test_balance_words_call_a_move_only_outside_the_step_pairs_spread():
    steady = {"loads": [torch.tensor([[9, 1]] * 4)]}
    noisy_off = {"loads": [torch.tensor([[9, 1], [1, 1], [1, 9], [1, 1]])]}   # pairs: 1.67, 1.67
    noisy_on = {"loads": [torch.tensor([[5, 5], [6, 4], [8, 2], [9, 1]])]}     # pairs: 1.1, 1.7
    fell = vmoe.balance_words({"off": steady, "on": {"loads": [torch.tensor([[5, 5]] * 4)]}}, last=4)
    assert "layer 0 fell from 1.8 to 1" in fell and "(1.80-1.80 over 2 step pairs)" in fell
    level = vmoe.balance_words({"off": noisy_off, "on": noisy_on}, last=4)
    assert "inside the spread of the step pairs" in level and "fell" not in level


def test_sign_rule_figure_draws_the_load_and_the_bias():
    runs = {"off": run_of([6, 1, 1, 0], [1, 3, 2, 2], bias_moves=[0.0] * 10), "on": run_of([6, 1, 1, 0], [1, 3, 2, 2])}
    fig = vmoe.sign_rule_figure(runs, last=10)
    assert len(fig.axes) == 2 and "expert 0" in fig.axes[0].get_title()
    assert list(fig.axes[1].lines[0].get_ydata()[:2]) == pytest.approx([-0.01, 0.0])
    plt.close("all")


def record(when, ms, p20, p80, config, impl="triton", triton="3.6.0"):
    return {"suite": "moe", "case": "E8_k2_d64_f32_T64", "impl": impl, "device": "NVIDIA H200", "when": when,
            "ms": ms, "p20_ms": p20, "p80_ms": p80, "config": config, "triton": triton, "torch": "2.11.0",
            "dtype": "bfloat16", "shape": {"E": 8, "k": 2, "d": 64, "f": 32, "T": 64},
            "timing_method": "CUDA events per call"}


def test_gpu_records_widen_the_newest_run_over_its_repeats_only(monkeypatch):
    runs = [record("1", 1.0, 0.5, 1.5, {"BLOCK_M": 16}),        # another config: not a repeat
            record("2", 1.2, 1.1, 1.3, {"BLOCK_M": 32}),
            record("3", 1.0, 0.9, 1.05, {"BLOCK_M": 32}, triton="3.5.0"),   # other versions: not a repeat
            record("4", 1.1, 1.05, 1.2, {"BLOCK_M": 32}),
            record("4", 2.0, 1.9, 2.1, None, impl="torch_grouped_mm")]
    monkeypatch.setattr(moe_records.measure, "load_records", lambda *a, **k: list(runs))
    got = {r["impl"]: r for r in moe_records.gpu_records()}
    ours = got["triton"]
    assert (ours["when"], ours["ms"], ours["p20_ms"], ours["p80_ms"], ours["n_runs"]) == ("4", 1.1, 1.05, 1.3, 2)
    assert got["torch_grouped_mm"]["n_runs"] == 1 and got["torch_grouped_mm"]["p80_ms"] == 2.1


def test_gpu_words_follow_the_widened_spreads(monkeypatch):
    base = dict(pct_of_ceiling=50.0, ceiling="copy", gbps=1.0, tflops=1.0)
    ours = {**record("1", 1.0, 0.98, 1.02, {}), **base, "n_runs": 3}
    peer = {**record("1", 1.05, 1.04, 1.06, None, impl="sglang_triton"), **base, "n_runs": 3}
    assert "1.05x faster than SGLang" in vmoe.on_a_gpu_words([ours, peer], E=8)
    wide = {**ours, "p80_ms": 1.045}                  # a repeat reached into the peer's range: no gap
    said = vmoe.on_a_gpu_words([wide, peer], E=8)
    assert "level with SGLang" in said and "widened over every recorded run, up to 3" in said


def test_fp8_bytes_are_counted_against_bf16_and_the_dtype_at_hand():
    w13, w2 = torch.randn(2, 32, 16), torch.randn(2, 16, 16)
    q13, s13, q2, s2 = quantize_experts(w13, w2)
    text = vmoe.fp8_bytes_words(q13, s13, q2, s2, w13, w2)
    fp8 = q13.nbytes + s13.nbytes + q2.nbytes + s2.nbytes
    bf16 = 2 * (w13.numel() + w2.numel())
    assert f"{fp8:,} bytes" in text and f"{bf16:,} bytes of the same weights in bf16" in text
    assert f"{bf16 / fp8:.2f}x fewer" in text and f"{2 * bf16 / fp8:.2f}x fewer than the {2 * bf16:,} bytes" in text
    assert "they take here" not in vmoe.fp8_bytes_words(q13, s13, q2, s2, w13.bfloat16(), w2.bfloat16())


def test_provenance_is_one_collapsed_block_naming_device_and_versions():
    recs = [{**record("2026-01-02T00:00", 1.0, 0.9, 1.1, {}), "reps": 20, "n_runs": 2}]
    md = moe_records.provenance(preset="cpu", seconds=12.0, records=recs)
    assert md.startswith("<details>") and md.endswith("</details>")
    assert "NVIDIA H200, Triton 3.6.0, torch 2.11.0" in md and "up to 2 runs" in md and "12 s" in md
    assert "section 5" not in moe_records.provenance(preset="cpu", seconds=1.0, records=[])


def test_measure_here_times_nothing_in_the_cpu_preset():
    assert moe_records.measure_here("cpu") == []
