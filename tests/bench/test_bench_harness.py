"""The harness must catch wrong results, unwritten outputs and NaN -- and pass right ones.
Inputs live on the kernel device; the timing tests check the CPU wall clock and, on a GPU,
the CUDA-event and CUDA-graph methods."""
from __future__ import annotations

import json
import math

import pytest
import torch
from tests.support.devices import DEVICE, generator, gpu_only, randn

from minimax_lab import measure
from minimax_lab.bench import cli as bench_cli


def make_inputs(seed: int, device=None) -> dict:
    g = generator(seed)
    return {"x": randn(257, 33, gen=g, device=device), "w": randn(33, 17, gen=g, device=device)}


def reference(x, w):
    return x @ w


def test_right_answer_passes():
    res = measure.check(lambda x, w: x @ w, reference, make_inputs, trials=3)
    assert res.passed, res.summary()
    assert res.max_error < 1e-5


def test_wrong_answer_fails():
    res = measure.check(lambda x, w: x @ w * 1.01, reference, make_inputs)
    assert not res.passed and "rel err" in res.failures[0]


def test_nan_never_passes():
    def with_nan(x, w):
        y = x @ w
        y[3, 4] = float("nan")
        return y

    res = measure.check(with_nan, reference, make_inputs, tol=1e9)  # even with a huge tolerance
    assert not res.passed and math.isinf(res.max_error)


def test_unwritten_output_fails():
    def writes_half(x, w, out):
        out[: out.shape[0] // 2] = (x @ w)[: out.shape[0] // 2]
        return out

    make_out = lambda inp: torch.zeros(inp["x"].shape[0], inp["w"].shape[1], device=DEVICE)  # noqa: E731  zeros would hide it
    res = measure.check(writes_half, reference, make_inputs, make_out=make_out)
    assert not res.passed
    full = measure.check(lambda x, w, out: torch.matmul(x, w, out=out), reference, make_inputs, make_out=make_out)
    assert full.passed, full.summary()


def test_memorised_answer_fails_on_fresh_inputs():
    first = {}

    def memorise(x, w):
        if "y" not in first:
            first["y"] = x @ w
        return first["y"]

    res = measure.check(memorise, reference, make_inputs, trials=2)
    assert not res.passed  # trial 2 draws new inputs


def test_integer_outputs_must_match_exactly():
    mk = lambda s: {"x": randn(64, 40, gen=generator(s))}  # noqa: E731
    good = measure.check(lambda x: x.topk(4, dim=-1).indices, lambda x: x.topk(4, dim=-1).indices, mk)
    assert good.passed
    bad = measure.check(lambda x: x.topk(4, dim=-1).indices.flip(-1), lambda x: x.topk(4, dim=-1).indices, mk)
    assert not bad.passed and "integer" in bad.failures[0]


def test_relative_error_basics():
    a = torch.ones(10, device=DEVICE)
    assert measure.relative_error(a, a) == 0
    assert measure.relative_error(a, a.cpu() * 2) == 0.5  # the reference may live elsewhere
    assert measure.relative_error(torch.ones(3, device=DEVICE), torch.ones(4, device=DEVICE)) == math.inf
    with pytest.raises(TypeError):
        measure.relative_error([1.0], a)
    with pytest.raises(ValueError):
        measure.tolerance_for(torch.int32)


def test_cpu_timing_says_it_is_wall_clock():
    # CPU tensors take the wall-clock branch on every machine, a GPU one included
    t = measure.time_fn(lambda x, w: x @ w, lambda s: make_inputs(s, device="cpu"), reps=10, min_time_s=0.01)
    assert t.ms > 0 and "wall clock" in t.method and t.input_sets >= 2
    with pytest.raises(ValueError):
        measure.time_fn(lambda: None)


def test_a_closure_is_timed_on_the_runtimes_device():
    """``inputs={}`` and a closure: on a GPU machine CUDA events (a wall clock without a
    synchronize would time only the launch), elsewhere a wall clock."""
    if DEVICE.type == "cuda":
        t = measure.time_fn(lambda: torch.cuda._sleep(20_000_000), inputs={}, reps=5)  # ~10 ms of GPU spin
        assert t.method == "CUDA events per call" and t.ms > 4.0, t
    else:
        t = measure.time_fn(lambda: sum(range(20_000)), inputs={}, reps=5, min_time_s=0.01)
        assert "wall clock" in t.method and t.ms > 0


@gpu_only
@pytest.mark.parametrize("graph", [False, True], ids=["events", "cuda_graph"])
def test_gpu_timing_uses_cuda_events(graph):
    t = measure.time_fn(lambda x, w: x @ w, make_inputs, reps=10, cuda_graph=graph)
    assert t.ms > 0 and t.reps >= 5 and t.input_sets >= 2
    assert t.method == ("CUDA graph replay, events" if graph else "CUDA events per call")


def test_records_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIMAX_LAB_RESULTS", str(tmp_path))
    rec = measure.make_record("demo", "case1", "ours", 2.0, flops=4e12, bytes_moved=8e9, peers={"peer": 3.0})
    assert rec["tflops"] == 2000.0 and rec["gbps"] == 4000.0
    assert rec["speedup_vs"]["peer"] == 1.5
    path = measure.append_records([rec], tmp_path / "Some_GPU.json")
    measure.append_records([dict(rec, ms=1.0)], path)
    stored = json.loads(path.read_text())
    assert len(stored) == 2 and stored[0]["torch"] == torch.__version__ and "commit" in stored[0]
    newest = measure.load_records("Some GPU", suite="demo")
    assert len(newest) == 1 and newest[0]["ms"] == 1.0
    with pytest.raises(ValueError):
        measure.make_record("demo", "c", "ours", 0.0)


def test_cli_runs_ceilings_without_recording(capsys):
    assert bench_cli.main(["ceilings", "--no-record", "--preset", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "ceilings" in out and "copy" in out
    with pytest.raises(ValueError, match="unknown suite"):
        bench_cli.run_suite("nope")


def test_pitfalls_suite_records_each_mistake_beside_its_honest_twin():
    from minimax_lab.bench import suite_pitfalls as timing_pitfalls

    recs = {r["case"]: r for r in timing_pitfalls.run("cpu")}
    assert set(recs) == {"no_sync", "no_warmup", "single_run_min", "single_run_max", "honest",
                         "cache_resident", "cache_rotating"}
    assert recs["honest"]["speedup_vs"]["honest"] == 1.0
    assert recs["cache_rotating"]["speedup_vs"]["honest"] == 1.0
    assert recs["cache_resident"]["shape"]["n"] < recs["honest"]["shape"]["n"]


def test_a_tiny_speedup_keeps_its_size_in_the_record():
    """A ratio far below 1 (an interpreted kernel against a compiled peer) is kept to four significant
    figures, never rounded to 0."""
    rec = measure.make_record("s", "c", "ours", 2000.0, peers={"peer": 0.05, "slow_peer": 4000.0})
    assert rec["speedup_vs"] == {"peer": 2.5e-05, "slow_peer": 2.0}
