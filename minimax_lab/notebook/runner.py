"""Run a notebook's code cells top to bottom without Jupyter, the way papermill would.

For machines that have Python and the workbook but no Jupyter packages (a GPU server with no
network, say)::

    python -m minimax_lab.notebook.runner notebooks/02_flash_attention_in_triton.ipynb -p preset gpu

What it does, in a fresh process (:func:`run_notebook` starts one; the command line *is* one):

* reads the ``.ipynb`` file with the :mod:`json` module (no ``nbformat`` needed);
* injects ``-p NAME VALUE`` parameters as papermill does: a new cell right after the cell tagged
  ``parameters`` (at the top if there is none), so the values override the defaults. Values are
  typed like papermill's ``-p``: ``True``/``False``/``None``, integers and floats, else strings;
* runs every code cell in order in one namespace that is a fresh ``__main__`` module, with the
  working directory set to the notebook's folder and matplotlib on its ``Agg`` backend
  (figures are closed after each cell, as Jupyter's inline backend does). A cell whose last
  statement is an expression prints its value, as Jupyter would display it;
* skips IPython syntax that plain Python cannot run: line magics (``%matplotlib inline``) and
  shell lines (``!pip install ...``) become ``pass`` (``%time STATEMENT`` runs the statement);
  a cell magic runs the cell's body for ``%%time`` and ``%%capture`` and skips the cell
  otherwise. Each is reported;
* provides a small stand-in for ``IPython.display`` (``display``, ``Markdown``, ``HTML``) when
  IPython is not installed, printing what a notebook would show; ``display`` and ``get_ipython``
  (which returns None: no frontend) are predefined, as in a Jupyter kernel;
* stops at the first error and reports the cell's index in the notebook (0-based, counting
  markdown cells; ``-1`` for the injected parameters), its first line and the traceback.

The notebook's namespace is a new ``__main__`` module without a file, as in Jupyter: processes
started with multiprocessing's ``spawn`` import only the module of their target function,
never re-run the notebook. Exit status: 0 when every cell ran, 1 when a cell raised, 2 for a
bad command line or an unreadable notebook.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import dataclasses
import json
import linecache
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path
from typing import Any, Mapping, Sequence

INJECTED_TAG = "injected-parameters"
_CELL_MAGICS_RUN_BODY = ("time", "capture")
_TIME_MAGIC = re.compile(r"^%time\s+(\S.*)$")
_MAGIC_LINE = re.compile(r"^(\s*)([%!](?!=).*)$")


# --------------------------------------------------------------------------- reading and preparing


def load_notebook(path: str | os.PathLike) -> dict:
    """The notebook as a dict; raises ``ValueError`` if the file is not a notebook (nbformat 4)."""
    path = Path(path)
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read notebook {path}: {e}") from e
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list) or nb.get("nbformat") != 4:
        raise ValueError(f"{path} is not an nbformat-4 notebook (expected a JSON object with 'cells')")
    return nb


def cell_source(cell: Mapping) -> str:
    """A cell's source as one string (notebooks store it as a string or a list of lines)."""
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def parse_value(text: str) -> Any:
    """Type a command-line parameter value as papermill's ``-p`` does."""
    if text in ("True", "False"):
        return text == "True"
    if text == "None":
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parameters_source(parameters: Mapping[str, Any]) -> str:
    """The injected cell's code: one ``name = repr(value)`` line per parameter."""
    for name in parameters:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"parameter names must be Python identifiers, got {name!r}")
    return "# Parameters\n" + "".join(f"{k} = {v!r}\n" for k, v in parameters.items())


@dataclasses.dataclass
class CodeCell:
    index: int          # position in the notebook's cell list (-1: injected parameters)
    source: str         # what will be executed (magics already replaced)
    skipped: list[str]  # IPython lines or cell magics that were not run


def strip_magics(source: str) -> tuple[str | None, list[str]]:
    """Replace IPython-only lines by ``pass``; returns ``(code or None to skip the cell, skipped)``.

    A cell that already parses as Python is returned unchanged (so ``!=`` or ``%`` at the start of
    a continuation line is never mistaken for IPython syntax).
    """
    lines = source.splitlines()
    first = lines[0].strip() if lines else ""
    skipped = []
    if first.startswith("%%"):
        name = first[2:].split()[0] if len(first) > 2 else ""
        if name not in _CELL_MAGICS_RUN_BODY:
            return None, [first]
        source, skipped = "\n".join(lines[1:]), [f"{first} (its body ran)"]
    try:
        ast.parse(source)
        return source, skipped
    except SyntaxError:
        pass
    out = []
    for line in source.splitlines():
        m = _MAGIC_LINE.match(line)
        if m and not _inside_string_guess(out):
            timed = _TIME_MAGIC.match(m.group(2))
            if timed:  # %time STATEMENT: run the statement
                out.append(m.group(1) + timed.group(1))
                skipped.append(f"{m.group(2).strip()} (the statement ran)")
            else:
                out.append(f"{m.group(1)}pass  # skipped IPython line: {m.group(2)[:60]}")
                skipped.append(m.group(2).strip())
        else:
            out.append(line)
    return "\n".join(out), skipped


