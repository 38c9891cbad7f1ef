"""SGLang's Triton MSA kernels as a peer, called as SGLang's MiniMax-M3 backend calls them on CUDA.

The kernels come from the folder ``tools/fetch_peers.py`` extracts (see :mod:`minimax_lab.bench.peers`);
nothing of SGLang is part of this package. The M3 settings are fixed: 0 init blocks, 1 local
block, max block score, score-only indexer (no index value), one query token per query block
(``block_size_q = 1``), page = block; on CUDA the backend then runs the functions in
``minimax_sparse_ops/minimax_sparse.py`` with ``use_msa=False`` (the MSA ``fmha_sm100`` kernel is
Blackwell-only). Decode top-k runs SGLang's Triton two-stage kernel: its default JIT CUDA
radix-select kernel needs SGLang's build stack (the stand-in ``envs`` switches it off).

Layouts. Ours (:mod:`minimax_lab.attention.msa`): prefill ``q [B, S, Hq, D]``, ``k, v [B, S, G, D]``,
``q_idx [B, S, G, Di]``, ``k_idx [B, S, Di]``; decode caches ``[P, page, G, D]`` with a
``block_table [B, max_pages]``. SGLang's: token-major slots -- ``q [tokens, Hq, D]``,
``k_cache [slots, G, D]``, ``idx_k_cache [slots, 1, Di]`` -- and ``req_to_token [B, max_len]``
mapping each sequence position to its slot. The conversions are views (no copy) for contiguous
inputs; the per-batch metadata (``req_to_token``, ``cu_seqlens``, ...) is built once by
:func:`prefill_plan` / :func:`decode_plan`, as SGLang builds it once per forward, outside the
kernels' time.

Selections: SGLang returns each row's blocks in **ascending** id order (``-1`` tail); ours puts the
local block last. :func:`selection_sets_equal` compares them as sets. Both pick the local block
plus the ``topk - 1`` highest-scoring earlier blocks by max score; on ties the order of SGLang's
bitonic sort decides, ours takes the lower id.

Entry points (each raises :class:`minimax_lab.bench.peers.PeerUnavailable` without the folder):
:func:`available`, :func:`prefill`, :func:`select`, :func:`attention`, :func:`decode`,
:func:`decode_select`, :func:`decode_attention`. Dtypes: bf16 or fp16 (SGLang's kernels reject fp32).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from minimax_lab import runtime
from minimax_lab.bench import peers
from minimax_lab.validate import check_tensor

#: SGLang's M3 sparse-attention settings the backend passes (``init_blocks``, ``local_blocks``, score).
M3 = dict(init_blocks=0, local_blocks=1, score_type="max")
DTYPES = (torch.bfloat16, torch.float16)


def available() -> tuple[bool, str]:
    """``(True, what)`` when SGLang's MSA kernels can be imported, else ``(False, why)``."""
    return peers.importable(_ops, "SGLang MSA kernels")


def _ops():
    """SGLang's entry points (imported from the peers folder on first use)."""
    # deferred: SGLang is an optional peer, importable only once tools/fetch_peers.py has put it on the path
    peers.require()
    from sglang.kernels.ops.attention.minimax_sparse.decode.flash_with_topk_idx import flash_decode_with_topk_idx
    from sglang.kernels.ops.attention.minimax_sparse.decode.topk_sparse import flash_decode_with_gqa_share_sparse
    from sglang.kernels.ops.attention.minimax_sparse.prefill.flash_with_topk_idx import \
        flash_prefill_with_topk_index
    from sglang.kernels.ops.attention.minimax_sparse.prefill.topk_sparse import flash_prefill_with_gqa_share_sparse
    from sglang.srt.layers.attention.minimax_sparse_ops.minimax_sparse import (minimax_sparse_decode,
                                                                                 minimax_sparse_prefill)
    if runtime.is_interpreter():
        _one_config_each()
    return dict(prefill=minimax_sparse_prefill, decode=minimax_sparse_decode,
                prefill_index=flash_prefill_with_topk_index, prefill_attention=flash_prefill_with_gqa_share_sparse,
                decode_index=flash_decode_with_topk_idx, decode_attention=flash_decode_with_gqa_share_sparse)


