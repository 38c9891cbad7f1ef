"""The launch-config loader (minimax_lab.configs) and the tuner (python -m minimax_lab.bench.tune)."""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import tomllib
from pathlib import Path

import pytest
import torch

import minimax_lab  # noqa: F401  (first: decides the Triton interpreter)
from minimax_lab import configs, runtime
from minimax_lab.bench import tune
from minimax_lab.paged_kv import decode_triton
from minimax_lab.moe import experts_triton
from tests.support.gpus import GPUS, fake_gpu

ROOT = Path(__file__).resolve().parents[2]

#: the H200's values (NVIDIA_H200.json), also the sm_90 family's default
H200_PAGED_DECODE = {"BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "programs_per_sm": 2}
H200_MOE_PREFILL = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3,
                    "DOWN_BLOCK_N": 128, "DOWN_BLOCK_K": 64, "SWAP_AB": False, "DOWN_SWAP_AB": False, "USE_TMA": True}
INTERP = {"BLOCK_N": 16, "num_warps": 1, "num_stages": 1, "programs_per_sm": 2}
PAGED_DECODE = decode_triton.LAUNCH
MOE = experts_triton.LAUNCH
#: a Hopper GPU the package has no tuned file for
TEST_GPU = dataclasses.replace(GPUS["H100"], name="TEST GPU")


@pytest.fixture
def gpu_view(tmp_path, monkeypatch):
    """The loader as on a Hopper GPU named TEST GPU, with its tuned files in tmp_path."""
    fake_gpu(monkeypatch, TEST_GPU)
    monkeypatch.setenv(configs.ENV_DIR, str(tmp_path))
    return tmp_path / "TEST_GPU.json"


def _write(path: Path, ops: dict) -> None:
    path.write_text(json.dumps({"device": "test", "ops": ops}))


def test_interpreter_config_wins_under_the_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv(configs.ENV_DIR, str(tmp_path))
    monkeypatch.setattr(configs, "interpreting", lambda: True)
    tuned = {**H200_PAGED_DECODE, "BLOCK_N": 32}
    _write(tmp_path / f"{configs.device_slug()}.json", {"paged_decode": {"source": "t", "config": tuned}})
    assert PAGED_DECODE.interpreter == INTERP
    assert configs.launch_config(PAGED_DECODE) == INTERP


def test_tuned_file_wins_over_the_family_default(gpu_view):
    tuned = {**H200_PAGED_DECODE, "BLOCK_N": 32, "num_warps": 8}
    assert configs.launch_config(PAGED_DECODE) == H200_PAGED_DECODE  # no file: the sm_90 family's
    _write(gpu_view, {"paged_decode": {"source": "t", "config": tuned}})
    assert configs.launch_config(PAGED_DECODE) == tuned
    # an op the file does not hold falls back to the family default; keyed ops pick their key
    assert configs.launch_config(MOE, key="prefill") == H200_MOE_PREFILL
    _write(gpu_view, {"moe_experts": {"source": {"prefill": "t"},
                                      "by_key": {"prefill": {**H200_MOE_PREFILL, "BLOCK_K": 32}}}})
    assert configs.launch_config(MOE, key="prefill")["BLOCK_K"] == 32
    family = json.loads(configs.family_path("sm_90").read_text())["ops"]
    assert configs.launch_config(MOE, key="decode") == family["moe_experts"]["by_key"]["decode"]


def test_a_gpu_falls_back_to_its_architectures_family_not_to_the_h200(monkeypatch):
    """Without a tuned file each GPU takes its family's default (by compute capability and shared
    memory per block), which is not the H200's entry below Hopper."""
    assert [configs.family(GPUS[g]) for g in ("T4", "L4", "A100", "H100", "H200")] == \
        ["sm_75", "sm_89", "sm_80", "sm_90", "sm_90"]
    consumer_ampere = runtime.gpu_capabilities("RTX 3090", 8, 6, sm_count=82, smem_per_block=99 * 1024)
    blackwell_desktop = runtime.gpu_capabilities("RTX 5090", 12, 0, sm_count=170, smem_per_block=99 * 1024)
    assert configs.family(consumer_ampere) == "sm_75" and configs.family(blackwell_desktop) == "sm_89"
    h200 = json.loads((ROOT / "minimax_lab" / "configs" / "NVIDIA_H200.json").read_text())["ops"]
    for name in ("T4", "L4", "A100"):
        fake_gpu(monkeypatch, GPUS[name])
        family = json.loads(configs.family_path(configs.family(GPUS[name])).read_text())["ops"]
        assert configs.launch_config(PAGED_DECODE) == family["paged_decode"]["config"]
        assert configs.launch_config(MOE, key="prefill") != h200["moe_experts"]["by_key"]["prefill"]
    with pytest.raises(KeyError, match="no launch config for 'moe_experts_fp8'"):
        configs.launch_config(experts_triton.FP8_LAUNCH, key="decode")   # the A100's family has no FP8


