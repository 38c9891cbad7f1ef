"""Solutions of chapter 03's exercises (MiniMax Sparse Attention). Try each one first: the checker
says what is wrong."""
from __future__ import annotations

import math

import torch


def block_scores_mean(q_idx: torch.Tensor, k_idx: torch.Tensor, block_size: int) -> torch.Tensor:
    S, G, D = q_idx.shape
    nb = math.ceil(S / block_size)
    pad = nb * block_size - S                    # the last block may be ragged: pad, it is never ranked
    k_mean = torch.nn.functional.pad(k_idx.float(), (0, 0, 0, pad)).view(nb, block_size, D).mean(1)
    scores = torch.einsum("tgd,jd->tgj", q_idx.float(), k_mean) / math.sqrt(D)  # [S, G, nb]
    local = torch.arange(S) // block_size
    earlier = torch.arange(nb)[None, :] < local[:, None]  # [S, nb]
    return scores.masked_fill(~earlier[:, None, :], float("-inf"))


def select_blocks(scores: torch.Tensor, block_size: int, topk: int) -> torch.Tensor:
    S, G, nb = scores.shape
    out = torch.full((S, G, topk), -1, dtype=torch.int32)
    for t in range(S):
        local = t // block_size
        if local + 1 <= topk:                    # few blocks visible: take them all
            out[t, :, : local + 1] = torch.arange(local + 1, dtype=torch.int32)
            continue
        for g in range(G):
            row = scores[t, g, :local].tolist()  # earlier blocks only
            best = sorted(range(local), key=lambda j: (-row[j], j))[: topk - 1]  # score down, id up
            out[t, g] = torch.tensor(best + [local], dtype=torch.int32)
    return out


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, selected: torch.Tensor,
                     block_size: int) -> torch.Tensor:
    S, Hq, D = q.shape
    G = k.shape[1]
    key_block = torch.arange(S) // block_size                              # [S] block of each key
    sel = selected.long().permute(1, 0, 2)                                 # [G, S, topk]
    allowed = (sel[..., None] == key_block).any(-2)                        # [G, S(query), S(key)]
    allowed &= torch.ones(S, S, dtype=torch.bool).tril()                   # causal: j <= t
    allowed = allowed.repeat_interleave(Hq // G, dim=0)                    # [Hq, S, S]
    kh = k.float().permute(1, 0, 2).repeat_interleave(Hq // G, dim=0)     # [Hq, S, D]
    vh = v.float().permute(1, 0, 2).repeat_interleave(Hq // G, dim=0)
    s = q.float().permute(1, 0, 2) @ kh.transpose(1, 2) / math.sqrt(D)    # [Hq, S, S]
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)                               # a row with no key: all 0
    return (p @ vh).permute(1, 0, 2).to(q.dtype)
