"""What the two MSA chapters (03 the idea, 04 the kernels) compute behind the scenes: the chapter
helpers say what the records and inputs hold, their comparison words follow their numbers (and
say plainly what is not recorded), and the Triton exercises refuse PyTorch answers and explain
wrong kernels in the learner's terms."""
from __future__ import annotations

import math
from types import SimpleNamespace

import matplotlib
import pytest
import torch

from tests.support.devices import fresh_seed

import triton  # noqa: E402 (after tests.support.devices: the interpreter is decided first)
import triton.language as tl  # noqa: E402
from minimax_lab import exercises
from minimax_lab.attention import MSA_SHAPE_CPU, msa_select
from minimax_lab.exercises.solutions import ch03 as sol03
from minimax_lab.exercises.solutions import ch04 as sol04
from minimax_lab.model import load_pretrained
from minimax_lab.model import msa_indexer as mi
from minimax_lab.model.needle import answer_probs, needle_batch
from minimax_lab.notebook import recorded
from minimax_lab.viz import msa as vmsa, msa_kernels as vmk, msa_records
from minimax_lab.viz import noise

matplotlib.use("Agg")


# --------------------------------------------------------------------------- chapter helpers


def test_key_table_orders_by_score_then_lower_block():
    table = vmk.key_table(scores=[0.75, -0.5, 0.75, -1.0, 2.0, -0.0, 0.0], block_ids=[3, 5, 7, 8, 9, 2, 4])
    order = table.splitlines()[-1]
    assert order.index("block 9") < order.index("block 3") < order.index("block 7") < order.index("block 2") \
        < order.index("block 4") < order.index("block 5") < order.index("block 8")


def test_kernel_inputs_repeat_and_make_selection_rank():
    a, b = vmk.kernel_inputs("cpu", seed=3), vmk.kernel_inputs("cpu", seed=3)
    assert torch.equal(a.q, b.q) and torch.equal(a.k_idx, b.k_idx)
    assert not torch.equal(a.q, vmk.kernel_inputs("cpu", seed=4).q)
    assert (a.Hq, a.G, a.Bk, a.topk) == (MSA_SHAPE_CPU["Hq"], MSA_SHAPE_CPU["G"], MSA_SHAPE_CPU["Bk"], MSA_SHAPE_CPU["topk"])
    assert a.S % a.Bk and a.n_blocks > a.topk  # a ragged last block; more blocks than topk
    sel = msa_select(a.q_idx, a.k_idx, block_size=a.Bk, topk=a.topk, impl="torch")
    window = torch.arange(a.n_blocks - a.topk, a.n_blocks)
    assert not (sel[:, -1, :, : a.topk - 1].sort(-1).values == window[:-1]).all()  # not just the window
    assert "see more than topk blocks" in a.describe()


def test_paged_cache_puts_each_block_on_its_page():
    g = torch.Generator().manual_seed(fresh_seed())
    B, S, Bk = 2, 37, 16
    x = torch.randn(B, S, 3, generator=g)
    n_pages = math.ceil(S / Bk)
    table = torch.randperm(B * n_pages, generator=g).view(B, n_pages)
    cache = vmk.paged_cache(x, table, Bk)
    for b in range(B):
        for p in range(n_pages):
            got = cache[table[b, p]][: min(Bk, S - p * Bk)]
            assert torch.equal(got, x[b, p * Bk:(p + 1) * Bk])


def test_gpu_lines_are_the_records_in_computed_words():
    ours = recorded.one("msa", "prefill_s131072", "triton_kv")
    cudnn = recorded.one("msa", "prefill_s131072", "sdpa_cudnn")
    if not (ours and cudnn):
        pytest.skip("no shipped H200 prefill records")
    text = msa_records.gpu_summary()
    assert noise.speed_words(ours, cudnn) in text and f"{ours['ms']:.1f} ms" in text
    assert f"torch {ours['torch']}, Triton {ours['triton']}" in text  # recorded numbers name their versions
    assert text.count(".\n") + 1 <= 3  # at most three sentences beside the figure
    floor = msa_records.kv_outer_floor()
    sparse = recorded.one("msa", "sparse_attn_s131072", "triton_kv")
    assert f"{sparse['ms']:.1f} ms" in floor
    fig = msa_records.prefill_figure()
    assert ours["device"] in fig.axes[0].get_title() and "p20-p80" in fig.axes[0].get_title()
    assert all(len(c) == 3 for c in fig.axes[0].containers)  # every line drawn with error bars
    assert "recorded on an NVIDIA H200" in vmsa.why_sparse()


def test_index_growth_reads_the_ratios_from_the_records():
    idx = [recorded.one("msa", f"index_s{S}", "triton_fused_topk") for S in (32768, 65536, 131072)]
    if not all(idx):
        pytest.skip("no shipped index records")
    text = msa_records.index_growth()
    assert f"{idx[2]['ms'] / idx[1]['ms']:.1f}x" in text and "S = 131,072" in text  # FLOPs equal at MSA's shape