def test_the_shipped_h200_entries_and_the_runs_that_made_them():
    data = json.loads((ROOT / "minimax_lab" / "configs" / "NVIDIA_H200.json").read_text())
    assert data["ops"]["paged_decode"] == {"source": "hand sweep on NVIDIA H200", "config": H200_PAGED_DECODE}
    assert data["ops"]["moe_experts"]["by_key"]["prefill"] == H200_MOE_PREFILL
    runs = json.loads((ROOT / "results" / "tune_NVIDIA_H200.json").read_text())["runs"]
    assert {(r["op"], r["key"]) for r in runs} >= {("moe_experts", k) for k in ("prefill", "decode", "decode_wide")}
    for run in runs:   # each tuned entry is the winner of its run, by the tuner's rule on what it measured
        entry = data["ops"][run["op"]]
        shipped = entry["by_key"][run["key"]] if run["key"] else entry["config"]
        source = entry["source"][run["key"]] if run["key"] else entry["source"]
        assert run["source"] == source
        assert run["config"] == shipped
        assert_winner_rule(shipped, run)
    assert tune.recorded_run("moe_experts", "prefill")["config"] == H200_MOE_PREFILL
    assert tune.recorded_run("moe_experts", "nope") is None


def assert_winner_rule(config: dict, measured: dict) -> None:
    """The written config is the best geometric mean measured, or the current config kept within
    the margin (and then the entry says so)."""
    timings = measured["timings"]
    gm = {lbl: math.exp(sum(math.log(v) for v in t.values()) / len(t)) for lbl, t in timings.items()}
    label, fastest = tune.label(config), min(gm, key=gm.get)
    if label != fastest:
        assert "kept_current" in measured and gm[label] <= gm[fastest] * (1 + tune.KEEP_CURRENT_MARGIN), label


def test_pick_winner_keeps_the_current_config_within_the_margin():
    score = {"cur": 10.05, "a": 10.0, "b": 11.0}
    assert tune.pick_winner(score, "cur") == "cur"                 # 0.5% slower: noise, kept
    assert tune.pick_winner({**score, "cur": 10.2}, "cur") == "a"  # 2% slower: replaced
    assert tune.pick_winner(score, None) == "a" and tune.pick_winner(score, "gone") == "a"
    assert tune.pick_winner(score, "cur", margin=0.0) == "a"


def test_warm_up_calls_for_the_given_time_and_swallows_failures():
    calls = []
    tune._warm_up(lambda: calls.append(1), 0.05)
    assert len(calls) >= 1
    tune._warm_up(lambda: 1 / 0, 10.0)   # returns at once: the candidate loop reports failures


def test_launch_configs_are_fresh_copies(gpu_view):
    """launch_config caches per file mtime: a caller that changes its dict (pick_config halves
    BLOCK_K for fp32) must not change the next caller's, and a deleted file means the default."""
    first = configs.launch_config(PAGED_DECODE)
    first["num_warps"] = 99
    assert configs.launch_config(PAGED_DECODE) == H200_PAGED_DECODE
    _write(gpu_view, {"paged_decode": {"source": "t", "config": {**H200_PAGED_DECODE, "BLOCK_N": 32}}})
    assert configs.launch_config(PAGED_DECODE)["BLOCK_N"] == 32
    gpu_view.unlink()
    assert configs.launch_config(PAGED_DECODE) == H200_PAGED_DECODE


def test_override_merges_key_by_key_and_unknown_keys_raise(gpu_view):
    got = configs.launch_config(PAGED_DECODE, config={"num_warps": 8})
    assert got == {**H200_PAGED_DECODE, "num_warps": 8}
    with pytest.raises(ValueError, match=r"paged_decode: unknown config keys \['BLOCK_Q'\]; allowed: \['BLOCK_N'"):
        configs.launch_config(PAGED_DECODE, config={"BLOCK_Q": 16})
    with pytest.raises(ValueError, match="config must be a dict"):
        configs.launch_config(PAGED_DECODE, config=[("num_warps", 8)])
    _write(gpu_view, {"paged_decode": {"source": "t", "config": {"BLOCK_N": 32, "WARPS": 2}}})
    with pytest.raises(ValueError, match=r"TEST_GPU.json: paged_decode has unknown config keys \['WARPS'\]"):
        configs.launch_config(PAGED_DECODE)
    gpu_view.write_text("{not json")
    with pytest.raises(ValueError, match="TEST_GPU.json: not valid JSON"):
        configs.launch_config(PAGED_DECODE)


