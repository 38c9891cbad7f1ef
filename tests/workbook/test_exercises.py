"""The exercises: every solution passes its checker, every untouched stub fails it, each chapter
that has exercises has at least three, the notebook shows the very stub that is checked, and every
kernel chapter asks the learner to write Triton, with a checker that a PyTorch answer cannot pass."""
from __future__ import annotations

import importlib
import inspect
import json

import pytest

import torch

from minimax_lab import exercises, runtime
from tests.support.devices import fresh_seed
from tests.support.notebook_rules import NOTEBOOK_DIR

ALL = exercises.all_exercises()
KEYS = [e.key for e in ALL]
TRITON_KEYS = [e.key for e in ALL if e.writes_triton]
#: the chapters that build kernels, each of which has at least one exercise where the learner writes
#: Triton; a group of two (the sparse-attention idea and its kernels) needs one between them
KERNEL_CHAPTERS = (("00",), ("01",), ("02",), ("03", "04"), ("05",), ("06",), ("09",))


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


@pytest.mark.parametrize("chapters", KERNEL_CHAPTERS, ids=["/".join(c) for c in KERNEL_CHAPTERS])
def test_every_kernel_chapter_has_the_learner_write_triton(chapters):
    found = [e.key for ch in chapters for e in exercises.all_exercises(ch) if e.writes_triton]
    assert found, (f"chapter {' or '.join(chapters)} has no exercise registered with writes_triton=True: a kernel "
                   f"chapter needs one where the learner writes a @triton.jit kernel")


def _torch_twin(ex: exercises.Exercise):
    """The pure-PyTorch answer beside the solution: ``solutions.ch<NN>.<stub name>_torch``."""
    module = importlib.import_module(f"minimax_lab.exercises.solutions.ch{ex.chapter}")
    name = f"{ex.stub.__name__}_torch"
    twin = getattr(module, name, None)
    assert twin is not None, (f"{ex.key} writes Triton, so solutions/ch{ex.chapter}.py needs {name}: the same numbers "
                              f"in PyTorch, which the checker must refuse")
    return twin


@pytest.mark.parametrize("key", TRITON_KEYS)
def test_triton_exercise_refuses_a_pytorch_answer(key):
    """A Triton exercise's checker fails the PyTorch twin of its solution, saying that no kernel ran; the
    solution itself (which passes) launches a kernel."""
    ex = exercises.get(key)
    v = exercises.verdict(key, _torch_twin(ex))
    assert not v.passed, f"{key}: the checker passed a PyTorch answer that launched no Triton kernel"
    assert exercises.NO_TRITON in v.problems, f"{key}: the checker refused the PyTorch answer for another reason: {v.problems}"
    with exercises.triton_launches() as launched:
        assert exercises.verdict(key, ex.solution()).passed
    assert launched["count"] > 0


def test_triton_launches_counts_kernels_and_only_kernels():
    """The counter the Triton checkers rely on sees an interpreted or compiled launch, and nothing else."""
    ex = exercises.get("02.4")
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(fresh_seed())).to(runtime.kernel_device())
    with exercises.triton_launches() as launched:
        torch.softmax(x, -1)
    assert launched["count"] == 0
    with exercises.triton_launches() as launched:
        ex.solution()(x)
    assert launched["count"] == 1
