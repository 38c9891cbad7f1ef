"""The store's processes never outlive the Python process that started them, and its temporary
folders go with it: a script that exits without ``stop()`` (here: by raising) leaves no process and
no folder behind, a parent killed outright (SIGKILL) leaves no process behind, and a server that
failed keeps its logs."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minimax_lab.kvcache import store as mc
from tests.kvcache.conftest import _require_store

ROOT = Path(__file__).resolve().parents[2]

#: starts a store and one replica, prints their pids and the log folder, then raises or waits
SCRIPT = """
import json, sys, time
from minimax_lab.kvcache import store as mc
from minimax_lab.engine.replicas import start_replicas
server = mc.StoreServer(pool_bytes=16 << 20).start()
replicas = start_replicas(server, 1, page_size=16, timeout_s=2.0)
pids = [p.pid for p in (server.master, server.metadata, server.pool_node, server.holder) if p is not None]
pids += [r.proc.pid for r in replicas]
print(json.dumps(dict(pids=pids, log_dir=str(server.log_dir))), flush=True)
if sys.argv[1] == "raise":
    raise RuntimeError("a cell failed; nobody called stop()")
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper is not running)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pids, timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def _start_script(how: str) -> tuple[subprocess.Popen, dict]:
    _require_store()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, how], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail(f"the script did not start the store: {proc.stderr.read()[-2000:]}")
    return proc, json.loads(line)


def test_a_script_that_raises_without_stop_leaves_nothing_behind():
    proc, info = _start_script("raise")
    try:
        err = proc.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 1 and "a cell failed" in err
    assert len(info["pids"]) >= 4
    assert _wait_gone(info["pids"]) == [], "processes outlived the script that started them"
    assert not Path(info["log_dir"]).exists(), "the store's temporary folder outlived a run that did not fail"


def test_a_killed_parent_takes_the_store_and_its_replicas_down():
    proc, info = _start_script("wait")
    try:
        assert all(_alive(p) for p in info["pids"])
        proc.send_signal(signal.SIGKILL)                   # no atexit, no stop(): only the parent-death signal
        proc.wait(10)
        assert _wait_gone(info["pids"]) == [], "processes outlived a parent killed with SIGKILL"
    finally:
        for pid in info["pids"]:                            # never leave a server behind, even when this fails
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.communicate()
        # a killed parent cannot tidy up: its logs stay, as after any failure; this test removes them
        subprocess.run(["rm", "-rf", info["log_dir"]], check=False)


def test_stop_removes_the_folder_it_made_and_keeps_the_logs_of_a_failure():
    _require_store()
    server = mc.StoreServer(pool_bytes=16 << 20)
    try:
        server.start()
        folder = Path(server.log_dir)
        assert folder.is_dir()
    finally:
        server.stop()
    assert not folder.exists() and not server.failed
    server = mc.StoreServer(pool_bytes=16 << 20)
    try:
        server.start()
        folder = Path(server.log_dir)
        server.metadata.kill()                               # a process dies on its own: a failure
        server.metadata.wait()
    finally:
        with pytest.warns(RuntimeWarning, match="logs are kept"):
            server.stop()
    try:
        assert server.failed and (folder / "master.log").exists()
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=False)


def test_the_parent_death_signal_is_set_in_every_child(monkeypatch):
    """Without ``setpriv`` the child sets the signal itself; with it, ``setpriv`` runs in front."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    for wrapper in (mc._setpriv(), None):
        monkeypatch.setattr(mc, "_setpriv", lambda w=wrapper: w)
        # PR_GET_PDEATHSIG (2) is not in /proc: the child reports what the kernel holds for it
        probe = mc.spawn([sys.executable, "-c", "import ctypes, signal; v = ctypes.c_int(); "
                          "ctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0); print(v.value)"],
                         stdout=subprocess.PIPE, text=True)
        out = probe.communicate(timeout=30)[0]
        assert int(out) == signal.SIGKILL, (wrapper, out)
