"""MSA sparse prefill in Triton: the query-outer kernel and the KV-outer schedule.

Both compute the contract of :func:`minimax_lab.attention.msa.msa_attention`: each query head
attends, with an exact softmax, over the tokens of its group's ``topk`` selected blocks
(``selected int32 [B, S, G, topk]``, ``-1`` = unused), causal inside the local block.
Scores use ``exp2`` with ``log2(e) * scale`` folded into one multiply, as in :mod:`.dense_triton`.

**Query-outer** (:func:`_query_outer_kernel`): one program per (batch, token, group). Its
``Hq / G`` query heads share the group's K/V, so they are packed into the tile's M dimension
(padded to 16, the smallest tensor-core tile); the program walks the token's ``topk`` blocks
with an online softmax and writes the output directly. Simple, but every (token, group) reads
``topk * Bk`` keys and values of its own: with M = 16 rows per K/V tile the arithmetic
intensity is low (~16 FLOP/byte) and the tensor cores wait on memory.

**KV-outer** (the MSA paper's schedule, arXiv 2606.13392): turn the selection around. For each
KV block, list the (token, slot) entries that selected it -- an *inverted index* built with
torch ops (a stable sort by ``(batch, group, block)``, ``bincount`` and ``cumsum``). A program
owns one KV block and a run of up to ``TOKENS_PER_PROG`` of those tokens: it loads K and V
once, then for ``BT`` tokens at a time packs ``BT x (Hq/G)`` query rows into M (128 rows on the
GPU), computes that block's scores, and writes a **partial** result per (token, slot, head):
the block-normalized output and its log-sum-exp. A small combine kernel merges the ``topk``
partials of each (token, head) by their log-sum-exp weights. Each K/V block is read once per
run of tokens instead of once per token; the price is the partials' round trip through memory
(bf16 on the GPU), so queries are processed in chunks whose partials fit a memory budget. A
KV-outer program holds a whole K and V block; where that does not fit the GPU's shared memory
(a 64 KB Turing at ``Bk = D = 128``), ``schedule="auto"`` runs the query-outer kernel.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minimax_lab import configs
from minimax_lab.attention.msa_triton_select import msa_select_triton
from minimax_lab.triton_blocks import (LOG2E, dot_precision, finish_rows, interpreter_safe, log2_sum_exp, merge_weights,
                                       natural_lse, require_dtypes, softmax_tile_weights)
from minimax_lab.validate import check_triton_inputs

#: partial outputs of one query chunk of the KV-outer schedule (a larger budget, fewer chunks)
PARTIAL_BUDGET_BYTES = 16 * 2**30
SCHEDULES = ("auto", "kv", "query")


def _query_outer_smem(a) -> int:
    """The query tile and the K/V block tiles of one :func:`_query_outer_kernel` program."""
    return configs.attention_smem(a["M"], a["BLOCK_N"], a["BLOCK_D"], q_itemsize=a["Q"].element_size(),
                                  kv_itemsize=a["K"].element_size(), num_stages=a["num_stages"])


def _kv_outer_smem(a) -> int:
    """The K/V block one :func:`_kv_outer_kernel` program holds, and its query-row tiles."""
    kv = configs.tile_bytes((a["BLOCK_N"], a["BLOCK_D"]), (a["BLOCK_N"], a["BLOCK_D"]),
                            itemsize=a["K"].element_size())
    q = configs.tile_bytes((a["BT"] * a["HPG_P"], a["BLOCK_D"]), itemsize=a["Q"].element_size())
    return kv + configs.pipelined(a["num_stages"], q)


#: The sparse prefill's launch: rows of the packed query tile, tokens per KV-outer program, warps,
#: stages, tokens per L2 sub-chunk (see :func:`inverted_index`), warps of the combine kernel,
#: warps and stages of the query-outer kernel; the tuner's candidates change one part each.
LAUNCH = configs.Launch(
    op="msa_prefill",
    keys=("BLOCK_M", "TOKENS_PER_PROG", "num_warps", "num_stages", "L2_TOKENS", "COMBINE_WARPS", "Q_WARPS",
          "Q_STAGES"),
    interpreter={"BLOCK_M": 16, "TOKENS_PER_PROG": 16, "num_warps": 4, "num_stages": 1,
                 "L2_TOKENS": 0, "COMBINE_WARPS": 4, "Q_WARPS": 4, "Q_STAGES": 1},
    candidates=(
        [dict(L2_TOKENS=n) for n in (0, 8192)]
        + [dict(BLOCK_M=bm, TOKENS_PER_PROG=tp, num_warps=w, num_stages=st)
           for bm, tp, w, st in [(64, 128, 4, 2), (64, 256, 4, 2), (64, 256, 4, 1), (64, 64, 4, 2), (64, 128, 4, 1),
                                 (64, 128, 8, 2), (32, 128, 4, 2), (32, 128, 2, 2), (32, 64, 4, 3), (128, 256, 8, 2)]]
        + [dict(COMBINE_WARPS=w) for w in (4, 8, 16)]),
    quick={"COMBINE_WARPS": 2},
    smem={"_query_outer_kernel": _query_outer_smem, "_kv_outer_kernel": _kv_outer_smem},
)


@triton.jit
def _combine_kernel(Po, Plse, O, LSE,
                    stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                    Sc, t0,
                    G: tl.constexpr, HPG: tl.constexpr, HPG_P: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_D: tl.constexpr, NP: tl.constexpr, NP_P: tl.constexpr, STORE_LSE: tl.constexpr):
    """Merge ``NP`` partial results per (row n = (b, token, group), head): partial outputs
    ``Po [N, NP, HPG, D]`` (each normalized by its own sum) and their log2-sum-exp
    ``Plse [N, NP, HPG]`` (``-inf`` = empty). o = sum_p 2^(lse_p - lse) * o_p."""
    n = tl.program_id(0).to(tl.int64)
    b = n // (Sc * G)
    t = t0 + (n // G) % Sc
    g = n % G
    hh = tl.arange(0, HPG_P)
    d = tl.arange(0, BLOCK_D)
    p = tl.arange(0, NP_P)
    hmask = hh < HPG
    lse_all = tl.load(Plse + (n * NP + p[:, None]) * HPG + hh[None, :],
                      mask=(p[:, None] < NP) & hmask[None, :], other=float("-inf"))  # [NP_P, HPG_P]
    m_safe, l = merge_weights(lse_all)  # per head: the largest lse (0 if all empty), the weights' sum
    acc = tl.zeros([HPG_P, BLOCK_D], tl.float32)
    for i in tl.static_range(NP):
        lse_i = tl.load(Plse + (n * NP + i) * HPG + hh, mask=hmask, other=float("-inf"))
        w = tl.math.exp2(lse_i - m_safe)
        # loaded without a mask on w, so the 16 loads need not wait for the LSE loads; the
        # slots of unused entries were never written (may hold NaN), hence where() not w * o
        o_i = tl.load(Po + ((n * NP + i) * HPG + hh[:, None]) * HEAD_DIM + d[None, :],
                      mask=hmask[:, None] & (d[None, :] < HEAD_DIM), other=0.0)
        acc += tl.where((w > 0)[:, None], w[:, None] * o_i.to(tl.float32), 0.0)
    out = acc / tl.where(l == 0.0, 1.0, l)[:, None]
    heads = g * HPG + hh
    tl.store(O + b * stride_ob + t * stride_os + heads[:, None] * stride_oh + d[None, :],
             out.to(O.dtype.element_ty), mask=hmask[:, None] & (d[None, :] < HEAD_DIM))
    if STORE_LSE:
        lse = natural_lse(log2_sum_exp(m_safe, l))
        tl.store(LSE + b * stride_lb + heads * stride_lh + t, lse, mask=hmask)


def combine_partials(po, plse, o, lse, *, Sc: int, t0: int, G: int, hpg: int, num_warps: int = 4):
    """Launch :func:`_combine_kernel` over ``N = B * Sc * G`` rows into ``o [B, S, Hq, D]``
    (tokens ``t0 .. t0 + Sc``) and optionally ``lse [B, Hq, S]`` (natural log)."""
    N, NP = plse.shape[0], plse.shape[1]
    D = o.shape[-1]
    if N == 0:
        return
    lse_arg = lse if lse is not None else plse
    _combine_kernel[(N,)](
        po, plse, o, lse_arg, o.stride(0), o.stride(1), o.stride(2),
        lse_arg.stride(0) if lse is not None else 0, lse_arg.stride(1) if lse is not None else 0,
        Sc, t0, G=G, HPG=hpg, HPG_P=max(2, triton.next_power_of_2(hpg)), HEAD_DIM=D,
        BLOCK_D=max(16, triton.next_power_of_2(D)), NP=NP, NP_P=max(2, triton.next_power_of_2(NP)),
        STORE_LSE=lse is not None, num_warps=num_warps)


@triton.jit
def row_ptrs(X, strides, b, t, h, d):
    """Pointers to rows of a ``[B, S, H, D]`` tensor with unit stride along ``D``: batch ``b``,
    token ``t`` and head ``h`` (each a scalar, or a column ``[R, 1]``: one per row), columns
    ``d [BLOCK_D]``; ``strides``: the tensor's first three strides."""
    return X + b * strides[0] + t * strides[1] + h * strides[2] + d[None, :]


