"""MiniMax Sparse Attention, the reference: dense masks in fp32, every rule spelled out.

This file is the *definition* the fast versions are checked against, so it favours loops a
reader can follow over speed (use it at a few hundred tokens). The rules are those of the MSA
contract of :mod:`.msa` (from the MSA paper, arXiv 2606.13392):

* **Index branch.** Token score ``s(t, j) = q_idx[t, g] . k_idx[j] / sqrt(D_idx)`` for the
  causally visible keys ``j <= t``; a block's score is the max of ``s`` over its visible tokens.
* **Selection** for query ``t`` and group ``g``: ``n = t // Bk + 1`` blocks are visible. If
  ``n <= topk`` all of them are selected, ascending ids. Otherwise the ``topk - 1`` earlier blocks
  with the highest scores come first, in descending score order (ties: lower block id first),
  and the query's own (local) block is placed **last**. Unused slots hold ``-1``.
* **Main branch.** Each query head of group ``g`` attends with an exact softmax over the tokens
  of its group's selected blocks, causal inside the local block.

* A query whose selection holds no block (all ``-1``, only possible with a caller's
  ``selected``) attends to nothing: output 0, lse ``-inf``.

Shapes: ``q [B, S, Hq, D]``, ``k, v [B, S, G, D]``, ``q_idx [B, S, G, D_idx]``,
``k_idx [B, S, D_idx]``; selection ``int32 [B, S, G, topk]``; ``lse [B, Hq, S]`` fp32 (fp64 for
fp64 inputs: the main branch computes in :func:`minimax_lab.validate.accumulate_dtype`; index
scores are fp32 in every impl). Inputs are assumed valid (``msa.py`` checks them).
"""
from __future__ import annotations

import math

import torch

from minimax_lab.paged_kv.layout import dequantize_kv, gather_sequence
from minimax_lab.validate import accumulate_dtype


def block_scores_reference(q_idx: torch.Tensor, k_idx: torch.Tensor, block_size: int) -> torch.Tensor:
    """Block scores ``[B, S, G, n_blocks]`` fp32: max of the scaled token scores over each
    block's causally visible tokens; ``-inf`` for blocks the query cannot see at all."""
    B, S, G, Didx = q_idx.shape
    n_blocks = math.ceil(S / block_size)
    qi, ki = q_idx.float(), k_idx.float()
    token = torch.einsum("btgd,bjd->bgtj", qi, ki) / math.sqrt(Didx)  # [B, G, S, S]
    t = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    token = token.masked_fill((j > t).to(token.device), float("-inf"))
    out = torch.full((B, S, G, n_blocks), float("-inf"), device=q_idx.device)
    for blk in range(n_blocks):
        cols = token[..., blk * block_size:(blk + 1) * block_size]  # [B, G, S, <=Bk]
        out[..., blk] = cols.amax(dim=-1).transpose(1, 2)
    return out


def select_from_scores_reference(scores: torch.Tensor, positions, block_size: int, topk: int) -> torch.Tensor:
    """Apply the selection rule row by row. ``scores [..., n_blocks]``, ``positions`` the query
    position of each row (broadcastable to ``scores.shape[:-1]``). Returns int32 ``[..., topk]``."""
    rows = scores.reshape(-1, scores.shape[-1]).tolist()
    pos = torch.as_tensor(positions).expand(scores.shape[:-1]).reshape(-1).tolist()
    out = []
    for row, t in zip(rows, pos):
        local = int(t) // block_size
        n = local + 1
        if n <= topk:
            chosen = list(range(n))
        else:
            earlier = sorted(range(local), key=lambda i: (-row[i], i))  # best score, then lower id
            chosen = earlier[: topk - 1] + [local]
        out.append(chosen + [-1] * (topk - len(chosen)))
    return torch.tensor(out, dtype=torch.int32, device=scores.device).reshape(*scores.shape[:-1], topk)


def msa_select_reference(q_idx, k_idx, *, block_size: int = 128, topk: int = 16) -> torch.Tensor:
    """Selected block ids ``int32 [B, S, G, topk]`` by the contract's rule."""
    S = q_idx.shape[1]
    scores = block_scores_reference(q_idx, k_idx, block_size)
    positions = torch.arange(S)[None, :, None]
    return select_from_scores_reference(scores, positions, block_size, topk)


