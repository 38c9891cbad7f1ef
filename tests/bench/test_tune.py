"""The launch-config loader (minimax_lab.configs) and the tuner (python -m minimax_lab.bench.tune)."""
from __future__ import annotations

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

ROOT = Path(__file__).resolve().parents[2]

#: today's H200 values, as they were hand-copied into the kernel modules before the tuner
H200_PAGED_DECODE = {"BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "programs_per_sm": 2}
H200_MOE_PREFILL = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3,
                    "DOWN_BLOCK_N": 128, "DOWN_BLOCK_K": 64, "SWAP_AB": False, "DOWN_SWAP_AB": False, "USE_TMA": True}
INTERP = {"BLOCK_N": 16, "num_warps": 1, "num_stages": 1, "programs_per_sm": 2}


@pytest.fixture
def gpu_view(tmp_path, monkeypatch):
    """The loader as on a GPU named TEST_GPU, with its tuned files in tmp_path."""
    monkeypatch.setenv(configs.ENV_DIR, str(tmp_path))
    monkeypatch.setattr(configs, "device_slug", lambda: "TEST_GPU")
    monkeypatch.setattr(configs, "interpreting", lambda: False)
    return tmp_path / "TEST_GPU.json"


def _write(path: Path, ops: dict) -> None:
    path.write_text(json.dumps({"device": "test", "ops": ops}))


def test_interpreter_config_wins_under_the_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv(configs.ENV_DIR, str(tmp_path))
    monkeypatch.setattr(configs, "device_slug", lambda: "TEST_GPU")
    monkeypatch.setattr(configs, "interpreting", lambda: True)
    tuned = {**H200_PAGED_DECODE, "BLOCK_N": 32}
    _write(tmp_path / "TEST_GPU.json", {"paged_decode": {"source": "t", "config": tuned}})
    assert configs.launch_config("paged_decode", interpreter=INTERP) == INTERP


def test_tuned_file_wins_over_the_builtin_default(gpu_view):
    tuned = {**H200_PAGED_DECODE, "BLOCK_N": 32, "num_warps": 8}
    assert configs.launch_config("paged_decode", interpreter=INTERP) == H200_PAGED_DECODE  # no file: built-in
    _write(gpu_view, {"paged_decode": {"source": "t", "config": tuned}})
    assert configs.launch_config("paged_decode", interpreter=INTERP) == tuned
    # an op the file does not hold falls back to the built-in default; keyed ops pick their key
    assert configs.launch_config("moe_experts", interpreter=INTERP, key="prefill") == H200_MOE_PREFILL
    _write(gpu_view, {"moe_experts": {"source": "t", "by_key": {"prefill": {**H200_MOE_PREFILL, "BLOCK_K": 32}}}})
    assert configs.launch_config("moe_experts", interpreter=INTERP, key="prefill")["BLOCK_K"] == 32
    builtin_decode = configs.builtin("moe_experts", "decode")
    assert configs.launch_config("moe_experts", interpreter=INTERP, key="decode") == builtin_decode


def test_builtin_defaults_are_the_hand_tuned_h200_values():
    data = json.loads(configs.DEFAULT_FILE.read_text())
    assert configs.DEFAULT_FILE.name == "NVIDIA_H200.json"
    assert data["ops"]["paged_decode"]["config"] == H200_PAGED_DECODE
    assert data["ops"]["moe_experts"]["by_key"]["prefill"] == H200_MOE_PREFILL
    for op, entry in data["ops"].items():   # every number came from a sweep or from the tuner, never typed
        assert "carried over" in entry["source"] or entry["source"].startswith(f"python -m minimax_lab.tune {op}"), op
        for key, source in entry.get("earlier_source", {}).items():
            assert key in entry["by_key"] and ("carried over" in source or source.startswith("python -m")), (op, key)
    moe = data["ops"]["moe_experts"]
    assert moe["source"].startswith("python -m minimax_lab.tune moe_experts --keys decode decode_wide")
    assert set(moe["earlier_source"]) == {"decode", "decode_wide", "prefill"}
    assert {"prefill", "decode", "decode_wide"} <= set(moe["measured"])
    for key, measured in moe["measured"].items():  # each winner follows the tuner's rule on what it measured
        assert_winner_rule(moe["by_key"][key], measured)


def assert_winner_rule(config: dict, measured: dict) -> None:
    """The written config is the best geometric mean measured, or the current config kept within
    the margin (and then the entry says so)."""
    timings = measured["timings"]
    gm = {lbl: math.exp(sum(math.log(v) for v in t.values()) / len(t)) for lbl, t in timings.items()}
    label, fastest = tune._label(config), min(gm, key=gm.get)
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
    BLOCK_K for fp32) must not change the next caller's, and a deleted file means the built-in."""
    first = configs.launch_config("paged_decode", interpreter=INTERP)
    first["num_warps"] = 99
    assert configs.launch_config("paged_decode", interpreter=INTERP) == H200_PAGED_DECODE
    _write(gpu_view, {"paged_decode": {"source": "t", "config": {**H200_PAGED_DECODE, "BLOCK_N": 32}}})
    assert configs.launch_config("paged_decode", interpreter=INTERP)["BLOCK_N"] == 32
    gpu_view.unlink()
    assert configs.launch_config("paged_decode", interpreter=INTERP) == H200_PAGED_DECODE


