"""FP8 (e4m3) storage with fp32 scales: the one quantizer every FP8 path of the package uses.

A tensor ``x`` is stored as ``x8 = x / scale`` in ``float8_e4m3fn`` with one fp32 ``scale`` per
group of elements; the groups are the slices along ``dims`` (``dims=(-1,)``: one scale per row,
e.g. per token of a key, per output channel of a weight, per token of an activation;
``dims=(1, 3)`` of a ``[pages, page_size, heads, D]`` cache: one scale per page and head).

The scale is ``2**ceil(log2(amax / 448))`` (448 is e4m3's largest finite value), a **power of
two**: dividing by it and multiplying back are exact, so ``x8 * scale`` is exactly representable
in bf16 and fp32 and a kernel may apply the scale after a dot product (``(q . k8) * scale``)
without changing a bit. The only loss is rounding each value to e4m3's 3 mantissa bits (relative
error up to ``2**-4``); the largest value of each group lands in ``(224, 448]``, so nothing
saturates. All-zero groups get scale 1.

    x8, scale = quantize_fp8(x)                  # x [..., D] -> fp8 [..., D], fp32 [...]
    back = dequantize_fp8(x8, scale)             # fp32 [..., D]
"""
from __future__ import annotations

from typing import Sequence

import torch

from minimax_lab.validate import FLOAT_DTYPES, check_tensor

FP8 = torch.float8_e4m3fn
#: e4m3's largest finite value
FP8_MAX = 448.0


def _normal_dims(dims: Sequence[int], ndim: int, name: str = "dims") -> tuple[int, ...]:
    if isinstance(dims, int):
        dims = (dims,)
    out = []
    for d in dims:
        if not isinstance(d, int) or not -ndim <= d < ndim:
            raise ValueError(f"{name} must be ints in [-{ndim}, {ndim}) for a {ndim}-d tensor, got {tuple(dims)}")
        out.append(d % ndim)
    if not out or len(set(out)) != len(out):
        raise ValueError(f"{name} must name at least one dimension, each once; got {tuple(dims)}")
    return tuple(sorted(out))


def pow2_scale(amax: torch.Tensor) -> torch.Tensor:
    """The smallest power of two ``s`` with ``amax / s <= 448`` (fp32; 1 where ``amax`` is 0)."""
    # exact, from the exponent bits: amax = m * 2**e with m in [0.5, 1), and 448 = 0.875 * 2**9, so
    # amax <= 448 * 2**k  <=>  k >= e - 9 (m <= 0.875) or e - 8 (m > 0.875). (A log2 in fp32 can
    # land a hair below an integer and return half the scale.)
    amax = amax.float()
    m, e = torch.frexp(amax)
    k = e - 9 + (m > FP8_MAX / 512).to(e.dtype)
    return torch.where(amax > 0, torch.ldexp(torch.ones_like(amax), k), torch.ones_like(amax))


def quantize_fp8(x: torch.Tensor, *, dims: Sequence[int] = (-1,),
                 check_values: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x8 float8_e4m3fn, shaped like x; scale fp32, x's shape without dims)`` with one
    power-of-two scale per slice along ``dims``: ``x8.float() * scale`` (unsqueezed at ``dims``)
    is the stored value. Raises TypeError for a non-tensor, ValueError for a non-float or 0-d
    tensor, bad ``dims``, or (unless ``check_values=False``, which skips a device-to-host read)
    inf/NaN values."""
    check_tensor(x, "x", dtypes=FLOAT_DTYPES)
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension to quantize along")
    dims = _normal_dims(dims, x.ndim)
    xf = x.float()
    if check_values and xf.numel() and not bool(torch.isfinite(xf).all()):
        raise ValueError("x has inf or NaN values; FP8 storage needs finite values")
    scale = pow2_scale(xf.abs().amax(dim=dims)) if xf.numel() else torch.ones(
        [s for i, s in enumerate(x.shape) if i not in dims], dtype=torch.float32, device=x.device)
    x8 = (xf / _unsqueeze(scale, dims)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return x8, scale


def _unsqueeze(scale: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    for d in dims:
        scale = scale.unsqueeze(d)
    return scale


def dequantize_fp8(x8: torch.Tensor, scale: torch.Tensor, *, dims: Sequence[int] = (-1,),
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``x8 * scale`` in ``dtype`` (exact for fp32 and bf16). ``scale`` must have ``x8``'s shape
    without ``dims``; raises ValueError otherwise."""
    check_tensor(x8, "x8", dtypes=(FP8,))
    dims = _normal_dims(dims, x8.ndim)
    check_fp8_scale(x8, scale, "scale", dims=dims)
    return (x8.float() * _unsqueeze(scale.float(), dims)).to(dtype)


def check_fp8_scale(x8: torch.Tensor, scale, name: str, *, dims: Sequence[int] = (-1,)) -> None:
    """Raise unless ``scale`` is an fp32 tensor of ``x8``'s shape without ``dims``, on ``x8``'s
    device (TypeError / ValueError naming ``name`` and the expected shape)."""
    dims = _normal_dims(dims, x8.ndim)
    want = [s for i, s in enumerate(x8.shape) if i not in dims]
    check_tensor(scale, name, shape=want, dtypes=(torch.float32,))
    if scale.device != x8.device:
        raise ValueError(f"{name} must be on the fp8 tensor's device {x8.device}, got {scale.device}")


def check_scales_given(x: torch.Tensor, name: str, what: str, scales: dict, *, expect: str) -> bool:
    """Whether ``x`` (called ``name``; ``what``: what it stands for, e.g. ``"caches"``) is stored as
    ``float8_e4m3fn``, with its scales ``{name: tensor or None}`` given exactly then: FP8 needs every
    one of them (ValueError ``"float8_e4m3fn <what> need <expect>"``), another dtype none (ValueError
    ``"<names> ... only for float8_e4m3fn <what>"``). Their shapes are the caller's to check
    (:func:`check_fp8_scale`)."""
    if x.dtype != FP8:
        if any(s is not None for s in scales.values()):
            verb = "is" if len(scales) == 1 else "are"
            raise ValueError(f"{'/'.join(scales)} {verb} only for float8_e4m3fn {what}; {name} is "
                             f"{str(x.dtype).replace('torch.', '')}")
        return False
    if any(s is None for s in scales.values()):
        raise ValueError(f"float8_e4m3fn {what} need {expect}")
    return True


def is_fp8(x: torch.Tensor) -> bool:
    """Whether ``x`` is stored as ``float8_e4m3fn``."""
    return isinstance(x, torch.Tensor) and x.dtype == FP8