def selection_mask(selected: torch.Tensor, S: int, block_size: int) -> torch.Tensor:
    """Dense boolean mask ``[B, G, S, S]``: query ``t`` of group ``g`` may see key ``j`` when
    ``j``'s block is among ``selected[b, t, g]`` and ``j <= t``."""
    B, _, G, _ = selected.shape
    key_block = torch.arange(S, device=selected.device) // block_size  # [S]
    sel = selected.long().permute(0, 2, 1, 3)  # [B, G, S, topk]
    hit = (sel[..., None] == key_block).any(dim=-2)  # [B, G, S(query), S(key)]
    causal = torch.ones(S, S, dtype=torch.bool, device=selected.device).tril()
    return hit & causal


def msa_attention_reference(q, k, v, q_idx, k_idx, *, block_size: int = 128, topk: int = 16,
                            scale: float | None = None, return_lse: bool = False, selected=None):
    """Sparse attention by a dense mask: ``o [B, S, Hq, D]`` in q's dtype (and ``lse``)."""
    B, S, Hq, D = q.shape
    G = k.shape[2]
    work = accumulate_dtype(q.dtype)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    if selected is None:
        selected = msa_select_reference(q_idx, k_idx, block_size=block_size, topk=topk)
    mask = selection_mask(selected, S, block_size)  # [B, G, S, S]
    mask = mask.repeat_interleave(Hq // G, dim=1)  # [B, Hq, S, S]
    qf = q.to(work).transpose(1, 2)
    kf = k.to(work).transpose(1, 2).repeat_interleave(Hq // G, dim=1)
    vf = v.to(work).transpose(1, 2).repeat_interleave(Hq // G, dim=1)
    scores = (qf @ kf.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # -inf for a row whose selection is empty
    # exp(score - lse) is the softmax; an empty row would be exp(-inf - -inf) = NaN: it gives 0
    probs = torch.exp(scores - lse.masked_fill(torch.isinf(lse), 0.0)[..., None])
    o = (probs @ vf).transpose(1, 2).to(q.dtype)
    return (o, lse) if return_lse else o


#: The first ``length`` tokens of sequence ``b`` of a paged cache: ``unpage(cache, block_table, b, length)``.
unpage = gather_sequence


def msa_decode_paged_reference(q, k_cache, v_cache, block_table, seq_lens, q_idx, k_idx_cache, *,
                               topk: int = 16, scale: float | None = None, return_selected: bool = False,
                               k_scale=None, v_scale=None):
    """Paged sparse decode, one sequence at a time: un-page the cache, then run the prefill rule
    for the last ``T`` positions. ``q [B, T, Hq, D]``, ``q_idx [B, T, G, Didx]``; page = block.
    FP8 caches (with checked ``k_scale``/``v_scale``) are dequantized first, exactly, to fp32.
    Returns ``o [B, T, Hq, D]`` in q's dtype (and the selection ``int32 [B, T, G, topk]``)."""
    k_cache, v_cache = dequantize_kv(k_cache, k_scale), dequantize_kv(v_cache, v_scale)
    B, T, Hq, D = q.shape
    G = k_cache.shape[2]
    ps = k_cache.shape[1]
    work = accumulate_dtype(q.dtype)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    outs, sels = [], []
    for b in range(B):
        L = int(seq_lens[b])
        k = unpage(k_cache, block_table, b, L).to(work)  # [L, G, D]
        v = unpage(v_cache, block_table, b, L).to(work)
        ki = unpage(k_idx_cache, block_table, b, L).float()  # [L, Didx]
        keys = torch.arange(L, device=q.device)
        pos = keys[L - T:]
        # block scores of the T queries over the whole sequence (causal), then the rule
        qi = q_idx[b].float()  # [T, G, Didx]
        tok = torch.einsum("tgd,jd->tgj", qi, ki) / math.sqrt(ki.shape[-1])
        tok = tok.masked_fill(keys[None, None, :] > pos[:, None, None], float("-inf"))
        nb = math.ceil(L / ps)
        scores = torch.stack([tok[..., i * ps:(i + 1) * ps].amax(-1) for i in range(nb)], dim=-1)
        sel = select_from_scores_reference(scores, pos[:, None], ps, topk)  # [T, G, topk]
        allowed = (sel.long()[..., None] == (keys // ps)).any(-2)  # [T, G, L]
        allowed &= keys[None, None, :] <= pos[:, None, None]
        qh = q[b].to(work).reshape(T, G, Hq // G, D)
        s = torch.einsum("tghd,jgd->tghj", qh, k) * scale
        s = s.masked_fill(~allowed[:, :, None, :], float("-inf"))
        o = torch.einsum("tghj,jgd->tghd", torch.softmax(s, -1), v)
        outs.append(o.reshape(T, Hq, D))
        sels.append(sel)
    o = torch.stack(outs).to(q.dtype)
    return (o, torch.stack(sels)) if return_selected else o
