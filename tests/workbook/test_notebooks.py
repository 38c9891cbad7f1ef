"""Every notebook follows the conventions and runs top to bottom at the CPU preset within budget."""
from __future__ import annotations

import copy
import importlib.util
import time

import pytest

from tests.support.notebook_rules import (KERNEL_NAME, MAX_CODE_LINES, MAX_PLUMBING_CELL_LINES, MAX_PROSE_WORDS,
                                         NOTEBOOK_DIR, budget_seconds, load, notebook_problems, notebooks,
                                         output_problems, reading_problems, seed_problems)

NOTEBOOKS = notebooks()
IDS = [p.stem for p in NOTEBOOKS]


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"


#: the whole workbook at the CPU preset, on 2 cores, in seconds: the sum of the notebooks' own
#: budgets (each enforced by test_notebook_executes_within_budget) stays under it
ALL_NOTEBOOKS_CPU_BUDGET_S = 780


def test_all_notebooks_fit_in_ten_minutes_on_the_cpu():
    budgets = {p.name: budget_seconds(load(p)) or 0 for p in NOTEBOOKS}
    assert sum(budgets.values()) <= ALL_NOTEBOOKS_CPU_BUDGET_S, budgets


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_has_navigation(path):
    """Opens with what it builds and assumes; ends with links to its neighbours and the package code."""
    nb = load(path)
    md = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
          for c in nb["cells"] if c["cell_type"] == "markdown"]
    head, tail = "\n".join(md[:2]), md[-1]
    assert "**What this chapter builds:**" in head and "**It assumes:**" in head, path.name
    i = NOTEBOOKS.index(path)
    if i > 0:
        assert f"({NOTEBOOKS[i - 1].name})" in tail and "**Previous:**" in tail, path.name
    if i < len(NOTEBOOKS) - 1:
        assert f"({NOTEBOOKS[i + 1].name})" in tail and "**Next:**" in tail, path.name
    assert "**Package code used here:**" in tail, path.name


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

    generic_kernel = copy.deepcopy(good)
    generic_kernel["metadata"]["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    assert any("kernelspec" in p for p in notebook_problems(generic_kernel))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_reads_as_a_lesson(path):
    """No commit hashes or project talk in prose, plot text and comments; no plumbing cell over the
    limit; prose and code within the chapter's reading budget."""
    problems = reading_problems(load(path))
    assert not problems, f"{path.name}:\n  " + "\n  ".join(problems)


def _markdown(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _code(text: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "source": text, "outputs": [], "execution_count": None}


def _broken(good: dict, *cells: dict) -> dict:
    nb = copy.deepcopy(good)
    nb["cells"] += list(cells)
    return nb


def _has(problems: list[str], fragment: str) -> bool:
    return any(fragment in p for p in problems)


def test_reading_rules_catch_breakage():
    """Each reading rule must be able to fail: break a good notebook one way at a time."""
    good = load(NOTEBOOKS[0])
    assert reading_problems(good) == []
    for text in ("measured at commit 580080a", "measured at 580080af7a8819796b2bb4ee65562e3addb5c35f",
                 "on a dirty tree (3f9c2e1-dirty)"):
        assert _has(reading_problems(_broken(good, _markdown(text))), "commit-hash-like"), text
    for text, word in (("Our targets were met", "Our targets"), ("target: ≥ 50% of the ceiling", "target: ≥"),
                       ("In the last session we measured it", "session"),
                       ("see results/notes_attention.md", "results/notes_"), ("tests/attention/test_msa.py", "tests/"),
                       ("run tools/nb.py", "tools/"), ("as `results/NVIDIA_H200.json` says", "results/NVIDIA_H200.json")):
        assert _has(reading_problems(_broken(good, _markdown(text))), repr(word)), text
    # words that look alike but speak of the subject pass
    for text in ("an agent session's next turn reuses its prefix", "the page hash a3f9c1d2e4b5 names its tokens",
                 "1.68e+07 FLOPs, e4m3 and bf16 at sm_90a"):
        assert reading_problems(_broken(good, _markdown(text))) == [], text
    assert _has(reading_problems(_broken(good, _code('ax.set_title("recorded at commit 62bf54e")'))), "plot text")
    assert _has(reading_problems(_broken(good, _code("x = 1  # numbers in results/notes_msa.md"))), "(comment)")
    assert _has(reading_problems(_broken(good, _code("label = live_vs_recorded.commits_label(recs)"))),
                "shows a record's commit")
    long_cell = "\n".join(f"x{i} = {i}" for i in range(MAX_PLUMBING_CELL_LINES + 1))
    assert _has(reading_problems(_broken(good, _code(long_cell))), "non-kernel cells")
    kernel_cell = "@triton.jit\ndef k(x):\n" + "\n".join(f"    y{i} = {i}" for i in range(MAX_PLUMBING_CELL_LINES))
    assert not _has(reading_problems(_broken(good, _code(kernel_cell))), "non-kernel cells")
    assert _has(reading_problems(_broken(good, _markdown("word " * MAX_PROSE_WORDS))), "words of prose")
    twenty = "\n".join(f"y{i} = {i}" for i in range(20))
    assert _has(reading_problems(_broken(good, *[_code(twenty)] * (MAX_CODE_LINES // 20 + 1))), "lines of code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_seeds_are_fixed(path):
    """A chapter draws its inputs from fixed seeds, so a run repeats and its checks cannot pass or fail by the clock."""
    problems = seed_problems(load(path))
    assert not problems, f"{path.name}: " + "; ".join(problems)


def test_seed_rule_catches_breakage():
    good = load(NOTEBOOKS[0])
    assert seed_problems(good) == []
    for line in ("g = torch.Generator().manual_seed(int(time.time()) % 2**31)", "seed = time.time_ns() % 1000",
                 "rng = np.random.default_rng(seed=int.from_bytes(os.urandom(4), 'little'))", "random.seed()"):
        assert seed_problems(_broken(good, _code(line))), line
    assert seed_problems(_broken(good, _code("# never seed = time.time()\nt0 = time.perf_counter()"))) == []


def test_output_rules_catch_breakage():
    """What a notebook prints is read too: hashes and project talk in any output kind fail."""
    def executed(*outputs):
        cell = _code("print(x)")
        cell["outputs"] = list(outputs)
        return {"cells": [cell]}

    assert output_problems(executed({"output_type": "stream", "name": "stdout", "text": "1.42x faster than SDPA\n"})) == []
    assert _has(output_problems(executed({"output_type": "stream", "name": "stdout", "text": ["recorded at ", "580080a\n"]})),
                "commit-hash-like")
    assert _has(output_problems(executed({"output_type": "display_data", "metadata": {},
                                          "data": {"text/markdown": "see `results/notes_moe.md`"}})), "results/notes_")
    assert _has(output_problems(executed({"output_type": "execute_result", "metadata": {}, "execution_count": 1,
                                          "data": {"text/plain": "'as this session found'"}})), "session")


TWINS = sorted(NOTEBOOK_DIR.glob("*.py"))


@pytest.mark.parametrize("twin", TWINS, ids=[p.stem for p in TWINS])
def test_py_twin_matches_its_notebook(twin):
    """A notebook's `.py` twin (the source `tools/nb.py build` reads) says exactly what the notebook says."""
    pytest.importorskip("nbformat")
    spec = importlib.util.spec_from_file_location("nb_tool", NOTEBOOK_DIR.parent / "tools" / "nb.py")
    nb_tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nb_tool)
    notebook = twin.with_suffix(".ipynb")
    assert notebook.exists(), f"{twin.name} has no notebook {notebook.name}"
    assert nb_tool.export(notebook) == twin.read_text(), (
        f"{twin.name} and {notebook.name} differ: rebuild with `python tools/nb.py build {twin.relative_to(NOTEBOOK_DIR.parent)} "
        f"{notebook.relative_to(NOTEBOOK_DIR.parent)}` (or export the notebook over the twin)")


def test_every_notebook_has_a_text_twin():
    """Every notebook has its `.py` twin (kept in step by the test above), so each reads and diffs
    as text; none is left without."""
    notebooks = sorted(p.stem for p in NOTEBOOK_DIR.glob("*.ipynb") if not p.name.endswith(".out.ipynb"))
    assert notebooks and notebooks == [p.stem for p in TWINS], "every notebook needs a .py twin (tools/nb.py export)"


def registered_kernel() -> str:
    """The registered "Python (minimax_lab)" Jupyter kernel's name; fails, saying what to do, without it."""
    from jupyter_client.kernelspec import KernelSpecManager  # deferred: Jupyter is optional (skipped without it)

    if KERNEL_NAME not in KernelSpecManager().find_kernel_specs():
        pytest.fail(f"the Jupyter kernel {KERNEL_NAME!r} the notebooks use is not registered for this Python: "
                    f"run `make setup` (it runs `python -m ipykernel install --sys-prefix --name {KERNEL_NAME}`)")
    return KERNEL_NAME


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_executes_within_budget(path, tmp_path, monkeypatch):
    papermill = pytest.importorskip("papermill")
    kernel = registered_kernel()
    budget = budget_seconds(load(path))
    assert budget, f"{path.name} has no cpu_budget_s"
    monkeypatch.setenv("MINIMAX_LAB_STATIC", "1")  # widgets draw statically: no frontend here
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("TQDM_MININTERVAL", "5")
    t0 = time.perf_counter()
    papermill.execute_notebook(
        str(path), str(tmp_path / path.name), parameters={"preset": "cpu"}, kernel_name=kernel,
        cwd=str(NOTEBOOK_DIR), progress_bar=False, execution_timeout=budget + 60,
    )
    elapsed = time.perf_counter() - t0
    problems = output_problems(load(tmp_path / path.name))
    assert not problems, f"{path.name} prints what a learner should not read:\n  " + "\n  ".join(problems)
    assert elapsed <= budget, f"{path.name} took {elapsed:.0f} s, over its CPU budget of {budget} s"