def test_a_launch_block_refuses_keys_it_does_not_take():
    with pytest.raises(ValueError, match=r"launch block: demo has unknown config keys \['BLOCK_Q'\]"):
        configs.Launch(op="demo", keys=("BLOCK_N",), interpreter={"BLOCK_N": 16}, candidates=[{"BLOCK_Q": 8}])
    with pytest.raises(ValueError, match="demo: candidates for"):
        configs.Launch(op="demo", keys=("BLOCK_N",), interpreter={}, regimes=("a",), candidates={"b": []})


def test_kernels_refuse_unknown_config_keys():
    from minimax_lab.attention.dense_triton import flash_attention
    from minimax_lab.attention.msa_triton_select import msa_select_triton
    from minimax_lab.paged_kv.decode import paged_decode_triton
    from minimax_lab.moe.experts_triton import experts_triton

    op = tune.TUNERS["paged_decode"]()
    ins = op.cases(True)[0].make(0)
    with pytest.raises(ValueError, match="paged_decode: unknown config keys"):
        paged_decode_triton(**ins, config={"BLOCK": 16})
    q = torch.randn(1, 8, 2, 16, device=runtime.kernel_device())
    with pytest.raises(ValueError, match="flash: unknown config keys"):
        flash_attention(q, q, q, config={"BLOCK": 16})
    qi, ki = torch.randn(1, 40, 2, 16, device=q.device), torch.randn(1, 40, 16, device=q.device)
    with pytest.raises(ValueError, match="msa_select: unknown config keys"):
        msa_select_triton(qi, ki, block_size=16, topk=2, config={"BLOCK": 16})
    moe = tune.TUNERS["moe_experts"]().cases(True)[0].make(0)
    with pytest.raises(ValueError, match="moe_experts: unknown config keys"):
        experts_triton(moe["x"], moe["w_gate_up"], moe["w_down"], moe["weights"], moe["ids"],
                       config={"FP8_UPCAST": True})


def test_tuner_end_to_end_writes_a_file_the_loader_reads(tmp_path, monkeypatch, capsys):
    out, measured = tmp_path / "TEST_GPU.json", tmp_path / "tune_TEST_GPU.json"
    assert tune.main(["paged_decode", "--quick", "--out", str(out), "--results", str(measured)]) == 0
    assert tune.main(["moe_experts", "--quick", "--out", str(out), "--results", str(measured)]) == 0
    data = json.loads(out.read_text())
    assert set(data["ops"]) == {"paged_decode", "moe_experts"}
    dec = data["ops"]["paged_decode"]
    assert set(dec) == {"source", "config"}                               # values and their run only
    assert dec["source"].startswith("python -m minimax_lab.bench.tune paged_decode --quick on ")
    runs = json.loads(measured.read_text())["runs"]
    assert [(r["op"], r["key"]) for r in runs] == [("paged_decode", None), ("moe_experts", "decode"),
                                                   ("moe_experts", "decode_wide")]   # T=1 and T=40 at E=8, k=2
    assert len(runs[0]["timings"]) == 2 and not runs[0]["rejected"]       # current config + one variant
    assert runs[0]["source"] == dec["source"] and runs[0]["config"] == dec["config"]
    assert_winner_rule(dec["config"], runs[0])
    # the loader, as on that GPU, returns what the tuner wrote
    fake_gpu(monkeypatch, TEST_GPU)
    monkeypatch.setenv(configs.ENV_DIR, str(tmp_path))
    assert configs.launch_config(PAGED_DECODE) == dec["config"]
    moe = data["ops"]["moe_experts"]["by_key"]
    assert set(moe) == {"decode", "decode_wide"}
    for key, cfg in moe.items():
        assert configs.launch_config(MOE, key=key) == cfg
    assert configs.launch_config(MOE, key="prefill") == H200_MOE_PREFILL  # not tuned here: the family's
    assert "paged_decode: config" in capsys.readouterr().out


def test_tuner_keys_retune_one_regime_and_keep_the_others(tmp_path):
    out, measured = tmp_path / "TEST_GPU.json", tmp_path / "tune.json"
    assert tune.main(["moe_experts", "--quick", "--out", str(out), "--results", str(measured)]) == 0
    before = json.loads(out.read_text())["ops"]["moe_experts"]
    assert tune.main(["moe_experts", "--quick", "--keys", "decode", "--out", str(out), "--results", str(measured)]) == 0
    after = json.loads(out.read_text())["ops"]["moe_experts"]
    assert after["source"]["decode"].startswith("python -m minimax_lab.bench.tune moe_experts --quick --keys decode")
    assert after["by_key"]["decode_wide"] == before["by_key"]["decode_wide"]
    assert after["source"]["decode_wide"] == before["source"]["decode_wide"]    # kept, with its own run
    assert len(json.loads(measured.read_text())["runs"]) == 3                   # 2 + 1 appended
    with pytest.raises(ValueError, match="not among its tuned keys"):
        tune.tune_op("moe_experts", quick=True, keys=["prefill"])       # the quick shapes have no prefill