@triton.jit
def query_outer_start(Q, q_strides, S, G: tl.constexpr, HPG: tl.constexpr, M: tl.constexpr,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """The start of a query-outer program ``n = (b, token, group)``, group fastest: the group's
    ``HPG`` query heads packed into the tile's ``M`` rows (padded to >= 16, the smallest
    tensor-core tile). Returns ``(n, b, t, g, heads, hmask, d, rows_ok, q)``: ``hmask [M]`` masks
    the padded heads, ``rows_ok [M, BLOCK_D]`` the padded heads and columns, ``q`` is the
    ``[M, BLOCK_D]`` query tile."""
    n = tl.program_id(0).to(tl.int64)
    b = n // (S * G)
    t = (n // G) % S
    g = n % G
    hh = tl.arange(0, M)
    d = tl.arange(0, BLOCK_D)
    heads = g * HPG + hh
    hmask = hh < HPG
    rows_ok = hmask[:, None] & (d < HEAD_DIM)[None, :]
    q = tl.load(row_ptrs(Q, q_strides, b, t, heads[:, None], d), mask=rows_ok, other=0.0)
    return n, b, t, g, heads, hmask, d, rows_ok, q


@triton.jit
def selected_block(K, V, k_strides, v_strides, Sel, n, slot, b, t, g, d,
                   HEAD_DIM: tl.constexpr, TOPK: tl.constexpr, BLOCK_N: tl.constexpr):
    """Slot ``slot`` of program ``n``'s selection (``Sel`` ``[B, S, G, TOPK]``, ``-1`` unused):
    ``(kv_ok [BLOCK_N], k, v [BLOCK_N, BLOCK_D])`` -- the block's keys and values, zero where
    ``kv_ok`` is false: an unused slot, or a key after token ``t`` (causal, in the local block)."""
    blk = tl.load(Sel + n * TOPK + slot)
    keys = tl.maximum(blk, 0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    # tl.where, not `&`: a scalar test `&` a block one is rejected by newer Tritons
    kv_ok = tl.where(blk >= 0, keys <= t, False)
    mask = kv_ok[:, None] & (d < HEAD_DIM)[None, :]
    k = tl.load(row_ptrs(K, k_strides, b, keys[:, None], g, d), mask=mask, other=0.0)
    v = tl.load(row_ptrs(V, v_strides, b, keys[:, None], g, d), mask=mask, other=0.0)
    return kv_ok, k, v


@triton.jit
def _query_outer_kernel(Q, K, V, Sel, O, LSE, q_strides, k_strides, v_strides, o_strides, S, qk_scale,
                        G: tl.constexpr, TOPK: tl.constexpr, HPG: tl.constexpr, M: tl.constexpr,
                        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                        STORE_LSE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    n, b, t, g, heads, hmask, d, rows_ok, q = query_outer_start(Q, q_strides, S, G, HPG, M, HEAD_DIM, BLOCK_D)
    m_i = tl.full([M], float("-inf"), tl.float32)
    l_i = tl.zeros([M], tl.float32)
    acc = tl.zeros([M, BLOCK_D], tl.float32)
    for slot in range(0, TOPK):
        kv_ok, k, v = selected_block(K, V, k_strides, v_strides, Sel, n, slot, b, t, g, d, HEAD_DIM, TOPK, BLOCK_N)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        s = tl.where(kv_ok[None, :], s, float("-inf"))
        p, alpha, m_i, l_i = softmax_tile_weights(m_i, l_i, s, qk_scale)   # the online softmax's step
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    out, lse = finish_rows(acc, m_i, l_i)
    tl.store(row_ptrs(O, o_strides, b, t, heads[:, None], d), out.to(O.dtype.element_ty), mask=rows_ok)
    if STORE_LSE:
        tl.store(LSE + (b * (G * HPG) + heads) * S + t, natural_lse(lse), mask=hmask)


@triton.jit
def kv_outer_start(K, V, TileGk, TileStart, TileLen, k_strides, v_strides, S,
                   G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_KN: tl.constexpr):
    """The start of a KV-outer program: program ``(i, j)`` owns work-list entry ``i`` of
    :func:`inverted_index` -- a (batch, group, KV block) and a run of entries that selected it --
    and keys ``j * BLOCK_KN .. + BLOCK_KN`` of the block (``BLOCK_KN = BLOCK_N``: all of them).
    It loads their K and V tiles ``[BLOCK_KN, BLOCK_D]`` once, for the whole run. Returns
    ``(b, g, start, n_tok, d, dmask, keys, kmask, k, v)``: the run is entries ``start ..
    start + n_tok`` of the sorted list; ``kmask`` masks keys past ``S``, ``dmask`` the padded columns."""
    i = tl.program_id(0)
    gk = tl.load(TileGk + i).to(tl.int64)  # (batch, group, kv block) of this program
    start = tl.load(TileStart + i)
    n_tok = tl.load(TileLen + i)
    nb = tl.cdiv(S, BLOCK_N)
    b = gk // (G * nb)
    g = (gk // nb) % G
    blk = gk % nb
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    keys = blk * BLOCK_N + tl.program_id(1) * BLOCK_KN + tl.arange(0, BLOCK_KN)
    kmask = keys < S
    mask = kmask[:, None] & dmask[None, :]
    k = tl.load(row_ptrs(K, k_strides, b, keys[:, None], g, d), mask=mask, other=0.0)
    v = tl.load(row_ptrs(V, v_strides, b, keys[:, None], g, d), mask=mask, other=0.0)
    return b, g, start, n_tok, d, dmask, keys, kmask, k, v


@triton.jit
def _kv_outer_kernel(Q, K, V, Ent, TileGk, TileStart, TileLen, Po, Plse, q_strides, k_strides, v_strides,
                     S, Sc, t0, qk_scale,
                     G: tl.constexpr, TOPK: tl.constexpr, HPG: tl.constexpr, HPG_P: tl.constexpr,
                     BT: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                     DOT_PRECISION: tl.constexpr):
    # the KV block: loaded once, used by every token of the run
    b, g, start, n_tok, d, dmask, keys, kmask, k, v = kv_outer_start(
        K, V, TileGk, TileStart, TileLen, k_strides, v_strides, S, G, HEAD_DIM, BLOCK_D, BLOCK_N, BLOCK_N)
    r = tl.arange(0, BT * HPG_P)  # row = (token of the run) * HPG_P + head of the group
    no_max = tl.full([BT * HPG_P], float("-inf"), tl.float32)  # the empty online-softmax state
    no_sum = tl.zeros([BT * HPG_P], tl.float32)
    tok_i = r // HPG_P
    hh = r % HPG_P
    h_ok = hh < HPG
    q_rows = row_ptrs(Q, q_strides, b, 0, (g * HPG + hh)[:, None], d)
    # Prefetch: the query rows of the next BT tokens load while this tile computes, and the
    # entries (which say where those rows are) two tiles ahead, so no load waits on another.
    # Entries fit int32 (< B * Sc * G * TOPK per chunk): no 64-bit division by the runtime Sc.
    ok = (tok_i < n_tok) & h_ok
    e = tl.load(Ent + start + tok_i, mask=ok, other=0)  # entry = (b, token, g) * TOPK + slot
    t = t0 + (e // (TOPK * G)) % Sc
    q = tl.load(q_rows + t.to(tl.int64)[:, None] * q_strides[1], mask=ok[:, None] & dmask[None, :], other=0.0)
    ok_next = (BT + tok_i < n_tok) & h_ok
    e_next = tl.load(Ent + start + BT + tok_i, mask=ok_next, other=0)
    for j in range(0, n_tok, BT):
        t_next = t0 + (e_next // (TOPK * G)) % Sc
        q_next = tl.load(q_rows + t_next.to(tl.int64)[:, None] * q_strides[1],
                         mask=ok_next[:, None] & dmask[None, :], other=0.0)
        ok_after = (j + 2 * BT + tok_i < n_tok) & h_ok
        e_after = tl.load(Ent + start + j + 2 * BT + tok_i, mask=ok_after, other=0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        visible = kmask[None, :] & (keys[None, :] <= t[:, None])  # causal: only bites in the local block
        s = tl.where(visible, s, float("-inf"))
        # one tile from an empty state: the block-normalized output and its lse
        p, _, m, l = softmax_tile_weights(no_max, no_sum, s, qk_scale)
        o, lse = finish_rows(tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION), m, l)
        row = e.to(tl.int64) * HPG + hh  # partial slot of (entry, head)
        tl.store(Po + row[:, None] * HEAD_DIM + d[None, :], o.to(Po.dtype.element_ty),
                 mask=ok[:, None] & dmask[None, :])
        tl.store(Plse + row, lse, mask=ok)
        q, e, t, ok = q_next, e_next, t_next, ok_next
        e_next, ok_next = e_after, ok_after


def inverted_index(sel: torch.Tensor, n_blocks: int, tokens_per_prog: int, l2_tokens: int = 0):
    """For a selection chunk ``sel int32 [B, Sc, G, topk]``: the entries (flat indices into
    ``sel``) sorted by ``(sub-chunk, batch, group, block)``, and a work list of programs, each a
    run of at most ``tokens_per_prog`` entries of one KV block: ``(entries, tile_gk, tile_start,
    tile_len)``, all int32, with ``gk = (b * G + g) * n_blocks + block``.

    ``l2_tokens > 0`` splits the chunk's tokens into sub-chunks of that many tokens and orders
    the work sub-chunk first. Programs run roughly in id order, so the ones in flight together
    gather query rows of one sub-chunk and one group -- ``l2_tokens * (Hq / G) * D`` values, which
    stay in L2 -- instead of rows from anywhere in the sequence, which come from HBM every time.
    The price is that each KV block is loaded once per sub-chunk rather than once per chunk
    (K/V are small next to the query rows read ``topk`` times each). ``0`` = one sub-chunk."""
    B, Sc, G, topk = sel.shape
    dev = sel.device
    n_sub = 1 if l2_tokens <= 0 else -(-Sc // l2_tokens)
    per_sub = B * G * n_blocks
    b = torch.arange(B, device=dev, dtype=torch.int32).view(B, 1, 1, 1)
    t = torch.arange(Sc, device=dev, dtype=torch.int32).view(1, Sc, 1, 1)
    g = torch.arange(G, device=dev, dtype=torch.int32).view(1, 1, G, 1)
    sub = t // l2_tokens if n_sub > 1 else torch.zeros_like(t)
    key = ((sub * B + b) * G + g) * n_blocks + sel
    # unused slots sort last, as one bin; so do ids past the last block (possible only when the
    # caller skipped the selection check): a KV-outer program never reads outside K/V
    key = torch.where((sel >= 0) & (sel < n_blocks), key, n_sub * per_sub).reshape(-1)
    # stable: within a block, tokens stay in order; int32 keys keep the radix sort short
    _, order = torch.sort(key, stable=True)
    entries = order.to(torch.int32)
    counts = torch.bincount(key, minlength=n_sub * per_sub + 1)[:-1]
    starts = torch.cumsum(counts, 0) - counts
    tiles_per = (counts + tokens_per_prog - 1) // tokens_per_prog
    n_tiles = int(tiles_per.sum())
    tile_key = torch.repeat_interleave(torch.arange(n_sub * per_sub, device=dev), tiles_per,
                                       output_size=n_tiles)
    first_tile = torch.cumsum(tiles_per, 0) - tiles_per
    within = torch.arange(n_tiles, device=dev) - first_tile[tile_key]
    tile_start = starts[tile_key] + within * tokens_per_prog
    tile_len = torch.clamp(counts[tile_key] - within * tokens_per_prog, max=tokens_per_prog)
    tile_gk = tile_key % per_sub
    return entries, tile_gk.to(torch.int32), tile_start.to(torch.int32), tile_len.to(torch.int32)


def kv_outer_fits(q: torch.Tensor, k: torch.Tensor, block_size: int, cfg: dict) -> bool:
    """Whether a KV-outer program (:func:`_kv_outer_smem`) fits this GPU's shared memory for
    ``q [B, S, Hq, D]``, ``k [B, S, G, D]``, the block size and the launch config ``cfg``."""
    hpg_p = triton.next_power_of_2(q.shape[2] // k.shape[2])
    meta = {"BLOCK_N": block_size, "BLOCK_D": max(16, triton.next_power_of_2(q.shape[3])), "K": k, "Q": q,
            "BT": max(1, cfg["BLOCK_M"] // hpg_p), "HPG_P": hpg_p, "num_stages": cfg["num_stages"]}
    return configs.shared_memory_fits(_kv_outer_smem(meta))


def row_strides(*tensors) -> list[tuple[int, int, int]]:
    """The first three strides of each ``[B, S, H, D]`` tensor, one tuple per tensor: the kernels'
    ``*_strides`` arguments (:func:`row_ptrs`; unit stride along ``D`` is assumed)."""
    return [tuple(t.stride()[:3]) for t in tensors]


def msa_attention_triton(q, k, v, q_idx, k_idx, *, block_size: int = 128, topk: int = 16, scale=None,
                         return_lse: bool = False, selected=None, schedule: str = "auto",
                         partial_budget_bytes: int = PARTIAL_BUDGET_BYTES, config: dict | None = None,
                         k_idx_scale=None):
    """Sparse prefill on the GPU (or the interpreter); contract of :func:`.msa.msa_attention`
    (FP8 index tensors come with the keys' scales ``k_idx_scale``, see :func:`.msa_select_triton`).
    ``schedule``: ``"kv"`` (KV-outer), ``"query"`` (query-outer) or ``"auto"`` (KV-outer where
    its K/V block fits the GPU's shared memory, :func:`kv_outer_fits`); another value raises
    ``ValueError``; bf16 or FP8 tensors on a GPU without them raise
    :class:`minimax_lab.runtime.UnsupportedOnDevice`."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    check_triton_inputs(q=q, k=k, v=v)
    require_dtypes("MSA's sparse prefill", q, k, v)   # the index tensors: by the selection, where it runs
    B, S, Hq, D = q.shape
    G = k.shape[2]
    hpg = Hq // G
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    cfg = configs.launch_config(LAUNCH, config=config)
    if selected is None:
        selected = msa_select_triton(q_idx, k_idx, block_size=block_size, topk=topk, k_idx_scale=k_idx_scale)
    selected = selected.contiguous()
    out_dtype = q.dtype
    q, k, v = interpreter_safe(q, k, v)  # interpreter: bf16 tl.dot is wrong
    # the kernels take unit stride along head_dim: other layouts are copied (prefill inputs, not a cache)
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    o = torch.empty(B, S, Hq, D, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, Hq, S, dtype=torch.float32, device=q.device) if return_lse else None
    BLOCK_D = max(16, triton.next_power_of_2(D))
    hpg_p = triton.next_power_of_2(hpg)
    bt = max(1, cfg["BLOCK_M"] // hpg_p)
    if schedule == "auto":
        schedule = "kv" if kv_outer_fits(q, k, block_size, cfg) else "query"
    if schedule == "query":
        _query_outer_kernel[(B * S * G,)](
            q, k, v, selected, o, lse if lse is not None else o, *row_strides(q, k, v, o),
            S, scale * LOG2E, G=G, TOPK=topk, HPG=hpg, M=max(16, hpg_p), HEAD_DIM=D, BLOCK_D=BLOCK_D,
            BLOCK_N=block_size, STORE_LSE=lse is not None, DOT_PRECISION=dot_precision(q.dtype),
            num_warps=cfg["Q_WARPS"], num_stages=cfg["Q_STAGES"])
    else:
        n_blocks = math.ceil(S / block_size)
        tpp = max(bt, cfg["TOKENS_PER_PROG"] // bt * bt)
        per_token = B * G * topk * hpg * D * q.element_size()
        chunk = max(1, min(S, partial_budget_bytes // per_token))
        po = torch.empty(B * min(chunk, S) * G * topk * hpg * D, dtype=q.dtype, device=q.device)
        plse = torch.empty(B * min(chunk, S) * G * topk * hpg, dtype=torch.float32, device=q.device)
        for c0 in range(0, S, chunk):
            c1 = min(S, c0 + chunk)
            Sc = c1 - c0
            ent, tile_gk, tile_start, tile_len = inverted_index(selected[:, c0:c1], n_blocks, tpp,
                                                                cfg["L2_TOKENS"])
            plse_c = plse[: B * Sc * G * topk * hpg].view(B * Sc * G, topk, hpg)
            po_c = po[: B * Sc * G * topk * hpg * D].view(B * Sc * G, topk, hpg, D)
            plse_c.fill_(float("-inf"))  # unused slots stay empty
            if tile_gk.numel():
                _kv_outer_kernel[(tile_gk.numel(),)](
                    q, k, v, ent, tile_gk, tile_start, tile_len, po_c, plse_c, *row_strides(q, k, v),
                    S, Sc, c0, scale * LOG2E, G=G, TOPK=topk, HPG=hpg, HPG_P=hpg_p, BT=bt,
                    HEAD_DIM=D, BLOCK_D=BLOCK_D, BLOCK_N=block_size, DOT_PRECISION=dot_precision(q.dtype),
                    num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
            combine_partials(po_c, plse_c, o, lse, Sc=Sc, t0=c0, G=G, hpg=hpg, num_warps=cfg["COMBINE_WARPS"])
    o = o.to(out_dtype)
    return (o, lse) if return_lse else o