def autotuned_kernels() -> list:
    """SGLang's autotuned Triton kernels on the MSA path (``triton.runtime.Autotuner`` objects)."""
    # deferred: the optional peer's modules (see _ops)
    peers.require()
    from sglang.kernels.ops.attention.minimax_sparse.decode import flash_with_topk_idx as dec_index
    from sglang.kernels.ops.attention.minimax_sparse.decode import topk_sparse as dec_attn
    from sglang.kernels.ops.attention.minimax_sparse.prefill import flash_with_topk_idx as pre_index
    from sglang.kernels.ops.attention.minimax_sparse.prefill import topk_sparse as pre_attn

    found = []
    for mod in (pre_index, pre_attn, dec_index, dec_attn):
        for obj in vars(mod).values():
            fn = obj
            while fn is not None and not isinstance(fn, triton.runtime.Autotuner):
                fn = getattr(fn, "fn", None)       # heuristics wrap the autotuner
            if fn is not None and fn not in found:
                found.append(fn)
    return found


def reset_autotune() -> int:
    """Forget every autotuned choice, so each kernel re-tunes at its next shape; returns how many
    kernels were reset. The bench calls it before each case: the peer runs its best config there."""
    kernels = autotuned_kernels()
    for k in kernels:
        k.cache.clear()
    return len(kernels)


def _one_config_each():
    """Under Triton's CPU interpreter timing means nothing and every config costs minutes: keep
    each autotuner's smallest-tile config (the product of its block sizes, then fewest warps), and
    let the top-k kernels sort 8 scores at a time (so the interpreter supports ``topk <= 4`` only)."""
    def cost(c):
        tiles = 1
        for name, val in c.kwargs.items():
            if name.startswith("BLOCK_SIZE"):
                tiles *= val
        return tiles, c.num_warps, c.num_stages

    for k in autotuned_kernels():
        name = getattr(k.base_fn, "__name__", "")
        if name.startswith("_topk_index") and "BLOCK_SIZE_K" in k.configs[0].kwargs:
            # bitonic top-k over 8 scores at a time (SGLang's smallest is 64; enough for topk <= 4)
            k.configs = [triton.Config({"BLOCK_SIZE_K": 8}, num_warps=1, num_stages=1)]
        elif len(k.configs) > 1:
            k.configs = [min(k.configs, key=cost)]


# --------------------------------------------------------------------------- layouts


@dataclass
class PrefillPlan:
    """SGLang's per-forward prefill metadata for B sequences of S new tokens, no prefix; slots
    ``b * S + t`` (ours ``k[b, t]`` flattened)."""

    B: int
    S: int
    req_to_token: torch.Tensor   # int32 [B, S]
    slot_ids: torch.Tensor       # int64 [B]
    cu_seqlens: torch.Tensor     # int32 [B + 1]
    seq_lens: torch.Tensor       # int32 [B]
    prefix_lens: torch.Tensor    # int32 [B]
    cu_seqblocks_q: torch.Tensor
    max_seqblock_q: int
    all_seqblock_q: int


def prefill_plan(B: int, S: int, device, block_size: int = 128) -> PrefillPlan:
    """The metadata SGLang's backend builds once per prefill forward (one query per query block)."""
    peers.require()
    from sglang.kernels.ops.attention.minimax_sparse.common.utils import get_cu_seqblocks  # deferred: optional peer

    dev = torch.device(device)
    req_to_token = (torch.arange(B, device=dev)[:, None] * S + torch.arange(S, device=dev)[None, :]).to(torch.int32)
    cu = (torch.arange(B + 1, device=dev) * S).to(torch.int32)
    cu_blocks, max_blocks, all_blocks, *_ = get_cu_seqblocks(cu, S, 1, block_size, [S] * B)
    return PrefillPlan(B, S, req_to_token, torch.arange(B, device=dev), cu,
                       torch.full((B,), S, dtype=torch.int32, device=dev), torch.zeros(B, dtype=torch.int32, device=dev),
                       cu_blocks, max_blocks, all_blocks)


