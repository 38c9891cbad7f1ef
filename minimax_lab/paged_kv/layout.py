"""The paged KV layout every paged kernel shares, and the one place its inputs are checked.

Layout (vLLM's, Kwon et al. 2023, arXiv 2309.06180)::

    k_cache, v_cache  [num_pages, page_size, Hkv, D]   one float dtype, any strides
    block_table       int32 [B, max_pages]             sequence b's token t is in page
                                                       block_table[b, t // page_size], slot t % page_size;
                                                       -1 = no page
    seq_lens          int32 [B]                        tokens cached per sequence

FP8 caches (e4m3): ``k_cache, v_cache`` of dtype ``float8_e4m3fn`` come with fp32 scales
``k_scale, v_scale`` (the stored value is ``cache * scale``), power-of-two scales from
:func:`minimax_lab.fp8.quantize_fp8`, in one of two layouts:

    per token and kv head   [num_pages, page_size, Hkv]   quantize_fp8(cache, dims=(-1,))
    per page and kv head    [num_pages, Hkv]              quantize_fp8(cache, dims=(1, 3))

Writers (:func:`minimax_lab.paged_kv.write.write_kv`) keep per-token scales only: a new token
cannot change the scale of the tokens already in its page. The readers take both; a per-page
scale reaches the kernels as a per-token one whose token stride is 0 (:func:`token_scales`), so
one kernel serves both layouts.

Used by :func:`minimax_lab.paged_kv.decode.paged_decode`, :func:`minimax_lab.paged_kv.prefill.paged_prefill`
and :func:`minimax_lab.attention.msa.msa_decode_paged` (whose extra ``k_idx_cache
[num_pages, page_size, D_idx]`` is paged by the same table).

Two levels of checking:

* **Layout** (always; nothing read from the device): ranks, shapes, dtypes, devices.
* **Values** (``check_values=True``, the default): ``seq_lens`` in ``[min_len, max_pages * page_size]``,
  every ``block_table`` entry a page id in ``[0, num_pages)`` or ``-1``, and no ``-1`` among the
  pages a sequence's length reaches. This reads a small tensor back to the host (a device
  sync), so a hot decode loop or a CUDA graph passes ``check_values=False``. The Triton kernels
  then **clamp** every page id into ``[0, num_pages)`` and every length into
  ``[0, max_pages * page_size]`` as they load them: out-of-range values give unspecified output,
  but never a read or write outside the tensors the kernel was given.
"""
from __future__ import annotations

import torch

from minimax_lab.fp8 import FP8, check_scales_given, dequantize_fp8
from minimax_lab.triton_blocks import interpreter_safe
from minimax_lab.validate import FLOAT_DTYPES, TRITON_DTYPES, check_same_device, check_tensor, check_triton_inputs

#: What a paged cache may hold: any float dtype, or FP8 (e4m3) with scales.
CACHE_DTYPES = FLOAT_DTYPES + (FP8,)


def check_kv_scales(k_cache, v_cache, k_scale, v_scale, *, per_page: bool = True) -> str | None:
    """Check the scales of a paged cache (see the module doc); the one check every paged entry uses.

    Returns ``None`` (no FP8: both caches of another dtype, no scales), ``"token"`` (scales
    ``[num_pages, page_size, Hkv]``) or ``"page"`` (``[num_pages, Hkv]``; refused with
    ``per_page=False``, the writers' setting). ``k_scale`` and ``v_scale`` must share a layout,
    be fp32 and live on the caches' device. Raises ``TypeError``/``ValueError`` naming the
    expected shape: FP8 caches without scales, scales with other caches, a wrong shape, dtype or
    device. The caches' own shapes are checked by the caller.
    """
    P, ps, Hkv = k_cache.shape[:3]
    tok, page = f"[num_pages={P}, page_size={ps}, Hkv={Hkv}]", f"[num_pages={P}, Hkv={Hkv}]"
    expect = f"fp32 {tok} (one scale per token and kv head)" + (
        f" or fp32 {page} (one per page and kv head)" if per_page else "")
    how = "quantize_fp8(cache, dims=(-1,))" + (" or dims=(1, 3)" if per_page else "")
    if not check_scales_given(k_cache, "k_cache", "caches", {"k_scale": k_scale, "v_scale": v_scale},
                              expect=f"k_scale and v_scale: {expect}; make them with {how}"):
        return None
    layout = None
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        check_tensor(scale, name)
        if scale.ndim == 2 and tuple(scale.shape) == (P, Hkv) and not per_page:
            raise ValueError(f"{name} is per page {page}, but writing needs one scale per token {tok}: a new "
                             f"token cannot change the scale of the tokens already in its page")
        this = "token" if tuple(scale.shape) == (P, ps, Hkv) else "page" if (
            per_page and tuple(scale.shape) == (P, Hkv)) else None
        if this is None:
            raise ValueError(f"{name} must have shape {tok}" + (f" or {page}" if per_page else "")
                             + f", got {list(scale.shape)}")
        if layout is not None and this != layout:
            raise ValueError(f"k_scale and v_scale must share one layout, got k_scale {list(k_scale.shape)} "
                             f"and v_scale {list(v_scale.shape)}")
        layout = this
        if scale.dtype != torch.float32:
            raise ValueError(f"{name} must be {expect}, got dtype {str(scale.dtype).replace('torch.', '')}")
        if scale.device != k_cache.device:
            raise ValueError(f"{name} must be on the caches' device {k_cache.device}, got {scale.device}")
    return layout


