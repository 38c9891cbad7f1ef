"""The launch blocks beside the kernels: every op and key resolves on the H200 and in the interpreter
exactly as it did before the blocks moved there (``data/launch_configs_h200_before.json``, recorded
before the move), the blocks added since resolve as set, every op and key resolves on each GPU a
learner has (its family's default), the tuner's candidates are unchanged
(``data/tune_candidates_before.json``), and the shipped config files hold values only.

The interpreter's configs are compared under a forced interpreter and the GPUs' under a fake GPU
(:func:`tests.support.gpus.fake_gpu`), so these tests ask the same on a CPU and on a GPU; what this
machine resolves (its interpreter config, or its GPU's) is a test of its own."""
from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path

import pytest

import minimax_lab
from minimax_lab import configs, runtime
from minimax_lab.attention import (dense_triton, msa_backward_index_triton, msa_backward_triton, msa_triton_decode,
                                   msa_triton_prefill, msa_triton_select)
from minimax_lab.paged_kv import decode_triton, prefill_triton
from minimax_lab.moe import align_triton, experts_triton
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


@pytest.fixture
def interpreting(monkeypatch):
    """The loader as under Triton's interpreter, on any machine."""
    monkeypatch.setattr(configs, "interpreting", lambda: True)


@pytest.mark.parametrize("op", sorted(BEFORE["interpreter"]))
def test_every_interpreter_config_is_as_before(op, interpreting):
    assert configs.launch_config(LAUNCHES[op]) == dict(LAUNCHES[op].interpreter) == BEFORE["interpreter"][op]


def _keys(launch: configs.Launch) -> tuple:
    return launch.regimes or (None,)


#: the FP8 ops: a family before sm_89 has no entry for them (their launchers refuse such a GPU first)
FP8_OPS = {op for op in LAUNCHES if op.endswith("_fp8")}


@pytest.mark.parametrize("name", sorted(f"{op}/{key}" if key else op for op, launch in LAUNCHES.items()
                                        for key in _keys(launch)))
def test_what_this_machine_resolves_is_its_interpreter_config_or_its_gpus(name):
    """Under the interpreter the block's own config; on a GPU this GPU's entry or its family's (an
    FP8 op on a GPU without FP8 has none)."""
    launch, key = _split(name)
    if configs.interpreting():
        assert configs.launch_config(launch, key=key) == dict(launch.interpreter)
        return
    if launch.op in FP8_OPS and not runtime.supports("fp8"):
        with pytest.raises(KeyError, match="no launch config"):
            configs.launch_config(launch, key=key)
        return
    assert configs.launch_config(launch, key=key) == configs.gpu_config(launch, key)


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_every_op_and_key_resolves_on_every_gpu(gpu, monkeypatch):
    """A GPU without a tuned file of its own (an H100, an A100, an L4, a T4) finds every op and every
    key of it in its family's file, with keys its op takes; FP8 ops only where the GPU has FP8.
    An op configured per key has no config without one."""
    fake_gpu(monkeypatch, GPUS[gpu])
    for op, launch in LAUNCHES.items():
        for key in _keys(launch):
            if op in FP8_OPS and not GPUS[gpu].fp8:
                with pytest.raises(KeyError, match=f"no launch config for {op!r}"):
                    configs.launch_config(launch, key=key)
                continue
            cfg = configs.launch_config(launch, key=key)
            assert cfg and set(cfg) <= set(launch.keys), (gpu, op, key)
        if launch.regimes:
            with pytest.raises(KeyError, match=f"no launch config for {op!r}"):
                configs.launch_config(launch)


def test_the_table_covers_every_launch_block_and_key():
    """Every op the table recorded still has a block; the ops added since are listed below, each
    with its launch (:data:`ADDED`)."""
    recorded = {name.partition("/")[0] for name in BEFORE["gpu"]}
    assert recorded | set(ADDED) == set(LAUNCHES)
    for launch in LAUNCHES.values():
        for key in launch.regimes:
            assert f"{launch.op}/{key}" in BEFORE["gpu"]


#: the blocks added after the table was recorded: (the block, its interpreter config, the H200's)
ADDED = {
    # the sparse decode's attention: the launch fixed in the code before it had a block
    "msa_decode": (msa_triton_decode.DECODE_LAUNCH, {"num_warps": 4, "num_stages": 1},
                   {"num_warps": 4, "num_stages": 3}),
    # the FP8 paged decode (its values are the paged decode's to test)
    "paged_decode_fp8": (decode_triton.FP8_LAUNCH, None, None),
    # MSA's backward: the interpreter config it had; on Hopper at most 64 keys per KV-outer program
    # (a whole 128-key block's dK and dV accumulators in 4 warps' registers spill)
    "msa_backward": (msa_backward_triton.LAUNCH,
                     {"BLOCK_M": 16, "BLOCK_KN": 0, "num_warps": 4, "num_stages": 1, "Q_WARPS": 4, "Q_STAGES": 1},
                     {"BLOCK_M": 32, "BLOCK_KN": 64, "num_warps": 4, "num_stages": 1, "Q_WARPS": 4, "Q_STAGES": 1}),
    # the index loss's kernels: the configs they had (Triton's default of 3 stages on the GPU)
    "msa_index_backward": (msa_backward_index_triton.LAUNCH, {"BLOCK_M": 16, "num_warps": 4, "num_stages": 1},
                           {"BLOCK_M": 64, "num_warps": 4, "num_stages": 3}),
    # the MoE alignment kernels: the 8 warps they were launched with
    "moe_align": (align_triton.LAUNCH, {"num_warps": 8}, {"num_warps": 8}),
}


@pytest.mark.parametrize("op", sorted(op for op, (_, interp, _) in ADDED.items() if interp is not None))
def test_the_blocks_added_since_resolve_as_set(op, monkeypatch):
    launch, interpreter, h200 = ADDED[op]
    with monkeypatch.context() as m:
        m.setattr(configs, "interpreting", lambda: True)
        assert configs.launch_config(launch) == interpreter
    fake_gpu(monkeypatch, GPUS["H200"])
    assert configs.launch_config(launch) == h200


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
    fp8_ops = {"msa_select_fp8", "moe_experts_fp8", "paged_decode_fp8", "paged_prefill_fp8", "write_kv_fp8"}
    for name, since, _ in configs.FAMILIES:
        ops = json.loads(configs.family_path(name).read_text())["ops"]
        want = set(LAUNCHES) - (set() if since >= (8, 9) else fp8_ops)
        assert set(ops) == want, name
    assert set(json.loads((CONFIG_DIR / "NVIDIA_H200.json").read_text())["ops"]) == set(LAUNCHES)
