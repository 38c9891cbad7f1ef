"""Attention over the paged KV cache for one engine step: the package's paged kernels, per layer.

A step is a flat batch of ``N`` tokens (:class:`StepBatch`): first ``n_decode`` decode tokens
(one per running sequence), then prompt chunks (:class:`PrefillSpan`), each a run of new tokens
of one sequence at positions ``start .. start + length``. For every layer,
:class:`StepAttention` does:

1. **write** -- all ``N`` new K/V into their pages with :func:`minimax_lab.paged_kv.write_kv`
   (slots from the block manager), and for an MSA layer the index keys into the index-key pages
   (paged by the same block table). Every write of a layer comes before every read of that layer,
   so tokens of one step see each other's K/V.
2. **decode rows** -- dense layers :func:`minimax_lab.paged_kv.paged_decode`, MSA layers
   :func:`minimax_lab.attention.msa_decode_paged` (block = page), all decode rows in one call.
3. **prompt chunks**, one call per chunk -- dense layers :func:`minimax_lab.paged_kv.paged_prefill`
   over the whole cached prefix; MSA layers :func:`minimax_lab.attention.msa_attention` on the
   chunk's own K/V when the chunk starts the sequence, else :func:`msa_prefill_paged` (below).

``impl`` comes from :class:`~minimax_lab.engine.options.EngineOptions` (``paged_impl`` for the
dense kernels and the writes, ``msa_impl`` for MSA). With an FP8 cache (``kv_dtype="fp8_e4m3"``)
``write_kv`` quantizes K and V per token and head and every read passes the scales; the index keys
are quantized per token. The PyTorch implementations materialise
scores, so long chunks go through them in blocks of query rows (:func:`query_rows`) to bound
memory; the Triton ones take a chunk whole. The engine's own block tables are trusted: the
kernels run with ``check_values=False`` (no device sync; the Triton kernels clamp page ids, so
even a wrong table could not read outside the cache).

:func:`msa_prefill_paged` -- sparse attention for a chunk of new tokens over a cached prefix --
is what MSA's public entry points lack: ``msa_attention`` wants every query from position 0 and
the keys contiguous; ``msa_decode_paged`` takes the *last* ``T`` tokens of each sequence. It is
built from ``msa_decode_paged`` alone, two ways with one result (the contract's):

* ``impl="triton"``: token ``i`` of the chunk is the last token of a sequence of length
  ``start + i + 1`` sharing the chunk's block table -- so the chunk is a *batch* of ``T``
  one-token decodes, one launch of the paged index and attention kernels for the whole chunk;
* ``"torch"``/``"reference"``: blocks of query rows ``[i, j)`` as the last ``j - i`` tokens of
  a sequence of length ``start + j`` (their memory grows with rows x context).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minimax_lab.attention import msa_attention, msa_decode_paged
from minimax_lab.engine.config import M3Config
from minimax_lab.engine.precision import fake_quantize
from minimax_lab.fp8 import FP8, quantize_fp8
from minimax_lab.kvcache import KVPages
from minimax_lab.paged_kv import paged_decode, paged_prefill, write_kv

#: score elements (rows x keys x heads) one PyTorch-impl call may materialise (2**30: 2 GiB in bf16)
SCORE_BUDGET = 2**30
#: query rows of one Triton ``msa_prefill_paged`` launch (its block table is copied per row)
TRITON_MSA_ROWS = 4096


class PagedKVCache:
    """The engine's KV memory: ``KVPages`` of every layer (``[n_layers, P + 1, page, Hkv, D]``) and
    the index-key pages of the MSA layers (``index_keys [n_sparse, P + 1, page, D_idx]``).

    ``P = num_pages`` pages belong to the block manager; page ``P`` (:attr:`scratch_page`) is
    never handed out: padding rows of a CUDA-graph batch write and read there. The cache is the
    ``kv`` the block manager copies pages of (copy-on-write after ``fork``): :attr:`k` shows it
    the ``P`` managed pages and :meth:`copy_page` copies K, V, index keys (and scales).

    ``kv_dtype="fp8_e4m3"``: K, V and index keys are ``float8_e4m3fn``, with fp32 scales
    ``k_scale, v_scale [n_layers, P + 1, page, Hkv]`` (per token and head) and
    ``index_scale [n_sparse, P + 1, page]`` (per token); ``None``: the model's dtype, no scales."""

    def __init__(self, cfg: M3Config, num_pages: int, *, device, kv_dtype: str | None = None):
        self.cfg = cfg
        self.num_pages = num_pages
        self.scratch_page = num_pages
        self.fp8 = kv_dtype is not None
        ps = cfg.block_size
        dtype = FP8 if self.fp8 else cfg.torch_dtype
        self.pages = KVPages.allocate(cfg.n_layers, num_pages + 1, ps, cfg.n_kv_heads, cfg.head_dim,
                                      dtype=dtype, device=device)
        self.sparse_index = {layer: i for i, layer in enumerate(cfg.sparse_layers)}
        self.index_keys = torch.zeros(len(cfg.sparse_layers), num_pages + 1, ps, cfg.d_idx, dtype=dtype,
                                      device=device)
        self.k_scale = self.v_scale = self.index_scale = None
        if self.fp8:
            scale = lambda *shape: torch.ones(shape, dtype=torch.float32, device=device)  # noqa: E731
            self.k_scale = scale(cfg.n_layers, num_pages + 1, ps, cfg.n_kv_heads)
            self.v_scale = scale(cfg.n_layers, num_pages + 1, ps, cfg.n_kv_heads)
            self.index_scale = scale(len(cfg.sparse_layers), num_pages + 1, ps)

    @property
    def page_size(self) -> int:
        return self.cfg.block_size

    @property
    def k(self) -> torch.Tensor:
        """K pages of every layer, the managed ones: ``[n_layers, P, page, Hkv, D]`` (a view)."""
        return self.pages.k[:, :self.num_pages]

    def copy_page(self, src: int, dst: int) -> None:
        """Copy page ``src`` to ``dst`` in every layer: K, V, index keys and their scales."""
        self.pages.copy_page(src, dst)
        self.index_keys[:, dst].copy_(self.index_keys[:, src])
        for t in (self.k_scale, self.v_scale, self.index_scale):
            if t is not None:
                t[:, dst].copy_(t[:, src])

    def tensors(self) -> list:
        """Every tensor that holds a page (page index on dim 1): K, V, index keys, FP8 scales."""
        ts = [self.pages.k, self.pages.v, self.index_keys, self.k_scale, self.v_scale, self.index_scale]
        return [t for t in ts if t is not None]

    def read_pages(self, pages: list) -> list:
        """Host copies of ``pages`` (every layer, with index keys and scales): one tensor per pool
        tensor, page index first; pinned host memory when the cache is on a GPU."""
        idx = torch.as_tensor(pages, dtype=torch.long, device=self.pages.k.device)
        out = []
        for t in self.tensors():
            part = t.index_select(1, idx).transpose(0, 1)
            if part.device.type == "cuda":
                host = torch.empty(part.shape, dtype=part.dtype, pin_memory=True)
                out.append(host.copy_(part))
            else:
                out.append(part.to("cpu", copy=True) if part.device.type != "meta" else part)
        return out

    def write_pages(self, pages: list, data: list) -> None:
        """Copy ``data`` (from :meth:`read_pages`, possibly sliced to ``len(pages)``) into ``pages``."""
        idx = torch.as_tensor(pages, dtype=torch.long, device=self.pages.k.device)
        for t, part in zip(self.tensors(), data):
            src = part.transpose(0, 1).to(t.device, non_blocking=True)
            if t.dtype == FP8:   # index_copy_ has no float8 kernel: copy the bytes
                t, src = t.view(torch.uint8), src.view(torch.uint8)
            t.index_copy_(1, idx, src)

    def page_bytes(self) -> int:
        """Bytes one page takes in every layer: K, V, index keys and FP8 scales."""
        return sum(t[:, 0].numel() * t.element_size() for t in self.tensors())

    def layer(self, i: int):
        """``(k_pages, v_pages)`` of layer ``i``: ``[P + 1, page, Hkv, D]`` views."""
        return self.pages.layer(i)

    def scales(self, i: int) -> dict:
        """The FP8 scales of layer ``i`` as keyword arguments of the paged kernels
        (``{"k_scale": [P + 1, page, Hkv], "v_scale": ...}``); ``{}`` for a cache in the model's dtype."""
        return {"k_scale": self.k_scale[i], "v_scale": self.v_scale[i]} if self.fp8 else {}

    def index_pages(self, i: int) -> torch.Tensor:
        """Index-key pages ``[P + 1, page, D_idx]`` of MSA layer ``i``."""
        return self.index_keys[self.sparse_index[i]]

    def index_scales(self, i: int) -> torch.Tensor | None:
        """The index keys' FP8 scales ``[P + 1, page]`` of MSA layer ``i`` (``None`` without FP8)."""
        return None if self.index_scale is None else self.index_scale[self.sparse_index[i]]

    def write_index(self, i: int, slots: torch.Tensor, k_idx: torch.Tensor) -> None:
        """Store MSA layer ``i``'s index keys ``k_idx [N, D_idx]`` at ``slots [N]`` (quantized per
        token when the cache is FP8)."""
        pages = self.index_pages(i).view(-1, self.cfg.d_idx)
        if not self.fp8:
            pages.index_copy_(0, slots, k_idx.to(pages.dtype))
            return
        k8, scale = quantize_fp8(k_idx, dims=(-1,), check_values=False)
        # byte views: index_copy_ has no float8 kernel, and a byte copy is the same copy
        pages.view(torch.uint8).index_copy_(0, slots, k8.view(torch.uint8))
        self.index_scales(i).view(-1).index_copy_(0, slots, scale)

    @property
    def nbytes(self) -> int:
        """Bytes of the pool: K, V, index keys and (FP8) their scales."""
        return sum(t.numel() * t.element_size() for t in self.tensors())


