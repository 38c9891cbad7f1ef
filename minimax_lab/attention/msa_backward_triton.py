"""The backward of MSA's sparse attention in Triton: dQ query-outer, dK/dV KV-outer, no atomics.

Contract of :func:`msa_attention_backward_triton`, formulas of :mod:`.msa_backward_reference`
(``ds = p * (dp - delta)``, ``dq = scale * ds @ k``, ``dk = scale * ds^T q``, ``dv = p^T do``).
Both kernels recompute the scores from ``q``, ``k`` and the forward's log-sum-exp: with ``lse``
the softmax weight of a (query, key) pair is ``p = exp(s - lse)``, no running max needed, so the
two gradients can be computed by two independent walks over the same selection:

**dQ, query-outer** (:func:`_dq_kernel`, as the forward's query-outer kernel): one program per
(batch, token, group). The group's ``Hq / G`` heads share its K/V blocks, so they are packed into
the tile's M dimension (padded to 16). The program first forms ``delta = do . o - dlse`` for its
rows (and stores it: the second kernel reads it), then walks the token's ``topk`` blocks:
``s = q k^T``, ``p``, ``dp = do v^T``, ``ds``, ``dq += ds @ k``. Each program owns its rows'
``dq``: one store, no atomics.

**dK/dV, KV-outer** (:func:`_dkdv_kernel`, the forward's inverted index): the entries of the
selection sorted by (batch, group, block) list, for every KV block, the (token, slot) pairs that
selected it (:func:`.msa_triton_prefill.inverted_index`). One program owns one KV block -- or
``BLOCK_KN`` keys of it -- and **all** of its entries: it loads its keys and values once, then
for ``BT`` tokens at a time gathers their ``BT x (Hq/G)`` query rows, ``do`` rows, ``lse`` and
``delta``, and accumulates ``dv += p^T do`` and ``dk += ds^T q`` in registers. A key block's
gradient is then a sum over its own program's loop only: written once, deterministic, and never
an atomic add. Programs run heaviest first (a block selected by many tokens starts early, so it
does not finish alone at the end of the grid).

Numerics: scores in the log2 domain (``qk_scale = scale * log2 e``, as in
:mod:`minimax_lab.triton_blocks`); ``p`` and ``ds`` are cast to the operands' dtype for the
tensor-core dots (fp32 accumulation; fp64 throughout for fp64 inputs). A row with no visible key
(``lse = -inf``) has ``p = 0``: its gradients are 0.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minimax_lab import configs
from minimax_lab.attention.msa_triton_prefill import (inverted_index, kv_outer_start, query_outer_start,
                                                      row_ptrs, row_strides, selected_block)
from minimax_lab.triton_blocks import LOG2E, dot_precision, interpreter_safe, require_dtypes
from minimax_lab.validate import FLOAT_DTYPES, TRITON_DTYPES, check_tensor, check_triton_inputs

#: dtypes the backward kernels take: the forward's, and fp64 (the checks' ground truth)
BACKWARD_DTYPES = TRITON_DTYPES + (torch.float64,)


def dkdv_smem(block_kn: int, rows: int, block_d: int, itemsize: int, num_stages: int) -> int:
    """Shared memory of one :func:`_dkdv_kernel` program: its K and V tiles ``[block_kn, block_d]``
    held for the whole walk, and the ``[rows, block_d]`` query and ``do`` tiles of each step."""
    kv = configs.tile_bytes((block_kn, block_d), (block_kn, block_d), itemsize=itemsize)
    step = configs.tile_bytes((rows, block_d), itemsize=itemsize)
    return kv + configs.pipelined(num_stages, step, step)


def _dkdv_smem(a) -> int:
    return dkdv_smem(a["BLOCK_KN"], a["BT"] * a["HPG_P"], a["BLOCK_D"], a["Q"].element_size(), a["num_stages"])


def _dq_smem(a) -> int:
    """The query and output-gradient tiles one :func:`_dq_kernel` program holds, and the K/V tiles
    of each selected block."""
    rows = configs.tile_bytes((a["M"], a["BLOCK_D"]), itemsize=a["Q"].element_size())
    kv = configs.tile_bytes((a["BLOCK_N"], a["BLOCK_D"]), itemsize=a["K"].element_size())
    return 2 * rows + configs.pipelined(a["num_stages"], kv, kv)


#: The backward's launch: rows (tokens x heads) of the KV-outer tile per step, at most ``BLOCK_KN``
#: keys per KV-outer program (``0``: the whole block; see :func:`kv_block_keys`), its warps and
#: stages, and the query-outer dQ kernel's warps and stages. A KV-outer program keeps its keys'
#: dK and dV in fp32 registers (``2 * BLOCK_KN * D`` values over ``32 * num_warps`` threads): the
#: candidates trade keys per program against warps.
LAUNCH = configs.Launch(
    op="msa_backward",
    keys=("BLOCK_M", "BLOCK_KN", "num_warps", "num_stages", "Q_WARPS", "Q_STAGES"),
    interpreter={"BLOCK_M": 16, "BLOCK_KN": 0, "num_warps": 4, "num_stages": 1, "Q_WARPS": 4, "Q_STAGES": 1},
    candidates=(
        [dict(BLOCK_M=bm, BLOCK_KN=kn, num_warps=w, num_stages=st)
         for bm, kn, w, st in [(32, 64, 4, 1), (32, 64, 4, 2), (64, 64, 4, 2), (16, 64, 4, 2), (32, 32, 4, 2),
                               (32, 128, 8, 1), (64, 128, 8, 2), (32, 128, 8, 2), (64, 64, 8, 2), (128, 128, 8, 2)]]
        + [dict(Q_WARPS=w, Q_STAGES=st) for w, st in [(4, 2), (4, 3), (8, 2), (2, 2)]]),
    quick={"BLOCK_M": 32},
    smem={"_dq_kernel": _dq_smem, "_dkdv_kernel": _dkdv_smem},
)


def kv_block_keys(cfg: dict, block_size: int, rows: int, block_d: int, itemsize: int) -> int:
    """Keys per KV-outer program: ``cfg["BLOCK_KN"]`` (``0``: the whole block), at most the block,
    halved (down to 16, ``tl.dot``'s smallest side) until :func:`dkdv_smem` fits this GPU's shared
    memory (:func:`minimax_lab.configs.shared_memory_fits`: a 64 KB Turing splits a 128-key block
    of head dim 128). Raises ``ValueError`` for a ``BLOCK_KN`` that is not 0 or a power of two (it
    must divide the block size, a power of two)."""
    want = cfg["BLOCK_KN"]
    if want < 0 or want & (want - 1):
        raise ValueError(f"BLOCK_KN must be 0 or a power of two that can divide the block size, got {want}")
    keys = min(want or block_size, block_size)
    while keys > 16 and not configs.shared_memory_fits(dkdv_smem(keys, rows, block_d, itemsize, cfg["num_stages"])):
        keys //= 2
    return keys


@triton.jit
def _dq_kernel(Q, K, V, O, dO, LSE, dLSE, Sel, dQ, Delta,
               q_strides, k_strides, v_strides, o_strides, do_strides, dq_strides, S, qk_scale, scale,
               G: tl.constexpr, TOPK: tl.constexpr, HPG: tl.constexpr, M: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
               HAS_DLSE: tl.constexpr, ACC: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # one program per (b, token, group), its heads packed into M rows, as the forward's query-outer kernel
    n, b, t, g, heads, hmask, d, rows_ok, q = query_outer_start(Q, q_strides, S, G, HPG, M, HEAD_DIM, BLOCK_D)
    do = tl.load(row_ptrs(dO, do_strides, b, t, heads[:, None], d), mask=rows_ok, other=0.0)
    o = tl.load(row_ptrs(O, o_strides, b, t, heads[:, None], d), mask=rows_ok, other=0.0)
    row = (b * (G * HPG) + heads) * S + t  # [B, Hq, S] layout of lse, dlse and delta
    delta = tl.sum(do.to(ACC) * o.to(ACC), 1)
    if HAS_DLSE:
        delta -= tl.load(dLSE + row, mask=hmask, other=0.0).to(ACC)
    tl.store(Delta + row, delta, mask=hmask)
    lse = tl.load(LSE + row, mask=hmask, other=0.0).to(ACC)
    lse2 = tl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)  # LOG2E; empty rows: p = 0 below
    dq = tl.zeros([M, BLOCK_D], ACC)
    for slot in range(0, TOPK):
        kv_ok, k, v = selected_block(K, V, k_strides, v_strides, Sel, n, slot, b, t, g, d, HEAD_DIM, TOPK, BLOCK_N)
        s = tl.dot(q, tl.trans(k), out_dtype=ACC, input_precision=DOT_PRECISION)
        p = tl.where(kv_ok[None, :], tl.math.exp2(s * qk_scale - lse2[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), out_dtype=ACC, input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, out_dtype=ACC, input_precision=DOT_PRECISION)
    tl.store(row_ptrs(dQ, dq_strides, b, t, heads[:, None], d), (dq * scale).to(dQ.dtype.element_ty), mask=rows_ok)


@triton.jit
def _dkdv_kernel(Q, K, V, dO, LSE, Delta, Ent, TileGk, TileStart, TileLen, dK, dV,
                 q_strides, k_strides, v_strides, do_strides, dkv_strides, S, qk_scale, scale,
                 G: tl.constexpr, TOPK: tl.constexpr, HPG: tl.constexpr, HPG_P: tl.constexpr, BT: tl.constexpr,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KN: tl.constexpr,
                 ACC: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # dkv_strides: the strides of dK and dV (allocated alike)
    b, g, start, n_tok, d, dmask, keys, kmask, k, v = kv_outer_start(
        K, V, TileGk, TileStart, TileLen, k_strides, v_strides, S, G, HEAD_DIM, BLOCK_D, BLOCK_N, BLOCK_KN)
    dk = tl.zeros([BLOCK_KN, BLOCK_D], ACC)
    dv = tl.zeros([BLOCK_KN, BLOCK_D], ACC)
    r = tl.arange(0, BT * HPG_P)  # row = (token of the step) * HPG_P + head of the group
    tok_i = r // HPG_P
    hh = r % HPG_P
    h_ok = hh < HPG
    heads = g * HPG + hh
    for j in range(0, n_tok, BT):
        ok = (j + tok_i < n_tok) & h_ok
        e = tl.load(Ent + start + j + tok_i, mask=ok, other=0)  # entry = ((b * S + t) * G + g) * TOPK + slot
        t = (e // (TOPK * G)) % S
        t64 = t.to(tl.int64)
        rows_ok = ok[:, None] & dmask[None, :]
        q = tl.load(row_ptrs(Q, q_strides, b, t64[:, None], heads[:, None], d), mask=rows_ok, other=0.0)
        do = tl.load(row_ptrs(dO, do_strides, b, t64[:, None], heads[:, None], d), mask=rows_ok, other=0.0)
        row = (b * (G * HPG) + heads) * S + t64
        lse = tl.load(LSE + row, mask=ok, other=0.0).to(ACC)
        lse2 = tl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)  # LOG2E
        delta = tl.load(Delta + row, mask=ok, other=0.0)
        s = tl.dot(q, tl.trans(k), out_dtype=ACC, input_precision=DOT_PRECISION)
        visible = ok[:, None] & kmask[None, :] & (keys[None, :] <= t[:, None])  # causal: the local block
        p = tl.where(visible, tl.math.exp2(s * qk_scale - lse2[:, None]), 0.0)
        dv = tl.dot(tl.trans(p.to(do.dtype)), do, dv, out_dtype=ACC, input_precision=DOT_PRECISION)
        dp = tl.dot(do, tl.trans(v), out_dtype=ACC, input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dk = tl.dot(tl.trans(ds.to(q.dtype)), q, dk, out_dtype=ACC, input_precision=DOT_PRECISION)
    out_ok = kmask[:, None] & dmask[None, :]
    tl.store(row_ptrs(dK, dkv_strides, b, keys[:, None], g, d), (dk * scale).to(dK.dtype.element_ty), mask=out_ok)
    tl.store(row_ptrs(dV, dkv_strides, b, keys[:, None], g, d), dv.to(dV.dtype.element_ty), mask=out_ok)


def block_work_list(selected: torch.Tensor, n_blocks: int):
    """The KV-outer work list of the backward: one program per (batch, group, KV block) that some
    (token, slot) selected, holding **all** of its entries, heaviest first.

    ``selected int32 [B, S, G, topk]`` -> ``(entries, tile_gk, tile_start, tile_len)`` int32 as
    :func:`.msa_triton_prefill.inverted_index` returns them (``entries`` flat indices into
    ``selected``, ``gk = (b * G + g) * n_blocks + block``), programs reordered by ``tile_len``
    descending. Blocks no entry selected get no program (their gradient is 0)."""
    # every entry of a block in one run: the run length bound is the number of entries
    entries, tile_gk, tile_start, tile_len = inverted_index(selected, n_blocks, max(1, selected.numel()))
    order = torch.argsort(tile_len, descending=True, stable=True)
    return entries, tile_gk[order], tile_start[order], tile_len[order]


def _check_backward_inputs(q, k, v, o, lse, do, selected, dlse, block_size):
    check_tensor(q, "q", ndim=4, dtypes=FLOAT_DTYPES)
    B, S, Hq, D = q.shape
    check_tensor(k, "k", shape=[B, S, None, D], dtypes=(q.dtype,))
    G = k.shape[2]
    check_tensor(v, "v", shape=list(k.shape), dtypes=(q.dtype,))
    check_tensor(o, "o", shape=list(q.shape), dtypes=(q.dtype,))
    check_tensor(do, "do", shape=list(q.shape), dtypes=FLOAT_DTYPES)
    check_tensor(lse, "lse", shape=[B, Hq, S], dtypes=FLOAT_DTYPES)
    if dlse is not None:
        check_tensor(dlse, "dlse", shape=[B, Hq, S], dtypes=FLOAT_DTYPES)
    check_tensor(selected, "selected", shape=[B, S, G, None], dtypes=(torch.int32,))
    if G < 1 or Hq % G:
        raise ValueError(f"Hq ({Hq}) must be a positive multiple of the kv heads ({G})")
    check_triton_inputs(float_dtypes=BACKWARD_DTYPES, allow_grad=True, q=q, k=k, v=v, o=o, do=do, lse=lse,
                        dlse=dlse, selected=selected)
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size}")


def msa_attention_backward_triton(q, k, v, o, lse, do, selected, *, block_size: int, scale: float | None = None,
                                  dlse=None, config: dict | None = None):
    """``(dq, dk, dv)`` of sparse attention over ``selected``, on the GPU (or the interpreter).

    ``q [B, S, Hq, D]``, ``k, v [B, S, G, D]`` (fp16, bf16, fp32; fp64 for checks), the forward's
    output ``o`` (q's shape and dtype) and log-sum-exp ``lse [B, Hq, S]`` (natural log, ``-inf``
    for a row with no key), the output's gradient ``do``, ``selected int32 [B, S, G, topk]`` (the
    forward's selection: each id ``-1`` or a block the token may see, no id twice in a row --
    unchecked here, :func:`.msa.check_selection` checks it), ``dlse [B, Hq, S]`` (the
    log-sum-exp's gradient) or None. Any strides. Returns gradients in the dtypes and shapes of
    ``q``, ``k``, ``v`` (contiguous). Raises ``ValueError``/``TypeError`` for bad shapes or dtypes,
    :class:`minimax_lab.runtime.UnsupportedOnDevice` for bf16 on a GPU without it."""
    _check_backward_inputs(q, k, v, o, lse, do, selected, dlse, block_size)
    require_dtypes("MSA's sparse backward", q, k, v)
    B, S, Hq, D = q.shape
    G, topk = k.shape[2], selected.shape[3]
    hpg = Hq // G
    dtypes = (q.dtype, k.dtype, v.dtype)
    if B * S == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    cfg = configs.launch_config(LAUNCH, config=config)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    acc = tl.float64 if q.dtype == torch.float64 else tl.float32
    q, k, v, o, do = interpreter_safe(q, k, v, o, do.to(q.dtype))  # interpreter: bf16 tl.dot is wrong
    q, k, v, o, do = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v, o, do))
    lse = lse.contiguous()
    dlse = dlse.contiguous() if dlse is not None else None
    selected = selected.contiguous()
    dq = torch.empty(B, S, Hq, D, dtype=q.dtype, device=q.device)
    dk = torch.zeros(B, S, G, D, dtype=q.dtype, device=q.device)  # blocks no token selected keep 0
    dv = torch.zeros(B, S, G, D, dtype=q.dtype, device=q.device)
    delta = torch.empty(B, Hq, S, dtype=torch.float64 if acc == tl.float64 else torch.float32, device=q.device)
    BLOCK_D = max(16, triton.next_power_of_2(D))
    hpg_p = triton.next_power_of_2(hpg)
    qk_scale = scale * LOG2E
    _dq_kernel[(B * S * G,)](
        q, k, v, o, do, lse, dlse if dlse is not None else lse, selected, dq, delta,
        *row_strides(q, k, v, o, do, dq), S, qk_scale, scale,
        G=G, TOPK=topk, HPG=hpg, M=max(16, hpg_p), HEAD_DIM=D, BLOCK_D=BLOCK_D, BLOCK_N=block_size,
        HAS_DLSE=dlse is not None, ACC=acc, DOT_PRECISION=dot_precision(q.dtype), num_warps=cfg["Q_WARPS"], num_stages=cfg["Q_STAGES"])
    n_blocks = math.ceil(S / block_size)
    entries, tile_gk, tile_start, tile_len = block_work_list(selected, n_blocks)
    bt = max(1, cfg["BLOCK_M"] // hpg_p)
    block_kn = kv_block_keys(cfg, block_size, bt * hpg_p, BLOCK_D, q.element_size())
    if tile_gk.numel():
        _dkdv_kernel[(tile_gk.numel(), block_size // block_kn)](
            q, k, v, do, lse, delta, entries, tile_gk, tile_start, tile_len, dk, dv,
            *row_strides(q, k, v, do, dk), S, qk_scale, scale,
            G=G, TOPK=topk, HPG=hpg, HPG_P=hpg_p, BT=bt, HEAD_DIM=D, BLOCK_D=BLOCK_D,
            BLOCK_N=block_size, BLOCK_KN=block_kn, ACC=acc, DOT_PRECISION=dot_precision(q.dtype),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return dq.to(dtypes[0]), dk.to(dtypes[1]), dv.to(dtypes[2])

