"""MiniMax Sparse Attention in vectorized PyTorch: gather-based and chunked so 64k fits.

Same contract as :mod:`.msa_reference` (read that first). Three pieces:

* :func:`select_from_scores` -- the selection rule for a whole tensor of block scores at once.
  ``torch.topk`` does not promise an order among equal values, so each score is turned into one
  int64 key (:func:`minimax_lab.triton_blocks.topk_key_torch`, the twin of the Triton kernels'
  key): a larger key is a higher score, and among equal scores the lower block id. ``topk`` on
  the keys is then exact and deterministic.
* :func:`msa_select_torch` -- block scores by a matmul over query chunks, max-pooled per block.
* :func:`msa_attention_torch` -- per query chunk, gather the selected K/V blocks
  ``[C, G, topk * Bk, D]`` and run an fp32 softmax over them.
* :func:`msa_decode_paged_torch` -- the same for queries at the end of paged sequences.
"""
from __future__ import annotations

import math

import torch

from minimax_lab.paged_kv.layout import token_scales
from minimax_lab.triton_blocks import ID_BITS, KEY_MIN, topk_key_torch  # noqa: F401  (ID_BITS: msa.py reads it here)
from minimax_lab.validate import accumulate_dtype


def select_from_scores(scores: torch.Tensor, positions: torch.Tensor, block_size: int, topk: int) -> torch.Tensor:
    """Selection rule, vectorized. ``scores [..., n_blocks]`` fp32 (entries for blocks at or
    after a row's local block are ignored), ``positions`` int, broadcastable to
    ``scores.shape[:-1]``. Returns int32 ``[..., topk]``."""
    nb = scores.shape[-1]
    device = scores.device
    positions = torch.as_tensor(positions, device=device).expand(scores.shape[:-1])
    local = (positions // block_size).long()  # [...]
    ids = torch.arange(nb, device=device)
    eligible = ids < local[..., None]
    key = topk_key_torch(scores, ids).masked_fill(~eligible, KEY_MIN)
    k1 = min(topk - 1, nb)
    best = key.topk(k1, dim=-1, sorted=True).indices if k1 > 0 else ids.new_empty(*key.shape[:-1], 0)
    sparse = torch.cat([best, local[..., None]], dim=-1)  # rows with n > topk
    slot = torch.arange(topk, device=device)
    if sparse.shape[-1] < topk:  # only possible when nb < topk - 1: then every row selects all
        sparse = torch.nn.functional.pad(sparse, (0, topk - sparse.shape[-1]), value=-1)
    all_vis = torch.where(slot < (local[..., None] + 1), slot, -1)  # rows with n <= topk
    out = torch.where((local + 1 <= topk)[..., None], all_vis, sparse)
    return out.to(torch.int32)


def block_scores_torch(q_idx, k_idx, block_size: int, *, q_start: int = 0, n_blocks: int | None = None,
                       chunk: int = 1024) -> torch.Tensor:
    """Block scores ``[B, Sq, G, n_blocks]`` fp32 for queries at positions ``q_start + i``
    against the key index ``k_idx [B, Skv, D_idx]``; causally masked, ``-inf`` where unseen."""
    B, Sq, G, Didx = q_idx.shape
    Skv = k_idx.shape[1]
    n_blocks = math.ceil(Skv / block_size) if n_blocks is None else n_blocks
    out = torch.full((B, Sq, G, n_blocks), float("-inf"), device=q_idx.device)
    kf = k_idx.float()
    for c0 in range(0, Sq, chunk):
        qc = q_idx[:, c0:c0 + chunk].float()
        t = q_start + c0 + torch.arange(qc.shape[1], device=q_idx.device)
        kmax = min(Skv, int(t[-1]) + 1)
        nbc = math.ceil(kmax / block_size)
        s = torch.einsum("btgd,bjd->btgj", qc, kf[:, :kmax]) / math.sqrt(Didx)
        s = s.masked_fill(torch.arange(kmax, device=q_idx.device) > t[:, None, None], float("-inf"))
        s = torch.nn.functional.pad(s, (0, nbc * block_size - kmax), value=float("-inf"))
        out[:, c0:c0 + chunk, :, :nbc] = s.view(*s.shape[:-1], nbc, block_size).amax(-1)
    return out


def msa_select_torch(q_idx, k_idx, *, block_size: int = 128, topk: int = 16, chunk: int = 1024):
    """Selected block ids ``int32 [B, S, G, topk]``, in query chunks (memory ~ chunk * S)."""
    B, S, G, _ = q_idx.shape
    out = torch.empty(B, S, G, topk, dtype=torch.int32, device=q_idx.device)
    for c0 in range(0, S, chunk):
        c1 = min(S, c0 + chunk)
        nb = math.ceil(c1 / block_size)
        scores = block_scores_torch(q_idx[:, c0:c1], k_idx[:, :c1], block_size, q_start=c0, n_blocks=nb)
        pos = torch.arange(c0, c1, device=q_idx.device)[None, :, None]
        out[:, c0:c1] = select_from_scores(scores, pos, block_size, topk)
    return out


def _gather_attend(q, k_blocks, v_blocks, key_pos, q_pos, scale):
    """q ``[N, G, hpg, D]``, k/v_blocks ``[N, G, L, D]``, key_pos ``[N, G, L]`` (-1 = none),
    q_pos ``[N]``: softmax over the gathered keys in fp32 (fp64 for fp64 inputs). Returns
    (o, lse) ``[N, G, hpg, ...]``; a row with no visible key gives o = 0, lse = -inf."""
    work = accumulate_dtype(q.dtype)
    s = torch.einsum("nghd,ngld->nghl", q.to(work), k_blocks.to(work)) * scale
    ok = (key_pos >= 0) & (key_pos <= q_pos[:, None, None])
    s = s.masked_fill(~ok[:, :, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.masked_fill(torch.isinf(lse), 0.0)[..., None])  # empty rows: 0, not NaN
    return torch.einsum("nghl,ngld->nghd", p, v_blocks.to(work)), lse


def msa_attention_torch(q, k, v, q_idx, k_idx, *, block_size: int = 128, topk: int = 16, scale=None,
                        return_lse: bool = False, selected=None, chunk: int = 256):
    """Gather-based sparse attention: ``o [B, S, Hq, D]`` in q's dtype (and ``lse [B, Hq, S]``)."""
    B, S, Hq, D = q.shape
    G = k.shape[2]
    hpg = Hq // G
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    if selected is None:
        selected = msa_select_torch(q_idx, k_idx, block_size=block_size, topk=topk)
    n_blocks = math.ceil(S / block_size)
    pad = n_blocks * block_size - S
    kb = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).view(B, n_blocks, block_size, G, D)
    vb = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).view(B, n_blocks, block_size, G, D)
    o = torch.empty_like(q)
    lse = torch.empty(B, Hq, S, dtype=accumulate_dtype(q.dtype), device=q.device)
    gi = torch.arange(G, device=q.device)
    offs = torch.arange(block_size, device=q.device)
    for b in range(B):
        for c0 in range(0, S, chunk):
            sel = selected[b, c0:c0 + chunk].long()  # [C, G, topk]
            C = sel.shape[0]
            safe = sel.clamp(min=0)
            kg = kb[b][safe, :, gi[None, :, None], :]  # [C, G, topk, Bk, D]
            vg = vb[b][safe, :, gi[None, :, None], :]
            key_pos = torch.where(sel[..., None] >= 0, safe[..., None] * block_size + offs, -1)
            key_pos = key_pos.masked_fill(key_pos >= S, -1)
            qc = q[b, c0:c0 + C].view(C, G, hpg, D)
            oc, lc = _gather_attend(qc, kg.flatten(2, 3), vg.flatten(2, 3), key_pos.flatten(2, 3),
                                    torch.arange(c0, c0 + C, device=q.device), scale)
            o[b, c0:c0 + C] = oc.reshape(C, Hq, D).to(q.dtype)
            lse[b, :, c0:c0 + C] = lc.reshape(C, Hq).T
    return (o, lse) if return_lse else o


