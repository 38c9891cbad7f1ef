"""Chapter 06's helpers: the check of a block manager built in cells against ``BlockManager``, the
measurements of what prefix caching costs per turn, the GPU timing of the grown decode kernels,
and the sentences and figures drawn from them -- every check able to fail, every comparison word
following the numbers it compares."""
from __future__ import annotations

from collections import deque

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from minimax_lab.engine.slice import agent_session_chunks  # noqa: E402
from minimax_lab.kvcache import BlockManager  # noqa: E402
from minimax_lab.model import TinyMultimodalModel, preset_config  # noqa: E402
from minimax_lab.paged_kv import paged_decode  # noqa: E402
from minimax_lab.viz import block_books, kvcache as vkv, paged_steps, prefix_cost  # noqa: E402

SYSTEM = list(range(100, 124))
USERS = [("allocate", f"user{i}", SYSTEM + [i] * (3 + 5 * i)) for i in range(4)]
FORK = [("fork", "user3", "branch"), ("append", "branch", 7), ("append", "user3", 8), ("free", "user0")]


class Books:
    """A ``BlockManager`` seen through the attributes chapter 06's manager has (``tables``, ``tokens``,
    ``refcount``, ``name``, ``cow_copies``), so it can stand on the learner's side of the check."""

    def __init__(self, mgr: BlockManager):
        self.mgr, self.page_size = mgr, mgr.page_size

    def __getattr__(self, op):          # allocate, append, fork, free
        return getattr(self.mgr, op)

    tables = property(lambda self: {s: q.pages for s, q in self.mgr.seqs.items()})
    tokens = property(lambda self: {s: q.tokens for s, q in self.mgr.seqs.items()})
    refcount = property(lambda self: self.mgr.refcount)
    name = property(lambda self: self.mgr.page_hash)
    cow_copies = property(lambda self: self.mgr.stats["cow_copies"])


def renumbered(num_pages=64, page_size=4, **kw) -> BlockManager:
    """A manager that hands its pages out in reverse order: the same books, other page numbers."""
    mgr = BlockManager(num_pages, page_size, **kw)
    mgr.free_pages = deque(reversed(range(num_pages)))
    return mgr


def test_same_books_holds_up_to_page_numbers_and_catches_each_difference(capsys):
    ours, theirs = Books(renumbered()), BlockManager(64, 4)
    block_books.replay(ours, theirs, USERS + FORK)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(USERS + FORK) and lines[1].startswith("allocate user1 -> 24: same books")
    assert ours.tables["user2"] != theirs.seqs["user2"].pages        # other numbers, same books
    assert "10 shared" in block_books.same_books(ours, theirs)

    with pytest.raises(block_books.BooksDiffer, match="shared differently|two of our pages"):
        block_books.replay(Books(BlockManager(64, 4, prefix_caching=False)), BlockManager(64, 4), USERS[:2])
    class MiscountingBooks(Books):
        def allocate(self, seq, tokens):
            return self.mgr.allocate(seq, tokens) + 1

    with pytest.raises(block_books.BooksDiffer, match="ours returned 1, BlockManager 0"):
        block_books.replay(MiscountingBooks(BlockManager(64, 4)), BlockManager(64, 4), USERS[:1])

    class MisplacingBooks(Books):
        def append(self, seq, token):
            return self.mgr.append(seq, token) + 1

    with pytest.raises(block_books.BooksDiffer, match="append 'user0'"):
        block_books.replay(MisplacingBooks(renumbered()), BlockManager(64, 4), USERS[:1] + [("append", "user0", 5)])
    a, b = Books(BlockManager(64, 4)), BlockManager(64, 4)
    block_books.replay(a, b, USERS[:1])
    a.mgr.seqs["user0"].tokens[-1] = 99
    with pytest.raises(block_books.BooksDiffer, match="other tokens"):
        block_books.same_books(a, b)
    a, b = Books(BlockManager(64, 4)), BlockManager(64, 4)
    block_books.replay(a, b, USERS[:1])
    a.mgr.stats["cow_copies"] = 1
    with pytest.raises(block_books.BooksDiffer, match="copies on write"):
        block_books.same_books(a, b)
    b.free("user0")
    with pytest.raises(block_books.BooksDiffer, match="sequences differ"):
        block_books.same_books(a, b)


def test_page_states_name_pages_as_the_block_manager_does():
    mgr = BlockManager(16, 4)
    for op, seq, *args in USERS[:3]:
        getattr(mgr, op)(seq, *args)
    mgr.free("user1")                     # its own full pages stay cached, the system prompt's shared
    assert block_books.page_states(Books(mgr)) == mgr.page_states()
    assert set(mgr.page_states()) == {"free", "used", "shared", "cached"}


