"""Chapter 07's pictures, tables and sentences: computed from the numbers they describe, comparisons
judged against their spread (a choice that flips inside it is a tie), every fault explained, nothing
drawn as a GPU measurement, and the shipped records consistent with the code."""
import os
from dataclasses import replace
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from minimax_lab.engine.store_faults import FAULTS  # noqa: E402
from minimax_lab.kvcache.cost import M3_LAYER, PrefillCost  # noqa: E402
from minimax_lab.kvcache.pool_sim import MODES, mooncake_comparison, simulate_pool  # noqa: E402
from minimax_lab.kvcache.trace import find_trace, read_trace, replay_trace  # noqa: E402
from minimax_lab.model.config import preset_config  # noqa: E402
from minimax_lab.viz import kvstore as vks, kvstore_eviction as vev, kvstore_scale as vsc  # noqa: E402


def _row(mode, n, hit, ttft=1.0, load=0.5, compute=1.0):
    return dict(mode=mode, replicas=n, hit_ratio=hit, ttft_mean_s=ttft, load=load, compute_s_mean=compute,
                fetch_s_mean=0.0)


# --------------------------------------------------------------------------- at scale


def test_replay_notes_name_lines_that_coincide_and_explain_queueing():
    rows = [_row(m, n, 0.5 if m.startswith("pool") else 0.2 + 0.1 * i, load=2.0 if n == 2 else 0.3)
            for n in (2, 8) for i, m in enumerate(MODES)]
    notes = vsc.replay_notes(rows)
    assert any("'shared pool, round-robin' and 'shared pool, priced routing'" in s and "every count" in s for s in notes)
    assert any(s.startswith("each of 2 replicas is asked for 2.0 s") for s in notes)
    assert not any("each of 8" in s for s in notes)


def test_the_mooncake_sentences_carry_the_numbers_they_compare():
    doc = dict(capacity_tokens=3_000_000, ceiling_hit_ratio=0.6,
               rows=[_row("isolated_rr", 1, 0.3) | dict(recomputed_tokens=70),
                     _row("isolated_aware", 10, 0.5, compute=2.0) | dict(recomputed_tokens=50),
                     _row("pool_priced", 10, 0.55, compute=1.0) | dict(recomputed_tokens=45)])
    text = "\n".join(vsc.mooncake_words(mooncake_comparison(doc)))
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


def _measured(rows):
    return dict(measured=dict(model="tiny", kv_bytes_per_token=1536, tflops=0.004, link_gbps=0.1, time_stretch=80.0,
                              rows=rows))


def test_the_measured_replay_table_and_words_carry_every_mode_and_judge_routing():
    rows = [_row(m, n, 0.5, ttft=10.0 if m == "pool_priced" else 20.0, load=1.5 if n == 1 else 0.4)
            | dict(fetched_tokens=10 if m == "pool_priced" else (40 if m == "pool_rr" else 0), input_tokens=100)
            for n in (1, 4) for m in MODES]
    table = vsc.measured_replay_table(_measured(rows))
    assert "| 4 | 50.0% / 0.0% / 20.0 s |" in table and table.count("\n| ") == 4   # header, rule, 2 rows
    text = "\n".join(vsc.measured_replay_words(_measured(rows)))
    assert "at 4 replicas" in text and "fetches only 10.0%" in text and "round-robin keeps 50.0% of tokens and fetches 40.0%" in text
    assert "2.00x shorter than round-robin's (10 s against 20 s)" in text
    assert "at 1 replica(s) more prefill is asked" in text and "stretched 80x" in text


# --------------------------------------------------------------------------- eviction


def _gap_row(cap, **hit):
    gap = hit["belady"] - hit["lru"]
    return dict(capacity_tokens=cap, hit=hit,
                gap_closed={k: (v - hit["lru"]) / gap if gap else None for k, v in hit.items()})