def _backward(S, impl, ms, device="NVIDIA H100 80GB HBM3"):
    return {"suite": "msa", "case": f"backward_s{S}", "impl": impl, "ms": ms, "p20_ms": ms * 0.99, "p80_ms": ms * 1.01,
            "device": device, "torch": "2.11.0", "triton": "3.6.0", "interpreter": False,
            "shape": {"S": S, "Hq": 64, "G": 4, "D": 128, "Bk": 128, "topk": 16}}


def test_backward_lines_say_which_lengths_have_no_record(monkeypatch):
    monkeypatch.setattr(msa_records, "backward_records", lambda: {})
    assert msa_records.backward_figure() is None
    assert "32k, 64k, 128k tokens" in msa_records.backward_summary() and msa_records.BACKWARD_COMMAND in \
        msa_records.backward_summary()
    rows = {"triton_fwd_bwd": [_backward(131072, "triton_fwd_bwd", 300.0)],
            "sdpa_cudnn": [_backward(131072, "sdpa_cudnn", 1800.0)], "sdpa_flash": [_backward(131072, "sdpa_flash", 3000.0)]}
    monkeypatch.setattr(msa_records, "backward_records", lambda: rows)
    text = msa_records.backward_summary()
    assert "6.00x faster than dense cuDNN (1800.0 ms)" in text and "NVIDIA H100 80GB HBM3 (torch 2.11.0" in text
    assert text.splitlines()[-1].startswith("No GPU record of MSA's backward at 32k, 64k tokens")
    rows["sdpa_cudnn"] = [_backward(131072, "sdpa_cudnn", 301.0)]  # inside the spreads: no word of speed
    assert "level with dense cuDNN" in msa_records.backward_summary()
    fig = msa_records.gpu_figure()
    assert len(fig.axes) == 2 and "H100" in fig.axes[1].get_title()


def test_training_words_draw_no_comparison_from_a_few_steps():
    runs = lambda accs, losses: SimpleNamespace(  # noqa: E731
        runs={k: dict(loss=losses[i], acc=accs[i], seconds=1.0)
              for i, k in enumerate((vmk.DENSE, vmk.MSA_TORCH, vmk.MSA_TRITON))},
        steps=len(losses[0]), batch_size=2, n_held_out=500)
    short = vmk.training_words(runs([0.1, 0.2, 0.2], [[5.0, 4.9]] * 3))
    assert "equal in every bit at each of the 2 steps" in short and "no comparison is drawn" in short
    assert "ahead" not in short and "behind" not in short
    long = vmk.training_words(runs([0.3, 0.6, 0.61], [[5.0] * 150, [4.0] * 150, [4.0] * 149 + [4.001]]))
    assert "differ by at most 1.0e-03" in long
    assert f"against {vmk.MSA_TORCH}: level" in long and f"against {vmk.DENSE}: ahead" in long
    fig = vmk.training_figure(runs([0.1, 0.2, 0.2], [[5.0, 4.9]] * 3))
    assert len(fig.axes[1].containers[0]) == 3  # one bar per model, with its two standard errors


def test_random_teacher_puts_its_mass_on_visible_blocks():
    t = vmk.random_teacher(2, 37, 3, 16, generator=torch.Generator().manual_seed(fresh_seed()))
    assert t.shape == (2, 37, 3, 3)
    torch.testing.assert_close(t.sum(-1), torch.ones(2, 37, 3, dtype=torch.float64))
    visible = torch.arange(3) <= torch.arange(37)[:, None] // 16
    by_block = t.transpose(2, 3)  # [B, S, n_blocks, G]
    assert (by_block[:, ~visible] == 0).all() and (by_block[:, visible] > 0).all()


def test_tile_rows_counts_the_useful_rows():
    lines = vmk.tile_rows(vmk.kernel_inputs("cpu", seed=0)).splitlines()
    assert lines[0] == "here: Hq/G = 2 query heads per group -> a 16-row tile, 2 of them useful, per selected block loaded"
    assert lines[1].startswith("MSA's shape: Hq/G = 16 query heads per group -> a 16-row tile")


def test_inverted_index_figure_draws():
    a = vmk.kernel_inputs("cpu", seed=0)
    sel = msa_select(a.q_idx, a.k_idx, block_size=a.Bk, topk=a.topk, impl="torch")[0, :, 0]
    fig = vmk.inverted_index_figure(sel, block_size=a.Bk, block=1)
    bars = [p.get_height() for p in fig.axes[1].patches]
    assert bars == torch.bincount(sel[sel >= 0].long(), minlength=a.n_blocks).tolist()


# --------------------------------------------------------------------------- the Triton exercises


def test_pytorch_answers_to_triton_exercises_are_refused():
    assert exercises.verdict("03.3", sol03.block_mass_torch).problems == [exercises.NO_TRITON]
    assert exercises.verdict("04.3", sol04.merge_partials_torch).problems == [exercises.NO_TRITON]
    assert all(exercises.get(k).writes_triton for k in ("03.3", "04.3"))


