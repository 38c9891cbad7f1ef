"""The package outside the repository.

A wheel built through an sdist (what a release or ``pip install git+...`` builds), installed with
its dependencies into a fresh venv, works from a folder outside the clone: the shipped checkpoint
loads, the recorded H200 records read back, Mooncake's trace replays to the published unbounded
hit ratio, and bench records land in the working directory or ``$MINIMAX_LAB_RESULTS`` -- never in
site-packages. The cheap tests below check :mod:`minimax_lab.resources`' rules in this clone.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
import yaml

from minimax_lab import measure, resources, runtime
from minimax_lab.model import load_checkpoint
from minimax_lab.model.train import DEFAULT_CHECKPOINT

ROOT = Path(__file__).resolve().parents[2]
#: What the sdist is built from (the rest of the clone is not part of the package).
SDIST_INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "minimax_lab", "results")
#: Published hit ratio of an unbounded cache on Mooncake's synthetic trace (3 decimals).
UNBOUNDED_HIT_RATIO = 0.651
PIP = [sys.executable, "-m", "pip"]
#: Quiet, fail fast without a network, and no bytecode compilation (it doubles torch's install time).
PIP_FLAGS = ["-q", "--disable-pip-version-check", "--retries", "0", "--timeout", "20", "--no-compile"]


def _run(cmd, cwd, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _tail(proc: subprocess.CompletedProcess, lines: int = 15) -> str:
    text = "\n".join(l for l in (proc.stdout + proc.stderr).splitlines() if "is ignored" not in l)
    return "\n".join(text.splitlines()[-lines:])


def _torch_pin() -> str:
    """The CPU build `make setup` installs (the Makefile's TORCH_CPU), e.g. ``torch==2.13.0``: it
    lies on local disk on our CI machines; an open ``torch`` would pull a multi-GB CUDA build."""
    m = re.search(r"^TORCH_CPU \?=.*?(torch==\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert m, "Makefile has no TORCH_CPU pin for torch"
    return m.group(1)


def _index_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def build_wheel(work: Path) -> Path:
    """sdist from the package's inputs, then a wheel from the unpacked sdist (no network: the
    running environment's setuptools builds both)."""
    try:
        import setuptools
    except ImportError:
        pytest.skip("setuptools is not installed in this environment: the wheel cannot be built offline")
    if int(setuptools.__version__.split(".")[0]) < 68:
        pytest.skip(f"setuptools>=68 builds the wheel (pyproject.toml); this environment has {setuptools.__version__}")
    src = work / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.lock", "*.tmp")
    for name in SDIST_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, src / name)
    hook = "import sys; from setuptools import build_meta as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"
    sdist = _run([sys.executable, "-c", hook, "build_sdist", work / "dist"], cwd=src)
    assert sdist.returncode == 0, _tail(sdist)
    with tarfile.open(work / "dist" / sdist.stdout.split()[-1]) as tar:
        names = tar.getnames()
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(work / "unpacked", **kwargs)
    assert any(n.endswith("results/NVIDIA_H200.json") for n in names), "the sdist lacks results/"
    unpacked = next((work / "unpacked").iterdir())
    wheel = _run([sys.executable, "-c", hook, "build_wheel", work / "dist"], cwd=unpacked)
    assert wheel.returncode == 0, _tail(wheel)
    return work / "dist" / wheel.stdout.split()[-1]


def install(wheel: Path, venv_dir: Path) -> tuple[Path, str]:
    """A fresh venv with the wheel and its dependencies; returns (its python, how).

    From the package index (``torch`` pinned to the CPU build first). Where no index is reachable
    (the GPU machine), the venv sees this environment's packages instead and pip must find every
    dependency there (``--no-index``); where neither works the test is skipped, saying why."""
    python = venv_dir / "bin" / "python"
    made = _run([sys.executable, "-m", "venv", "--without-pip", venv_dir], cwd=venv_dir.parent)
    assert made.returncode == 0, _tail(made)
    into = [*PIP, "--python", python, "install", *PIP_FLAGS]
    online = _run([*into, _torch_pin(), wheel], cwd=venv_dir.parent)
    if online.returncode == 0:
        return python, "package index"
    if _index_reachable():
        pytest.fail(f"pip could not install the wheel with its dependencies:\n{_tail(online)}")
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=venv_dir.parent)
    ours = _run([sys.executable, "-c", "import site; print('\\n'.join(site.getsitepackages()))"], cwd=ROOT)
    (Path(purelib.stdout.strip()) / "_this_environment.pth").write_text(ours.stdout)
    offline = _run([*into, "--no-index", wheel], cwd=venv_dir.parent)
    if offline.returncode != 0:
        pytest.skip("no package index reachable and this environment lacks a dependency of the wheel:\n"
                    + _tail(offline, 5))
    return python, "this environment's packages (no package index reachable)"


