"""The whole workbook on a GPU machine, in one command, with a record of what passed.

    make gpu-check                                 # or: python3 tools/gpu_check.py
    python3 tools/gpu_check.py --only tests        # the parts can run in separate commands;
    python3 tools/gpu_check.py --only notebooks,bench   # they merge into the same record
    python3 tools/gpu_check.py --overlap           # notebooks beside the tests and bench: one shorter command

Three parts:

* **tests** -- the whole test suite (``pytest -n WORKERS -m "not exclusive"``, then the tests marked
  ``exclusive`` -- they time against a clock -- alone; JUnit XML), reported per test file
  (``tests/workbook/test_gpu_check_record.py`` is left out: it checks this record, so it cannot be in it);
* **notebooks** -- every notebook in ``notebooks/`` at preset ``gpu``: with papermill and the
  registered ``minimax_lab`` Jupyter kernel when both are installed, otherwise with
  :mod:`minimax_lab.notebook.runner` (plain Python, no Jupyter needed); the notebooks of
  :data:`ALONE_NOTEBOOKS` (they judge timings against a clock) last and alone, as the
  ``exclusive`` tests;
* **bench** -- a smoke run of every suite of :data:`minimax_lab.bench.cli.SUITES` at preset ``cpu``
  (small cases, on this machine's device), its records written to a temporary file and never
  into ``results/`` (checked).

It writes ``results/gpu_check_<device>.json`` after every step (so a run cut short keeps what it
finished): the git commit (``MINIMAX_LAB_COMMIT`` where the tree has no git metadata), versions,
and per test file, notebook and bench suite: passed/failed and seconds. A part run again at the
same commit replaces that part; a record from another commit is started afresh. Everything stops
starting new work after ``--deadline-s`` seconds (what did not run is marked ``not_run``), so a
machine that allows ten minutes per command gets its record back. Exit status 0 only when
everything that ran passed and nothing was left out.

This is a tool of the repository (it needs ``tests/`` and ``notebooks/``, which a ``pip install``
does not ship), so it lives in ``tools/``; the notebook runner it falls back to is part of the
package.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run from a clone without `make setup`: use the package next to this file
    sys.path.insert(0, str(REPO))

PARTS = ("tests", "notebooks", "bench")
RECORD_TEST = "tests/workbook/test_gpu_check_record.py"   # checks the record, so it is not part of it
KERNEL_NAME = "minimax_lab"                      # the Jupyter kernel `make setup` registers


# --------------------------------------------------------------------------- what there is to check


def test_files(repo: Path = REPO) -> list[str]:
    """Every test file, repository-relative, except the one that checks the record."""
    return sorted(str(p.relative_to(repo)) for p in (repo / "tests").rglob("test_*.py") if
                  str(p.relative_to(repo)) != RECORD_TEST)


#: Notebooks that run alone, after everything else of the run has finished: they judge timings
#: taken in a second process against this machine's clock (notebook 06's isolated kernel bench,
#: whose tampered-clock flag needs the round trip's jitter small), which other notebooks, the
#: bench suites or test workers sharing the GPU and the CPUs would blur (on an H200 with
#: ``--overlap`` it once failed that way; alone it passed).
ALONE_NOTEBOOKS = ("08_kernel_bench_that_hacks_cannot_fool",)


def notebook_files(repo: Path = REPO) -> list[str]:
    """Every notebook of the workbook (papermill outputs excluded), by file name."""
    return sorted(p.name for p in (repo / "notebooks").glob("*.ipynb") if not p.name.endswith(".out.ipynb"))


def bench_suites() -> list[str]:
    from minimax_lab.bench.cli import SUITES

    return list(SUITES)


# --------------------------------------------------------------------------- the record


def new_record(commit: str, describe: Mapping) -> dict:
    """An empty record for this commit and machine."""
    import torch

    versions = {k: describe.get(k) for k in ("torch", "triton", "python", "device", "device_kind", "interpreter",
                                             "compute_dtype", "capability", "sm_count", "memory_gib")}
    versions["cuda"] = torch.version.cuda
    versions["platform"] = platform.platform()
    try:
        import numpy

        versions["numpy"] = numpy.__version__
    except ImportError:  # pragma: no cover - numpy is a dependency
        versions["numpy"] = None
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return {"commit": commit, "device": describe.get("device"), "versions": versions, "started": now,
            "updated": now, "parts": {}}


def merge_into(old: dict | None, fresh: dict) -> dict:
    """The record to write: ``old`` keeps its parts when it is for the same commit and device."""
    if old and old.get("commit") == fresh["commit"] and old.get("device") == fresh["device"]:
        return {**fresh, "started": old.get("started", fresh["started"]), "parts": dict(old.get("parts", {}))}
    return fresh


ITEMS = {"tests": "files", "notebooks": "notebooks", "bench": "suites"}


def merge_part(old: dict | None, new: dict, part: str) -> dict:
    """``new`` with the items of ``old`` (same commit) it did not run: a run of some notebooks
    keeps the others' results; an item marked ``not_run`` now keeps its earlier result."""
    key = ITEMS[part]
    if not old or key not in old:
        return new
    items = dict(old[key])
    items.update({k: v for k, v in new.get(key, {}).items() if v.get("status") != "not_run" or k not in items})
    return {**new, key: items}