@triton.jit
def _mass_without_causal_mask(Q, K, Lse, Out, S, n_blocks, scale, D: tl.constexpr, BLOCK_M: tl.constexpr,
                              BK: tl.constexpr):
    pid_m, j = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    keys = j * BK + tl.arange(0, BK)
    d = tl.arange(0, D)
    q = tl.load(Q + rows[:, None] * D + d[None, :], mask=rows[:, None] < S, other=0.0)
    k = tl.load(K + keys[:, None] * D + d[None, :], mask=keys[:, None] < S, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    lse = tl.load(Lse + rows, mask=rows < S, other=0.0)
    p = tl.where(keys[None, :] < S, tl.exp(s - lse[:, None]), 0.0)  # the mistake: no keys <= rows
    tl.store(Out + rows * n_blocks + j, tl.sum(p, axis=1), mask=rows < S)


def test_block_mass_checker_names_the_missing_causal_mask():
    def block_mass(q, k, lse, block_size):
        S, D = q.shape
        nb = triton.cdiv(S, block_size)
        out = torch.empty(S, nb)
        _mass_without_causal_mask[(triton.cdiv(S, 16), nb)](q.contiguous(), k.contiguous(), lse, out, S, nb,
                                                             1 / math.sqrt(D), D=D, BLOCK_M=16, BK=block_size)
        return out

    problems = exercises.verdict("03.3", block_mass).problems
    assert problems and any("not visible" in p for p in problems), problems


@triton.jit
def _merge_without_max(Po, Plse, Out, R, TOPK: tl.constexpr, TOPK_P: tl.constexpr, D: tl.constexpr,
                       BLOCK_R: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    slots = tl.arange(0, TOPK_P)
    d = tl.arange(0, D)
    ok = (rows[:, None] < R) & (slots[None, :] < TOPK)
    w = tl.exp(tl.load(Plse + rows[:, None] * TOPK + slots[None, :], mask=ok, other=float("-inf")))  # the mistake
    w = w / tl.sum(w, axis=1)[:, None]
    acc = tl.zeros([BLOCK_R, D], tl.float32)
    for s in range(TOPK):
        w_s = tl.sum(tl.where(slots[None, :] == s, w, 0.0), axis=1)
        acc += w_s[:, None] * tl.load(Po + (rows[:, None] * TOPK + s) * D + d[None, :], mask=rows[:, None] < R,
                                      other=0.0)
    tl.store(Out + rows[:, None] * D + d[None, :], acc, mask=rows[:, None] < R)


def test_merge_checker_explains_empty_rows_and_overflow():
    def merge_partials(po, plse):
        R, topk, D = po.shape
        out = torch.empty(R, D)
        _merge_without_max[(triton.cdiv(R, 16),)](po.contiguous(), plse.contiguous(), out, R, TOPK=topk,
                                                  TOPK_P=triton.next_power_of_2(topk), D=D, BLOCK_R=16)
        return out

    problems = exercises.verdict("04.3", merge_partials).problems
    assert problems and any("no partial" in p or "overflows" in p for p in problems), problems


def test_split_runs_checker_names_the_list_it_cuts_wrongly():
    def one_run_per_list(counts, max_run):  # forgets to cut long lists
        keep = counts > 0
        ids = torch.arange(len(counts))[keep]
        starts = (torch.cumsum(counts, 0) - counts)[keep]
        return ids.int(), starts.int(), counts[keep].int()

    problems = exercises.verdict("04.2", one_run_per_list).problems
    assert problems and "should be cut into runs" in problems[0], problems


def test_answer_probs_is_the_row_of_the_full_probabilities():
    """The needle mass reads one row per document: the same numbers as the mode's full [S, S] matrix."""
    model, cfg = load_pretrained(use_indexer=True)
    mi.init_indexer(model, seed=fresh_seed())
    batch = needle_batch(6, 3, seed=fresh_seed())
    rows = torch.arange(3)
    for mode in ("dense", "msa", "window", "oracle"):
        r = mi.run_layers(model, batch["tokens"], batch["images"], mode=mode, keep=("probs",))
        for layer in r["layers"]:
            got = answer_probs(layer["q"], layer["k"], batch["answer_pos"], layer["selected"], cfg.msa_block_size)
            torch.testing.assert_close(got, layer["probs"][rows, :, batch["answer_pos"]], rtol=1e-5, atol=1e-6)


def test_recall_by_length_is_the_package_recall_with_a_paired_gap_to_the_window():
    model, _ = load_pretrained(use_indexer=True)
    mi.init_indexer(model, seed=0)
    ours = vmsa.recall_by_length(model, (8,), n_docs=3)
    pkg = mi.recall_vs_length(model, (8,), n_docs=3)
    for name in ("msa", "window", "oracle"):
        assert ours[name][0] == pytest.approx(pkg[name][0], abs=1e-6)   # per document, then the mean: the same
    mean, se2 = ours["gap"][0]
    assert mean == pytest.approx(ours["msa"][0] - ours["window"][0], abs=1e-6) and se2 > 0
    row = vmsa.recall_length_table(ours).splitlines()[1]
    verdict = "indexer ahead" if mean > se2 else "window ahead" if -mean > se2 else "level"
    assert row.endswith(f"{mean:+.3f} ± {se2:.3f}: {verdict}")
