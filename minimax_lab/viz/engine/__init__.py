"""The engine's pictures and tables, from bench records (suite ``engine``, chapter 09), one topic per
module; their public names are gathered here (``from minimax_lab.viz import engine as veng``).

* :mod:`.records` -- which record is a day's, the values the tables show (:data:`.records.METRICS`,
  with their repeats), whether two records' times can be compared (both rehearsed, or both made
  where nothing compiles) and each change written ``after / before``; decode records made under
  an older batch rule left out (:func:`.records.breaks_batch_rule`)
* :mod:`.days` -- what each day's switch buys and costs on a GPU: the day table, a sentence per
  day, bars with the repeats' spread
* :mod:`.load` -- the load and preemption sweeps: p50/p99 TTFT and inter-token latency, goodput and
  the share meeting the SLO against the rate, with the repeats' range; how each sweep was made
* :mod:`.prices` -- each day's step prices, three reference steps per day
* :mod:`.ledger` -- what each switch buys under load (a ledger with spreads, judged against them),
  where FP8 pays from the step prices, and the FP8 verdict from the GPU records
* :mod:`.decode_roofline` -- each day's decode step on chapter 00's roofline
* :mod:`.timeline` -- the steps of a simulated run, one row per request
* :mod:`.gpu_story` -- the recorded GPU runs in one figure, and what their records lack
* :mod:`.quality` -- each day's logits against day 0's
* :mod:`.fp8_breakdown` -- what FP8 storage saves and where it moves the logits
* :mod:`.targets` -- the H200 goals of the day-0-to-day-14 story, met or not
* :mod:`.setup` -- the chapter's one setup call
* :mod:`.provenance` -- where the chapter's numbers come from (its last, collapsed cell)
"""
from __future__ import annotations

from minimax_lab.viz.engine.days import day_ledger, day_panels, day_table, left_out, plot_days
from minimax_lab.viz.engine.decode_roofline import (decode_points, plot_decode_roofline, recorded_ceilings,
                                                    roofline_sentences)
from minimax_lab.viz.engine.fp8_breakdown import breakdown_lines, format_breakdown, memory_lines
from minimax_lab.viz.engine.gpu_story import gpu_devices, gpu_story_lines, plot_gpu_story, unrehearsed
from minimax_lab.viz.engine.ledger import (fp8_break_even, fp8_choice_line, fp8_threshold_lines, fp8_verdict, format_ledger,
                                           ledger_sentences, sweep_ledger)
from minimax_lab.viz.engine.load import (curve_comparison, goodput_sentences, plot_preemption, plot_sweep, sweep_curves,
                                         sweep_lines)
from minimax_lab.viz.engine.prices import price_table
from minimax_lab.viz.engine.provenance import provenance
from minimax_lab.viz.engine.quality import format_quality, quality_rows
from minimax_lab.viz.engine.setup import Chapter, setup
from minimax_lab.viz.engine.records import (COMMAND, METRICS, TIMED, breaks_batch_rule, by_case, by_device, change,
                                            comparable, day_values, engine_records, fmt_value, itl_case, no_record)
from minimax_lab.viz.engine.targets import TARGETS, format_targets, target_rows
from minimax_lab.viz.engine.timeline import plot_timeline

__all__ = ["COMMAND", "METRICS", "TIMED", "breaks_batch_rule", "by_case", "by_device", "change", "comparable",
           "day_values", "engine_records", "fmt_value", "itl_case", "no_record", "day_ledger", "day_panels",
           "day_table", "left_out", "plot_days", "curve_comparison", "goodput_sentences", "plot_preemption",
           "plot_sweep", "sweep_curves", "sweep_lines", "fp8_break_even", "fp8_choice_line", "fp8_threshold_lines", "fp8_verdict",
           "format_ledger", "ledger_sentences", "sweep_ledger", "decode_points", "plot_decode_roofline",
           "recorded_ceilings", "roofline_sentences", "plot_timeline", "gpu_devices", "gpu_story_lines",
           "plot_gpu_story", "unrehearsed", "format_quality", "quality_rows", "breakdown_lines", "format_breakdown",
           "memory_lines", "TARGETS", "format_targets", "target_rows", "provenance", "Chapter", "setup", "price_table"]
