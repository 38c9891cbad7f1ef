"""minimax-lab's stand-ins for the CUDA-only helpers SGLang's Triton fused MoE calls.

SGLang's ``fused_experts`` chains its two Triton GEMM kernels with helpers that, on CUDA, come
from compiled extensions (``sgl_kernel``, JIT CUDA) that a wheel extracted without its build
stack cannot run. This module replaces them with Triton/PyTorch code **of ours** that keeps the
same call signature and output contract, so SGLang's own Python and Triton code around them runs
unchanged. Each is a plain function: the bench times it on its own, so its share of SGLang's time
is visible.

* :func:`moe_align_block_size` -- ``sgl_kernel.moe_align_block_size``'s contract (the "+1
  bucket" convention: ``num_experts`` = E + 1 buckets, expert ``e`` is bucket ``e + 1``). It
  fills, in place: ``sorted_token_ids`` (every row = ``topk_ids.numel()`` first, then each
  expert's flat slots ``t * k + j`` in ascending expert order, each expert's group padded to a
  multiple of ``block_size``), ``experts_ids`` (expert of each used block, -1 past them) and
  ``num_tokens_post_pad[0]`` (rows in use). Computed by minimax-lab's own alignment
  (:mod:`minimax_lab.moe.align`: one Triton launch up to 4096 slots, three above on a GPU -- the
  alignment minimax-lab's own experts use -- and the torch chain elsewhere), then copied into
  the caller's buffers. Inside an expert, slots are in ascending order (the CUDA
  kernel's order is scheduling-dependent; no consumer depends on it). Not supported (raises
  ``NotImplementedError``): ``ignore_invalid_expert`` and filtered (-1) expert ids.
* :func:`silu_and_mul` -- ``out[..., j] = silu(x[..., j]) * x[..., d + j]`` for ``x [..., 2d]``,
  computed in fp32 and stored in ``out``'s dtype (one Triton kernel). The row-filter keywords of
  SGLang's JIT kernel are not supported (raise ``NotImplementedError``); ``fused_experts`` passes
  none when every expert is local.
* :func:`moe_sum_reduce` -- ``sgl_kernel.moe_sum_reduce``'s contract:
  ``output[t] = routed_scaling_factor * sum_j input[t, j]``. Delegates to SGLang's own Triton
  kernel of the same contract (``moe_sum_reduce_triton``, the one its ROCm path uses).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minimax_lab.moe.align_torch import align_tokens_unchecked
from minimax_lab.moe.align_triton import TRITON_ALIGN_MAX_SLOTS, align_decode, align_prefill, prefill_chunk


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int,
                         sorted_token_ids: torch.Tensor, experts_ids: torch.Tensor,
                         num_tokens_post_pad: torch.Tensor, cumsum_buffer: torch.Tensor | None = None,
                         pad_sorted_token_ids: bool = True, ignore_invalid_expert: bool = False) -> None:
    """Fill SGLang's alignment buffers in place (see the module docstring); ``cumsum_buffer`` is
    the CUDA kernel's workspace and is left untouched."""
    if ignore_invalid_expert:
        raise NotImplementedError("the minimax-lab stand-in has no ignore_invalid_expert mode")
    n_experts = num_experts - 1                      # "+1" convention: bucket 0 holds filtered (-1) ids
    n = topk_ids.numel()
    if n <= TRITON_ALIGN_MAX_SLOTS:
        al = align_decode(topk_ids, n_experts, block_size)
    elif topk_ids.is_cuda and prefill_chunk(n, n_experts):     # the same alignment minimax-lab's experts use
        al = align_prefill(topk_ids, n_experts, block_size)
    else:
        al = align_tokens_unchecked(topk_ids, n_experts, block_size)
    rows = min(al.capacity, sorted_token_ids.numel())
    sorted_token_ids[:rows].copy_(al.sorted_ids[:rows])
    if rows < sorted_token_ids.numel():
        sorted_token_ids[rows:].fill_(n)
    blocks = min(al.block_expert.numel(), experts_ids.numel())
    experts_ids[:blocks].copy_(al.block_expert[:blocks])
    if blocks < experts_ids.numel():
        experts_ids[blocks:].fill_(-1)
    num_tokens_post_pad[:1].copy_(al.num_rows)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, d, stride_xm, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < d
    gate = tl.load(x_ptr + row * stride_xm + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_xm + d + cols, mask=ok, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_om + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def silu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None, expert_ids=None, expert_step: int = 1, *,
                 sorted_token_ids=None, num_tokens_post_padded=None, num_valid_tokens: int = 0) -> torch.Tensor:
    """``silu(gate) * up`` over the last dimension ``[gate | up]``; returns ``out``."""
    if expert_ids is not None or sorted_token_ids is not None or num_tokens_post_padded is not None:
        raise NotImplementedError("the minimax-lab silu_and_mul stand-in computes every row (no row filter)")
    two_d = input.shape[-1]
    if two_d % 2:
        raise ValueError(f"silu_and_mul needs an even last dimension, got {two_d}")
    d = two_d // 2
    x = input.reshape(-1, two_d)
    if x.stride(-1) != 1:
        x = x.contiguous()
    if out is None:
        out = input.new_empty(*input.shape[:-1], d)
    o = out.view(-1, d)
    if o.shape[0] and d:
        block = min(1024, triton.next_power_of_2(d))
        _silu_and_mul_kernel[(o.shape[0], triton.cdiv(d, block))](x, o, d, x.stride(0), o.stride(0), BLOCK=block)
    return out


def absent(name: str, why: str):
    """A function named ``name`` that raises ``NotImplementedError(why)``: for the extension entry
    points the extracted files import but the bench never calls."""
    def fn(*args, **kwargs):
        raise NotImplementedError(f"{name}: {why}")
    fn.__name__ = name
    return fn


def moe_sum_reduce(input: torch.Tensor, output: torch.Tensor, routed_scaling_factor: float) -> None:
    """``output = routed_scaling_factor * input.sum(1)`` for ``input [T, k, d]``, ``output [T, d]``."""
    from sglang.kernels.ops.moe.fused_moe_triton_kernels import moe_sum_reduce_triton

    moe_sum_reduce_triton(input, output, routed_scaling_factor)
