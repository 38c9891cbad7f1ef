"""Vectorised expert layer: sort the routed slots by expert, then two grouped GEMMs.

1. flatten the ``T * k`` routed slots, sort them by expert (stable), gather their rows of ``x``;
2. ``torch._grouped_mm`` (one launch for all experts, each multiplying its contiguous run of
   rows) with ``w_gate_up``, SwiGLU, ``torch._grouped_mm`` with ``w_down``;
3. scale each row by its routing weight and scatter-add it back to its token (``index_add_``).

``torch._grouped_mm`` exists from torch 2.8 (bf16 on Hopper GPUs; fp32 on the CPU, forward
only -- its CPU backward fails on the transposed weight views). Where it is missing, where
autograd needs a backward on the CPU, or where ``d``/``f`` or the weights' strides break its
16-byte layout rule (:func:`can_use_grouped_mm`), step 2 uses a **padded batched matmul** instead: rows scattered into an
``[E, max_count, d]`` buffer (zeros elsewhere) and ``torch.bmm`` -- differentiable everywhere,
at the price of one host sync for ``max_count`` and the padding FLOPs.

**FP8 experts** (:func:`experts_fp8_torch`, the vectorised peer of the FP8 computation in
:mod:`.experts_reference`): on Hopper-class GPUs ``torch._scaled_grouped_mm`` (fp8 x fp8 with
row-wise scales, bf16 out; it needs sm90/sm100, ``d`` and ``f`` multiples of 16 and 16-byte
aligned operands), else ``torch._scaled_mm`` once per expert (fp8 GPUs without the grouped op),
else dequantized weights through the grouped/batched matmul above (CPU; GPUs without fp8).
:func:`torch_fp8_backend` says which one runs. Its fp8 GEMMs return bf16, so ``h`` is rounded to
bf16 before SwiGLU there: it matches the reference less tightly than the Triton path on the GPU.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from minimax_lab.fp8 import FP8, dequantize_fp8, quantize_fp8
from minimax_lab.moe.experts_reference import _swiglu_stored, quantize_rows
from minimax_lab.validate import accumulate_dtype


def _sort_by_expert(ids: torch.Tensor, n_experts: int):
    flat = ids.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices          # slot indices, expert-major
    counts = torch.zeros(n_experts, dtype=torch.long, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))
    return flat, order, counts


def _aligned_for_grouped_mm(t: torch.Tensor) -> bool:
    """``torch._grouped_mm``'s layout rule for one operand (checked on the CPU and the GPU alike):
    unit stride in one of the last two dims, every other stride and the base address a multiple
    of 16 bytes."""
    rows, cols = t.stride()[-2:]
    if cols == 1:
        lead = rows
    elif rows == 1:
        lead = cols
    else:
        return False
    return all(s * t.element_size() % 16 == 0 for s in (*t.stride()[:-2], lead)) and t.data_ptr() % 16 == 0


def can_use_grouped_mm(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> bool:
    """Whether :func:`experts_grouped_mm` can run on these inputs here: the op exists, the dtype
    and device suit it (fp32 forward on the CPU, bf16 on the GPU), and every operand meets its
    16-byte layout rule -- the gathered rows ``[n, d]`` and SwiGLU rows ``[n, f]`` (so ``d`` and
    ``f`` times the element size are multiples of 16 bytes) and both weights as transposed views."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or w_gate_up.requires_grad or w_down.requires_grad)
    if x.device.type == "cpu":
        if needs_grad or x.dtype != torch.float32:
            return False
    elif x.dtype != torch.bfloat16:
        return False
    d, f = w_down.shape[1], w_down.shape[2]
    rows_ok = (d * x.element_size()) % 16 == 0 and (f * x.element_size()) % 16 == 0
    return rows_ok and all(_aligned_for_grouped_mm(w.transpose(1, 2)) for w in (w_gate_up, w_down))


