"""MSA paged sparse decode in Triton: index scores over pages, top-k, then attention that reads
only the selected pages straight out of the paged KV cache.

Layout (as in :func:`minimax_lab.attention.msa.msa_decode_paged`): ``k_cache, v_cache
[num_pages, page_size, G, D]``, ``block_table int32 [B, max_pages]`` (-1 unused), ``seq_lens
int32 [B]``, ``k_idx_cache [num_pages, page_size, D_idx]``; block = page. The queries are the
last ``T`` tokens of each sequence (already in the cache).

Three steps:

1. :func:`_paged_index_kernel` -- one program per (sequence, run of pages). The ``T x G`` index
   queries of a sequence are packed into M (padded to 16); each page of index keys is loaded
   once through the block table and max-pooled over its causally visible tokens. This pass reads
   *every* page's index keys (``D_idx`` values per token) -- at long context it is the larger part
   of the decode's memory traffic, so it streams several pages per program, loading each page's
   table entry one page ahead. FP8 index keys (:mod:`.msa_index_fp8`) with bf16/fp16 queries take
   the dot in fp16 (e4m3 -> fp16 is one conversion; -> bf16 is not), with scores equal to the
   bf16 dot's: each query row is first brought into fp16's range by a power of two.
2. :func:`_decode_select_kernel` on the ``[B, T, G, max_pages]`` scores (small): the contract's
   exact rule (:func:`minimax_lab.attention.msa_torch.select_from_scores`), one program per row,
   in registers -- one launch instead of the torch rule's dozen.
3. :func:`_decode_attn_kernel` -- one program per (sequence, query token, group, split): the
   ``Hq / G`` query heads of the group packed into M (GQA: one K/V page load serves them all), a
   split-K share of the selected slots, online softmax, a partial result per split, merged by the
   LSE combine kernel of :mod:`.msa_triton_prefill`. Splitting the slots gives enough programs to
   fill the GPU at small batch (about :data:`PROGRAMS_PER_SM` per SM of the device).

:func:`decode_attention_pages` runs step 3 for any list of pages per (token, group); with every
page of the sequence selected it is a dense paged decode (the bench's peer).

The caches are read in place through all their strides (a head_dim stride of 1 is specialised
by Triton, so the usual layout pays nothing). FP8 (e4m3) caches take the paged decode's FP8 tile
step (:func:`minimax_lab.triton_blocks.fp8_attend_tile`): with 16-bit queries the dots run in fp16
(each query row moved into fp16's range by a power of two), key scales on the scores' columns
(per-page scales: folded into the softmax scale), value scales on P's columns (per-page: on the
page's ``P @ V``), one conversion per page for all the group's heads. FP8 caches and index
keys need a GPU with FP8 (:func:`minimax_lab.runtime.supports`). Bounds guard: page ids from the
block table are clamped into ``[0, num_pages)`` and selected block ids into ``[0, max_pages)`` as
they are loaded, so unchecked inputs (``check_values=False``) never send a load outside the tensors.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minimax_lab import configs, runtime
from minimax_lab.attention.msa_triton_prefill import combine_partials, row_ptrs
from minimax_lab.paged_kv.layout import kv_scale_operands, paged_triton_operands
from minimax_lab.triton_blocks import (ID_BITS, KEY_MIN_C, LOG2E, dot_precision, finish_rows, fp8_attend_tile,
                                       fp8_query, fp16_rows, needs_fp32_dot, require_dtypes, softmax_tile_weights,
                                       topk_block, topk_key, upcast_if)
from minimax_lab.validate import check_triton_inputs


def _index_smem(a) -> int:
    """The index-query tile and the index-key tiles of one :func:`_paged_index_kernel` program."""
    q = configs.tile_bytes((a["M"], a["BLOCK_D"]), itemsize=a["Qi"].element_size())
    k = configs.tile_bytes((a["BLOCK_D"], a["PS"]), itemsize=a["Kic"].element_size())
    return q + configs.pipelined(a["num_stages"], k)


#: The index pass's launch: pages per program, warps, pipeline stages.
INDEX_LAUNCH = configs.Launch(
    op="msa_index",
    keys=("PAGES", "num_warps", "num_stages"),
    interpreter={"PAGES": 2, "num_warps": 4, "num_stages": 1},
    candidates=[{"PAGES": p, "num_warps": w, "num_stages": s}
                for p, w, s in [(8, 4, 3), (16, 4, 3), (8, 8, 3), (16, 8, 4), (4, 4, 4), (8, 4, 5), (32, 8, 3)]],
    quick={"PAGES": 4},
    smem={"_paged_index_kernel": _index_smem},
)


@triton.jit
def _paged_index_kernel(Qi, Kic, Ksc, Table, Lens, Out, q_strides, k_strides, scale_strides, out_strides,
                        T, maxp, n_pages, sm_scale,
                        G: tl.constexpr, M: tl.constexpr, DIDX: tl.constexpr, BLOCK_D: tl.constexpr,
                        PS: tl.constexpr, PAGES: tl.constexpr, CAST_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
                        FP8_KEYS: tl.constexpr, FP16_DOT: tl.constexpr):
    # q_strides, out_strides: (batch, token, group); k_strides: (page, slot, column); scale_strides:
    # (page, slot). The block table is dense: row b starts at b * maxp.
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    r = tl.arange(0, M)  # row = query token * G + group
    t = r // G
    g = r % G
    rok = r < T * G
    d = tl.arange(0, BLOCK_D)
    cols = tl.arange(0, PS)
    L = tl.load(Lens + b)
    pos = L - T + t
    q = tl.load(Qi + b * q_strides[0] + t[:, None] * q_strides[1] + g[:, None] * q_strides[2] + d[None, :],
                mask=rok[:, None] & (d[None, :] < DIDX), other=0.0)
    q = upcast_if(q, CAST_F32)
    if FP16_DOT:
        # FP8 keys with 16-bit queries: the dot runs in fp16, not bf16. e4m3 -> fp16 is one
        # conversion instruction, e4m3 -> bf16 goes through fp32, and that conversion makes this
        # pass compute-bound. Every product is exact in fp32 either way and the row scale is a
        # power of two, so the scores are the bf16 dot's.
        q, q_row_scale = fp16_rows(q)
    # Each page's table entry (and FP8 scales) is loaded one page ahead, carried through the
    # loop: loaded in the same iteration, the scale load's latency would sit between two key tiles.
    phys_next = tl.load(Table + b * maxp + c * PAGES, mask=c * PAGES < maxp, other=-1).to(tl.int64)
    if FP8_KEYS:
        scale_next = tl.load(Ksc + tl.minimum(phys_next, n_pages - 1) * scale_strides[0] + cols * scale_strides[1],
                             mask=tl.where(phys_next >= 0, cols >= 0, False), other=0.0)
    for i in range(0, PAGES):
        p = c * PAGES + i
        phys = phys_next
        phys_next = tl.load(Table + b * maxp + p + 1, mask=(p + 1 < maxp) & (i + 1 < PAGES),
                            other=-1).to(tl.int64)
        if FP8_KEYS:
            scale = scale_next
            scale_next = tl.load(Ksc + tl.minimum(phys_next, n_pages - 1) * scale_strides[0] + cols * scale_strides[1],
                                 mask=tl.where(phys_next >= 0, cols >= 0, False), other=0.0)
        ok = (p < maxp) & (p * PS < L) & (phys >= 0)  # a scalar: this page is read at all
        phys = tl.minimum(phys, n_pages - 1)  # bounds guard (unchecked tables)
        # tl.where, not `&`: a scalar test `&` a block one is rejected by newer Tritons
        kt = tl.load(Kic + phys * k_strides[0] + cols[None, :] * k_strides[1] + d[:, None] * k_strides[2],
                     mask=tl.where(ok, d[:, None] < DIDX, False), other=0.0)  # [BLOCK_D, PS]
        kt = upcast_if(kt, CAST_F32)
        if FP8_KEYS:
            kt = kt.to(q.dtype)  # e4m3 is exact in fp16, bf16 and fp32: half the bytes read, same dot
        s = tl.dot(q, kt, input_precision=DOT_PRECISION)  # fp32 inputs: full fp32, not TF32
        if FP16_DOT:
            s = s * q_row_scale[:, None]
        if FP8_KEYS:  # each token's power-of-two scale, after the dot: exact, so ranks are unchanged
            s = s * scale[None, :]
        visible = tl.where(ok, p * PS + cols[None, :] <= pos[:, None], False)
        best = tl.max(tl.where(visible, s, float("-inf")), 1) * sm_scale
        tl.store(Out + b * out_strides[0] + t * out_strides[1] + g * out_strides[2] + p, best,
                 mask=tl.where(p < maxp, rok, False))


def paged_index_scores_triton(q_idx, k_idx_cache, block_table, seq_lens, k_idx_scale=None, *,
                              config: dict | None = None) -> torch.Tensor:
    """Block (= page) scores ``[B, T, G, max_pages]`` fp32, ``-inf`` where nothing is visible;
    contract of :func:`.msa_torch.paged_block_scores_torch`. FP8 index keys come with their
    per-token scales ``k_idx_scale [num_pages, page_size]`` (see :mod:`.msa_index_fp8`).
    ``config``: keys of the launch config to override (unknown keys raise ValueError). FP8 keys
    (and bf16 tensors) raise :class:`minimax_lab.runtime.UnsupportedOnDevice` on a GPU without them."""
    require_dtypes("MSA's decode index pass", q_idx, k_idx_cache)
    fp8 = k_idx_scale is not None
    check_triton_inputs(allow_grad=True, q_idx=q_idx, k_idx_cache=None if fp8 else k_idx_cache)
    B, T, G, Didx = q_idx.shape
    maxp = block_table.shape[1]
    ps = k_idx_cache.shape[1]
    out = torch.empty(B, T, G, maxp, dtype=torch.float32, device=q_idx.device)
    # small operands unit-stride; the paged index keys are read in place (their stride goes in)
    q_idx, block_table, seq_lens = (t if t.is_contiguous() else t.contiguous()
                                    for t in (q_idx, block_table, seq_lens))
    cast = needs_fp32_dot(q_idx.dtype)
    cfg = configs.launch_config(INDEX_LAUNCH, config=config)
    pages = cfg["PAGES"]
    grid = (B, triton.cdiv(maxp, pages))
    scales = k_idx_scale if fp8 else k_idx_cache  # (unused pointer without FP8 keys)
    _paged_index_kernel[grid](
        q_idx, k_idx_cache, scales, block_table, seq_lens, out, q_idx.stride()[:3], k_idx_cache.stride(),
        k_idx_scale.stride() if fp8 else (0, 0), out.stride()[:3], T, maxp, k_idx_cache.shape[0], 1.0 / math.sqrt(Didx),
        G=G, M=max(16, triton.next_power_of_2(T * G)), DIDX=Didx, BLOCK_D=max(16, triton.next_power_of_2(Didx)),
        PS=ps, PAGES=pages, CAST_F32=cast, FP8_KEYS=fp8,
        FP16_DOT=fp8 and q_idx.dtype in (torch.bfloat16, torch.float16),
        DOT_PRECISION=dot_precision(q_idx.dtype), num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"])
    return out


def _decode_attn_smem(a) -> int:
    """The query tile and the K/V page tiles of one :func:`_decode_attn_kernel` program."""
    return configs.attention_smem(a["M"], a["PS"], a["BLOCK_D"], q_itemsize=a["Q"].element_size(),
                                  kv_itemsize=a["Kc"].element_size(), num_stages=a["num_stages"])


#: The sparse decode attention's launch: warps and pipeline stages.
DECODE_LAUNCH = configs.Launch(
    op="msa_decode",
    keys=("num_warps", "num_stages"),
    interpreter={"num_warps": 4, "num_stages": 1},
    smem={"_decode_attn_kernel": _decode_attn_smem},
)
#: split the selected slots until about this many programs per SM run (each split keeps >= 2 slots)
PROGRAMS_PER_SM = 4


@triton.jit
def _selected_page(Sel, Table, n, slot, b, pos, maxp, n_pages, NSEL: tl.constexpr, PS: tl.constexpr):
    """Slot ``slot`` of row ``n``'s selection (``Sel [N, NSEL]``, ``-1`` unused) through the dense
    block table ``[B, maxp]``: ``(phys, ok)`` -- the physical page (clamped into the cache, so
    unchecked inputs never load outside it) and which of its ``PS`` tokens the query at ``pos``
    sees (none for an unused slot; causal in the local page)."""
    blk = tl.load(Sel + n * NSEL + slot, mask=slot < NSEL, other=-1)
    blk_safe = tl.minimum(tl.maximum(blk, 0), maxp - 1)
    phys = tl.load(Table + b * maxp + blk_safe, mask=blk >= 0, other=0).to(tl.int64)
    phys = tl.minimum(tl.maximum(phys, 0), n_pages - 1)
    ok = tl.where(blk >= 0, blk_safe * PS + tl.arange(0, PS) <= pos, False)  # [PS]
    return phys, ok


@triton.jit
def _decode_attn_kernel(Q, Kc, Vc, Table, Lens, Sel, Po, Plse, Ks, Vs,
                        q_strides, k_strides, v_strides, ks_strides, vs_strides,
                        T, qk_scale, maxp, n_pages,
                        G: tl.constexpr, HPG: tl.constexpr, M: tl.constexpr, HEAD_DIM: tl.constexpr,
                        BLOCK_D: tl.constexpr, PS: tl.constexpr, NSEL: tl.constexpr, SLOTS: tl.constexpr,
                        SCALES: tl.constexpr, DOT_PRECISION: tl.constexpr, FP16_DOT: tl.constexpr = False):
    # q_strides: (batch, token, head); k/v_strides: (page, slot, head, column) of the caches, read in
    # place; ks/vs_strides: (page, slot, head) of the FP8 scales. SCALES: "none" (16/32-bit caches),
    # or e4m3 caches with scales Ks/Vs per "token" or per "page"; FP16_DOT: 16-bit queries, FP8 dots
    # in fp16 (see minimax_lab.triton_blocks.fp8_attend_tile)
    n = tl.program_id(0).to(tl.int64)  # (b, query token, group)
    sp = tl.program_id(1)  # split of the selected slots
    b = n // (T * G)
    t = (n // G) % T
    g = n % G
    pos = tl.load(Lens + b) - T + t
    hh = tl.arange(0, M)  # the group's query heads, packed into M
    hmask = hh < HPG
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    cols = tl.arange(0, PS)
    heads = g * HPG + hh
    q = tl.load(row_ptrs(Q, q_strides, b, t, heads[:, None], d), mask=hmask[:, None] & dmask[None, :], other=0.0)
    if SCALES != "none":
        q, row_f = fp8_query(q, qk_scale, FP16_DOT)  # q16 * 2**shift == q; the shift joins row_f
    m_i = tl.full([M], float("-inf"), tl.float32)
    l_i = tl.zeros([M], tl.float32)
    acc = tl.zeros([M, BLOCK_D], tl.float32)
    for i in range(0, SLOTS):
        phys, ok = _selected_page(Sel, Table, n, sp * SLOTS + i, b, pos, maxp, n_pages, NSEL, PS)
        kv_ok = ok[:, None] & dmask[None, :]
        k = tl.load(Kc + phys * k_strides[0] + cols[:, None] * k_strides[1] + g * k_strides[2]
                    + d[None, :] * k_strides[3], mask=kv_ok, other=0.0)
        v = tl.load(Vc + phys * v_strides[0] + cols[:, None] * v_strides[1] + g * v_strides[2]
                    + d[None, :] * v_strides[3], mask=kv_ok, other=0.0)
        if SCALES == "page":  # a page is a tile: one scalar scale each
            ksc = tl.load(Ks + phys * ks_strides[0] + g * ks_strides[2])
            vsc = tl.load(Vs + phys * vs_strides[0] + g * vs_strides[2])
        elif SCALES == "token":  # a column of scales each
            ksc = tl.load(Ks + phys * ks_strides[0] + cols * ks_strides[1] + g * ks_strides[2], mask=ok, other=0.0)
            vsc = tl.load(Vs + phys * vs_strides[0] + cols * vs_strides[1] + g * vs_strides[2], mask=ok, other=0.0)
        if SCALES != "none":
            acc, m_i, l_i = fp8_attend_tile(acc, m_i, l_i, q, k, v, ksc, vsc, row_f, ok[None, :], True,
                                            SCALES == "page", DOT_PRECISION)
        else:
            # fp32 queries: full fp32 products. TF32 rounds q to 10 bits, which moves large scores
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
            s = tl.where(ok[None, :], s, float("-inf"))
            p, alpha, m_i, l_i = softmax_tile_weights(m_i, l_i, s, qk_scale)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    out, lse = finish_rows(acc, m_i, l_i)
    row = (n * tl.num_programs(1) + sp) * HPG + hh  # partial slot of (row, split, head)
    tl.store(Po + row[:, None] * HEAD_DIM + d[None, :], out, mask=hmask[:, None] & dmask[None, :])
    tl.store(Plse + row, lse, mask=hmask)


def decode_attention_pages(q, k_cache, v_cache, block_table, seq_lens, pages, *, scale=None,
                           n_split: int | None = None, k_scale=None, v_scale=None) -> torch.Tensor:
    """Attention of decode queries ``q [B, T, Hq, D]`` over the logical pages
    ``pages int32 [B, T, G, n_sel]`` (``-1`` = none) of the paged cache; ``[B, T, Hq, D]``.
    FP8 caches come with their (checked) scales ``k_scale``/``v_scale``, either layout; they raise
    :class:`minimax_lab.runtime.UnsupportedOnDevice` on a GPU without FP8 (bf16 ones likewise)."""
    require_dtypes("MSA's sparse decode", q, k_cache, v_cache)
    B, T, Hq, D = q.shape
    ps, G = k_cache.shape[1], k_cache.shape[2]
    hpg = Hq // G
    n_sel = pages.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out_dtype = q.dtype
    fp16_dot = q.dtype in (torch.bfloat16, torch.float16)  # decided before the interpreter's fp32 upcast
    q, k_cache, v_cache, block_table, seq_lens = paged_triton_operands(q, k_cache, v_cache, block_table, seq_lens)
    ks, vs, ks_strides, vs_strides, fp8 = kv_scale_operands(k_cache, k_scale, v_scale)
    cfg = configs.launch_config(DECODE_LAUNCH)
    if n_split is None:  # PROGRAMS_PER_SM per SM at least, but keep >= 2 slots per split
        sms = runtime.capabilities().sm_count
        want = max(1, (PROGRAMS_PER_SM * sms) // max(1, B * T * G)) if not runtime.is_interpreter() else 2
        n_split = max(1, min(want, n_sel // 2 if n_sel >= 4 else 1))
    slots = triton.cdiv(n_sel, n_split)
    n_split = triton.cdiv(n_sel, slots)
    N = B * T * G
    po = torch.empty(N, n_split, hpg, D, dtype=torch.float32, device=q.device)
    plse = torch.empty(N, n_split, hpg, dtype=torch.float32, device=q.device)
    pages = pages.contiguous()
    _decode_attn_kernel[(N, n_split)](
        q, k_cache, v_cache, block_table, seq_lens, pages, po, plse, ks, vs, q.stride()[:3], k_cache.stride(),
        v_cache.stride(), ks_strides, vs_strides, T, scale * LOG2E, block_table.shape[1], k_cache.shape[0],
        G=G, HPG=hpg, M=max(16, triton.next_power_of_2(hpg)), HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        PS=ps, NSEL=n_sel, SLOTS=slots, SCALES=("page" if k_scale.ndim == 2 else "token") if fp8 else "none",
        DOT_PRECISION="ieee" if fp8 and not fp16_dot else dot_precision(q.dtype), FP16_DOT=fp8 and fp16_dot,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    o = torch.empty(B, T, Hq, D, dtype=q.dtype, device=q.device)
    combine_partials(po, plse, o, None, Sc=T, t0=0, G=G, hpg=hpg)
    return o.to(out_dtype)


@triton.jit
def _decode_select_kernel(Scores, Lens, Out, stride_scores_row, T, nb, ps,
                          G: tl.constexpr, TOPK: tl.constexpr, NB_P: tl.constexpr):
    """One row (sequence, query token, group): the selection rule of
    :func:`.msa_torch.select_from_scores` on the row's page scores, in registers."""
    r = tl.program_id(0).to(tl.int64)
    b = r // (T * G)
    t = (r // G) % T
    pos = tl.load(Lens + b).to(tl.int64) - T + t
    local = tl.where(pos < 0, -1, pos // ps)  # any negative local selects nothing; avoids C's rounding
    ids = tl.arange(0, NB_P)
    s = tl.load(Scores + r * stride_scores_row + ids, mask=ids < nb, other=float("-inf"))
    key = topk_key(s, ids)  # the rule's int64 key: the higher score, then the lower id
    key = tl.where((ids < local) & (ids < nb), key, KEY_MIN_C)
    k1 = tl.minimum(TOPK - 1, nb)  # ranked slots; the local block follows them
    dense = local + 1 <= TOPK  # short rows select every visible block, in order
    # TOPK - 1 passes of a row max: every key is distinct, so the max names one block exactly
    for j in tl.static_range(TOPK):
        pick = topk_block(tl.max(key, 0))
        key = tl.where(ids == pick, KEY_MIN_C, key)
        sparse_id = tl.where(j < k1, pick, tl.where(j == k1, local, -1))
        dense_id = tl.where(j < local + 1, j, -1)
        tl.store(Out + r * TOPK + j, tl.where(dense, dense_id, sparse_id).to(tl.int32))


def select_from_scores_triton(scores: torch.Tensor, seq_lens: torch.Tensor, block_size: int, topk: int) -> torch.Tensor:
    """:func:`.msa_torch.select_from_scores` for decode rows in one launch: ``scores [B, T, G, nb]``
    fp32 of the last ``T`` tokens of each sequence (positions ``seq_lens[b] - T + t``); returns
    int32 ``[B, T, G, topk]``, equal to the torch rule (ties, ``-inf`` and ``-0.0`` included)."""
    B, T, G, nb = scores.shape
    if nb >= 1 << ID_BITS:
        raise ValueError(f"at most {(1 << ID_BITS) - 1} pages per sequence, got {nb}")
    scores = scores if scores.is_contiguous() else scores.contiguous()
    seq_lens = seq_lens if seq_lens.is_contiguous() else seq_lens.contiguous()
    out = torch.empty(B, T, G, topk, dtype=torch.int32, device=scores.device)
    if out.numel() == 0:
        return out
    nb_p = max(16, triton.next_power_of_2(nb))
    _decode_select_kernel[(B * T * G,)](scores, seq_lens, out, nb, T, nb, block_size,
                                        G=G, TOPK=topk, NB_P=nb_p, num_warps=8 if nb_p >= 4096 else 4)
    return out


def msa_decode_select_triton(q_idx, k_idx_cache, block_table, seq_lens, *, topk: int, k_idx_scale=None) -> torch.Tensor:
    """Selected logical pages ``int32 [B, T, G, topk]`` for decode queries: the index kernel, then
    the selection rule in one more launch (the rule's dozen small torch ops cost more than the
    index pass's memory traffic at short decode steps)."""
    scores = paged_index_scores_triton(q_idx, k_idx_cache, block_table, seq_lens, k_idx_scale)
    return select_from_scores_triton(scores, seq_lens, k_idx_cache.shape[1], topk)


def msa_decode_paged_triton(q, k_cache, v_cache, block_table, seq_lens, q_idx, k_idx_cache, *,
                            topk: int = 16, scale=None, k_idx_scale=None, k_scale=None, v_scale=None):
    """Paged sparse decode: ``(o [B, T, Hq, D], selected int32 [B, T, G, topk])``; FP8 K/V caches
    with their scales ``k_scale``/``v_scale`` (either layout of :mod:`minimax_lab.paged_kv.layout`)."""
    sel = msa_decode_select_triton(q_idx, k_idx_cache, block_table, seq_lens, topk=topk, k_idx_scale=k_idx_scale)
    o = decode_attention_pages(q, k_cache, v_cache, block_table, seq_lens, sel, scale=scale, k_scale=k_scale,
                               v_scale=v_scale)
    return o, sel