def _inside_string_guess(previous_lines: list[str]) -> bool:
    """True when the lines so far leave a triple-quoted string open (a ``%`` line there is text)."""
    text = "\n".join(previous_lines)
    return (text.count('"""') % 2 == 1) or (text.count("'''") % 2 == 1)


def code_cells(nb: dict, parameters: Mapping[str, Any] | None = None) -> list[CodeCell]:
    """The cells to run, in order, with the parameters injected after the ``parameters`` cell."""
    cells = []
    for i, c in enumerate(nb["cells"]):
        if c.get("cell_type") != "code" or INJECTED_TAG in c.get("metadata", {}).get("tags", []):
            continue
        src, skipped = strip_magics(cell_source(c))
        if src is None:
            cells.append(CodeCell(i, "", skipped))
            continue
        cells.append(CodeCell(i, src, skipped))
        if parameters and "parameters" in c.get("metadata", {}).get("tags", []):
            cells.append(CodeCell(-1, parameters_source(parameters), []))
    if parameters and not any(c.index == -1 for c in cells):
        cells.insert(0, CodeCell(-1, parameters_source(parameters), []))
    return cells


# --------------------------------------------------------------------------- executing (in this process)


def _install_ipython_display_standin() -> None:
    """``IPython.display`` with ``display``/``Markdown``/``HTML`` that print, if IPython is absent."""
    try:
        import IPython.display  # noqa: F401  (deferred: IPython is optional; the GPU image has none)
        return
    except ImportError:
        pass

    class _Text:
        def __init__(self, data: str = "", **_: Any):
            self.data = data

        def __repr__(self) -> str:
            return str(self.data)

    def display(*objs: Any, **_: Any) -> None:
        for o in objs:
            md = getattr(o, "_repr_markdown_", None)
            print(md() if callable(md) else repr(o))

    ipy = types.ModuleType("IPython")
    disp = types.ModuleType("IPython.display")
    disp.display, disp.Markdown, disp.HTML = display, type("Markdown", (_Text,), {}), type("HTML", (_Text,), {})
    ipy.display, ipy.get_ipython = disp, lambda: None
    # matplotlib reads IPython.version_info whenever IPython is in sys.modules (to patch the GUI
    # backend table of IPython < 8.24); a stand-in without it breaks every plt.figure().
    ipy.version_info = (8, 24, 0, "minimax_lab stand-in")
    sys.modules["IPython"], sys.modules["IPython.display"] = ipy, disp


def _close_figures() -> int:
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return 0
    n = len(plt.get_fignums())
    plt.close("all")
    return n


def _cell_traceback(e: BaseException) -> str:
    """The traceback from the notebook's own frame on (the runner's frames left out)."""
    tb = e.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb or e.__traceback__))


def _run_cell(cell: CodeCell, namespace: dict) -> None:
    """Execute one cell; a trailing expression's value is printed (Jupyter's display of it)."""
    filename = f"<cell {cell.index}>"
    linecache.cache[filename] = (len(cell.source), None, cell.source.splitlines(True), filename)
    tree = ast.parse(cell.source, filename=filename)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, filename, "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), filename, "eval"), namespace)
        if value is not None:
            print(repr(value))


def execute(path: Path, parameters: Mapping[str, Any] | None = None, *, cwd: Path | None = None,
            stream=None) -> dict:
    """Run the notebook in *this* process (it becomes the notebook's kernel); returns the report.

    The report: ``ok``, ``seconds``, ``cells`` (one ``{index, seconds, figures}`` per cell run),
    ``skipped`` (IPython lines not run) and, on failure, ``error`` = ``{index, first_line,
    type, message, traceback}``.
    """
    stream = stream or sys.stdout
    nb = load_notebook(path)
    cells = code_cells(nb, parameters)
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("MINIMAX_LAB_STATIC", "1")   # widgets: draw once, no frontend here
    os.chdir(cwd or path.resolve().parent)
    sys.argv = [str(path)]
    _install_ipython_display_standin()
    main = types.ModuleType("__main__", doc=f"namespace of {path.name}")
    main.__dict__["__builtins__"] = builtins
    from IPython.display import display  # deferred: the real one, or the stand-in installed above

    main.__dict__.update(display=display, get_ipython=lambda: None)  # names a Jupyter kernel predefines
    sys.modules["__main__"] = main
    report: dict = {"notebook": str(path), "parameters": dict(parameters or {}), "cells": [], "skipped": [],
                    "ok": True, "error": None}
    t_start = time.perf_counter()
    for n, cell in enumerate(cells):
        report["skipped"] += [f"cell {cell.index}: {s}" for s in cell.skipped]
        if not cell.source.strip():
            continue
        print(f"--- [{n + 1}/{len(cells)}] cell {cell.index}", file=stream, flush=True)
        t0 = time.perf_counter()
        try:
            _run_cell(cell, main.__dict__)
        except BaseException as e:  # noqa: BLE001 - a notebook may raise anything, SystemExit included
            first = next((l for l in cell.source.splitlines() if l.strip()), "")
            report["ok"] = False
            report["error"] = {"index": cell.index, "first_line": first[:120], "type": type(e).__name__,
                               "message": str(e)[:2000], "traceback": _cell_traceback(e)[-8000:]}
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        report["cells"].append({"index": cell.index, "seconds": round(time.perf_counter() - t0, 3),
                                "figures": _close_figures()})
        if not report["ok"]:
            break
    report["seconds"] = round(time.perf_counter() - t_start, 3)
    return report


