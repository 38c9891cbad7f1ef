"""Peers that are not installed: the folder ``tools/fetch_peers.py`` lays out, and how to import it.

Some kernels a user would pick instead of ours ship only inside a large serving package (SGLang's
Triton MSA and fused-MoE kernels). ``python tools/fetch_peers.py`` downloads that package's wheel
without its dependencies and extracts just those Triton files, with small stand-in modules of ours
for what they import from the rest of the package, into a folder that git ignores. This module
finds that folder and puts it on ``sys.path``; the adapters (:mod:`minimax_lab.bench.peer_sglang_msa`,
:mod:`minimax_lab.bench.peer_sglang_moe`) call the kernels through it.

Where the folder is: ``$MINIMAX_LAB_PEERS`` if set, else ``<repository>/peers``.

* :func:`status` -> ``(ok, reason)``: never raises; ``reason`` says what is missing and how to get it.
* :func:`require` -> the folder, on ``sys.path``; raises :class:`PeerUnavailable` with that reason.
* :func:`sglang_version` -> the version string recorded in the folder's ``VERSION.json`` (or None).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ENV_VAR = "MINIMAX_LAB_PEERS"
REPO_ROOT = Path(__file__).resolve().parent.parent.parent
FETCH_HINT = "run `python tools/fetch_peers.py` from a clone of the repository (needs network access once)"


class PeerUnavailable(RuntimeError):
    """The peers folder is missing or unusable; the message says why and what to run."""


def peers_dir() -> Path:
    """``$MINIMAX_LAB_PEERS`` if set, else ``<repository>/peers``."""
    env = os.environ.get(ENV_VAR, "").strip()
    return Path(env).expanduser().resolve() if env else REPO_ROOT / "peers"


def _version_info(folder: Path) -> dict | None:
    try:
        return json.loads((folder / "VERSION.json").read_text())
    except (OSError, ValueError):
        return None


def status() -> tuple[bool, str]:
    """Whether the peers folder is usable, and if not, why (and how to fetch it)."""
    folder = peers_dir()
    if not folder.is_dir():
        return False, f"no peers folder at {folder}: {FETCH_HINT}"
    info = _version_info(folder)
    if info is None or "sglang" not in info:
        return False, f"{folder} has no readable VERSION.json: {FETCH_HINT}"
    for needed in ("sglang/__init__.py", "peer_standin_kernels.py"):
        if not (folder / needed).is_file():
            return False, f"{folder} lacks {needed}: {FETCH_HINT}"
    loaded = sys.modules.get("sglang")
    if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(str(folder)):
        return False, (f"another 'sglang' package is already imported ({getattr(loaded, '__file__', '?')}); "
                       "the extracted kernels need a process that has not imported it")
    return True, f"sglang {info['sglang']} Triton kernels from {folder}"


def require() -> Path:
    """The peers folder, inserted at the front of ``sys.path``; raises :class:`PeerUnavailable`."""
    ok, reason = status()
    if not ok:
        raise PeerUnavailable(reason)
    folder = str(peers_dir())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return Path(folder)


def importable(load, what: str) -> tuple[bool, str]:
    """``(True, what is there)`` when the folder is usable and ``load()`` imports the peer's entry
    points, else ``(False, why)``; ``what`` names them in the reason (e.g. ``"SGLang MSA kernels"``)."""
    ok, why = status()
    if not ok:
        return ok, why
    try:
        load()
    except Exception as e:  # noqa: BLE001 - any import failure is a reason, reported as such
        return False, f"{what} do not import: {type(e).__name__}: {e}"
    return True, why


def sglang_version() -> str | None:
    """The sglang version the peers folder was extracted from, or None without a folder."""
    info = _version_info(peers_dir())
    return info.get("sglang") if info else None
