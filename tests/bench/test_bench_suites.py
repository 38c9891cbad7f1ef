"""Every bench suite has one shape: ``CASES`` and ``run(preset, cases=None, **options)``; the CLI
passes ``--cases`` and the suite's options through; no suite reads a setting from the environment."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from minimax_lab import bench, measure
from minimax_lab.bench import cli as bench_cli

PACKAGE = Path(bench.__file__).resolve().parent
REPO = PACKAGE.parent


def test_select_cases():
    valid = ("a", "b", "c")
    assert measure.select_cases(None, valid) == ["a", "b", "c"]
    assert measure.select_cases(None, valid, ("c", "a")) == ["a", "c"]  # in the suite's order
    assert measure.select_cases(["c", "a"], valid) == ["a", "c"]
    assert measure.select_cases("b", valid) == ["b"]
    with pytest.raises(ValueError, match=r"unknown case group\(s\) \['x'\]; choose from \['a', 'b', 'c'\]"):
        measure.select_cases(["a", "x"], valid)
    with pytest.raises(ValueError, match="no case group given"):
        measure.select_cases([], valid)


@pytest.mark.parametrize("name", sorted(bench_cli.SUITES))
def test_every_suite_takes_cases_and_rejects_an_unknown_one(name):
    module = bench_cli.SUITES[name]
    assert module is not None, f"suite {name!r} does not import"
    assert isinstance(module.CASES, tuple) and module.CASES and all(isinstance(c, str) for c in module.CASES)
    assert set(getattr(module, "DEFAULT_CASES", ())) <= set(module.CASES)
    params = inspect.signature(module.run).parameters
    assert list(params)[:2] == ["preset", "cases"] and params["cases"].default is None
    for opt, spec in getattr(module, "OPTIONS", {}).items():  # every CLI option is a keyword of run
        assert opt in params and params[opt].kind is inspect.Parameter.KEYWORD_ONLY, (name, opt)
        assert spec.get("help"), (name, opt)
    with pytest.raises(ValueError) as err:
        module.run("cpu", cases=["no_such_group"])
    assert "no_such_group" in str(err.value) and all(c in str(err.value) for c in module.CASES)


# each run at preset cpu: (suite, case groups, options, what every record's case must look like)
SMALL_RUNS = [
    ("ceilings", ["gemm"], {}, r"gemm_\w+"),
    ("pitfalls", ["cache"], {}, r"cache_(resident|rotating)"),
    ("attention", ["gqa"], {}, r"causal_\w+_gqa\d+-\d+_\w+"),
    ("kvcache", ["write"], {}, r"write_kv_\w+"),
    ("kvcache", ["engine"], {}, r"engine_ttft_(cached|nocache)"),
    ("kernelbench", ["problems"], {"problems": ["softmax"], "n_test": 1}, r"softmax"),
    ("msa", ["decode"], {}, None),  # GPU-only group: nothing at preset cpu
]


@pytest.mark.parametrize("name,cases,options,pattern", SMALL_RUNS, ids=[f"{r[0]}-{r[1][0]}" for r in SMALL_RUNS])
def test_a_suite_runs_only_the_groups_asked_for(name, cases, options, pattern):
    recs = bench_cli.run_suite(name, "cpu", cases=cases, **options)
    if pattern is None:
        assert recs == []
    else:
        assert recs and all(re.fullmatch(pattern, r["case"]) for r in recs), [r["case"] for r in recs]
        assert all(r["suite"] == name for r in recs)


def test_attention_steps_ride_on_the_first_mha_case(monkeypatch):
    from minimax_lab.bench import suite_attention as bench_suite

    calls = []
    monkeypatch.setattr(bench_suite, "run_case", lambda c, reps, configs: calls.append((c, configs)) or [])
    bench_suite.run("cpu", cases=["gqa"])
    assert [c["Hq"] != c["Hkv"] for c, _ in calls] == [True] and calls[0][1] is None
    calls.clear()
    bench_suite.run("cpu", cases=["steps"])
    assert len(calls) == 1 and calls[0][0]["Hq"] == calls[0][0]["Hkv"] and calls[0][1] == bench_suite.STEP_CONFIGS["cpu"]
    calls.clear()
    bench_suite.run("cpu")
    assert len(calls) == len(bench_suite.cases("cpu")) and calls[0][1] and not any(cfg for _, cfg in calls[1:])


def _fake_run(seen: dict):
    def run(preset="auto", cases=None, **options):
        seen.update(preset=preset, cases=cases, options=options)
        return [measure.make_record("fake", "c", "ours", 1.0)]
    return run


def test_cli_passes_cases_and_options_through(monkeypatch, capsys):
    msa = bench_cli.SUITES["msa"]
    seen: dict = {}
    monkeypatch.setattr(msa, "run", _fake_run(seen))
    argv = ["msa", "--cases", "decode", "fp8kv", "--decode-sizes", "32:1024", "64:2048", "--no-dense",
            "--preset", "cpu", "--no-record"]
    assert bench_cli.main(argv) == 0
    assert seen == {"preset": "cpu", "cases": ["decode", "fp8kv"],
                    "options": {"decode_sizes": [(32, 1024), (64, 2048)], "dense": False}}
    assert bench_cli.main(["msa", "--no-record"]) == 0  # nothing given: the suite's defaults
    assert seen["cases"] is None and seen["options"] == {}

    kv = bench_cli.SUITES["kvcache"]
    monkeypatch.setattr(kv, "run", _fake_run(seen))
    assert bench_cli.main(["kvcache", "--cases", "fp8", "--no-record"]) == 0
    assert seen["cases"] == ["fp8"] and seen["options"] == {}
    capsys.readouterr()


@pytest.mark.parametrize("argv,message", [
    (["kvcache", "--cases", "nope"], "unknown case group"),
    (["kvcache", "msa", "--cases", "decode"], "one suite"),
    (["kvcache", "--lengths", "4096"], "unrecognized arguments"),  # an option of another suite
    (["msa", "--decode-sizes", "32x4096"], "B:context"),
    (["nope"], "unknown suite"),
])
def test_cli_refuses_bad_arguments_before_running(argv, message, monkeypatch, capsys):
    for name in ("kvcache", "msa"):
        monkeypatch.setattr(bench_cli.SUITES[name], "run", lambda *a, **k: pytest.fail("ran"))
    with pytest.raises(SystemExit) as e:
        bench_cli.main(argv + ["--no-record"])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_moe_and_kernelbench_options_reach_run(monkeypatch):
    seen: dict = {}
    for name, argv, want in [("moe", ["--tokens", "1", "64", "--fp8-sweep"], {"tokens": [1, 64], "fp8_sweep": True}),
                             ("kernelbench", ["--problems", "softmax", "--n-test", "1"],
                              {"problems": ["softmax"], "n_test": 1})]:
        monkeypatch.setattr(bench_cli.SUITES[name], "run", _fake_run(seen))
        assert bench_cli.main([name, "--no-record", *argv]) == 0
        assert seen["options"] == want, name


# a read of an environment variable whose name has BENCH in it: os.environ[...] / .get / getenv, or
# the name as a string constant (read elsewhere through a variable)
ENV_READ = re.compile(r"""(?:environ\s*(?:\.\s*(?:get|pop|setdefault)\s*\(|\[)|getenv\s*\()\s*[rbf]?["']([^"']*)["']""")
BENCH_NAME = re.compile(r"""["']([A-Z0-9_]*BENCH[A-Z0-9_]*)["']""")


def _bench_env_reads(text: str) -> list[str]:
    return [n for n in ENV_READ.findall(text) if "BENCH" in n.upper()] + BENCH_NAME.findall(text)


def test_the_check_for_environment_settings_can_fail():
    assert _bench_env_reads('x = os.environ.get("MSA_BENCH_CASES", "a")') == ["MSA_BENCH_CASES"] * 2
    assert _bench_env_reads("os.getenv('my_bench_flag')") == ["my_bench_flag"]
    assert _bench_env_reads('NAME = "KVCACHE_BENCH_CASES"') == ["KVCACHE_BENCH_CASES"]
    assert _bench_env_reads('os.environ.get("MINIMAX_LAB_RESULTS")') == []


def test_no_package_module_reads_a_bench_setting_from_the_environment():
    found = {str(p.relative_to(REPO)): hits for p in sorted(PACKAGE.rglob("*.py"))
             if (hits := _bench_env_reads(p.read_text()))}
    assert not found, f"bench settings come from run()'s arguments and the CLI, not the environment: {found}"


def test_bench_helpers_used_elsewhere_are_public():
    private = re.compile(r"\b(?:bench|measure)\._[a-z]\w*|from minimax_lab\.(?:bench|measure) import[^\n]*\b_[a-z]")
    homes = {Path(bench.__file__).resolve().parent, Path(measure.__file__).resolve().parent}
    found = {str(p.relative_to(REPO)): private.findall(p.read_text())
             for d in ("minimax_lab", "tools", "tests") for p in sorted((REPO / d).rglob("*.py"))
             if not homes & set(p.resolve().parents)}
    assert not {k: v for k, v in found.items() if v}
    for name in ("nbytes", "upcast", "poison_allocator", "select_cases"):
        assert (getattr(measure, name).__doc__ or "").strip(), name
    assert (bench_cli.run_suite.__doc__ or "").strip()


def test_kvcache_measure_is_a_case_group_and_writes_nothing_itself():
    from minimax_lab.bench import suite_kvcache as bench_suite, suite_kvcache_tiers as tiers_suite

    assert {"bandwidth", "engine"} <= set(bench_suite.CASES)
    assert not {"bandwidth", "engine"} & set(bench_suite.DEFAULT_CASES)
    source = inspect.getsource(tiers_suite)
    assert not hasattr(tiers_suite, "main") and not re.search(r"append_records|write_text|json\.dump|open\(", source)


def test_compare_flags_a_fallen_peer_ratio_and_a_missing_case(tmp_path):
    """`bench compare` reads ratios to peers (not times): a case 5% worse against its peer fails a
    3% tolerance, one 10% better passes, a case recorded before and not after is reported."""
    import json

    from minimax_lab import bench, measure

    def rec(case, ratio, ms=1.0):
        return {"suite": "msa", "case": case, "impl": "triton", "ms": ms, "speedup_vs": {"sglang": ratio}}

    before = [rec("decode", 1.00), rec("prefill", 2.00), rec("gone", 1.5)]
    after = [rec("decode", 0.95, ms=0.5), rec("prefill", 2.20)]
    out = measure.compare_records(before, after, tolerance=0.03)
    assert [r["case"] for r in out["regressions"]] == ["decode"] and out["missing"] == ["msa/gone/triton"]
    assert {r["case"]: round(r["change"], 3) for r in out["rows"]} == {"decode": -0.05, "prefill": 0.1}
    assert "**worse**" in measure.format_comparison(out)
    b, a = tmp_path / "b.json", tmp_path / "a.json"
    b.write_text(json.dumps(before))
    a.write_text(json.dumps(after))
    assert bench_cli.main(["compare", str(b), str(a)]) == 1
    a.write_text(json.dumps(after + [rec("gone", 1.5), rec("decode", 0.99)]))
    assert bench_cli.main(["compare", str(b), str(a), "--tolerance", "0.03"]) == 0
    with pytest.raises(ValueError, match="tolerance"):
        measure.compare_records(before, after, tolerance=2)
