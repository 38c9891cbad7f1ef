"""The noise helpers call a difference a win or a loss only outside two standard errors, and always
say how large the noise was."""
from __future__ import annotations

import math

import pytest

from minimax_lab.viz import noise


def test_two_standard_errors_of_two_shares():
    assert noise.two_se_shares(0.5, 0.5, 100) == pytest.approx(2 * math.sqrt(0.25 / 100 * 2))
    assert noise.two_se_shares(0.448, 0.468, 500) == pytest.approx(0.0631, abs=5e-4)
    # a share of exactly 0 or 1 still carries the noise of one trial in n
    assert noise.two_se_shares(0.0, 1.0, 16) == pytest.approx(2 * math.sqrt(2 / 16**2))
    with pytest.raises(ValueError, match="positive number of trials"):
        noise.two_se_shares(0.5, 0.5, 0)


def test_a_gap_inside_the_noise_is_level_whichever_way_it_points():
    kw = dict(above="ahead", below="behind", level="level")
    assert noise.gap_words(0.30, 0.10, 0.1, **kw).startswith("ahead (a gap of 0.20, more than two standard errors, 0.10)")
    assert noise.gap_words(0.10, 0.30, 0.1, **kw).startswith("behind")
    assert noise.gap_words(0.12, 0.25, 0.22, **kw) == "level (a gap of 0.13, inside two standard errors, 0.22)"
    with pytest.raises(ValueError, match="noise"):
        noise.gap_words(1, 0, float("nan"), **kw)


def test_a_share_against_guessing():
    assert noise.versus_chance(0.41, 0.5, 160).startswith("below guessing (50%; two standard errors of guessing on 160")
    assert noise.versus_chance(0.57, 0.5, 160).startswith("no different from guessing")
    assert noise.versus_chance(0.60, 0.25, 172).startswith("above guessing")


def test_paired_differences_with_their_noise():
    mean, se2 = noise.mean_diff([1.0, 1.2, 0.8, 1.0])
    assert mean == pytest.approx(1.0) and se2 == pytest.approx(2 * math.sqrt(0.08 / 3) / 2)
    assert "larger than its noise" in noise.mean_diff_words([1.0, 1.2, 0.8, 1.0], unit="ms", what="turn")
    assert "over 4 turns" in noise.mean_diff_words([1.0, 1.2, 0.8, 1.0], unit="ms", what="turn")
    assert "no measurable difference" in noise.mean_diff_words([1.0, -1.1, 0.9, -1.0])
    with pytest.raises(ValueError, match="two"):
        noise.mean_diff([1.0])


def test_timings_whose_spreads_overlap_did_not_measurably_change():
    v5 = {"ms": 7.96, "p20_ms": 7.96, "p80_ms": 8.04, "tflops": 552}
    v6 = {"ms": 8.06, "p20_ms": 8.00, "p80_ms": 8.15, "tflops": 545}
    v4 = {"ms": 9.26, "p20_ms": 8.95, "p80_ms": 9.26, "tflops": 475}
    tf = lambda r: r["tflops"]  # noqa: E731
    assert noise.spreads_overlap(v5, v6) and not noise.spreads_overlap(v4, v5)
    assert "no measurable change" in noise.timing_words(v5, v6, tf, unit="TFLOP/s")
    moved = noise.timing_words(v4, v5, tf, unit="TFLOP/s")
    assert moved.startswith("rose from 475 TFLOP/s to 552 TFLOP/s (1.16x), outside the spreads")