def test_ttft_slope_finds_a_planted_slope_and_its_noise():
    prompts = [1000, 1200, 1400, 1600, 1800]
    slope, two_se = prefix_cost.ttft_slope([5 + 2e-3 * p for p in prompts], prompts)
    assert slope == pytest.approx(2.0) and two_se == pytest.approx(0.0, abs=1e-9)
    noisy = [5 + 2e-3 * p + e for p, e in zip(prompts, (0.3, -0.3, 0.3, -0.3, 0.3))]
    slope, two_se = prefix_cost.ttft_slope(noisy, prompts)
    assert two_se > 0 and abs(slope - 2.0) < two_se
    with pytest.raises(ValueError, match="three or more"):
        prefix_cost.ttft_slope([1.0, 2.0], [1, 2])
    with pytest.raises(ValueError, match="same prompt length"):
        prefix_cost.ttft_slope([1.0, 2.0, 3.0], [5, 5, 5])


RECORDED_SHAPE = dict(turns=12, base_tokens=1024, final_length=1835, page_size=16, d_model=256, n_layers=4)


def test_the_recorded_session_is_rebuilt_with_its_lengths():
    prompts = prefix_cost.prompt_lengths(RECORDED_SHAPE)
    base, tools, new_tokens = prefix_cost.recorded_session(RECORDED_SHAPE)
    assert new_tokens == 8 and prompts[0] == 1024 and len(prompts) == 12
    assert prompts[-1] + new_tokens + len(tools[-1]) == RECORDED_SHAPE["final_length"]
    assert all(b > a for a, b in zip(prompts, prompts[1:]))


def test_bookkeeping_is_timed_per_turn_for_both_variants():
    shape = dict(turns=3, base_tokens=64, final_length=64 + 3 * (4 + 50), page_size=16)
    got = prefix_cost.bookkeeping_ms(shape, repeats=2)
    assert set(got) == set(prefix_cost.VARIANTS) and all(len(v) == 3 for v in got.values())
    assert all(0 < ms < 1e4 for v in got.values() for ms in v)


def test_run_turns_counts_tokens_and_times_the_bookkeeping_inside_ttft():
    cfg = preset_config("cpu")
    torch.manual_seed(0)
    model = TinyMultimodalModel(cfg).eval()
    base, tools = agent_session_chunks(3, vocab_size=cfg.vocab_size, base_tokens=48, turn_tokens=(20, 30))
    per_turn = prefix_cost.run_turns(model, base, tools, new_tokens=2, num_pages=64, repeats=2)
    assert prefix_cost.same_outputs(per_turn)
    cached, plain = per_turn["with prefix caching"], per_turn["without"]
    for rows in (cached, plain):
        assert all(r["computed"] + r["reused"] == r["prompt"] for r in rows)
        assert all(len(r["ttft_ms_runs"]) == 2 and 0 < r["bookkeeping_ms"] < r["ttft_ms"] for r in rows)
    assert cached[0]["reused"] == 0 and all(r["reused"] > 0 for r in cached[1:])
    assert all(r["reused"] == 0 for r in plain)
    ax = prefix_cost.plot_turn_times(per_turn, title="t")
    assert len(ax.patches) == 4 * len(cached) and "median of 2 runs" in ax.get_title()
    plt.close("all")
    assert not hasattr(model, "mgr")


def _rows(ttfts, books):
    return [dict(ttft_ms=t, bookkeeping_ms=b, ttft_ms_runs=[t, t]) for t, b in zip(ttfts, books)]


def test_turn_words_follow_the_numbers():
    faster = {"with prefix caching": _rows([10, 11, 12], [1.0, 1.1, 1.2]), "without": _rows([20, 22, 21], [0.5, 0.5, 0.5])}
    text = prefix_cost.turn_words(faster, "here")
    assert "shortens the time to first token" in text and "adds the host work" in text
    level = {"with prefix caching": _rows([10, 12, 11], [0.5, 0.6, 0.4]), "without": _rows([11, 11, 11], [0.5, 0.5, 0.5])}
    text = prefix_cost.turn_words(level, "here")
    assert "does not measurably change the time" in text and "does not measurably change the host" in text


def rec(impl, ms, step, spread=0.01, **kw):
    return dict(suite=paged_steps.SUITE, case="decode_B8", impl=impl, ms=ms, p20_ms=ms * (1 - spread),
                p80_ms=ms * (1 + spread), step=step, is_step=impl not in paged_steps.OTHERS, device="GPU X",
                torch="2.11", triton="3.6", dtype="bfloat16", when="2026-01-01",
                shape=dict(B=8, L=32768, Hq=32, Hkv=8, page=16), **kw)