def write_record(path: Path, record: dict) -> None:
    """Write atomically (temporary file + rename)."""
    record["updated"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)


def check_record(record: dict, *, tests: Iterable[str], notebooks: Iterable[str], suites: Iterable[str],
                 parts: Iterable[str] = PARTS) -> list[str]:
    """What is wrong with a record (empty list = complete and all passed), for the given parts.

    It must name a commit, and hold every test file, notebook and bench suite given, each
    ``passed`` (a test file also needs at least one test that passed: skipped is not passed).
    """
    problems = []
    if not record.get("commit"):
        problems.append("the record names no commit")
    recorded, wanted_parts = record.get("parts", {}), set(parts)
    wanted = {"tests": list(tests), "notebooks": list(notebooks), "bench": list(suites)}
    for part, names in wanted.items():
        key = ITEMS[part]
        if part not in wanted_parts:
            continue
        got = recorded.get(part, {}).get(key)
        if got is None:
            problems.append(f"part {part!r} is missing (run: python3 tools/gpu_check.py --only {part})")
            continue
        for name in names:
            entry = got.get(name)
            if entry is None:
                problems.append(f"{part}: {name} is not in the record")
            elif entry.get("status") != "passed":
                problems.append(f"{part}: {name} {entry.get('status')}" +
                                (f" ({entry['error']})" if entry.get("error") else ""))
            elif part == "tests" and not entry.get("passed"):
                problems.append(f"tests: {name} has no passing test")
    return problems


def junit_by_file(xml_paths: Path | Sequence[Path], files: Sequence[str], repo: Path = REPO) -> dict[str, dict]:
    """Per test file: counts of passed/failed/errors/skipped, summed seconds, status, summed over
    one or more JUnit reports (the parallel run and the ``exclusive`` run).

    A file with no test case in the reports is ``missing``; with failures or errors ``failed``; with
    only skipped tests ``skipped``; else ``passed``.
    """
    out = {f: {"status": "missing", "passed": 0, "failed": 0, "errors": 0, "skipped": 0, "seconds": 0.0,
               "failures": []} for f in files}
    paths = [xml_paths] if isinstance(xml_paths, (str, Path)) else list(xml_paths)
    cases = [case for path in paths for case in ET.parse(path).getroot().iter("testcase")]
    for case in cases:
        name = _file_of(case.get("classname") or "", repo) or _file_of(case.get("name") or "", repo)
        if name is None:
            continue
        entry = out.setdefault(name, {"status": "missing", "passed": 0, "failed": 0, "errors": 0, "skipped": 0,
                                      "seconds": 0.0, "failures": []})
        entry["seconds"] += float(case.get("time") or 0.0)
        kinds = {child.tag for child in case}
        if "failure" in kinds or "error" in kinds:
            entry["failed" if "failure" in kinds else "errors"] += 1
            if len(entry["failures"]) < 10:
                entry["failures"].append(case.get("name"))
        elif "skipped" in kinds:
            entry["skipped"] += 1
        else:
            entry["passed"] += 1
    for entry in out.values():
        entry["seconds"] = round(entry["seconds"], 2)
        total = entry["passed"] + entry["failed"] + entry["errors"] + entry["skipped"]
        entry["status"] = ("missing" if total == 0 else "failed" if entry["failed"] or entry["errors"]
                           else "skipped" if not entry["passed"] else "passed")
    return out


