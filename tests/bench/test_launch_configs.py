"""The launch configs resolve on the H200 and in the interpreter exactly as they did before the
launch blocks moved beside their kernels (``data/launch_configs_h200_before.json``, recorded
before the move), and the tuner's candidates are unchanged (``data/tune_candidates_before.json``)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import minimax_lab  # noqa: F401  (first: decides the Triton interpreter)
from minimax_lab import configs
from minimax_lab.attention import dense_triton, msa_triton_decode, msa_triton_prefill, msa_triton_select
from minimax_lab.bench import tune
from minimax_lab.kvcache import decode_triton, prefill_triton
from minimax_lab.moe import experts_triton

DATA = Path(__file__).resolve().parent / "data"
BEFORE = json.loads((DATA / "launch_configs_h200_before.json").read_text())
CANDIDATES_BEFORE = json.loads((DATA / "tune_candidates_before.json").read_text())

INTERPRETER = {"paged_decode": decode_triton.INTERPRETER_CONFIG, "paged_prefill": prefill_triton.INTERPRETER_CONFIG,
               "flash": dense_triton.INTERPRETER_CONFIG, "msa_index": msa_triton_decode.INDEX_INTERPRETER_CONFIG,
               "msa_prefill": msa_triton_prefill.INTERPRETER_CONFIG, "msa_select": msa_triton_select.INTERPRETER_CONFIG,
               "msa_select_fp8": msa_triton_select.INTERPRETER_CONFIG,
               "moe_experts": experts_triton.INTERPRETER_CONFIG, "moe_experts_fp8": experts_triton.INTERPRETER_CONFIG}


def _split(name: str) -> tuple[str, str | None]:
    op, _, key = name.partition("/")
    return op, key or None


@pytest.fixture
def on_the_h200(monkeypatch):
    """The loader as on the H200: its slug, compiled kernels, no config dir of the user's."""
    monkeypatch.delenv(configs.ENV_DIR, raising=False)
    monkeypatch.setattr(configs, "device_slug", lambda: "NVIDIA_H200")
    monkeypatch.setattr(configs, "interpreting", lambda: False)


@pytest.mark.parametrize("name", sorted(BEFORE["gpu"]))
def test_every_op_and_key_resolves_on_the_h200_as_before(name, on_the_h200):
    op, key = _split(name)
    assert configs.launch_config(op, interpreter=INTERPRETER[op], key=key) == BEFORE["gpu"][name]


@pytest.mark.parametrize("op", sorted(BEFORE["interpreter"]))
def test_every_interpreter_config_is_as_before(op):
    assert dict(INTERPRETER[op]) == BEFORE["interpreter"][op]


def test_the_tuners_candidates_are_as_before():
    now = {name: getattr(tune, name) for name in CANDIDATES_BEFORE}
    assert json.loads(json.dumps(now)) == CANDIDATES_BEFORE
