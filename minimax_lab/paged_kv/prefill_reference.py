"""The readable reference of :func:`minimax_lab.paged_kv.prefill.paged_prefill`: per sequence,
gather its cached tokens, fp32 scores, a causal mask offset by the cached prefix."""
from __future__ import annotations

import math

import torch

from minimax_lab.paged_kv.layout import dequantize_kv, gather_sequence
from minimax_lab.validate import accumulate_dtype


def paged_prefill_reference(q, k_cache, v_cache, block_table, seq_lens, *, q_lens=None, scale=None, k_scale=None,
                            v_scale=None):
    """Per sequence: gather its cached tokens, fp32 scores (fp64 for fp64 inputs), causal mask with
    the prefix offset. FP8 caches are dequantized first (exactly, to fp32)."""
    k_cache, v_cache = dequantize_kv(k_cache, k_scale), dequantize_kv(v_cache, v_scale)
    B, S, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    work = accumulate_dtype(q.dtype)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.zeros(B, S, Hq, D, dtype=work, device=q.device)
    for b in range(B):
        L = int(seq_lens[b])
        n = S if q_lens is None else int(q_lens[b])
        if n == 0:
            continue
        k = gather_sequence(k_cache, block_table, b, L).to(work).repeat_interleave(Hq // Hkv, dim=1)  # [L, Hq, D]
        v = gather_sequence(v_cache, block_table, b, L).to(work).repeat_interleave(Hq // Hkv, dim=1)
        s = torch.einsum("ihd,jhd->hij", q[b, :n].to(work), k) * scale  # [Hq, n, L]
        pos = torch.arange(L - n, L, device=q.device)
        s = s.masked_fill(torch.arange(L, device=q.device)[None, None, :] > pos[None, :, None], float("-inf"))
        out[b, :n] = torch.einsum("hij,jhd->ihd", torch.softmax(s, dim=-1), v)
    return out.to(q.dtype)
