"""FP8 experts: e4m3 weights with one fp32 scale per output channel, activations quantized per token.

Storage. :func:`quantize_experts` stores each expert's ``w_gate_up [E, 2f, d]`` and
``w_down [E, d, f]`` as ``float8_e4m3fn`` with one fp32 scale per output channel (row):
``w_gate_up_scale [E, 2f]``, ``w_down_scale [E, d]``, through the package's one quantizer
(:func:`minimax_lab.fp8.quantize_fp8`: power-of-two scales, so ``w8 * scale`` is exact in bf16
and fp32). Any positive finite fp32 scales of these shapes are accepted as well (e.g. a
checkpoint's ``amax / 448`` scales); only their shapes, dtype and device are checked.

The computation every FP8 implementation follows (:func:`experts_fp8_reference` spells it out in
fp32; the Triton kernels run the two GEMMs as fp8 x fp8 -> fp32 on tensor cores):

1. ``x`` is quantized **per token** (one scale per row of ``x``, :func:`quantize_fp8`);
2. ``h = x_q @ W13_e^T`` with ``x_q = x8 * sx`` and ``W13_e = w13_8[e] * s13[e]`` (fp32);
3. ``a = silu(h[:, :f]) * h[:, f:]`` in fp32, then **rounded to bf16** (round to nearest even):
   the intermediate's storage between the two GEMMs (:data:`INTERMEDIATE_DTYPE`);
4. ``a`` is quantized **per routed row** (one scale per (token, expert) row of ``f`` values);
5. ``y = a_q @ W2_e^T`` (fp32), weighted by the router and summed over the token's ``k`` experts;
   returned in ``x``'s dtype.

Because every scale is a power of two (activations always; weights from :func:`quantize_experts`),
``x8 . w8`` accumulated in fp32 and scaled afterwards equals step 2 up to summation order, so the
Triton path matches the reference to rounding. The price of FP8 is e4m3's 3-bit mantissa on
weights and activations: against the unquantized experts the relative error (``bench.relative_error``)
is a few percent -- about 5% on Gaussian tokens and init-scale weights; the moe bench records it.

``impl="torch"`` (:func:`experts_fp8_torch`) is the vectorised peer: on Hopper-class GPUs
``torch._scaled_grouped_mm`` (fp8 x fp8 with row-wise scales, bf16 out; it needs sm90/sm100,
``d`` and ``f`` multiples of 16 and 16-byte aligned operands), else ``torch._scaled_mm`` once
per expert (fp8 GPUs without the grouped op), else dequantized weights through the grouped/
batched matmul of :mod:`.experts_torch` (CPU; GPUs without fp8). :func:`torch_fp8_backend` says
which one runs. Its fp8 GEMMs return bf16, so ``h`` is rounded to bf16 before SwiGLU there:
it matches the reference less tightly than the Triton path on the GPU.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from minimax_lab.fp8 import FP8, check_fp8_scale, dequantize_fp8, is_fp8, quantize_fp8
from minimax_lab.validate import FLOAT_DTYPES, accumulate_dtype, check_tensor

#: The intermediate (SwiGLU output) is stored in this dtype between the two GEMMs, then
#: quantized per row: the reference rounds to it too.
INTERMEDIATE_DTYPE = torch.bfloat16


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


# --------------------------------------------------------------------------- the torch peer

def _probe(fn) -> bool:
    try:
        fn()
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001 - any failure means "not on this device / build"
        return False


@functools.lru_cache(maxsize=None)
def _scaled_grouped_mm_works(device_index: int) -> bool:
    """One tiny ``torch._scaled_grouped_mm`` on this GPU (2 groups, ragged 3 + 18 rows)."""
    if not hasattr(torch, "_scaled_grouped_mm"):
        return False
    dev = torch.device("cuda", device_index)

    def call():
        a = torch.randn(21, 32, device=dev).to(FP8)
        b = torch.randn(2, 48, 32, device=dev).to(FP8).transpose(1, 2)
        offs = torch.tensor([3, 21], dtype=torch.int32, device=dev)
        torch._scaled_grouped_mm(a, b, torch.ones(21, device=dev), torch.ones(2, 48, device=dev), offs=offs,
                                 out_dtype=torch.bfloat16)
    return _probe(call)


@functools.lru_cache(maxsize=None)
def _scaled_mm_works(device_index: int) -> bool:
    """One tiny row-wise-scaled ``torch._scaled_mm`` (an odd row count) on this GPU."""
    if not hasattr(torch, "_scaled_mm"):
        return False
    dev = torch.device("cuda", device_index)

    def call():
        a = torch.randn(3, 32, device=dev).to(FP8)
        b = torch.randn(48, 32, device=dev).to(FP8).t()
        torch._scaled_mm(a, b, scale_a=torch.ones(3, 1, device=dev), scale_b=torch.ones(1, 48, device=dev),
                         out_dtype=torch.bfloat16)
    return _probe(call)


def torch_fp8_backend(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> str:
    """Which GEMMs :func:`experts_fp8_torch` uses for these inputs: ``"scaled_grouped_mm"``,
    ``"scaled_mm"`` (per expert) or ``"dequantized"`` (see the module doc). The fp8 ops need a
    CUDA device that runs them (tried once per device), ``d`` and ``f`` multiples of 16 and the
    weights' transposed views in the 16-byte layout of :func:`.experts_torch.can_use_grouped_mm`."""
    from minimax_lab.moe.experts_torch import _aligned_for_grouped_mm
    if x.device.type != "cuda":
        return "dequantized"
    d, f = w2.shape[1], w2.shape[2]
    if d % 16 or f % 16 or not all(_aligned_for_grouped_mm(w.transpose(1, 2)) for w in (w13, w2)):
        return "dequantized"
    idx = x.device.index if x.device.index is not None else torch.cuda.current_device()
    if _scaled_grouped_mm_works(idx):
        return "scaled_grouped_mm"
    return "scaled_mm" if _scaled_mm_works(idx) else "dequantized"


