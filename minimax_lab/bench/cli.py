"""``python -m minimax_lab.bench``: run suites, merge records from a GPU run, compare two runs.

    python -m minimax_lab.bench SUITE [SUITE ...] [--cases G ...] [--preset P] [--out F] [suite options]
    python -m minimax_lab.bench all
    python -m minimax_lab.bench merge FILE [FILE ...]
    python -m minimax_lab.bench compare BEFORE AFTER [--tolerance 0.03]
    python -m minimax_lab.bench report [--out DIR] [--html] [--device NAME ...] [--suite NAME ...]

Every suite is a module ``suite_<topic>.py`` beside this one with ``CASES`` (its case groups),
``run(preset, cases=None, **options)`` returning records and optionally ``OPTIONS`` (the keyword
options of ``run``, offered as ``--option-name``); :data:`SUITES` registers them by import.
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from minimax_lab import resources, runtime
from minimax_lab.bench import report
from minimax_lab.bench import (suite_attention, suite_ceilings, suite_engine, suite_kernelbench, suite_kvcache,
                               suite_moe, suite_msa, suite_pitfalls)
from minimax_lab.bench.cases import select_cases
from minimax_lab.bench.records import append_records, compare_records, format_comparison, format_table

#: suite name -> module. Each module has ``CASES`` (its case groups), ``run(preset="auto",
#: cases=None, **options)`` returning records, and optionally ``OPTIONS`` (option name -> the
#: keyword arguments of ``argparse.add_argument`` for ``--<option-name>``; the CLI passes the
#: options given to ``run`` as keywords).
SUITES: dict[str, Any] = {
    "ceilings": suite_ceilings,
    "pitfalls": suite_pitfalls,
    "attention": suite_attention,
    "msa": suite_msa,
    "moe": suite_moe,
    "kvcache": suite_kvcache,
    "kernelbench": suite_kernelbench,
    "engine": suite_engine,
}


def run_suite(name: str, preset: str = "auto", cases=None, **options) -> list[dict]:
    """Run one registered suite: ``cases`` (None: the preset's default groups) and the suite's
    ``options``; returns its records (not yet written). Raises ValueError for an unknown name."""
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; choose from {sorted(SUITES)} or 'all'")
    return list(SUITES[name].run(preset=preset, cases=cases, **options))


def _option_dest(name: str) -> str:
    return f"suite_option:{name}"


def _add_suite_options(parser: argparse.ArgumentParser, modules: Mapping[str, Any]) -> None:
    """``--<option>`` for every option of the named suites (an option two suites share once)."""
    seen = set()
    for name, module in modules.items():
        opts = getattr(module, "OPTIONS", {})
        default = getattr(module, "DEFAULT_CASES", None)
        group = parser.add_argument_group(
            f"suite {name!r}", f"case groups {', '.join(module.CASES)}"
            + (f" (default {', '.join(default)})" if default else "") + ("" if opts else "; no options"))
        for opt, spec in opts.items():
            if opt not in seen:
                seen.add(opt)
                group.add_argument("--" + opt.replace("_", "-"), dest=_option_dest(opt), default=argparse.SUPPRESS,
                                   **spec)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m minimax_lab.bench SUITE [SUITE ...] [--cases G ...] [--preset P] [--out F]
    [--no-record] [suite options]`` and ``python -m minimax_lab.bench merge FILE [FILE ...]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    epilog = ("Name one suite with --help to see its case groups and options, e.g. "
              "'python -m minimax_lab.bench msa --help'.")

    def parser_for(modules: Mapping[str, Any], *, first: bool = False) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog="python -m minimax_lab.bench", description=__doc__.split("\n\n")[0],
                                    epilog=epilog, add_help=not first)
        p.add_argument("suites", nargs="*" if first else "+",
                       help=f"suites to run: {', '.join(SUITES)}, all; or 'merge FILE...'")
        p.add_argument("--preset", default="auto", choices=runtime.PRESETS)
        p.add_argument("--cases", nargs="+", default=None, metavar="GROUP",
                       help="case groups of the one suite named (default: the preset's); see its --help")
        p.add_argument("--out", default=None,
                       help="records file (default: <results>/<device>.json, <results> = $MINIMAX_LAB_RESULTS or ./results)")
        p.add_argument("--no-record", action="store_true", help="print the table, write nothing")
        _add_suite_options(p, modules)
        return p

    if argv[:1] == ["report"]:
        return report.main(argv[1:])
    if argv[:1] == ["compare"]:
        p = argparse.ArgumentParser(prog="python -m minimax_lab.bench compare",
                                    description="every case's ratio to its peers, before and after a change")
        p.add_argument("before")
        p.add_argument("after")
        p.add_argument("--tolerance", type=float, default=0.03, help="largest allowed fall of a ratio (0.03: 3%%)")
        a = p.parse_args(argv[1:])
        result = compare_records(json.loads(Path(a.before).read_text()), json.loads(Path(a.after).read_text()),
                                 tolerance=a.tolerance)
        print(format_comparison(result, a.tolerance))
        return 1 if result["regressions"] or result["missing"] else 0
    named = parser_for({}, first=True).parse_known_args(argv)[0].suites  # which suites' options to offer
    names = [] if named[:1] == ["merge"] else list(SUITES) if "all" in named else [n for n in named if n in SUITES]
    modules = {n: SUITES[n] for n in dict.fromkeys(names)}
    parser = parser_for(modules)
    args = parser.parse_args(argv)
    if args.suites[0] == "merge":
        for f in args.suites[1:]:
            recs = json.loads(Path(f).read_text())
            dev = recs[0].get("device") if recs else None
            out = append_records(recs, args.out or resources.user_results_dir() / f"{runtime.device_slug(dev)}.json")
            print(f"merged {len(recs)} records from {f} into {out}")
        return 0
    names = list(SUITES) if args.suites == ["all"] else args.suites
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {unknown}; choose from {', '.join(SUITES)} or all")
    if args.cases is not None:
        if len(names) != 1:
            parser.error(f"--cases names case groups of one suite; {len(names)} suites given ({', '.join(names)})")
        try:
            select_cases(args.cases, modules[names[0]].CASES)
        except ValueError as e:
            parser.error(f"suite {names[0]!r}: {e}")
    print(f"[bench] {runtime.device_name()} torch {torch.__version__}; preset {runtime.resolve_preset(args.preset)}")
    all_records: list[dict] = []
    failed = []
    for name in names:
        opts = getattr(modules[name], "OPTIONS", {})
        given = {o: getattr(args, _option_dest(o)) for o in opts if hasattr(args, _option_dest(o))}
        t0 = time.perf_counter()
        streamed: list[dict] = []
        if "sink" in inspect.signature(modules[name].run).parameters:
            # a suite that hands over records as it goes: write each batch at once, so a run cut
            # short keeps what it finished
            def sink(batch, streamed=streamed):
                streamed.extend(batch)
                if batch and not args.no_record:
                    append_records(batch, args.out)
            given["sink"] = sink
        try:
            recs = run_suite(name, args.preset, cases=args.cases, **given)
        except Exception as e:  # keep going: one broken suite must not hide the others' numbers
            traceback.print_exc()
            failed.append(name)
            all_records += streamed
            print(f"[bench] suite {name!r} FAILED: {type(e).__name__}: {e}")
            continue
        print(f"[bench] suite {name!r}: {len(recs)} records in {time.perf_counter() - t0:.1f} s")
        written = {id(r) for r in streamed}
        unwritten = [r for r in recs if id(r) not in written]
        if unwritten and not args.no_record:
            append_records(unwritten, args.out)
        all_records += recs
    print(format_table(all_records))
    if failed:
        print(f"[bench] failed suites: {', '.join(failed)}")
    return 1 if failed else 0