def _check_prefill(q, k, v, q_idx, k_idx):
    check_tensor(q, "q", ndim=4, dtypes=DTYPES)
    B, S, Hq, D = q.shape
    check_tensor(k, "k", shape=[B, S, None, D], dtypes=(q.dtype,))
    check_tensor(v, "v", shape=list(k.shape), dtypes=(q.dtype,))
    G = k.shape[2]
    check_tensor(q_idx, "q_idx", shape=[B, S, G, None], dtypes=(q.dtype,))
    check_tensor(k_idx, "k_idx", shape=[B, S, q_idx.shape[3]], dtypes=(q.dtype,))
    if Hq % G:
        raise ValueError(f"Hq ({Hq}) must be a multiple of G ({G})")


def _tokens(x):
    """``[B, S, ...]`` -> ``[B * S, ...]`` (a view when contiguous)."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _plan_for(plan, B, S, dev, block_size):
    if plan is None:
        return prefill_plan(B, S, dev, block_size)
    if (plan.B, plan.S) != (B, S):
        raise ValueError(f"plan is for B={plan.B}, S={plan.S}; inputs have B={B}, S={S}")
    return plan


def _prefill_kw(plan: PrefillPlan, block_size: int, topk: int) -> dict:
    return dict(req_to_token=plan.req_to_token, slot_ids=plan.slot_ids, cu_seqlens=plan.cu_seqlens,
                seq_lens=plan.seq_lens, prefix_lens=plan.prefix_lens, max_seqlen_q=plan.S, max_seqlen_k=plan.S,
                block_size_q=1, block_size_k=block_size, topk=topk, init_blocks=M3["init_blocks"],
                local_blocks=M3["local_blocks"], score_type=M3["score_type"], disable_index_value=True,
                cu_seqblocks_q=plan.cu_seqblocks_q, max_seqblock_q=plan.max_seqblock_q,
                all_seqblock_q=plan.all_seqblock_q)


def selection_to_ours(topk_idx: torch.Tensor, B: int, S: int) -> torch.Tensor:
    """SGLang's ``[G, B * S, topk]`` (or ``[G, B, topk]`` for decode, S = 1) -> ours ``[B, S, G, topk]``."""
    G, _, topk = topk_idx.shape
    return topk_idx.reshape(G, B, S, topk).permute(1, 2, 0, 3).contiguous()


def selection_to_sglang(selected: torch.Tensor) -> torch.Tensor:
    """Ours ``[B, S, G, topk]`` (``-1`` tail) -> SGLang's ``[G, B * S, topk]``."""
    B, S, G, topk = selected.shape
    return selected.permute(2, 0, 1, 3).reshape(G, B * S, topk).contiguous()


def selection_sets_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per row (last dim), whether two selections hold the same set of block ids (``-1`` = none).
    Same shapes required; returns a bool tensor of ``a.shape[:-1]``."""
    if a.shape != b.shape:
        raise ValueError(f"selections differ in shape: {list(a.shape)} vs {list(b.shape)}")
    big = torch.iinfo(torch.int32).max

    def canon(x):
        x = x.to(torch.int64)
        return torch.sort(torch.where(x < 0, big, x), dim=-1).values

    return (canon(a) == canon(b.to(a.device))).all(-1)


# --------------------------------------------------------------------------- prefill


def prefill(q, k, v, q_idx, k_idx, *, block_size: int = 128, topk: int = 16, plan: PrefillPlan | None = None):
    """SGLang's M3 sparse prefill end to end (index scores + top-k + sparse attention), from our
    layouts; returns ``o [B, S, Hq, D]`` in q's dtype."""
    ops = _ops()
    _check_prefill(q, k, v, q_idx, k_idx)
    B, S, Hq, D = q.shape
    plan = _plan_for(plan, B, S, q.device, block_size)
    _, o = ops["prefill"](_tokens(q), _tokens(k), _tokens(v), None, _tokens(q_idx), _tokens(k_idx)[:, None], None,
                          None, use_msa=False, page_size=block_size if S % block_size == 0 or B == 1 else 1,
                          seqlens_cpu=[S] * B, **_prefill_kw(plan, block_size, topk))
    return o.view(B, S, Hq, D)


