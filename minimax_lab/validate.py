"""Input checks for public functions: every message says what was expected and what came.

Wrong kind of object -> ``TypeError``; right kind but wrong rank, shape, dtype or device ->
``ValueError``. Use these at the top of every public entry point::

    check_tensor(q, "q", ndim=4, dtypes=FLOAT_DTYPES)
    check_same_device(q=q, k=k, v=v)

and, in every ``impl="triton"`` entry point, :func:`check_triton_inputs` (the dtype and autograd
rules all the Triton kernels share; the interpreter's operand upcast is
:func:`minimax_lab.triton_blocks.interpreter_safe`).
"""
from __future__ import annotations

import math
import operator
from typing import Iterable, Sequence

import torch

from minimax_lab import runtime

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
#: What the Triton compute kernels (tensor-core ``tl.dot``) accept: float64 is refused with a
#: clear error rather than silently computed in float32.
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: The implementations behind every operator's ``impl=`` (MoE experts add ``"loop"``); the default
#: everywhere is ``"torch"``.
IMPLS = ("reference", "torch", "triton")


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


def check_int(value, name: str, *, minimum: int | None = None) -> int:
    """An integer -- ``int``, a NumPy integer or a 0-d integer tensor, not bool, float or str --
    as an ``int``, ``>= minimum`` when given; raises ``TypeError``/``ValueError`` (never rounds)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got bool {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r:.40}") from None
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


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


def check_scale(scale) -> float | None:
    """``None`` or a finite real number (not a bool); returns it as a float (or ``None``).
    Raises ``TypeError`` for other types, ``ValueError`` for NaN/inf."""
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


def accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a reference or torch implementation computes in: float64 for float64 inputs
    (so the reference is a float64 ground truth), float32 for every other float."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_triton_inputs(*, float_dtypes: Sequence[torch.dtype] = TRITON_DTYPES, allow_grad: bool = False,
                        **tensors) -> None:
    """The rules every ``impl="triton"`` compute entry point shares, for its named tensors:

    * on :func:`minimax_lab.runtime.kernel_device` (the GPU, or the CPU under the interpreter);
    * floats in ``float_dtypes`` (default :data:`TRITON_DTYPES`: float64 raises -- use
      ``impl="torch"`` or ``"reference"``; a kernel that only copies passes :data:`FLOAT_DTYPES`);
    * no autograd: the kernels have no backward, so a float input that requires grad while
      grad mode is on raises instead of returning a silently detached output (run under
      ``torch.no_grad()`` for inference, or use ``impl="torch"`` to train). ``allow_grad=True``
      for inputs no impl differentiates through (e.g. the index tensors MSA only ranks with).

    ``None`` entries are skipped. Raises ``ValueError`` naming the tensor.
    """
    want = runtime.kernel_device().type
    grad = torch.is_grad_enabled()
    for name, t in tensors.items():
        if t is None:
            continue
        if t.device.type != want:
            raise ValueError(f"impl='triton' needs tensors on {want}, got {name} on {t.device.type}")
        if t.is_floating_point() and t.dtype not in float_dtypes:
            raise ValueError(f"impl='triton' computes in ({_dtype_names(float_dtypes)}), got {name} in "
                             f"{str(t.dtype).replace('torch.', '')}; use impl='torch' or 'reference' for it")
        if grad and not allow_grad and t.requires_grad:
            raise ValueError(f"impl='triton' has no backward, but {name} requires grad; use impl='torch' for "
                             "training or run under torch.no_grad()")