def _gap_doc():
    def rows(lfu_1m, chain_3m):
        return [_gap_row(1_000_000, lru=0.10, lfu=lfu_1m, chain=0.12, conversation=0.15, learned=0.151,
                         knows_whether=0.25, belady=0.30),
                _gap_row(3_000_000, lru=0.40, lfu=0.30, chain=chain_3m, conversation=0.44, learned=0.44,
                         knows_whether=0.45, belady=0.50)]
    savings = [dict(capacity_tokens=1_000_000, lru_hit=0.1, needed_tokens=6e5, saved=0.4),
               dict(capacity_tokens=3_000_000, lru_hit=0.4, needed_tokens=None, saved=None)]
    return dict(policies=["lru", "lfu", "chain", "conversation", "learned", "knows_whether", "belady"],
                traces=dict(synthetic=dict(rows=rows(0.16, 0.45), savings=savings, learned=dict(auc=0.7)),
                            conversations_a=dict(rows=rows(0.16, 0.45), savings=savings, learned=dict(auc=0.8)),
                            conversations_b=dict(rows=rows(0.19, 0.455), savings=savings, learned=dict(auc=0.71))))


def test_eviction_words_judge_one_trace_exactly_and_two_draws_against_their_disagreement():
    text = "\n".join(vev.eviction_words(_gap_doc()))
    assert "Mooncake's synthetic trace [one trace, replayed exactly] -- 1M: lfu keeps more (+1.0 points); " \
           "3M: chain keeps more (+1.0 points)" in text
    # two draws: lfu +1.0 and +4.0 at 1M (mean 2.5, draws 3.0 apart): a tie; chain +1.0 and +1.5 at 3M counts
    assert "generated conversations [two draws, A and B] -- 1M: no other policy keeps more beyond the spread " \
           "(the nearest, lfu: +1.0 and +4.0 points); 3M: chain keeps more (+1.0 and +1.5 points)" in text
    assert "closes Mooncake's synthetic trace 75%/50%" in text and "of the gap (1M/3M)" in text
    assert "AUC 0.71 on B" in text and "1M +0.1 and +0.1 points (learned keeps more)" in text


def test_a_two_draw_difference_larger_than_its_disagreement_counts():
    assert vev._verdict([0.3, 0.3]) == 1 and vev._verdict([-1.4, -0.4]) == 0 and vev._verdict([0.5, -0.2]) == 0
    assert vev._verdict([0.05]) == 0 and vev._verdict([-0.2]) == -1


def test_the_eviction_figure_writes_each_share_beside_its_hit_ratio():
    doc = vks.recorded("kvstore_policy_gap")
    fig = vev.plot_eviction(doc)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    for d in doc["traces"].values():
        for r in d["rows"]:
            share = r["gap_closed"]["conversation"]
            assert ("no gap" if share is None else f"{share:.0%}") in texts
    assert len(fig.axes) == len(doc["traces"])
    plt.close(fig)


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


def test_tables_give_hit_ratios_beside_shares_and_savings_say_where_nothing_is_saved():
    doc = _gap_doc()
    table = vev.gap_table(doc["traces"]["synthetic"]["rows"], "t", ["lru", "conversation", "belady"])
    assert "| 1,000,000 | 10.0% (0%) | 15.0% (25%) | 30.0% (100%) |" in table
    savings = vev.savings_table(doc)
    assert "| 1M | 10.0% | 0.60M | 40% |" in savings and "more than the capacity | - |" in savings
    words = vev.savings_words(doc)
    assert "40% to 40% less cache" in words and "at 3 it never does" in words and "not a head-to-head" in words
    assert "<details>" in vev.all_tables(doc)



def test_the_policy_table_has_one_row_per_recorded_policy_and_only_the_offline_ones_are_not_online():
    doc = vks.recorded("kvstore_policy_gap")
    rows = vev.policy_table(doc).splitlines()[2:]
    assert [r.split("`")[1] for r in rows] == doc["policies"]
    assert {r.split("`")[1] for r in rows if r.rstrip(" |").split("| ")[-1].startswith("no")} == set(vev.OFFLINE)


