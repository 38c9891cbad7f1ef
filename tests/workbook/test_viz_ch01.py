"""Chapter 01's helpers say what their numbers say: the check of a part built by hand fails on a
different answer, RoPE's picture is drawn from a rotation that depends on distance only, the
grounding ratio per question is the image's attention on the object over the object's share of the
patches and averages to the package's, and every comparison word (heads, seeds,
guessing) follows the numbers it compares and their noise."""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from minimax_lab.data import make_examples  # noqa: E402
from minimax_lab.model import ModelConfig, TinyMultimodalModel, TrainConfig  # noqa: E402
from minimax_lab.model.experiments import grounding_ratios  # noqa: E402
from minimax_lab.model.layers import apply_rope, rope_cos_sin  # noqa: E402
from minimax_lab.viz import attention_maps as amaps  # noqa: E402
from minimax_lab.viz import early_fusion, step_zero  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def package_rope(x, positions):
    return apply_rope(x, *rope_cos_sin(positions, x.shape[-1], 10000.0))


# --------------------------------------------------------------------------- the checks and RoPE's picture

def test_same_prints_the_largest_difference_and_raises_on_a_real_one(capsys):
    a = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    b = a.clone()
    b[1, 2] += 1e-6
    early_fusion.same("part", b, a)
    assert (f"part: equal to the package's within rtol 1.3e-06, atol 1e-05, shape (3, 5), max |difference| "
            f"{float((b - a).abs().max()):.1e}") in capsys.readouterr().out
    early_fusion.same("whole", b, a, rtol=1e-5, atol=1e-4)
    assert "whole: equal to the package's within rtol 1.0e-05, atol 1e-04," in capsys.readouterr().out
    with pytest.raises(AssertionError):
        early_fusion.same("part", a, a + 1e-3)
    with pytest.raises(AssertionError):
        early_fusion.same("part", a, a[:2])


def test_rope_scores_depend_on_the_distance_only():
    d = np.arange(0, 40)
    near = early_fusion.rope_scores(package_rope, 16, d, start=0, n_vectors=8)
    far = early_fusion.rope_scores(package_rope, 16, d, start=1000, n_vectors=8)
    assert near.shape == (8, 40)
    np.testing.assert_allclose(near[:, 0], 1.0, atol=1e-5)        # unit vectors, no rotation between them
    np.testing.assert_allclose(near, far, atol=2e-4)               # fp32 angles at position 1000 round a little
    assert abs(near[:, 1:].mean(0)).max() < 1.0                   # and rotating does change the score

    def absolute(x, positions):                                   # a position code that is not relative
        return x * (1 + positions[..., None, None].float() / 100)
    assert not np.allclose(early_fusion.rope_scores(absolute, 16, d, start=0, n_vectors=8),
                           early_fusion.rope_scores(absolute, 16, d, start=1000, n_vectors=8), atol=1e-2)


def test_rope_picture_draws_the_given_rotation():
    calls = []

    def spy(x, positions):
        calls.append(tuple(x.shape))
        return package_rope(x, positions)
    fig = early_fusion.plot_rope(spy, 32, 10000.0, max_distance=50, seq_len=28)
    assert calls and all(s[-1] == 32 for s in calls)
    labels = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert any("first position 1000" in t for t in labels) and any("(28)" in t for t in labels)


# --------------------------------------------------------------------------- grounding

def _small_model():
    torch.manual_seed(0)
    return TinyMultimodalModel(ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64))


def test_grounding_per_question_averages_to_the_packages_ratio():
    model = _small_model()
    examples = make_examples("test", 40, 3)
    per_q, share = amaps.grounding_per_question(model, examples, batch_size=16)
    kept = [e for e in examples if e.focus]
    assert per_q.shape == share.shape == (len(kept), 2, 4)
    torch.testing.assert_close(per_q.mean(0), grounding_ratios(model, examples, batch_size=16), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="focus"):
        amaps.grounding_per_question(model, [e for e in examples if not e.focus])