# --------------------------------------------------------------------------- paged decode


def decode_positions(seq_lens: torch.Tensor, T: int) -> torch.Tensor:
    """Positions ``[B, T]`` of the last ``T`` cached tokens of each sequence (the queries)."""
    return seq_lens.long()[:, None] - T + torch.arange(T, device=seq_lens.device)


def paged_block_scores_torch(q_idx, k_idx_cache, block_table, seq_lens) -> torch.Tensor:
    """Block scores ``[B, T, G, max_pages]`` for decode queries ``q_idx [B, T, G, Didx]`` against
    the paged index keys ``k_idx_cache [num_pages, page_size, Didx]``."""
    B, T, G, Didx = q_idx.shape
    ps = k_idx_cache.shape[1]
    maxp = block_table.shape[1]
    pages = block_table.long().clamp(min=0)
    kk = k_idx_cache[pages].float()  # [B, maxp, ps, Didx]
    s = torch.einsum("btgd,bpsd->btgps", q_idx.float(), kk) / math.sqrt(Didx)
    key_pos = (torch.arange(maxp, device=q_idx.device)[:, None] * ps + torch.arange(ps, device=q_idx.device))
    pos = decode_positions(seq_lens, T)  # [B, T]
    visible = (key_pos[None, None] <= pos[:, :, None, None]) & (block_table[:, None, :, None] >= 0)
    s = s.masked_fill(~visible[:, :, None], float("-inf"))
    return s.amax(-1)


