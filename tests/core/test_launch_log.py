"""The launch log: kernel keys, the log's lines, and the covering set the newest-Triton run takes."""
from __future__ import annotations

import json

import pytest
import torch
import triton
import triton.language as tl

from minimax_lab import runtime
from tests.support import launch_log


@triton.jit
def _scaled_copy(x_ptr, out_ptr, n, NEGATE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, -x if NEGATE else x, mask=offs < n)


def test_a_launch_is_keyed_by_kernel_and_flags_not_block_sizes():
    dev = runtime.kernel_device()
    x = torch.arange(10, dtype=torch.float32, device=dev)
    out = torch.empty_like(x)
    started = launch_log.start()
    for negate, block in ((True, 16), (True, 32), (False, 16)):
        _scaled_copy[(1,)](x, out, 10, NEGATE=negate, BLOCK=block)
    assert launch_log.launches() == started[0] + 3
    assert torch.equal(out.cpu(), torch.arange(10, dtype=torch.float32))
    name = f"{__name__}._scaled_copy"
    assert launch_log._keys == {f"{name}[NEGATE=True]{{float32}}", f"{name}[NEGATE=False]{{float32}}"}
    _scaled_copy[(1,)](x.half(), out.half(), 10, NEGATE=False, BLOCK=16)
    assert f"{name}[NEGATE=False]{{float16}}" in launch_log._keys


def test_note_writes_one_line_per_launching_test(tmp_path, monkeypatch):
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv(launch_log.ENV, str(log))
    started = launch_log.start()
    launch_log.note("t::quiet", started)                       # launched nothing: no line
    assert not log.exists()
    _scaled_copy[(1,)](torch.zeros(4, device=runtime.kernel_device()),
                       torch.zeros(4, device=runtime.kernel_device()), 4, NEGATE=False, BLOCK=4)
    launch_log.note("t::loud", started)
    (rec,) = launch_log.read(log)
    assert rec["test"] == "t::loud" and rec["kernels"] == [f"{__name__}._scaled_copy[NEGATE=False]{{float32}}"]
    assert rec["seconds"] >= 0


def _rec(test, kernels, seconds):
    return {"test": test, "kernels": kernels, "seconds": seconds}


def test_select_covers_every_key_cheaply():
    records = [_rec("a", ["k1", "k2", "k3"], 10.0),     # covers all, but slow
               _rec("b", ["k1", "k2"], 1.0),
               _rec("c", ["k3"], 1.0),
               _rec("d", ["k1"], 0.5),
               _rec("b", ["k4"], 2.0)]                  # a test seen twice counts with both lines
    chosen = launch_log.select(records)
    assert chosen == ["b", "c"]
    covered = set().union(*(set(r["kernels"]) for r in records if r["test"] in chosen))
    assert covered == {"k1", "k2", "k3", "k4"}
    assert launch_log.select([]) == []


def test_select_from_the_command_line(tmp_path, capsys):
    log, out = tmp_path / "log.jsonl", tmp_path / "chosen.txt"
    log.write_text("".join(json.dumps(r) + "\n" for r in [_rec("x::a", ["k"], 3.0), _rec("x::b", ["k"], 1.0)]))
    assert launch_log.main(["select", str(log), str(out)]) == 0
    assert out.read_text() == "x::b\n"
    assert "1 of 2 kernel-launching tests launch all 1 kernel keys" in capsys.readouterr().out


@pytest.mark.parametrize("content", ["not json\n", '{"test": "a"}\n'])
def test_a_damaged_log_is_named(tmp_path, capsys, content):
    log = tmp_path / "log.jsonl"
    log.write_text(content)
    with pytest.raises(ValueError, match="log.jsonl:1 is not a launch-log line"):
        launch_log.read(log)
    assert launch_log.main(["select", str(log), str(tmp_path / "o")]) == 2
    assert launch_log.main(["pick"]) == 2
    assert "usage" in capsys.readouterr().err