def test_grounding_divides_out_the_share_of_attention_on_the_image():
    # one question at a time, by hand: of the answer row's weight on the 16 patches, the part on the
    # focus cells, over the focus cells' part of the patches
    model = _small_model()
    examples = [e for e in make_examples("test", 30, 5) if e.focus][:5]
    per_q, share = amaps.grounding_per_question(model, examples)
    batch, attn = amaps.capture_attention(model, examples)
    for n, e in enumerate(examples):
        for layer in range(2):
            for head in range(4):
                on_image = attn[layer][n, head, int(batch.answer_pos[n]), 1:17].double()
                on_object = sum(float(on_image[c]) for c in e.focus)
                want = on_object / float(on_image.sum()) / (len(e.focus) / 16)
                assert float(share[n, layer, head]) == pytest.approx(float(on_image.sum()), rel=1e-5)
                assert float(per_q[n, layer, head]) == pytest.approx(want, rel=1e-4)
    assert float(share.max()) < 1.0                 # the words take some of each row: not the same measure
    assert float(per_q.max()) <= 16.0 + 1e-4        # one focus patch caps the ratio at 16


def _per_question(best: float, runner_up: float, spread: float, n: int = 100) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    per_q = torch.ones(n, 2, 3)
    per_q[:, 1, 2] = best + spread * torch.randn(n, generator=g)
    per_q[:, 0, 1] = runner_up + spread * torch.randn(n, generator=g)
    return per_q


def test_grounding_lines_judge_heads_against_their_noise():
    per_q = _per_question(6.0, 3.0, 1.0)
    clear = amaps.grounding_lines(per_q)
    best, two_se = per_q[:, 1, 2].double().mean().item(), 2 * per_q[:, 1, 2].double().std().item() / 10
    assert f"best head: layer 1 head 2, grounding ratio {best:.1f} ± {two_se:.1f} (two standard errors over 100 " in clear
    assert "above 1: within the image it prefers" in clear
    assert f"runner-up, layer 0 head 1 ({per_q[:, 0, 1].mean().item():.1f})" in clear
    assert "larger than its noise" in clear
    close = amaps.grounding_lines(_per_question(3.02, 3.0, 2.0))
    assert "inside its noise: no measurable difference" in close
    flat = amaps.grounding_lines(_per_question(1.05, 0.5, 3.0))
    assert "not measurably above 1" in flat
    share = torch.full_like(per_q, 0.25)
    share[:, 1, 2] = 0.75
    with_share = amaps.grounding_lines(per_q, share)
    assert "avoids" not in with_share and "0.75 of its attention is on the image\n" in with_share
    assert f"({per_q[:, 0, 1].mean().item():.1f}; 0.25 of its attention is on the image)" in with_share


def test_grounding_table_writes_each_mean_with_its_two_standard_errors():
    per_q = _per_question(6.0, 3.0, 1.0)
    fig = amaps.grounding_table(per_q)
    texts = [t.get_text() for t in fig.axes[0].texts]
    mean, two_se = per_q[:, 1, 2].mean().item(), 2 * per_q[:, 1, 2].std().item() / math.sqrt(100)
    assert f"{mean:.1f}\n±{two_se:.1f}" in texts
    assert "100 questions" in fig.axes[0].get_title()
    assert all("±" not in t.get_text() for t in amaps.grounding_table(per_q.mean(0)).axes[0].texts)
    share = torch.full_like(per_q, 0.5)
    share[:, 1, 2] = 0.125
    texts = [t.get_text() for t in amaps.grounding_table(per_q, share).axes[0].texts]
    assert f"{mean:.1f}\n±{two_se:.1f}\nimage 0.12" in texts and texts.count("1.0\n±0.0\nimage 0.50") == 4
    with pytest.raises(ValueError, match="image_share"):
        amaps.grounding_table(per_q, share[:, :1])


# --------------------------------------------------------------------------- accuracy and the experiment

def test_accuracy_lines_give_each_share_with_its_noise_against_guessing():
    examples = make_examples("test", 90, 1)
    n = {q: sum(e.qtype == q for e in examples) for q in ("colour", "count", "left")}
    text = step_zero.accuracy_lines({"all": 0.9, "colour": 1.0, "count": 0.3, "left": 0.5}, examples)
    assert "held-out accuracy on 90 test questions: 90.0% ± 6.3%" in text
    assert f"colour: 100.0% ± {step_zero.two_se_share(1.0, n['colour']):.1%} of {n['colour']}, above guessing" in text
    assert "left: 50.0%" in text and "left: 50.0% ± 0" not in text
    assert "count: 30.0%" in text and "no different from guessing" in text   # 30% of a third of 90 is inside the noise


