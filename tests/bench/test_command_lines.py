"""Every command line answers a bad argument, or a missing or damaged file, with one line on stderr
and a non-zero exit status -- never a traceback: ``python -m minimax_lab.bench``, ``python -m
minimax_lab.kernelbench``, ``tools/fetch_peers.py`` and ``tools/gpu_check.py``."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from minimax_lab import measure
from minimax_lab.bench import cli as bench_cli
from minimax_lab.measure import records as records_mod

REPO = Path(__file__).resolve().parents[2]


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(f"tool_{name}", REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _one_line_error(capsys, code, want_code=2) -> str:
    err = capsys.readouterr().err.strip()
    assert code == want_code, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _exit_code(call) -> int:
    try:
        return call()
    except SystemExit as e:
        return e.code


@pytest.fixture
def files(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps([measure.make_record("demo", "c", "ours", 1.0, peers={"peer": 2.0})]))
    damaged = tmp_path / "cut.json"
    damaged.write_text(good.read_text()[:-7])  # a copy cut short
    return {"good": str(good), "damaged": str(damaged), "missing": str(tmp_path / "nope.json"),
            "folder": str(tmp_path), "not_a_list": _write(tmp_path / "obj.json", '{"suite": "x"}')}


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("argv, says", [
    (["merge", "{missing}"], "no such file"),
    (["merge", "{good}", "{damaged}"], "not JSON"),
    (["merge", "{not_a_list}"], "not a list"),
    (["merge", "{good}", "--out", "{folder}"], "is a folder"),
    (["compare", "{damaged}", "{good}"], "not JSON"),
    (["compare", "{good}", "{missing}"], "no such file"),
    (["compare", "{good}", "{good}", "--tolerance", "3"], "--tolerance"),
    (["compare", "{good}"], "the following arguments are required"),
    (["kvcache", "--out", "{folder}"], "is a folder"),
    (["kernelbench", "--problems", "nope"], "unknown problem 'nope'"),
    (["kernelbench", "--n-test", "-1"], "--n-test"),
    (["kernelbench", "--partial", "{folder}"], "--partial"),
    (["kernelbench", "--n-test", "many"], "invalid int value"),
    (["--preset", "huge", "ceilings"], "invalid choice"),
    (["nope"], "unknown suite"),
    ([], "the following arguments are required"),
])
def test_bench_answers_mistakes_with_one_line(argv, says, files, capsys, monkeypatch):
    for suite in bench_cli.SUITES.values():
        monkeypatch.setattr(suite, "run", lambda *a, **k: pytest.fail("ran despite a mistake"))
    code = _exit_code(lambda: bench_cli.main([a.format(**files) for a in argv]))
    err = _one_line_error(capsys, code)
    assert says in err, err


def test_merge_writes_nothing_when_one_file_is_damaged(files, tmp_path, capsys):
    out = tmp_path / "merged.json"
    assert _exit_code(lambda: bench_cli.main(["merge", files["good"], files["damaged"], "--out", str(out)])) == 2
    assert not out.exists()
    assert bench_cli.main(["merge", files["good"], "--out", str(out)]) == 0 and len(json.loads(out.read_text())) == 1
    capsys.readouterr()


def test_records_that_cannot_be_saved_end_on_stdout(monkeypatch, tmp_path, capsys):
    def fail(path, data):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(records_mod, "_write_json", fail)
    monkeypatch.setattr(bench_cli.SUITES["ceilings"], "run",
                        lambda preset="auto", cases=None: [measure.make_record("ceilings", "c", "i", 1.0)])
    code = bench_cli.main(["ceilings", "--out", str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in err and "records follow" in err
    saved = json.loads(out[out.index("[\n"):])
    assert [r["case"] for r in saved] == ["c"]


def test_a_damaged_out_file_is_kept_aside_and_said_in_one_line(tmp_path, monkeypatch, capsys):
    out = tmp_path / "r.json"
    out.write_text("[{")
    monkeypatch.setattr(bench_cli.SUITES["ceilings"], "run",
                        lambda preset="auto", cases=None: [measure.make_record("ceilings", "c", "i", 1.0)])
    assert bench_cli.main(["ceilings", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("RecordsWarning") == 1 and "kept it as" in err and "Traceback" not in err
    assert len(json.loads(out.read_text())) == 1 and len(list(tmp_path.glob("r.json.damaged-*"))) == 1


def test_the_kernel_bench_suite_answers_a_bad_problem_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "minimax_lab.bench", "kernelbench", "--problems", "nope", "--preset", "cpu"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown problem 'nope'" in lines[0] and "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- tools/fetch_peers.py


def test_fetch_peers_refuses_a_folder_that_is_not_a_peers_folder(tmp_path, capsys):
    fetch = _tool("fetch_peers")
    (tmp_path / "mine.txt").write_text("keep me")
    code = _exit_code(lambda: fetch.main(["--dest", str(tmp_path), "--wheel-cache", str(tmp_path / "cache")]))
    assert "not a peers folder" in _one_line_error(capsys, code)
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_fetch_peers_answers_a_wheel_with_the_wrong_hash_in_one_line(tmp_path, capsys):
    fetch = _tool("fetch_peers")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / fetch.WHEEL_NAME).write_bytes(b"not a wheel")
    code = fetch.main(["--dest", str(tmp_path / "peers"), "--wheel-cache", str(cache)])
    assert "SHA-256" in _one_line_error(capsys, code, want_code=1)


def test_fetch_peers_answers_an_unknown_option_in_one_line(capsys):
    code = _exit_code(lambda: _tool("fetch_peers").main(["--nope"]))
    assert "unrecognized arguments" in _one_line_error(capsys, code)


# --------------------------------------------------------------------------- tools/gpu_check.py


@pytest.mark.parametrize("argv, says", [
    (["--only", "tests,nope"], "--only"),
    (["--tests", "tests/no_such_test.py"], "no such test file"),
    (["--notebooks", "99_nope"], "unknown notebook"),
    (["--suites", "nope"], "unknown suite"),
    (["--deadline-s", "0"], "--deadline-s must be positive"),
    (["--workers", "x"], "invalid int value"),
])
def test_gpu_check_answers_bad_arguments_in_one_line(argv, says, capsys):
    code = _exit_code(lambda: _tool("gpu_check").main(argv))
    assert says in _one_line_error(capsys, code)


@pytest.mark.parametrize("content", ["{\"commit\": ", "[1, 2]", None], ids=["cut short", "not a record", "a folder"])
def test_gpu_check_answers_a_damaged_record_in_one_line(content, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MINIMAX_LAB_COMMIT", "0123456789ab")
    record = tmp_path / "record.json"
    if content is None:
        record.mkdir()
    else:
        record.write_text(content)
    code = _tool("gpu_check").main(["--record", str(record), "--only", "bench", "--suites", "ceilings"])
    err = _one_line_error(capsys, code)
    assert str(record) in err
    if content is not None:
        assert record.read_text() == content  # left as it was