def test_override_merges_key_by_key_and_unknown_keys_raise(gpu_view):
    got = configs.launch_config("paged_decode", interpreter=INTERP, config={"num_warps": 8})
    assert got == {**H200_PAGED_DECODE, "num_warps": 8}
    with pytest.raises(ValueError, match=r"unknown config keys \['BLOCK_Q'\]; allowed: \['BLOCK_N'"):
        configs.launch_config("paged_decode", interpreter=INTERP, config={"BLOCK_Q": 16})
    with pytest.raises(ValueError, match="unknown op 'nope'"):
        configs.launch_config("nope", interpreter=INTERP)
    _write(gpu_view, {"paged_decode": {"source": "t", "config": {"BLOCK_N": 32, "WARPS": 2}}})
    with pytest.raises(ValueError, match=r"TEST_GPU.json: paged_decode has unknown config keys \['WARPS'\]"):
        configs.launch_config("paged_decode", interpreter=INTERP)


def test_kernels_refuse_unknown_config_keys():
    from minimax_lab.attention.dense_triton import flash_attention
    from minimax_lab.attention.msa_triton_select import msa_select_triton
    from minimax_lab.kvcache.decode import paged_decode_triton
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
    out = tmp_path / "TEST_GPU.json"
    assert tune.main(["paged_decode", "--quick", "--out", str(out)]) == 0
    assert tune.main(["moe_experts", "--quick", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert set(data["ops"]) == {"paged_decode", "moe_experts"}
    dec = data["ops"]["paged_decode"]
    assert dec["source"].startswith("python -m minimax_lab.bench.tune paged_decode --quick")
    timings = dec["measured"]["timings"]
    assert len(timings) == 2 and not dec["measured"]["rejected"]          # current config + one variant
    assert_winner_rule(dec["config"], dec["measured"])
    # the loader, as on that GPU, returns what the tuner wrote
    monkeypatch.setenv(configs.ENV_DIR, str(tmp_path))
    monkeypatch.setattr(configs, "device_slug", lambda: "TEST_GPU")
    monkeypatch.setattr(configs, "interpreting", lambda: False)
    assert configs.launch_config("paged_decode", interpreter=INTERP) == dec["config"]
    moe = data["ops"]["moe_experts"]["by_key"]
    assert set(moe) == {"decode", "decode_wide"}                           # T=1 and T=40 at E=8, k=2
    for key, cfg in moe.items():
        assert configs.launch_config("moe_experts", interpreter=INTERP, key=key) == cfg
    assert "paged_decode: config" in capsys.readouterr().out


def test_tuner_keys_retune_one_regime_and_keep_the_others(tmp_path):
    out = tmp_path / "TEST_GPU.json"
    assert tune.main(["moe_experts", "--quick", "--out", str(out)]) == 0
    before = json.loads(out.read_text())["ops"]["moe_experts"]
    assert tune.main(["moe_experts", "--quick", "--keys", "decode", "--out", str(out)]) == 0
    after = json.loads(out.read_text())["ops"]["moe_experts"]
    assert after["source"].startswith("python -m minimax_lab.bench.tune moe_experts --quick --keys decode")
    assert after["by_key"]["decode_wide"] == before["by_key"]["decode_wide"]
    assert after["earlier_source"] == {"decode_wide": before["source"]}
    assert set(after["measured"]) == {"decode", "decode_wide"}
    with pytest.raises(ValueError, match="not among its tuned keys"):
        tune.tune_op("moe_experts", quick=True, keys=["prefill"])       # the quick shapes have no prefill


def test_tuner_rejects_a_wrong_candidate(monkeypatch):
    from minimax_lab.kvcache import decode

    real = decode.paged_decode_triton

    def broken_for_two_warps(*a, config=None, **kw):
        out = real(*a, config=config, **kw)
        return out + 1.0 if config and config.get("num_warps") == 2 else out

    monkeypatch.setattr(decode, "paged_decode_triton", broken_for_two_warps)
    lines = []
    res = tune.tune_op("paged_decode", quick=True, log=lines.append)[None]
    assert res["config"] == tune._current("paged_decode") and len(res["timings"]) == 1
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
    # every op of the shipped file (= every op the loader knows) is asked for by its kernel
    shipped = json.loads(configs.DEFAULT_FILE.read_text())["ops"]
    assert set(shipped) == set(configs.OPS)
    for op, entry in shipped.items():
        for cfg in (entry["by_key"].values() if "by_key" in entry else [entry["config"]]):
            assert set(cfg) <= set(configs.OPS[op]), op
    asked = []
    real = configs.launch_config
    monkeypatch.setattr(configs, "launch_config", lambda op, **kw: asked.append(op) or real(op, **kw))
    for name, build in tune.TUNERS.items():
        op = build()
        ins = op.cases(True)[0].make(0)
        before = len(asked)
        op.run({}, **ins)
        assert name in asked[before:], f"{name}'s kernel did not ask the loader for its config ({asked[before:]})"
    # FP8 experts: the regime's FP8 config
    from minimax_lab.moe import experts_triton
    asked.clear()
    experts_triton.pick_config(8, 8, 64, 48, 1, fp8=True)
    assert asked == ["moe_experts_fp8"]
    assert set(tune.TUNERS) | {"moe_experts_fp8"} == set(configs.OPS)


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