def test_steps_words_judge_each_step_against_its_spread():
    recs = [rec("toy", 4.0, 0), rec("tl.dot", 3.0, 1), rec("GQA packing", 1.0, 2), rec("split-K", 0.99, 3),
            rec("package", 0.5, 4), rec("sdpa_contiguous", 0.5, 5)]
    text = paged_steps.steps_words(recs)
    assert "tl.dot is 1.33x faster than toy" in text and "GQA packing is 3.00x faster than tl.dot" in text
    assert "split-K is level with GQA packing" in text and "1.98x slower than the package's kernel" in text
    assert text.startswith("On the GPU X (torch 2.11, Triton 3.6")
    assert "no GPU timing" in paged_steps.steps_words([])
    ax = paged_steps.plot_steps(recs)
    assert len(ax.patches) == len(recs) and ax.get_xscale() == "log"
    plt.close("all")


def test_time_steps_checks_times_and_records_each_step(tmp_path, monkeypatch):
    """On this machine (the interpreter off a GPU), at a tiny case: the harness the chapter runs on a GPU."""
    monkeypatch.setenv("MINIMAX_LAB_RESULTS", str(tmp_path))
    case = dict(B=2, L=24, Hq=4, Hkv=2, D=16, page=8)
    ref = lambda **x: paged_decode(**x, impl="reference")  # noqa: E731
    steps = {"reference": ref, "torch": lambda **x: paged_decode(**x, impl="torch")}
    recs = paged_steps.time_steps(steps, case=case, reps=2, record=True)
    assert [r["impl"] for r in recs] == ["reference", "torch", "package", "gather_sdpa", "sdpa_contiguous"]
    assert all(r["device"] and r["torch"] and r["triton"] and r["p20_ms"] <= r["p80_ms"] for r in recs)
    assert [r["impl"] for r in paged_steps.recorded_steps()] == [r["impl"] for r in recs]
    wrong = {"wrong": lambda **x: ref(**x) + 1.0}
    with pytest.raises(AssertionError, match="wrong"):
        paged_steps.time_steps(wrong, case=case, reps=2)


def engine_recs(cached_per_turn, plain_per_turn):
    def one(case, per_turn, prefill):
        return dict(case=case, impl="engine", ms=sum(per_turn) / len(per_turn), ttft_ms_per_turn=per_turn,
                    prefill_tokens=prefill, cached_tokens=0, shape=RECORDED_SHAPE, device="NVIDIA H200",
                    torch="2.11", triton="3.6")
    return [one("engine_ttft_cached", cached_per_turn, 1781), one("engine_ttft_nocache", plain_per_turn, 16805)]


def test_engine_words_explain_a_slower_cache_from_what_is_measured():
    plain = [8.8 + 0.01 * (i % 3) for i in range(12)]
    slower = engine_recs([p + 1.0 + 0.02 * (i % 2) for i, p in enumerate(plain)], plain)
    book = {"with prefix caching": [1.5] * 12, "without": [1.0] * 12}
    text = vkv.on_a_gpu_words([], slower, bookkeeping=book)
    assert "yet the mean time to first token rose" in text and "not measurably" in text
    assert "costs +0.50 ms ± 0.00 per turn" in text and "of the recorded gap" in text
    rising = [8.0 + 0.004 * n + 0.01 * (i % 2) for i, n in enumerate(prefix_cost.prompt_lengths(RECORDED_SHAPE))]
    text = vkv.on_a_gpu_words([], engine_recs([p + 1.0 + 0.02 * (i % 3) for i, p in enumerate(rising)], rising))
    assert "rose" in text and "(measurably)" in text and "naming" not in text
    faster = engine_recs([p - 4.0 for p in plain], plain)
    text = vkv.on_a_gpu_words([], faster, bookkeeping=book)
    assert "and the mean time to first token fell" in text and "naming" not in text


def test_gpu_figure_adds_the_steps_and_names_the_versions():
    recs = [rec("toy", 4.0, 0), rec("split-K", 1.0, 1), rec("package", 0.5, 2)]
    fig = vkv.on_a_gpu([], engine_recs([9.0] * 12, [8.8] * 12), steps=recs)
    assert len(fig.axes) == 3 and "torch 2.11, Triton 3.6" in fig._suptitle.get_text()
    assert "GPU X, torch 2.11, Triton 3.6" in fig.axes[0].get_title()
    plt.close("all")
    assert len(vkv.on_a_gpu([], engine_recs([9.0] * 12, [8.8] * 12)).axes) == 2
    plt.close("all")


def test_provenance_is_one_collapsed_block_naming_its_sources():
    text = vkv.provenance(preset="cpu", seconds=12.3, trace_path="/somewhere/trace.jsonl")
    assert text.startswith("<details>") and text.endswith("</details>")
    assert "`trace.jsonl`" in text and "/somewhere" not in text and "record_steps=True" in text
