"""The lookup task of chapter 03 and its index branch: the sequences say what they promise, the
answer loss sends nothing to the index weights, every baseline selection keeps the contract and its
cost, and an index distilled from the main branch's attention selects the answer's block more often
than the sliding window and a random pick, by more than two standard errors, where an untrained
index and one taught by a shuffled teacher do not. The figures and sentences follow their numbers.

The task runs on the CPU in every run (the model is tiny; its attention calls ``impl="torch"``)."""
from __future__ import annotations

import dataclasses

import matplotlib
import pytest
import torch

from minimax_lab.attention import msa_select
from minimax_lab.model import lookup as lk
from minimax_lab.model import lookup_index as li
from minimax_lab.viz import lookup as vlk
from minimax_lab.viz import noise

matplotlib.use("Agg")

CFG = lk.LookupConfig()


def _beats(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` ahead of ``b`` by more than two standard errors of their paired per-sequence differences."""
    mean, se2 = noise.mean_diff((a - b).tolist())
    return mean > se2


def _finds_the_answers(hit: dict, name: str) -> bool:
    """The chapter's claim about an index: it selects the answer's block for most questions, ahead of
    the sliding window and of a random pick by more than two standard errors (paired)."""
    return (hit[name].mean() > 0.5 and _beats(hit[name], hit["sliding window"])
            and _beats(hit[name], hit["random pick"]))


@pytest.fixture(scope="module")
def trained():
    """The main branch, held-out sequences, and the measures of every selection (small and seeded)."""
    model, hist = lk.train_lookup(CFG, steps=100, seed=0)
    held = lk.lookup_batch(CFG, 32, CFG.seq_len, seed=2)
    lk.init_index(model, seed=0)
    untrained = li.measure(model, held, li.learned_selection(model, held))
    shuffled = li.distill_index(model, teacher="shuffled", steps=40, held=held, eval_every=20)
    taught = li.distill_index(model, teacher="attention", steps=40, held=held, eval_every=20)
    results = li.compare(model, held, untrained=untrained, shuffled=shuffled["final"])
    return model, held, results, {"shuffled": shuffled, "attention": taught}, hist


def test_lookup_batch_says_what_it_promises():
    b = lk.lookup_batch(CFG, 6, 200, seed=4)
    n, S, Q = 6, 200, CFG.n_questions
    assert b["role"].shape == (n, S) and b["answer"].shape == (n, Q)
    assert torch.equal(b["question_pos"], torch.arange(S - Q, S))
    assert (b["role"][:, -Q:] == lk.QUESTION).all() and (b["role"][:, :-Q] != lk.QUESTION).all()
    rows = torch.arange(n)[:, None]
    assert (b["role"][rows, b["answer_pos"]] == lk.PAIR).all()
    assert (b["answer_pos"] < S - Q).all()
    assert torch.equal(b["key"][rows, b["answer_pos"]], b["key"][:, -Q:])        # the question asks that pair's key
    assert torch.equal(b["value"][rows, b["answer_pos"]], b["answer"])
    for i in range(n):
        keys = b["key"][i][b["role"][i] == lk.PAIR]
        assert len(keys) == CFG.n_pairs and len(set(keys.tolist())) == CFG.n_pairs   # distinct keys
    assert (b["key"][b["role"] == lk.FILLER] == CFG.n_keys).all()                     # filler holds no key
    again = lk.lookup_batch(CFG, 6, 200, seed=4)
    assert all(torch.equal(b[k], again[k]) for k in b)
    assert not torch.equal(lk.lookup_batch(CFG, 6, 200, seed=5)["answer_pos"], b["answer_pos"])
    with pytest.raises(ValueError, match="do not fit"):
        lk.lookup_batch(CFG, 2, CFG.n_questions + 3, seed=0)
    with pytest.raises(ValueError, match="n_pairs"):
        lk.lookup_batch(CFG, 2, 200, seed=0, n_pairs=CFG.n_keys + 1)


def test_the_main_branch_answers_long_sequences_dense(trained):
    _, _, results, _, hist = trained
    assert hist["loss"][-1] < hist["loss"][0] / 4
    assert results["dense"]["answered"].mean() > 0.9


def test_the_answer_loss_sends_no_gradient_to_the_index(trained):
    model, held, *_ = trained
    small = {k: (v[:2] if v.dim() == 2 and k != "question_pos" else v) for k, v in held.items()}
    assert li.answer_loss_index_grads(model, small) == [None, None]
    # the distillation loss does reach them
    x = model.embed(small)
    loss = li.index_distill_loss(*model.index_qk(x), li.teacher_mass(model, small), block_size=CFG.block_size)
    grads = torch.autograd.grad(loss, [model.idx_q.weight, model.idx_k.weight])
    assert all(g is not None and g.abs().sum() > 0 for g in grads)


def test_every_selection_keeps_the_contract_and_its_cost(trained):
    model, held, *_ = trained
    B, S = held["role"].shape
    local = torch.arange(S) // CFG.block_size
    ranking = local + 1 > CFG.topk
    for name, sel in li.selections(model, held, seed=1).items():
        assert sel.shape == (B, S, 1, CFG.topk) and sel.dtype == torch.int32, name
        assert torch.equal(sel[:, :, 0, -1][:, ranking], local[ranking].expand(B, -1).int()), name  # local last
        ranked = sel[:, ranking, 0, :-1]
        assert (ranked >= 0).all() and (ranked < local[ranking][None, :, None]).all(), name     # earlier blocks
        assert (ranked.sort(-1).values.diff(dim=-1) != 0).all(), name                            # distinct
    # the random pick is spread over the earlier blocks, and not the window
    rnd = li.random_selection(64, S, block_size=CFG.block_size, topk=CFG.topk, seed=0)[:, -1, 0, :-1]
    counts = torch.bincount(rnd.flatten().long(), minlength=int(local[-1]))
    assert (counts > 0).all()
    learned = li.learned_selection(model, held)
    assert torch.equal(learned, msa_select(*model.index_qk(model.embed(held)), block_size=CFG.block_size,
                                           topk=CFG.topk, impl="reference"))


def test_distilled_index_beats_window_and_random_pick(trained):
    """The test the chapter's claim rests on; the untrained and the shuffled-teacher index must fail it."""
    _, _, results, hists, _ = trained
    hit = {name: r["hit"] for name, r in results.items()}
    assert _finds_the_answers(hit, "distilled")
    assert _beats(results["distilled"]["answered"], results["sliding window"]["answered"])
    for weak in ("untrained", "shuffled teacher"):
        assert not _finds_the_answers(hit, weak), weak
    assert hists["attention"]["hit"][-1] > hists["attention"]["hit"][0]
    assert results["oracle"]["hit"].mean() > 0.95


def test_distill_index_checks_its_arguments():
    model = lk.LookupModel(CFG)
    with pytest.raises(ValueError, match="teacher"):
        li.distill_index(model, teacher="none", steps=1)
    with pytest.raises(ValueError, match="batch_size"):
        li.distill_index(model, teacher="shuffled", steps=1, batch_size=1)
    with pytest.raises(ValueError, match="steps"):
        li.distill_index(model, steps=0)


def test_by_length_measures_each_length():
    small = dataclasses.replace(CFG, n_pairs=4)
    model, _ = lk.train_lookup(small, steps=5)
    bl = li.by_length(model, (64, 96), n=3)
    assert bl["lengths"] == [64, 96] and bl["n"] == 3
    for name in ("dense", "learned", "window", "random"):
        assert len(bl[name]) == 2 and all(m["hit"].shape == (3,) for m in bl[name]), name
    assert all((m["hit"] == 1).all() for m in bl["dense"])


# --------------------------------------------------------------------------- figures and sentences


def test_question_rows_are_the_index_branch_and_its_selection(trained):
    model, held, *_ = trained
    dist, picks = vlk.question_rows(model, held, 3, what="index")
    Q, nb = CFG.n_questions, CFG.seq_len // CFG.block_size
    assert dist.shape == (Q, nb) and torch.allclose(dist.sum(-1), torch.ones(Q))
    assert torch.equal(picks, li.learned_selection(model, held)[3, held["question_pos"], 0])
    assert torch.equal(dist[:, :-1].argmax(-1).long(), picks[:, 0].long())  # the best earlier block comes first
    mass, none = vlk.question_rows(model, held, 3)
    assert none is None and torch.allclose(mass, li.teacher_mass(model, held)[3, held["question_pos"], 0])
    with pytest.raises(ValueError, match="what"):
        vlk.question_rows(model, held, what="student")


def test_figures_draw(trained):
    model, held, results, hists, _ = trained
    panels = [("teacher", *vlk.question_rows(model, held)), ("index", *vlk.question_rows(model, held, what="index"))]
    fig = vlk.rows_figure(panels, held, 0, block_size=CFG.block_size, topk=CFG.topk)
    assert len(fig.legends[0].get_texts()) == 4
    one = vlk.rows_figure(panels[:1], held, 0, block_size=CFG.block_size, topk=CFG.topk)
    assert len(one.legends[0].get_texts()) == 3        # no "selected" entry where nothing is selected
    fig = vlk.result_figure(results, hists, chance=1 / CFG.n_values)
    assert [a.get_title() for a in fig.axes][1:] == ["the answer's block selected", "answered right"]
    bl = li.by_length(model, (128, 192), n=4)
    fig = vlk.length_figure(bl, block_size=CFG.block_size, topk=CFG.topk, chance=1 / CFG.n_values)
    assert len(fig.axes) == 2
    matplotlib.pyplot.close("all")


def test_sentences_follow_their_numbers(trained):
    _, held, results, hists, hist = trained
    a, b = torch.tensor([1.0, 1.0, 0.9, 1.0]), torch.tensor([0.2, 0.1, 0.3, 0.2])
    assert "x ahead" in vlk.paired_words(a, b, names=("x", "y"), what="w")
    assert "x behind" in vlk.paired_words(b, a, names=("x", "y"), what="w")
    assert "level" in vlk.paired_words(a, a + torch.tensor([0.1, -0.1, 0.1, -0.1]), names=("x", "y"), what="w")
    summary = vlk.result_summary(results)
    assert "ahead of the window" in summary and "ahead of the random pick" in summary
    assert f"{results['distilled']['hit'].mean():.2f}" in summary
    words = vlk.result_words(results)
    assert "shuffled teacher against random pick" in words and "untrained against random pick" in words
    assert "± " in vlk.teacher_words(trained[0], held)
    tiny = {"config": {"steps": 8, "warmup_steps": 3, "n_train": 16, "n_images": 12, "batch_size": 4, "n_eval": 4},
            "seconds": 1.5}
    text = vlk.provenance(preset="cpu", cfg=CFG, n_held=32, main_history=hist, histories=hists, seconds=12.0,
                          tiny_history=tiny, recorded_with="NVIDIA H200, torch 2.11.0")
    assert text.startswith("<details>") and text.rstrip().endswith("</details>")
    assert "torch" in text and "seeds" in text and "8 steps (3 of them the dense warm-up)" in text
    assert "NVIDIA H200, torch 2.11.0" in text and f"{len(hist['loss'])} steps" in text


def test_length_words_name_both_comparisons():
    t = lambda *x: {"answered": torch.tensor(x)}  # noqa: E731
    bl = {"lengths": [128], "learned": [t(1.0, 1.0, 0.9, 1.0)], "dense": [t(1.0, 1.0, 1.0, 1.0)],
          "window": [t(0.2, 0.3, 0.1, 0.2)]}
    line = vlk.length_words(bl)
    assert "against dense attention (level)" in line and "against the window (ahead)" in line
    assert vlk.paired_gap(torch.tensor([0.1, 0.2, 0.1]), torch.tensor([0.9, 0.8, 0.9]))[2] == "behind"


def test_recorded_with_names_the_device_and_versions(monkeypatch):
    from minimax_lab.viz import msa as vmsa  # the chapter-03 line beside the recorded prefill
    rec = {"device": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "timing_method": "CUDA events per call",
           "reps": 2, "p20_ms": 1385.8, "p80_ms": 1388.1, "dense_cudnn_ms": 36609.4}
    monkeypatch.setattr(vmsa.recorded, "one", lambda *a, **k: rec)
    line = vmsa.recorded_with()
    assert all(x in line for x in ("NVIDIA H200", "torch 2.11.0", "Triton 3.6.0", "2 repeats", "1386-1388 ms",
                                   "measured once"))
    monkeypatch.setattr(vmsa.recorded, "one", lambda *a, **k: None)
    assert vmsa.recorded_with().startswith("no record")