@dataclass
class PrefillSpan:
    """A chunk of one sequence's prompt in a step: rows ``offset .. offset + length`` of the flat
    batch hold its tokens at positions ``start .. start + length``; ``block_table int32 [1, pages]``
    and ``seq_len int32 [1] = start + length`` describe its cache."""

    offset: int
    start: int
    length: int
    block_table: torch.Tensor
    seq_len: torch.Tensor


@dataclass
class StepBatch:
    """The inputs of one step (see the module docstring): ``input_ids``, ``positions``, ``slots``
    (int64 ``[N]``; slot = page * page_size + offset), the decode rows' ``decode_block_table``
    (int32 ``[n_decode, max_pages]``) and ``decode_seq_lens`` (int32 ``[n_decode]``, the new token
    included), the prompt chunks, the image patches (``patches [n, d]`` for flat rows
    ``patch_rows``) and the rows whose logits the step returns (``None``: all)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    n_decode: int = 0
    decode_block_table: torch.Tensor | None = None
    decode_seq_lens: torch.Tensor | None = None
    prefills: list = field(default_factory=list)
    patches: torch.Tensor | None = None
    patch_rows: torch.Tensor | None = None
    logit_rows: torch.Tensor | None = None


def query_rows(n_queries: int, work_per_row: int, budget: int = SCORE_BUDGET) -> int:
    """How many query rows a PyTorch-impl call takes so rows x ``work_per_row`` stays within ``budget``."""
    return max(1, min(n_queries, budget // max(1, work_per_row)))


def _given(**kw) -> dict:
    """The keyword arguments that are not ``None`` (the FP8 scales, passed only for an FP8 cache)."""
    return {k: v for k, v in kw.items() if v is not None}


def msa_prefill_paged(q, k_cache, v_cache, block_table, start: int, q_idx, k_idx_cache, *, topk: int,
                      impl: str = "torch", scale: float | None = None, k_scale=None, v_scale=None,
                      k_idx_scale=None) -> torch.Tensor:
    """MSA for a chunk of ``T`` new tokens at positions ``start .. start + T`` whose K/V and index
    keys are already in the paged cache (see the module docstring).

    ``q [T, Hq, D]``, ``q_idx [T, G, D_idx]``, ``k_cache, v_cache [P, page, G, D]``,
    ``k_idx_cache [P, page, D_idx]``, ``block_table int32 [1, pages]`` covering ``start + T``
    tokens. Returns ``[T, Hq, D]`` in q's dtype: each token attends, by MSA's rule, to the
    ``topk`` blocks (pages) its index query selects among the blocks it can see. An FP8 cache
    passes its scales (``k_scale``, ``v_scale`` ``[P, page, G]``, ``k_idx_scale [P, page]``) as
    :func:`~minimax_lab.attention.msa_decode_paged` takes them."""
    T, Hq, D = q.shape
    fp8 = _given(k_scale=k_scale, v_scale=v_scale, k_idx_scale=k_idx_scale)
    if T == 0:
        return q.new_empty(q.shape)
    dev = q.device
    if impl == "triton":
        outs = []
        for i in range(0, T, TRITON_MSA_ROWS):
            j = min(T, i + TRITON_MSA_ROWS)
            lens = torch.arange(start + i + 1, start + j + 1, dtype=torch.int32, device=dev)
            outs.append(msa_decode_paged(q[i:j], k_cache, v_cache, block_table.expand(j - i, -1), lens, q_idx[i:j],
                                         k_idx_cache, topk=topk, impl="triton", scale=scale, check_values=False,
                                         **fp8))
        return torch.cat(outs) if len(outs) > 1 else outs[0]
    G, page = k_cache.shape[2], k_cache.shape[1]
    per_row = max(G * (start + T), G * topk * page * D)
    rows = query_rows(T, per_row)
    outs = []
    for i in range(0, T, rows):
        j = min(T, i + rows)
        lens = torch.tensor([start + j], dtype=torch.int32, device=dev)
        outs.append(msa_decode_paged(q[None, i:j], k_cache, v_cache, block_table, lens, q_idx[None, i:j], k_idx_cache,
                                     topk=topk, impl=impl, scale=scale, **fp8)[0])
    return torch.cat(outs) if len(outs) > 1 else outs[0]


def dense_prefill_paged(q, k_cache, v_cache, block_table, start: int, *, impl: str, k_scale=None,
                        v_scale=None) -> torch.Tensor:
    """Causal attention for a chunk ``q [T, Hq, D]`` at positions ``start .. start + T`` over the
    paged cache (prefix and chunk): :func:`minimax_lab.paged_kv.paged_prefill`, in blocks of query
    rows for the PyTorch implementations (an FP8 cache passes its scales). Returns ``[T, Hq, D]``."""
    fp8 = _given(k_scale=k_scale, v_scale=v_scale)
    T, Hq, _ = q.shape
    dev = q.device
    rows = T if impl == "triton" else query_rows(T, Hq * (start + T))
    outs = []
    for i in range(0, T, rows):
        j = min(T, i + rows)
        lens = torch.tensor([start + j], dtype=torch.int32, device=dev)
        outs.append(paged_prefill(q[None, i:j], k_cache, v_cache, block_table, lens, impl=impl, check_values=False,
                                  **fp8)[0])
    return torch.cat(outs) if len(outs) > 1 else outs[0]


class StepAttention:
    """``attend(layer, q, k, v, q_idx, k_idx) -> [N, Hq, D]`` for one :class:`StepBatch` (module docstring)."""

    def __init__(self, cfg: M3Config, cache: PagedKVCache, batch: StepBatch, *, msa_impl: str, paged_impl: str):
        self.cfg, self.cache, self.batch = cfg, cache, batch
        self.msa_impl, self.paged_impl = msa_impl, paged_impl

    def __call__(self, layer: int, q, k, v, q_idx, k_idx) -> torch.Tensor:
        b, cfg, cache = self.batch, self.cfg, self.cache
        k_pages, v_pages = cache.layer(layer)
        kv_scales = cache.scales(layer)            # {} unless the cache is FP8
        write_kv(k, v, k_pages, v_pages, b.slots, impl=self.paged_impl, check_values=False, **kv_scales)
        sparse = q_idx is not None
        if sparse:
            idx_pages, idx_scale = cache.index_pages(layer), cache.index_scales(layer)
            cache.write_index(layer, b.slots, k_idx)
            idx_kw = _given(k_idx_scale=idx_scale)
        parts = []
        nd = b.n_decode
        if nd:
            if sparse:
                parts.append(msa_decode_paged(q[:nd], k_pages, v_pages, b.decode_block_table, b.decode_seq_lens,
                                              q_idx[:nd], idx_pages, topk=cfg.topk, impl=self.msa_impl,
                                              check_values=False, **kv_scales, **idx_kw))
            else:
                parts.append(paged_decode(q[:nd], k_pages, v_pages, b.decode_block_table, b.decode_seq_lens,
                                          impl=self.paged_impl, check_values=False, **kv_scales))
        for s in b.prefills:
            rows = slice(s.offset, s.offset + s.length)
            if not sparse:
                parts.append(dense_prefill_paged(q[rows], k_pages, v_pages, s.block_table, s.start,
                                                 impl=self.paged_impl, **kv_scales))
            elif s.start == 0:  # the chunk is the sequence so far: MSA's prefill on its own K/V
                kr, vr, kir = k[rows], v[rows], k_idx[rows]
                if cache.fp8:   # what the cache holds (precision.fake_quantize), as every later chunk reads
                    kr, vr, kir = fake_quantize(kr), fake_quantize(vr), fake_quantize(kir)
                parts.append(msa_attention(q[None, rows], kr[None], vr[None], q_idx[None, rows], kir[None],
                                           block_size=cfg.block_size, topk=cfg.topk, impl=self.msa_impl)[0])
            else:
                parts.append(msa_prefill_paged(q[rows], k_pages, v_pages, s.block_table, s.start, q_idx[rows],
                                               idx_pages, topk=cfg.topk, impl=self.msa_impl, **kv_scales,
                                               k_idx_scale=idx_scale))
        return torch.cat(parts) if len(parts) > 1 else parts[0]
