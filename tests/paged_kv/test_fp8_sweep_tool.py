"""``tools/fp8_decode_sweep.py`` (the FP8 GPU sweep) on toy sizes: every part checks before it
times and writes its results as it goes, the bytes and ratios it reports follow from its own
numbers, a small budget skips what would run past it (and says so), and bad arguments get a
one-line answer. On the CPU the kernels run in Triton's interpreter (seconds, not speeds)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.support.devices import ON_GPU

TOOL = Path(__file__).resolve().parents[2] / "tools" / "fp8_decode_sweep.py"


def _tool():
    spec = importlib.util.spec_from_file_location("fp8_decode_sweep", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_cpu_smoke_checks_then_times_every_part(tmp_path, capsys):
    sweep = _tool()
    out = tmp_path / "sweep.jsonl"
    assert sweep.main(["--cpu-smoke", "--out", str(out)]) == 0
    recs = _lines(out)
    parts = [r["part"] for r in recs]
    assert {"ceilings", "decode_check", "decode", "moe", "prefill", "msa", "suggestion"} <= set(parts)
    assert "skipped" not in parts
    # checks come before the timings they cover, and every checked config was timed
    assert parts.index("decode_check") < parts.index("decode")
    checked = [r for r in recs if r["part"] == "decode_check"]
    assert all("max_rel_err" in r and r["max_rel_err"] < 2e-2 for r in checked)
    decode = [r for r in recs if r["part"] == "decode" and "variant" in r and "case" in r and "bytes" in r]
    first = decode[0]["case"]
    timed = {json.dumps(r["config"], sort_keys=True) for r in decode if r["case"] == first and r.get("config")}
    assert {json.dumps(r["config"], sort_keys=True) for r in checked} <= timed
    # the bytes each must read, and the ratio to bf16 of the same run
    c = next(r for r in decode if r["variant"] == "bf16" and r["case"] == first)["shape"]
    n_tok, n_page = c["B"] * c["L"] * c["Hkv"], c["B"] * -(-c["L"] // c["page"])
    bf16 = next(r for r in decode if r["variant"] == "bf16" and r["case"] == first)
    assert bf16["bytes"] == 2 * n_tok * c["D"] * 2 + 4 * n_page
    for r in decode:
        if r["case"] != first or r["variant"] == "bf16" or r["timing"].startswith("CUDA graph"):
            continue
        want = 2 * n_tok * c["D"] + 4 * n_page + (8 * n_tok if r["scale_layout"] == "token" else 8 * n_page * c["Hkv"])
        assert r["bytes"] == want, r["variant"]
        assert r["vs_bf16"] == pytest.approx(bf16["ms"] / r["ms"])
        assert r["gbps"] == pytest.approx(r["bytes"] / r["ms"] / 1e6)
    moe = {r["variant"] for r in recs if r["part"] == "moe"}
    assert moe == {"bf16", "fp8", "fp8 separate quantize"}
    assert {r["variant"] for r in recs if r["part"] == "prefill"} == {"bf16", "fp8 token", "fp8 page"}
    suggestion = next(r for r in recs if r["part"] == "suggestion")
    assert set(suggestion["config"]) == {"BLOCK_N", "num_warps", "num_stages", "programs_per_sm", "GATHER"}
    printed = capsys.readouterr().out
    assert "== summary" in printed and "every check passed" in printed and '"paged_decode_fp8"' in printed


def test_budget_skips_what_would_run_past_it(tmp_path, capsys):
    sweep = _tool()
    out = tmp_path / "short.jsonl"
    assert sweep.main(["--cpu-smoke", "--out", str(out), "--budget-s", "0.01"]) == 0
    recs = _lines(out)
    assert recs and all(r["part"] == "skipped" for r in recs)
    assert {r["what"] for r in recs} >= {"ceilings", "moe T=2", "prefill", "msa fp8 K/V decode"}
    assert "[skip]" in capsys.readouterr().out


@pytest.mark.skipif(ON_GPU, reason="CPU-only: checks the refusal without a GPU")
def test_mistakes_get_one_line_and_a_nonzero_exit(tmp_path, capsys):
    sweep = _tool()
    assert sweep.main(["--out", str(tmp_path / "x.jsonl")]) == 2       # no GPU, no --cpu-smoke
    assert "--cpu-smoke" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        sweep.main(["--cpu-smoke", "--out", str(tmp_path / "x.jsonl"), "--budget-s", "-1"])
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1
    with pytest.raises(SystemExit) as e:
        sweep.main(["--cpu-smoke", "--out", str(tmp_path / "x.jsonl"), "--parts", "nope"])
    assert e.value.code == 2
    (tmp_path / "a_file").write_text("")
    assert sweep.main(["--cpu-smoke", "--out", str(tmp_path / "a_file" / "x.jsonl")]) == 2   # a file as folder
    assert "cannot write" in capsys.readouterr().err