def test_a_sketched_policy_is_replayed_beside_the_chosen_one_and_judged_against_the_draws():
    from minimax_lab.kvcache.eviction import LRUPolicy
    from minimax_lab.kvcache.workloads import conversation_workload

    class Copy(LRUPolicy):
        name = "copy of lru"

    draws = [conversation_workload(40, seed=s).requests for s in (5, 6)]
    cap = 20 * 512
    line = vev.sketch_lines(draws, Copy, capacities=(cap,), chosen="lru")[0]
    hits = [replay_trace(d, capacity_tokens=cap, policy="lru").hit_ratio for d in draws]
    assert f"LRU {hits[0]:.1%} and {hits[1]:.1%}" in line
    assert line.endswith("copy of lru minus lru: +0.0 and +0.0 points (a tie within the draws' disagreement)")


def test_a_records_origin_names_its_machine_and_versions_or_says_it_keeps_none():
    assert vks.record_origin({"machine": "box"}, "medians") == "recorded on box; it keeps no package versions; medians"
    assert vks.record_origin({"cores": 2}) == "recorded on a 2-core CPU machine; it keeps no package versions"
    assert vks.record_origin({}) == "the record names no machine; it keeps no package versions"
    assert vks.record_origin({"machine": "box", "versions": {"torch": "2.11"}}) == "recorded on box, torch 2.11"
    fig = vks.plot_break_even(_bandwidth() | {"machine": "box"}, preset_config("cpu"))
    assert "recorded on box" in fig._suptitle.get_text()
    plt.close(fig)


# --------------------------------------------------------------------------- faults


def test_every_fault_is_explained_in_words_and_its_cost_counted():
    rows = [dict(fault=f, trials=3, equal=3, wrong=0, crashed=0, fetched=1, recomputed=3) for f in FAULTS]
    table = vks.fault_table(rows, "recorded, 3 trials each")
    assert set(vks.FAULT_WORDS) == set(FAULTS)
    assert "recorded, 3 trials each" in table and not any(f in table for f in FAULTS)   # no bare identifiers
    assert table.count("\n| ") == len(FAULTS) + 2          # header, rule, one row per fault
    words = vks.fault_words(rows)
    assert words.startswith(f"{3 * len(FAULTS)} of {3 * len(FAULTS)} answers equal") and "master killed mid-run 75%" in words


# --------------------------------------------------------------------------- the link, the price, the router


def _tier_row(block, **mibps):
    row = dict(block_bytes=block, batch=16, repeats=7, pack_keyed_mibps=500, pack_checksum_mibps=10_000,
               check_keyed_mibps=480, check_checksum_mibps=9_000)
    for p, (put, get) in mibps.items():
        row |= {f"{p}_put_mibps": put, f"{p}_get_mibps": get}
    for p in ("tier_keyed", "tier_checksum"):
        for op in ("put", "get"):
            row[f"{p}_{op}_vs_raw"] = max(row[f"raw_bytes_{op}_mibps"], row[f"raw_zero_copy_{op}_mibps"]) / \
                row[f"{p}_{op}_mibps"]
    return row


def _bandwidth():
    return dict(cpu_prefill_tflops=0.004, tier=[
        _tier_row(1 << 20, raw_bytes=(600, 800), raw_zero_copy=(650, 900), tier_keyed=(560, 700), tier_checksum=(600, 850)),
        _tier_row(4 << 20, raw_bytes=(600, 800), raw_zero_copy=(650, 900), tier_keyed=(500, 100), tier_checksum=(600, 850))])


def test_tier_words_give_the_range_against_the_raw_client_and_the_price_of_signing():
    doc = _bandwidth()
    text = "\n".join(vks.tier_words(doc))
    assert "signed with the pool's secret, takes 1.16x to 9.00x the faster raw path's time" in text
    assert "keyed BLAKE3 costs 20x the CPU time of xxh3" in text
    assert "| 1 MiB x16 | get | 800 | 900 | 700 | 850 | 1.29x | 1.06x |" in vks.tier_table(doc)
    lo, mid, hi = vks.tier_rates(doc)
    assert lo < mid < hi and mid == pytest.approx((700 + 100) / 2 * 2**20 / 1e9)


