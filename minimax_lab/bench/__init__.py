"""Everything that times, tunes, records or fetches peers, kept apart from the operators it measures.

The harness every chapter and suite uses, importable as ``from minimax_lab import bench``:

* correctness -- :func:`check`, :func:`relative_error`, :func:`compare_outputs` (:mod:`.check`)
* timing -- :func:`time_fn`, :func:`ceilings` (:mod:`.timing`)
* records -- :func:`make_record`, :func:`append_records`, :func:`load_records`,
  :func:`compare_records` (:mod:`.records`)

Beside them, imported by name: the suites (``suite_<topic>.py``, run by ``python -m
minimax_lab.bench``, :mod:`.cli`), the launch-config tuner (:mod:`.tune`), the SGLang peer adapters
(``peer_sglang_*.py``) and :mod:`.peers`, which finds the peers ``tools/fetch_peers.py`` downloads.
"""
from minimax_lab.bench.cases import select_cases
from minimax_lab.bench.check import (INT_POISON, TOLERANCES, CheckResult, check, compare_outputs, poison_,
                                     poison_allocator, relative_error, tolerance_for, upcast)
from minimax_lab.bench.records import (append_records, compare_records, format_comparison, format_table, git_commit,
                                       load_records, make_record)
from minimax_lab.bench.timing import Ceilings, Timing, ceilings, nbytes, time_fn

__all__ = ["select_cases", "INT_POISON", "TOLERANCES", "CheckResult", "check", "compare_outputs", "poison_",
           "poison_allocator", "relative_error", "tolerance_for", "upcast", "append_records", "compare_records",
           "format_comparison", "format_table", "git_commit", "load_records", "make_record", "Ceilings", "Timing",
           "ceilings", "nbytes", "time_fn"]
