"""The bench's suites, registered by import: suite name -> its ``suite_<topic>`` module.

Each module has ``CASES`` (its case groups), ``run(preset="auto", cases=None, **options)`` returning
records, and optionally ``DEFAULT_CASES``, ``OPTIONS`` (option name -> the keyword arguments of
``argparse.add_argument`` for ``--<option-name>``; the command line passes the options given to
``run`` as keywords), ``check_options(**options)`` and ``TARGETS`` (read by the report). A suite
whose ``run`` takes ``sink`` hands over records as it goes.
"""
from __future__ import annotations

from types import ModuleType

from minimax_lab.bench import (suite_attention, suite_ceilings, suite_engine, suite_kernelbench, suite_kvcache,
                               suite_kvstore, suite_moe, suite_msa, suite_pitfalls)

SUITES: dict[str, ModuleType] = {
    "ceilings": suite_ceilings,
    "pitfalls": suite_pitfalls,
    "attention": suite_attention,
    "msa": suite_msa,
    "moe": suite_moe,
    "kvcache": suite_kvcache,
    "kvstore": suite_kvstore,
    "kernelbench": suite_kernelbench,
    "engine": suite_engine,
}
