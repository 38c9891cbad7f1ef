"""The kernel bench's MoE problems: token alignment (a stable order of the routed slots by expert,
and each expert's count) and the fused SwiGLU experts with FP8 weights, against what a user would
call instead (``torch.sort`` + ``torch.bincount``; ``torch._scaled_grouped_mm``).
"""
from __future__ import annotations

import torch

from minimax_lab import runtime
from minimax_lab.fp8 import quantize_fp8
from minimax_lab.kernelbench.problem import Peer, Problem, _dev, _gen, _nbytes, _randn
from minimax_lab.moe import align as moe_align
from minimax_lab.moe import moe_experts
from minimax_lab.moe.experts_reference import experts_fp8_reference
from minimax_lab.moe.experts_torch import experts_fp8_torch


def _distinct_experts(T: int, E: int, k: int, g: torch.Generator) -> torch.Tensor:
    """``[T, k]`` int64: k distinct random experts per token (top-k of random keys, vectorized)."""
    return torch.rand(T, E, generator=g).argsort(dim=1)[:, :k]


def _align_inputs(shape, seed, regime):
    g = _gen(seed)
    T, k, E = shape["tokens"], shape["top_k"], shape["experts"]
    ids = _distinct_experts(T, E, k, g)
    return {"topk_ids": ids.to(torch.int32).to(_dev()), "n_experts": E}


def moe_align_reference(topk_ids, n_experts):
    """Group the (token, slot) pairs by expert: returns ``(order int64 [T*k], counts int64 [E])``
    where ``order`` lists flat slot indices ``t * k + j`` expert by expert, in token order within an
    expert (a stable sort), and ``counts[e]`` is expert e's number of rows."""
    flat = topk_ids.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices
    return order, torch.bincount(flat, minlength=n_experts)


MOE_ALIGN = Problem(
    name="moe_align",
    description="MoE token alignment: stable order of (token, slot) pairs by expert, and per-expert counts",
    reference=moe_align_reference,
    make_inputs=_align_inputs,
    validation_shapes=lambda p: runtime.pick(p, cpu=[{"tokens": 16, "top_k": 2, "experts": 8}],
                                              gpu=[{"tokens": 8192, "top_k": 8, "experts": 128}]),
    draw_test_shape=lambda rng, p: runtime.pick(
        p, cpu={"tokens": rng.randint(1, 40), "top_k": rng.randint(1, 3), "experts": rng.randint(4, 12)},
        gpu={"tokens": rng.randint(1, 16384), "top_k": rng.choice([1, 2, 4, 8]), "experts": rng.choice([8, 64, 128, 256])}),
    timing_shape=lambda p: runtime.pick(p, cpu={"tokens": 32, "top_k": 2, "experts": 8},
                                        gpu={"tokens": 8192, "top_k": 8, "experts": 128}),
    tol=0.0,
    best=lambda: moe_align_workbook,
    strong_peer=lambda: Peer("torch.sort(stable=True) + torch.bincount", moe_align_reference,
                             note="the reference's two PyTorch calls are what a user writes (SGLang's "
                                  "moe_align_block_size pads per block and is not stable within an expert)"),
    # read the ids, write the int64 order and the counts
    traffic=lambda topk_ids, n_experts: (0.0, _nbytes(topk_ids) + 8.0 * topk_ids.numel() + 8.0 * n_experts),
)

def moe_align_workbook(topk_ids, n_experts):
    """The MoE chapter's ``align_tokens`` (block-padded layout) adapted to this contract: with
    ``block_m = 1`` nothing is padded, so the first ``T*k`` rows of ``sorted_ids`` are the stable
    expert order. The one-launch Triton version is used where it applies (``T*k`` up to
    ``TRITON_ALIGN_MAX_SLOTS``)."""
    n = topk_ids.numel()
    align = moe_align.align_tokens_triton if n <= moe_align.TRITON_ALIGN_MAX_SLOTS else moe_align.align_tokens_unchecked
    a = align(topk_ids, n_experts, 1)
    return a.sorted_ids[:n], a.counts


def _fp8_moe_inputs(shape, seed, regime):
    T, d, f, E, k = shape["tokens"], shape["d_model"], shape["d_ff"], shape["experts"], shape["top_k"]
    g = _gen(seed)
    w13 = torch.randn(E, 2 * f, d, generator=g) / d**0.5
    w2 = torch.randn(E, d, f, generator=g) / f**0.5
    w13, s13 = quantize_fp8(w13)  # one power-of-two scale per output channel
    w2, s2 = quantize_fp8(w2)
    ids = _distinct_experts(T, E, k, g)
    weights = torch.softmax(torch.randn(T, k, generator=g), dim=-1)
    dev = _dev()
    return {"x": _randn((T, d), seed + 1, regime, torch.float32),
            "w13": w13.to(dev), "w13_scale": s13.to(dev), "w2": w2.to(dev), "w2_scale": s2.to(dev),
            "topk_ids": ids.to(torch.int32).to(dev), "topk_weights": weights.to(dev)}