#: Runs inside the fresh venv, from a folder outside the clone; prints what it found as JSON.
CHECK_SCRIPT = r"""
import json, os, sysconfig
from pathlib import Path
import minimax_lab
from minimax_lab import measure, runtime
from minimax_lab.kvcache import find_trace, replay_trace
from minimax_lab.model import load_pretrained

model, cfg = load_pretrained()
trace = find_trace()
written = measure.append_records([measure.make_record("wheel_check", "write", "ours", 1.0)])
found = {
    "package": str(Path(minimax_lab.__file__).parent),
    "param_sum": sum(float(p.double().sum()) for p in model.state_dict().values()),
    "records": len(measure.load_records("NVIDIA H200", latest=False)),
    "suites": sorted({r["suite"] for r in measure.load_records("NVIDIA H200")}),
    "trace": str(trace), "hit_ratio": replay_trace(trace, capacity_tokens=None).hit_ratio,
    "written": str(written), "slug": runtime.device_slug(), "refused": None,
    "hacks_md": (Path(minimax_lab.__file__).parent / "kernelbench" / "HACKS.md").is_file(),
}
os.chdir(sysconfig.get_paths()["purelib"])   # ./results would be inside site-packages: refused
try:
    measure.append_records([measure.make_record("wheel_check", "write", "ours", 1.0)])
except ValueError as e:
    found["refused"] = str(e)
print(json.dumps(found))
"""


def _files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.slow
def test_wheel_works_outside_the_repository():
    if not any((ROOT / "results").glob("*.json")):
        pytest.fail("results/ has no recorded records to ship")
    pip_version = _run([*PIP, "--version"], cwd=ROOT).stdout.split()
    if len(pip_version) < 2 or tuple(int(x) for x in re.findall(r"\d+", pip_version[1])[:2]) < (22, 3):
        pytest.skip(f"pip >= 22.3 is needed to install into another venv (pip --python), found {pip_version[1:2]}")
    with tempfile.TemporaryDirectory(prefix="minimax_lab_wheel_") as tmp:
        work = Path(tmp)
        wheel = build_wheel(work)
        python, source = install(wheel, work / "venv")
        elsewhere, chosen = work / "elsewhere", work / "chosen"
        elsewhere.mkdir()
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "MINIMAX_LAB_RESULTS", "MINIMAX_LAB_TRACES", "MINIMAX_LAB_COMMIT")}
        env["OMP_NUM_THREADS"] = "1"
        purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            cwd=elsewhere).stdout.strip())
        before = _files_under(purelib)

        proc = _run([python, "-c", CHECK_SCRIPT], cwd=elsewhere, env=env)
        assert proc.returncode == 0, f"(dependencies from {source})\n{_tail(proc, 30)}"
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        merge = _run([python, "-m", "minimax_lab.bench", "merge", got["written"]], cwd=elsewhere,
                     env={**env, "MINIMAX_LAB_RESULTS": str(chosen)})
        assert merge.returncode == 0, _tail(merge)
        after = _files_under(purelib)

        package = Path(got["package"])
        assert package.parent == purelib and ROOT not in package.parents, got["package"]
        # the checkpoint is the clone's one
        model, _, _ = load_checkpoint(DEFAULT_CHECKPOINT)
        assert got["param_sum"] == pytest.approx(sum(float(p.double().sum()) for p in model.state_dict().values()),
                                                 rel=1e-12)
        # every recorded H200 record came along
        assert got["records"] == len(json.loads((ROOT / "results" / "NVIDIA_H200.json").read_text())) > 0
        assert {"attention", "msa", "moe", "kvcache"} <= set(got["suites"])
        # the shipped trace replays to the published number
        assert Path(got["trace"]) == package / "assets" / "traces" / "mooncake_synthetic_trace.jsonl"
        assert round(got["hit_ratio"], 3) == UNBOUNDED_HIT_RATIO
        assert got["hacks_md"], "the hack catalogue (kernelbench/HACKS.md) is not in the wheel"
        # records go to ./results of the working directory or $MINIMAX_LAB_RESULTS, never site-packages
        assert Path(got["written"]) == elsewhere / "results" / f"{got['slug']}.json"
        assert f"into {chosen}" in merge.stdout and (chosen / Path(got["written"]).name).is_file()
        assert got["refused"] and "MINIMAX_LAB_RESULTS" in got["refused"]
        assert after == before, f"files appeared in site-packages: {sorted(map(str, after - before))[:5]}"


