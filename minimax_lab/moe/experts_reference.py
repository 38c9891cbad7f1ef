"""The obviously-right expert layer: a Python loop over experts, in fp32.

SwiGLU experts (Shazeer, arXiv 2002.05202): expert ``e`` maps a row ``x`` to
``W_down[e] @ (silu(W_gate[e] @ x) * (W_up[e] @ x))``. The MoE output of token ``t`` is the
routing-weighted sum over its ``k`` chosen experts: ``sum_j weights[t, j] * expert_{ids[t, j]}(x_t)``.

Weight layout shared by every implementation (``nn.Linear``'s ``[out, in]`` per expert):
``w_gate_up`` ``[E, 2f, d]`` -- rows ``0..f-1`` are the gate projection, rows ``f..2f-1`` the up
projection -- and ``w_down`` ``[E, d, f]``.

**FP8 experts.** With ``float8_e4m3fn`` weights and one fp32 scale per output channel
(:func:`~minimax_lab.moe.experts.quantize_experts`), every implementation follows one
computation (:func:`experts_fp8_reference` spells it out in fp32; the Triton kernels run the two
GEMMs as fp8 x fp8 -> fp32 on tensor cores):

1. ``x`` is quantized **per token** (one scale per row of ``x``, :func:`minimax_lab.fp8.quantize_fp8`);
2. ``h = x_q @ W13_e^T`` with ``x_q = x8 * sx`` and ``W13_e = w13_8[e] * s13[e]`` (fp32);
3. ``a = silu(h[:, :f]) * h[:, f:]`` in fp32, then **rounded to bf16** (round to nearest even):
   the intermediate's storage between the two GEMMs (:data:`INTERMEDIATE_DTYPE`);
4. ``a`` is quantized **per routed row** (one scale per (token, expert) row of ``f`` values);
5. ``y = a_q @ W2_e^T`` (fp32), weighted by the router and summed over the token's ``k`` experts;
   returned in ``x``'s dtype.

Because every scale is a power of two (activations always; weights from ``quantize_experts``),
``x8 . w8`` accumulated in fp32 and scaled afterwards equals step 2 up to summation order, so the
Triton path matches the reference to rounding. The price of FP8 is e4m3's 3-bit mantissa on
weights and activations: against the unquantized experts the relative error (``measure.relative_error``)
is a few percent -- about 5% on Gaussian tokens and init-scale weights; the moe bench records it.

:func:`check_fp8_weights` (are these FP8 weights, with scales of the right shapes?) is here, in
the file every implementation builds on, so that :func:`~minimax_lab.moe.experts.moe_experts`
and the Triton implementation both check FP8 weights with it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from minimax_lab.fp8 import check_fp8_scale, dequantize_fp8, is_fp8, quantize_fp8
from minimax_lab.validate import accumulate_dtype

#: The intermediate (SwiGLU output) is stored in this dtype between the two GEMMs, then
#: quantized per row: the reference rounds to it too.
INTERMEDIATE_DTYPE = torch.bfloat16


def swiglu_expert(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """One expert on rows ``x`` ``[n, d]`` with its ``w_gate_up`` ``[2f, d]``, ``w_down`` ``[d, f]``."""
    f = w_down.shape[1]
    h = x @ w_gate_up.t()
    return (F.silu(h[:, :f]) * h[:, f:]) @ w_down.t()


def experts_reference(x, w_gate_up, w_down, weights, ids) -> torch.Tensor:
    """Loop over experts in fp32 (fp64 for fp64 inputs); returns ``[T, d]`` in ``x``'s dtype.
    Inputs as in :func:`moe_experts`."""
    work = accumulate_dtype(x.dtype)
    xf = x.to(work)
    out = torch.zeros(x.shape[0], x.shape[1], dtype=work, device=x.device)
    for e in range(w_gate_up.shape[0]):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        y = swiglu_expert(xf[tok], w_gate_up[e].to(work), w_down[e].to(work))
        out.index_add_(0, tok, y * weights[tok, slot].to(work)[:, None])
    return out.to(x.dtype)


def experts_loop(x, w_gate_up, w_down, weights, ids) -> torch.Tensor:
    """The same loop in the inputs' own dtype: the "per-expert loop" peer of the benchmark.

    Each expert's ``nonzero`` synchronises with the GPU once -- the cost a naive port pays.
    """
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for e in range(w_gate_up.shape[0]):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        y = swiglu_expert(x[tok], w_gate_up[e], w_down[e])
        out.index_add_(0, tok, (y * weights[tok, slot].to(y.dtype)[:, None]).float())
    return out.to(x.dtype)


# --------------------------------------------------------------------------- FP8 experts

def check_fp8_weights(w_gate_up, w_down, w_gate_up_scale, w_down_scale) -> bool:
    """Whether these are FP8 expert weights with their scales. Both weights fp8 -> both scales must
    be fp32 ``[E, 2f]`` / ``[E, d]`` on the weights' device; neither fp8 -> no scales may be given.
    Raises ``ValueError`` (``TypeError`` for a scale that is not a tensor) naming what was expected."""
    fp8_gu, fp8_down = is_fp8(w_gate_up), is_fp8(w_down)
    given = (w_gate_up_scale is not None, w_down_scale is not None)
    if fp8_gu != fp8_down:
        raise ValueError(f"w_gate_up and w_down must both be float8_e4m3fn or both not, got {w_gate_up.dtype} "
                         f"and {w_down.dtype}")
    if not fp8_gu:
        if any(given):
            raise ValueError("w_gate_up_scale / w_down_scale are for float8_e4m3fn weights; these weights are "
                             f"{w_gate_up.dtype}: pass no scales (or quantize with quantize_experts first)")
        return False
    if not all(given):
        raise ValueError("float8_e4m3fn weights need their fp32 per-output-channel scales: w_gate_up_scale "
                         f"[E, 2f] = {list(w_gate_up.shape[:2])} and w_down_scale [E, d] = {list(w_down.shape[:2])} "
                         "(quantize_experts returns them)")
    check_fp8_scale(w_gate_up, w_gate_up_scale, "w_gate_up_scale", dims=(-1,))
    check_fp8_scale(w_down, w_down_scale, "w_down_scale", dims=(-1,))
    return True


def quantize_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` after FP8 storage with one scale per row (per token), as fp32: what the FP8 GEMMs see."""
    t8, scale = quantize_fp8(t, dims=(-1,), check_values=False)
    return dequantize_fp8(t8, scale)


