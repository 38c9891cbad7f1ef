"""The pieces every attention kernel of the package shares, written once.

Each attention kernel (dense FlashAttention, MSA prefill and decode, paged decode and prefill)
walks keys tile by tile with the *online softmax* (Milakov & Gimelshein 2018, arXiv 1805.02867;
FlashAttention, Dao et al. 2022, arXiv 2205.14135): per query row it carries the running max
``m``, the running sum ``l`` and an unnormalized output ``acc``; a tile that raises the max
rescales what came before by ``alpha = 2**(m - m_new)``. Kernels that split the keys across
programs write one partial result per split with its log-sum-exp and merge them after. This
module holds those steps as ``@triton.jit`` functions (Triton inlines them into the calling
kernel when it compiles), ``LOG2E`` and the launch-side helpers: the interpreter's operand upcast, on the host
(:func:`interpreter_safe`) or, where a kernel reads a cache in place, inside it (:func:`upcast_if`).

It also holds the ranking key of MSA's top-k (:func:`topk_key`, with its torch twin
:func:`topk_key_torch`): one int64 per block, ``(orderable fp32 bits of the score) * 2**ID_BITS +
(2**ID_BITS - 1 - block id)``, so "higher score, then lower id" is plain integer order and every
key of a row is distinct.

Conventions: scores live in the **log2 domain** -- the caller folds ``log2(e) * softmax_scale``
into one factor ``qk_scale`` (``exp(x) = 2**(x * log2 e)``; ``exp2`` is one instruction), masked
scores are ``-inf`` *before* scaling, and a log-sum-exp is base 2 until :func:`natural_lse`.
A row that has seen no visible key keeps ``m = -inf`` and ``l = 0``; every helper here guards it
(no NaN) and a merge gives it weight 0.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minimax_lab import runtime

#: log2(e): ``exp(x) == 2 ** (x * LOG2E)``. Launchers pass ``softmax_scale * LOG2E`` as ``qk_scale``.
LOG2E = 1.4426950408889634

#: bits of a top-k key that hold the block id: block ids below 2**20 (128M tokens at Bk = 128)
ID_BITS = 20
#: the int64 range: the smallest key marks a block that is not ranked, the largest an unused slot
KEY_MIN = -(2**63)
KEY_MAX = 2**63 - 1
ID_SHIFT = tl.constexpr(1 << ID_BITS)
KEY_MIN_C = tl.constexpr(KEY_MIN)
KEY_MAX_C = tl.constexpr(KEY_MAX)


@triton.jit
def softmax_tile_weights(m_i, l_i, qk, qk_scale):
    """One tile of the online softmax, up to the weights: raw scores ``qk`` [M, N] (masked = -inf),
    the state ``m_i``, ``l_i`` [M] -> ``(p, alpha, m_new, l_new)``: ``p = 2**(qk * qk_scale - m)``
    [M, N] (the tile's unnormalized weights), ``alpha`` [M] (what the old ``acc`` is multiplied by)
    and the new state. A caller that scales ``p`` before ``p @ V`` (FP8 value scales) uses this and
    its own dot; the others use :func:`online_softmax_step`."""
    # the max of the raw scores times qk_scale (> 0) equals the max of the scaled scores, and
    # qk * qk_scale - m is one FMA per score: the only per-score work besides exp2 and the sum
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no visible key yet: no NaN
    p = tl.math.exp2(qk * qk_scale - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    l_new = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_new


@triton.jit
def pow2_of(x):
    """``2**floor(log2(x))`` of positive fp32 ``x`` (any shape) from its exponent bits, and its
    inverse, both clamped to ``[2**-126, 2**126]`` (0 and subnormals give ``2**-126``): a power of
    two a tensor is multiplied by without rounding."""
    e = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.minimum(tl.maximum(e, -126), 126)
    return ((e + 127) << 23).to(tl.float32, bitcast=True), ((127 - e) << 23).to(tl.float32, bitcast=True)


@triton.jit
def fp16_rows(q):
    """``(q16, row_scale)``: ``q`` (bf16 or fp16 values, held in any float type) ``[M, D]`` in fp16
    with ``q16 * row_scale[:, None] == q``. Each row is divided by the power of two that puts its
    largest entry in ``[2**14, 2**15)``: fp16 holds it (it tops out at 65504) with bf16's 8 mantissa
    bits intact for every entry down to ``2**-28`` of the largest; smaller ones round, far below
    what the fp32 sum of the row's products resolves anyway. ``row_scale`` stays >= ``2**-100``
    (rows whose largest entry is below ``2**-86`` keep a smaller fp16 amax, still exact), so a
    softmax scale times it is a normal fp32 number and ``-inf`` scores times it never give NaN."""
    amax = tl.max(tl.abs(q.to(tl.float32)), 1)
    exponent = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # floor(log2(amax))
    shift = tl.minimum(tl.maximum(exponent - 14, -100), 127)
    row_scale = ((shift + 127) << 23).to(tl.float32, bitcast=True)  # 2**shift, built exactly
    return (q.to(tl.float32) / row_scale[:, None]).to(tl.float16), row_scale


@triton.jit
def fp8_query(q, qk_scale, FP16_DOT: tl.constexpr):
    """The query tile of an FP8 reader and each row's log2-domain softmax scale: ``(q16, row_f)``
    with ``FP16_DOT`` (16-bit queries; :func:`fp16_rows`, the shift folded into ``row_f``), else
    ``(q in fp32, qk_scale for every row)``."""
    if FP16_DOT:
        q, row_scale = fp16_rows(q)
        row_f = qk_scale * row_scale
    else:
        q = q.to(tl.float32)
        row_f = tl.zeros([q.shape[0]], tl.float32) + qk_scale
    return q, row_f


@triton.jit
def fp8_scores(q, k8, v8, ksc, row_f, visible, MASKED: tl.constexpr, SCALAR_SCALES: tl.constexpr,
               DOT_PRECISION: tl.constexpr):
    """The first half of an FP8 tile step: ``(qk, row_f, v)`` -- the scores ``q . k8`` [M, N] (fp32
    accumulation) with the key scales on their columns (``[N]`` ``ksc``) or folded into the rows'
    softmax scale ``row_f`` (one ``ksc`` for the tile, ``SCALAR_SCALES``), ``-inf`` where not
    ``visible`` (when ``MASKED``); and the V tile. Both tiles converted to q's dtype once, for every row."""
    k = k8.to(q.dtype)
    v = v8.to(q.dtype)
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    if SCALAR_SCALES:
        row_f = row_f * ksc
    else:
        qk = qk * ksc[None, :]
    if MASKED:
        qk = tl.where(visible, qk, float("-inf"))
    return qk, row_f, v


@triton.jit
def fp8_attend_tile(acc, m_i, l_i, q, k8, v8, ksc, vsc, row_f, visible, MASKED: tl.constexpr,
                    SCALAR_SCALES: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One K/V tile of an FP8 (e4m3) cache through the online softmax, for all rows of ``q`` at once.

    ``q`` [M, D] is fp16 (a 16-bit query moved into fp16's range by :func:`fp16_rows`) or fp32;
    ``k8, v8`` [N, D] e4m3; ``row_f`` [M] (> 0) the log2-domain softmax scale of each row (the
    :func:`fp16_rows` shift folded in); ``visible`` broadcasts to [M, N] (used when ``MASKED``).
    ``SCALAR_SCALES``: ``ksc``/``vsc`` are one scale each for the whole tile (a tile inside one
    page with per-page scales), else one per key, ``[N]``.

    * The tiles are converted once to q's dtype (e4m3 -> fp16 is one instruction per pair, e4m3 ->
      bf16 goes through fp32) and shared by every row, i.e. every query head of the group.
    * Key scales stay out of the K tile: ``q . (k8 s) = (q . k8) s``, one multiply per score
      column, or folded into ``row_f`` when one scale covers the tile.
    * P is taken against the tile's own row max (its largest entry is 1) and the factor
      ``2**(tile max - running max)`` joins the row's update, so fp16's range never cuts a tile
      whose scores lie far below the running max. Value scales stay out of the V tile: they
      multiply P's columns, and P is then divided, per row, by the power of two at or below its
      largest entry (:func:`pow2_of`), so its fp16 copy keeps 11 bits however small the scales
      are; the dot's result is multiplied back. A tile-wide scale multiplies the dot's result.

    All scales are powers of two, so only the fp16 rounding of P (and of query entries below
    ``2**-28`` of their row's largest) differs from the fp32 computation. Returns ``(acc, m, l)``."""
    qk, row_f, v = fp8_scores(q, k8, v8, ksc, row_f, visible, MASKED, SCALAR_SCALES, DOT_PRECISION)
    m_tile = tl.max(qk, 1) * row_f  # the tile's row max, log2 domain (row_f > 0)
    m_new = tl.maximum(m_i, m_tile)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no visible key yet: no NaN
    t_safe = tl.where(m_tile == float("-inf"), 0.0, m_tile)
    p = tl.math.exp2(qk * row_f[:, None] - t_safe[:, None])  # [M, N], each row's largest entry 1
    alpha = tl.math.exp2(m_i - m_safe)  # what the old acc and l are worth now
    c = tl.math.exp2(m_tile - m_safe)  # what this tile's p are worth now (0 for a row that saw nothing)
    l_new = l_i * alpha + tl.sum(p, 1) * c
    if SCALAR_SCALES:
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv * (c * vsc)[:, None]
    else:
        w = p * vsc[None, :]
        back, inv = pow2_of(tl.max(w, 1))
        pv = tl.dot((w * inv[:, None]).to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv * (back * c)[:, None]
    return acc, m_new, l_new


@triton.jit
def fp8_attend_tile_plain(acc, m_i, l_i, q, k8, v8, ksc, vsc, qk_scale, visible, MASKED: tl.constexpr,
                          SCALAR_SCALES: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """:func:`fp8_attend_tile` the plain way: the e4m3 tiles converted to ``q``'s dtype as loaded
    (bf16, fp16 or fp32), the key scales on the score columns (or folded into ``qk_scale`` when
    one scale covers the tile), the value scales on P's columns, and the online softmax of
    :func:`softmax_tile_weights` with one scale ``qk_scale`` for every row. bf16 keeps fp32's
    range, so no row is moved; an fp16 ``q`` gets P times the value scales divided, per row, by the
    power of two at or below its largest entry (:func:`pow2_of`) and multiplied back after the dot,
    so scales far below 1 do not fall under fp16's subnormals. Returns ``(acc, m, l)``."""
    qk, qk_scale, v = fp8_scores(q, k8, v8, ksc, qk_scale, visible, MASKED, SCALAR_SCALES, DOT_PRECISION)
    p, alpha, m_new, l_new = softmax_tile_weights(m_i, l_i, qk, qk_scale)
    if SCALAR_SCALES:
        w = p * vsc
    else:
        w = p * vsc[None, :]
    if q.dtype == tl.float16:
        back, inv = pow2_of(tl.max(w, 1))
        pv = tl.dot((w * inv[:, None]).to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv * back[:, None]
    else:
        acc = tl.dot(w.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_new


@triton.jit
def online_softmax_step(acc, m_i, l_i, qk, qk_scale, v):
    """One K/V tile of the online softmax: ``acc`` [M, D] fp32, ``m_i``, ``l_i`` [M], raw scores
    ``qk`` [M, N] (masked = -inf), the tile's values ``v`` [N, D] -> ``(acc, m, l)`` after it.
    ``p`` is cast to ``v``'s dtype for the tensor-core dot (fp32 accumulation)."""
    p, alpha, m_new, l_new = softmax_tile_weights(m_i, l_i, qk, qk_scale)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_new


@triton.jit
def log2_sum_exp(m, l):
    """The base-2 log-sum-exp ``m + log2(l)`` of a state (``-inf`` where ``l == 0``: nothing seen)."""
    return tl.where(l == 0.0, float("-inf"), m + tl.math.log2(tl.where(l == 0.0, 1.0, l)))


@triton.jit
def finish_rows(acc, m_i, l_i):
    """The end of the walk: ``(acc / l, lse)`` -- the normalized output [M, D] (0 for a row that
    saw no key) and its base-2 log-sum-exp [M] (-inf for such a row)."""
    return acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None], log2_sum_exp(m_i, l_i)


@triton.jit
def natural_lse(lse2):
    """A base-2 log-sum-exp in natural log (``-inf`` stays ``-inf``)."""
    return lse2 / 1.4426950408889634  # LOG2E; a jit function cannot read a module float


@triton.jit
def merge_weights(lse2):
    """Merging partial results: their base-2 log-sum-exps ``lse2`` [P, ...] (-inf = empty partial)
    -> ``(m, total)`` over axis 0: partial ``i`` weighs ``2**(lse2[i] - m)`` and the merged
    output is ``sum_i 2**(lse2[i] - m) * o_i / total`` (``o_i`` normalized by its own sum); its
    log-sum-exp is ``m + log2(total)``. All partials empty: ``m = 0``, ``total = 0``."""
    m = tl.max(lse2, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    total = tl.sum(tl.math.exp2(lse2 - tl.expand_dims(m, 0)), 0)
    return m, total


@triton.jit
def topk_key(score, block_id):
    """The top-k ranking key of fp32 ``score`` for block ``block_id`` (int, broadcast against the
    score): int64, larger for a higher score and, among equal scores, for a lower id. ``-0.0``
    ranks as ``+0.0``; ``-inf`` below every finite score. Twin of :func:`topk_key_torch`."""
    score = tl.where(score == 0.0, 0.0, score)
    bits = score.to(tl.int32, bitcast=True)
    bits = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # negative floats: larger magnitude, smaller key
    last_id = tl.full([], ID_SHIFT - 1, tl.int64)  # a tensor: newer Tritons refuse a constexpr minus a tensor
    return bits.to(tl.int64) * ID_SHIFT + (last_id - block_id)


@triton.jit
def topk_block(key):
    """The block id a :func:`topk_key` holds (also for keys of negative scores)."""
    last_id = tl.full([], ID_SHIFT - 1, tl.int64)  # a tensor, as in topk_key
    return last_id - (key & last_id)


def topk_key_torch(scores: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """:func:`topk_key` in torch, bit for bit: ``scores`` (any float dtype, taken as fp32) and
    ``block_ids`` broadcast to one int64 key each."""
    s = scores.float()
    bits = torch.where(s == 0.0, torch.zeros_like(s), s).contiguous().view(torch.int32)
    bits = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return bits.to(torch.int64) * (1 << ID_BITS) + ((1 << ID_BITS) - 1 - block_ids.to(torch.int64))


def topk_block_torch(keys: torch.Tensor) -> torch.Tensor:
    """The block ids of keys made by :func:`topk_key_torch` (int64)."""
    return (1 << ID_BITS) - 1 - (keys & ((1 << ID_BITS) - 1))


@triton.jit
def upcast_if(x, CAST_F32: tl.constexpr):
    """``x`` in fp32 when ``CAST_F32`` (see :func:`needs_fp32_dot`), else unchanged."""
    if CAST_F32:
        x = x.to(tl.float32)
    return x


#: dtypes a Triton kernel can take only where the device has the feature (runtime.supports)
_DTYPE_FEATURES = {torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8"}


def require_dtypes(what: str, *tensors) -> None:
    """Raise :class:`minimax_lab.runtime.UnsupportedOnDevice` naming ``what`` when a tensor's dtype
    needs a feature this device lacks: bf16 before sm_80, ``float8_e4m3fn`` before sm_89 (Triton
    compiles neither there); ``None`` entries are skipped."""
    for t in tensors:
        feature = _DTYPE_FEATURES.get(getattr(t, "dtype", None))
        if feature is not None:
            runtime.require(feature, what)


def interpreter_safe(*tensors):
    """The tensors a Triton kernel may take here: bf16 becomes fp32 under the interpreter
    (whose bf16 ``tl.dot`` multiplies bit patterns, errors ~1e10); unchanged on the GPU.
    Returns a tuple in the same order (``None`` stays ``None``)."""
    if not runtime.is_interpreter():
        return tensors
    return tuple(t.float() if t is not None and t.dtype == torch.bfloat16 else t for t in tensors)


def dot_precision(dtype: torch.dtype) -> str:
    """A kernel's ``input_precision`` for ``tl.dot`` on ``dtype`` operands: ``"ieee"`` for fp32
    (full fp32 products: TF32's 10-bit mantissa can swap near-tied scores and, with large scores,
    move them by whole logits), ``"tf32"`` otherwise (16-bit dots ignore it)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def needs_fp32_dot(dtype: torch.dtype) -> bool:
    """Whether a kernel should upcast its dot operands to fp32: under Triton's interpreter (its
    ``tl.dot`` on bf16 is wrong) and for fp32 inputs (so they are not rounded to tf32)."""
    return runtime.is_interpreter() or dtype == torch.float32
