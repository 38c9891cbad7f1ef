"""The chapters' helpers: comparison words agree with the numbers, record lookups find or say None."""
from __future__ import annotations

import pytest

from minimax_lab.notebook import recorded, words


def test_speed_words_follow_the_ratio():
    assert words.speed(2.0, 4.0) == "2.00x faster than"
    assert words.speed(4.0, 2.0) == "2.00x slower than"
    assert words.speed(1.0, 1.02) == "about as fast as"
    assert words.speed(1.0, 1.05) == "1.05x faster than"


def test_change_words_never_call_an_11_percent_rise_flat():
    assert words.change(8.84, 9.87, unit="ms").startswith("rose from 8.84 ms to 9.87 ms")
    assert words.change(7.6, 2.8, unit="s").startswith("fell from 7.6 s to 2.8 s")
    assert words.change(100, 101).startswith("hardly moved")


def test_more_or_less_and_bad_numbers():
    assert words.more_or_less(3, 2) == "1.50x more than"
    assert words.more_or_less(2, 3, smaller="fewer") == "1.50x fewer than"
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="positive finite"):
            words.speed(bad, 1.0)


def test_recorded_lookups_find_the_shipped_records_or_say_none():
    r = recorded.one("msa", "prefill_s131072", "triton_kv")
    assert r is not None and r["ms"] > 0 and r["device"] == recorded.H200
    assert recorded.one("msa", "no_such_case", "triton_kv") is None
    assert all(x["suite"] == "msa" for x in recorded.all_of("msa"))
