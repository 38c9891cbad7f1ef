"""MiniMax Sparse Attention (MSA): the public entry points, input checks, and the impl switch.

The contract (from the MSA paper, arXiv 2606.13392; rules spelled out in :mod:`.msa_reference`):

``msa_select(q_idx, k_idx, *, block_size=128, topk=16, impl="torch") -> int32 [B, S, G, topk]``
    ``q_idx [B, S, G, D_idx]`` (one index query per GQA group), ``k_idx [B, S, D_idx]`` (one
    shared index key). Block score = max over the block's causally visible tokens of
    ``q_idx . k_idx / sqrt(D_idx)``. With ``n = t // Bk + 1 <= topk`` visible blocks all are
    selected (ascending ids); otherwise the ``topk - 1`` best earlier blocks (descending score,
    ties to the lower id) then the local block last. Unused slots are ``-1``.

``msa_attention(q, k, v, q_idx, k_idx, *, block_size=128, topk=16, impl="torch", return_lse=False)``
    ``q [B, S, Hq, D]``, ``k, v [B, S, G, D]`` with ``Hq`` a multiple of ``G``; exact softmax of
    each query head over its group's selected tokens, causal in the local block. Returns
    ``o [B, S, Hq, D]`` in q's dtype (and ``lse [B, Hq, S]`` fp32, fp64 for fp64 inputs in the
    reference/torch impls). Extra keywords: ``scale`` (default ``1/sqrt(D)``; a finite number),
    ``selected`` (reuse a selection, see below) and, for ``impl="triton"``, ``schedule="query" |
    "kv" | "auto"`` (query-outer or KV-outer kernel; default ``"auto"``: KV-outer where its K/V
    block fits the GPU's shared memory, :func:`.msa_triton_prefill.kv_outer_fits`).

    ``selected`` ``int32 [B, S, G, topk]`` is checked (a host sync): every id is ``-1`` (unused)
    or a block token ``t`` may see, ``0 <= id <= t // block_size``, and no block appears twice in
    a row (it would be counted twice). It need not contain the local block. A row with no block
    (all ``-1``) attends to nothing: its output is 0 and its lse ``-inf``, as for a dense row that
    sees no key. ``check_selected=False`` skips that check for ``impl="triton"`` (a selection
    :func:`msa_select` just made, in a timed loop): bad ids then give unspecified output, but the
    kernels never read outside K/V (keys past a token are masked, ids past the last block
    ignored). The reference and torch impls always check.

``msa_decode_paged(q, k_cache, v_cache, block_table, seq_lens, q_idx, k_idx_cache, *, topk=16, impl="torch")``
    Decode for the last ``T`` tokens of each sequence, already written to the paged cache:
    ``q [B, Hq, D]`` or ``[B, T, Hq, D]``; ``k_cache, v_cache [num_pages, page_size, G, D]``;
    ``block_table int32 [B, max_pages]`` (-1 unused); ``seq_lens int32 [B]`` (tokens cached,
    queries included, so ``T <= seq_lens[b] <= max_pages * page_size``); ``q_idx [B, G, D_idx]``
    or ``[B, T, G, D_idx]``; ``k_idx_cache [num_pages, page_size, D_idx]``. Block = page, so
    ``block_size = page_size``. ``k_idx_cache`` may be ``float8_e4m3fn`` with ``k_idx_scale``
    fp32 ``[num_pages, page_size]`` (one power-of-two scale per token, from
    :func:`minimax_lab.attention.msa_index_fp8.quantize_index_keys`): every impl then ranks the
    dequantized keys, the Triton kernel reading half the bytes. The K/V caches may be
    ``float8_e4m3fn`` too, with ``k_scale, v_scale`` fp32 ``[num_pages, page_size, G]`` (per token
    and group) or ``[num_pages, G]`` (per page and group), checked by
    :func:`minimax_lab.paged_kv.layout.check_kv_scales`: every impl attends over the stored values
    ``cache * scale`` (the Triton kernel upcasts the e4m3 tiles to q's dtype). Returns o in q's shape and dtype; ``return_selected=True`` also
    returns the selection ``int32 [B, T, G, topk]``. The paged layout and its checks are those of
    :mod:`minimax_lab.paged_kv.layout` (page ids in range, no -1 inside a sequence, lengths in
    range); ``check_values=False`` skips the value checks for ``impl="triton"`` (no host sync:
    CUDA graphs), whose kernels then clamp page ids and block ids, so bad values give
    unspecified output but never a read outside the caches.

FP8 index tensors (prefill): ``msa_select`` and ``msa_attention`` take ``q_idx`` and ``k_idx`` in
``float8_e4m3fn`` with ``q_idx_scale`` fp32 ``[B, S, G]`` and ``k_idx_scale`` fp32 ``[B, S]`` (one
power-of-two scale per vector, from
:func:`minimax_lab.attention.msa_index_fp8.quantize_index_keys`): every impl ranks the dequantized
``q_idx . k_idx``, the Triton kernel on the FP8 tensor cores.

Shared rules: ``1 <= topk <= 256`` (``MAX_TOPK``); at most ``2**20`` blocks (pages) per sequence
(the ranking keys hold a block id in 20 bits); at least one group and ``D_idx >= 1``; index
tensors (``q_idx``, ``k_idx``, ``k_idx_cache``) of one dtype; ``B = 0`` or ``S = 0`` (``T = 0``)
give empty outputs; any strides (non-contiguous views give the contiguous answer). Index scores
are ranked in fp32 in every impl.

``impl``: ``"reference"`` (dense masks, fp32 -- fp64 for fp64 inputs), ``"torch"`` (gather,
chunked; same dtypes), ``"triton"`` (fp16, bf16, fp32 on :func:`minimax_lab.runtime.kernel_device`).

Training: ``msa_attention`` is differentiable in ``q``, ``k``, ``v`` in every impl, from ``o``
and from ``lse`` (the selection is integer: ``q_idx``/``k_idx`` get no gradient from it; the
index branch learns by distillation, :mod:`.msa_backward_index`). The reference and torch impls
are differentiated by autograd through their own ops; ``impl="triton"`` under grad mode, with
``q``, ``k`` or ``v`` requiring grad, runs :class:`.msa_backward_autograd.SparseAttention`: the
Triton forward saves ``o``, ``lse`` and the selection, and the Triton backward
(:mod:`.msa_backward_triton`) computes the gradients. ``msa_decode_paged(impl="triton")`` serves
inference only: caches or ``q`` that require grad raise under grad mode.
Bad input raises ``TypeError``/``ValueError`` naming what was expected.
"""
from __future__ import annotations

