"""Fused MoE in Triton: two kernels over expert-aligned blocks of routed rows.

After :func:`~minimax_lab.moe.align.align_tokens` every block of ``BLOCK_M`` padded rows
belongs to one expert. Then:

* ``_gate_up_kernel`` -- one program per (block, N-tile of ``f``): gathers the block's rows of
  ``x`` (the token of slot ``s`` is ``s // k``), multiplies them by the expert's gate **and** up
  tiles with two accumulators, and applies SwiGLU in the epilogue, writing
  ``silu(g) * u`` to an intermediate ``[capacity, f]`` in the aligned (padded) row order.
* ``_down_kernel`` -- one program per (block, N-tile of ``d``): the block's intermediate rows
  times the expert's down tile, scaled by each row's routing weight, stored to the row's slot
  ``y[s, :]``. Every slot is written exactly once, so the combine is a deterministic
  ``y.view(T, k, d).sum(1)`` -- a sorted scatter instead of atomics.

Why this is fast at both ends. Decode (``T*k`` small next to ``E``): each used expert gets one
block, and a program streams its weight tile exactly once for all of the block's rows -- the
kernel is a weight-streaming loop that should run near the copy bandwidth. Prefill: blocks of
64-128 rows of one expert make each program an ordinary tensor-core GEMM tile; consecutive
program ids walk the N-tiles of one block, so the gathered rows stay in L2 while the expert's
weights (a few MB) are reused by its next block.

Configs (``BLOCK_M/N/K``, ``num_warps``, ``num_stages``) are picked by :func:`pick_config` from
the shape -- measured on the H200 (``results/notes_moe.md``) -- and fixed small ones in the
interpreter. The kernels have no backward (inputs that require grad raise under grad mode),
take fp16, bf16 or fp32 (float64 raises), and run bf16 in fp32 under the interpreter (its
bf16 ``tl.dot`` is wrong). Non-contiguous ``x`` or weights are copied on every call.
"""
from __future__ import annotations

import warnings

import torch
import triton
import triton.language as tl

from minimax_lab import runtime
from minimax_lab.moe.align import (TRITON_ALIGN_MAX_SLOTS, Alignment, align_decode, align_tokens_triton,
                                   align_tokens_unchecked)
