#!/usr/bin/env python
"""Fetch the peers the benchmarks compare against: SGLang's Triton MSA and Triton fused-MoE kernels.

    python tools/fetch_peers.py            # -> <repo>/peers (ignored by git)
    python tools/fetch_peers.py --dest DIR --wheel-cache DIR

What it does, in order:

1. ``pip download --no-deps sglang==0.5.23`` (the wheel only, none of its dependencies) into a
   cache folder outside the repository (default ``~/.cache/minimax-lab/wheels``), then checks the
   wheel's SHA-256 against the one pinned here.
2. Extracts **only** the files listed in :data:`EXTRACT` (Python sources of the Triton kernels,
   the Python that calls them, SGLang's tuned fused-MoE config JSONs and its license) into
   ``peers/``. Nothing of SGLang is committed to minimax-lab; ``peers/`` is in ``.gitignore``.
3. Copies minimax-lab's own stand-in modules (``tools/peer_standins/``) over the places where
   those files import the rest of SGLang (``sglang.srt.utils``, ``sglang.srt.environ``,
   ``sglang.srt.runtime_context``, ...) and the CUDA-only helpers (token alignment,
   ``silu_and_mul``, ``moe_sum_reduce``), and writes an empty ``__init__.py`` into every other
   package folder.
4. Writes ``peers/VERSION.json``: the sglang version, the wheel's name and SHA-256, the files
   extracted and the stand-ins. The benchmarks copy the version into every peer record.

The folder is small (about 2 MB) so it can travel with the working tree to a GPU machine
without network access. ``minimax_lab.bench.peers`` finds it (``MINIMAX_LAB_PEERS`` or ``<repo>/peers``).
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STANDINS = Path(__file__).resolve().parent / "peer_standins"

SGLANG_VERSION = "0.5.23"
WHEEL_NAME = f"sglang-{SGLANG_VERSION}-cp311-cp311-manylinux_2_34_x86_64.whl"
WHEEL_SHA256 = "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"

#: Wheel members to extract (``fnmatch`` patterns; ``*`` also crosses ``/``). Each must match at least once.
EXTRACT = (
    # MSA: the Triton kernels, and the functions SGLang's M3 backend calls them through on CUDA
    "sglang/kernels/ops/attention/minimax_sparse/*.py",
    "sglang/srt/layers/attention/minimax_sparse_ops/minimax_sparse.py",
    # fused MoE: the Triton kernels, fused_experts and its config lookup, the tuned configs
    "sglang/kernels/ops/moe/fused_moe_triton_kernels.py",
    "sglang/kernels/ops/moe/moe_align_small_numel.py",
    "sglang/srt/layers/moe/moe_runner/triton_utils/__init__.py",
    "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py",
    "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py",
    "sglang/srt/layers/moe/moe_runner/triton_utils/moe_align_block_size.py",
    "sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_*/E=*.json",
    # SGLang's license travels with its files
    f"sglang-{SGLANG_VERSION}.dist-info/licenses/LICENSE",
)


def selected_members(names) -> list[str]:
    """The wheel members :data:`EXTRACT` selects, sorted; raises ``ValueError`` naming every
    pattern that matches nothing (the wheel's layout changed)."""
    names = [n for n in names if not n.endswith("/")]
    picked, missing = set(), []
    for pattern in EXTRACT:
        hits = fnmatch.filter(names, pattern)
        if not hits:
            missing.append(pattern)
        picked.update(hits)
    if missing:
        raise ValueError(f"patterns matched nothing in the wheel: {missing}")
    return sorted(picked)


def standin_files() -> list[Path]:
    """minimax-lab's stand-in modules, relative to ``tools/peer_standins``."""
    return sorted(p.relative_to(STANDINS) for p in STANDINS.rglob("*.py") if "__pycache__" not in p.parts)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download_wheel(cache: Path) -> Path:
    """The pinned sglang wheel in ``cache`` (downloaded with pip unless already there, hash checked)."""
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / WHEEL_NAME
    if not wheel.exists():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.11", "--platform", "manylinux_2_34_x86_64",
               f"sglang=={SGLANG_VERSION}", "-d", str(cache)]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    if not wheel.exists():
        raise FileNotFoundError(f"pip did not produce {wheel}")
    got = sha256(wheel)
    if got != WHEEL_SHA256:
        raise ValueError(f"{wheel} has SHA-256 {got}, expected {WHEEL_SHA256}; delete it and fetch again")
    return wheel


def check_dest(dest: Path) -> None:
    """Raise ``FileExistsError`` unless ``dest`` is absent, empty, or a peers folder (it is replaced)."""
    if dest.exists() and not dest.is_dir():
        raise FileExistsError(f"{dest} is a file, not a peers folder; not touching it")
    if dest.exists() and not (dest / "VERSION.json").exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} exists and is not a peers folder (no VERSION.json); not touching it")


def build(wheel: Path, dest: Path) -> dict:
    """Lay out ``dest`` from the wheel and the stand-ins; returns what VERSION.json records."""
    check_dest(dest)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as z:
        members = selected_members(z.namelist())
        for name in members:
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(name))
    standins = standin_files()
    for rel in standins:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(STANDINS / rel, target)
    markers = []
    for pkg in ("sglang", "sgl_kernel"):
        for folder in [dest / pkg, *sorted(p for p in (dest / pkg).rglob("*") if p.is_dir())]:
            init = folder / "__init__.py"
            if folder.name != "configs" and not folder.name.startswith("triton_") and not init.exists():
                init.write_text("# package marker written by minimax-lab's tools/fetch_peers.py\n")
                markers.append(str(init.relative_to(dest)))
    info = {"sglang": SGLANG_VERSION, "wheel": WHEEL_NAME, "sha256": WHEEL_SHA256,
            "extracted": members, "standins": [str(p) for p in standins], "package_markers": sorted(markers)}
    (dest / "VERSION.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class _Parser(argparse.ArgumentParser):
    """argparse answering a mistake with one line on stderr and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv=None) -> int:
    """Fetch and lay out the peers; a mistake or a failure (no network, a wheel with the wrong
    hash, a destination that is not a peers folder) ends with one line on stderr and a non-zero
    exit status (2 for the command line, 1 for the rest)."""
    ap = _Parser(prog="python tools/fetch_peers.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", type=Path, default=REPO / "peers", help="peers folder (default <repo>/peers)")
    ap.add_argument("--wheel-cache", type=Path, default=Path.home() / ".cache" / "minimax-lab" / "wheels")
    args = ap.parse_args(argv)
    try:
        check_dest(args.dest)  # before a download, not after
    except FileExistsError as e:
        ap.error(str(e))
    try:
        wheel = download_wheel(args.wheel_cache)
        info = build(wheel, args.dest)
    except subprocess.CalledProcessError as e:
        print(f"fetch_peers: error: pip could not download sglang=={SGLANG_VERSION} (exit {e.returncode}); "
              "this needs network access once", file=sys.stderr)
        return 1
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        print(f"fetch_peers: error: {e}", file=sys.stderr)
        return 1
    size = folder_bytes(args.dest)
    print(f"sglang {info['sglang']}: {len(info['extracted'])} files extracted, {len(info['standins'])} stand-ins, "
          f"{size / 2**20:.1f} MiB in {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
