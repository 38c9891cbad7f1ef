"""The exercises: every solution passes its checker, every untouched stub fails it, each chapter
that has exercises has at least three, and the notebook shows the very stub that is checked."""
from __future__ import annotations

import inspect
import json

import pytest

from minimax_lab import exercises
from tests.support.notebook_rules import NOTEBOOK_DIR

ALL = exercises.all_exercises()
KEYS = [e.key for e in ALL]


def _notebook_text(chapter: str) -> str:
    (path,) = NOTEBOOK_DIR.glob(f"{chapter}_*.ipynb")
    nb = json.loads(path.read_text())
    return "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                     for c in nb["cells"] if c["cell_type"] == "code")


@pytest.mark.parametrize("key", KEYS)
def test_solution_passes_its_checker(key):
    ex = exercises.get(key)
    v = exercises.verdict(key, ex.solution())
    assert v.passed, str(v)


@pytest.mark.parametrize("key", KEYS)
def test_untouched_stub_fails_its_checker(key):
    v = exercises.verdict(key, exercises.get(key).stub)
    assert not v.passed and v.problems, f"{key}: the untouched stub passed its checker"


@pytest.mark.parametrize("key", KEYS)
def test_the_notebook_shows_the_checked_stub_and_checks_it(key):
    ex = exercises.get(key)
    text = _notebook_text(ex.chapter)
    stub = inspect.getsource(ex.stub).strip()
    assert stub in text, f"notebook {ex.chapter} does not show the stub of {key} exactly as the checker's module has it"
    assert f'exercises.check("{key}"' in text, f"notebook {ex.chapter} never calls exercises.check(\"{key}\", ...)"


def test_each_chapter_with_exercises_has_at_least_three():
    chapters = {e.chapter for e in ALL}
    for ch in chapters:
        assert len(exercises.all_exercises(ch)) >= 3, f"chapter {ch} has fewer than 3 exercises"


def test_check_reports_instead_of_raising(capsys):
    """A learner's exception is a problem in the verdict, not a crash of the notebook; a bad key or
    a non-function is the caller's error."""
    if not ALL:
        pytest.skip("no exercises registered")
    ex = ALL[0]

    def broken(*args, **kwargs):
        raise ZeroDivisionError("oops")

    v = exercises.verdict(ex.key, broken)
    assert not v.passed and any("ZeroDivisionError" in p for p in v.problems)
    exercises.check(ex.key, ex.stub)
    assert "not yet" in capsys.readouterr().out
    with pytest.raises(KeyError, match="no exercise"):
        exercises.get("99.9")
    with pytest.raises(TypeError, match="checks a function"):
        exercises.verdict(ex.key, 42)


def test_registry_rejects_bad_keys():
    with pytest.raises(ValueError, match="must look like"):
        exercises.exercise("2.1", "t", "task", lambda: None)
