"""The backward of MSA's sparse attention in PyTorch, written out by hand: gather, recompute, scatter.

Same contract as :mod:`.msa_backward_reference` (read its formulas first). The forward saved two
things per query row and head besides its output: the log-sum-exp ``lse`` of the row's scores,
and the selection. With them the backward never needs the softmax of the forward: for a chunk of
query tokens it

1. gathers the K/V blocks each (token, group) selected, ``[C, G, topk * Bk, D]`` -- as the torch
   forward (:func:`.msa_torch.msa_attention_torch`) does;
2. recomputes the scores and ``p = exp(s - lse)`` (exact: ``lse`` normalizes the row);
3. forms ``dp = do . v``, ``ds = p * (dp - delta)`` with ``delta = do . o - dlse`` per row, and
   ``dq = scale * ds @ k`` -- each query row owns its own ``dq``;
4. scatters ``scale * ds^T q`` and ``p^T do`` back to the key positions they came from
   (``index_add_``): many query rows share a key, so ``dk``/``dv`` are sums over every row that
   selected the key's block.

Step 4 is where the Triton version differs: a KV-outer program owns one key block and walks the
query rows that selected it, so it sums in registers and writes once (no scatter, no atomics).
"""
from __future__ import annotations

import math

import torch

from minimax_lab.validate import accumulate_dtype


def row_delta(o, do, dlse=None):
    """``delta [B, Hq, S]`` in :func:`minimax_lab.validate.accumulate_dtype`: ``sum_d do * o`` per
    row, minus the log-sum-exp's gradient ``dlse [B, Hq, S]`` when given."""
    work = accumulate_dtype(o.dtype)
    delta = (do.to(work) * o.to(work)).sum(-1).transpose(1, 2)
    return delta if dlse is None else delta - dlse.to(work)


def gathered_blocks(x, sel, block_size: int):
    """Key blocks selected per (token, group): ``x [S, G, D]`` (one sequence), ``sel int64
    [C, G, topk]`` -> ``(blocks [C, G, topk * Bk, D], key_pos [C, G, topk * Bk])`` with
    ``key_pos = -1`` for unused slots and positions past the sequence."""
    S, G, D = x.shape
    n_blocks = math.ceil(S / block_size)
    xb = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, n_blocks * block_size - S)).view(n_blocks, block_size, G, D)
    safe = sel.clamp(min=0)
    gi = torch.arange(G, device=x.device)[None, :, None]
    blocks = xb[safe, :, gi, :]  # [C, G, topk, Bk, D]
    key_pos = safe[..., None] * block_size + torch.arange(block_size, device=x.device)
    key_pos = torch.where((sel[..., None] >= 0) & (key_pos < S), key_pos, -1)
    return blocks.flatten(2, 3), key_pos.flatten(2, 3)


def msa_attention_backward_torch(q, k, v, o, lse, do, selected, *, block_size: int, scale: float | None = None,
                                 dlse=None, chunk: int = 256):
    """``(dq, dk, dv)`` of sparse attention over ``selected`` from the forward's ``o`` and ``lse``.

    ``q [B, S, Hq, D]``, ``k, v [B, S, G, D]``, ``o`` (q's shape) and ``lse [B, Hq, S]`` from the
    forward, ``do`` the output's gradient, ``selected int32 [B, S, G, topk]`` (valid),
    ``dlse [B, Hq, S]`` or None. Computes in fp32 (fp64 for fp64 inputs), ``chunk`` query tokens
    at a time; returns gradients in the dtypes of ``q``, ``k``, ``v``. Inputs are assumed valid."""
    B, S, Hq, D = q.shape
    G = k.shape[2]
    hpg = Hq // G
    work = accumulate_dtype(q.dtype)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    delta = row_delta(o, do, dlse)  # [B, Hq, S]
    lse = lse.to(work).masked_fill(torch.isinf(lse), 0.0)  # an empty row has no visible key: p = 0 anyway
    dq = torch.empty(B, S, Hq, D, dtype=work, device=q.device)
    dk = torch.zeros(B, S * G, D, dtype=work, device=q.device)  # rows (key, group), for index_add_
    dv = torch.zeros(B, S * G, D, dtype=work, device=q.device)
    gi = torch.arange(G, device=q.device)[None, :, None]
    for b in range(B):
        kf, vf = k[b].to(work), v[b].to(work)
        for c0 in range(0, S, chunk):
            sel = selected[b, c0:c0 + chunk].long()  # [C, G, topk]
            C = sel.shape[0]
            kg, key_pos = gathered_blocks(kf, sel, block_size)  # [C, G, L, D], [C, G, L]
            vg, _ = gathered_blocks(vf, sel, block_size)
            t = torch.arange(c0, c0 + C, device=q.device)
            visible = (key_pos >= 0) & (key_pos <= t[:, None, None])  # [C, G, L]
            qc = q[b, c0:c0 + C].to(work).view(C, G, hpg, D)
            doc = do[b, c0:c0 + C].to(work).view(C, G, hpg, D)
            lse_c = lse[b, :, c0:c0 + C].T.reshape(C, G, hpg)
            delta_c = delta[b, :, c0:c0 + C].T.reshape(C, G, hpg)
            s = torch.einsum("cghd,cgld->cghl", qc, kg) * scale
            p = torch.exp(s - lse_c[..., None]).masked_fill(~visible[:, :, None, :], 0.0)
            dp = torch.einsum("cghd,cgld->cghl", doc, vg)
            ds = p * (dp - delta_c[..., None])
            dq[b, c0:c0 + C] = (torch.einsum("cghl,cgld->cghd", ds, kg) * scale).reshape(C, Hq, D)
            rows = (key_pos.clamp(min=0) * G + gi).flatten()  # (key, group) row of every gathered key
            keep = visible.flatten()
            dk[b].index_add_(0, rows[keep], (torch.einsum("cghl,cghd->cgld", ds, qc) * scale).flatten(0, 2)[keep])
            dv[b].index_add_(0, rows[keep], torch.einsum("cghl,cghd->cgld", p, doc).flatten(0, 2)[keep])
    return dq.to(q.dtype), dk.view(B, S, G, D).to(k.dtype), dv.view(B, S, G, D).to(v.dtype)
