"""The package's one FP8 quantizer: exact round trips of what e4m3 can hold, power-of-two scales,
per-row and per-block groups, and clear errors."""
from __future__ import annotations

import pytest
import torch

from tests.support.devices import DEVICE, generator, randn
from minimax_lab.fp8 import FP8, FP8_MAX, check_fp8_scale, dequantize_fp8, is_fp8, pow2_scale, quantize_fp8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_row_round_trip_is_within_e4m3_rounding(dtype):
    x = randn(7, 5, 33, gen=generator(), device=DEVICE).mul(3.0).to(dtype)
    x[2, 1] = 0.0  # an all-zero row gets scale 1 and stays zero
    x8, scale = quantize_fp8(x)
    assert x8.dtype == FP8 and x8.shape == x.shape and scale.shape == (7, 5) and scale.dtype == torch.float32
    assert scale[2, 1].item() == 1.0 and not dequantize_fp8(x8, scale)[2, 1].any()
    back = dequantize_fp8(x8, scale)
    xf = x.float()
    # e4m3 keeps 3 mantissa bits: relative error <= 2**-4 for normal values; tiny values are absolute
    err = (back - xf).abs()
    assert bool((err <= xf.abs() * 2.0**-4 + scale[..., None] * 2.0**-9).all())
    # the scale is a power of two and the largest value of each row lands in (224, 448]
    assert torch.equal(torch.exp2(torch.log2(scale).round()), scale)
    peak = (xf.abs().amax(-1) / scale)
    nz = xf.abs().amax(-1) > 0
    assert bool(((peak[nz] > FP8_MAX / 2) & (peak[nz] <= FP8_MAX)).all())


def test_values_e4m3_holds_come_back_exactly():
    vals = torch.tensor([[448.0, -1.0, 0.5, 0.0, -3.5, 2.0**-6]], device=DEVICE)
    x8, scale = quantize_fp8(vals)
    assert scale.item() == 1.0
    assert torch.equal(dequantize_fp8(x8, scale), vals)
    # scaled by a power of two, the same values are still exact
    x8, scale = quantize_fp8(vals * 2.0**20)
    assert scale.item() == 2.0**20 and torch.equal(dequantize_fp8(x8, scale), vals * 2.0**20)


def test_block_groups_per_page_and_head():
    cache = randn(3, 4, 2, 8, gen=generator(), device=DEVICE)  # [pages, page_size, heads, D]
    cache[1, :, 0] *= 1000.0  # one (page, head) with large values must not change the others' scale
    x8, scale = quantize_fp8(cache, dims=(1, 3))
    assert scale.shape == (3, 2)
    back = dequantize_fp8(x8, scale, dims=(1, 3))
    assert torch.allclose(back, cache, rtol=2.0**-4, atol=float(scale.max()) * 2.0**-9)
    assert scale[1, 0] > 100 * scale[1, 1]
    assert torch.equal(pow2_scale(cache.abs().amax(dim=(1, 3))), scale)


def test_bad_input_raises_clearly():
    x = torch.randn(4, 8, device=DEVICE)
    with pytest.raises(TypeError, match="torch.Tensor"):
        quantize_fp8([1.0, 2.0])
    with pytest.raises(ValueError, match="dtype"):
        quantize_fp8(torch.ones(4, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="dims"):
        quantize_fp8(x, dims=(2,))
    with pytest.raises(ValueError, match="each once"):
        quantize_fp8(x, dims=(1, -1))
    bad = x.clone()
    bad[0, 0] = float("inf")
    with pytest.raises(ValueError, match="inf or NaN"):
        quantize_fp8(bad)
    x8, scale = quantize_fp8(x)
    with pytest.raises(ValueError, match=r"shape \[4\]"):
        dequantize_fp8(x8, scale[:3])
    with pytest.raises(ValueError, match="dtype"):
        check_fp8_scale(x8, scale.half(), "k_scale")
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        dequantize_fp8(x, scale)
    assert is_fp8(x8) and not is_fp8(x)


def test_scale_is_the_smallest_power_of_two_that_fits_even_at_the_edges():
    amax = torch.tensor([448.0, 448.0 * (1 + 2.0**-23), 1.0, 448.0 * 2.0**-20, 448.0 * 2.0**-20 * (1 + 2.0**-23),
                         1e-30, 3e38], device=DEVICE)
    spread = torch.exp2(torch.randint(-60, 60, (4096,)).float()).to(DEVICE)
    amax = torch.cat([amax, randn(4096, gen=generator(), device=DEVICE).abs() * spread])
    s = pow2_scale(amax)
    assert bool((amax / s <= FP8_MAX).all()), "a value would saturate"
    assert bool((amax / (s / 2) > FP8_MAX).all()), "a smaller power of two would fit"
