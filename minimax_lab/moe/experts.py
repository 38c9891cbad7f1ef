"""One contract for the SwiGLU expert layer, three implementations behind ``impl=``.

``moe_experts(x, w_gate_up, w_down, weights, ids, *, impl="torch")``:

* ``x`` ``[T, d]`` float -- the tokens (flattened over batch and sequence);
* ``w_gate_up`` ``[E, 2f, d]`` -- per expert, gate rows then up rows (``nn.Linear`` layout);
* ``w_down`` ``[E, d, f]``;
* ``weights`` ``[T, k]`` float and ``ids`` ``[T, k]`` integer in ``[0, E)`` -- from a router;
* returns ``[T, d]`` in ``x``'s dtype: ``sum_j weights[t, j] * expert_{ids[t, j]}(x_t)``.

``impl``: ``"reference"`` (fp32 loop over experts -- fp64 for fp64 inputs,
:mod:`.experts_reference`), ``"loop"`` (the same loop in the input dtype: the benchmark's naive
peer), ``"torch"`` (sorted tokens + grouped GEMM, :mod:`.experts_torch`; any ``d``, ``f`` and
weight strides; differentiable), ``"triton"`` (fused kernels, :mod:`.experts_triton`: fp16,
bf16 or fp32 on :func:`minimax_lab.runtime.kernel_device`; no backward, so inputs that require
grad raise under grad mode). ``T = 0`` gives an empty ``[0, d]``. Raises ``TypeError``/``ValueError``
for wrong types, mismatched shapes or dtypes, ``k > E`` and ids out of range (the range check
synchronises with the GPU once; hot loops that trust their router pass ``check_ids=False``).

**FP8 experts.** With ``w_gate_up`` and ``w_down`` in ``float8_e4m3fn`` their fp32
per-output-channel scales are required: ``w_gate_up_scale [E, 2f]``, ``w_down_scale [E, d]``.
:func:`quantize_experts` makes them: each expert's weights as ``float8_e4m3fn`` with one fp32
scale per output channel (row), through the package's one quantizer
(:func:`minimax_lab.fp8.quantize_fp8`: power-of-two scales, so ``w8 * scale`` is exact in bf16
and fp32). Any positive finite fp32 scales of these shapes are accepted as well (e.g. a
checkpoint's ``amax / 448`` scales); only their shapes, dtype and device are checked. ``x`` may
then be fp16, bf16 or fp32 (fp64 for ``"reference"``/``"loop"``/``"torch"``), and activations
are quantized per token to FP8 inside every implementation, which all follow the definition in
:mod:`.experts_reference` (``"reference"``: fp32 on dequantized values; ``"triton"``: fp8 x fp8
tensor-core GEMMs; ``"torch"``: ``torch._scaled_grouped_mm`` where the GPU has it,
:mod:`.experts_torch`). Scales for non-FP8 weights, FP8 weights without scales, or scales of the
wrong shape, dtype or device raise ``ValueError``. The FP8 paths have no backward.
"""
from __future__ import annotations

import torch

from minimax_lab.fp8 import FP8, quantize_fp8
from minimax_lab.moe.experts_reference import (check_fp8_weights, experts_fp8_loop, experts_fp8_reference, experts_loop,
                                               experts_reference)
from minimax_lab.moe.experts_torch import experts_fp8_torch, experts_torch
from minimax_lab.moe.experts_triton import experts_triton
from minimax_lab.validate import (FLOAT_DTYPES, INT_DTYPES, TRITON_DTYPES, check_choice, check_same_device,
                                  check_tensor, check_triton_inputs)

IMPLS = ("reference", "loop", "torch", "triton")


