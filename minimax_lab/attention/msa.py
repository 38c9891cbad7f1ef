"""MiniMax Sparse Attention (MSA): the public entry points, input checks, and the impl switch.

The contract (``DESIGN.md``, from the MSA paper, arXiv 2606.13392; rules spelled out in
:mod:`.msa_reference`):

``msa_select(q_idx, k_idx, *, block_size=128, topk=16, impl="torch") -> int32 [B, S, G, topk]``
    ``q_idx [B, S, G, D_idx]`` (one index query per GQA group), ``k_idx [B, S, D_idx]`` (one
    shared index key). Block score = max over the block's causally visible tokens of
    ``q_idx . k_idx / sqrt(D_idx)``. With ``n = t // Bk + 1 <= topk`` visible blocks all are
    selected (ascending ids); otherwise the ``topk - 1`` best earlier blocks (descending score,
    ties to the lower id) then the local block last. Unused slots are ``-1``.

``msa_attention(q, k, v, q_idx, k_idx, *, block_size=128, topk=16, impl="torch", return_lse=False)``
    ``q [B, S, Hq, D]``, ``k, v [B, S, G, D]`` with ``Hq`` a multiple of ``G``; exact softmax of
    each query head over its group's selected tokens, causal in the local block. Returns
    ``o [B, S, Hq, D]`` in q's dtype (and ``lse [B, Hq, S]`` fp32). Extra keywords: ``scale``
    (default ``1/sqrt(D)``), ``selected`` (reuse a selection) and, for ``impl="triton"``,
    ``schedule="query" | "kv"`` (query-outer or KV-outer kernel; default ``"kv"``).

``msa_decode_paged(q, k_cache, v_cache, block_table, seq_lens, q_idx, k_idx_cache, *, topk=16, impl="torch")``
    Decode for the last ``T`` tokens of each sequence, already written to the paged cache:
    ``q [B, Hq, D]`` or ``[B, T, Hq, D]``; ``k_cache, v_cache [num_pages, page_size, G, D]``;
    ``block_table int32 [B, max_pages]`` (-1 unused); ``seq_lens int32 [B]`` (tokens cached,
    queries included); ``q_idx [B, G, D_idx]`` or ``[B, T, G, D_idx]``; ``k_idx_cache
    [num_pages, page_size, D_idx]``. Block = page, so ``block_size = page_size``. Returns o in q's
    shape and dtype; ``return_selected=True`` also returns the selection ``int32 [B, T, G, topk]``.

``impl``: ``"reference"`` (dense masks, fp32), ``"torch"`` (gather, chunked), ``"triton"``.
Bad input raises ``TypeError``/``ValueError`` naming what was expected.
"""
from __future__ import annotations

import torch

from minimax_lab.validate import (FLOAT_DTYPES, INT_DTYPES, check_choice, check_positive_int,
                                  check_power_of_two, check_same_device, check_tensor)

IMPLS = ("reference", "torch", "triton")
MIN_BLOCK, MAX_BLOCK = 16, 128


def _check_index(q_idx, k_idx, *, block_size, topk, impl):
    check_choice(impl, "impl", IMPLS)
    check_power_of_two(block_size, "block_size", minimum=MIN_BLOCK, maximum=MAX_BLOCK)
    check_positive_int(topk, "topk")
    check_tensor(q_idx, "q_idx", ndim=4, dtypes=FLOAT_DTYPES)
    B, S, G, Didx = q_idx.shape
    check_tensor(k_idx, "k_idx", shape=[B, S, Didx], dtypes=FLOAT_DTYPES)
    check_same_device(q_idx=q_idx, k_idx=k_idx)
    if S < 1:
        raise ValueError(f"need at least one token, got S = {S}")


def msa_select(q_idx, k_idx, *, block_size: int = 128, topk: int = 16, impl: str = "torch") -> torch.Tensor:
    """Top-k block selection of MSA's index branch; see the module docstring."""
    _check_index(q_idx, k_idx, block_size=block_size, topk=topk, impl=impl)
    if impl == "reference":
        from minimax_lab.attention.msa_reference import msa_select_reference
        return msa_select_reference(q_idx, k_idx, block_size=block_size, topk=topk)
    if impl == "torch":
        from minimax_lab.attention.msa_torch import msa_select_torch
        return msa_select_torch(q_idx, k_idx, block_size=block_size, topk=topk)
    from minimax_lab.attention.msa_triton_select import msa_select_triton
    return msa_select_triton(q_idx, k_idx, block_size=block_size, topk=topk)


def _check_attention(q, k, v, q_idx, k_idx, *, block_size, topk, impl):
    _check_index(q_idx, k_idx, block_size=block_size, topk=topk, impl=impl)
    check_tensor(q, "q", ndim=4, dtypes=FLOAT_DTYPES)
    B, S, Hq, D = q.shape
    G = q_idx.shape[2]
    check_tensor(k, "k", shape=[B, S, None, D], dtypes=(q.dtype,))
    check_tensor(v, "v", shape=list(k.shape), dtypes=(q.dtype,))
    if k.shape[2] != G:
        raise ValueError(f"k/v have {k.shape[2]} kv heads but q_idx has {G} groups; they must match")
    if Hq % G:
        raise ValueError(f"Hq ({Hq}) must be a multiple of Hkv ({G})")
    if q_idx.shape[:2] != (B, S):
        raise ValueError(f"q_idx must have shape [{B}, {S}, G, D_idx], got {list(q_idx.shape)}")
    check_same_device(q=q, k=k, v=v, q_idx=q_idx)


