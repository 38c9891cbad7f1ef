"""The pictures and sentences of chapters 05 and 06: every comparison word follows the numbers it
compares (whichever way they point), nothing is claimed where nothing was recorded, and each figure
draws the panels it promises."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from minimax_lab.kvcache.cost import MINIMAX_M2, break_even  # noqa: E402
from minimax_lab.model.config import tiny_model_shape  # noqa: E402
from minimax_lab.model import preset_config  # noqa: E402
from minimax_lab.moe import align_tokens, experts_triton  # noqa: E402
from minimax_lab.viz import kvcache as vkv  # noqa: E402
from minimax_lab.viz import moe as vmoe  # noqa: E402
from minimax_lab.viz import tuner as vtuner  # noqa: E402
from minimax_lab.viz.excerpt import excerpt  # noqa: E402


def moe_rec(E, T, impl, ms, *, fp8=False, pct=50.0, spread=0.01):
    case = ("fp8_" if fp8 else "") + f"E{E}_k8_d64_f32_T{T}"
    return {"suite": "moe", "case": case, "impl": impl, "ms": ms, "shape": {"E": E, "d": 64, "f": 32, "k": 8, "T": T},
            "ceiling": "copy" if T <= 256 else "gemm", "pct_of_ceiling": pct, "gbps": 1.0, "tflops": 1.0,
            "p20_ms": ms * (1 - spread), "p80_ms": ms * (1 + spread)}


def moe_records(fp8_eager_ms, fp8_graph_ms):
    recs = []
    for E in (128, 256):
        for T in (64, 16384):
            recs += [moe_rec(E, T, "triton", 1.0), moe_rec(E, T, "torch_grouped_mm", 2.0),
                     moe_rec(E, T, "sglang_triton", 1.0)]
        recs += [moe_rec(E, 64, "triton_cudagraph", 0.5, pct=90.0), moe_rec(E, 64, "torch_grouped_mm_cudagraph", 1.5)]
    recs += [moe_rec(128, 64, "triton_fp8", fp8_eager_ms, fp8=True), moe_rec(128, 64, "triton_bf16", 0.3, fp8=True),
             moe_rec(128, 64, "triton_fp8_cudagraph", fp8_graph_ms, fp8=True),
             moe_rec(128, 64, "triton_bf16_cudagraph", 0.3, fp8=True),
             moe_rec(128, 16384, "triton_fp8", 2.0, fp8=True), moe_rec(128, 16384, "triton_bf16", 2.0, fp8=True)]
    return recs


def test_moe_gpu_words_follow_the_records_either_way():
    slower = vmoe.on_a_gpu_words(moe_records(fp8_eager_ms=0.45, fp8_graph_ms=0.15))
    assert "3.00x faster than `torch._grouped_mm`" in slower          # graph replay at T=64: 0.5 vs 1.5
    assert "2.00x faster than bf16 at T = 64 under graph replay" in slower
    assert "1.50x slower than bf16 at T = 64 launched eagerly" in slower
    assert "level with bf16 at T = 16,384" in slower and "spreads of the two timings do not overlap" in slower
    assert "90% (E=128) and 90% (E=256)" in slower and "past 100%" not in slower
    past = vmoe.on_a_gpu_words([{**r, "pct_of_ceiling": 102.0} if r["impl"] == "triton_cudagraph" else r
                                for r in moe_records(0.45, 0.15)])
    assert "102% (E=128)" in past and "past 100%: the ceiling is a copy" in past
    faster = vmoe.on_a_gpu_words(moe_records(fp8_eager_ms=0.15, fp8_graph_ms=0.6))
    assert "2.00x faster than bf16 at T = 64 launched eagerly" in faster and "2.00x slower than bf16 at T = 64" in faster


def test_moe_gpu_words_and_figure_without_records():
    assert "No H200 records" in vmoe.on_a_gpu_words([])
    with pytest.raises(ValueError, match="no 'moe' records"):
        vmoe.on_a_gpu([])


def test_moe_gpu_figure_has_decode_prefill_and_fp8_panels():
    fig = vmoe.on_a_gpu(moe_records(0.45, 0.15), measured=[moe_rec(128, 64, "triton_cudagraph", 0.6, pct=80.0)],
                        device_now="a test GPU")
    titles = [ax.get_title() for ax in fig.axes]
    assert any("decode" in t and "CUDA graphs" in t for t in titles)
    assert any("prefill" in t for t in titles) and any("FP8" in t for t in titles)
    stars = [line for line in fig.axes[0].lines if line.get_marker() == "*"]
    assert len(stars) == 1 and list(stars[0].get_ydata()) == [80.0]
    plt.close("all")


def test_tuner_words_name_the_pick_and_compare_it_with_pointer_loads():
    base = "BLOCK_M=128,BLOCK_N=64,BLOCK_K=64,num_warps=8,num_stages=3,DOWN_BLOCK_N=128,DOWN_BLOCK_K=64"
    timings = {base: {"a": 2.0, "b": 2.0}, base + ",USE_TMA=True": {"a": 1.0, "b": 1.0}}
    text = vtuner.tuner_words(timings, base + ",USE_TMA=True")
    assert "weights through TMA" in text and "2.00x slower than it" in text and "timed twice" not in text
    assert "pointer loads" in vtuner.tuner_words(timings, base) and "slower" not in vtuner.tuner_words(timings, base)
    # the same config named two ways (a default spelled out) is one config timed twice: the tuner's noise
    twice = {**timings, base + ",SWAP_AB=False,DOWN_SWAP_AB=False": {"a": 2.2, "b": 2.2}}
    said = vtuner.tuner_words(twice, base + ",USE_TMA=True")
    assert "came out 10.0% apart, so that gap is larger than its noise" in said
    assert "no other candidate lies within it of the pick" in said
    near = {**twice, base + ",USE_TMA=True,GROUP_M=8": {"a": 1.05, "b": 1.05}}
    assert "1 other candidate lies within it of the pick: among those the pick is a toss-up" in \
        vtuner.tuner_words(near, base + ",USE_TMA=True")


def test_tuner_figure_draws_one_bar_per_config_from_zero():
    base = "BLOCK_M=128,BLOCK_N=64,BLOCK_K=64,num_warps=8,num_stages=3,DOWN_BLOCK_N=128,DOWN_BLOCK_K=64"
    timings = {base: {"a": 2.0}, base + ",SWAP_AB=False,DOWN_SWAP_AB=False": {"a": 2.2},
               base + ",USE_TMA=True": {"a": 1.0}}
    fig = vtuner.tuner_candidates(timings, base + ",USE_TMA=True")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == len(set(labels)) == 2 and any("(timed twice)" in lbl for lbl in labels)
    widths = sorted(round(p.get_width(), 6) for p in ax.patches)
    assert widths == [0.0, 110.0] and ax.get_xlim()[0] <= 0    # % above the fastest, from a true zero
    assert "10.0% apart" in ax.get_title()
    plt.close("all")


def test_balance_and_modality_words_compute_what_they_say():
    loads = lambda *rows: torch.tensor(rows)  # noqa: E731
    runs = {"off": {"loads": [loads([9, 1], [9, 1])]}, "on": {"loads": [loads([5, 5], [6, 4])]}}
    text = vmoe.balance_words(runs, last=2)
    assert "off: busiest expert / mean load over the last 2 steps (the curves' last points), per layer: 1.80" in text
    assert "layer 0 fell from 1.8 to 1.1 (0.61x)" in text
    shares = [(torch.tensor([0.5, 0.25, 0.25]), torch.tensor([0.1, 0.45, 0.45]))]
    assert "expert 0 takes 50% of the image-patch slots" in vmoe.modality_words(shares, top_k=2)
    assert "100% of the patches pick it" in vmoe.modality_words(shares, top_k=2)
    assert "5.00x larger than its text share (10%)" in vmoe.modality_words(shares, top_k=2)


def test_idea_and_balance_figures_draw():
    weights, ids = torch.tensor([[0.6, 0.4], [0.7, 0.3]]), torch.tensor([[0, 2], [2, 1]])
    fig = vmoe.idea_figure(weights, ids, align_tokens(ids, 3, 2), block_m=2)
    assert len(fig.axes) == 2
    runs = {"a": {"loads": [torch.randint(0, 9, (5, 4))] * 2}, "b": {"loads": [torch.randint(0, 9, (5, 4))] * 2}}
    assert vmoe.balance_figure(runs, window=2) is not None
    plt.close("all")


def test_excerpt_shows_the_lines_it_names():
    part = excerpt(experts_triton._gate_up_kernel, "if USE_TMA:", 3)
    assert part.text.splitlines()[0].strip().startswith("if USE_TMA:") and len(part.text.splitlines()) == 3
    assert part.last == part.first + 2 and f"#L{part.first}-L{part.last}" in part.url
    with pytest.raises(ValueError, match="no line"):
        excerpt(experts_triton._gate_up_kernel, "this text is in no kernel", 3)


def kv_records(cached_ms, plain_ms):
    decode = []
    for case in ("decode_B8_L32768_Hq32_Hkv8_D128_p16", "decode_B64_L8192_Hq32_Hkv8_D128_p16"):
        decode += [dict(case=case, impl="triton", ms=1.0, gbps=4000.0, pct_of_ceiling=95.0),
                   dict(case=case, impl="gather_sdpa", ms=3.3, gbps=1200.0, pct_of_ceiling=30.0),
                   dict(case=case, impl="sdpa_contiguous", ms=0.98, gbps=4100.0, pct_of_ceiling=97.0)]
    shape = dict(turns=12, d_model=256, n_layers=4)
    engine = [dict(case="engine_ttft_cached", impl="engine", ms=cached_ms, prefill_tokens=1781, cached_tokens=15024,
                   ttft_ms_per_turn=[cached_ms] * 3, shape=shape),
              dict(case="engine_ttft_nocache", impl="engine", ms=plain_ms, prefill_tokens=16805, cached_tokens=0,
                   ttft_ms_per_turn=[plain_ms] * 3, shape=shape)]
    return decode, engine


def test_kvcache_gpu_words_say_what_the_engine_records_say():
    text = vkv.on_a_gpu_words(*kv_records(cached_ms=9.87, plain_ms=8.84))
    assert "yet the mean time to first token rose from 8.84 ms to 9.87 ms (1.12x), by +1.03 ms ± 0.00" in text
    assert "9.44x fewer than without" in text and "hardly" not in text
    assert "3.30x faster than gathering the pages" in text and "about as fast as SDPA" in text
    faster = vkv.on_a_gpu_words(*kv_records(cached_ms=4.0, plain_ms=8.84))
    assert "and the mean time to first token fell from 8.84 ms to 4 ms" in faster and "not spent" not in faster
    assert "No H200 records" in vkv.on_a_gpu_words([], [])
    decode, engine = kv_records(cached_ms=9.0, plain_ms=8.84)
    engine[0]["ttft_ms_per_turn"], engine[1]["ttft_ms_per_turn"] = [9.5, 8.5, 9.0], [8.84, 8.84, 8.84]
    noisy = vkv.on_a_gpu_words(decode, engine)
    assert "did not measurably move (8.84 ms -> 9 ms)" in noisy and "two standard errors over 3 turns" in noisy


def test_speed_ranges_point_the_way_the_ratios_do():
    assert vkv._speed_range([(1.0, 3.25), (1.0, 3.36)]) == "3.25-3.36x faster than"
    assert vkv._speed_range([(1.03, 1.0), (1.05, 1.0)]) == "1.03-1.05x slower than"
    assert vkv._speed_range([(1.0, 1.01), (1.0, 0.99)]) == "about as fast as"
    assert vkv._speed_range([(1.0, 2.0), (2.0, 1.0)]) == "between 2.00x slower and 2.00x faster than"


def test_kvcache_gpu_figure_and_fetch_words():
    now = [dict(case="decode_B8_L32768_Hq32_Hkv8_D128_p16", impl="triton", ms=1.1, gbps=3000.0)]
    fig = vkv.on_a_gpu(*kv_records(9.87, 8.84), measured_decode=now, measured_turns={"with prefix caching": [1.0, 2.0]},
                       device_now="x")
    assert len(fig.axes) == 2 and len(fig.axes[1].lines) == 3
    stars = [line for line in fig.axes[0].lines if line.get_marker() == "*"]
    assert len(stars) == 1 and list(stars[0].get_ydata()) == [3000.0]
    plt.close("all")


def test_fetch_or_recompute_says_where_fetching_wins_and_whose_rates_it_used():
    cfg = preset_config("cpu")
    tiny = tiny_model_shape(cfg)
    even = vkv.break_even_context(tiny, link_gbps=55.0, gpu_tflops=800.0)
    at = break_even(tiny, link_gbps=55.0, gpu_tflops=800.0, context=round(even))["ratio"]
    assert even > cfg.max_seq_len and at == pytest.approx(1.0, abs=1e-3)       # fetch and recompute cost the same there
    assert vkv.break_even_context(MINIMAX_M2, link_gbps=55.0, gpu_tflops=800.0) == 0.0
    text = vkv.fetch_or_recompute([(tiny, (1024, cfg.max_seq_len), cfg.max_seq_len), (MINIMAX_M2, (1024,), None)])
    assert f"beyond the {cfg.max_seq_len:,} tokens this model can hold: for it recomputing always wins" in text
    assert "MiniMax-M2" in text and "fetching wins at every context" in text
    assert "recorded on the NVIDIA H200" in text and "nothing here is measured on this machine" in text