def test_history_plot_draws_the_test_accuracy_it_prints():
    hist = {"loss": [2.0, 1.0, 0.5], "val_step": [1, 2, 3], "val_acc": [0.3, 0.5, 0.6]}
    fig = step_zero.plot_history(hist, n_val=256, test_acc=0.957, n_test=1000)
    labels = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert "validation, 256 questions" in labels and "held-out test, 1000 questions (95.7%)" in labels


def _run(seed, mixed, text_first, g_mixed=3.0, g_text=3.0, steps=20):
    def schedule(acc, grounding, jump):
        loss = [1.0] * (steps // 2) + [jump] * (steps - steps // 2)
        return {"test_acc": {"colour": acc, "count": acc, "left": acc, "all": acc}, "best_grounding": grounding,
                "history": {"loss": loss, "val_step": [10, 20], "val_acc": [acc / 2, acc]}}
    return {"steps": steps, "seed": seed, "text_first_frac": 0.5, "n_test": 60,
            "train_config": {"eval_examples": 64}, "mixed": schedule(mixed, g_mixed, 1.0),
            "text_first": schedule(text_first, g_text, 2.0)}


def _experiment(*rs):
    return {**rs[0], "more_seeds": list(rs[1:])}


def test_runs_unpack_the_experiment_seed_by_seed():
    exp = _experiment(_run(0, 0.5, 0.6), _run(1, 0.4, 0.5))
    assert [r["seed"] for r in step_zero.runs(exp)] == [0, 1]
    assert all("more_seeds" not in r for r in step_zero.runs(exp))
    assert step_zero.runs(_run(7, 0.5, 0.5)) == [_run(7, 0.5, 0.5)]


def test_schedule_lines_judge_the_schedules_by_seed_against_the_seeds_noise():
    exp = _experiment(_run(0, 0.50, 0.60, 3.0, 2.0), _run(1, 0.40, 0.52, 3.2, 2.1), _run(2, 0.45, 0.54, 2.9, 2.0))
    text = step_zero.schedule_lines(exp)
    accs = [0.50, 0.40, 0.45]
    mean, two_se = np.mean(accs), 2 * np.std(accs, ddof=1) / math.sqrt(3)
    assert "seeds [0, 1, 2] (the shipped runs)" in text
    assert f"mixed: held-out accuracy {mean:.1%} ± {two_se:.1%} over the seeds (50.0%, 40.0%, 45.0%), above guessing" in text
    assert "accuracy +10.3 points ± 1.8 (two standard errors over 3 seeds), larger than its noise" in text
    assert "best object-attention ratio -1.0 ± 0.1 (two standard errors over 3 seeds), larger than its noise" in text
    within = {**exp, "grounding_measure": "within_image",
              "more_seeds": [{**r, "grounding_measure": "within_image"} for r in exp["more_seeds"]]}
    assert "best grounding ratio -1.0 ± 0.1" in step_zero.schedule_lines(within)
    with pytest.raises(ValueError, match="one grounding measure"):
        step_zero.schedule_lines({**exp, "grounding_measure": "within_image"})
    assert "rises to 1.50x, 1.50x, 1.50x" in text     # the 25-step trailing mean, half of it after the switch
    assert ("the seeds of one schedule lie up to 10.0 points apart, against ± 12.9 points from one seed's 60 "
            "questions alone: no more than the questions' own noise") in text
    wide = _experiment(_run(0, 0.2, 0.5), _run(1, 0.9, 0.5), _run(2, 0.5, 0.5))
    assert "lie up to 70.0 points apart, against ± 12.9 points" in step_zero.schedule_lines(wide)
    assert "the seed, not the questions, is the larger noise" in step_zero.schedule_lines(wide)
    low = _experiment(_run(0, 0.30, 0.3), _run(1, 0.35, 0.3), _run(2, 0.33, 0.3))
    assert "over the seeds (30.0%, 35.0%, 33.0%), not measurably different from guessing" in step_zero.schedule_lines(low)
    noisy = _experiment(_run(0, 0.50, 0.60), _run(1, 0.50, 0.40), _run(2, 0.45, 0.50))
    assert "accuracy +1.7 points ± 12.0 (two standard errors over 3 seeds), inside its noise" in step_zero.schedule_lines(noisy)


def test_schedule_plot_draws_the_test_accuracy_with_its_error_over_seeds():
    exp = _experiment(_run(0, 0.50, 0.60), _run(1, 0.40, 0.52), _run(2, 0.45, 0.54))
    fig = step_zero.plot_schedules(exp)
    bars = [c for c in fig.axes[1].containers if "held-out test" in c.get_label()]
    assert len(bars) == 2 and all(c.has_yerr for c in fig.axes[1].containers)
    (segment,) = bars[0].lines[2][0].get_segments()
    accs = [0.50, 0.40, 0.45]
    two_se = 2 * np.std(accs, ddof=1) / math.sqrt(3)
    np.testing.assert_allclose(segment[:, 1], [np.mean(accs) - two_se, np.mean(accs) + two_se])
    labels = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert f"mixed, held-out test: {np.mean(accs):.1%} ± {two_se:.1%}" in labels


def test_run_experiment_records_each_seed_with_its_versions():
    cfg = ModelConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32)
    tc = TrainConfig(batch_size=4, warmup=1, eval_examples=4)
    exp = step_zero.run_experiment(cfg, 4, [3, 4], tc=tc, n_test=12)
    rs = step_zero.runs(exp)
    assert [r["seed"] for r in rs] == [3, 4] and all(r["steps"] == 4 and r["n_test"] == 12 for r in rs)
    assert all(r["versions"]["torch"] == torch.__version__ and "threads" in r["trained_on"] for r in rs)
    assert rs[0]["mixed"]["history"]["loss"] != rs[1]["mixed"]["history"]["loss"]   # the seed matters
    with pytest.raises(ValueError, match="seed"):
        step_zero.run_experiment(cfg, 4, [], tc=tc)


