"""Paged decode attention: one new query token per sequence, its keys and values read straight
out of the paged KV cache through the block table.

Contract::

    paged_decode(q, k_cache, v_cache, block_table, seq_lens, *, scale=None, impl="torch",
                 k_scale=None, v_scale=None) -> o

* ``q [B, Hq, D]`` -- the query of each sequence's newest token (its K/V already written);
* ``k_cache, v_cache [num_pages, page_size, Hkv, D]`` -- one layer's page pool, ``Hq`` a
  multiple of ``Hkv`` (GQA: query head ``h`` reads kv head ``h // (Hq // Hkv)``);
* ``block_table int32 [B, max_pages]`` -- sequence ``b``'s token ``t`` lives in page
  ``block_table[b, t // page_size]`` at slot ``t % page_size``; unused entries are ``-1``;
* ``seq_lens int32 [B]`` -- tokens cached per sequence, ``0 <= seq_lens[b] <= max_pages * page_size``;
* ``k_scale, v_scale`` -- only with ``float8_e4m3fn`` caches: fp32 ``[num_pages, page_size, Hkv]``
  (per token and kv head) or ``[num_pages, Hkv]`` (per page and kv head), see :mod:`.paged`.
  The attention then runs over the stored values ``cache * scale``; q keeps its dtype.

The layout and its checks are those of :mod:`.paged` (one owner for every paged kernel). ``q``
may have another float dtype than the cache: the torch and Triton impls cast it to the cache's
dtype, the reference computes in fp32; o has q's dtype.

Returns ``o [B, Hq, D]`` in q's dtype: softmax(q . k / sqrt(D)) . v over the sequence's
``seq_lens[b]`` cached tokens (a sequence with no tokens gives zeros; ``B = 0`` gives an empty
o). Any strides give the contiguous answer; ``impl="triton"`` reads the caches in place whatever
their layout (no copy of the cache). Bad input raises
``TypeError``/``ValueError`` saying what was expected: page ids out of range, a -1 inside a
sequence, lengths out of range (unless ``check_values=False``, see :mod:`.paged`), a non-finite
``scale``, and for ``impl="triton"`` float64 or inputs that require grad (no backward).

Implementations behind ``impl`` (each a plain function of its own module):

* ``"reference"`` -- :func:`.decode_reference.paged_decode_reference`: one sequence at a time,
  gather its tokens, fp32 softmax. Obviously right.
* ``"torch"`` (the default) -- :func:`.decode_torch.paged_decode_torch`: gather every page of the
  batch into a contiguous copy, then ``scaled_dot_product_attention`` with a length mask. Runs
  everywhere.
* ``"triton"`` -- :func:`.decode_triton.paged_decode_triton`: the flash-decoding kernel (GQA
  packing, split-K, a merge pass; :mod:`.decode_triton` describes it).
"""
from __future__ import annotations

import torch

from minimax_lab.paged_kv.decode_reference import paged_decode_reference
from minimax_lab.paged_kv.decode_torch import paged_decode_torch
from minimax_lab.paged_kv.decode_triton import paged_decode_triton
from minimax_lab.paged_kv.layout import check_paged_layout
from minimax_lab.validate import FLOAT_DTYPES, IMPLS, check_choice, check_same_device, check_scale, check_tensor



# --------------------------------------------------------------------------- input checks


def _check_decode(q, k_cache, v_cache, block_table, seq_lens, scale, impl, check_values, k_scale=None,
                  v_scale=None):
    check_choice(impl, "impl", IMPLS)
    check_tensor(q, "q", ndim=3, dtypes=FLOAT_DTYPES)
    B, Hq, D = q.shape
    # the reference and torch impls read lengths back to the host anyway: they always check values
    P, ps, Hkv, Dk, max_pages = check_paged_layout(k_cache, v_cache, block_table, seq_lens, batch=B,
                                                   check_values=check_values or impl != "triton",
                                                   k_scale=k_scale, v_scale=v_scale)
    if Dk != D:
        raise ValueError(f"q has head_dim {D} but k_cache has {Dk}")
    if Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of kv heads ({Hkv})")
    check_same_device(q=q, k_cache=k_cache)
    check_scale(scale)
    return B, Hq, Hkv, D, ps


# --------------------------------------------------------------------------- public entry point


def paged_decode(q, k_cache, v_cache, block_table, seq_lens, *, scale: float | None = None,
                 impl: str = "torch", num_splits: int | None = None, config: dict | None = None,
                 check_values: bool = True, k_scale: torch.Tensor | None = None,
                 v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention over a paged KV cache; see the module docstring for the contract.

    ``impl`` is ``"torch"`` by default (runs everywhere, quickly on a CPU); ``impl="triton"``
    selects the Triton kernel, ``impl="reference"`` the fp32 reference.

    ``check_values=False`` skips, for ``impl="triton"``, the checks that read ``seq_lens``/
    ``block_table`` back to the host (needed inside CUDA graphs): out-of-range values then give
    unspecified output, but the kernel clamps page ids and lengths, so it never reads outside
    the cache (see :mod:`.paged`). The reference and torch impls always check.

    ``num_splits`` and ``config`` (``BLOCK_N``, ``num_warps``, ``num_stages``,
    ``programs_per_sm``) only apply to ``impl="triton"``. ``k_scale``/``v_scale``: the scales of
    ``float8_e4m3fn`` caches (required with them, refused without; see :mod:`.paged`).
    """
    _check_decode(q, k_cache, v_cache, block_table, seq_lens, scale, impl, check_values, k_scale, v_scale)
    kw = dict(scale=scale, k_scale=k_scale, v_scale=v_scale)
    if impl == "reference":
        return paged_decode_reference(q, k_cache, v_cache, block_table, seq_lens, **kw)
    if impl == "torch":
        return paged_decode_torch(q, k_cache, v_cache, block_table, seq_lens, **kw)
    return paged_decode_triton(q, k_cache, v_cache, block_table, seq_lens, num_splits=num_splits, config=config,
                               **kw)
