"""``python -m minimax_lab.bench``: run suites, merge records from a GPU run, compare two runs.

    python -m minimax_lab.bench SUITE [SUITE ...] [--cases G ...] [--preset P] [--out F] [suite options]
    python -m minimax_lab.bench all
    python -m minimax_lab.bench merge FILE [FILE ...] [--out F]
    python -m minimax_lab.bench compare BEFORE AFTER [--tolerance 0.03]
    python -m minimax_lab.bench report [--out DIR] [--html] [--device NAME ...] [--suite NAME ...]

Every suite is a module ``suite_<topic>.py`` beside this one with ``CASES`` (its case groups),
``run(preset, cases=None, **options)`` returning records and optionally ``OPTIONS`` (the keyword
options of ``run``, offered as ``--option-name``) and ``check_options(**options)`` (raises
``ValueError`` for a bad value before anything runs); :data:`SUITES` registers them by import.

A mistake on the command line -- an unknown suite, case group or option, a bad value, a missing or
damaged file -- is answered with one line on stderr and exit status 2, before anything runs.
Records are never lost to a damaged or unwritable results file (:func:`.records.append_records`
keeps the damaged file aside or writes elsewhere and says where; where nothing can be written, the
records are printed as JSON on stdout and the exit status is 1).
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from minimax_lab import resources, runtime
from minimax_lab.bench import report
from minimax_lab.measure.cases import select_cases
from minimax_lab.bench.parsing import Parser
from minimax_lab.bench.suites import SUITES
from minimax_lab.measure.records import (RecordsNotSaved, RecordsWarning, append_records, compare_records,
                                         format_comparison, format_table, is_record, read_records)

PROG = "python -m minimax_lab.bench"

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


def _records_of(parser: argparse.ArgumentParser, path: str) -> list[dict]:
    """The records in ``path``; a missing or damaged file is a command-line mistake (one line, exit 2)."""
    stored, problem = read_records(path)
    if stored is None:
        parser.error(f"{path}: {problem}")
    if problem is not None:
        print(f"[bench] {path}: {problem}; using the {sum(map(is_record, stored))} records", file=sys.stderr)
    return [r for r in stored if is_record(r)]


def _check_out(parser: argparse.ArgumentParser, out: str | None) -> None:
    if out is not None and Path(out).is_dir():
        parser.error(f"--out {out} is a folder; name a records file (a .json file in it)")


def _compare(argv: list[str]) -> int:
    p = Parser(prog=f"{PROG} compare", description="every case's ratio to its peers, before and after a change")
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--tolerance", type=float, default=0.03, help="largest allowed fall of a ratio (0.03: 3%%)")
    a = p.parse_args(argv)
    if not 0 <= a.tolerance < 1:
        p.error(f"--tolerance must be in [0, 1), got {a.tolerance}")
    result = compare_records(_records_of(p, a.before), _records_of(p, a.after), tolerance=a.tolerance)
    print(format_comparison(result, a.tolerance))
    return 1 if result["regressions"] or result["missing"] else 0


def _merge(argv: list[str]) -> int:
    p = Parser(prog=f"{PROG} merge", description="append the records of files (from a GPU run) to the records file")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--out", default=None, help="records file (default: <results>/<the records' device>.json)")
    a = p.parse_args(argv)
    _check_out(p, a.out)
    batches = [(f, _records_of(p, f)) for f in a.files]  # every file checked before anything is written
    for f, recs in batches:
        dev = recs[0].get("device") if recs else None
        out = append_records(recs, a.out or resources.user_results_dir() / f"{runtime.device_slug(dev)}.json")
        print(f"merged {len(recs)} records from {f} into {out}")
    return 0


def _run(argv: list[str]) -> int:
    epilog = ("Name one suite with --help to see its case groups and options, e.g. "
              "'python -m minimax_lab.bench msa --help'.")

    def parser_for(modules: Mapping[str, Any], *, first: bool = False) -> argparse.ArgumentParser:
        p = Parser(prog=PROG, description=__doc__.split("\n\n")[0], epilog=epilog, add_help=not first)
        p.add_argument("suites", nargs="*" if first else "+",
                       help=f"suites to run: {', '.join(SUITES)}, all; or 'merge FILE...', 'compare BEFORE AFTER'")
        p.add_argument("--preset", default="auto", choices=runtime.PRESETS)
        p.add_argument("--cases", nargs="+", default=None, metavar="GROUP",
                       help="case groups of the one suite named (default: the preset's); see its --help")
        p.add_argument("--out", default=None,
                       help="records file (default: <results>/<device>.json, <results> = $MINIMAX_LAB_RESULTS or ./results)")
        p.add_argument("--no-record", action="store_true", help="print the table, write nothing")
        _add_suite_options(p, modules)
        return p

    named = parser_for({}, first=True).parse_known_args(argv)[0].suites  # which suites' options to offer
    names = list(SUITES) if "all" in named else [n for n in named if n in SUITES]
    modules = {n: SUITES[n] for n in dict.fromkeys(names)}
    parser = parser_for(modules)
    args = parser.parse_args(argv)
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
    _check_out(parser, args.out)
    options = {}
    for name in names:
        opts = getattr(modules[name], "OPTIONS", {})
        options[name] = {o: getattr(args, _option_dest(o)) for o in opts if hasattr(args, _option_dest(o))}
        try:
            getattr(modules[name], "check_options", lambda **kw: None)(**options[name])
        except ValueError as e:
            parser.error(f"suite {name!r}: {e}")
    print(f"[bench] {runtime.device_name()} torch {torch.__version__}; preset {runtime.resolve_preset(args.preset)}")
    all_records: list[dict] = []
    failed = []
    for name in names:
        given = dict(options[name])
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
        except RecordsNotSaved:
            raise
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


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"[bench] {category.__name__}: {message}", file=sys.stderr)


@contextlib.contextmanager
def _records_warnings_in_one_line():
    """Records warnings (a damaged file kept aside, records written elsewhere) as one line each."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", RecordsWarning)
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, RecordsWarning):
                _one_line_warning(message, category, filename, lineno)
            else:
                shown(message, category, filename, lineno, file, line)
        warnings.showwarning = show
        yield


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m minimax_lab.bench SUITE [SUITE ...] [--cases G ...] [--preset P] [--out F]
    [--no-record] [suite options]``, ``... merge FILE [FILE ...]``, ``... compare BEFORE AFTER`` and
    ``... report`` (:mod:`.report`). Returns the exit status (a command-line mistake exits with 2
    through ``SystemExit``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"compare": _compare, "merge": _merge, "report": report.main}
    with _records_warnings_in_one_line():
        try:
            if argv[:1] and argv[0] in commands:
                return commands[argv[0]](argv[1:])
            return _run(argv)
        except RecordsNotSaved as e:
            print(f"{PROG}: error: {e}; the records follow on stdout as JSON", file=sys.stderr)
            print(json.dumps(e.records, indent=1))
            return 1
