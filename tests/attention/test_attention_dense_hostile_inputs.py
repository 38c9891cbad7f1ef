"""Regression tests for inputs a new user hands dense attention (and the SDPA calls under it): each
test is one finding that used to give a silent wrong answer, a crash or a cryptic error, and now
gives the right answer or a clear ``TypeError``/``ValueError``. Inputs live on the kernel device
(the GPU, or the CPU under the Triton interpreter); tolerances follow the dtype actually computed.
Findings that hold for several operators at once: ``tests/core/test_hostile_inputs.py``."""
from __future__ import annotations

import pytest
import torch

from minimax_lab.attention import attention
from tests.support.devices import DEVICE, generator, randn


def test_model_with_triton_attention_cannot_train_silently():
    torch.manual_seed(0)
    proj = torch.nn.Linear(16, 3 * 32).to(DEVICE)
    x = randn(1, 20, 16, gen=generator(7))
    q, k, v = proj(x).view(1, 20, 3, 2, 16).unbind(2)
    with pytest.raises(ValueError, match="no backward"):
        attention(q, k, v, impl="triton").sum().backward()
    attention(q, k, v, impl="torch").sum().backward()
    assert proj.weight.grad is not None and proj.weight.grad.abs().sum() > 0


def test_sdpa_inputs_with_a_storage_offset_are_read_from_an_aligned_copy():
    """torch's memory-efficient SDPA kernel faults on a CUDA view whose data pointer is not
    16-byte aligned (pytorch/pytorch#183484); the package's SDPA calls copy exactly those."""
    from minimax_lab.sdpa import VECTOR_BYTES, aligned, sdpa

    buf = torch.randn(1 + 2 * 6 * 3 * 16, device=DEVICE)
    q = buf[1:].view(2, 3, 6, 16)          # offset by one float: 4 bytes past an aligned pointer
    k, v = torch.randn(2, 3, 6, 16, device=DEVICE), torch.randn(2, 3, 6, 16, device=DEVICE)
    if DEVICE.type == "cuda":
        assert aligned(q).data_ptr() % VECTOR_BYTES == 0 and aligned(k) is k
    else:
        assert aligned(q) is q             # nothing to fix off the GPU
    want = torch.nn.functional.scaled_dot_product_attention(q.clone(), k, v, is_causal=True)
    assert torch.allclose(sdpa(q, k, v, is_causal=True), want, atol=1e-5)
    out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, impl="torch")
    torch.cuda.synchronize() if DEVICE.type == "cuda" else None
    assert torch.allclose(out.transpose(1, 2), want, atol=1e-5)
