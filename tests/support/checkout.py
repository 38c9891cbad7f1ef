"""What a test run may leave in the checkout: nothing.

``tests/conftest.py`` lists the checkout's files when a run starts (:func:`files_in`) and again when
it ends; a file that appeared and is not tracked by git (:func:`written_by_run`) was written by the
run -- a results file, a notebook output, a tool's cache -- and fails the run. Left out of the
listing: ``.git``, virtual environments (a folder holding ``pyvenv.cfg``), other git checkouts
inside this one (a folder holding ``.git``: a worktree or clone a person made), Python's
``__pycache__`` bytecode and pytest's ``.pytest_cache`` (off in ``pyproject.toml``; only a run that
turns it back on on purpose writes it). Tests write into ``tmp_path``; hypothesis keeps its files in a temporary
folder (``tests/conftest.py``).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

#: the checkout this test suite belongs to
ROOT = Path(__file__).resolve().parents[2]
#: folders never listed: git's own, bytecode, pytest's cache (see the module docstring)
SKIPPED_FOLDERS = frozenset({".git", "__pycache__", ".pytest_cache"})


def files_in(root: Path = ROOT) -> set[str]:
    """Every file under ``root`` (paths relative to it, ``/``-separated), but those in
    :data:`SKIPPED_FOLDERS`, in virtual environments, in other git checkouts and ``*.pyc`` bytecode."""
    found = set()
    for here, folders, files in os.walk(root):
        folders[:] = [f for f in folders if f not in SKIPPED_FOLDERS
                      and not any(os.path.exists(os.path.join(here, f, marker)) for marker in ("pyvenv.cfg", ".git"))]
        rel = Path(here).relative_to(root)
        found.update((rel / f).as_posix() for f in files if not f.endswith(".pyc"))
    return found


def tracked_files(root: Path = ROOT) -> set[str] | None:
    """The files git tracks under ``root``; None where ``root`` is not a git checkout (a source
    archive) or git is missing."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return {p for p in out.stdout.decode("utf-8", "surrogateescape").split("\0") if p}


def written_by_run(before: set[str], after: set[str], tracked: set[str] | None) -> list[str]:
    """The files in ``after`` that were not in ``before`` and git does not track, sorted. A file
    created and committed by a person while the tests ran is tracked, so it is not counted."""
    return sorted(after - before - (tracked or set()))