@pytest.mark.parametrize("args, damaged, message", [
    (["nope", "--quick"], None, "invalid choice: 'nope'"),
    (["paged_decode", "--quick", "--keys", "decode"], None, "not among its tuned keys"),
    (["paged_decode", "--quick"], "out", "not valid JSON"),
    (["paged_decode", "--quick"], "results", "not valid JSON"),
    (["paged_decode", "--quick", "--results", "{tmp}"], None, "Is a directory"),
])
def test_the_command_line_answers_mistakes_in_one_line(args, damaged, message, tmp_path, capsys):
    """Bad arguments and damaged files: one line on stderr, exit 2, no traceback, nothing written."""
    out, measured = tmp_path / "TEST_GPU.json", tmp_path / "tune.json"
    if damaged:
        (out if damaged == "out" else measured).write_text("{damaged")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--results" not in args:
        args += ["--results", str(measured)]
    with pytest.raises(SystemExit) as e:
        tune.main(args + ["--out", str(out)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    if not damaged:
        assert not out.exists()


def test_tuner_rejects_a_wrong_candidate(monkeypatch):
    from minimax_lab.paged_kv import decode

    real = decode.paged_decode_triton

    def broken_for_two_warps(*a, config=None, **kw):
        out = real(*a, config=config, **kw)
        return out + 1.0 if config and config.get("num_warps") == 2 else out

    monkeypatch.setattr(decode, "paged_decode_triton", broken_for_two_warps)
    lines = []
    res = tune.tune_op("paged_decode", quick=True, log=lines.append)[None]
    assert res["config"] == configs.launch_config(PAGED_DECODE) and len(res["timings"]) == 1
    (label, why), = res["rejected"].items()
    assert "num_warps=2" in label and "wrong output" in why
    assert any("REJECTED" in line and "num_warps=2" in line for line in lines)

    monkeypatch.setattr(decode, "paged_decode_triton", lambda *a, **kw: real(*a, **kw) * 2)
    with pytest.raises(RuntimeError, match="every candidate was rejected"):
        tune.tune_op("paged_decode", quick=True, log=lambda _: None)


def test_tuner_needs_quick_without_a_gpu(tmp_path):
    if not runtime.is_interpreter():
        pytest.skip("on a GPU the tuner runs without --quick (minutes: not a unit test)")
    with pytest.raises(SystemExit):
        tune.main(["flash", "--out", str(tmp_path / "x.json")])
    with pytest.raises(ValueError, match="only --quick"):
        tune.tune_op("flash")
    assert not (tmp_path / "x.json").exists()


def test_every_kernel_gets_its_config_through_the_loader(monkeypatch):
    """Each tuned op's kernel asks the loader for its own launch block's config."""
    asked = []
    real = configs.launch_config
    monkeypatch.setattr(configs, "launch_config", lambda launch, **kw: asked.append(launch.op) or real(launch, **kw))
    for name, build in tune.TUNERS.items():
        op = build()
        assert op.name == name
        ins = op.cases(True)[0].make(0)
        before = len(asked)
        op.run({}, **ins)
        assert name in asked[before:], f"{name}'s kernel did not ask the loader for its config ({asked[before:]})"
    # FP8 experts: the regime's FP8 config
    asked.clear()
    experts_triton.pick_config(8, 8, 64, 48, 1, fp8=True)
    assert asked == ["moe_experts_fp8"]


def test_config_files_ship_in_the_package():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = py["tool"]["setuptools"]["package-data"]["minimax_lab"]
    files = sorted((ROOT / "minimax_lab" / "configs").glob("*.json"))
    assert files
    for f in files:
        rel = f.relative_to(ROOT / "minimax_lab").as_posix()
        assert any(fnmatch.fnmatch(rel, g) for g in globs), f"{rel} is not package data"
    assert "include minimax_lab/configs/*.json" in (ROOT / "MANIFEST.in").read_text().splitlines()


def test_an_installed_package_is_never_written_into(monkeypatch, tmp_path):
    """Without --out the tuner writes where the kernels read: the package's own configs/ only in a
    clone; from an installed wheel it refuses and says how to choose a folder."""
    from minimax_lab import resources
    from minimax_lab.bench import tune
    monkeypatch.delenv("MINIMAX_LAB_CONFIG_DIR", raising=False)
    monkeypatch.setattr(resources, "checkout_root", lambda: None)
    with pytest.raises(SystemExit) as e:
        tune.main(["paged_decode", "--quick"])
    assert e.value.code == 2
