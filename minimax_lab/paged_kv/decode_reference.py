"""The readable reference of :func:`minimax_lab.paged_kv.decode.paged_decode`: one sequence at a
time, gather its cached tokens through the block table, then an fp32 softmax."""
from __future__ import annotations

import math

import torch

from minimax_lab.paged_kv.layout import dequantize_kv, gather_sequence
from minimax_lab.validate import accumulate_dtype


def paged_decode_reference(q, k_cache, v_cache, block_table, seq_lens, *, scale=None, k_scale=None,
                           v_scale=None):
    """Sequence by sequence: gather its tokens, then an fp32 softmax (fp64 for fp64 inputs).
    FP8 caches are dequantized first (exactly, to fp32). ``[B, Hq, D]`` in q's dtype."""
    k_cache, v_cache = dequantize_kv(k_cache, k_scale), dequantize_kv(v_cache, v_scale)
    B, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    work = accumulate_dtype(q.dtype)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.zeros(B, Hq, D, dtype=work, device=q.device)
    for b in range(B):
        L = int(seq_lens[b])
        if L == 0:
            continue
        k = gather_sequence(k_cache, block_table, b, L).to(work).repeat_interleave(Hq // Hkv, dim=1)  # [L, Hq, D]
        v = gather_sequence(v_cache, block_table, b, L).to(work).repeat_interleave(Hq // Hkv, dim=1)
        s = torch.einsum("hd,lhd->hl", q[b].to(work), k) * scale
        out[b] = torch.einsum("hl,lhd->hd", torch.softmax(s, dim=-1), v)
    return out.to(q.dtype)
