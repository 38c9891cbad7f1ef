"""A test run writes nothing into the checkout: ``tests/conftest.py`` fails a run that leaves a new
untracked file there (:mod:`tests.support.checkout`), and hypothesis keeps its files elsewhere."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from hypothesis import configuration, given
from hypothesis import strategies as st

from tests.support import checkout

REPO = checkout.ROOT


def test_the_listing_leaves_out_git_bytecode_and_virtual_environments(tmp_path):
    for path in ("a.txt", "results/r.json", ".git/HEAD", "pkg/__pycache__/m.cpython-311.pyc", "pkg/old.pyc",
                 "env/pyvenv.cfg", "env/lib/x.py", ".pytest_cache/v/x", "notebooks/01.out.ipynb",
                 "worktree/.git", "worktree/README.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x")
    assert checkout.files_in(tmp_path) == {"a.txt", "results/r.json", "notebooks/01.out.ipynb"}


def test_a_new_file_counts_unless_git_tracks_it():
    before = {"README.md", "tests/x.py"}
    after = before | {"results/new.json", "tests/y.py"}
    assert checkout.written_by_run(before, after, {"README.md", "tests/x.py", "tests/y.py"}) == ["results/new.json"]
    assert checkout.written_by_run(before, after, None) == ["results/new.json", "tests/y.py"]


def test_the_checkout_is_listed_as_git_sees_it():
    tracked = checkout.tracked_files()
    if tracked is None:  # a source archive: nothing is tracked, every new file counts
        return
    assert "tests/conftest.py" in tracked and "tests/conftest.py" in checkout.files_in()
    assert not any(p.startswith(".venv/") or "/__pycache__/" in p for p in checkout.files_in())


@given(st.text(max_size=3))
def test_hypothesis_keeps_its_files_out_of_the_checkout(text):
    home = configuration.storage_directory(intent_to_write=False).path.resolve()
    assert REPO.resolve() not in home.parents and home != REPO.resolve(), home


WRITER = textwrap.dedent("""
    from pathlib import Path

    ROOT = Path(__file__).resolve().parents[1]

    def test_writes_a_result_into_the_checkout():
        (ROOT / "results").mkdir()
        (ROOT / "results" / "made_by_a_test.json").write_text("[]")

    def test_writes_under_tmp_path_only(tmp_path):
        (tmp_path / "fine.json").write_text("[]")
        (ROOT / "__pycache__").mkdir(exist_ok=True)
        (ROOT / "__pycache__" / "fine.cpython-311.pyc").write_bytes(b"")
""")


def test_a_run_that_writes_into_the_checkout_fails_and_names_the_file(tmp_path):
    """A copy of the suite's conftest and support in a folder of its own (a checkout without git):
    a test there writes ``results/made_by_a_test.json`` beside it; the run fails and says so."""
    for path in ("tests/__init__.py", "tests/conftest.py", "tests/support/__init__.py", "tests/support/checkout.py",
                 "tests/support/devices.py", "tests/support/launch_log.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, tmp_path / path)
    (tmp_path / "tests" / "test_writer.py").write_text(WRITER)
    env = {k: v for k, v in os.environ.items() if k not in ("MINIMAX_LAB_CHECKOUT_CHECK", "PYTHONPATH")}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                          "-p", "no:xdist", "tests/test_writer.py"], cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]
    assert "2 passed" in out and "wrote 1 new file(s) into the checkout" in out, out[-3000:]
    assert "results/made_by_a_test.json" in out and "fine" not in out.split("into the checkout")[1], out[-3000:]
    assert not (REPO / "results" / "made_by_a_test.json").exists()
    assert Path(tmp_path / "results" / "made_by_a_test.json").exists()
