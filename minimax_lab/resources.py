"""Where the workbook's files are -- from a clone, an editable install, a wheel or Colab's
``pip install git+...``. Every lookup of a shipped or written file goes through this module.

Shipped with the package (found with :mod:`importlib.resources`, read-only):

* ``minimax_lab/assets/``: the CPU-preset checkpoint ``tiny_cpu.pt``, its training history
  ``tiny_cpu_history.json`` and the step-zero experiment ``experiment_step_zero.json``;
* ``minimax_lab/assets/traces/``: Mooncake's synthetic trace (Apache-2.0; its ``NOTICE`` and
  license text lie beside it);
* the recorded benchmark results: a clone keeps them in ``results/`` at its root; a built
  package carries a copy of ``results/*.json`` in ``minimax_lab/assets/results/``.

Written by the user: benchmark records go to :func:`user_results_dir` -- ``$MINIMAX_LAB_RESULTS``
when set, else ``results/`` in the current working directory (in a clone run from its root, the
clone's ``results/``) -- never into an installed package.
"""
from __future__ import annotations

import functools
import json
import os
from importlib import metadata, resources
from pathlib import Path

#: Environment variable naming the folder benchmark records are written to (and read from).
RESULTS_ENV = "MINIMAX_LAB_RESULTS"
#: Environment variable naming a folder searched for traces before the shipped ones.
TRACES_ENV = "MINIMAX_LAB_TRACES"
CHECKPOINT = "tiny_cpu.pt"
MOONCAKE_SYNTHETIC = "mooncake_synthetic_trace.jsonl"


def package_dir() -> Path:
    """The ``minimax_lab`` package folder on disk. Raises ``RuntimeError`` if it is not a folder
    (e.g. imported from a zip archive): the checkpoint must be a real file for ``torch.load``."""
    root = resources.files("minimax_lab")
    if not isinstance(root, Path):
        raise RuntimeError(f"minimax_lab must be installed as files on disk, found {root!r}")
    return root


def assets_dir() -> Path:
    """``minimax_lab/assets``: the shipped checkpoint, its JSON files and ``traces/``."""
    return package_dir() / "assets"


@functools.lru_cache(maxsize=None)
def checkout_root() -> Path | None:
    """The clone's root when the package is imported from a clone (or an editable install of
    one), else None (an installed wheel)."""
    root = package_dir().parent
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and 'name = "minimax-lab"' in pyproject.read_text():
        return root
    return None


def asset(name: str) -> Path:
    """Path of a shipped asset, e.g. ``asset("tiny_cpu_history.json")`` or
    ``asset("traces/NOTICE")``. Raises ``FileNotFoundError`` naming it if it is missing."""
    path = assets_dir() / name
    if not path.is_file():
        raise FileNotFoundError(f"minimax_lab's shipped file {name!r} is missing (looked at {path}); "
                                "reinstall the package")
    return path


def checkpoint_path() -> Path:
    """The shipped CPU-preset checkpoint (``minimax_lab/assets/tiny_cpu.pt``); it may be absent
    only in a broken install, which loading reports."""
    return assets_dir() / CHECKPOINT


def find_trace(name: str = MOONCAKE_SYNTHETIC) -> Path | None:
    """A trace file: ``$MINIMAX_LAB_TRACES/name`` if that exists, else the shipped
    ``minimax_lab/assets/traces/name``; None if neither exists."""
    candidates = [Path(os.environ[TRACES_ENV]) / name] if os.environ.get(TRACES_ENV) else []
    candidates.append(assets_dir() / "traces" / name)
    return next((c for c in candidates if c.is_file()), None)


def recorded_results_dir() -> Path:
    """The recorded benchmark results: the clone's ``results/``, or in an installed package the
    copy made when it was built (``minimax_lab/assets/results/``)."""
    root = checkout_root()
    return root / "results" if root is not None else assets_dir() / "results"


def _chosen_results_dir() -> Path:
    env = os.environ.get(RESULTS_ENV)
    return Path(env) if env else Path.cwd() / "results"


def user_results_dir() -> Path:
    """Where benchmark records are written: ``$MINIMAX_LAB_RESULTS``, else ``./results`` of the
    working directory. Raises ``ValueError`` if that folder lies inside the installed package's
    ``site-packages`` (choose another working directory or set ``MINIMAX_LAB_RESULTS``)."""
    path = _chosen_results_dir()
    if checkout_root() is None:
        installed_in = package_dir().parent.resolve()
        if path.resolve() == installed_in or installed_in in path.resolve().parents:
            raise ValueError(f"benchmark results would be written into {installed_in}, where minimax_lab "
                             f"is installed; run from another folder or set {RESULTS_ENV}")
    return path


def results_dirs() -> list[Path]:
    """Folders whose ``*.json`` records are read, oldest source first: the recorded results, then
    the user's :func:`user_results_dir` if it exists and is a different folder."""
    dirs = [recorded_results_dir()]
    user = _chosen_results_dir()
    if user.is_dir() and user.resolve() != dirs[0].resolve():
        dirs.append(user)
    return dirs


def installed_commit() -> str | None:
    """The git commit an installed package was built from, when pip recorded it (``pip install
    git+https://...`` does); None otherwise."""
    try:
        direct_url = metadata.distribution("minimax-lab").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not direct_url:
        return None
    commit = json.loads(direct_url).get("vcs_info", {}).get("commit_id")
    return commit[:12] if commit else None