def select(q_idx, k_idx, *, block_size: int = 128, topk: int = 16, plan: PrefillPlan | None = None,
           raw: bool = False):
    """SGLang's prefill indexer + top-k: our layout ``[B, S, G, topk]`` (ascending ids, ``-1`` tail),
    or SGLang's own ``[G, B * S, topk]`` with ``raw=True`` (what its attention kernel takes)."""
    ops = _ops()
    check_tensor(q_idx, "q_idx", ndim=4, dtypes=DTYPES)
    B, S, G, Di = q_idx.shape
    check_tensor(k_idx, "k_idx", shape=[B, S, Di], dtypes=(q_idx.dtype,))
    plan = _plan_for(plan, B, S, q_idx.device, block_size)
    kw = _prefill_kw(plan, block_size, topk)
    kw.pop("disable_index_value")
    _, topk_idx = ops["prefill_index"](_tokens(q_idx), _tokens(k_idx)[:, None], None, None,
                                       disable_index_value=True, **kw)
    return topk_idx if raw else selection_to_ours(topk_idx, B, S)


def attention(q, k, v, selected, *, block_size: int = 128, plan: PrefillPlan | None = None):
    """SGLang's sparse prefill attention alone over a given selection: ours ``[B, S, G, topk]`` or
    SGLang's raw ``[G, B * S, topk]``; returns ``o [B, S, Hq, D]``."""
    ops = _ops()
    check_tensor(q, "q", ndim=4, dtypes=DTYPES)
    B, S, Hq, D = q.shape
    plan = _plan_for(plan, B, S, q.device, block_size)
    topk_idx = selection_to_sglang(selected) if selected.ndim == 4 else selected
    o = ops["prefill_attention"](_tokens(q), _tokens(k), _tokens(v), None, plan.req_to_token, plan.slot_ids,
                                 topk_idx, 1, block_size, plan.cu_seqlens, plan.seq_lens, plan.prefix_lens, S,
                                 cu_seqblocks_q=plan.cu_seqblocks_q, max_seqblock_q=plan.max_seqblock_q)
    return o.view(B, S, Hq, D)


# --------------------------------------------------------------------------- decode


@dataclass
class DecodePlan:
    """SGLang's per-forward decode metadata for a paged cache: ``req_to_token[b, t]`` = the slot
    (``page * page_size + offset``) of position t of sequence b; unused pages map to slot 0."""

    req_to_token: torch.Tensor   # int32 [B, max_pages * page_size]
    slot_ids: torch.Tensor       # int64 [B]
    seq_lens: torch.Tensor       # int32 [B]
    max_seqlen: int
    page_size: int