def test_the_price_uses_the_replicas_fp32_cache_and_the_measured_rate():
    cfg = preset_config("cpu")
    cost = vks.measured_cost(_bandwidth(), cfg)
    assert cost.mfu == 1.0 and cost.tflops == 0.004 and cost.shape.dtype_bytes == 4
    even = vks.break_even_gbps(cost, 0, 112)
    at_even = replace(cost, link_gbps=even)
    assert at_even.fetch_s(112) == pytest.approx(at_even.compute_s(0, 112))


def test_rate_words_name_the_gpu_a_model_and_judge_at_both_ends_of_the_spread():
    cfg = preset_config("cpu")
    text = "\n".join(vks.rate_words(_bandwidth(), cfg))
    assert "modelled" not in text.split("\n")[0] and "H200" in text
    assert "recompute wins at every rate the tier measured" in text and "fetch wins at every rate" in text
    fig = vks.plot_break_even(_bandwidth(), cfg)
    assert "modelled" in fig.axes[1].get_title() and "recorded" in fig.axes[0].get_title()
    plt.close(fig)


def test_a_route_that_flips_inside_the_links_spread_is_called_a_tie():
    cost = PrefillCost(M3_LAYER, link_gbps=1.0, tflops=1.0, mfu=1.0)
    n, local, pool = 1000, [1000, 0], 1000
    fetch_s = cost.fetch_s(1000)
    queue = [fetch_s, 0.0]                     # replica 0 waits exactly what replica 1 spends fetching
    plan = dict(replica=0, local=local, pool=pool)
    assert "a tie within the spread" in "\n".join(vks.route_lines(cost, plan, queue, n, spread=(0.5, 2.0)))
    far = vks.route_lines(cost, plan, [0.0, 0.0], n, spread=(0.5, 2.0))
    assert far[-1].strip().startswith("replica 0 finishes first at every link rate from 0.5 to 2 GB/s")


# --------------------------------------------------------------------------- the value, the status, provenance


def test_the_value_layout_names_every_part_and_they_add_up():
    from minimax_lab.kvcache.pool_value import ValueCodec

    block = torch.randn(2, 3, 16, 2, 32)
    codec = ValueCodec("tiny", block.dtype, block.shape, os.urandom(32))
    value = codec.encode(b"\x01" * 16, block)
    text = vks.value_layout(value, codec.tag_bytes)
    hlen = int.from_bytes(value[8:12], "little")
    assert f"payload ({block.numel() * 4:,} B)" in text and f"header length (4 B) = {hlen}" in text
    assert 12 + hlen + block.numel() * 4 + 32 == len(value) and (12 + hlen) % 64 == 0
    lines = vks.served_lines({"good": value, "bad": value[:-1]}, lambda v: codec.decode(v, b"\x01" * 16))
    assert lines[0].endswith("served: yes") and "no (a miss" in lines[1]


def test_without_a_store_the_status_says_why_and_what_is_skipped():
    line = vks.store_status(None, "Mooncake Store cannot start: test", [])
    assert line.startswith("Mooncake Store cannot start: test") and "skipped" in line
    assert line.count("Mooncake Store") == 1


def test_provenance_says_what_the_records_do_not_keep():
    records = {name: None for name in vks.RECORDS} | dict(kvstore_faults=dict(rows=[], trials=3),
                                                         kvstore_policy_gap=dict(cores=2))
    lab = SimpleNamespace(P="cpu", t0=0.0, records=records)
    text = vks.provenance(lab, None)
    assert text.startswith("<details>") and "not recorded here" in text
    assert "the record names no machine; it keeps no package versions" in text and "a 2-core CPU machine" in text


@pytest.mark.parametrize("draw", ["pool", "replay"])
def test_the_figures_draw(draw):
    if draw == "pool":
        fig = vks.draw_pool()
        assert any("master" in t.get_text() for t in fig.axes[0].texts)
    else:
        rows = [_row(m, n, 0.3, load=1.5 if n == 1 else 0.2) for n in (1, 10) for m in MODES]
        fig = vsc.plot_replay(rows, "t", ceiling=0.6)
        assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1", "10"]
    plt.close(fig)
