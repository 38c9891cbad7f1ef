"""The engine's pictures and tables, from bench records (suite ``engine``, chapter 09), one topic per
module; their public names are gathered here (``from minimax_lab.viz import engine as veng``).

* :mod:`.records` -- which record is a day's, the values the tables show (:data:`.records.METRICS`),
  whether two records' times can be compared (both rehearsed, or both made by Triton's
  interpreter) and each change written ``after / before``; decode records made under an older
  batch rule left out (:func:`.records.breaks_batch_rule`)
* :mod:`.days` -- what each day's switch buys and costs: the day table, a sentence per day, bars
* :mod:`.load` -- the load and preemption sweeps: throughput against p99 TTFT, p99 inter-token
  latency, the share of requests meeting the SLO, and what each curve sustains in words
* :mod:`.decode_roofline` -- each day's decode step on chapter 00's roofline
* :mod:`.timeline` -- the steps of a simulated run, one row per request
* :mod:`.gpu_story` -- the recorded GPU run in one figure, and what its records lack
* :mod:`.quality` -- each day's logits against day 0's
* :mod:`.fp8_breakdown` -- what FP8 storage saves and where it moves the logits
* :mod:`.targets` -- the H200 goals of the day-0-to-day-14 story, met or not
"""
from __future__ import annotations

from minimax_lab.viz.engine.days import day_ledger, day_panels, day_table, plot_days
from minimax_lab.viz.engine.decode_roofline import (decode_points, plot_decode_roofline, recorded_ceilings,
                                                    roofline_sentences)
from minimax_lab.viz.engine.fp8_breakdown import breakdown_lines, format_breakdown, memory_lines
from minimax_lab.viz.engine.gpu_story import gpu_story_lines, plot_gpu_story, unrehearsed
from minimax_lab.viz.engine.load import (curve_comparison, goodput_sentences, plot_preemption, plot_sweep, sweep_curves,
                                         sweep_lines)
from minimax_lab.viz.engine.quality import format_quality, quality_rows
from minimax_lab.viz.engine.records import (COMMAND, METRICS, TIMED, breaks_batch_rule, by_case, change, comparable,
                                            day_values, engine_records, fmt_value, itl_case, no_record)
from minimax_lab.viz.engine.targets import TARGETS, format_targets, target_rows
from minimax_lab.viz.engine.timeline import plot_timeline

__all__ = ["COMMAND", "METRICS", "TIMED", "breaks_batch_rule", "by_case", "change", "comparable", "day_values",
           "engine_records", "fmt_value", "itl_case", "no_record", "day_ledger", "day_panels", "day_table", "plot_days",
           "curve_comparison", "goodput_sentences", "plot_preemption", "plot_sweep", "sweep_curves", "sweep_lines",
           "decode_points", "plot_decode_roofline", "recorded_ceilings", "roofline_sentences", "plot_timeline",
           "gpu_story_lines", "plot_gpu_story", "unrehearsed", "format_quality", "quality_rows", "breakdown_lines",
           "format_breakdown", "memory_lines", "TARGETS", "format_targets", "target_rows"]
