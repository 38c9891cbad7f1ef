"""The launch blocks beside the kernels: every op and key resolves on the H200 and in the interpreter
exactly as it did before the blocks moved there (``data/launch_configs_h200_before.json``, recorded
before the move), the tuner's candidates are unchanged (``data/tune_candidates_before.json``), and
the shipped config files hold values only."""
from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path

import pytest

import minimax_lab
from minimax_lab import configs
from minimax_lab.attention import dense_triton, msa_triton_decode, msa_triton_prefill, msa_triton_select
from minimax_lab.paged_kv import decode_triton, prefill_triton
from minimax_lab.moe import experts_triton
from tests.support.gpus import GPUS, fake_gpu

DATA = Path(__file__).resolve().parent / "data"
BEFORE = json.loads((DATA / "launch_configs_h200_before.json").read_text())
CANDIDATES_BEFORE = json.loads((DATA / "tune_candidates_before.json").read_text())
CONFIG_DIR = Path(configs.__file__).parent


def all_launch_blocks() -> dict[str, configs.Launch]:
    """Every :class:`configs.Launch` in the package's modules, by op (each op once)."""
    found: dict[str, configs.Launch] = {}
    for mod in pkgutil.walk_packages(minimax_lab.__path__, "minimax_lab."):
        if mod.name.endswith("__main__") or mod.name.startswith(("minimax_lab.exercises", "minimax_lab.notebook")):
            continue
        module = importlib.import_module(mod.name)
        for value in vars(module).values():
            if isinstance(value, configs.Launch):
                assert found.get(value.op, value) is value, f"two launch blocks name op {value.op!r}"
                found[value.op] = value
    return found


LAUNCHES = all_launch_blocks()


def _split(name: str) -> tuple[configs.Launch, str | None]:
    op, _, key = name.partition("/")
    return LAUNCHES[op], key or None


@pytest.mark.parametrize("name", sorted(BEFORE["gpu"]))
def test_every_op_and_key_resolves_on_the_h200_as_before(name, monkeypatch):
    fake_gpu(monkeypatch, GPUS["H200"])
    launch, key = _split(name)
    assert configs.launch_config(launch, key=key) == BEFORE["gpu"][name]


@pytest.mark.parametrize("op", sorted(BEFORE["interpreter"]))
def test_every_interpreter_config_is_as_before(op):
    assert configs.launch_config(LAUNCHES[op]) == BEFORE["interpreter"][op]


def test_the_table_covers_every_launch_block_and_key():
    """Every op the table recorded still has a block; the ops added since are the sparse decode's
    attention, whose launch was fixed in the code (``num_warps=4``, 3 stages on a GPU), and the FP8
    paged decode, which had the bf16 decode's launch."""
    recorded = {name.partition("/")[0] for name in BEFORE["gpu"]}
    assert recorded | {"msa_decode", "paged_decode_fp8"} == set(LAUNCHES)
    for launch in LAUNCHES.values():
        for key in launch.regimes:
            assert f"{launch.op}/{key}" in BEFORE["gpu"]


def test_the_added_sparse_decode_block_keeps_the_launch_it_had(monkeypatch):
    assert configs.launch_config(msa_triton_decode.DECODE_LAUNCH) == {"num_warps": 4, "num_stages": 1}
    fake_gpu(monkeypatch, GPUS["H200"])
    assert configs.launch_config(msa_triton_decode.DECODE_LAUNCH) == {"num_warps": 4, "num_stages": 3}


#: where each candidate list of the old tuner lives now
CANDIDATES_NOW = {
    "FLASH_CANDIDATES": dense_triton.LAUNCH.candidates_for(None),
    "MOE_DECODE_CANDIDATES": experts_triton.LAUNCH.candidates_for("decode"),
    "MOE_PREFILL_CANDIDATES": experts_triton.LAUNCH.candidates_for("prefill"),
    "MSA_INDEX_CANDIDATES": msa_triton_decode.INDEX_LAUNCH.candidates_for(None),
    "MSA_PREFILL_CANDIDATES": msa_triton_prefill.LAUNCH.candidates_for(None),
    "MSA_SELECT_CANDIDATES": msa_triton_select.LAUNCH.candidates_for(None),
    "MSA_SELECT_FP8_CANDIDATES": msa_triton_select.FP8_LAUNCH.candidates_for(None),
    "PAGED_DECODE_CANDIDATES": decode_triton.LAUNCH.candidates_for(None),
    "PAGED_PREFILL_CANDIDATES": prefill_triton.LAUNCH.candidates_for(None),
    "QUICK_VARIANT": dict(decode_triton.LAUNCH.quick),
}
#: the quick variants the old tuner held per op (QUICK_VARIANT served the two paged ops)
QUICK_BEFORE = {"paged_decode": {"num_warps": 2}, "paged_prefill": {"num_warps": 2}, "flash": {"GROUP_H": 1024},
                "msa_index": {"PAGES": 4}, "msa_prefill": {"COMBINE_WARPS": 2}, "msa_select": {"num_warps": 2},
                "msa_select_fp8": {"num_warps": 2}, "moe_experts": {"BLOCK_K": 32}}


def test_the_tuners_candidates_are_as_before():
    assert json.loads(json.dumps(CANDIDATES_NOW)) == CANDIDATES_BEFORE
    assert experts_triton.LAUNCH.candidates_for("decode_wide") == experts_triton.LAUNCH.candidates_for("decode")
    assert {op: dict(LAUNCHES[op].quick) for op in QUICK_BEFORE} == QUICK_BEFORE


def _entries(data: dict):
    for op, entry in data["ops"].items():
        cfgs = entry["by_key"] if "by_key" in entry else {None: entry["config"]}
        for key, cfg in cfgs.items():
            yield op, key, cfg, entry["source"][key] if key is not None else entry["source"]


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.json")), ids=lambda p: p.name)
def test_config_files_hold_values_and_the_run_that_made_them(path):
    """Only ``device`` and ``ops``; each entry only ``source`` and ``config``/``by_key``; every
    config's keys are its op's; the source names a tuner run or a hand sweep, never a commit or
    the history of the entry."""
    data = json.loads(path.read_text())
    assert set(data) == {"device", "ops"}
    for op, entry in data["ops"].items():
        assert set(entry) in ({"source", "config"}, {"source", "by_key"}), (path.name, op)
        if "by_key" in entry:
            assert set(entry["source"]) == set(entry["by_key"]) == set(LAUNCHES[op].regimes), (path.name, op)
    for op, key, cfg, source in _entries(data):
        LAUNCHES[op].check_keys(cfg, where=path.name)
        assert source.startswith(("python -m minimax_lab.bench.tune ", "hand", "the NVIDIA H200's entry")), source
        for history in ("carried over", "previous", " at ", "commit", "earlier"):
            assert history not in source, (path.name, op, key, source)


def test_every_family_file_configures_every_op_it_can_run():
    """A family holds every op; FP8 ops only where the family has FP8 (sm_89 and newer)."""
    fp8_ops = {"msa_select_fp8", "moe_experts_fp8", "paged_decode_fp8"}
    for name, since, _ in configs.FAMILIES:
        ops = json.loads(configs.family_path(name).read_text())["ops"]
        want = set(LAUNCHES) - (set() if since >= (8, 9) else fp8_ops)
        assert set(ops) == want, name
    assert set(json.loads((CONFIG_DIR / "NVIDIA_H200.json").read_text())["ops"]) == set(LAUNCHES)
