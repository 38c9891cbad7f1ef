"""The README keeps its promises: the two commands come first and every notebook has a Colab badge."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def readme_problems(text: str, notebook_stems: list[str], make_targets: set[str]) -> list[str]:
    """What is wrong with a README ``text`` (empty when nothing is)."""
    problems = []
    first_block = re.search(r"```(?:bash)?\n(.*?)```", text, re.S)
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()] if first_block else []
    for want in ("make lab", "make test"):
        if want not in commands:
            problems.append(f"the first code block does not give `{want}`")
        elif want.split()[1] not in make_targets:
            problems.append(f"`{want}` is not a Makefile target")
    for stem in notebook_stems:
        url = f"https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/{stem}.ipynb"
        if url not in text:
            problems.append(f"no Colab badge for {stem}")
    return problems


def _targets() -> set[str]:
    return set(re.findall(r"^([a-z]+):", (ROOT / "Makefile").read_text(), re.M))


def test_readme_gives_both_commands_and_a_badge_per_notebook():
    stems = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert readme_problems(README.read_text(), stems, _targets()) == []


def test_readme_checker_can_fail():
    text = README.read_text()
    assert readme_problems(text.replace("make lab", "make open"), [], _targets())
    assert readme_problems(text, ["99_not_a_notebook"], _targets())
    assert readme_problems(text, [], {"test"})


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