def fp8_moe_reference(x, w13, w13_scale, w2, w2_scale, topk_ids, topk_weights):
    """SwiGLU experts with fp8 (e4m3) weights and per-output-channel scales, activations quantized
    per token with power-of-two scales (:mod:`minimax_lab.moe.experts_reference` spells out the five
    steps): ``out[t] = sum_j w[t,j] * W2_e q(bf16(silu(G_e q(x)) * U_e q(x)))`` with
    e = topk_ids[t, j] and ``q`` the per-row FP8 round trip of :func:`minimax_lab.fp8.quantize_fp8`."""
    # the harness hands references fp32 copies of every float input: fp8 values come back exactly
    w13, w2 = (w if w.dtype == torch.float8_e4m3fn else w.to(torch.float8_e4m3fn) for w in (w13, w2))
    return experts_fp8_reference(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids)


def fp8_fused_moe_workbook(x, w13, w13_scale, w2, w2_scale, topk_ids, topk_weights):
    """The MoE chapter's fused Triton experts with FP8 weights."""
    return moe_experts(x, w13, w2, topk_weights, topk_ids, impl="triton", check_ids=False,
                       w_gate_up_scale=w13_scale, w_down_scale=w2_scale)


def fp8_grouped_gemm_peer(x, w13, w13_scale, w2, w2_scale, topk_ids, topk_weights):
    """The MoE chapter's PyTorch FP8 experts: ``torch._scaled_grouped_mm`` on Hopper-class GPUs
    (``torch._scaled_mm`` per expert on other FP8 GPUs, dequantized grouped GEMMs elsewhere)."""
    return experts_fp8_torch(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids)


def _fp8_moe_traffic(x, w13, w13_scale, w2, w2_scale, topk_ids, topk_weights):
    """Only the experts some token picked need their weights read (fp8: 3 f d bytes each); 6 T k d f
    flops (gate and up: 4 d f per routed token, down: 2 d f); x read, the output written."""
    used = topk_ids.unique()
    f, d = w2.shape[-1], w2.shape[1]
    weights = float(used.numel()) * (3 * f * d * w13.element_size() + 3 * f * w13_scale.element_size())
    return 6.0 * topk_ids.numel() * d * f, weights + 2 * _nbytes(x) + _nbytes(topk_ids, topk_weights)


FP8_MOE = Problem(
    name="fp8_fused_moe",
    description="fused MoE (SwiGLU experts) with fp8 (e4m3) weights, one fp32 scale per output channel, "
                "activations quantized per token",
    reference=fp8_moe_reference,
    make_inputs=_fp8_moe_inputs,
    validation_shapes=lambda p: runtime.pick(p, cpu=[{"tokens": 12, "d_model": 32, "d_ff": 48, "experts": 4, "top_k": 2}],
                                              gpu=[{"tokens": 4096, "d_model": 4096, "d_ff": 1536, "experts": 64, "top_k": 8}]),
    draw_test_shape=lambda rng, p: runtime.pick(
        p, cpu={"tokens": rng.randint(1, 20), "d_model": 8 * rng.randint(1, 6), "d_ff": 8 * rng.randint(1, 8),
                "experts": rng.randint(2, 6), "top_k": 2},
        gpu={"tokens": rng.randint(1, 8192), "d_model": 4096, "d_ff": 1536, "experts": 64, "top_k": 8}),
    timing_shape=lambda p: runtime.pick(p, cpu={"tokens": 16, "d_model": 32, "d_ff": 48, "experts": 4, "top_k": 2},
                                        gpu={"tokens": 4096, "d_model": 4096, "d_ff": 1536, "experts": 64, "top_k": 8}),
    tol=2e-2,  # the reference quantizes as a kernel must: what is left is summation order and rounding ties
    best=lambda: fp8_fused_moe_workbook,
    strong_peer=lambda: Peer("torch._scaled_grouped_mm (FP8 grouped GEMMs)", fp8_grouped_gemm_peer,
                             note="sorted routed rows through PyTorch's FP8 grouped GEMM where the GPU runs it; "
                                  "SGLang's fused MoE (where fetched) takes bf16/fp16 weights, not this contract"),
    traffic=_fp8_moe_traffic,
)
