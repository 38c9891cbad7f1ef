"""Every notebook follows the conventions and runs top to bottom at the CPU preset within budget."""
from __future__ import annotations

import copy
import os
import time

import pytest

from notebook_rules import NOTEBOOK_DIR, budget_seconds, load, notebook_problems, notebooks

NOTEBOOKS = notebooks()
IDS = [p.stem for p in NOTEBOOKS]


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_conventions(path):
    problems = notebook_problems(load(path))
    assert not problems, f"{path.name}: " + "; ".join(problems)


def test_convention_checker_catches_breakage():
    """Each rule must be able to fail: break a good notebook one way at a time."""
    good = load(NOTEBOOKS[0])
    assert notebook_problems(good) == []
    code_idx = [i for i, c in enumerate(good["cells"]) if c["cell_type"] == "code"]

    with_output = copy.deepcopy(good)
    with_output["cells"][code_idx[-1]]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "x"}]
    assert "has stored outputs" in notebook_problems(with_output)

    no_params = copy.deepcopy(good)
    for c in no_params["cells"]:
        c.get("metadata", {}).pop("tags", None)
    assert any("parameters" in p for p in notebook_problems(no_params))

    no_budget = copy.deepcopy(good)
    no_budget["metadata"].pop("minimax_lab", None)
    assert any("cpu_budget_s" in p for p in notebook_problems(no_budget))


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_executes_within_budget(path, tmp_path, monkeypatch):
    papermill = pytest.importorskip("papermill")
    budget = budget_seconds(load(path))
    assert budget, f"{path.name} has no cpu_budget_s"
    monkeypatch.setenv("MINIMAX_LAB_STATIC", "1")  # widgets draw statically: no frontend here
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("TQDM_MININTERVAL", "5")
    t0 = time.perf_counter()
    papermill.execute_notebook(
        str(path), str(tmp_path / path.name), parameters={"preset": "cpu"}, kernel_name="python3",
        cwd=str(NOTEBOOK_DIR), progress_bar=False, execution_timeout=budget + 60,
    )
    elapsed = time.perf_counter() - t0
    assert elapsed <= budget, f"{path.name} took {elapsed:.0f} s, over its CPU budget of {budget} s"