def decode_plan(block_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int) -> DecodePlan:
    """The per-token slot map SGLang keeps (its ``req_to_token`` pool) for our block table."""
    check_tensor(block_table, "block_table", ndim=2, dtypes=(torch.int32,))
    B, maxp = block_table.shape
    check_tensor(seq_lens, "seq_lens", shape=[B])
    dev = block_table.device
    pos = torch.arange(maxp * page_size, device=dev)
    pages = block_table.long().clamp(min=0)[:, pos // page_size]
    req_to_token = (pages * page_size + pos % page_size).to(torch.int32)
    return DecodePlan(req_to_token, torch.arange(B, device=dev), seq_lens.to(torch.int32),
                      int(seq_lens.max()), page_size)


def _decode_args(q, k_cache, v_cache, q_idx, k_idx_cache, plan: DecodePlan):
    if q.ndim == 4:
        if q.shape[1] != 1:
            raise ValueError(f"SGLang's decode takes one query token per sequence, got T = {q.shape[1]}")
        q = q[:, 0]
    if q_idx.ndim == 4:
        q_idx = q_idx[:, 0]
    check_tensor(q, "q", ndim=3, dtypes=DTYPES)
    check_tensor(k_cache, "k_cache", ndim=4, dtypes=(q.dtype,))
    P, ps, G, D = k_cache.shape
    if ps != plan.page_size:
        raise ValueError(f"k_cache pages hold {ps} tokens, the plan {plan.page_size}")
    check_tensor(q_idx, "q_idx", shape=[q.shape[0], G, None], dtypes=(q.dtype,))
    return (q, k_cache.reshape(P * ps, G, D), v_cache.reshape(P * ps, G, D), q_idx,
            k_idx_cache.reshape(P * ps, 1, k_idx_cache.shape[-1]))


def decode(q, k_cache, v_cache, q_idx, k_idx_cache, plan: DecodePlan, *, topk: int = 16):
    """SGLang's M3 paged sparse decode end to end (index scores over every page + top-k + attention);
    ``q [B, Hq, D]`` (or ``[B, 1, Hq, D]``); returns ``o`` in q's shape."""
    ops = _ops()
    q3, kc, vc, qi, kic = _decode_args(q, k_cache, v_cache, q_idx, k_idx_cache, plan)
    _, o = ops["decode"](q3, None, kc, vc, qi, None, kic, None, plan.req_to_token, plan.slot_ids, plan.seq_lens,
                         plan.max_seqlen, 1, plan.page_size, topk, M3["init_blocks"], M3["local_blocks"],
                         score_type=M3["score_type"], disable_index_value=True, page_size=plan.page_size,
                         use_msa=False)
    return o.view(q.shape)


def decode_select(q_idx, k_idx_cache, plan: DecodePlan, *, topk: int = 16, raw: bool = False):
    """SGLang's decode indexer + top-k: ours ``[B, 1, G, topk]`` (ascending, ``-1`` tail) or its own
    ``[G, B, topk]`` with ``raw=True``."""
    ops = _ops()
    qi = q_idx[:, 0] if q_idx.ndim == 4 else q_idx
    check_tensor(qi, "q_idx", ndim=3, dtypes=DTYPES)
    kic = k_idx_cache.reshape(-1, 1, k_idx_cache.shape[-1])
    _, topk_idx, _ = ops["decode_index"](qi, None, kic, None, plan.req_to_token, plan.seq_lens, plan.max_seqlen,
                                         plan.slot_ids, plan.page_size, topk, M3["init_blocks"], M3["local_blocks"],
                                         score_type=M3["score_type"], disable_index_value=True,
                                         page_size=plan.page_size)
    return topk_idx if raw else selection_to_ours(topk_idx, qi.shape[0], 1)


def decode_attention(q, k_cache, v_cache, selected, plan: DecodePlan):
    """SGLang's paged sparse decode attention alone over a selection: ours ``[B, 1, G, topk]`` or
    its raw ``[G, B, topk]``; returns ``o`` in q's shape."""
    ops = _ops()
    q3 = q[:, 0] if q.ndim == 4 else q
    P, ps, G, D = k_cache.shape
    topk_idx = selection_to_sglang(selected) if selected.ndim == 4 else selected
    o = ops["decode_attention"](q3, None, k_cache.reshape(P * ps, G, D), v_cache.reshape(P * ps, G, D),
                                plan.req_to_token, plan.seq_lens, plan.slot_ids, plan.page_size, topk_idx,
                                page_size=plan.page_size)
    return o.view(q.shape)
