"""The PyTorch implementation of :func:`minimax_lab.paged_kv.prefill.paged_prefill`: gather every
page into a contiguous copy, then SDPA with a boolean causal-offset mask."""
from __future__ import annotations

import torch

from minimax_lab.paged_kv.layout import gather_pages
from minimax_lab.sdpa import sdpa


def paged_prefill_torch(q, k_cache, v_cache, block_table, seq_lens, *, q_lens=None, scale=None, k_scale=None,
                        v_scale=None):
    """Gather all pages into a contiguous copy (FP8 pages dequantized to q's dtype as they are
    gathered), then SDPA with a boolean causal-offset mask."""
    B, S, Hq, D = q.shape
    _, ps, Hkv, _ = k_cache.shape
    L = int(seq_lens.max()) if B else 0
    if L == 0:
        return torch.zeros_like(q)
    n_pages = (L + ps - 1) // ps
    pages = block_table[:, :n_pages].long().clamp_min(0)
    k = gather_pages(k_cache, k_scale, pages, q.dtype).reshape(B, n_pages * ps, Hkv, D)[:, :L].transpose(1, 2)
    v = gather_pages(v_cache, v_scale, pages, q.dtype).reshape(B, n_pages * ps, Hkv, D)[:, :L].transpose(1, 2)
    ql = q_lens.long() if q_lens is not None else torch.full((B,), S, device=q.device, dtype=torch.long)
    rows = torch.arange(S, device=q.device)
    pos = seq_lens.long()[:, None] - ql[:, None] + rows[None, :]  # [B, S] position of each new token
    mask = torch.arange(L, device=q.device)[None, None, :] <= pos[:, :, None]  # [B, S, L]
    real = rows[None, :] < ql[:, None]
    mask = mask | ~real[:, :, None]  # padding rows: let them see everything (no NaN), zeroed below
    o = sdpa(q.transpose(1, 2).to(k.dtype), k, v, attn_mask=mask[:, None],
                                                         scale=scale, enable_gqa=Hq != Hkv)
    o = o.transpose(1, 2).to(q.dtype)  # q cast to the cache's dtype and back, as in paged_decode
    return torch.where(real[:, :, None, None], o, torch.zeros_like(o))