import torch

from minimax_lab.attention.msa_backward_autograd import SparseAttention
from minimax_lab.attention.msa_index_fp8 import check_fp8_index, check_fp8_index_pair, dequantize_index_keys
from minimax_lab.attention.msa_reference import (msa_attention_reference, msa_decode_paged_reference,
                                                 msa_select_reference)
from minimax_lab.attention.msa_torch import (ID_BITS, msa_attention_torch, msa_decode_paged_torch,
                                             msa_decode_select_torch, msa_select_torch)
from minimax_lab.attention.msa_triton_decode import msa_decode_paged_triton
from minimax_lab.attention.msa_triton_prefill import SCHEDULES, msa_attention_triton
from minimax_lab.attention.msa_triton_select import msa_select_triton
from minimax_lab.fp8 import FP8, is_fp8
from minimax_lab.paged_kv.layout import check_paged_layout
from minimax_lab.validate import (FLOAT_DTYPES, IMPLS, TRITON_DTYPES, check_choice, check_positive_int,
                                  check_power_of_two, check_same_device, check_scale, check_tensor, check_triton_inputs)

MIN_BLOCK, MAX_BLOCK = 16, 128
#: the selection is an int32 ``[B, S, G, topk]`` tensor; MSA uses 16
MAX_TOPK = 256

#: MSA's production shape (MiniMax M3's attention layer, from the MSA paper): 64 query heads in
#: 4 GQA groups, head dim 128, index dim 128, 128-token blocks, 16 blocks per query and group
MSA_SHAPE = dict(Hq=64, G=4, D=128, Didx=128, Bk=128, topk=16)
#: the same structure at sizes Triton's interpreter runs in seconds (selection is still a real top-k)
MSA_SHAPE_CPU = dict(Hq=4, G=2, D=32, Didx=16, Bk=16, topk=3)


def _check_block_count(n_blocks: int) -> None:
    """Block ids live in the low ``ID_BITS`` bits of the ranking keys: at most ``2**ID_BITS`` blocks."""
    if n_blocks > 2**ID_BITS:
        raise ValueError(f"at most 2**{ID_BITS} blocks per sequence (the ranking keys hold the block id in "
                         f"{ID_BITS} bits), got {n_blocks}")


