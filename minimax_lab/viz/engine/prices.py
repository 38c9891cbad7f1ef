"""What one engine step costs on each day: the step prices a simulated sweep charges, as a table of
three reference steps per day (:func:`price_table`) -- a decode step of one sequence and of 32, and
a prompt prefilled alone -- each the median over the price's repeats, their range in brackets.
"""
from __future__ import annotations

import statistics

from minimax_lab.engine.clock import StepShape, chunk_pairs
from minimax_lab.viz.engine.records import _label

#: (column title, the step): the reference steps of :func:`price_table`
STEPS = (("decode, 1 seq at 4k", StepShape(decodes=1, attended=4096)),
         ("decode, 32 seqs at 8k", StepShape(decodes=32, attended=32 * 8192)),
         ("prompt of 2k tokens", StepShape(prefill_tokens=2048, attended=chunk_pairs(0, 2048),
                                           prefill_pairs=chunk_pairs(0, 2048))))


def _cell(vals: list) -> str:
    med = statistics.median(vals)
    f = (lambda x: f"{x:.3g}")
    return f"{f(med)} ms" if min(vals) == max(vals) else f"{f(med)} ({f(min(vals))}-{f(max(vals))}) ms"


def price_table(prices) -> str:
    """Each priced day's cost of the :data:`STEPS` under ``prices``
    (:class:`~minimax_lab.bench.suite_engine_prices.Prices`), headed by what priced them."""
    if prices is None:
        return "(no step prices)"
    lines = [f"step prices: {prices.label()}",
             f"{'':36s}" + "".join(f"{t:>26s}" for t, _ in STEPS)]
    for day, costs in sorted(prices.by_day.items()):
        lines.append(f"{_label(day)[:36]:36s}" + "".join(f"{_cell([c.ms(s) for c in costs]):>26s}" for _, s in STEPS))
    return "\n".join(lines)
