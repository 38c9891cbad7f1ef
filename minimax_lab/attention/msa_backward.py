"""The backward of MSA's sparse attention: the entry points and their checks.

``msa_attention_backward(q, k, v, o, lse, do, selected, *, block_size, scale=None, dlse=None, impl="torch")``
    ``(dq, dk, dv)`` of :func:`minimax_lab.attention.msa.msa_attention` over a given selection:
    ``q [B, S, Hq, D]``, ``k, v [B, S, G, D]``, the forward's output ``o`` (q's shape and dtype)
    and log-sum-exp ``lse [B, Hq, S]``, the output's gradient ``do`` (q's shape), the selection
    ``int32 [B, S, G, topk]`` the forward used (checked by :func:`.msa.check_selection`: a host
    sync), and the log-sum-exp's gradient ``dlse [B, Hq, S]`` or None. GQA (query head ``h`` reads
    kv head ``h // (Hq / G)``), causal inside the local block, any ``S`` (a ragged last block), any
    strides. A row that selected no block has output 0, lse ``-inf`` and zero gradients. Returns
    gradients in the dtypes and shapes of ``q``, ``k``, ``v``.

``impl``: ``"reference"`` (autograd through the dense-mask forward; ``o`` and ``lse`` unused),
``"torch"`` (the formulas by hand, gathered per query chunk, scattered with ``index_add_``),
``"triton"`` (dQ query-outer, dK/dV KV-outer without atomics; fp16, bf16, fp32 -- and fp64, the
checks' ground truth -- on :func:`minimax_lab.runtime.kernel_device`). The formulas are in
:mod:`.msa_backward_reference`; the other impls compute in fp32 (fp64 for fp64 inputs).

``sparse_attention(q, k, v, selected, *, block_size, scale=None, forward="triton", backward="triton", schedule="auto")``
    ``(o, lse)`` with autograd: the ``forward`` impl over the selection, differentiated by the
    ``backward`` impl (:class:`.msa_backward_autograd.SparseAttention`); gradients reach ``q``,
    ``k``, ``v`` from ``o`` and ``lse``, never the selection. ``msa_attention(impl="triton")``
    trains through it with both impls ``"triton"``; pairing the fp64 reference forward with the
    Triton backward lets ``torch.autograd.gradcheck`` judge the kernels in fp64. A Triton forward
    takes fp16, bf16, fp32.

Bad input raises ``TypeError``/``ValueError`` naming what was expected.
"""
from __future__ import annotations

import torch

from minimax_lab.attention.msa import MAX_BLOCK, MIN_BLOCK, check_selection
from minimax_lab.attention.msa_backward_autograd import SparseAttention, backward_of
# the switch's implementations, at the top as every entry point has them; backward_of (shared with
# the autograd wiring) is the one dispatch among them
from minimax_lab.attention.msa_backward_reference import msa_attention_backward_reference  # noqa: F401
from minimax_lab.attention.msa_backward_torch import msa_attention_backward_torch  # noqa: F401
from minimax_lab.attention.msa_backward_triton import BACKWARD_DTYPES, msa_attention_backward_triton  # noqa: F401
from minimax_lab.attention.msa_triton_prefill import SCHEDULES
from minimax_lab.validate import (FLOAT_DTYPES, IMPLS, check_choice, check_power_of_two, check_same_device,
                                  check_scale, check_tensor, check_triton_inputs)


def _check(q, k, v, selected, *, block_size, scale, impl):
    check_choice(impl, "impl", IMPLS)
    check_power_of_two(block_size, "block_size", minimum=MIN_BLOCK, maximum=MAX_BLOCK)
    check_scale(scale)
    check_tensor(q, "q", ndim=4, dtypes=FLOAT_DTYPES)
    B, S, Hq, D = q.shape
    check_tensor(k, "k", shape=[B, S, None, D], dtypes=(q.dtype,))
    check_tensor(v, "v", shape=list(k.shape), dtypes=(q.dtype,))
    G = k.shape[2]
    if G < 1 or Hq < 1 or Hq % G:
        raise ValueError(f"Hq ({Hq}) must be a positive multiple of Hkv ({G})")
    check_tensor(selected, "selected", ndim=4, dtypes=(torch.int32,))
    check_selection(selected, B=B, S=S, G=G, topk=selected.shape[3], block_size=block_size)
    check_same_device(q=q, k=k, v=v, selected=selected)
    if impl == "triton":
        check_triton_inputs(float_dtypes=BACKWARD_DTYPES, allow_grad=True, q=q, k=k, v=v)


def msa_attention_backward(q, k, v, o, lse, do, selected, *, block_size: int, scale: float | None = None,
                           dlse=None, impl: str = "torch"):
    """Gradients of sparse attention over ``selected``; see the module docstring."""
    _check(q, k, v, selected, block_size=block_size, scale=scale, impl=impl)
    B, S, Hq, _ = q.shape
    check_tensor(o, "o", shape=list(q.shape), dtypes=(q.dtype,))
    check_tensor(do, "do", shape=list(q.shape), dtypes=FLOAT_DTYPES)
    check_tensor(lse, "lse", shape=[B, Hq, S], dtypes=FLOAT_DTYPES)
    if dlse is not None:
        check_tensor(dlse, "dlse", shape=[B, Hq, S], dtypes=FLOAT_DTYPES)
    check_same_device(q=q, o=o, do=do, lse=lse, dlse=dlse)
    return backward_of(impl, q, k, v, o, lse, do, selected, block_size=block_size, scale=scale, dlse=dlse)


def sparse_attention(q, k, v, selected, *, block_size: int, scale: float | None = None, forward: str = "triton",
                     backward: str = "triton", schedule: str = "auto"):
    """``(o, lse)`` with autograd through the chosen forward and backward; see the module docstring."""
    check_choice(forward, "forward", IMPLS)
    check_choice(schedule, "schedule", SCHEDULES)
    _check(q, k, v, selected, block_size=block_size, scale=scale, impl=backward)
    if forward == "triton":
        check_triton_inputs(allow_grad=True, q=q, k=k, v=v)
    return SparseAttention.apply(q, k, v, selected, block_size, scale, forward, backward, schedule)
