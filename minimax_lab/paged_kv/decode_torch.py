"""The PyTorch implementation of :func:`minimax_lab.paged_kv.decode.paged_decode`: gather every
page of the batch (``k_cache[block_table]``) into a contiguous copy, then
``scaled_dot_product_attention`` with a length mask. What a user writes first; it moves every
byte of the context twice (read pages, write copy, read copy)."""
from __future__ import annotations

import torch

from minimax_lab.paged_kv.layout import gather_pages
from minimax_lab.sdpa import sdpa


def paged_decode_torch(q, k_cache, v_cache, block_table, seq_lens, *, scale=None, k_scale=None, v_scale=None):
    """Gather all pages of the batch into a contiguous copy (FP8 pages dequantized to q's dtype
    as they are gathered), then SDPA (masked when ragged)."""
    B, Hq, D = q.shape
    _, ps, Hkv, _ = k_cache.shape
    L = int(seq_lens.max()) if B else 0
    out = torch.zeros_like(q)
    if L == 0:
        return out
    n_pages = (L + ps - 1) // ps
    pages = block_table[:, :n_pages].long().clamp_min(0)  # -1 pages sit beyond each length: masked
    k = gather_pages(k_cache, k_scale, pages, q.dtype).reshape(B, n_pages * ps, Hkv, D)[:, :L].transpose(1, 2)
    v = gather_pages(v_cache, v_scale, pages, q.dtype).reshape(B, n_pages * ps, Hkv, D)[:, :L].transpose(1, 2)
    mask = None
    if bool((seq_lens != L).any()):
        mask = (torch.arange(L, device=q.device)[None, :] < seq_lens[:, None])[:, None, None, :]
    # SDPA wants one dtype: q is cast to the cache's (as the Triton kernel does), o back to q's
    o = sdpa(q[:, :, None, :].to(k.dtype), k, v, attn_mask=mask,
                                                         scale=scale, enable_gqa=Hq != Hkv)
    o = o[:, :, 0, :].to(q.dtype)
    return torch.where((seq_lens > 0)[:, None, None], o, torch.zeros_like(o))