def _file_of(dotted: str, repo: Path) -> str | None:
    """'tests.test_moe.TestX' -> 'tests/test_moe.py' (the longest prefix that is a file)."""
    parts = dotted.replace("/", ".").removesuffix(".py").split(".")
    for n in range(len(parts), 0, -1):
        candidate = "/".join(parts[:n]) + ".py"
        if (repo / candidate).is_file():
            return candidate
    return None


def summary_table(record: dict) -> str:
    """A short plain-text table: one row per test file, notebook and suite."""
    rows = []
    parts = record.get("parts", {})
    for part, key in ITEMS.items():
        for name, e in parts.get(part, {}).get(key, {}).items():
            detail = ""
            if part == "tests":
                detail = f"{e.get('passed', 0)} passed, {e.get('failed', 0) + e.get('errors', 0)} failed, " \
                         f"{e.get('skipped', 0)} skipped"
            elif e.get("error"):
                detail = str(e["error"])[:70]
            rows.append((part, name, e.get("status", "?"), f"{e.get('seconds', 0):.0f}", detail))
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(("part", "name", "status", "s", ""))]
    fmt = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    head = f"gpu-check at {record.get('commit')} on {record.get('device')} " \
           f"(torch {record.get('versions', {}).get('torch')}, triton {record.get('versions', {}).get('triton')})"
    return "\n".join([head, fmt(("part", "name", "status", "s", "")), fmt(["-" * w for w in widths])]
                     + [fmt(r) for r in rows])


# --------------------------------------------------------------------------- running the parts


class Clock:
    """Seconds left before ``deadline_s``; items that would start too late are not started."""

    def __init__(self, deadline_s: float):
        self.t0, self.deadline_s = time.monotonic(), deadline_s

    def left(self) -> float:
        return self.deadline_s - (time.monotonic() - self.t0)


