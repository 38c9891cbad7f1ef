"""Paged decode attention: one new query token per sequence, its keys and values read straight
out of the paged KV cache through the block table.

Contract::

    paged_decode(q, k_cache, v_cache, block_table, seq_lens, *, scale=None, impl="triton",
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

Implementations behind ``impl``:

* ``"reference"`` -- one sequence at a time: gather its tokens, fp32 softmax. Obviously right.
* ``"torch"`` -- gather every page of the batch (``k_cache[block_table]``) into a contiguous
  copy, then ``scaled_dot_product_attention`` with a length mask. What a user writes first;
  it moves every byte of the context twice (read pages, write copy, read copy).
* ``"triton"`` -- the kernel below (flash-decoding, Dao et al. 2023,
  https://crfm.stanford.edu/2023/10/12/flashdecoding.html, on vLLM's paged layout, Kwon et al.
  2023, arXiv 2309.06180):

  1. **GQA packing.** One program owns one ``(sequence, kv head)`` and *all* ``G = Hq / Hkv``
     query heads of that group as the M dimension of its tiles, so each K/V byte is read from
     memory once for the whole group (not G times) and the scores are a small ``tl.dot``.
  2. **Split-K.** With few sequences (B=8) there are only ``B * Hkv`` = 64 such programs for
     132 SMs, so the context is cut into ``num_splits`` pieces, one program each; each writes a
     partial output (normalised) and its log-sum-exp. ``num_splits`` is chosen on the host from
     ``B * Hkv`` against the SM count (:func:`choose_num_splits`) -- no device sync.
  3. **Second pass.** A tiny kernel merges the splits: ``o = sum_s w_s o_s`` with
     ``w_s = exp(lse_s - max lse) / sum(...)``. With one split the first pass writes ``o``
     directly and the second is skipped.
  4. **Pages.** Each tile is ``BLOCK_N`` tokens; every token looks its page up in the block
     table (``t // page_size``), so one code path serves page sizes 16-128 whether a tile spans
     several pages or lies inside one.
  5. **FP8 caches.** The e4m3 tiles are loaded (half of bf16's bytes) and upcast to q's dtype
     (exact); each key's scale multiplies its column of the scores after the dot, each value's
     scale multiplies P's column before ``P @ V`` (see :func:`_decode_tile`). A per-page scale
     is a per-token one with token stride 0: one kernel for both layouts.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minimax_lab import configs, runtime
from minimax_lab.kvcache.paged import (check_paged_layout, dequantize_kv, gather_pages, gather_sequence,
                                       kv_scale_operands, paged_triton_operands)
from minimax_lab.sdpa import sdpa
from minimax_lab.validate import (FLOAT_DTYPES, accumulate_dtype, check_choice, check_same_device, check_scale,
                                  check_tensor)

IMPLS = ("reference", "torch", "triton")
LOG2E = 1.4426950408889634

#: Launch config in the interpreter; on a GPU :func:`minimax_lab.configs.launch_config` gives this
#: GPU's tuned config (``python -m minimax_lab.tune paged_decode``) or the built-in default,
#: :data:`GPU_CONFIG` (the H200's, from ``minimax_lab/configs/NVIDIA_H200.json``).
GPU_CONFIG = configs.builtin("paged_decode")
INTERPRETER_CONFIG = {"BLOCK_N": 16, "num_warps": 1, "num_stages": 1, "programs_per_sm": 2}


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


# --------------------------------------------------------------------------- reference / torch


def paged_decode_reference(q, k_cache, v_cache, block_table, seq_lens, *, scale=None, k_scale=None,
                           v_scale=None):
    """Sequence by sequence: gather its tokens, then an fp32 softmax (fp64 for fp64 inputs).
    FP8 caches are dequantized first (exactly, to fp32). ``[B, Hq, D]`` in q's dtype."""
    k_cache, v_cache = dequantize_kv(k_cache, k_scale), dequantize_kv(v_cache, v_scale)
    B, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    work = accumulate_dtype(q.dtype)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.zeros(B, Hq, D, dtype=work, device=q.device)
    for b in range(B):
        L = int(seq_lens[b])
        if L == 0:
            continue
        k = gather_sequence(k_cache, block_table, b, L).to(work).repeat_interleave(Hq // Hkv, dim=1)  # [L, Hq, D]
        v = gather_sequence(v_cache, block_table, b, L).to(work).repeat_interleave(Hq // Hkv, dim=1)
        s = torch.einsum("hd,lhd->hl", q[b].to(work), k) * scale
        out[b] = torch.einsum("hl,lhd->hd", torch.softmax(s, dim=-1), v)
    return out.to(q.dtype)


def paged_decode_torch(q, k_cache, v_cache, block_table, seq_lens, *, scale=None, k_scale=None, v_scale=None):
    """Gather all pages of the batch into a contiguous copy (FP8 pages dequantized to q's dtype
    as they are gathered), then SDPA (masked when ragged)."""
    B, Hq, D = q.shape
    _, ps, Hkv, _ = k_cache.shape
    L = int(seq_lens.max()) if B else 0
    out = torch.zeros_like(q)
    if L == 0:
        return out
    n_pages = (L + ps - 1) // ps
    pages = block_table[:, :n_pages].long().clamp_min(0)  # -1 pages sit beyond each length: masked
    k = gather_pages(k_cache, k_scale, pages, q.dtype).reshape(B, n_pages * ps, Hkv, D)[:, :L].transpose(1, 2)
    v = gather_pages(v_cache, v_scale, pages, q.dtype).reshape(B, n_pages * ps, Hkv, D)[:, :L].transpose(1, 2)
    mask = None
    if bool((seq_lens != L).any()):
        mask = (torch.arange(L, device=q.device)[None, :] < seq_lens[:, None])[:, None, None, :]
    # SDPA wants one dtype: q is cast to the cache's (as the Triton kernel does), o back to q's
    o = sdpa(q[:, :, None, :].to(k.dtype), k, v, attn_mask=mask,
                                                         scale=scale, enable_gqa=Hq != Hkv)
    o = o[:, :, 0, :].to(q.dtype)
    return torch.where((seq_lens > 0)[:, None, None], o, torch.zeros_like(o))


# --------------------------------------------------------------------------- Triton kernels


@triton.jit
def _decode_tile(acc, m_i, l_i, q, k_base, v_base, bt_row, start, offs_n, offs_d, hi, sks, svs, skp, svp,
                 skd, svd, n_pages, qk_scale, ks_base, vs_base, kscp, kscs, vscp, vscs, PAGE: tl.constexpr,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MASKED: tl.constexpr, FP8: tl.constexpr):
    """One tile of ``BLOCK_N`` tokens of the online softmax, for all G heads of the group at once.
    With ``FP8`` the caches are e4m3 and ``ks_base``/``vs_base`` point at this kv head's scales
    (page stride ``k/vscp``, token stride ``k/vscs``: 0 for per-page scales)."""
    t = start + offs_n
    if MASKED:
        t_ok = t < hi
        page = tl.load(bt_row + t // PAGE, mask=t_ok, other=0)
    else:
        page = tl.load(bt_row + t // PAGE)  # the page of each token (repeats are served by L1)
    # bounds guard: an unchecked table (check_values=False) never sends a load outside the cache
    page = tl.minimum(tl.maximum(page, 0), n_pages - 1)
    slot = t % PAGE
    # skd/svd: the head_dim strides, 1 for every usual cache (Triton specialises a 1 away)
    k_off = page.to(tl.int64)[:, None] * skp + slot[:, None] * sks + offs_d[None, :] * skd
    v_off = page.to(tl.int64)[:, None] * svp + slot[:, None] * svs + offs_d[None, :] * svd
    if MASKED:
        kv_mask = t_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
        k = tl.load(k_base + k_off, mask=kv_mask, other=0.0)
        v = tl.load(v_base + v_off, mask=kv_mask, other=0.0)
    elif BLOCK_D != HEAD_DIM:
        k = tl.load(k_base + k_off, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        v = tl.load(v_base + v_off, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    else:
        k = tl.load(k_base + k_off)
        v = tl.load(v_base + v_off)
    if FP8:
        # e4m3 -> q's dtype is exact (3 mantissa bits, exponents within fp16/bf16's range): the
        # dots see the stored fp8 values, and memory traffic is half of a bf16 cache's
        k = k.to(q.dtype)
        v = v.to(q.dtype)
        if MASKED:
            ksc = tl.load(ks_base + page.to(tl.int64) * kscp + slot * kscs, mask=t_ok, other=0.0)
            vsc = tl.load(vs_base + page.to(tl.int64) * vscp + slot * vscs, mask=t_ok, other=0.0)
        else:
            ksc = tl.load(ks_base + page.to(tl.int64) * kscp + slot * kscs)
            vsc = tl.load(vs_base + page.to(tl.int64) * vscp + slot * vscs)
    qk = tl.dot(q, tl.trans(k))  # [BLOCK_H, BLOCK_N]
    if FP8:  # q . (k8 * s) = (q . k8) * s: one scale per key, i.e. per column of the scores
        qk = qk * ksc[None, :]
    qk = qk * qk_scale  # log2 domain
    if MASKED:
        qk = tl.where(t_ok[None, :], qk, float("-inf"))
    # every tile holds >= 1 valid token, so m_new is finite and no row needs a NaN guard
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.math.exp2(qk - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    if FP8:
        # sum_t p_t (v8_t * s_t) = sum_t (p_t * s_t) v8_t: the value scales go on P's columns, a
        # [BLOCK_H, BLOCK_N] tile D/G times smaller than the V tile they would otherwise multiply
        # (l_i above keeps the unscaled p). The scale is a power of two: exact unless p * s falls
        # below fp16's normal range (|v| < ~2**-6 with fp16 queries); bf16 has fp32's exponents.
        p = p * vsc[None, :]
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


@triton.jit
def _paged_decode_kernel(Q, K, V, BT, LENS, O, PART_O, PART_LSE, KS, VS,
                         sqb, sqh, skp, sks, skh, skd, svp, svs, svh, svd, sbt, sob, soh,
                         kscp, kscs, ksch, vscp, vscs, vsch,
                         Hkv, GROUP, qk_scale, NUM_SPLITS, n_pages, max_len,
                         PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, FP8: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // Hkv
    hk = pid % Hkv
    L = tl.minimum(tl.maximum(tl.load(LENS + b), 0), max_len)  # bounds guard: block-table reads stay in the row
    # This split's tokens [lo, hi): equal pieces, each a multiple of BLOCK_N long.
    per_split = tl.cdiv(tl.cdiv(L, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * per_split
    hi = tl.minimum(lo + per_split, L)
    full_hi = lo + tl.maximum(hi - lo, 0) // BLOCK_N * BLOCK_N

    offs_h = tl.arange(0, BLOCK_H)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    heads = hk * GROUP + offs_h  # the G query heads of kv head hk, padded to BLOCK_H rows
    h_ok = offs_h < GROUP
    q_mask = h_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q + b.to(tl.int64) * sqb + heads[:, None] * sqh + offs_d[None, :], mask=q_mask, other=0.0)
    k_base = K + hk * skh
    v_base = V + hk * svh
    ks_base = KS + hk * ksch  # this kv head's scales (unused without FP8)
    vs_base = VS + hk * vsch
    bt_row = BT + b.to(tl.int64) * sbt

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for start in range(lo, full_hi, BLOCK_N):  # whole tiles: no masks
        acc, m_i, l_i = _decode_tile(acc, m_i, l_i, q, k_base, v_base, bt_row, start, offs_n, offs_d, hi,
                                     sks, svs, skp, svp, skd, svd, n_pages, qk_scale, ks_base, vs_base, kscp, kscs,
                                     vscp, vscs, PAGE, HEAD_DIM, BLOCK_D, False, FP8)
    for start in range(full_hi, hi, BLOCK_N):  # the ragged tail (at most one tile)
        acc, m_i, l_i = _decode_tile(acc, m_i, l_i, q, k_base, v_base, bt_row, start, offs_n, offs_d, hi,
                                     sks, svs, skp, svp, skd, svd, n_pages, qk_scale, ks_base, vs_base, kscp, kscs,
                                     vscp, vscs, PAGE, HEAD_DIM, BLOCK_D, True, FP8)

    empty = l_i == 0.0  # no token in this split (or an empty sequence)
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    if DIRECT:  # one split: this program's result is final
        o_ptrs = O + b.to(tl.int64) * sob + heads[:, None] * soh + offs_d[None, :]
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=q_mask)
    else:
        # partials: PART_O [B, Hq, NUM_SPLITS, BLOCK_D] fp32, PART_LSE [B, Hq, NUM_SPLITS] (log2 domain)
        row = (b.to(tl.int64) * (Hkv * GROUP) + heads) * NUM_SPLITS + split
        tl.store(PART_O + row[:, None] * BLOCK_D + offs_d[None, :], out, mask=h_ok[:, None])
        lse = tl.where(empty, float("-inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))
        tl.store(PART_LSE + row, lse, mask=h_ok)


@triton.jit
def _merge_splits_kernel(PART_O, PART_LSE, O, Hq, sob, soh, NUM_SPLITS,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    """Second pass: one program per (sequence, query head) merges its splits by their lse."""
    row = tl.program_id(0)  # = b * Hq + h
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < NUM_SPLITS
    lse = tl.load(PART_LSE + row.to(tl.int64) * NUM_SPLITS + offs_s, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # all splits empty: weights 0, output 0
    w = tl.math.exp2(lse - m_safe)
    part = tl.load(PART_O + (row.to(tl.int64) * NUM_SPLITS + offs_s[:, None]) * BLOCK_D + offs_d[None, :],
                   mask=s_ok[:, None], other=0.0)
    total = tl.sum(w, 0)
    out = tl.sum(part * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    b = row // Hq
    h = row % Hq
    tl.store(O + b.to(tl.int64) * sob + h * soh + offs_d, out.to(O.dtype.element_ty), mask=offs_d < HEAD_DIM)


def sm_count() -> int:
    """Streaming multiprocessors of the current GPU (132 on an H200; 8 stands in for the interpreter)."""
    if runtime.INTERPRET or not torch.cuda.is_available():
        return 8
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def choose_num_splits(batch: int, kv_heads: int, max_context: int, *, sms: int, block_n: int,
                      programs_per_sm: int = 2, min_tokens_per_split: int = 512, max_splits: int = 64) -> int:
    """How many pieces to cut each sequence's context into.

    ``batch * kv_heads`` programs exist before splitting; ``sms * programs_per_sm`` can run at
    once. Take the fewest splits whose programs fill at least one such wave and keep the last
    wave >= 85% full (so no SM idles through a long tail), never making a split shorter than
    ``min_tokens_per_split`` tokens (each split costs a partial write and a merge).
    """
    base = max(1, batch * kv_heads)
    slots = max(1, sms * programs_per_sm)
    limit = max(1, min(max_splits, max_context // max(min_tokens_per_split, block_n)))
    best, best_eff = 1, 0.0
    for s in range(1, limit + 1):
        n = base * s
        eff = n / (math.ceil(n / slots) * slots)
        if n >= slots and eff >= 0.85:
            return s
        if eff > best_eff + 1e-9:
            best, best_eff = s, eff
    return best if base * best >= slots or limit == 1 else limit


def paged_decode_triton(q, k_cache, v_cache, block_table, seq_lens, *, scale=None, num_splits=None, config=None,
                        k_scale=None, v_scale=None):
    """The Triton flash-decoding kernel (see the module docstring); ``num_splits``/``config``
    override the host heuristic and the launch config (used by the tuning sweep)."""
    B, Hq, D = q.shape
    _, ps, Hkv, _ = k_cache.shape
    cfg = configs.launch_config("paged_decode", interpreter=INTERPRETER_CONFIG, config=config)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out_dtype = q.dtype
    q, k_cache, v_cache, block_table, seq_lens = paged_triton_operands(q, k_cache, v_cache, block_table, seq_lens)
    ks, vs, ks_strides, vs_strides, fp8 = kv_scale_operands(k_cache, k_scale, v_scale)
    o = torch.empty(B, Hq, D, dtype=q.dtype, device=q.device)
    if B == 0:
        return o.to(out_dtype)
    G = Hq // Hkv
    BLOCK_N = cfg["BLOCK_N"]
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BLOCK_H = max(16, triton.next_power_of_2(G))  # tl.dot needs M >= 16
    max_context = block_table.shape[1] * ps
    if num_splits is None:
        num_splits = choose_num_splits(B, Hkv, max_context, sms=sm_count(), block_n=BLOCK_N,
                                       programs_per_sm=cfg["programs_per_sm"])
    num_splits = max(1, int(num_splits))
    if num_splits > 1:
        part_o = torch.empty(B, Hq, num_splits, BLOCK_D, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(B, Hq, num_splits, dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = o  # unused
    _paged_decode_kernel[(B * Hkv, num_splits)](
        q, k_cache, v_cache, block_table, seq_lens, o, part_o, part_lse, ks, vs,
        q.stride(0), q.stride(1), *k_cache.stride(), *v_cache.stride(), block_table.stride(0), o.stride(0), o.stride(1),
        *ks_strides, *vs_strides, Hkv, G, scale * LOG2E, num_splits, k_cache.shape[0], max_context,
        PAGE=ps, HEAD_DIM=D, BLOCK_D=BLOCK_D, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, DIRECT=num_splits == 1, FP8=fp8,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if num_splits > 1:
        _merge_splits_kernel[(B * Hq,)](part_o, part_lse, o, Hq, o.stride(0), o.stride(1), num_splits,
                                        HEAD_DIM=D, BLOCK_D=BLOCK_D,
                                        BLOCK_S=max(2, triton.next_power_of_2(num_splits)), num_warps=4)
    return o.to(out_dtype)


# --------------------------------------------------------------------------- public entry point


def paged_decode(q, k_cache, v_cache, block_table, seq_lens, *, scale: float | None = None,
                 impl: str = "triton", num_splits: int | None = None, config: dict | None = None,
                 check_values: bool = True, k_scale: torch.Tensor | None = None,
                 v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention over a paged KV cache; see the module docstring for the contract.

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
