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

from minimax_lab import configs, runtime
from minimax_lab.attention.msa_triton_prefill import inverted_index
from minimax_lab.triton_blocks import LOG2E, interpreter_safe, require_dtypes
from minimax_lab.validate import FLOAT_DTYPES, TRITON_DTYPES, check_tensor, check_triton_inputs

#: launch config in the interpreter: rows (tokens x heads) of the KV-outer tile, keys per KV-outer
#: program (a divisor of the block size; 0 = the whole block, or the largest part of it that fits
#: the GPU's shared memory, :func:`kv_block_keys`), warps and stages of both kernels
INTERPRETER_CONFIG = {"BLOCK_M": 16, "BLOCK_KN": 0, "num_warps": 4, "num_stages": 1, "Q_WARPS": 4, "Q_STAGES": 1}
#: on a GPU (untuned: a whole 128-key block's dK and dV accumulators in registers, 32 query rows
#: per step)
GPU_CONFIG = {"BLOCK_M": 32, "BLOCK_KN": 0, "num_warps": 4, "num_stages": 1, "Q_WARPS": 4, "Q_STAGES": 1}
#: dtypes the backward kernels take: the forward's, and fp64 (the checks' ground truth)
BACKWARD_DTYPES = TRITON_DTYPES + (torch.float64,)


def launch_config(config: dict | None = None) -> dict:
    """The kernels' launch config: :data:`INTERPRETER_CONFIG` or :data:`GPU_CONFIG`, with
    ``config``'s keys over it (an unknown key raises ``ValueError`` naming the allowed ones)."""
    base = INTERPRETER_CONFIG if runtime.is_interpreter() else GPU_CONFIG
    if config is not None and not isinstance(config, dict):
        raise ValueError(f"config must be a dict or None, got {type(config).__name__}")
    unknown = sorted(set(config or {}) - set(base))
    if unknown:
        raise ValueError(f"unknown msa backward config keys {unknown}; allowed: {sorted(base)}")
    return {**base, **(config or {})}


def dkdv_smem(block_kn: int, rows: int, block_d: int, itemsize: int, num_stages: int) -> int:
    """Shared memory of one :func:`_dkdv_kernel` program: its K and V tiles ``[block_kn, block_d]``
    held for the whole walk, and the ``[rows, block_d]`` query and ``do`` tiles of each step."""
    kv = configs.tile_bytes((block_kn, block_d), (block_kn, block_d), itemsize=itemsize)
    step = configs.tile_bytes((rows, block_d), itemsize=itemsize)
    return kv + configs.pipelined(num_stages, step, step)


def kv_block_keys(cfg: dict, block_size: int, rows: int, block_d: int, itemsize: int) -> int:
    """Keys per KV-outer program: ``cfg["BLOCK_KN"]`` when set, else the whole block, halved (down
    to 16, ``tl.dot``'s smallest side) until :func:`dkdv_smem` fits this GPU's shared memory
    (:func:`minimax_lab.configs.shared_memory_fits`: a 64 KB Turing splits a 128-key block of
    head dim 128). Raises ``ValueError`` for a ``BLOCK_KN`` that does not divide the block size."""
    if cfg["BLOCK_KN"]:
        if block_size % cfg["BLOCK_KN"]:
            raise ValueError(f"BLOCK_KN ({cfg['BLOCK_KN']}) must divide the block size ({block_size})")
        return cfg["BLOCK_KN"]
    keys = block_size
    while keys > 16 and not configs.shared_memory_fits(dkdv_smem(keys, rows, block_d, itemsize, cfg["num_stages"])):
        keys //= 2
    return keys


@triton.jit
def _dq_kernel(Q, K, V, O, dO, LSE, dLSE, Sel, dQ, Delta,
               stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
               stride_ob, stride_os, stride_oh, stride_dob, stride_dos, stride_doh, stride_dqb, stride_dqs, stride_dqh,
               S, qk_scale, scale,
               G: tl.constexpr, TOPK: tl.constexpr, HPG: tl.constexpr, M: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
               HAS_DLSE: tl.constexpr, ACC: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)  # (b, token, group), group fastest
    b = n // (S * G)
    t = (n // G) % S
    g = n % G
    hh = tl.arange(0, M)  # the group's query heads, packed into M (padded to >= 16)
    d = tl.arange(0, BLOCK_D)
    cols = tl.arange(0, BLOCK_N)
    hmask = hh < HPG
    dmask = d < HEAD_DIM
    rows_ok = hmask[:, None] & dmask[None, :]
    heads = g * HPG + hh
    q = tl.load(Q + b * stride_qb + t * stride_qs + heads[:, None] * stride_qh + d[None, :], mask=rows_ok, other=0.0)
    do = tl.load(dO + b * stride_dob + t * stride_dos + heads[:, None] * stride_doh + d[None, :], mask=rows_ok,
                 other=0.0)
    o = tl.load(O + b * stride_ob + t * stride_os + heads[:, None] * stride_oh + d[None, :], mask=rows_ok, other=0.0)
    row = (b * (G * HPG) + heads) * S + t  # [B, Hq, S] layout of lse, dlse and delta
    delta = tl.sum(do.to(ACC) * o.to(ACC), 1)
    if HAS_DLSE:
        delta -= tl.load(dLSE + row, mask=hmask, other=0.0).to(ACC)
    tl.store(Delta + row, delta, mask=hmask)
    lse = tl.load(LSE + row, mask=hmask, other=0.0).to(ACC)
    lse2 = tl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)  # LOG2E; empty rows: p = 0 below
    dq = tl.zeros([M, BLOCK_D], ACC)
    for slot in range(0, TOPK):
        blk = tl.load(Sel + n * TOPK + slot)
        keys = tl.maximum(blk, 0).to(tl.int64) * BLOCK_N + cols
        # tl.where, not `&`: a scalar test `&` a block one is rejected by newer Tritons
        kv_ok = tl.where(blk >= 0, keys <= t, False)  # unused slot, or causal inside the local block
        k = tl.load(K + b * stride_kb + keys[:, None] * stride_ks + g * stride_kh + d[None, :],
                    mask=kv_ok[:, None] & dmask[None, :], other=0.0)
        v = tl.load(V + b * stride_vb + keys[:, None] * stride_vs + g * stride_vh + d[None, :],
                    mask=kv_ok[:, None] & dmask[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k), out_dtype=ACC)
        p = tl.where(kv_ok[None, :], tl.math.exp2(s * qk_scale - lse2[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), out_dtype=ACC)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, out_dtype=ACC)
    tl.store(dQ + b * stride_dqb + t * stride_dqs + heads[:, None] * stride_dqh + d[None, :],
             (dq * scale).to(dQ.dtype.element_ty), mask=rows_ok)


