"""Regression tests for inputs a new user hands the MoE experts and layer: each test is one finding
that used to give a silent wrong answer, a crash or a cryptic error, and now gives the right answer
or a clear ``TypeError``/``ValueError``. Inputs live on the kernel device (the GPU, or the CPU under
the Triton interpreter); tolerances follow the dtype actually computed. Findings that hold for
several operators at once: ``tests/core/test_hostile_inputs.py``."""
from __future__ import annotations

import pytest
import torch

from minimax_lab.moe import MoEFFN, moe_experts
from tests.support.devices import DEVICE, generator, randn, relative_error, tol
from tests.support.operator_inputs import moe_inputs, relayout


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_moe_triton_every_kernel_dtype_matches_reference(dtype):
    # finding: bf16 on the CPU gave ~1e10 (the interpreter's bf16 tl.dot) -- no fp32 upcast
    x, wgu, wd, w, ids = moe_inputs(T=9, d=20, f=24, seed=4, dtype=dtype)
    want = moe_experts(x, wgu, wd, w, ids, impl="reference")
    got = moe_experts(x, wgu, wd, w, ids, impl="triton")
    assert got.dtype == dtype
    assert relative_error(got, want) < tol(dtype)


def test_moeffn_triton_bfloat16():
    torch.manual_seed(0)
    ffn = MoEFFN(32, 24, 4, 2, impl="triton").to(DEVICE).bfloat16().eval()
    ref = MoEFFN(32, 24, 4, 2, impl="reference").to(DEVICE).bfloat16().eval()
    ref.load_state_dict(ffn.state_dict())
    x = randn(2, 5, 32, gen=generator(5), dtype=torch.bfloat16)
    with torch.no_grad():
        assert relative_error(ffn(x), ref(x)) < tol(torch.bfloat16)


@pytest.mark.parametrize("d,f,layout", [(30, 32, "contiguous"), (32, 30, "contiguous"), (30, 30, "contiguous"),
                                        (32, 32, "transposed_storage"), (32, 32, "sliced"),
                                        (32, 32, "last_dim_strided")])
def test_moe_torch_any_width_and_weight_layout(d, f, layout):
    # finding: the default impl="torch" failed on the CPU with a raw _grouped_mm stride error when
    # d or f was not a multiple of 4 or the weights were not contiguous
    x, wgu, wd, w, ids = moe_inputs(T=12, d=d, f=f, E=4, seed=11)
    want = moe_experts(x, wgu, wd, w, ids, impl="reference")
    got = moe_experts(relayout(x, layout), relayout(wgu, layout), relayout(wd, layout), w, ids, impl="torch")
    assert relative_error(got, want) < tol(torch.float32)


def test_triton_experts_refuse_float64_even_for_an_empty_batch():
    """The empty-batch shortcut must not skip the Triton contract (found on the H200, where the
    property test drew T=0 with float64)."""
    g = generator(5)
    x = torch.zeros(0, 8, device=DEVICE, dtype=torch.float64)
    wgu, wd = randn(2, 12, 8, gen=g, dtype=torch.float64), randn(2, 8, 6, gen=g, dtype=torch.float64)
    w, ids = torch.ones(0, 1, device=DEVICE, dtype=torch.float64), torch.zeros(0, 1, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="float64"):
        moe_experts(x, wgu, wd, w, ids, impl="triton")
    assert moe_experts(x, wgu, wd, w, ids, impl="torch").shape == (0, 8)