def token_scales(scale: torch.Tensor, page_size: int) -> torch.Tensor:
    """A checked scale as per token and kv head, ``[num_pages, page_size, Hkv]``: a per-token
    scale unchanged, a per-page ``[num_pages, Hkv]`` one as a view whose token stride is 0."""
    if scale.ndim == 3:
        return scale
    return scale[:, None, :].expand(scale.shape[0], page_size, scale.shape[1])


def dequantize_kv(cache: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values an FP8 cache stores, ``cache * scale`` in ``dtype`` (exact in fp32); a cache
    without a scale comes back unchanged. ``scale`` is a checked one (either layout)."""
    if scale is None:
        return cache
    return dequantize_fp8(cache, token_scales(scale, cache.shape[1]), dims=(-1,), dtype=dtype)


def check_paged_layout(k_cache, v_cache, block_table, seq_lens, *, batch: int | None = None, min_len: int = 0,
                       check_values: bool = True, k_idx_cache=None, k_scale=None,
                       v_scale=None) -> tuple[int, int, int, int, int]:
    """Check the paged layout (and, with ``check_values``, its contents; see the module doc).

    ``batch`` (if given) is the number of sequences the caller's queries hold; ``min_len`` the
    least ``seq_lens`` may be (e.g. the number of query tokens already in the cache). FP8 caches
    need ``k_scale``/``v_scale`` (:func:`check_kv_scales`, either layout).
    Returns ``(num_pages, page_size, Hkv, D, max_pages)``; raises ``TypeError``/``ValueError``.
    """
    check_tensor(k_cache, "k_cache", ndim=4, dtypes=CACHE_DTYPES)
    P, ps, Hkv, D = k_cache.shape
    check_tensor(v_cache, "v_cache", shape=[P, ps, Hkv, D], dtypes=(k_cache.dtype,))
    if P < 1 or ps < 1 or Hkv < 1 or D < 1:
        raise ValueError(f"k_cache needs non-empty dims [num_pages, page_size, Hkv, D], got {list(k_cache.shape)}")
    check_tensor(block_table, "block_table", ndim=2, dtypes=(torch.int32,))
    B, max_pages = block_table.shape
    if batch is not None and B != batch:
        raise ValueError(f"block_table must have {batch} rows (one per sequence), got {B}")
    check_tensor(seq_lens, "seq_lens", shape=[B], dtypes=(torch.int32,))
    if k_idx_cache is not None:
        check_tensor(k_idx_cache, "k_idx_cache", ndim=3, dtypes=FLOAT_DTYPES + (torch.float8_e4m3fn,))
        if tuple(k_idx_cache.shape[:2]) != (P, ps) or k_idx_cache.shape[2] < 1:
            raise ValueError(f"k_idx_cache must have shape [num_pages={P}, page_size={ps}, D_idx >= 1], "
                             f"got {list(k_idx_cache.shape)}")
    check_same_device(k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens,
                      k_idx_cache=k_idx_cache)
    check_kv_scales(k_cache, v_cache, k_scale, v_scale)
    if check_values:
        check_paged_values(block_table, seq_lens, num_pages=P, page_size=ps, min_len=min_len)
    return P, ps, Hkv, D, max_pages


def check_paged_values(block_table: torch.Tensor, seq_lens: torch.Tensor, *, num_pages: int, page_size: int,
                       min_len: int = 0) -> None:
    """The value checks of :func:`check_paged_layout` (their statistics come back to the host together)."""
    B, max_pages = block_table.shape
    if B == 0:
        return
    lens = seq_lens.long()
    table = block_table.long()
    pages_used = (lens.clamp(min=0) + page_size - 1) // page_size
    used = torch.arange(max_pages, device=table.device)[None, :] < pages_used[:, None]
    no_page = torch.zeros((), dtype=torch.long, device=table.device)
    stats = torch.stack([lens.min(), lens.max(), table.min() if table.numel() else no_page - 1,
                         table.max() if table.numel() else no_page - 1, (used & (table < 0)).any().long()])
    lo, hi, page_lo, page_hi, hole = stats.tolist()  # the one device sync
    if lo < min_len or hi > max_pages * page_size:
        raise ValueError(f"seq_lens must lie in [{min_len}, max_pages * page_size = {max_pages * page_size}], "
                         f"got values in [{lo}, {hi}]")
    if page_lo < -1 or page_hi >= num_pages:
        raise ValueError(f"block_table entries must be page ids in [0, {num_pages}) or -1, got values in "
                         f"[{page_lo}, {page_hi}]")
    if hole:
        raise ValueError("block_table has -1 (no page) inside a sequence's seq_lens tokens")


def gather_sequence(cache: torch.Tensor, block_table: torch.Tensor, b: int, length: int) -> torch.Tensor:
    """The first ``length`` tokens of sequence ``b`` from a paged cache ``[num_pages, page_size, ...]``:
    ``[length, ...]`` (a copy). For checked inputs only (no -1 among the pages it reads)."""
    ps = cache.shape[1]
    n_pages = (length + ps - 1) // ps
    pages = block_table[b, :n_pages].long()
    return cache[pages].reshape(n_pages * ps, *cache.shape[2:])[:length]


def gather_pages(cache: torch.Tensor, scale: torch.Tensor | None, pages: torch.Tensor,
                 dtype: torch.dtype) -> torch.Tensor:
    """``cache[pages]`` (``pages`` int64 of any shape -> ``[*pages.shape, page_size, Hkv, D]``, a
    copy); an FP8 cache's pages come back dequantized to ``dtype`` with their scales gathered the
    same way (a cache without a scale keeps its dtype)."""
    if scale is None:
        return cache[pages]
    return (cache[pages].float() * token_scales(scale, cache.shape[1])[pages][..., None]).to(dtype)


def paged_triton_operands(q, k_cache, v_cache, block_table, *small):
    """Ready the operands of a paged Triton kernel, copying nothing the size of the cache.

    Checks :func:`minimax_lab.validate.check_triton_inputs` (kernel device, fp16/bf16/fp32 --
    or FP8 caches --, no autograd) and ``head_dim <= 256``; computes bf16 in fp32 under the
    interpreter; casts ``q`` to the cache's dtype, except for FP8 caches: their tiles are upcast to
    q's dtype in the kernel (e4m3 values are exact in fp16, bf16 and fp32). The caches keep their strides (the kernels take all four, so a cache
    strided along ``head_dim`` is read in place -- a stride of 1 is specialised by Triton and
    costs nothing). The small operands -- ``q``, ``block_table`` and any further index tensors in
    ``small`` (``seq_lens``, ``q_lens``; ``None`` stays ``None``) -- are made unit-stride, as the
    kernels index them densely. Returns ``(q, k_cache, v_cache, block_table, *small)``.
    """
    check_triton_inputs(q=q)
    check_triton_inputs(float_dtypes=TRITON_DTYPES + (FP8,), k_cache=k_cache, v_cache=v_cache)
    if q.shape[-1] > 256:
        raise ValueError(f"head_dim must be <= 256 for the Triton kernel, got {q.shape[-1]}")
    q, k_cache, v_cache = interpreter_safe(q, k_cache, v_cache)
    if k_cache.dtype != q.dtype and k_cache.dtype != FP8:
        q = q.to(k_cache.dtype)
    dense = lambda t: t if t is None or t.is_contiguous() else t.contiguous()  # noqa: E731
    return (dense(q), k_cache, v_cache, dense(block_table), *(dense(t) for t in small))


def kv_scale_operands(k_cache, k_scale, v_scale) -> tuple:
    """The scale operands of a paged Triton kernel: ``(k_scale, v_scale, (k page, token, head
    strides), (v strides), fp8)``. Without FP8 the caches stand in as (unused) pointers with
    zero strides. A per-page scale passes a token stride of 0 (:func:`token_scales`): the kernel
    loads one scale per token either way."""
    if k_scale is None:
        return k_cache, k_cache, (0, 0, 0), (0, 0, 0), False
    check_triton_inputs(k_scale=k_scale, v_scale=v_scale)
    ps = k_cache.shape[1]
    ks, vs = token_scales(k_scale, ps), token_scales(v_scale, ps)
    return ks, vs, tuple(ks.stride()), tuple(vs.stride()), True
