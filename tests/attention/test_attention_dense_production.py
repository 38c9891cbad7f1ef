"""Dense FlashAttention at 16k tokens, on the GPU, against an fp32 reference on sampled query
rows: autotuned, TMA loads and pointer loads.

bf16 inputs, bf16 tolerances; the checks, and why only a GPU run can make them:
:mod:`tests.support.production_checks`."""
from __future__ import annotations

import pytest
import torch
from tests.support.devices import DEVICE, gpu_only
from tests.support.production_checks import check_dense_prefill, flash

BF16 = torch.bfloat16


@gpu_only
@pytest.mark.parametrize("S", [16384, 16000], ids=["s16k", "s16k_ragged"])
@pytest.mark.parametrize("variant", ["autotuned", "tma", "pointers"])
def test_dense_attention_16k(variant, S):
    from minimax_lab.attention.dense_triton import DEFAULT_CONFIG, _tma_ok
    hopper = torch.cuda.get_device_capability(DEVICE)[0] >= 9
    if variant == "tma":
        # the layout takes a TMA descriptor on Hopper or newer, so this config really loads by TMA
        assert _tma_ok(torch.empty(1, 16, 4, 128, dtype=BF16, device=DEVICE)) == hopper
    config = {"autotuned": None, "tma": dict(DEFAULT_CONFIG, USE_TMA=True),
              "pointers": dict(DEFAULT_CONFIG, USE_TMA=False)}[variant]
    print(check_dense_prefill(B=1, S=S, Hq=64, Hkv=4, D=128, dtype=BF16, n_rows=64, attention=flash(config)))