def _check_index(q_idx, k_idx, *, block_size, topk, impl, q_idx_scale=None, k_idx_scale=None) -> bool:
    """Checks the index inputs; returns whether they are FP8 (with checked scales)."""
    check_choice(impl, "impl", IMPLS)
    check_power_of_two(block_size, "block_size", minimum=MIN_BLOCK, maximum=MAX_BLOCK)
    check_positive_int(topk, "topk", maximum=MAX_TOPK)
    check_tensor(q_idx, "q_idx", ndim=4, dtypes=FLOAT_DTYPES + (FP8,))
    B, S, G, Didx = q_idx.shape
    if G < 1 or Didx < 1:
        raise ValueError(f"q_idx [B, S, G, D_idx] needs at least one group and D_idx >= 1, got {list(q_idx.shape)}")
    check_tensor(k_idx, "k_idx", shape=[B, S, Didx], dtypes=(q_idx.dtype,))
    check_same_device(q_idx=q_idx, k_idx=k_idx)
    _check_block_count(-(-S // block_size))
    fp8 = check_fp8_index_pair(q_idx, k_idx, q_idx_scale, k_idx_scale)
    if impl == "triton":  # the selection is integer in every impl: no gradient to lose
        check_triton_inputs(allow_grad=True, float_dtypes=TRITON_DTYPES + (FP8,), q_idx=q_idx, k_idx=k_idx)
    return fp8


def _index_operands(q_idx, k_idx, q_idx_scale, k_idx_scale, *, fp8: bool, impl: str):
    """``(q_idx, k_idx, k_idx_scale)`` as the impl takes them: the Triton kernel reads FP8 tensors
    and the keys' scales; the other impls rank the dequantized tensors (exact in fp32)."""
    if not fp8 or impl == "triton":
        return q_idx, k_idx, k_idx_scale
    return dequantize_index_keys(q_idx, q_idx_scale), dequantize_index_keys(k_idx, k_idx_scale), None


def msa_select(q_idx, k_idx, *, block_size: int = 128, topk: int = 16, impl: str = "torch",
               q_idx_scale: torch.Tensor | None = None, k_idx_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Top-k block selection of MSA's index branch; see the module docstring."""
    fp8 = _check_index(q_idx, k_idx, block_size=block_size, topk=topk, impl=impl, q_idx_scale=q_idx_scale,
                       k_idx_scale=k_idx_scale)
    if q_idx.numel() == 0:
        return torch.empty(*q_idx.shape[:3], topk, dtype=torch.int32, device=q_idx.device)
    q_idx, k_idx, k_idx_scale = _index_operands(q_idx, k_idx, q_idx_scale, k_idx_scale, fp8=fp8, impl=impl)
    if impl == "reference":
        return msa_select_reference(q_idx, k_idx, block_size=block_size, topk=topk)
    if impl == "torch":
        return msa_select_torch(q_idx, k_idx, block_size=block_size, topk=topk)
    return msa_select_triton(q_idx, k_idx, block_size=block_size, topk=topk, k_idx_scale=k_idx_scale)


def _check_attention(q, k, v, q_idx, k_idx, *, block_size, topk, impl, scale, q_idx_scale=None,
                     k_idx_scale=None) -> bool:
    fp8 = _check_index(q_idx, k_idx, block_size=block_size, topk=topk, impl=impl, q_idx_scale=q_idx_scale,
                       k_idx_scale=k_idx_scale)
    check_tensor(q, "q", ndim=4, dtypes=FLOAT_DTYPES)
    B, S, Hq, D = q.shape
    G = q_idx.shape[2]
    check_tensor(k, "k", shape=[B, S, None, D], dtypes=(q.dtype,))
    check_tensor(v, "v", shape=list(k.shape), dtypes=(q.dtype,))
    if k.shape[2] != G:
        raise ValueError(f"k/v have {k.shape[2]} kv heads but q_idx has {G} groups; they must match")
    if Hq < 1 or Hq % G:
        raise ValueError(f"Hq ({Hq}) must be a positive multiple of Hkv ({G})")
    if D < 1:
        raise ValueError(f"head_dim must be >= 1, got {D}")
    if q_idx.shape[:2] != (B, S):
        raise ValueError(f"q_idx must have shape [{B}, {S}, G, D_idx], got {list(q_idx.shape)}")
    check_same_device(q=q, k=k, v=v, q_idx=q_idx)
    check_scale(scale)
    if impl == "triton":  # trainable: SparseAttention carries the gradients
        check_triton_inputs(allow_grad=True, q=q, k=k, v=v)
    return fp8


def check_selection(selected, *, B: int, S: int, G: int, topk: int, block_size: int) -> None:
    """A caller's selection for :func:`msa_attention`: ``int32 [B, S, G, topk]``, each id ``-1``
    (unused) or a block token ``t`` may see (``0 <= id <= t // block_size``), no id twice in a
    row. Reads the verdict back to the host (a sync). Raises ``TypeError``/``ValueError``."""
    check_tensor(selected, "selected", shape=[B, S, G, topk], dtypes=(torch.int32,))
    if selected.numel() == 0:
        return
    sel = selected.long()
    local = (torch.arange(S, device=sel.device) // block_size)[None, :, None, None]
    ids = sel.sort(dim=-1).values
    repeated = ((ids[..., 1:] == ids[..., :-1]) & (ids[..., 1:] >= 0)).any()
    lowest, past_local, dup = torch.stack([sel.min(), (sel - local).max(), repeated.long()]).tolist()
    if lowest < -1:
        raise ValueError(f"selected ids must be -1 (unused) or block ids >= 0, got {lowest}")
    if past_local > 0:
        raise ValueError(f"selected must be causal: token t may select blocks 0 .. t // block_size only, got a "
                         f"block {past_local} past a token's own block")
    if dup:
        raise ValueError("selected has a duplicate block id in a row (a block selected twice would count twice)")


def msa_attention(q, k, v, q_idx, k_idx, *, block_size: int = 128, topk: int = 16, impl: str = "torch",
                  return_lse: bool = False, scale: float | None = None, selected: torch.Tensor | None = None,
                  schedule: str = "auto", check_selected: bool = True, q_idx_scale: torch.Tensor | None = None,
                  k_idx_scale: torch.Tensor | None = None):
    """Sparse prefill attention over the selected blocks; see the module docstring."""
    fp8 = _check_attention(q, k, v, q_idx, k_idx, block_size=block_size, topk=topk, impl=impl, scale=scale,
                           q_idx_scale=q_idx_scale, k_idx_scale=k_idx_scale)
    B, S, Hq, D = q.shape
    if selected is not None:
        if check_selected or impl != "triton":
            check_selection(selected, B=B, S=S, G=k.shape[2], topk=topk, block_size=block_size)
        else:  # layout only: nothing read from the device
            check_tensor(selected, "selected", shape=[B, S, k.shape[2], topk], dtypes=(torch.int32,))
    if impl == "triton":
        check_choice(schedule, "schedule", SCHEDULES)
    if B * S == 0:
        o = torch.empty_like(q)
        return (o, torch.empty(B, Hq, S, dtype=torch.float32, device=q.device)) if return_lse else o
    kw = dict(block_size=block_size, topk=topk, scale=scale, return_lse=return_lse, selected=selected)
    if selected is None:
        q_idx, k_idx, k_idx_scale = _index_operands(q_idx, k_idx, q_idx_scale, k_idx_scale, fp8=fp8, impl=impl)
    if impl == "reference":
        return msa_attention_reference(q, k, v, q_idx, k_idx, **kw)
    if impl == "torch":
        return msa_attention_torch(q, k, v, q_idx, k_idx, **kw)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))):
        return msa_attention_triton(q, k, v, q_idx, k_idx, schedule=schedule, k_idx_scale=k_idx_scale, **kw)
    if selected is None:  # the selection is integer: made once, saved, never differentiated
        selected = msa_select_triton(q_idx.detach(), k_idx.detach(), block_size=block_size, topk=topk,
                                     k_idx_scale=k_idx_scale)
    o, lse = SparseAttention.apply(q, k, v, selected, block_size, scale, "triton", "triton", schedule)
    return (o, lse) if return_lse else o


def msa_decode_paged(q, k_cache, v_cache, block_table, seq_lens, q_idx, k_idx_cache, *, topk: int = 16,
                     impl: str = "torch", scale: float | None = None, return_selected: bool = False,
                     check_values: bool = True, k_idx_scale=None, k_scale=None, v_scale=None):
    """Paged sparse decode (block = page); see the module docstring."""
    check_choice(impl, "impl", IMPLS)
    check_positive_int(topk, "topk", maximum=MAX_TOPK)
    check_tensor(q, "q", dtypes=FLOAT_DTYPES)
    if q.ndim not in (3, 4):
        raise ValueError(f"q must be [B, Hq, D] or [B, T, Hq, D], got shape {list(q.shape)}")
    squeeze = q.ndim == 3
    q4 = q[:, None] if squeeze else q
    B, T, Hq, D = q4.shape
    # the reference and torch impls read lengths back to the host anyway: they always check values
    P, ps, G, Dk, max_pages = check_paged_layout(k_cache, v_cache, block_table, seq_lens, batch=B, min_len=T,
                                                 check_values=check_values or impl != "triton",
                                                 k_idx_cache=k_idx_cache, k_scale=k_scale, v_scale=v_scale)
    _check_block_count(max_pages)
    if k_cache.dtype != q.dtype and not is_fp8(k_cache):
        raise ValueError(f"k_cache must have q's dtype {q.dtype} (or be float8_e4m3fn with k_scale and v_scale), "
                         f"got {k_cache.dtype}")
    if Dk != D:
        raise ValueError(f"k_cache head dim {Dk} != q head dim {D}")
    check_power_of_two(ps, "page_size (= block_size)", minimum=MIN_BLOCK, maximum=MAX_BLOCK)
    if Hq < 1 or Hq % G:
        raise ValueError(f"Hq ({Hq}) must be a positive multiple of Hkv ({G})")
    check_tensor(q_idx, "q_idx", dtypes=FLOAT_DTYPES)
    qi4 = q_idx[:, None] if q_idx.ndim == 3 else q_idx
    Didx = k_idx_cache.shape[2]
    if qi4.ndim != 4 or tuple(qi4.shape[:3]) != (B, T, G):
        raise ValueError(f"q_idx must be [B={B}, G={G}, D_idx] (or [B, T={T}, G, D_idx]), got {list(q_idx.shape)}")
    if qi4.shape[3] != Didx:
        raise ValueError(f"k_idx_cache has D_idx = {Didx} but q_idx has {qi4.shape[3]}; they must match")
    fp8_index = check_fp8_index(k_idx_cache, k_idx_scale)
    if k_idx_cache.dtype != q_idx.dtype and not fp8_index:
        raise ValueError(f"k_idx_cache must have q_idx's dtype {q_idx.dtype} (or be float8_e4m3fn with "
                         f"k_idx_scale), got {k_idx_cache.dtype}")
    if fp8_index and impl != "triton":  # the other impls rank the same (exactly) dequantized keys
        k_idx_cache, k_idx_scale = dequantize_index_keys(k_idx_cache, k_idx_scale, q_idx.dtype), None
    check_same_device(q=q, k_cache=k_cache, q_idx=q_idx)
    check_scale(scale)
    if impl == "triton":
        check_triton_inputs(q=q)
        check_triton_inputs(float_dtypes=TRITON_DTYPES + (FP8,), k_cache=k_cache, v_cache=v_cache)
        check_triton_inputs(allow_grad=True, q_idx=q_idx, k_idx_cache=None if fp8_index else k_idx_cache)
        if fp8_index:
            check_same_device(q_idx=q_idx, k_idx_cache=k_idx_cache, k_idx_scale=k_idx_scale)

    if B * T == 0:
        o, sel = torch.empty_like(q4), torch.empty(B, T, G, topk, dtype=torch.int32, device=q.device)
    elif impl == "reference":
        o, sel = msa_decode_paged_reference(q4, k_cache, v_cache, block_table, seq_lens, qi4, k_idx_cache,
                                            topk=topk, scale=scale, return_selected=True, k_scale=k_scale,
                                            v_scale=v_scale)
    elif impl == "torch":
        sel = msa_decode_select_torch(qi4, k_idx_cache, block_table, seq_lens, topk=topk)
        o = msa_decode_paged_torch(q4, k_cache, v_cache, block_table, seq_lens, sel, scale=scale, k_scale=k_scale,
                                   v_scale=v_scale)
    else:
        o, sel = msa_decode_paged_triton(q4, k_cache, v_cache, block_table, seq_lens, qi4, k_idx_cache,
                                         topk=topk, scale=scale, k_idx_scale=k_idx_scale, k_scale=k_scale,
                                         v_scale=v_scale)
    o = o[:, 0] if squeeze else o
    return (o, sel) if return_selected else o