from minimax_lab.validate import check_triton_inputs, interpreter_safe


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, out_ptr, sorted_ids_ptr, block_expert_ptr,
                    n_slots, top_k, d, f,
                    stride_xt, stride_we, stride_wn, stride_om,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    SWAP_AB: tl.constexpr):
    pid = tl.program_id(0)
    num_n = tl.cdiv(f, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert < 0:          # block past the last expert's padded rows: nothing to do
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(sorted_ids_ptr + rows)
    valid = slots < n_slots
    tok = (slots // top_k).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < f
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + tok[:, None] * stride_xt + offs_k[None, :]
    if SWAP_AB:
        # decode: the weight tile is the MMA's M operand ([BLOCK_N, BLOCK_K], its natural
        # K-contiguous layout) and the gathered rows are N (x^T, [BLOCK_K, BLOCK_M]), so the
        # accumulator is [BLOCK_N, BLOCK_M]: M = 64-256 is wgmma-sized even for 16 rows.
        wg_ptrs = w_ptr + expert * stride_we + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
        acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        # weight tiles loaded as [BLOCK_K, BLOCK_N] views of the K-contiguous [2f, d] matrix
        wg_ptrs = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    wu_ptrs = wg_ptrs + f * stride_wn
    acc_u = tl.zeros_like(acc_g)
    for k0 in range(0, d, BLOCK_K):
        k_ok = offs_k < d - k0
        xa = tl.load(x_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
        if SWAP_AB:
            w_ok = n_ok[:, None] & k_ok[None, :]
        else:
            w_ok = k_ok[:, None] & n_ok[None, :]
        wg = tl.load(wg_ptrs, mask=w_ok, other=0.0)
        wu = tl.load(wu_ptrs, mask=w_ok, other=0.0)
        if SWAP_AB:
            acc_g = tl.dot(wg, tl.trans(xa), acc_g)
            acc_u = tl.dot(wu, tl.trans(xa), acc_u)
        else:
            acc_g = tl.dot(xa, wg, acc_g)
            acc_u = tl.dot(xa, wu, acc_u)
        x_ptrs += BLOCK_K
        wg_ptrs += BLOCK_K
        wu_ptrs += BLOCK_K
    h = acc_g * tl.sigmoid(acc_g) * acc_u       # SwiGLU epilogue, in fp32
    if SWAP_AB:
        h = tl.trans(h)
    o_ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(o_ptrs, h.to(out_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


@triton.jit
def _down_kernel(a_ptr, w_ptr, y_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr,
                 n_slots, d, f,
                 stride_am, stride_we, stride_wn, stride_ys,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SWAP_AB: tl.constexpr):
    pid = tl.program_id(0)
    num_n = tl.cdiv(d, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(sorted_ids_ptr + rows)
    valid = slots < n_slots
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < d
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    if SWAP_AB:     # [BLOCK_N, BLOCK_K] weight tile as M, a^T as N (see _gate_up_kernel)
        w_ptrs = w_ptr + expert * stride_we + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        w_ptrs = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, f, BLOCK_K):
        k_ok = offs_k < f - k0
        a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
        if SWAP_AB:
            w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            acc = tl.dot(w, tl.trans(a), acc)
        else:
            w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc = tl.dot(a, w, acc)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if SWAP_AB:
        acc = tl.trans(acc)
    rw = tl.load(weights_ptr + slots, mask=valid, other=0.0).to(tl.float32)
    acc = acc * rw[:, None]                      # routing weight applied before the combine
    y_ptrs = y_ptr + slots[:, None].to(tl.int64) * stride_ys + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


#: Interpreter configs: small, so CPU tests stay fast and ragged d/f exercise the masks.
INTERPRETER_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4, "num_stages": 1,
                      "DOWN_BLOCK_N": 16, "DOWN_BLOCK_K": 16}

#: GPU configs by regime. Decode (few rows per expert): 16- or 32-row blocks, so each used
#: expert's weights are streamed once by one block; an expert whose rows overflow a block is
#: streamed once per block, which is why ``decode_wide`` (8-32 rows per expert on average)
#: takes 32-row blocks. ``SWAP_AB`` puts the weight tile in the MMA's M (wgmma instead of
#: mma.sync); on the H200 it measured within 1% of the unswapped kernels end to end. Picked by
#: ``tools/tune_moe.py --pick`` (best geometric mean over each regime's bench cases; sweep in
#: results/notes_moe.md). Prefill: full tensor-core tiles.
GPU_CONFIGS = {
    "decode": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3, "SWAP_AB": True,
               "DOWN_BLOCK_N": 128, "DOWN_BLOCK_K": 128, "DOWN_num_warps": 4, "DOWN_num_stages": 3,
               "DOWN_SWAP_AB": True},
    "decode_wide": {"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 8, "num_stages": 3, "SWAP_AB": True,
                    "DOWN_BLOCK_N": 128, "DOWN_BLOCK_K": 128, "DOWN_num_warps": 4, "DOWN_num_stages": 3,
                    "DOWN_SWAP_AB": False},
    "prefill": {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3,
                "DOWN_BLOCK_N": 128, "DOWN_BLOCK_K": 64},
}


def regime(n_slots: int, n_experts: int) -> str:
    """``"decode"`` (<= 8 routed rows per expert on average), ``"decode_wide"`` (<= 32) or ``"prefill"``."""
    rows_per_expert = n_slots / max(1, n_experts)
    return "decode" if rows_per_expert <= 8 else "decode_wide" if rows_per_expert <= 32 else "prefill"


_ALIGN_KERNEL_BROKEN: list[str] = []
#: decode-size alignment: ``"sort"`` (:func:`align_decode`) or ``"chunked"`` (``align_tokens_triton``)
DECODE_ALIGN = "sort"


def pick_config(n_slots: int, n_experts: int, d: int, f: int, itemsize: int = 2) -> dict:
    """The launch config for a shape: interpreter config on the CPU, else by rows per expert.

    The GPU configs were tuned for 2-byte operands (bf16/fp16); with 4-byte (fp32) operands
    every shared-memory tile doubles and the deepest ones would not fit the 227 KiB of an SM,
    so their K depth is halved (fp32 is the correctness path, not the tuned one)."""
    if runtime.is_interpreter():
        return dict(INTERPRETER_CONFIG)
    cfg = dict(GPU_CONFIGS[regime(n_slots, n_experts)])
    if itemsize > 2:
        for key in ("BLOCK_K", "DOWN_BLOCK_K"):
            if key in cfg:
                cfg[key] = max(16, cfg[key] * 2 // itemsize)
    return cfg


def experts_triton(x, w_gate_up, w_down, weights, ids, *, config: dict | None = None,
                   alignment: Alignment | None = None) -> torch.Tensor:
    """The fused MoE forward; returns ``[T, d]`` in ``x``'s dtype. Inputs as in :func:`moe_experts`.

    ``config`` overrides :func:`pick_config` key by key (keys ``BLOCK_M, BLOCK_N, BLOCK_K,
    num_warps, num_stages, SWAP_AB`` and optionally ``DOWN_BLOCK_N, DOWN_BLOCK_K``,
    ``DOWN_num_warps``, ``DOWN_num_stages``, ``DOWN_SWAP_AB`` for the down kernel); keys it
    leaves out keep the regime's values.
    """
    # before any launch: a tensor off the kernel device must not reach (and disable) the alignment kernel
    check_triton_inputs(x=x, w_gate_up=w_gate_up, w_down=w_down, weights=weights, ids=ids)
    out_dtype = x.dtype
    x, w_gate_up, w_down, weights = interpreter_safe(x, w_gate_up, w_down, weights)  # bf16 tl.dot is wrong there
    T, k = ids.shape
    E, d, f = w_down.shape
    n_slots = T * k
    cfg = {**pick_config(n_slots, E, d, f, x.element_size()), **(config or {})}
    bm = cfg["BLOCK_M"]
    if alignment is not None:
        al = alignment
    elif n_slots <= TRITON_ALIGN_MAX_SLOTS and not _ALIGN_KERNEL_BROKEN:
        try:                                   # decode sizes: one launch instead of ~25 (see align.py)
            al = (align_decode if DECODE_ALIGN == "sort" else align_tokens_triton)(ids.contiguous(), E, bm)
        except Exception as e:  # noqa: BLE001 - say so loudly, then keep working with the torch version
            _ALIGN_KERNEL_BROKEN.append(repr(e))
            warnings.warn(f"Triton alignment kernel failed ({e!r}); using the torch alignment from now on")
            al = align_tokens_unchecked(ids, E, bm)
    else:
        al = align_tokens_unchecked(ids, E, bm)
    if al.block_m != bm:
        raise ValueError(f"alignment was built for block_m={al.block_m}, config wants BLOCK_M={bm}")
    x = x.contiguous()
    inter = launch_gate_up(x, w_gate_up.contiguous(), al.sorted_ids, al.block_expert, k, cfg)
    y = launch_down(inter, w_down.contiguous(), al.sorted_ids, al.block_expert,
                    weights.reshape(-1).contiguous(), cfg)
    return y.view(T, k, d).sum(dim=1).to(out_dtype)


def launch_gate_up(x, w_gate_up, sorted_ids, block_expert, top_k: int, cfg: dict,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """``_gate_up_kernel`` over an alignment (contiguous inputs): the ``[capacity, f]`` SwiGLU rows
    (padding rows are left unwritten), into ``out`` if given."""
    T, d = x.shape
    f = w_gate_up.shape[1] // 2
    n_blocks = block_expert.numel()
    inter = torch.empty(sorted_ids.numel(), f, dtype=x.dtype, device=x.device) if out is None else out
    grid = (n_blocks * triton.cdiv(f, cfg["BLOCK_N"]),)
    _gate_up_kernel[grid](x, w_gate_up, inter, sorted_ids, block_expert, T * top_k, top_k, d, f,
                          x.stride(0), w_gate_up.stride(0), w_gate_up.stride(1), inter.stride(0),
                          BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                          SWAP_AB=bool(cfg.get("SWAP_AB", False)),
                          num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return inter


def launch_down(inter, w_down, sorted_ids, block_expert, w_flat, cfg: dict,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """``_down_kernel``: ``[n_slots, d]`` rows, each scaled by its routing weight (``w_flat``),
    into ``out`` if given."""
    n_slots = w_flat.numel()
    E, d, f = w_down.shape
    y = torch.empty(n_slots, d, dtype=inter.dtype, device=inter.device) if out is None else out
    dbn, dbk = cfg.get("DOWN_BLOCK_N", cfg["BLOCK_N"]), cfg.get("DOWN_BLOCK_K", cfg["BLOCK_K"])
    grid = (block_expert.numel() * triton.cdiv(d, dbn),)
    _down_kernel[grid](inter, w_down, y, sorted_ids, block_expert, w_flat, n_slots, d, f,
                       inter.stride(0), w_down.stride(0), w_down.stride(1), y.stride(0),
                       BLOCK_M=cfg["BLOCK_M"], BLOCK_N=dbn, BLOCK_K=dbk,
                       SWAP_AB=bool(cfg.get("DOWN_SWAP_AB", cfg.get("SWAP_AB", False))),
                       num_warps=cfg.get("DOWN_num_warps", cfg["num_warps"]),
                       num_stages=cfg.get("DOWN_num_stages", cfg["num_stages"]))
    return y