def _gather_fp8(t8: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``t8[rows]`` for an fp8 tensor (gathered as bytes: every build indexes uint8)."""
    return t8.view(torch.uint8)[rows].view(FP8)


def _scaled_grouped(a8, sa, w8, sw, counts, backend: str) -> torch.Tensor:
    """Rows ``a8 [n, K]`` fp8 (scales ``sa [n]``), sorted by expert with ``counts [E]`` rows each,
    times each expert's ``w8[e] [N, K]^T`` (scales ``sw [E, N]``) -> ``[n, N]`` bf16."""
    if backend == "scaled_grouped_mm":
        offs = torch.cumsum(counts, 0).to(torch.int32)
        return torch._scaled_grouped_mm(a8, w8.transpose(1, 2), sa.contiguous(), sw.contiguous(), offs=offs,
                                        out_dtype=torch.bfloat16)
    out = torch.empty(a8.shape[0], w8.shape[1], dtype=torch.bfloat16, device=a8.device)
    start = 0
    for e, c in enumerate(counts.tolist()):     # one host sync; then one launch per used expert
        if c:
            rows = a8[start:start + c]
            if rows.data_ptr() % 256:   # cuBLASLt refuses operands at unaligned offsets (seen on the H200)
                rows = rows.clone()
            # the scales are cloned too: a slice of a contiguous vector is "contiguous" already, so
            # .contiguous() would keep its unaligned offset (20 bytes for rows 5.. on the H200: refused)
            out[start:start + c] = torch._scaled_mm(rows, w8[e].t(),
                                                    scale_a=sa[start:start + c].clone().unsqueeze(1),
                                                    scale_b=sw[e].clone().unsqueeze(0), out_dtype=torch.bfloat16)
        start += c
    return out


def experts_fp8_torch(x, w13, s13, w2, s2, weights, ids) -> torch.Tensor:
    """Sorted routed rows through fp8 GEMMs (backend by :func:`torch_fp8_backend`); ``[T, d]`` in
    ``x``'s dtype. Inputs as in :func:`experts_fp8_reference`. The ``"scaled_grouped_mm"`` backend
    has no host synchronisation (CUDA-graph safe); the others synchronise once."""
    from minimax_lab.moe.experts_torch import _sort_by_expert, grouped_linear
    T, k = ids.shape
    E, d, f = w2.shape
    backend = torch_fp8_backend(x, w13, w2)
    flat, order, counts = _sort_by_expert(ids, E)
    tok = order // k
    x8, sx = quantize_fp8(x, dims=(-1,), check_values=False)
    if backend == "dequantized":
        # the fallback for shapes the fp8 GEMMs refuse: products in the reference's own precision
        # (bf16 products here flipped e4m3 roundings of the intermediate: 3.5% off at T=11, d=20 on an H200)
        work = accumulate_dtype(x.dtype)
        xs = dequantize_fp8(x8, sx, dtype=work)[tok]                  # exact in fp32
        h = grouped_linear(xs, dequantize_fp8(w13, s13, dtype=work), counts)
        a = quantize_rows(_swiglu_stored(h, f)).to(work)
        y = grouped_linear(a, dequantize_fp8(w2, s2, dtype=work), counts)
    else:
        h = _scaled_grouped(_gather_fp8(x8, tok), sx[tok], w13, s13, counts, backend)
        a8, sa = quantize_fp8(_swiglu_stored(h, f), dims=(-1,), check_values=False)
        y = _scaled_grouped(a8, sa, w2, s2, counts, backend)
    out_dtype = accumulate_dtype(x.dtype)
    y = y.to(out_dtype) * weights.reshape(-1)[order].to(out_dtype)[:, None]
    out = torch.zeros(T, d, dtype=out_dtype, device=x.device)
    return out.index_add_(0, tok, y).to(x.dtype)