def _swiglu_stored(h: torch.Tensor, f: int) -> torch.Tensor:
    """Step 3 of the module doc: SwiGLU in fp32, rounded to :data:`INTERMEDIATE_DTYPE`, as fp32."""
    h = h.float()
    return (F.silu(h[:, :f]) * h[:, f:]).to(INTERMEDIATE_DTYPE).float()


def _fp8_loop(x, w13, s13, w2, s2, weights, ids, work: torch.dtype) -> torch.Tensor:
    f = w2.shape[2]
    xq = quantize_rows(x).to(work)
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32 if work != torch.float64 else work,
                      device=x.device)
    for e in range(w13.shape[0]):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        w_gu = dequantize_fp8(w13[e], s13[e]).to(work)          # [2f, d]
        w_dn = dequantize_fp8(w2[e], s2[e]).to(work)            # [d, f]
        a = quantize_rows(_swiglu_stored(xq[tok] @ w_gu.t(), f)).to(work)
        y = a @ w_dn.t()
        out.index_add_(0, tok, (y * weights[tok, slot].to(work)[:, None]).to(out.dtype))
    return out.to(x.dtype)


def experts_fp8_reference(x, w13, s13, w2, s2, weights, ids) -> torch.Tensor:
    """The FP8 experts of the module doc, step by step, in fp32 (fp64 GEMMs for fp64 ``x``): a
    loop over experts on dequantized weights and per-token-quantized-then-dequantized
    activations. ``[T, d]`` in ``x``'s dtype. Inputs as in :func:`~minimax_lab.moe.moe_experts`
    with ``w13 = w_gate_up``, ``s13 = w_gate_up_scale``, ``w2 = w_down``, ``s2 = w_down_scale``."""
    return _fp8_loop(x, w13, s13, w2, s2, weights, ids, accumulate_dtype(x.dtype))


def experts_fp8_loop(x, w13, s13, w2, s2, weights, ids) -> torch.Tensor:
    """The same loop with its GEMMs in ``x``'s dtype (the benchmark's naive peer)."""
    return _fp8_loop(x, w13, s13, w2, s2, weights, ids, x.dtype)
