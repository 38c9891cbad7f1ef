"""MSA's index branch in Triton: block scores and a streaming top-k, fused, no S x S in memory.

One program takes ``BLOCK_M`` rows of the flattened ``[S * G, D_idx]`` index queries (the G
groups of a token share its index key, so packing them into the tile's M dimension lets every
loaded key block serve all groups). It walks the key blocks ``0 .. last visible``; for each it
computes the ``[BLOCK_M, Bk]`` tile of dots on the tensor cores, max-pools it over the causally
visible columns, and **inserts** the block into a per-row top-(k-1) list kept in registers.
Neither the ``S x S`` token scores nor the ``S x n_blocks`` block scores ever reach memory; what
is written is ``S * G * (topk - 1)`` int64 keys.

Exact, deterministic ties: each block's score becomes one int64 key
(:func:`minimax_lab.triton_blocks.topk_key`), so "higher score, then lower id" is plain integer
order and every key is distinct. Insertion replaces the row's smallest key when the new one is
larger (one min-with-index reduction over ``topk - 1`` registers per block). The keys are sorted
and decoded in torch (``S * G * 16`` values).

The score that is ranked is the raw max dot ``q_idx . k_idx``; the contract's ``1/sqrt(D_idx)``
is a positive factor, so the order is the same (two raw values the scaling would round to one
fp32 number are the only place the fast path may break a tie the reference sees).

At S = 128k, G = 4, D_idx = 128 this is ``S^2 / 2 * G * D_idx * 2 ~ 8.8`` TFLOP (causal half).

**FP8 index tensors** (``float8_e4m3fn`` queries and keys, one power-of-two scale per query row
and per key, :mod:`.msa_index_fp8`; GPUs with FP8, :func:`minimax_lab.runtime.supports`): the
dots run on the FP8 tensor cores and each key's scale multiplies its column of the tile after
the dot, exactly. A row's
own query scale is one positive power of two for the whole row: it cannot change the row's order,
so it is not applied. The ranking is then that of the dequantized ``q . k``, up to the order of
the fp32 sums (the same freedom the bf16 path has).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minimax_lab import configs
from minimax_lab.fp8 import FP8
from minimax_lab.triton_blocks import (KEY_MAX_C, KEY_MIN, KEY_MIN_C, dot_precision, needs_fp32_dot, require_dtypes,
                                       topk_block_torch, topk_key, upcast_if)


def _select_smem(a) -> int:
    """The index-query tile and the key tiles of one :func:`_select_kernel` program."""
    q = configs.tile_bytes((a["BLOCK_M"], a["BLOCK_D"]), itemsize=a["Qi"].element_size())
    k = configs.tile_bytes((a["BLOCK_D"], a["BLOCK_N"]), itemsize=a["Ki"].element_size())
    return q + configs.pipelined(a["num_stages"], k)


_SELECT_KEYS = ("BLOCK_M", "num_warps", "num_stages")
_SELECT_INTERPRETER = {"BLOCK_M": 32, "num_warps": 4, "num_stages": 1}
#: The fused index + top-k's launch: rows of (token, group) per program, warps, pipeline stages.
LAUNCH = configs.Launch(
    op="msa_select", keys=_SELECT_KEYS, interpreter=_SELECT_INTERPRETER,
    candidates=[dict(BLOCK_M=bm, num_warps=w, num_stages=st) for bm, w, st in
                [(128, 8, 3), (128, 8, 2), (128, 8, 4), (128, 4, 3), (64, 4, 3), (64, 4, 4), (256, 8, 3), (256, 8, 2)]],
    quick={"num_warps": 2},
    smem={"_select_kernel": _select_smem},
)
#: The same kernel on FP8 index tensors: their tiles are half the bytes of bf16's, so deeper
#: pipelines and wider row tiles fit.
FP8_LAUNCH = configs.Launch(
    op="msa_select_fp8", keys=_SELECT_KEYS, interpreter=_SELECT_INTERPRETER,
    candidates=[dict(BLOCK_M=bm, num_warps=w, num_stages=st) for bm, w, st in
                [(128, 8, 2), (128, 8, 3), (128, 8, 4), (128, 4, 3), (256, 8, 3), (256, 8, 4), (64, 4, 4)]],
    quick={"num_warps": 2},
    smem={"_select_kernel": _select_smem},
)


@triton.jit
def _select_kernel(
    Qi, Ki, Ks, Out,
    stride_qb, stride_qt, stride_qg,
    stride_kb, stride_kt,
    stride_ksb, stride_kst,
    stride_ob, stride_or,
    n_rows, S,
    G: tl.constexpr, DIDX: tl.constexpr, BLOCK_D: tl.constexpr, K_SEL: tl.constexpr, K_P: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAST_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
    FP8_KEYS: tl.constexpr,
):
    # reversed row tiles: the last tokens walk the most blocks, so they start first
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    b = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # row r = token * G + group
    row_ok = rows < n_rows
    tok = rows // G
    grp = rows % G
    local = tok // BLOCK_N  # the row's own block: not ranked (it is always selected, last)
    d = tl.arange(0, BLOCK_D)
    q = tl.load(Qi + b.to(tl.int64) * stride_qb + tok[:, None].to(tl.int64) * stride_qt
                + grp[:, None] * stride_qg + d[None, :],
                mask=row_ok[:, None] & (d[None, :] < DIDX), other=0.0)
    q = upcast_if(q, CAST_F32)  # the interpreter's tl.dot is wrong on bf16
    # top-(K_SEL) keys per row; padding columns (>= K_SEL) hold KEY_MAX so they are never the min
    kcol = tl.arange(0, K_P)
    top = tl.where(kcol[None, :] < K_SEL, tl.full([BLOCK_M, K_P], KEY_MIN_C, tl.int64),
                   tl.full([BLOCK_M, K_P], KEY_MAX_C, tl.int64))
    last_tok = tl.minimum(pid_m * BLOCK_M + BLOCK_M - 1, n_rows - 1) // G
    n_visit = last_tok // BLOCK_N  # blocks strictly before the tile's last local block
    cols = tl.arange(0, BLOCK_N)
    k_base = Ki + b.to(tl.int64) * stride_kb
    ks_base = Ks + b.to(tl.int64) * stride_ksb
    for blk in range(0, n_visit):
        keys = blk * BLOCK_N + cols
        kt = tl.load(k_base + keys[None, :].to(tl.int64) * stride_kt + d[:, None],
                     mask=(d[:, None] < DIDX), other=0.0)  # [BLOCK_D, BLOCK_N]; blk < local <= S/Bk: in range
        kt = upcast_if(kt, CAST_F32)
        s = tl.dot(q, kt, input_precision=DOT_PRECISION)  # fp32 inputs: full fp32, not TF32
        if FP8_KEYS:  # q . (k8 * s_k) = (q . k8) * s_k: a power of two per column, exact
            s = s * tl.load(ks_base + keys * stride_kst)[None, :]
        # blocks before the row's local block are fully visible: no causal mask needed
        key = topk_key(tl.max(s, axis=1), blk)
        key = tl.where(blk < local, key, KEY_MIN_C)  # the local block and later: not ranked
        # the row's smallest kept key and its slot in one reduction (cheaper than a min and an argmin)
        cur_min, at = tl.min(top, axis=1, return_indices=True)
        put = (kcol[None, :] == at[:, None]) & (key > cur_min)[:, None]
        top = tl.where(put, key[:, None], top)
    out = Out + b.to(tl.int64) * stride_ob + rows[:, None].to(tl.int64) * stride_or + kcol[None, :]
    tl.store(out, top, mask=row_ok[:, None] & (kcol[None, :] < K_SEL))


def topk_keys_triton(q_idx, k_idx, block_size: int, topk: int, config: dict | None = None,
                     k_idx_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Per (token, group) the ``topk - 1`` best earlier-block keys, unsorted: int64
    ``[B, S, G, topk - 1]`` (``KEY_MIN`` in unused slots). ``config`` overrides keys of the launch
    config. FP8 ``q_idx``/``k_idx`` come with the keys' scales ``k_idx_scale`` fp32 ``[B, S]``;
    they (and bf16 ones) raise :class:`minimax_lab.runtime.UnsupportedOnDevice` on a GPU without them."""
    require_dtypes("MSA's index kernel", q_idx, k_idx)
    fp8 = q_idx.dtype == FP8
    cfg = configs.launch_config(FP8_LAUNCH if fp8 else LAUNCH, config=config)
    B, S, G, Didx = q_idx.shape
    k_sel = topk - 1
    k_p = max(2, triton.next_power_of_2(k_sel))
    out = torch.empty(B, S, G, k_sel, dtype=torch.int64, device=q_idx.device)
    if q_idx.stride(3) != 1:
        q_idx = q_idx.contiguous()
    if k_idx.stride(2) != 1:
        k_idx = k_idx.contiguous()
    n_rows = S * G
    # the per-row top list lives in registers ([BLOCK_M, K_P] int64): a large topk takes fewer rows
    # per program (4096 keys per program; the default topk = 16 keeps the tuned BLOCK_M = 128)
    block_m = min(cfg["BLOCK_M"], max(16, 4096 // k_p))
    grid = (triton.cdiv(n_rows, block_m), B)
    scales = k_idx_scale if fp8 else k_idx  # (an unused pointer without FP8 keys)
    _select_kernel[grid](
        q_idx, k_idx, scales, out,
        q_idx.stride(0), q_idx.stride(1), q_idx.stride(2),
        k_idx.stride(0), k_idx.stride(1),
        *(k_idx_scale.stride() if fp8 else (0, 0)),
        out.stride(0), out.stride(2),
        n_rows, S,
        # the FP8 tensor cores take K in steps of 32
        G=G, DIDX=Didx, BLOCK_D=max(32 if fp8 else 16, triton.next_power_of_2(Didx)), K_SEL=k_sel,
        K_P=k_p, BLOCK_M=block_m, BLOCK_N=block_size,
        CAST_F32=needs_fp32_dot(q_idx.dtype),
        # fp32 index inputs on the GPU: tl.dot would round them to TF32 (10-bit mantissa) and
        # near-tied blocks would swap against the fp32 reference; "ieee" keeps fp32 products
        DOT_PRECISION=dot_precision(q_idx.dtype), FP8_KEYS=fp8,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return out


def selection_from_keys(keys: torch.Tensor, block_size: int, topk: int) -> torch.Tensor:
    """Sort the top keys (descending), decode block ids, append the local block, and apply the
    select-all rule for short prefixes: int32 ``[B, S, G, topk]``."""
    B, S, G, _ = keys.shape
    dev = keys.device
    ids = topk_block_torch(keys.sort(dim=-1, descending=True).values)
    local = (torch.arange(S, device=dev) // block_size)[None, :, None, None].expand(B, S, G, 1)
    sparse = torch.cat([ids, local], dim=-1)
    slot = torch.arange(topk, device=dev)
    all_vis = torch.where(slot < local + 1, slot, -1)  # rows that see <= topk blocks: all of them
    return torch.where(local + 1 <= topk, all_vis, sparse).to(torch.int32)


def msa_select_triton(q_idx, k_idx, *, block_size: int = 128, topk: int = 16,
                      config: dict | None = None, k_idx_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Selected block ids ``int32 [B, S, G, topk]`` (contract of :func:`.msa.msa_select`);
    ``config`` overrides keys of the launch config (:data:`LAUNCH`, or :data:`FP8_LAUNCH` for FP8
    index tensors, which come with ``k_idx_scale`` fp32 ``[B, S]``)."""
    B, S, G, _ = q_idx.shape
    if (q_idx.dtype == FP8) != (k_idx_scale is not None):
        raise ValueError("FP8 index tensors need k_idx_scale (and only they take one)")
    if topk == 1 or S <= topk * block_size:  # nothing to rank: every row keeps its local/visible blocks
        keys = torch.full((B, S, G, topk - 1), KEY_MIN, dtype=torch.int64, device=q_idx.device)
        return selection_from_keys(keys, block_size, topk)
    return selection_from_keys(topk_keys_triton(q_idx, k_idx, block_size, topk, config, k_idx_scale),
                               block_size, topk)