# --------------------------------------------------------------------------- a fresh process per notebook


@dataclasses.dataclass
class NotebookResult:
    """What :func:`run_notebook` found: ``ok``, ``seconds``, the failing cell (if any), the log."""

    notebook: str
    ok: bool
    seconds: float
    returncode: int
    error: dict | None
    cells: list
    skipped: list
    log: str

    def summary(self) -> str:
        name = Path(self.notebook).name
        if self.ok:
            return f"{name}: ok in {self.seconds:.0f} s ({len(self.cells)} code cells)"
        e = self.error or {}
        where = f"cell {e['index']}" if "index" in e else "the runner"
        return (f"{name}: FAILED at {where} after {self.seconds:.0f} s: {e.get('type', '')}: "
                f"{e.get('message', '')}"[:600])


def _package_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


def run_notebook(path: str | os.PathLike, parameters: Mapping[str, Any] | None = None, *,
                 cwd: str | os.PathLike | None = None, timeout_s: float | None = None,
                 python: str | None = None, env: Mapping[str, str] | None = None,
                 log_path: str | os.PathLike | None = None) -> NotebookResult:
    """Run a notebook in a fresh Python process (``python``, default this one); never hangs.

    ``cwd`` defaults to the notebook's folder. The child's output goes to ``log_path`` (or a
    temporary file) and is returned in ``.log``. After ``timeout_s`` the child and everything it
    started are killed and the result says so. Raises ``ValueError`` for a missing notebook.
    """
    path = Path(path).resolve()
    if not path.is_file():
        raise ValueError(f"no notebook at {path}")
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("MPLBACKEND", "Agg")
    child_env.setdefault("MINIMAX_LAB_STATIC", "1")
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), child_env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="nbrun_") as tmp:
        report_file = Path(tmp) / "report.json"
        log_file = Path(log_path) if log_path else Path(tmp) / "log.txt"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        cmd = [python or sys.executable, "-m", "minimax_lab.notebook.runner", str(path), "--report", str(report_file)]
        cmd += ["--cwd", str(Path(cwd).resolve() if cwd else path.parent)]
        for k, v in (parameters or {}).items():
            cmd += ["--json-param", k, json.dumps(v)]
        t0 = time.perf_counter()
        with open(log_file, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, cwd=tmp,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                rc, timed_out = proc.wait(), True
        seconds = time.perf_counter() - t0
        text = log_file.read_text(errors="replace")
        report = json.loads(report_file.read_text()) if report_file.exists() else None
    if timed_out:
        started = re.findall(r"^--- \[\d+/\d+\] cell (-?\d+)$", text, re.M)
        where = {"index": int(started[-1])} if started else {}
        error = {**where, "type": "TimeoutError",
                 "message": f"killed after {timeout_s:.0f} s" + (f", in cell {started[-1]}" if started else "")}
        return NotebookResult(str(path), False, seconds, rc, error, [], [], text)
    if report is None:
        error = {"type": "RunnerDied", "message": f"the notebook process exited with {rc} before reporting; "
                                                  f"log tail: {text[-1500:]}"}
        return NotebookResult(str(path), False, seconds, rc, error, [], [], text)
    return NotebookResult(str(path), bool(report["ok"]) and rc == 0, seconds, rc, report["error"], report["cells"],
                          report["skipped"], text)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minimax_lab.notebook.runner",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("notebook")
    ap.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                    help="set a parameter (typed as papermill types -p values)")
    ap.add_argument("--json-param", nargs=2, action="append", default=[], metavar=("NAME", "JSON"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--cwd", default=None, help="working directory (default: the notebook's folder)")
    ap.add_argument("--report", default=None, help="write the JSON report here")
    args = ap.parse_args(argv)
    params = {k: parse_value(v) for k, v in args.parameter}
    params.update({k: json.loads(v) for k, v in args.json_param})
    path = Path(args.notebook).resolve()
    try:
        report = execute(path, params, cwd=Path(args.cwd) if args.cwd else None)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=1))
    if report["ok"]:
        print(f"=== {path.name}: all {len(report['cells'])} code cells ran in {report['seconds']:.1f} s", flush=True)
    else:
        e = report["error"]
        print(f"=== {path.name}: FAILED at cell {e['index']} ({e['first_line']!r})\n{e['traceback']}",
              file=sys.stderr, flush=True)
    for s in report["skipped"]:
        print(f"    skipped {s}", flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":  # guarded: spawned children re-import this module, and must not re-run it
    sys.exit(main())
