"""Comparison words computed from the numbers they compare.

A sentence such as "the cached turn's first token comes 8% later" must agree with the two numbers
printed beside it; writing the word by hand lets the two drift apart when a record is re-run.
These helpers turn numbers into words::

    words.speed(ms=3.1, other_ms=4.4)               # '1.42x faster than'
    words.change(2.8, 7.6, unit="s")                # 'rose from 2.8 s to 7.6 s (2.71x)'
    words.change(8.84, 9.87, unit="ms")            # 'rose from 8.84 ms to 9.87 ms (1.12x)'
    words.change(8.84, 8.90, unit="ms")            # 'hardly moved (8.84 ms -> 8.9 ms)'
"""
from __future__ import annotations

import math


def _positive(name: str, x: float) -> float:
    x = float(x)
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{name} must be a positive finite number, got {x!r}")
    return x


def speed(ms: float, other_ms: float, *, same_within: float = 0.03) -> str:
    """How a time ``ms`` compares with ``other_ms`` (lower is faster): ``'1.42x faster than'``,
    ``'about as fast as'`` (within ``same_within``, a share) or ``'1.10x slower than'``."""
    ms, other_ms = _positive("ms", ms), _positive("other_ms", other_ms)
    r = other_ms / ms
    if abs(r - 1) <= same_within:
        return "about as fast as"
    return f"{r:.2f}x faster than" if r > 1 else f"{1 / r:.2f}x slower than"


def change(before: float, after: float, *, unit: str = "", same_within: float = 0.03, digits: int = 3) -> str:
    """How a quantity moved from ``before`` to ``after``: ``'rose from 2.8 s to 7.6 s (2.71x)'``,
    ``'fell from ...'`` or ``'hardly moved (8.84 ms -> 9.87 ms)'`` when within ``same_within``."""
    before, after = _positive("before", before), _positive("after", after)
    u = f" {unit}" if unit else ""
    a, b = f"{before:.{digits}g}{u}", f"{after:.{digits}g}{u}"
    if abs(after / before - 1) <= same_within:
        return f"hardly moved ({a} -> {b})"
    verb = "rose" if after > before else "fell"
    return f"{verb} from {a} to {b} ({after / before:.2f}x)"


def more_or_less(a: float, b: float, *, bigger: str = "more", smaller: str = "less",
                 same: str = "about as much as", same_within: float = 0.03) -> str:
    """``'1.30x more than'`` / ``'about as much as'`` / ``'1.25x less than'``: ``a`` against ``b``."""
    a, b = _positive("a", a), _positive("b", b)
    if abs(a / b - 1) <= same_within:
        return same
    return f"{a / b:.2f}x {bigger} than" if a > b else f"{b / a:.2f}x {smaller} than"
