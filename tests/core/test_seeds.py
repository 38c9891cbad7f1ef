"""Every test starts from seeds fixed by its name -- the global generators too (torch's, ``random``'s,
numpy's), so a draw that names no generator does not depend on which tests ran before it: a test
gives the same numbers in any order, alone or beside others (``tests/conftest.py``)."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support import devices

REPO = Path(__file__).resolve().parents[2]
#: where the probes below write what they drew, when a run of this file asks for it
PROBE_OUT = "MINIMAX_LAB_SEED_PROBE_OUT"


def draws() -> dict:
    """Numbers from each global generator, drawn without naming a generator."""
    return {"torch": torch.randn(3).tolist(), "random": random.random(), "numpy": float(np.random.rand())}


def draws_from(seed: int) -> dict:
    """What :func:`draws` gives right after the global generators are seeded with ``seed``."""
    return {"torch": torch.randn(3, generator=torch.Generator().manual_seed(seed)).tolist(),
            "random": random.Random(seed).random(), "numpy": float(np.random.RandomState(seed).rand())}


@pytest.mark.parametrize("extra", [1, 5, 11])
def test_global_generators_start_from_the_tests_name(extra, request):
    """The probe: what the global generators give first is fixed by this test's name. Each case then
    draws a different amount more, so the next test would start elsewhere if nothing reseeded."""
    got = draws()
    torch.randn(extra), [random.random() for _ in range(extra)], np.random.rand(extra)
    if os.environ.get(PROBE_OUT):  # what the next test would draw if nothing reseeded
        left = draws()
        with open(os.environ[PROBE_OUT], "a") as out:
            out.write(json.dumps({"test": request.node.nodeid, "draws": got, "left": left}) + "\n")
    assert got == draws_from(devices.name_seed(request.node.nodeid, "global"))
    assert devices.global_seed_of_test() == devices.name_seed(request.node.nodeid, "global")


@pytest.fixture(scope="module")
def drawn_by_a_shared_fixture():
    return draws()


def test_a_shared_fixture_starts_from_its_own_name(drawn_by_a_shared_fixture):
    """A module fixture is built by whichever of its tests runs first: its draws must not depend on
    which one that is."""
    name = f"{Path(__file__).relative_to(REPO).as_posix()}::drawn_by_a_shared_fixture"
    assert drawn_by_a_shared_fixture == draws_from(devices.name_seed(name, "global"))


def test_other_names_draw_other_numbers():
    a, b = (draws_from(devices.name_seed(f"tests/x.py::test_{n}", "global")) for n in "ab")
    assert a["torch"] != b["torch"] and a["random"] != b["random"] and a["numpy"] != b["numpy"]


def test_the_seed_offset_draws_other_numbers(monkeypatch):
    first = devices.name_seed("tests/x.py::test_a", "global")
    monkeypatch.setenv("MINIMAX_LAB_TEST_SEED", "1")
    assert devices.name_seed("tests/x.py::test_a", "global") != first


#: a plugin that runs the collected tests in reverse order
REVERSE_PLUGIN = "def pytest_collection_modifyitems(items):\n    items.reverse()\n"


def _probe_run(tmp_path: Path, name: str, *extra: str) -> subprocess.Popen:
    (tmp_path / "reverse_plugin.py").write_text(REVERSE_PLUGIN)
    env = {**os.environ, PROBE_OUT: str(tmp_path / f"{name}.jsonl"), "PYTHONPATH": str(tmp_path),
           "MINIMAX_LAB_CHECKOUT_CHECK": "off", "OMP_NUM_THREADS": "1"}
    env.pop("MINIMAX_LAB_TEST_SEED", None)
    probe = f"{Path(__file__).relative_to(REPO).as_posix()}::test_global_generators_start_from_the_tests_name"
    return subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:xdist", *extra,
                             probe], cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_a_test_draws_the_same_numbers_in_either_order(tmp_path):
    """The probes run forward in one process and backward in another: each draws the same numbers in
    both. And the reseeding is what makes it so: where a probe would have started without it (from
    the generators as the probe before it left them), the two orders differ."""
    runs = {"forward": _probe_run(tmp_path, "forward"), "backward": _probe_run(tmp_path, "backward",
                                                                                "-p", "reverse_plugin")}
    outputs = {name: proc.communicate(timeout=300)[0] for name, proc in runs.items()}
    rows = {}
    for name, proc in runs.items():
        assert proc.returncode == 0, outputs[name][-3000:]
        rows[name] = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    order = {name: [r["test"] for r in rows[name]] for name in rows}
    assert len(order["forward"]) == 3 and order["backward"] == order["forward"][::-1]
    drawn = {name: {r["test"]: r["draws"] for r in rows[name]} for name in rows}
    assert drawn["forward"] == drawn["backward"]
    # unseeded, the middle probe would have started from what its predecessor left: another one in
    # each order
    left = {name: [r["left"] for r in rows[name]] for name in rows}
    assert left["forward"][0] != left["backward"][0]
