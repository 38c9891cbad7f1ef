"""Chapter 07's pictures, tables and sentences: computed from the numbers they describe, every fault
explained, nothing drawn as a GPU measurement, and the shipped records consistent with the code."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from minimax_lab.engine.store_faults import FAULTS  # noqa: E402
from minimax_lab.kvcache.pool_sim import MODES, mooncake_comparison, simulate_pool  # noqa: E402
from minimax_lab.kvcache.trace import find_trace, read_trace, replay_trace  # noqa: E402
from minimax_lab.viz import kvstore as vks  # noqa: E402


def _row(mode, n, hit, ttft=1.0, load=0.5, compute=1.0):
    return dict(mode=mode, replicas=n, hit_ratio=hit, ttft_mean_s=ttft, load=load, compute_s_mean=compute,
                fetch_s_mean=0.0)


def test_replay_notes_name_lines_that_coincide_and_explain_queueing():
    rows = [_row(m, n, 0.5 if m.startswith("pool") else 0.2 + 0.1 * i, load=2.0 if n == 2 else 0.3)
            for n in (2, 8) for i, m in enumerate(MODES)]
    notes = vks.replay_notes(rows)
    assert any("'shared pool, round-robin' and 'shared pool, priced routing'" in s and "every count" in s for s in notes)
    assert any(s.startswith("each of 2 replicas is asked for 2.0 s") for s in notes)
    assert not any("each of 8" in s for s in notes)


def test_the_mooncake_sentences_carry_the_numbers_they_compare():
    doc = dict(capacity_tokens=3_000_000, ceiling_hit_ratio=0.6,
               rows=[_row("isolated_rr", 1, 0.3) | dict(recomputed_tokens=70),
                     _row("isolated_aware", 10, 0.5, compute=2.0) | dict(recomputed_tokens=50),
                     _row("pool_priced", 10, 0.55, compute=1.0) | dict(recomputed_tokens=45)])
    text = "\n".join(vks.mooncake_words(mooncake_comparison(doc)))
    assert "50.0%" in text and "55.0%" in text and "(1.10x)" in text and "10% fewer" in text and "0.50x" in text
    assert "2.36x" in text and "0.52x" in text and "Fig. 10" in text and "Fig. 9" in text
    assert "1.92x more than Mooncake's" in text                      # 0.50 / 0.26


def test_the_recorded_replay_is_what_the_code_computes_at_equal_memory():
    doc = vks.recorded("kvstore_replay")
    assert doc is not None and "equal" in doc["memory"]
    trace = read_trace(find_trace())
    for mode in ("isolated_aware", "pool_priced"):
        rec = next(r for r in doc["rows"] if r["replicas"] == 10 and r["mode"] == mode)
        fresh = simulate_pool(trace, replicas=10, mode=mode, capacity_tokens=doc["capacity_tokens"]).as_dict()
        assert fresh["recomputed_tokens"] == rec["recomputed_tokens"] and fresh["capacity_tokens"] == 3_000_000


def test_the_recorded_policy_gap_is_what_the_code_computes():
    doc = vks.recorded("kvstore_policy_gap")
    assert doc is not None and doc["chosen"] == "conversation"
    row = next(r for r in doc["traces"]["synthetic"]["rows"] if r["capacity_tokens"] == 10_000_000)
    trace = read_trace(find_trace())
    for policy in ("lru", "conversation"):
        assert replay_trace(trace, capacity_tokens=10_000_000, policy=policy).hit_ratio == pytest.approx(
            row["hit"][policy], abs=1e-12)
    for d in doc["traces"].values():
        for r in d["rows"]:
            assert r["hit"]["lru"] <= r["hit"]["belady"] + 1e-12 and r["hit"]["knows_whether"] <= r["hit"]["belady"] + 1e-12


def test_every_fault_is_explained_in_words():
    rows = [dict(fault=f, trials=3, equal=3, wrong=0, crashed=0, fetched=1, recomputed=2) for f in FAULTS]
    table = vks.fault_table(rows, "recorded, 3 trials each")
    assert set(vks.FAULT_WORDS) == set(FAULTS)
    assert "recorded, 3 trials each" in table and not any(f in table for f in FAULTS)   # no bare identifiers
    assert table.count("\n| ") == len(FAULTS) + 2          # header, rule, one row per fault


def test_gap_summary_reports_without_project_targets():
    rows = [dict(capacity_tokens=100, gap_closed=dict(lru=0.0, lfu=-0.2, adaptive=0.3, belady=1.0)),
            dict(capacity_tokens=200, gap_closed=dict(lru=0.0, lfu=0.6, adaptive=0.1, belady=1.0))]
    text = vks.gap_summary(rows, "trace")
    assert "half" not in text and "adaptive is the best at 1 of 2" in text
    assert "lfu at 100 tokens, closes -20%: worse than LRU" in text


def _gap_row(cap, **hit):
    gap = hit["belady"] - hit["lru"]
    return dict(capacity_tokens=cap, hit=hit, gap_closed={k: (v - hit["lru"]) / gap for k, v in hit.items()})


def test_policy_words_give_hit_ratios_beside_shares_and_say_where_it_loses():
    rows = [_gap_row(1_000_000, lru=0.10, lfu=0.20, conversation=0.15, learned=0.16, knows_whether=0.25, belady=0.30),
            _gap_row(3_000_000, lru=0.40, lfu=0.30, conversation=0.38, learned=0.38, knows_whether=0.45, belady=0.50)]
    doc = dict(policies=["lru", "lfu", "conversation", "learned", "knows_whether", "belady"],
               traces=dict(synthetic=dict(rows=rows, learned=dict(auc=0.71),
                                          savings=[dict(capacity_tokens=1_000_000, lru_hit=0.1, needed_tokens=6e5,
                                                        saved=0.4),
                                                   dict(capacity_tokens=3_000_000, lru_hit=0.4, needed_tokens=None,
                                                        saved=None)])))
    text = "\n".join(vks.policy_words(doc))
    assert "1M: 15.0% (LRU 10.0%, Belady 30.0%; 25% of the gap)" in text
    assert "lfu keeps more at 1M (20.0%)" in text and "below LRU at 3M" in text
    assert "closes 1M 75%, 3M 50% of the gap" in text and "AUC 0.71" in text and "1M +1.0 points" in text
    table = vks.gap_table(rows, "t", ["lru", "conversation", "belady"])
    assert "| 1,000,000 | 10.0% (0%) | 15.0% (25%) | 30.0% (100%) |" in table
    savings = vks.savings_table(doc)
    assert "| 1M | 10.0% | 0.60M | 40% |" in savings and "more than the capacity | - |" in savings


def test_tier_words_judge_every_cell_against_the_faster_raw_path():
    row = dict(block_bytes=1 << 20, batch=16, pack_keyed_mibps=2000, pack_checksum_mibps=9000, check_keyed_mibps=1900,
               check_checksum_mibps=8000)
    for p, put, get in (("raw_bytes", 600, 800), ("raw_zero_copy", 650, 900), ("tier_keyed", 560, 700),
                        ("tier_checksum", 600, 850)):
        row |= {f"{p}_put_mibps": put, f"{p}_get_mibps": get}
    for p in ("tier_keyed", "tier_checksum"):
        for op in ("put", "get"):
            row[f"{p}_{op}_vs_raw"] = max(row[f"raw_bytes_{op}_mibps"], row[f"raw_zero_copy_{op}_mibps"]) / \
                row[f"{p}_{op}_mibps"]
    doc = dict(tier=[row])
    text = "\n".join(vks.tier_words(doc))
    assert "signed with the pool's secret: 1 of 2 cells within 1.25x" in text and "gets of 1 MiB blocks at 1.29x" in text
    assert "checksummed only: 2 of 2 cells" in text and "2,000 MiB/s signed" in text
    assert "| 1 MiB x16 | get | 800 | 900 | 700 | 850 | 1.29x | 1.06x |" in vks.tier_table(doc)


def test_the_measured_replay_table_has_a_cell_per_mode_and_count():
    rows = [_row(m, n, 0.5) | dict(fetched_tokens=10, input_tokens=100) for n in (1, 4) for m in MODES]
    table = vks.measured_replay_table(dict(measured=dict(rows=rows)))
    assert table.count("\n") == 3 and "| 4 | 50.0% kept, 10.0% fetched, TTFT 1.0 s |" in table


def test_without_a_store_the_status_says_why_and_what_is_skipped():
    line = vks.store_status(None, "Mooncake Store cannot start: test", [])
    assert line.startswith("Mooncake Store cannot start: test") and "skipped" in line
    assert line.count("Mooncake Store") == 1


def test_bandwidth_words_name_the_gpu_a_model_and_use_the_typical_rate():
    doc = vks.recorded("kvstore_bandwidth")
    text = "\n".join(vks.bandwidth_words(doc))
    assert "modelled H200" in text and "not measured" in text
    assert f"median {doc['break_even'][0]['link_gbps']:.2f} GB/s" in text
    assert "0.020 GB/s" in text or "fetching wins above" in text


@pytest.mark.parametrize("draw", ["pool", "replay", "bandwidth"])
def test_the_figures_draw(draw):
    if draw == "pool":
        fig = vks.draw_pool()
        assert any("master" in t.get_text() for t in fig.axes[0].texts)
    elif draw == "replay":
        rows = [_row(m, n, 0.3, load=1.5 if n == 1 else 0.2) for n in (1, 10) for m in MODES]
        fig = vks.plot_replay(rows, "t", ceiling=0.6)
        assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1", "10"]
    else:
        fig = vks.plot_bandwidth(vks.recorded("kvstore_bandwidth"))
        assert "recorded" in fig._suptitle.get_text()
    plt.close(fig)