def child_env(extra: Mapping[str, str] | None = None, *, notebook: bool = False) -> dict:
    """This environment, with the package next to this file importable; for notebooks also no
    widget frontend (static pictures), matplotlib's Agg backend and quieter progress bars."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # workers sharing a card fragment less
    if notebook:
        env.setdefault("MPLBACKEND", "Agg")
        env["MINIMAX_LAB_STATIC"] = "1"
        env.setdefault("TQDM_MININTERVAL", "5")
    env.update(extra or {})
    return env


def run_logged(cmd: Sequence[str], *, log: Path, timeout_s: float, cwd: Path, env: Mapping[str, str],
               interrupt_first: bool = False) -> tuple[int, bool, float]:
    """Run ``cmd`` with its output in ``log``; kill its process group after ``timeout_s``.

    With ``interrupt_first`` a SIGINT comes 30 s before the kill (pytest then still writes its
    report). Returns ``(returncode, timed_out, seconds)``.
    """
    import signal

    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=dict(env),
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=max(1.0, timeout_s - (30 if interrupt_first else 0)))
            return rc, False, time.monotonic() - t0
        except subprocess.TimeoutExpired:
            pass
        if interrupt_first:
            proc.send_signal(signal.SIGINT)
            try:
                rc = proc.wait(timeout=30)
                return rc, True, time.monotonic() - t0
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        return proc.wait(), True, time.monotonic() - t0


#: pytest's exit code when a run selected no test (the ``exclusive`` run over files that have none)
NO_TESTS_COLLECTED = 5


def files_with_exclusive_tests(files: Sequence[str]) -> list[str]:
    """The test files that mark some test ``exclusive`` (read from their source)."""
    return [f for f in files if "pytest.mark.exclusive" in (REPO / f).read_text(errors="replace")]


def run_tests(args, clock: Clock, logs: Path, before_exclusive: Callable[[], None] | None = None) -> dict:
    """The test files in two runs: everything not marked ``exclusive`` on ``--workers`` xdist
    workers, then the ``exclusive`` tests (they time against a clock) alone, one at a time.
    ``before_exclusive`` runs between the two (``--overlap``: it waits for the other parts, so
    nothing shares the GPU with the exclusive tests). A file with exclusive tests whose exclusive
    run did not happen is ``not_run``, never passed on its other tests alone."""
    files = [f for f in test_files() if not args.tests or f in args.tests or Path(f).name in args.tests]
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors"]
    if _importable("pytest_timeout"):
        base.append(f"--timeout={args.test_timeout}")
    have_xdist = _importable("xdist")
    workers = ["-n", str(args.workers)] if args.workers > 1 and have_xdist else []
    runs = [("tests", workers + ["-m", "not exclusive"]), ("tests_exclusive", ["-m", "exclusive"])]
    timeout = clock.left() - args.reserve_s
    if timeout < args.min_item_s:
        return {"seconds": 0.0, "files": {f: {"status": "not_run", "passed": 0, "failed": 0, "errors": 0, "skipped": 0,
                                              "seconds": 0.0, "error": "deadline reached before it started"}
                                          for f in files}}
    threads = str(max(1, (os.cpu_count() or 2) // max(1, args.workers)))
    part = {"command": " then ".join(" ".join(["pytest"] + base[3:] + extra + args.pytest_args + ["tests/..."])
                                     for _, extra in runs),
            "returncode": 0, "timed_out": False, "seconds": 0.0}
    reports, ran = [], set()
    for name, extra in runs:
        if name == "tests_exclusive" and before_exclusive is not None:
            before_exclusive()
        junit = logs / f"{name}.xml"
        junit.unlink(missing_ok=True)      # never read an earlier run's report
        left = clock.left() - args.reserve_s
        if left < args.min_item_s:
            part["timed_out"] = True
            break
        print(f"[gpu-check] {name}: {len(files)} files, {'-m ' + extra[-1]}, {left:.0f} s at most; "
              f"log {logs / (name + '.log')}", flush=True)
        cmd = base + [f"--junitxml={junit}"] + extra + args.pytest_args + files
        rc, timed_out, seconds = run_logged(cmd, log=logs / f"{name}.log", timeout_s=left, cwd=REPO,
                                            env=child_env({"OMP_NUM_THREADS": threads}), interrupt_first=True)
        part["seconds"] = round(part["seconds"] + seconds, 1)
        part["timed_out"] = part["timed_out"] or timed_out
        if rc not in (0, NO_TESTS_COLLECTED):
            part["returncode"] = part["returncode"] or rc
        ran.add(name)
        if junit.exists():
            reports.append(junit)
        elif rc != NO_TESTS_COLLECTED:
            part["files"] = {f: {"status": "not_run", "passed": 0, "failed": 0, "errors": 0, "skipped": 0,
                                 "seconds": 0.0, "error": f"pytest ({name}) wrote no report (exit {rc})"}
                             for f in files}
            return part
        tail = (logs / f"{name}.log").read_text(errors="replace").strip().splitlines()[-3:]
        print(f"[gpu-check] {name}: " + " | ".join(tail), flush=True)
    part["files"] = junit_by_file(reports, files) if reports else {
        f: {"status": "not_run", "passed": 0, "failed": 0, "errors": 0, "skipped": 0, "seconds": 0.0,
            "error": "no pytest report"} for f in files}
    if part["timed_out"]:
        for e in part["files"].values():
            if e["status"] in ("missing", "skipped"):
                e["status"], e["error"] = "not_run", "the test run hit its deadline"
    if "tests_exclusive" not in ran or part["timed_out"]:
        # not run, or cut short by the deadline: its files' other tests alone must not read as passed
        for f in files_with_exclusive_tests(files):
            part["files"][f].update(status="not_run", error="its exclusive tests did not all run (deadline)")
    return part


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def notebook_executor(choice: str) -> str:
    """'papermill' when papermill and the registered kernel are installed (or asked for), else 'runner'."""
    if choice != "auto":
        return choice
    if _importable("papermill") and _importable("jupyter_client"):
        from jupyter_client.kernelspec import KernelSpecManager

        if KERNEL_NAME in KernelSpecManager().find_kernel_specs():
            return "papermill"
    return "runner"


def run_one_notebook(name: str, args, executor: str, timeout: float, logs: Path, cut_by_deadline: bool) -> dict:
    """Run one notebook; a run stopped by the overall deadline (not by its own time limit) is ``not_run``."""
    path = REPO / "notebooks" / name
    log = logs / f"{Path(name).stem}.log"
    env = child_env(notebook=True)
    if executor == "papermill":
        out = logs / f"{Path(name).stem}.out.ipynb"
        cmd = [sys.executable, "-m", "papermill", "-k", KERNEL_NAME, "-p", "preset", args.preset,
               "--cwd", str(REPO / "notebooks"), "--no-progress-bar", str(path), str(out)]
        rc, timed_out, seconds = run_logged(cmd, log=log, timeout_s=timeout, cwd=REPO, env=env)
        error = None if rc == 0 else (f"timed out after {seconds:.0f} s" if timed_out else
                                      " ".join(log.read_text(errors="replace").strip().splitlines()[-1:])[:300])
        status = "passed" if rc == 0 else "not_run" if timed_out and cut_by_deadline else "failed"
        return {"status": status, "seconds": round(seconds, 1), "executor": executor, "error": error, "log": log.name}
    from minimax_lab.notebook.runner import run_notebook

    res = run_notebook(path, {"preset": args.preset}, cwd=REPO / "notebooks", timeout_s=timeout,
                       python=sys.executable, env=env, log_path=log)
    entry = {"status": "passed" if res.ok else "failed", "seconds": round(res.seconds, 1), "executor": executor,
             "error": None, "log": log.name, "code_cells_run": len(res.cells)}
    if not res.ok:
        e = res.error or {}
        entry["error"] = f"cell {e.get('index', '?')}: {e.get('type', '')}: {e.get('message', '')}"[:500]
        if e.get("type") == "TimeoutError" and cut_by_deadline:
            entry["status"] = "not_run"
        if e.get("traceback"):
            entry["traceback_tail"] = e["traceback"][-1500:]
    return entry


def run_notebooks(args, clock: Clock, logs: Path, save, quiet: threading.Event | None = None) -> dict:
    """Every notebook (or ``--notebooks``), ``--jobs`` at a time, then the :data:`ALONE_NOTEBOOKS`
    one by one once the others are done and ``quiet`` (if given: the rest of an ``--overlap`` run)
    is set."""
    names = [n for n in notebook_files() if not args.notebooks or n in args.notebooks or Path(n).stem in args.notebooks]
    if args.notebooks:  # in the order given (longest first keeps --jobs busy)
        given = [Path(n).stem for n in args.notebooks]
        names.sort(key=lambda n: given.index(Path(n).stem))
    alone = [n for n in names if Path(n).stem in ALONE_NOTEBOOKS]
    pooled = [n for n in names if n not in alone]
    executor = notebook_executor(args.executor)
    part = {"executor": "papermill (kernel minimax_lab)" if executor == "papermill" else "minimax_lab.notebook.runner",
            "preset": args.preset, "notebooks": {n: {"status": "not_run", "seconds": 0.0, "error": None} for n in names}}
    print(f"[gpu-check] notebooks: {len(names)} at preset {args.preset!r} with {part['executor']}, "
          f"{args.jobs} at a time; logs in {logs}", flush=True)

    def one(name):
        left = clock.left()
        if left < args.min_item_s:
            return name, {"status": "not_run", "seconds": 0.0, "error": "deadline reached before it started"}
        return name, run_one_notebook(name, args, executor, min(args.notebook_timeout, left), logs,
                                      cut_by_deadline=left < args.notebook_timeout)

    def done(name, entry):
        part["notebooks"][name] = entry
        print(f"[gpu-check]   {name:48s} {entry['status']:8s} {entry['seconds']:6.0f} s"
              + (f"  {entry['error']}" if entry.get("error") else ""), flush=True)
        save(part)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for name, entry in pool.map(one, pooled):
            done(name, entry)
    if alone and quiet is not None:
        print(f"[gpu-check] notebooks: {', '.join(alone)} wait to run alone", flush=True)
        quiet.wait()
    for name in alone:
        done(*one(name))
    return part


def _results_snapshot(exclude: Path) -> dict:
    d = REPO / "results"
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in d.glob("*") if p.is_file() and p != exclude}


def run_bench(args, clock: Clock, logs: Path, record_path: Path, save) -> dict:
    suites = [s for s in bench_suites() if not args.suites or s in args.suites]
    part = {"preset": args.bench_preset, "suites": {s: {"status": "not_run", "seconds": 0.0, "error": None}
                                                     for s in suites}}
    print(f"[gpu-check] bench smoke: {', '.join(suites)} at preset {args.bench_preset!r}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu_check_bench_") as tmp:
        tmp = Path(tmp)
        for suite in suites:
            left = clock.left()
            if left < args.min_item_s:
                part["suites"][suite]["error"] = "deadline reached before it started"
                continue
            before = _results_snapshot(record_path)
            out = tmp / f"bench_{suite}.json"
            cmd = [sys.executable, "-m", "minimax_lab.bench", suite, "--preset", args.bench_preset, "--out", str(out)]
            env = child_env({"MINIMAX_LAB_RESULTS": str(tmp / "results")})  # bench writes go to the temp folder
            rc, timed_out, seconds = run_logged(cmd, log=logs / f"bench_{suite}.log", cwd=tmp, env=env,
                                                timeout_s=min(args.bench_timeout, left))
            n = len(json.loads(out.read_text())) if out.exists() else 0
            changed = sorted(k for k, v in _results_snapshot(record_path).items() if before.get(k) != v)
            error = (f"timed out after {seconds:.0f} s" if timed_out else f"exit status {rc}" if rc else
                     "produced no records" if n == 0 else
                     f"wrote into results/: {changed}" if changed else None)
            if rc and not timed_out:
                lines = (logs / f"bench_{suite}.log").read_text(errors="replace").strip().splitlines()
                error += ": " + " | ".join(l for l in lines[-3:])[:400]
            status = "not_run" if timed_out and left < args.bench_timeout else "failed" if error else "passed"
            part["suites"][suite] = {"status": status, "seconds": round(seconds, 1),
                                     "records": n, "error": error, "log": f"bench_{suite}.log"}
            print(f"[gpu-check]   bench {suite:12s} {part['suites'][suite]['status']:8s} {seconds:6.0f} s  "
                  f"{n} records" + (f"  {error}" if error else ""), flush=True)
            save(part)
    return part


# --------------------------------------------------------------------------- command line


#: GPU memory each pytest worker may need at its peak (the largest tests -- FP8 experts at the
#: production shape, the engine at the GPU model size, two-process expert parallelism, chapter 00
#: inside the runner test -- ran out of memory with 12 workers on an 80 GB card and passed on 141 GB)
GIB_PER_WORKER = 10


def default_workers(cpus: int | None = None, gpu_gib: float | None = None) -> int:
    """pytest-xdist workers for this machine: half its CPUs, at most 8, and at most one per
    :data:`GIB_PER_WORKER` GiB of GPU memory (no GPU: no memory bound)."""
    cpus = cpus or os.cpu_count() or 2
    if gpu_gib is None:
        try:
            import torch

            gpu_gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else 0
        except Exception:  # noqa: BLE001 - no usable GPU: no memory bound
            gpu_gib = 0
    by_memory = int(gpu_gib // GIB_PER_WORKER) if gpu_gib else 8
    return max(1, min(8, cpus // 2, by_memory))


class _Parser(argparse.ArgumentParser):
    """argparse answering a mistake with one line on stderr and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; a mistake (an unknown part, test file, notebook or suite, a bad number)
    ends with one line on stderr and exit status 2, before anything runs."""
    ap = _Parser(prog="python3 tools/gpu_check.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(PARTS), help="comma list of parts: tests, notebooks, bench")
    ap.add_argument("--record", default=None, help="record file (default results/gpu_check_<device>.json)")
    ap.add_argument("--log-dir", default=None, help="where the logs go (default: a new temporary folder)")
    ap.add_argument("--deadline-s", type=float, default=540, help="start nothing new after this many seconds")
    ap.add_argument("--reserve-s", type=float, default=0,
                    help="tests: leave this many seconds of the deadline to the parts after them")
    ap.add_argument("--min-item-s", type=float, default=20, help="do not start an item with less time left")
    ap.add_argument("--workers", type=int, default=None,
                    help=f"pytest-xdist workers (default: half the CPUs, at most 8 and one per {GIB_PER_WORKER} GiB "
                         "of GPU memory)")
    ap.add_argument("--test-timeout", type=int, default=600, help="seconds per test (pytest-timeout)")
    ap.add_argument("--tests", nargs="*", default=[], help="only these test files (the record will say the rest is missing)")
    ap.add_argument("--pytest-args", nargs="*", default=[], help="more pytest arguments")
    ap.add_argument("--preset", default="gpu", help="notebook preset (gpu; 'cpu' for a dry run elsewhere)")
    ap.add_argument("--notebooks", nargs="*", default=[], help="only these notebooks, run in this order")
    ap.add_argument("--notebook-timeout", type=float, default=480, help="seconds per notebook")
    ap.add_argument("--jobs", type=int, default=1, help="notebooks run at the same time")
    ap.add_argument("--executor", choices=("auto", "papermill", "runner"), default="auto")
    ap.add_argument("--bench-preset", default="cpu", help="preset of the bench smoke (cpu: small cases)")
    ap.add_argument("--suites", nargs="*", default=[], help="only these bench suites")
    ap.add_argument("--bench-timeout", type=float, default=240, help="seconds per bench suite")
    ap.add_argument("--overlap", action="store_true",
                    help="run the notebooks at the same time as the parallel tests and the bench (then the "
                         "exclusive tests alone): one command instead of two, at the price of a shared GPU")
    args = ap.parse_args(argv)
    if args.workers is None:
        args.workers = default_workers()
    args.parts = [p.strip() for p in args.only.split(",") if p.strip()]
    bad = [p for p in args.parts if p not in PARTS]
    if bad or not args.parts:
        ap.error(f"--only takes a comma list of {', '.join(PARTS)}; got {args.only!r}")
    for name in ("deadline_s", "notebook_timeout", "bench_timeout", "workers", "test_timeout", "jobs"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.reserve_s < 0 or args.min_item_s < 0:
        ap.error("--reserve-s and --min-item-s cannot be negative")
    missing = [t for t in args.tests if not (REPO / t.split("::")[0]).exists()]
    if missing:
        ap.error(f"--tests: no such test file(s) {missing} (paths are relative to {REPO})")
    known = {Path(n).stem for n in notebook_files()}
    unknown = [n for n in args.notebooks if Path(n).stem not in known]
    if unknown:
        ap.error(f"--notebooks: unknown notebook(s) {unknown}; choose from {sorted(known)}")
    if args.suites:
        unknown = [s for s in args.suites if s not in bench_suites()]
        if unknown:
            ap.error(f"--suites: unknown suite(s) {unknown}; choose from {bench_suites()}")
    return args


def read_record(path: Path) -> dict | None:
    """The record at ``path`` (None: there is none); raises ``ValueError`` saying what is wrong
    with a file that is unreadable, not JSON or not a record."""
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise ValueError(f"{path} is unreadable ({type(e).__name__}: {e.strerror or e})") from None
    except ValueError as e:
        raise ValueError(f"{path} is not JSON ({e})") from None
    if not isinstance(record, dict) or not isinstance(record.get("parts", {}), dict):
        raise ValueError(f"{path} is not a gpu-check record (a JSON {type(record).__name__})")
    return record


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    clock = Clock(args.deadline_s)
    from minimax_lab import measure, runtime

    commit = measure.git_commit()
    if not commit:
        print("[gpu-check] no git metadata here: set MINIMAX_LAB_COMMIT=<the commit this tree is> and run again",
              file=sys.stderr)
        return 2
    describe = runtime.describe()
    record_path = Path(args.record) if args.record else REPO / "results" / f"gpu_check_{runtime.device_slug()}.json"
    try:
        old = read_record(record_path)
        logs = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="gpu_check_logs_"))
        logs.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as e:
        print(f"[gpu-check] error: {e}; move the file aside or pass --record / --log-dir", file=sys.stderr)
        return 2
    record = merge_into(old, new_record(commit, describe))
    print(f"[gpu-check] {describe['device']} · torch {describe['torch']} · triton {describe['triton']} · "
          f"python {describe['python']} · commit {commit} · parts {', '.join(args.parts)} · record {record_path}",
          flush=True)
    if describe.get("device_kind") != "cuda":
        print("[gpu-check] note: no CUDA GPU here -- this is a dry run of the check, not a GPU record", flush=True)

    before = dict(record["parts"])
    lock = threading.Lock()  # --overlap: two parts write the record

    def saver(part_name):
        def save(part):
            with lock:
                record["parts"][part_name] = merge_part(before.get(part_name), {**part, "complete": False},
                                                        part_name)
                write_record(record_path, record)
        return save

    def run_part(part_name, **kw):
        t0 = time.monotonic()
        if part_name == "tests":
            part = run_tests(args, clock, logs, **kw)
        elif part_name == "notebooks":
            part = run_notebooks(args, clock, logs, saver("notebooks"), **kw)
        else:
            part = run_bench(args, clock, logs, record_path, saver("bench"))
        part["seconds"] = round(time.monotonic() - t0, 1)
        part["complete"] = True
        with lock:
            record["parts"][part_name] = merge_part(before.get(part_name), part, part_name)
            write_record(record_path, record)

    t_all = time.monotonic()
    if args.overlap and "notebooks" in args.parts:
        quiet = threading.Event()  # set once the tests beside the notebooks and the bench are done
        notebooks = threading.Thread(target=run_part, args=("notebooks",), kwargs={"quiet": quiet},
                                     name="gpu-check-notebooks")
        notebooks.start()

        def rest_then_wait():
            if quiet.is_set():  # once: between the tests' two runs, or after them
                return
            try:
                if "bench" in args.parts:
                    run_part("bench")
            finally:
                quiet.set()
            notebooks.join()

        if "tests" in args.parts:
            run_part("tests", before_exclusive=rest_then_wait)
        rest_then_wait()  # also when the tests stopped (deadline) before their exclusive run
    else:
        for part_name in PARTS:
            if part_name in args.parts:
                run_part(part_name)
    what = dict(tests=test_files(), notebooks=notebook_files(), suites=bench_suites())
    mine = check_record(record, **what, parts=args.parts)
    others = [p for p in check_record(record, **what) if p not in mine]
    print("\n" + summary_table(record))
    print(f"\n[gpu-check] {time.monotonic() - t_all:.0f} s; record {record_path}; logs {logs}")
    absent = [p for p in mine if p.endswith(" is not in the record")]
    for p in (p for p in mine if p not in absent):
        print(f"[gpu-check] PROBLEM {p}")
    for part in ITEMS:
        names = [p.split(": ", 1)[1].removesuffix(" is not in the record") for p in absent if p.startswith(part + ":")]
        if names:
            print(f"[gpu-check] PROBLEM {part}: {len(names)} not in the record: {', '.join(names)}")
    if others:
        print(f"[gpu-check] outside this run, the record still lacks or fails {len(others)}: "
              f"{'; '.join(others[:3])}{' ...' if len(others) > 3 else ''}")
    return 1 if mine else 0


if __name__ == "__main__":
    sys.exit(main())
