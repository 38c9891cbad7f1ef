"""Input checks for public functions: every message says what was expected and what came.

Wrong kind of object -> ``TypeError``; right kind but wrong rank, shape, dtype or device ->
``ValueError``. Use these at the top of every public entry point::

    check_tensor(q, "q", ndim=4, dtypes=FLOAT_DTYPES)
    check_same_device(q=q, k=k, v=v)
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(
    x,
    name: str,
    *,
    ndim: int | None = None,
    shape: Sequence[int | None] | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Check ``x`` is a tensor of the given rank, shape (``None`` = any size), dtype and device.

    Returns ``x`` so calls can be chained. Raises ``TypeError`` if ``x`` is not a tensor,
    ``ValueError`` naming ``name`` and the expectation otherwise.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if shape is not None:
        if x.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, x.shape)):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{name} must have shape {want}, got {list(x.shape)}")
    if dtypes is not None and x.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype in ({_dtype_names(dtypes)}), got {str(x.dtype).replace('torch.', '')}")
    if device is not None and x.device.type != torch.device(device).type:
        raise ValueError(f"{name} must be on {torch.device(device).type}, got {x.device.type}")
    return x


def check_same_device(**tensors: torch.Tensor) -> torch.device:
    """All named tensors on one device; returns it. Raises ``ValueError`` listing each device."""
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len({d for d in devices.values()}) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"tensors must be on one device, got {listing}")
    return next(iter(devices.values()))


def check_positive_int(value, name: str, *, minimum: int = 1, maximum: int | None = None) -> int:
    """An ``int`` (not bool) in ``[minimum, maximum]``; raises ``TypeError``/``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum or (maximum is not None and value > maximum):
        upper = "" if maximum is None else f" and <= {maximum}"
        raise ValueError(f"{name} must be >= {minimum}{upper}, got {value}")
    return value


def check_power_of_two(value, name: str, *, minimum: int = 1, maximum: int | None = None) -> int:
    """A power of two in ``[minimum, maximum]`` (e.g. block sizes); raises like above."""
    check_positive_int(value, name, minimum=minimum, maximum=maximum)
    if value & (value - 1):
        raise ValueError(f"{name} must be a power of two, got {value}")
    return value


def check_choice(value, name: str, choices: Sequence) -> object:
    """``value`` is one of ``choices``; raises ``ValueError`` listing them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value
