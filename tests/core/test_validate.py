"""Input checks raise clear errors naming what was expected (on tensors of the kernel device)."""
import pytest
import torch
from tests.support.devices import DEVICE

from minimax_lab import validate as v


def test_check_tensor():
    x = torch.zeros(2, 3, dtype=torch.float16, device=DEVICE)
    assert v.check_tensor(x, "x", ndim=2, shape=(2, None), dtypes=v.FLOAT_DTYPES, device=DEVICE.type) is x
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        v.check_tensor([1], "x")
    with pytest.raises(ValueError, match="3 dimensions"):
        v.check_tensor(x, "x", ndim=3)
    with pytest.raises(ValueError, match=r"shape \[2, 4\]"):
        v.check_tensor(x, "x", shape=(2, 4))
    with pytest.raises(ValueError, match="dtype in"):
        v.check_tensor(x, "x", dtypes=(torch.float32,))
    with pytest.raises(ValueError, match="must be on meta"):
        v.check_tensor(x, "x", device="meta")
    with pytest.raises(ValueError, match="one device"):
        v.check_same_device(a=x, b=x.to("meta"))
    assert v.check_same_device(a=x, b=x) == x.device


def test_triton_inputs_must_be_on_the_kernel_device():
    x = torch.zeros(2, 3, device=DEVICE)
    v.check_triton_inputs(x=x, ids=torch.zeros(2, dtype=torch.long, device=DEVICE))  # fine
    with pytest.raises(ValueError, match=f"needs tensors on {DEVICE.type}, got ids on meta"):
        v.check_triton_inputs(x=x, ids=torch.zeros(2, dtype=torch.long, device="meta"))


def test_scalars():
    assert v.check_power_of_two(64, "block", minimum=16, maximum=128) == 64
    with pytest.raises(ValueError, match="power of two"):
        v.check_power_of_two(48, "block")
    with pytest.raises(ValueError, match=">= 16"):
        v.check_power_of_two(8, "block", minimum=16)
    with pytest.raises(TypeError):
        v.check_positive_int(True, "k")
    with pytest.raises(ValueError, match="one of"):
        v.check_choice("x", "impl", ("torch", "triton"))
