"""The measuring core: how every number of the workbook is checked, timed and recorded.

Importable as ``from minimax_lab import measure``; every chapter, bench suite and the kernel bench
builds on it, and it imports nothing of theirs:

* correctness -- :func:`check`, :func:`relative_error`, :func:`compare_outputs`, the poisoned
  allocator (:mod:`.check`)
* timing -- :func:`time_fn`, :func:`ceilings` (:mod:`.timing`)
* records -- :func:`make_record`, :func:`append_records`, :func:`load_records`,
  :func:`compare_records` (:mod:`.records`)
* which case groups a suite runs -- :func:`select_cases` (:mod:`.cases`)

The suites, their command line, the report and the launch-config tuner are
:mod:`minimax_lab.bench`; the kernel bench's harness is :mod:`minimax_lab.kernelbench`.
"""
from minimax_lab.measure.cases import select_cases
from minimax_lab.measure.check import (INT_POISON, TOLERANCES, CheckResult, check, compare_outputs, poison_,
                                       poison_allocator, relative_error, tolerance_for, upcast)
from minimax_lab.measure.records import (append_records, compare_records, format_comparison, format_table,
                                         git_commit, load_records, make_record)
from minimax_lab.measure.timing import Ceilings, Timing, ceilings, nbytes, time_fn

__all__ = ["select_cases", "INT_POISON", "TOLERANCES", "CheckResult", "check", "compare_outputs", "poison_",
           "poison_allocator", "relative_error", "tolerance_for", "upcast", "append_records", "compare_records",
           "format_comparison", "format_table", "git_commit", "load_records", "make_record", "Ceilings", "Timing",
           "ceilings", "nbytes", "time_fn"]