def msa_decode_select_torch(q_idx, k_idx_cache, block_table, seq_lens, *, topk: int) -> torch.Tensor:
    """Selected logical block ids ``int32 [B, T, G, topk]`` for decode queries."""
    ps = k_idx_cache.shape[1]
    scores = paged_block_scores_torch(q_idx, k_idx_cache, block_table, seq_lens)
    pos = decode_positions(seq_lens, q_idx.shape[1])[:, :, None]
    return select_from_scores(scores, pos, ps, topk)


def msa_decode_paged_torch(q, k_cache, v_cache, block_table, seq_lens, selected, *, scale=None, k_scale=None,
                           v_scale=None):
    """Sparse decode over pages: ``q [B, T, Hq, D]``, selection ``[B, T, G, topk]`` of logical
    blocks; returns ``[B, T, Hq, D]`` in q's dtype. FP8 caches (with checked ``k_scale``/``v_scale``,
    either layout) are dequantized page by page as the selected pages are gathered."""
    B, T, Hq, D = q.shape
    ps, G = k_cache.shape[1], k_cache.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    sel = selected.long()
    safe = sel.clamp(min=0)
    pages = torch.gather(block_table.long()[:, None, None, :].expand(B, T, G, -1), 3, safe).clamp(min=0)
    gi = torch.arange(G, device=q.device)[None, None, :, None]
    kg = k_cache[pages, :, gi, :]  # [B, T, G, topk, ps, D]
    vg = v_cache[pages, :, gi, :]
    if k_scale is not None:  # the selected pages' scales, gathered alike: [B, T, G, topk, ps]
        work = accumulate_dtype(q.dtype)
        kg = kg.to(work) * token_scales(k_scale, ps)[pages, :, gi][..., None]
        vg = vg.to(work) * token_scales(v_scale, ps)[pages, :, gi][..., None]
    key_pos = safe[..., None] * ps + torch.arange(ps, device=q.device)
    key_pos = torch.where(sel[..., None] >= 0, key_pos, -1)
    N = B * T
    pos = decode_positions(seq_lens, T).reshape(N)
    o, _ = _gather_attend(q.reshape(N, G, Hq // G, D), kg.reshape(N, G, -1, D), vg.reshape(N, G, -1, D),
                          key_pos.reshape(N, G, -1), pos, scale)
    return o.reshape(B, T, Hq, D).to(q.dtype)
