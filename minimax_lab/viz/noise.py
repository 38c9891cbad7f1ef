"""Sentences about noisy measurements: a difference is called a win or a loss only when it is larger
than its noise, and the noise is stated beside it, so a sentence cannot claim more than its numbers.

* :func:`two_se_shares` -- two standard errors of the difference of two shares (accuracies, hit
  rates) measured on independent trials;
* :func:`gap_words` -- ``'ahead (a gap of 0.12, more than two standard errors, 0.08)'``, or the word
  for "level" when the gap lies inside them;
* :func:`versus_chance` -- a share against a guessing rate, with two standard errors of guessing;
* :func:`mean_diff_words` -- the mean of paired differences (one per turn, per case) with two
  standard errors of that mean;
* :func:`timing_words` -- how a recorded number moved between two timings, judged by whether their
  p20-p80 spreads overlap;
* :func:`speed_words` -- ``'1.58x faster than'`` / ``'level with'``: one timing against another, level
  where their p20-p80 spreads overlap.
"""
from __future__ import annotations

import math
import statistics
from typing import Callable, Mapping, Sequence

from minimax_lab.notebook import words


def _trials(name: str, n: int) -> int:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} must be a positive number of trials, got {n!r}")
    return n


def two_se_shares(a: float, b: float, n_a: int, n_b: int | None = None) -> float:
    """Two standard errors of ``a - b``, two shares measured on ``n_a`` and ``n_b`` independent
    trials (``n_b`` defaults to ``n_a``). Each share's variance is taken as at least that of one
    trial in ``n`` (``1/n²``), so a share of exactly 0 or 1 does not claim to be noiseless."""
    n_a = _trials("n_a", n_a)
    n_b = n_a if n_b is None else _trials("n_b", n_b)
    var = lambda p, n: max(p * (1 - p), 1 / n) / n  # noqa: E731
    return 2 * math.sqrt(var(a, n_a) + var(b, n_b))


def gap_words(a: float, b: float, noise: float, *, above: str, below: str, level: str,
              fmt: Callable[[float], str] = "{:.2f}".format) -> str:
    """``above`` / ``below`` when ``a - b`` is more than ``noise`` (two standard errors) above or
    below zero, else ``level``; followed by the gap and the noise, both written with ``fmt``."""
    if not (math.isfinite(noise) and noise >= 0):
        raise ValueError(f"noise must be a finite number >= 0, got {noise!r}")
    diff = a - b
    word = above if diff > noise else below if diff < -noise else level
    where = "inside" if abs(diff) <= noise else "more than"
    return f"{word} (a gap of {fmt(abs(diff))}, {where} two standard errors, {fmt(noise)})"


def versus_chance(share: float, chance: float, n: int, *, fmt: Callable[[float], str] = "{:.0%}".format) -> str:
    """``'above guessing (25%)'``, ``'below guessing (50%)'`` or ``'no different from guessing
    (25%)'`` for a share measured on ``n`` trials, judged against two standard errors of a guesser's
    share on ``n`` trials (stated in the words)."""
    n = _trials("n", n)
    noise = 2 * math.sqrt(chance * (1 - chance) / n)
    word = ("above guessing" if share - chance > noise else "below guessing" if chance - share > noise
            else "no different from guessing")
    return f"{word} ({fmt(chance)}; two standard errors of guessing on {n} questions: {fmt(noise)})"


def mean_diff(diffs: Sequence[float]) -> tuple[float, float]:
    """The mean of paired differences and two standard errors of that mean (needs two or more)."""
    if len(diffs) < 2:
        raise ValueError(f"need at least two paired differences, got {len(diffs)}")
    return statistics.fmean(diffs), 2 * statistics.stdev(diffs) / math.sqrt(len(diffs))


def mean_diff_words(diffs: Sequence[float], *, unit: str = "", what: str = "pair", digits: int = 2) -> str:
    """``'1.03 ms ± 0.21 (two standard errors over 12 turns)'``: the mean paired difference with its
    noise, then whether it is larger than the noise."""
    mean, noise = mean_diff(diffs)
    u = f" {unit}" if unit else ""
    verdict = "larger than its noise" if abs(mean) > noise else "inside its noise: no measurable difference"
    return (f"{mean:+.{digits}f}{u} ± {noise:.{digits}f} (two standard errors over {len(diffs)} {what}s), "
            f"{verdict}")


def spreads_overlap(a: Mapping, b: Mapping) -> bool:
    """Whether two timing records' p20-p80 ranges (``p20_ms``, ``p80_ms``) overlap."""
    return a["p20_ms"] <= b["p80_ms"] and b["p20_ms"] <= a["p80_ms"]


def timing_words(before: Mapping, after: Mapping, value: Callable[[Mapping], float], *, unit: str) -> str:
    """How ``value`` (e.g. TFLOP/s) moved from the record ``before`` to ``after``: ``'rose from 475
    TFLOP/s to 552 TFLOP/s (1.16x), outside the p20-p80 spreads of both timings'``, or, where the two
    spreads overlap, that the change is inside the timings' noise."""
    a, b = value(before), value(after)
    spreads = (f"p20-p80 {before['p20_ms']:.3g}-{before['p80_ms']:.3g} ms and "
               f"{after['p20_ms']:.3g}-{after['p80_ms']:.3g} ms")
    if spreads_overlap(before, after):
        return (f"moved from {a:.3g} {unit} to {b:.3g} {unit}, inside the spread of the two timings "
                f"({spreads}): no measurable change")
    return f"{words.change(a, b, unit=unit, same_within=0.0)}, outside the spreads of both timings ({spreads})"


def has_spread(*recs: Mapping) -> bool:
    """Whether every record carries its timing's p20-p80 spread (``p20_ms`` and ``p80_ms``)."""
    return all("p20_ms" in r and "p80_ms" in r for r in recs)


def speed_words(rec: Mapping, other: Mapping) -> str:
    """``rec`` against ``other`` (timing records with ``ms``, ``p20_ms``, ``p80_ms``): ``'level with'``
    where their p20-p80 spreads overlap, else :func:`minimax_lab.notebook.words.speed`'s words. A
    record without a spread falls back to :func:`~minimax_lab.notebook.words.speed` with its default
    margin (callers that say how gaps were judged check :func:`has_spread` first)."""
    if not has_spread(rec, other):
        return words.speed(rec["ms"], other["ms"])
    if spreads_overlap(rec, other):
        return "level with"
    return words.speed(rec["ms"], other["ms"], same_within=0.0)