@triton.jit
def _dkdv_kernel(Q, K, V, dO, LSE, Delta, Ent, TileGk, TileStart, TileLen, dK, dV,
                 stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                 stride_dob, stride_dos, stride_doh, stride_dkb, stride_dks, stride_dkh,
                 stride_dvb, stride_dvs, stride_dvh,
                 S, nb, qk_scale, scale,
                 G: tl.constexpr, TOPK: tl.constexpr, HPG: tl.constexpr, HPG_P: tl.constexpr, BT: tl.constexpr,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KN: tl.constexpr,
                 ACC: tl.constexpr):
    i = tl.program_id(0)
    gk = tl.load(TileGk + i).to(tl.int64)  # (batch, group, kv block) of this program
    start = tl.load(TileStart + i)
    n_tok = tl.load(TileLen + i)
    b = gk // (G * nb)
    g = (gk // nb) % G
    blk = gk % nb
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    keys = blk * BLOCK_N + tl.program_id(1) * BLOCK_KN + tl.arange(0, BLOCK_KN)  # this program's keys
    kmask = keys < S
    k = tl.load(K + b * stride_kb + keys[:, None] * stride_ks + g * stride_kh + d[None, :],
                mask=kmask[:, None] & dmask[None, :], other=0.0)
    v = tl.load(V + b * stride_vb + keys[:, None] * stride_vs + g * stride_vh + d[None, :],
                mask=kmask[:, None] & dmask[None, :], other=0.0)
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
        q = tl.load(Q + b * stride_qb + t64[:, None] * stride_qs + heads[:, None] * stride_qh + d[None, :],
                    mask=rows_ok, other=0.0)
        do = tl.load(dO + b * stride_dob + t64[:, None] * stride_dos + heads[:, None] * stride_doh + d[None, :],
                     mask=rows_ok, other=0.0)
        row = (b * (G * HPG) + heads) * S + t64
        lse = tl.load(LSE + row, mask=ok, other=0.0).to(ACC)
        lse2 = tl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)  # LOG2E
        delta = tl.load(Delta + row, mask=ok, other=0.0)
        s = tl.dot(q, tl.trans(k), out_dtype=ACC)
        visible = ok[:, None] & kmask[None, :] & (keys[None, :] <= t[:, None])  # causal: the local block
        p = tl.where(visible, tl.math.exp2(s * qk_scale - lse2[:, None]), 0.0)
        dv = tl.dot(tl.trans(p.to(do.dtype)), do, dv, out_dtype=ACC)
        dp = tl.dot(do, tl.trans(v), out_dtype=ACC)
        ds = p * (dp - delta[:, None])
        dk = tl.dot(tl.trans(ds.to(q.dtype)), q, dk, out_dtype=ACC)
    out_ok = kmask[:, None] & dmask[None, :]
    tl.store(dK + b * stride_dkb + keys[:, None] * stride_dks + g * stride_dkh + d[None, :],
             (dk * scale).to(dK.dtype.element_ty), mask=out_ok)
    tl.store(dV + b * stride_dvb + keys[:, None] * stride_dvs + g * stride_dvh + d[None, :],
             dv.to(dV.dtype.element_ty), mask=out_ok)


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
    cfg = launch_config(config)
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
        *_strides(q, k, v, o, do, dq), S, qk_scale, scale,
        G=G, TOPK=topk, HPG=hpg, M=max(16, hpg_p), HEAD_DIM=D, BLOCK_D=BLOCK_D, BLOCK_N=block_size,
        HAS_DLSE=dlse is not None, ACC=acc, num_warps=cfg["Q_WARPS"], num_stages=cfg["Q_STAGES"])
    n_blocks = math.ceil(S / block_size)
    entries, tile_gk, tile_start, tile_len = block_work_list(selected, n_blocks)
    bt = max(1, cfg["BLOCK_M"] // hpg_p)
    block_kn = kv_block_keys(cfg, block_size, bt * hpg_p, BLOCK_D, q.element_size())
    if tile_gk.numel():
        _dkdv_kernel[(tile_gk.numel(), block_size // block_kn)](
            q, k, v, do, lse, delta, entries, tile_gk, tile_start, tile_len, dk, dv,
            *_strides(q, k, v, do, dk, dv), S, n_blocks, qk_scale, scale,
            G=G, TOPK=topk, HPG=hpg, HPG_P=hpg_p, BT=bt, HEAD_DIM=D, BLOCK_D=BLOCK_D,
            BLOCK_N=block_size, BLOCK_KN=block_kn, ACC=acc, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return dq.to(dtypes[0]), dk.to(dtypes[1]), dv.to(dtypes[2])


def _strides(*ts):
    return [s for t in ts for s in (t.stride(0), t.stride(1), t.stride(2))]