def test_the_shipped_experiment_says_where_and_with_what_each_seed_ran():
    rs = step_zero.runs(step_zero.shipped_experiment())
    assert len({r["seed"] for r in rs}) == len(rs) >= 3
    assert len({r["steps"] for r in rs}) == 1
    for r in rs:
        assert r["versions"]["torch"] and r["trained_on"]
        for schedule in ("mixed", "text_first"):
            assert len(r[schedule]["history"]["loss"]) == r["steps"]
    text = early_fusion.provenance("cpu", 1.0, {"train_config": {"steps": 5}, "torch": "x"},
                                   step_zero.shipped_experiment(), n_test=10)
    assert text.startswith("<details>") and f"seeds {[r['seed'] for r in rs]}" in text
    assert "versions not recorded" not in text


def test_seeds_trained_side_by_side_give_the_numbers_of_one_after_the_other(tmp_path):
    from minimax_lab.model import make_checkpoint
    from minimax_lab.model.experiments import step_zero_experiment
    cfg = ModelConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32)
    tc = TrainConfig(batch_size=4, warmup=1, eval_examples=4)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                      # the side-by-side processes train on one thread each
    try:
        alone = step_zero_experiment(cfg, 3, [1, 2], tc=tc, n_test=8)
    finally:
        torch.set_num_threads(threads)
    together = step_zero_experiment(cfg, 3, [1, 2], tc=tc, n_test=8, jobs=2)
    for a, b in zip(step_zero.runs(alone), step_zero.runs(together)):
        assert a["seed"] == b["seed"] and b["trained_on"].endswith("1 threads")
        for schedule in ("mixed", "text_first"):
            assert a[schedule]["history"]["loss"] == b[schedule]["history"]["loss"]
            assert a[schedule]["grounding"] == b[schedule]["grounding"]
    with pytest.raises(ValueError, match="jobs"):
        step_zero_experiment(cfg, 3, [1], tc=tc, jobs=0)
    with pytest.raises(SystemExit):
        make_checkpoint.main(["--experiment", "--jobs", "0", "--out-dir", str(tmp_path)])
