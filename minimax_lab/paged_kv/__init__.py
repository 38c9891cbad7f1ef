"""The paged KV cache's layout and kernels: the operator the engine's attention calls every step.

* :mod:`.layout` -- the one owner of the paged layout: ``[num_pages, page_size, Hkv, D]`` caches, an
  int32 block table and int32 lengths, their checks, the Triton operands, and the FP8 scales' two
  layouts (``check_kv_scales``, ``dequantize_kv``)
* ``write_kv`` (:mod:`.write`) -- new tokens' K/V into their pages (FP8 caches quantized per token)
* ``paged_decode`` (:mod:`.decode`) -- one new query per sequence over its pages (flash-decoding)
* ``paged_prefill`` (:mod:`.prefill`) -- a chunk of new queries over a cached prefix and themselves

Each op is ``op.py`` (contract, checks, the ``impl`` switch) beside ``op_reference.py``,
``op_torch.py`` and ``op_triton.py``. The bookkeeping around the pages -- which page holds what,
prefix sharing, eviction, tiers, the distributed store -- is the cache system,
:mod:`minimax_lab.kvcache`.
"""
from __future__ import annotations

from minimax_lab.paged_kv.decode import paged_decode
from minimax_lab.paged_kv.layout import check_kv_scales, dequantize_kv
from minimax_lab.paged_kv.prefill import paged_prefill
from minimax_lab.paged_kv.write import write_kv

__all__ = ["paged_decode", "paged_prefill", "write_kv", "check_kv_scales", "dequantize_kv"]