# --------------------------------------------------------------------------- resources, in this clone


def test_dependency_bounds_are_the_same_everywhere():
    """pyproject's dependencies (the tested range) appear verbatim in requirements.txt and
    environment.yml."""
    deps = re.search(r"^dependencies = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    deps = re.findall(r'"([^"]+)"', deps)
    reqs = {l.split("#")[0].strip() for l in (ROOT / "requirements.txt").read_text().splitlines()}
    env_pip = next(d["pip"] for d in yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
                   if isinstance(d, dict))
    assert deps and all(d in reqs for d in deps) and all(d in env_pip for d in deps), deps
    assert "torch>=2.11" in deps and "triton>=3.6" in deps


def test_shipped_assets_are_found():
    assert resources.checkout_root() == ROOT
    assert DEFAULT_CHECKPOINT == resources.asset("tiny_cpu.pt")
    for name in ("tiny_cpu_history.json", "experiment_step_zero.json", "traces/NOTICE"):
        assert resources.asset(name).parent.is_relative_to(resources.assets_dir())
    with pytest.raises(FileNotFoundError, match="not_shipped.bin"):
        resources.asset("not_shipped.bin")
    assert resources.recorded_results_dir() == ROOT / "results"


def test_records_are_written_to_the_working_directory_and_read_with_the_recorded(tmp_path, monkeypatch):
    monkeypatch.delenv("MINIMAX_LAB_RESULTS", raising=False)
    monkeypatch.chdir(tmp_path)
    recorded = measure.load_records("NVIDIA H200", suite="attention")
    assert recorded and resources.results_dirs() == [ROOT / "results"]   # no ./results yet
    case = recorded[0]
    path = measure.append_records([dict(case, ms=case["ms"] / 2, commit="mine")],
                                  resources.user_results_dir() / "NVIDIA_H200.json")
    assert path == tmp_path / "results" / "NVIDIA_H200.json"
    assert resources.results_dirs() == [ROOT / "results", tmp_path / "results"]
    newest = {(r["case"], r["impl"]): r for r in measure.load_records("NVIDIA H200", suite="attention")}
    assert newest[(case["case"], case["impl"])]["commit"] == "mine"          # the user's own wins
    assert len(newest) == len(recorded)
    (tmp_path / "results" / "summary.json").write_text(json.dumps({"not": "records"}))
    assert measure.load_records(None, suite="attention")                       # a non-list file is skipped
    monkeypatch.setenv("MINIMAX_LAB_RESULTS", str(tmp_path / "chosen"))
    assert measure.append_records([case]) == tmp_path / "chosen" / f"{runtime.device_slug()}.json"


def test_installed_package_never_writes_into_site_packages(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    (site / "minimax_lab").mkdir(parents=True)
    monkeypatch.setattr(resources, "checkout_root", lambda: None)
    monkeypatch.setattr(resources, "package_dir", lambda: site / "minimax_lab")
    monkeypatch.delenv("MINIMAX_LAB_RESULTS", raising=False)
    assert resources.recorded_results_dir() == site / "minimax_lab" / "assets" / "results"
    monkeypatch.chdir(site)
    with pytest.raises(ValueError, match="MINIMAX_LAB_RESULTS"):
        resources.user_results_dir()
    monkeypatch.setenv("MINIMAX_LAB_RESULTS", str(site / "minimax_lab" / "results"))
    with pytest.raises(ValueError, match="installed"):
        measure.append_records([measure.make_record("demo", "c", "ours", 1.0)])
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MINIMAX_LAB_RESULTS")
    assert resources.user_results_dir() == tmp_path / "results"


def test_installed_package_records_the_commit_pip_saw(monkeypatch):
    class Dist:
        def __init__(self, text):
            self.text = text

        def read_text(self, name):
            return self.text if name == "direct_url.json" else None

    monkeypatch.delenv("MINIMAX_LAB_COMMIT", raising=False)
    monkeypatch.setattr(resources, "checkout_root", lambda: None)
    sha = "0123456789abcdef0123456789abcdef01234567"
    git_install = json.dumps({"url": "https://github.com/minimax-lab/minimax-lab",
                              "vcs_info": {"vcs": "git", "commit_id": sha}})
    monkeypatch.setattr(resources.metadata, "distribution", lambda name: Dist(git_install))
    assert measure.git_commit() == sha[:12]
    monkeypatch.setattr(resources.metadata, "distribution", lambda name: Dist('{"url": "file:///x.whl"}'))
    assert measure.git_commit() is None
