"""Solutions of chapter 06's exercises (``minimax_lab.exercises.ch06``)."""
from __future__ import annotations

import math
from collections import OrderedDict

import torch
import triton
import triton.language as tl

from minimax_lab.kvcache.blocks import page_hash
from minimax_lab.kvcache.eviction import EvictionPolicy


def page_and_offset(block_table: torch.Tensor, positions: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The i-th page of the sequence holds tokens [i * page_size, (i + 1) * page_size): the block
    table says which page of the pool that is."""
    positions = positions.long()
    page_ids = block_table.long()[positions // page_size]
    return page_ids, positions % page_size


def cached_prefix_pages(tokens: list[int], page_size: int, cached: dict) -> list[int]:
    """Walk the full pages in order, naming each from its parent's name; stop at the first miss
    (a hit must be a prefix: a later page's K/V was computed after every earlier token)."""
    pages, name = [], None
    for i in range(len(tokens) // page_size):
        name = page_hash(name, tokens[i * page_size:(i + 1) * page_size])
        if name not in cached:
            break
        pages.append(cached[name])
    return pages


class MyPolicy(EvictionPolicy):
    """Segmented LRU (Karedla et al. 1994): a block enters *probation*; a hit promotes it to the
    *protected* segment. Victims come from probation (its least recently used block) while the
    protected segment holds at most two thirds of the blocks, so a burst of one-off blocks (a
    fresh document, a long tool output) flushes other one-off blocks, not the prefixes that were
    reused."""

    name = "slru"

    def __init__(self, protected_share: float = 2 / 3):
        self.probation: OrderedDict = OrderedDict()
        self.protected: OrderedDict = OrderedDict()
        self.share = protected_share

    def insert(self, key, t, parent=None):
        if key not in self.protected:
            self.probation[key] = t
            self.probation.move_to_end(key)

    def touch(self, key, t):
        self.probation.pop(key, None)
        self.protected[key] = t
        self.protected.move_to_end(key)

    def remove(self, key):
        self.probation.pop(key, None)
        self.protected.pop(key, None)

    def evict(self):
        total = len(self.probation) + len(self.protected)
        if not total:
            raise KeyError("nothing to evict")
        if self.probation and (len(self.protected) <= self.share * total or not self.protected):
            return self.probation.popitem(last=False)[0]
        return self.protected.popitem(last=False)[0]

    def __len__(self):
        return len(self.probation) + len(self.protected)

    def __contains__(self, key):
        return key in self.probation or key in self.protected


@triton.jit
def _window_decode_kernel(Q, K, V, BT, LENS, O, scale, window,
                          stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_bt, stride_ob, stride_oh,
                          GROUP: tl.constexpr, PAGE: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    kv_head = h // GROUP
    L = tl.load(LENS + b)
    lo = tl.maximum(L - window, 0)             # the only change: the loop starts at the window
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_d).to(tl.float32)
    m = tl.full([], float("-inf"), tl.float32)
    l = tl.full([], 0.0, tl.float32)
    acc = tl.zeros([D], tl.float32)
    for start in range(lo, L, BLOCK_N):
        t = start + offs_n
        ok = t < L
        page = tl.load(BT + b * stride_bt + t // PAGE, mask=ok, other=0)
        row = page.to(tl.int64) * stride_kp + (t % PAGE) * stride_ks + kv_head * stride_kh
        k = tl.load(K + row[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        v = tl.load(V + row[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        s = tl.where(ok, tl.sum(k * q[None, :], 1) * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m - m_new)
        l = l * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)
    tl.store(O + b * stride_ob + h * stride_oh + offs_d, out.to(O.dtype.element_ty))


def sliding_window_paged_decode(q, k_cache, v_cache, block_table, seq_lens, window: int):
    """The chapter's small paged-decode kernel, its token loop starting at ``max(0, L - window)``
    instead of 0 (one program per sequence and query head; head_dim a power of two)."""
    B, Hq, D = q.shape
    _, page_size, Hkv, _ = k_cache.shape
    o = torch.empty_like(q)
    _window_decode_kernel[(B, Hq)](
        q, k_cache, v_cache, block_table, seq_lens, o, 1.0 / math.sqrt(D), int(window),
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=Hq // Hkv, PAGE=page_size, D=D, BLOCK_N=16)
    return o


def sliding_window_paged_decode_torch(q, k_cache, v_cache, block_table, seq_lens, window: int):
    """The same numbers in PyTorch, one sequence at a time (gather its window's pages, softmax):
    right, but no kernel of one's own, so exercise 06.3's checker refuses it."""
    B, Hq, D = q.shape
    page_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros_like(q)
    for b in range(B):
        L = int(seq_lens[b])
        t = torch.arange(max(0, L - int(window)), L, device=q.device)
        if t.numel() == 0:
            continue
        page = block_table[b, t // page_size].long()
        k = k_cache[page, t % page_size].repeat_interleave(Hq // Hkv, dim=1)   # [n, Hq, D]
        v = v_cache[page, t % page_size].repeat_interleave(Hq // Hkv, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].float(), k.float()) / math.sqrt(D)
        out[b] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v.float()).to(q.dtype)
    return out