def msa_attention(q, k, v, q_idx, k_idx, *, block_size: int = 128, topk: int = 16, impl: str = "torch",
                  return_lse: bool = False, scale: float | None = None, selected: torch.Tensor | None = None,
                  schedule: str = "kv"):
    """Sparse prefill attention over the selected blocks; see the module docstring."""
    _check_attention(q, k, v, q_idx, k_idx, block_size=block_size, topk=topk, impl=impl)
    if selected is not None:
        B, S, _, _ = q.shape
        check_tensor(selected, "selected", shape=[B, S, k.shape[2], topk], dtypes=(torch.int32,))
    kw = dict(block_size=block_size, topk=topk, scale=scale, return_lse=return_lse, selected=selected)
    if impl == "reference":
        from minimax_lab.attention.msa_reference import msa_attention_reference
        return msa_attention_reference(q, k, v, q_idx, k_idx, **kw)
    if impl == "torch":
        from minimax_lab.attention.msa_torch import msa_attention_torch
        return msa_attention_torch(q, k, v, q_idx, k_idx, **kw)
    check_choice(schedule, "schedule", ("query", "kv"))
    from minimax_lab.attention.msa_triton_prefill import msa_attention_triton
    return msa_attention_triton(q, k, v, q_idx, k_idx, schedule=schedule, **kw)


def msa_decode_paged(q, k_cache, v_cache, block_table, seq_lens, q_idx, k_idx_cache, *, topk: int = 16,
                     impl: str = "torch", scale: float | None = None, return_selected: bool = False):
    """Paged sparse decode (block = page); see the module docstring."""
    check_choice(impl, "impl", IMPLS)
    check_positive_int(topk, "topk")
    check_tensor(q, "q", dtypes=FLOAT_DTYPES)
    if q.ndim not in (3, 4):
        raise ValueError(f"q must be [B, Hq, D] or [B, T, Hq, D], got shape {list(q.shape)}")
    squeeze = q.ndim == 3
    q4 = q[:, None] if squeeze else q
    B, T, Hq, D = q4.shape
    check_tensor(k_cache, "k_cache", ndim=4, dtypes=(q.dtype,))
    P, ps, G, Dk = k_cache.shape
    if Dk != D:
        raise ValueError(f"k_cache head dim {Dk} != q head dim {D}")
    check_power_of_two(ps, "page_size (= block_size)", minimum=MIN_BLOCK, maximum=MAX_BLOCK)
    check_tensor(v_cache, "v_cache", shape=list(k_cache.shape), dtypes=(q.dtype,))
    if Hq % G:
        raise ValueError(f"Hq ({Hq}) must be a multiple of Hkv ({G})")
    check_tensor(block_table, "block_table", ndim=2, dtypes=(torch.int32,))
    if block_table.shape[0] != B:
        raise ValueError(f"block_table must have {B} rows (batch), got {block_table.shape[0]}")
    check_tensor(seq_lens, "seq_lens", shape=[B], dtypes=INT_DTYPES)
    check_tensor(q_idx, "q_idx", dtypes=FLOAT_DTYPES)
    qi4 = q_idx[:, None] if q_idx.ndim == 3 else q_idx
    if qi4.ndim != 4 or qi4.shape[:3] != (B, T, G):
        raise ValueError(f"q_idx must be [B={B}, G={G}, D_idx] (or [B, T={T}, G, D_idx]), got {list(q_idx.shape)}")
    Didx = qi4.shape[3]
    check_tensor(k_idx_cache, "k_idx_cache", shape=[P, ps, Didx], dtypes=FLOAT_DTYPES)
    check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens,
                      q_idx=q_idx, k_idx_cache=k_idx_cache)
    lens = seq_lens.long()
    if bool((lens < T).any()) or bool((lens > block_table.shape[1] * ps).any()):
        raise ValueError(f"seq_lens must lie in [{T}, max_pages * page_size = {block_table.shape[1] * ps}]")

    if impl == "reference":
        from minimax_lab.attention.msa_reference import msa_decode_paged_reference
        o, sel = msa_decode_paged_reference(q4, k_cache, v_cache, block_table, seq_lens, qi4, k_idx_cache,
                                            topk=topk, scale=scale, return_selected=True)
    elif impl == "torch":
        from minimax_lab.attention.msa_torch import msa_decode_paged_torch, msa_decode_select_torch
        sel = msa_decode_select_torch(qi4, k_idx_cache, block_table, seq_lens, topk=topk)
        o = msa_decode_paged_torch(q4, k_cache, v_cache, block_table, seq_lens, sel, scale=scale)
    else:
        from minimax_lab.attention.msa_triton_decode import msa_decode_paged_triton
        o, sel = msa_decode_paged_triton(q4, k_cache, v_cache, block_table, seq_lens, qi4, k_idx_cache,
                                         topk=topk, scale=scale)
    o = o[:, 0] if squeeze else o
    return (o, sel) if return_selected else o
