"""The notebook runner (`python -m minimax_lab.notebook.runner`), which executes the notebooks on
machines without Jupyter: parameters injected as papermill does, IPython lines skipped, the
first error reported with its cell index, spawn-safe, never hangs."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from minimax_lab.notebook.runner import code_cells, parse_value, run_notebook, strip_magics

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"


def write_notebook(path: Path, cells: list[tuple[str, str]]) -> Path:
    """cells: (kind, source) with kind "markdown", "code" or "parameters" (a tagged code cell)."""
    def cell(kind, src):
        if kind == "markdown":
            return {"cell_type": "markdown", "metadata": {}, "source": src}
        meta = {"tags": ["parameters"]} if kind == "parameters" else {}
        return {"cell_type": "code", "metadata": meta, "source": src.splitlines(True), "outputs": [],
                "execution_count": None}
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                                "cells": [cell(k, s) for k, s in cells]}))
    return path


def test_parameters_are_typed_and_injected_after_the_parameters_cell(tmp_path):
    assert [parse_value(v) for v in ("3", "2.5", "True", "None", "gpu")] == [3, 2.5, True, None, "gpu"]
    nb = json.loads(write_notebook(tmp_path / "a.ipynb", [
        ("markdown", "# t"), ("code", "x = 1"), ("parameters", "preset = 'auto'"), ("code", "y = 2")]).read_text())
    cells = code_cells(nb, {"preset": "cpu", "steps": 3})
    assert [c.index for c in cells] == [1, 2, -1, 3]
    assert "preset = 'cpu'" in cells[2].source and "steps = 3" in cells[2].source
    no_param_cell = json.loads(write_notebook(tmp_path / "b.ipynb", [("code", "x = 1")]).read_text())
    assert [c.index for c in code_cells(no_param_cell, {"n": 1})] == [-1, 0]
    with pytest.raises(ValueError, match="identifier"):
        code_cells(nb, {"not a name": 1})


def test_ipython_lines_are_skipped_but_python_is_never_touched():
    code, skipped = strip_magics("%matplotlib inline\n!pip install x\nif True:\n    %time y = 2\nz = 3")
    assert "pass" in code and "y = 2" in code and "z = 3" in code
    assert skipped == ["%matplotlib inline", "!pip install x", "%time y = 2 (the statement ran)"]
    python = "a = (1\n     != 2)\nb = (7\n     % 3)"
    assert strip_magics(python) == (python, [])
    assert strip_magics("%%bash\necho hi")[0] is None
    assert strip_magics("%%time\nx = 1") == ("x = 1", ["%%time (its body ran)"])


def test_runs_in_order_and_reports_the_first_error_with_its_cell_index(tmp_path):
    nb = write_notebook(tmp_path / "nb.ipynb", [
        ("markdown", "# a notebook"),
        ("code", "%matplotlib inline\nimport os\nimport matplotlib.pyplot as plt"),
        ("parameters", "preset = 'auto'\nsteps = 1"),
        ("code", "print('preset', preset, 'steps', steps * 10)\nplt.plot([1, 2]); plt.show()\nos.getcwd()"),
        ("code", "%%bash\nexit 1"),
        ("code", "def boom():\n    raise ValueError('cell five fails')\n\nboom()"),
        ("code", "print('NEVER RUNS')"),
    ])
    res = run_notebook(nb, {"preset": "cpu", "steps": 4}, timeout_s=120)
    assert not res.ok and res.returncode == 1
    assert res.error["index"] == 5 and res.error["type"] == "ValueError"
    assert "cell five fails" in res.error["message"] and "<cell 5>" in res.error["traceback"]
    assert "preset cpu steps 40" in res.log                # injected, typed, after the parameters cell
    assert repr(str(tmp_path)) in res.log                  # cwd is the notebook's folder; last value shown
    assert "NEVER RUNS" not in res.log                     # stops at the first error
    assert [c["index"] for c in res.cells] == [1, 2, -1, 3, 5]
    assert res.cells[3]["figures"] == 1
    assert any("%%bash" in s for s in res.skipped) and any("%matplotlib" in s for s in res.skipped)


def test_a_notebook_that_passes_and_one_that_spawns_processes(tmp_path):
    nb = write_notebook(tmp_path / "ok.ipynb", [
        ("parameters", "preset = 'auto'"),
        ("code", "import multiprocessing as mp, math\n"
                 "with mp.get_context('spawn').Pool(2) as pool:\n"
                 "    roots = pool.map(math.sqrt, [4.0, 9.0])\n"
                 "print('roots', roots, __name__)"),
    ])
    res = run_notebook(nb, {"preset": "cpu"}, timeout_s=120)
    assert res.ok, res.summary() + res.log
    assert "roots [2.0, 3.0] __main__" in res.log
    assert res.log.count("roots") == 1                     # the spawned children did not re-run the notebook


def test_ipython_display_stand_in_when_ipython_is_missing(tmp_path):
    blocker = tmp_path / "blocker" / "IPython"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('IPython is not installed here')\n")
    nb = write_notebook(tmp_path / "md.ipynb", [
        ("code", "from IPython.display import Markdown\ndisplay(Markdown('| a | b |'))\nassert get_ipython() is None"),
        # matplotlib consults the IPython module it finds in sys.modules on every new figure
        ("code", "import matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()")])
    import os

    env = {**os.environ, "PYTHONPATH": str(blocker.parent)}
    res = run_notebook(nb, timeout_s=120, env=env)
    assert res.ok, res.log
    assert "| a | b |" in res.log


def test_a_hanging_notebook_is_killed_at_its_timeout(tmp_path):
    nb = write_notebook(tmp_path / "hang.ipynb", [("code", "print('started', flush=True)"),
                                                  ("code", "import time\ntime.sleep(600)")])
    t0 = time.perf_counter()
    res = run_notebook(nb, timeout_s=8)
    assert time.perf_counter() - t0 < 60
    assert not res.ok and res.error["type"] == "TimeoutError" and res.error["index"] == 1
    assert "started" in res.log


def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no notebook"):
        run_notebook(tmp_path / "missing.ipynb")
    (tmp_path / "x.ipynb").write_text("{}")
    res = run_notebook(tmp_path / "x.ipynb", timeout_s=60)
    assert not res.ok and "nbformat-4" in res.log


@pytest.mark.notebook
def test_runs_a_workbook_notebook_at_the_cpu_preset():
    """The runner is what executes the notebooks on a GPU machine without Jupyter: a real one must pass."""
    path = NOTEBOOK_DIR / "00_roofline_and_honest_benchmarks.ipynb"
    res = run_notebook(path, {"preset": "cpu"}, timeout_s=600)
    assert res.ok, res.summary() + "\n" + res.log[-3000:]
    assert sum(c["figures"] for c in res.cells) >= 2