def check_expert_inputs(x, w_gate_up, w_down, weights, ids, *, check_ids: bool = True,
                        w_gate_up_scale=None, w_down_scale=None) -> bool:
    """Validate the expert layer's inputs (see the module doc); raises ``TypeError``/``ValueError``.
    Returns whether the weights are FP8 (with their scales)."""
    check_tensor(x, "x", ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor(w_gate_up, "w_gate_up", ndim=3, dtypes=FLOAT_DTYPES + (FP8,))
    check_tensor(w_down, "w_down", ndim=3, dtypes=FLOAT_DTYPES + (FP8,))
    check_tensor(ids, "ids", ndim=2, dtypes=INT_DTYPES)
    check_tensor(weights, "weights", shape=tuple(ids.shape), dtypes=FLOAT_DTYPES)
    check_same_device(x=x, w_gate_up=w_gate_up, w_down=w_down, weights=weights, ids=ids)
    T, d = x.shape
    E, two_f, d_w = w_gate_up.shape
    if d_w != d or two_f % 2:
        raise ValueError(f"w_gate_up must have shape [E, 2*f, d={d}], got {list(w_gate_up.shape)}")
    f = two_f // 2
    if tuple(w_down.shape) != (E, d, f):
        raise ValueError(f"w_down must have shape [E={E}, d={d}, f={f}] to match w_gate_up "
                         f"{list(w_gate_up.shape)}, got {list(w_down.shape)}")
    if ids.shape[0] != T:
        raise ValueError(f"ids must have shape [T={T}, k], got {list(ids.shape)}")
    if ids.shape[1] > E:
        raise ValueError(f"top_k = ids.shape[1] must be <= E={E}, got {ids.shape[1]}")
    fp8 = check_fp8_weights(w_gate_up, w_down, w_gate_up_scale, w_down_scale)
    if not fp8 and (w_gate_up.dtype != x.dtype or w_down.dtype != x.dtype):
        raise ValueError(f"x, w_gate_up and w_down must share a dtype, got {x.dtype}, {w_gate_up.dtype}, {w_down.dtype}")
    if check_ids and ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= E:
            raise ValueError(f"ids must lie in [0, E={E}), got values in [{lo}, {hi}]")
    return fp8


def moe_experts(x, w_gate_up, w_down, weights, ids, *, impl: str = "torch", check_ids: bool = True,
                config: dict | None = None, w_gate_up_scale: torch.Tensor | None = None,
                w_down_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Routed SwiGLU experts; see the module doc for the contract (FP8 weights with their
    ``w_gate_up_scale``/``w_down_scale``). ``config``: Triton only."""
    check_choice(impl, "impl", IMPLS)
    fp8 = check_expert_inputs(x, w_gate_up, w_down, weights, ids, check_ids=check_ids,
                              w_gate_up_scale=w_gate_up_scale, w_down_scale=w_down_scale)
    if impl == "triton":  # its contract (device, fp16/bf16/fp32, no autograd) holds for empty inputs too
        check_triton_inputs(float_dtypes=TRITON_DTYPES + ((FP8,) if fp8 else ()), x=x, w_gate_up=w_gate_up,
                            w_down=w_down, weights=weights, ids=ids, w_gate_up_scale=w_gate_up_scale,
                            w_down_scale=w_down_scale)
    if x.shape[0] == 0:
        return x.new_zeros(x.shape)
    if fp8:
        scaled = (x, w_gate_up, w_gate_up_scale, w_down, w_down_scale, weights, ids)
        if impl == "reference":
            return experts_fp8_reference(*scaled)
        if impl == "loop":
            return experts_fp8_loop(*scaled)
        if impl == "torch":
            return experts_fp8_torch(*scaled)
        return experts_triton(x, w_gate_up, w_down, weights, ids, config=config,
                              w_gate_up_scale=w_gate_up_scale, w_down_scale=w_down_scale)
    if impl == "reference":
        return experts_reference(x, w_gate_up, w_down, weights, ids)
    if impl == "loop":
        return experts_loop(x, w_gate_up, w_down, weights, ids)
    if impl == "torch":
        return experts_torch(x, w_gate_up, w_down, weights, ids)
    return experts_triton(x, w_gate_up, w_down, weights, ids, config=config)


def quantize_experts(w_gate_up: torch.Tensor, w_down: torch.Tensor):
    """``(w_gate_up [E, 2f, d], w_down [E, d, f])`` float -> ``(w13_8, s13, w2_8, s2)``:
    ``float8_e4m3fn`` weights of the same shapes and fp32 power-of-two scales ``[E, 2f]`` and
    ``[E, d]``, one per output channel (``w13_8[e, n, :].float() * s13[e, n]`` is the stored row).
    Raises ``TypeError``/``ValueError`` for non-tensors, wrong ranks or shapes, non-float dtypes,
    or inf/NaN weights."""
    check_tensor(w_gate_up, "w_gate_up", ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor(w_down, "w_down", ndim=3, dtypes=FLOAT_DTYPES)
    E, two_f, d = w_gate_up.shape
    if two_f % 2 or tuple(w_down.shape) != (E, d, two_f // 2):
        raise ValueError(f"w_gate_up [E, 2f, d] and w_down [E, d, f] do not match: {list(w_gate_up.shape)} "
                         f"and {list(w_down.shape)}")
    with torch.no_grad():
        w13_8, s13 = quantize_fp8(w_gate_up, dims=(-1,))
        w2_8, s2 = quantize_fp8(w_down, dims=(-1,))
    return w13_8, s13, w2_8, s2
