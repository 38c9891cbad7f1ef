"""The index branch's distillation loss in Triton: block max-pool forward, and its gradient, with
no ``S x S`` score matrix in memory.

The loss (:mod:`.msa_backward_index`) sees the index scores only through the student logits
``L[b, t, g, j] = max over block j's visible tokens i of q_idx[t, g] . k_idx[i] / sqrt(D_idx)``:
``[B, S, G, n_blocks]``, a block size smaller than the scores. So the kernels here do the
score-sized work and hand the block-sized rest to PyTorch (:class:`.msa_backward_autograd.IndexDistillLoss`):

* :func:`_block_max_kernel` -- one program per ``BLOCK_M`` rows of the flattened ``(token,
  group)`` index queries of a sequence (the groups of a token share its key, as in
  :mod:`.msa_triton_select`); it walks the visible key blocks, computes each ``[BLOCK_M, Bk]``
  tile of dots, and writes the block's max ``L`` and the token that attains it (``arg``, the
  lowest such token on a tie; ``-1`` for a block the row cannot see).
* Given ``dL`` (the loss's gradient w.r.t. the logits), the max passes it to ``arg`` alone:
  ``ds[t, g, arg] = dL[t, g, j]``. :func:`_dq_idx_kernel` gathers, per row, the ``n_blocks`` key
  rows at ``arg``: ``dq_idx[t, g] = sum_j dL[t, g, j] k_idx[arg] / sqrt(D_idx)``.
* :func:`_dk_idx_kernel` -- one program per (sequence, key block): it walks the rows that see
  the block, forms the one-hot ``[BLOCK_M, Bk]`` tile ``W = dL * (arg == key)`` and accumulates
  ``W^T @ q_idx`` on the tensor cores: ``dk_idx`` of a key is a sum over its own program's loop,
  written once (no atomics).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minimax_lab import configs
from minimax_lab.attention.msa_backward_autograd import IndexDistillLoss
from minimax_lab.attention.msa_backward_index_reference import NEG
from minimax_lab.triton_blocks import dot_precision, interpreter_safe, require_dtypes

def _block_max_smem(a) -> int:
    """The index-query tile one :func:`_block_max_kernel` program holds and the key tiles it walks."""
    q = configs.tile_bytes((a["BLOCK_M"], a["BLOCK_D"]), itemsize=a["Qi"].element_size())
    k = configs.tile_bytes((a["BLOCK_N"], a["BLOCK_D"]), itemsize=a["Ki"].element_size())
    return q + configs.pipelined(a["num_stages"], k)


def _dk_idx_smem(a) -> int:
    """The index-query rows one :func:`_dk_idx_kernel` program reads per step (and its one-hot tile)."""
    q = configs.tile_bytes((a["BLOCK_M"], a["BLOCK_D"]), itemsize=a["Qi"].element_size())
    onehot = configs.tile_bytes((a["BLOCK_M"], a["BLOCK_N"]), itemsize=a["Qi"].element_size())
    return configs.pipelined(a["num_stages"], q) + onehot


#: The index loss's launch, one config for its three kernels: rows of (token, group) per program,
#: warps, stages.
LAUNCH = configs.Launch(
    op="msa_index_backward",
    keys=("BLOCK_M", "num_warps", "num_stages"),
    interpreter={"BLOCK_M": 16, "num_warps": 4, "num_stages": 1},
    smem={"_block_max_kernel": _block_max_smem, "_dk_idx_kernel": _dk_idx_smem},
)


@triton.jit
def _rows(r0, S, G: tl.constexpr, BLOCK_M: tl.constexpr):
    """``BLOCK_M`` rows of the flattened ``(token, group)`` index queries from row ``r0``:
    ``(in range, token, group)``; row = token * G + group."""
    r = r0 + tl.arange(0, BLOCK_M)
    return r < S * G, (r // G).to(tl.int64), r % G


@triton.jit
def _block_max_kernel(Qi, Ki, L, Arg, stride_qb, stride_qt, stride_qg, stride_kb, stride_kt,
                      stride_lb, stride_lt, stride_lg,
                      S, inv_sqrt, G: tl.constexpr, DIDX: tl.constexpr, BLOCK_D: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NEG_L: tl.constexpr, ACC: tl.constexpr,
                      DOT_PRECISION: tl.constexpr):
    tile = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    rmask, t, g = _rows(tile * BLOCK_M, S, G, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    dmask = d < DIDX
    q = tl.load(Qi + b * stride_qb + t[:, None] * stride_qt + g[:, None] * stride_qg + d[None, :],
                mask=rmask[:, None] & dmask[None, :], other=0.0)
    cols = tl.arange(0, BLOCK_N)
    t_last = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // G, S - 1)  # the tile's last token
    out = b * stride_lb + t * stride_lt + g * stride_lg
    for j in range(0, t_last // BLOCK_N + 1):
        keys = j * BLOCK_N + cols
        k = tl.load(Ki + b * stride_kb + keys[:, None] * stride_kt + d[None, :],
                    mask=(keys < S)[:, None] & dmask[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k), out_dtype=ACC, input_precision=DOT_PRECISION) * inv_sqrt
        s = tl.where(keys[None, :] <= t[:, None], s, float("-inf"))  # causal; keys <= t < S exist
        best = tl.max(s, 1)
        at = tl.argmax(s, 1, tie_break_left=True)
        seen = j * BLOCK_N <= t  # the row sees at least the block's first token
        tl.store(L + out + j, tl.where(seen, best, NEG_L), mask=rmask)
        tl.store(Arg + out + j, tl.where(seen, j * BLOCK_N + at, -1).to(tl.int32), mask=rmask)


@triton.jit
def _dq_idx_kernel(Ki, dL, Arg, dQi, stride_kb, stride_kt, stride_lb, stride_lt, stride_lg,
                   stride_db, stride_dt, stride_dg,
                   S, inv_sqrt, G: tl.constexpr, DIDX: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr):
    tile = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    rmask, t, g = _rows(tile * BLOCK_M, S, G, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    dmask = d < DIDX
    t_last = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // G, S - 1)
    row = b * stride_lb + t * stride_lt + g * stride_lg
    acc = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    for j in range(0, t_last // BLOCK_N + 1):
        ok = rmask & (j * BLOCK_N <= t)
        at = tl.load(Arg + row + j, mask=ok, other=-1)
        w = tl.load(dL + row + j, mask=ok, other=0.0).to(ACC)
        k = tl.load(Ki + b * stride_kb + tl.maximum(at, 0).to(tl.int64)[:, None] * stride_kt + d[None, :],
                    mask=(at >= 0)[:, None] & dmask[None, :], other=0.0)  # the key row that won the max
        acc += w[:, None] * k.to(ACC)
    tl.store(dQi + b * stride_db + t[:, None] * stride_dt + g[:, None] * stride_dg + d[None, :],
             (acc * inv_sqrt).to(dQi.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])


@triton.jit
def _dk_idx_kernel(Qi, dL, Arg, dKi, stride_qb, stride_qt, stride_qg, stride_lb, stride_lt, stride_lg,
                   stride_db, stride_dt,
                   S, inv_sqrt, G: tl.constexpr, DIDX: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr, DOT_PRECISION: tl.constexpr):
    j = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    keys = j * BLOCK_N + tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    dmask = d < DIDX
    acc = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    for r0 in range(j * BLOCK_N * G, S * G, BLOCK_M):  # the rows whose token sees block j
        rmask, t, g = _rows(r0, S, G, BLOCK_M)
        row = b * stride_lb + t * stride_lt + g * stride_lg + j
        at = tl.load(Arg + row, mask=rmask, other=-1)
        w = tl.load(dL + row, mask=rmask, other=0.0).to(ACC)
        onehot = tl.where(at[:, None] == keys[None, :], w[:, None], 0.0)  # [BLOCK_M, BLOCK_N]
        q = tl.load(Qi + b * stride_qb + t[:, None] * stride_qt + g[:, None] * stride_qg + d[None, :],
                    mask=rmask[:, None] & dmask[None, :], other=0.0)
        acc = tl.dot(tl.trans(onehot.to(q.dtype)), q, acc, out_dtype=ACC, input_precision=DOT_PRECISION)
    tl.store(dKi + b * stride_db + keys[:, None] * stride_dt + d[None, :], (acc * inv_sqrt).to(dKi.dtype.element_ty),
             mask=(keys < S)[:, None] & dmask[None, :])


def _acc(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def block_logits_triton(q_idx, k_idx, block_size: int, *, config: dict | None = None):
    """``(L, arg)``: the student logits ``[B, S, G, n_blocks]`` (fp32; fp64 for fp64 inputs; :data:`NEG`
    where the row sees none of the block) and the token attaining each block's max (int32, ``-1``
    where unseen). ``q_idx [B, S, G, D_idx]``, ``k_idx [B, S, D_idx]`` of one dtype (fp16, bf16,
    fp32, fp64), any strides (other than unit stride along ``D_idx`` are copied). Inputs are
    assumed checked (:func:`.msa_backward_index.index_distill_loss`); bf16 on a GPU without it
    raises :class:`minimax_lab.runtime.UnsupportedOnDevice`."""
    require_dtypes("MSA's index loss", q_idx, k_idx)
    B, S, G, Didx = q_idx.shape
    nb = math.ceil(S / block_size)
    cfg = configs.launch_config(LAUNCH, config=config)
    out_dtype = torch.float64 if q_idx.dtype == torch.float64 else torch.float32
    q_idx, k_idx = (x if x.stride(-1) == 1 else x.contiguous() for x in interpreter_safe(q_idx, k_idx))
    L = torch.full((B, S, G, nb), NEG, dtype=out_dtype, device=q_idx.device)
    arg = torch.full((B, S, G, nb), -1, dtype=torch.int32, device=q_idx.device)
    grid = (triton.cdiv(S * G, cfg["BLOCK_M"]), B)
    _block_max_kernel[grid](q_idx, k_idx, L, arg, q_idx.stride(0), q_idx.stride(1), q_idx.stride(2),
                            k_idx.stride(0), k_idx.stride(1), L.stride(0), L.stride(1), L.stride(2),
                            S, 1.0 / math.sqrt(Didx), G=G, DIDX=Didx, BLOCK_D=max(16, triton.next_power_of_2(Didx)),
                            BLOCK_M=cfg["BLOCK_M"], BLOCK_N=block_size, NEG_L=NEG, ACC=_acc(out_dtype),
                            DOT_PRECISION=dot_precision(q_idx.dtype), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return L, arg


def index_grads_triton(q_idx, k_idx, arg, dL, block_size: int, *, config: dict | None = None):
    """``(dq_idx, dk_idx)`` in the dtypes of ``q_idx``/``k_idx`` from the logits' gradient
    ``dL [B, S, G, n_blocks]`` and ``arg`` of :func:`block_logits_triton` (the max passes each
    block's gradient to the token that attained it)."""
    B, S, G, Didx = q_idx.shape
    nb = arg.shape[-1]
    cfg = configs.launch_config(LAUNCH, config=config)
    dtypes = (q_idx.dtype, k_idx.dtype)
    q_idx, k_idx = (x if x.stride(-1) == 1 else x.contiguous() for x in interpreter_safe(q_idx, k_idx))
    arg, dL = arg.contiguous(), dL.contiguous()
    dq = torch.empty(B, S, G, Didx, dtype=q_idx.dtype, device=q_idx.device)
    dk = torch.empty(B, S, Didx, dtype=k_idx.dtype, device=k_idx.device)
    acc = _acc(q_idx.dtype)
    common = dict(G=G, DIDX=Didx, BLOCK_D=max(16, triton.next_power_of_2(Didx)), BLOCK_M=cfg["BLOCK_M"],
                  BLOCK_N=block_size, ACC=acc, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    _dq_idx_kernel[(triton.cdiv(S * G, cfg["BLOCK_M"]), B)](
        k_idx, dL, arg, dq, k_idx.stride(0), k_idx.stride(1), arg.stride(0), arg.stride(1), arg.stride(2),
        dq.stride(0), dq.stride(1), dq.stride(2), S, 1.0 / math.sqrt(Didx), **common)
    _dk_idx_kernel[(nb, B)](
        q_idx, dL, arg, dk, q_idx.stride(0), q_idx.stride(1), q_idx.stride(2), arg.stride(0), arg.stride(1),
        arg.stride(2), dk.stride(0), dk.stride(1), S, 1.0 / math.sqrt(Didx), DOT_PRECISION=dot_precision(q_idx.dtype),
        **common)
    return dq.to(dtypes[0]), dk.to(dtypes[1])


def index_distill_loss_triton(q_idx, k_idx, mass, *, block_size: int) -> torch.Tensor:
    """The loss through :class:`.msa_backward_autograd.IndexDistillLoss` with the Triton steps."""
    return IndexDistillLoss.apply(q_idx, k_idx, mass, block_size, block_logits_triton, index_grads_triton)