def grouped_linear(rows: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``rows [n, K]`` sorted by expert (``counts[e]`` consecutive rows for expert ``e``) times
    each expert's ``w[e] [N, K]`` transposed: ``[n, N]`` in ``rows``' dtype. ``torch._grouped_mm``
    where :func:`can_use_grouped_mm`'s rules hold for these operands, else the padded batched
    matmul of :func:`experts_padded_bmm` (one host sync)."""
    E, N, K = w.shape
    ok = hasattr(torch, "_grouped_mm") and not (torch.is_grad_enabled() and (rows.requires_grad or w.requires_grad))
    ok = ok and rows.dtype == (torch.float32 if rows.device.type == "cpu" else torch.bfloat16) and w.dtype == rows.dtype
    if ok and _aligned_for_grouped_mm(rows) and _aligned_for_grouped_mm(w.transpose(1, 2)) and (
            N * rows.element_size()) % 16 == 0:
        return torch._grouped_mm(rows, w.transpose(1, 2), offs=torch.cumsum(counts, 0).to(torch.int32))
    n = rows.shape[0]
    expert = torch.repeat_interleave(torch.arange(E, device=rows.device), counts, output_size=n)
    rank = torch.arange(n, device=rows.device) - (torch.cumsum(counts, 0) - counts)[expert]
    cap = int(counts.max()) if n else 0                    # the one host sync of this path
    padded = rows.new_zeros(E, max(cap, 1), K).index_put((expert, rank), rows)
    return torch.bmm(padded, w.transpose(1, 2))[expert, rank]


def experts_grouped_mm(x, w_gate_up, w_down, weights, ids) -> torch.Tensor:
    """Sorted tokens through ``torch._grouped_mm``; gather and scatter-add included. ``[T, d]``."""
    T, k = ids.shape
    E, f = w_down.shape[0], w_down.shape[2]
    flat, order, counts = _sort_by_expert(ids, E)
    tok = order // k
    xs = x[tok]
    offs = torch.cumsum(counts, 0).to(torch.int32)
    h = torch._grouped_mm(xs, w_gate_up.transpose(1, 2), offs=offs)
    a = F.silu(h[:, :f]) * h[:, f:]
    y = torch._grouped_mm(a, w_down.transpose(1, 2), offs=offs)
    y = y * weights.reshape(-1)[order].to(y.dtype)[:, None]
    out = torch.zeros(T, x.shape[1], dtype=accumulate_dtype(x.dtype), device=x.device)
    return out.index_add_(0, tok, y.to(out.dtype)).to(x.dtype)


def experts_padded_bmm(x, w_gate_up, w_down, weights, ids) -> torch.Tensor:
    """Sorted tokens scattered into ``[E, max_count, d]`` and ``torch.bmm``; differentiable. ``[T, d]``."""
    T, k = ids.shape
    E, d, f = w_down.shape
    flat, order, counts = _sort_by_expert(ids, E)
    tok = order // k
    expert = flat[order]
    start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(flat.numel(), device=x.device) - start[expert]
    cap = int(counts.max()) if flat.numel() else 0          # the one host sync of this path
    xp = x.new_zeros(E, max(cap, 1), d)
    xp = xp.index_put((expert, rank), x[tok])
    h = torch.bmm(xp, w_gate_up.transpose(1, 2))
    a = F.silu(h[..., :f]) * h[..., f:]
    yp = torch.bmm(a, w_down.transpose(1, 2))
    y = yp[expert, rank] * weights.reshape(-1)[order].to(x.dtype)[:, None]
    out = torch.zeros(T, d, dtype=accumulate_dtype(x.dtype), device=x.device)
    return out.index_add(0, tok, y.to(out.dtype)).to(x.dtype)


def experts_torch(x, w_gate_up, w_down, weights, ids) -> torch.Tensor:
    """Grouped GEMM where possible, padded batched matmul otherwise (see the module doc)."""
    if can_use_grouped_mm(x, w_gate_up, w_down):
        return experts_grouped_mm(x, w_gate_up, w_down, weights, ids)
    return experts_padded_bmm(x, w_gate_up, w_down, weights, ids)


# --------------------------------------------------------------------------- FP8 experts

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
