"""Build hook (the project's metadata is in pyproject.toml): a built package carries the recorded
benchmark results.

A clone keeps its benchmark records in ``results/`` at the repository root (where
``python -m minimax_lab.bench`` writes them when run from there). An installed package cannot
reach that folder, so building a wheel copies ``results/*.json`` into the package as
``minimax_lab/assets/results/``, where :mod:`minimax_lab.resources` finds them. The sdist carries
``results/`` (MANIFEST.in) so that a wheel built from it gets the same copy.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

RESULTS = Path(__file__).resolve().parent / "results"


class BuildPyWithResults(build_py):
    """``build_py`` plus the copy of ``results/*.json`` into ``minimax_lab/assets/results/``."""

    def run(self):
        super().run()
        if self.editable_mode:  # an editable install reads results/ from the clone itself
            return
        records = sorted(RESULTS.glob("*.json"))
        if not records:
            raise RuntimeError(f"no recorded results in {RESULTS}: build from a clone or from an sdist")
        target = Path(self.build_lib) / "minimax_lab" / "assets" / "results"
        shutil.rmtree(target, ignore_errors=True)  # no stale records from an earlier build
        target.mkdir(parents=True)
        for f in records:
            self.copy_file(str(f), str(target / f.name))


setup(cmdclass={"build_py": BuildPyWithResults})
