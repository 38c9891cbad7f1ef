"""Prefill over a cached prefix: new tokens attend causally to the prefix already in the paged
cache and to themselves -- the kernel behind prefix caching (a cache hit skips the prefix's
compute; only the new suffix runs).

Contract::

    paged_prefill(q, k_cache, v_cache, block_table, seq_lens, *, q_lens=None, scale=None, impl="torch",
                  k_scale=None, v_scale=None) -> o

* ``q [B, S, Hq, D]`` -- queries of up to ``S`` new tokens per sequence;
* ``k_cache, v_cache [num_pages, page_size, Hkv, D]``, ``block_table int32 [B, max_pages]``
  (-1 unused) -- the shared paged layout (see :mod:`.decode`). The new tokens' K/V are
  **already written** (:func:`minimax_lab.paged_kv.write.write_kv`), so
* ``seq_lens int32 [B]`` counts every cached token, prefix *and* new ones;
* ``q_lens int32 [B]`` (optional, default ``S`` for all) -- how many of the ``S`` rows of
  sequence ``b`` are real; ``q_lens[b] <= min(S, seq_lens[b])``;
* ``k_scale, v_scale`` -- only with ``float8_e4m3fn`` caches, either layout of :mod:`.paged`
  (per token and kv head, or per page and kv head); q keeps its dtype.

New token ``i < q_lens[b]`` sits at position ``p = seq_lens[b] - q_lens[b] + i`` and attends to
cached tokens ``0..p``. Rows ``i >= q_lens[b]`` (padding) come back as zeros. Returns
``o [B, S, Hq, D]`` in q's dtype (empty for ``B = 0`` or ``S = 0``); any strides. Bad input raises
``TypeError``/``ValueError`` as for :func:`minimax_lab.paged_kv.decode.paged_decode` (the checks of
:mod:`.paged`), plus ``q_lens`` out of range.

``impl`` (each a plain function of its own module): ``"reference"``
(:func:`.prefill_reference.paged_prefill_reference`, per sequence, gather + fp32 masked
softmax), ``"torch"``, the default (:func:`.prefill_torch.paged_prefill_torch`, gather every page
+ SDPA with a causal-offset mask), ``"triton"`` (:func:`.prefill_triton.paged_prefill_triton`,
the Triton kernel :mod:`.prefill_triton` describes).
"""
from __future__ import annotations

import torch

from minimax_lab.paged_kv.layout import check_paged_layout
from minimax_lab.paged_kv.prefill_reference import paged_prefill_reference
from minimax_lab.paged_kv.prefill_torch import paged_prefill_torch
from minimax_lab.paged_kv.prefill_triton import paged_prefill_triton
from minimax_lab.validate import FLOAT_DTYPES, IMPLS, check_choice, check_same_device, check_scale, check_tensor



def _check_prefill(q, k_cache, v_cache, block_table, seq_lens, q_lens, scale, impl, check_values, k_scale=None,
                   v_scale=None):
    check_choice(impl, "impl", IMPLS)
    check_tensor(q, "q", ndim=4, dtypes=FLOAT_DTYPES)
    B, S, Hq, D = q.shape
    check_values = check_values or impl != "triton"  # reference/torch read lengths back anyway: always checked
    P, ps, Hkv, Dk, max_pages = check_paged_layout(k_cache, v_cache, block_table, seq_lens, batch=B,
                                                   check_values=check_values, k_scale=k_scale, v_scale=v_scale)
    if Dk != D:
        raise ValueError(f"q has head_dim {D} but k_cache has {Dk}")
    if Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of kv heads ({Hkv})")
    check_same_device(q=q, k_cache=k_cache)
    if q_lens is not None:
        check_tensor(q_lens, "q_lens", shape=[B], dtypes=(torch.int32,))
        check_same_device(q=q, q_lens=q_lens)
    if check_values and B:
        ql = q_lens if q_lens is not None else torch.full_like(seq_lens, S)
        if bool(((ql < 0) | (ql > S) | (ql > seq_lens)).any()):
            raise ValueError(f"q_lens must lie in [0, min(S = {S}, seq_lens[b])] (the new tokens are part of the "
                             f"cached seq_lens), got q_lens {ql.tolist()[:8]} with seq_lens {seq_lens.tolist()[:8]}")
    check_scale(scale)


def paged_prefill(q, k_cache, v_cache, block_table, seq_lens, *, q_lens=None, scale: float | None = None,
                  impl: str = "torch", config: dict | None = None, check_values: bool = True,
                  k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Prefill of new tokens over their cached prefix, through the block table (module docstring).

    ``impl`` is ``"torch"`` by default (runs everywhere, quickly on a CPU); ``impl="triton"``
    selects the Triton kernel, ``impl="reference"`` the fp32 reference.

    ``check_values=False`` skips, for ``impl="triton"``, the checks that read lengths and page ids
    back to the host; the kernel then clamps them (unspecified output, never a read outside the
    cache; see :mod:`.paged`). The reference and torch impls always check. ``k_scale``/``v_scale``:
    the scales of ``float8_e4m3fn`` caches (required with them, refused without).
    """
    _check_prefill(q, k_cache, v_cache, block_table, seq_lens, q_lens, scale, impl, check_values, k_scale, v_scale)
    kw = dict(q_lens=q_lens, scale=scale, k_scale=k_scale, v_scale=v_scale)
    if impl == "reference":
        return paged_prefill_reference(q, k_cache, v_cache, block_table, seq_lens, **kw)
    if impl == "torch":
        return paged_prefill_torch(q, k_cache, v_cache, block_table, seq_lens, **kw)
    return paged_prefill_triton(q, k_cache, v_cache, block_table, seq_lens, config=config, **kw)
