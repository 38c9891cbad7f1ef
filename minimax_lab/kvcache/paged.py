"""The paged KV layout every paged kernel shares, and the one place its inputs are checked.

Layout (vLLM's, Kwon et al. 2023, arXiv 2309.06180)::

    k_cache, v_cache  [num_pages, page_size, Hkv, D]   one float dtype, any strides
    block_table       int32 [B, max_pages]             sequence b's token t is in page
                                                       block_table[b, t // page_size], slot t % page_size;
                                                       -1 = no page
    seq_lens          int32 [B]                        tokens cached per sequence

Used by :func:`minimax_lab.kvcache.decode.paged_decode`, :func:`minimax_lab.kvcache.prefill.paged_prefill`
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

from minimax_lab.validate import FLOAT_DTYPES, check_same_device, check_tensor, check_triton_inputs, interpreter_safe


def check_paged_layout(k_cache, v_cache, block_table, seq_lens, *, batch: int | None = None, min_len: int = 0,
                       check_values: bool = True, k_idx_cache=None) -> tuple[int, int, int, int, int]:
    """Check the paged layout (and, with ``check_values``, its contents; see the module doc).

    ``batch`` (if given) is the number of sequences the caller's queries hold; ``min_len`` the
    least ``seq_lens`` may be (e.g. the number of query tokens already in the cache).
    Returns ``(num_pages, page_size, Hkv, D, max_pages)``; raises ``TypeError``/``ValueError``.
    """
    check_tensor(k_cache, "k_cache", ndim=4, dtypes=FLOAT_DTYPES)
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


def paged_triton_operands(q, k_cache, v_cache, block_table, *small):
    """Ready the operands of a paged Triton kernel, copying nothing the size of the cache.

    Checks :func:`minimax_lab.validate.check_triton_inputs` (kernel device, fp16/bf16/fp32, no
    autograd) and ``head_dim <= 256``; computes bf16 in fp32 under the interpreter; casts ``q``
    to the cache's dtype. The caches keep their strides (the kernels take all four, so a cache
    strided along ``head_dim`` is read in place -- a stride of 1 is specialised by Triton and
    costs nothing). The small operands -- ``q``, ``block_table`` and any further index tensors in
    ``small`` (``seq_lens``, ``q_lens``; ``None`` stays ``None``) -- are made unit-stride, as the
    kernels index them densely. Returns ``(q, k_cache, v_cache, block_table, *small)``.
    """
    check_triton_inputs(q=q, k_cache=k_cache, v_cache=v_cache)
    if q.shape[-1] > 256:
        raise ValueError(f"head_dim must be <= 256 for the Triton kernel, got {q.shape[-1]}")
    q, k_cache, v_cache = interpreter_safe(q, k_cache, v_cache)
    if k_cache.dtype != q.dtype:
        q = q.to(k_cache.dtype)
    dense = lambda t: t if t is None or t.is_contiguous() else t.contiguous()  # noqa: E731
    return (dense(q), k_cache, v_cache, dense(block_table), *(dense(t) for t in small))
