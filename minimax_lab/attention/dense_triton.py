"""FlashAttention-2 in Triton: the dense-attention forward pass behind ``attention(..., impl="triton")``
(the loop order and causal tiling of FlashAttention-2, Dao 2023, arXiv 2307.08691; the tiled
online softmax of FlashAttention, Dao et al. 2022, arXiv 2205.14135).

One program owns a tile of ``BLOCK_M`` query rows of one query head. It keeps the tile of Q
in registers, streams the tiles of K and V of that head's kv group (GQA: the pointer arithmetic
maps query head ``h`` to kv head ``h // group``, K/V are never copied), and keeps the online-
softmax state per row: running max ``m``, running sum ``l`` and the unnormalized output ``acc``.
Scores never reach memory.

Hopper-minded choices, each a knob the notebook measures:

* ``exp2`` with ``log2(e) * scale`` folded into one multiply (``exp(x) = 2**(x * log2 e)``).
* Causal: key tiles left of the query tile's diagonal run a loop with **no masking**; only the
  one or two tiles that cross the diagonal (and a ragged tail) run the masked loop; tiles right
  of it are never visited.
* Launch order for L2: a 1-D grid that walks ``GROUP_H`` heads at a time through all their
  query tiles (``GROUP_H=1`` is FlashAttention's own order), so the programs resident at once
  (about one per SM) read the same head's K/V and find it in L2; inside a group the query tiles
  run in reversed order, so the longest causal rows launch first and the short ones fill the tail.
* TMA (Hopper and newer, :func:`minimax_lab.runtime.supports`): the unmasked loop loads K/V tiles
  with the bulk tensor copy engine through host tensor descriptors
  (``triton.tools.tensor_descriptor.TensorDescriptor``) of K/V viewed as 2-D ``[B*Skv, Hkv*D]``:
  one instruction per tile, no per-thread pointers in registers. Layouts that cannot be viewed
  that way (head-major strides, head_dim not a power of two) and older GPUs use pointer loads.
* On the GPU ``@triton.autotune`` picks block shapes/warps/stages among the configs that fit the
  GPU's shared memory; in the interpreter a fixed config is used (autotune needs a GPU), and bf16
  inputs are computed in fp32 there, because the interpreter's bf16 ``tl.dot`` is wrong (it
  multiplies bit patterns).

Contract: :func:`flash_attention` takes the dense-attention contract of
:func:`minimax_lab.attention.dense.attention` (q ``[B,S,Hq,D]``, k/v ``[B,Skv,Hkv,D]``,
bottom-right-aligned causal, empty rows give 0 and lse ``-inf``).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from minimax_lab import configs, runtime
from minimax_lab.attention.dense_reference import check_attention_inputs
from minimax_lab.triton_blocks import (LOG2E, finish_rows, interpreter_safe, natural_lse, online_softmax_step,
                                       require_dtypes)
from minimax_lab.validate import check_triton_inputs

def _set_kv_block(nargs):
    """Autotune pre-hook: a TMA descriptor carries its box shape, so it must follow the config's
    ``BLOCK_N`` (the descriptors are built before the autotuner has picked one)."""
    for name in ("K_desc", "V_desc"):
        d = nargs[name]
        if isinstance(d, TensorDescriptor):
            d.block_shape = [nargs["BLOCK_N"], d.block_shape[1]]


def _configs(rows, tma: bool):
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "USE_TMA": t, "GROUP_H": g}, num_warps=w, num_stages=s,
                          pre_hook=_set_kv_block)
            for bm, bn, w, s, t, g in rows if tma or not t]


#: Candidate configs for ``@triton.autotune`` on the GPU (Hopper: BLOCK_M=128, 8 warps; see
#: ``results/notes_attention.md`` for the sweep that picked them). Rows: BLOCK_M, BLOCK_N, warps,
#: stages, TMA, GROUP_H (heads per L2 group of the launch order). Layouts that cannot take a TMA
#: descriptor tune over the rows without TMA.
AUTOTUNE_ROWS = [(128, 128, 8, 3, True, 1), (128, 128, 8, 2, True, 1), (128, 64, 8, 3, True, 1),
                 (128, 64, 8, 4, True, 1), (128, 128, 8, 3, True, 4), (128, 128, 8, 3, True, 1024),
                 (128, 128, 8, 3, False, 1), (128, 64, 8, 3, False, 1), (64, 64, 4, 3, False, 1)]
#: Rows for GPUs where none of :data:`AUTOTUNE_ROWS` fits the shared memory of a block.
SMALL_DEVICE_ROWS = [(64, 64, 4, 2, False, 1), (64, 32, 4, 2, False, 1), (64, 64, 4, 1, False, 1),
                     (32, 32, 4, 1, False, 1)]
AUTOTUNE_CONFIGS = _configs(AUTOTUNE_ROWS, tma=True)


def _flash_cfg(bm, bn, w, s, tma, g):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s, "USE_TMA": tma, "GROUP_H": g}


def _flash_smem(a) -> int:
    """The query tile and the K/V tiles of one :func:`_flash_fwd` program."""
    itemsize = a["Q"].element_size()
    return configs.attention_smem(a["BLOCK_M"], a["BLOCK_N"], a["BLOCK_D"], q_itemsize=itemsize, kv_itemsize=itemsize,
                                  num_stages=a["num_stages"])


#: The fixed config's launch (the interpreter's, and a GPU's when a ``config`` is passed; without
#: one the GPU autotunes): ``GROUP_H`` 1 and ``WARP_SPEC`` off unless given. ``USE_TMA`` loads the
#: unmasked K/V tiles through TMA descriptors where :func:`_tma_ok`, elsewhere the pointer loads.
#: The tuner's candidates: ``GROUP_H=1024`` walks every head at one query tile before the next
#: tile, ``GROUP_H=1`` all query tiles of one head, then the next head (warp specialization,
#: ``WARP_SPEC``, is left out: its compile can hang).
LAUNCH = configs.Launch(
    op="flash",
    keys=("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "USE_TMA", "GROUP_H", "WARP_SPEC"),
    interpreter={"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "USE_TMA": True},
    candidates=[
        _flash_cfg(128, 128, 8, 3, False, 1024), _flash_cfg(128, 128, 8, 3, False, 1),
        _flash_cfg(128, 128, 8, 3, True, 1024), _flash_cfg(128, 128, 8, 3, True, 1),
        _flash_cfg(128, 128, 8, 3, True, 4), _flash_cfg(128, 128, 8, 3, True, 16),
        _flash_cfg(128, 128, 8, 2, True, 1), _flash_cfg(128, 64, 8, 3, True, 1), _flash_cfg(128, 64, 8, 4, True, 1),
        {"BLOCK_M": 256, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2},
    ],
    quick={"GROUP_H": 1024},
    smem={"_flash_fwd": _flash_smem},
)
#: ``config=DEFAULT_CONFIG`` runs the fixed config of this device as it is (no autotuning)
DEFAULT_CONFIG: dict = {}


def fitting_configs(candidates, nargs, **meta) -> list:
    """The autotuner's configs whose shared memory (:func:`_flash_smem`) fits this GPU: the rows of
    :data:`AUTOTUNE_ROWS` that fit, else those of :data:`SMALL_DEVICE_ROWS`, else the smallest
    config (``early_config_prune``; the compiler has the last word)."""
    need = {id(c): _flash_smem({**nargs, **meta, **c.kwargs, "num_stages": c.num_stages}) for c in candidates}
    fits = [c for c in candidates if configs.shared_memory_fits(need[id(c)])]
    small = {_row_key(r) for r in SMALL_DEVICE_ROWS}
    big = [c for c in fits if _config_key(c) not in small]
    return big or fits or [min(candidates, key=lambda c: need[id(c)])]


def _row_key(row) -> tuple:
    bm, bn, w, s, _, _ = row
    return bm, bn, w, s


def _config_key(c) -> tuple:
    return c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages


@triton.jit
def _load_kv(k_base, v_base, start_n, offs_n, offs_d, stride_ks, stride_vs, Skv,
             HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MASKED: tl.constexpr):
    """Pointer loads of one K and one V tile ``[BLOCK_N, BLOCK_D]``; bounds are checked only
    where a tile may leave the tensor (masked tiles, or a padded head dim)."""
    rows = (start_n + offs_n[:, None]).to(tl.int64)
    k_ptrs = k_base + rows * stride_ks + offs_d[None, :]
    v_ptrs = v_base + rows * stride_vs + offs_d[None, :]
    if MASKED:
        kv_mask = (start_n + offs_n[:, None]) < Skv
        if BLOCK_D != HEAD_DIM:
            kv_mask = kv_mask & (offs_d[None, :] < HEAD_DIM)
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
    elif BLOCK_D != HEAD_DIM:
        k = tl.load(k_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        v = tl.load(v_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    return k, v


@triton.jit
def _tile_update(acc, m_i, l_i, q, k, v, start_n, offs_m, offs_n, Skv, causal_off, qk_scale,
                 MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """One K/V tile of the online softmax (:func:`minimax_lab.triton_blocks.online_softmax_step`).
    ``MASKED`` tiles check bounds and the causal line; unmasked tiles skip all of that."""
    qk = tl.dot(q, tl.trans(k))
    if MASKED:
        cols = start_n + offs_n
        visible = cols[None, :] < Skv
        if CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + causal_off)
        qk = tl.where(visible, qk, float("-inf"))
    return online_softmax_step(acc, m_i, l_i, qk, qk_scale, v)


@triton.jit
def _flash_fwd(Q, K, V, K_desc, V_desc, O, LSE, q_strides, k_strides, v_strides, o_strides,
               S, Skv, Hq, GROUP, qk_scale, S_BUCKET,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
               STORE_LSE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               GROUP_H: tl.constexpr = 1, USE_TMA: tl.constexpr = False, WARP_SPEC: tl.constexpr = False):
    # *_strides: the (batch, sequence, head) strides of each [B, S, H, D] tensor (unit stride along D).
    # S_BUCKET is unused here: it only keys the autotuner's cache (next power of two of the length).
    # K_desc/V_desc are TMA descriptors of K/V seen as 2-D [B*Skv, Hkv*D] when USE_TMA, else unused.
    # Which (batch*head, query tile) this program owns. A 1-D grid walks GROUP_H heads at a time,
    # all query tiles of those heads before the next group: programs that run at the same time
    # then read the same few heads' K/V, which stay in L2 (FlashAttention's own grid puts the
    # query tile fastest, i.e. GROUP_H = 1). Inside a group the query tiles go in reversed order:
    # with causal masking the last tiles have the most work, so they start first and the short
    # ones fill the tail.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(S, BLOCK_M)
    first_bh = pid // (GROUP_H * tiles_m) * GROUP_H
    n_h = tl.minimum(GROUP_H, tl.num_programs(0) // tiles_m - first_bh)  # the last group may be short
    r = pid - first_bh * tiles_m
    bh = first_bh + r % n_h
    start_m = tiles_m - 1 - r // n_h
    b = bh // Hq
    h = bh % Hq
    hk = h // GROUP  # GQA: the kv head of this query head, by pointer arithmetic only
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_ptrs = (Q + b.to(tl.int64) * q_strides[0] + h * q_strides[2] + offs_m[:, None].to(tl.int64) * q_strides[1]
              + offs_d[None, :])
    q_mask = offs_m[:, None] < S
    if BLOCK_D != HEAD_DIM:
        q_mask = q_mask & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(q_ptrs, mask=q_mask, other=0.0)
    k_base = K + b.to(tl.int64) * k_strides[0] + hk * k_strides[2]
    v_base = V + b.to(tl.int64) * v_strides[0] + hk * v_strides[2]

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    causal_off = Skv - S  # query i sees keys j <= i + causal_off (bottom-right aligned)
    if CAUSAL:
        # keys every row of this tile sees: j <= start_m*BLOCK_M + causal_off
        full_end = tl.minimum(start_m * BLOCK_M + causal_off + 1, Skv)
        last_row = tl.minimum(start_m * BLOCK_M + BLOCK_M, S) - 1
        end = tl.minimum(last_row + causal_off + 1, Skv)
    else:
        full_end = Skv
        end = Skv
    full_end = tl.maximum(full_end, 0) // BLOCK_N * BLOCK_N
    end = tl.maximum(end, 0)

    # Off-diagonal tiles: no masking at all, and every tile lies inside this (batch, kv head)'s
    # rows, so a TMA box of the flattened [B*Skv, Hkv*D] view never crosses into the next batch.
    # TMA (Hopper's bulk tensor copy engine) moves a whole tile into swizzled shared memory with
    # one instruction: no per-thread address math, no registers spent on pointers.
    # WARP_SPEC asks Triton to split producer (loads) and consumer (math) warps for this loop.
    kv_row = b * Skv
    for start_n in tl.range(0, full_end, BLOCK_N, warp_specialize=WARP_SPEC):
        if USE_TMA:
            k = K_desc.load([kv_row + start_n, hk * HEAD_DIM])
            v = V_desc.load([kv_row + start_n, hk * HEAD_DIM])
        else:
            k, v = _load_kv(k_base, v_base, start_n, offs_n, offs_d, k_strides[1], v_strides[1], Skv, HEAD_DIM,
                            BLOCK_D, False)
        acc, m_i, l_i = _tile_update(acc, m_i, l_i, q, k, v, start_n, offs_m, offs_n, Skv, causal_off,
                                     qk_scale, False, CAUSAL)
    # Diagonal tiles and the ragged tail: masked pointer loads (they may leave the tensor).
    for start_n in range(full_end, end, BLOCK_N):
        k, v = _load_kv(k_base, v_base, start_n, offs_n, offs_d, k_strides[1], v_strides[1], Skv, HEAD_DIM, BLOCK_D,
                        True)
        acc, m_i, l_i = _tile_update(acc, m_i, l_i, q, k, v, start_n, offs_m, offs_n, Skv, causal_off,
                                     qk_scale, True, CAUSAL)

    out, lse = finish_rows(acc, m_i, l_i)  # rows that saw no key: output 0, lse -inf
    o_ptrs = (O + b.to(tl.int64) * o_strides[0] + h * o_strides[2] + offs_m[:, None].to(tl.int64) * o_strides[1]
              + offs_d[None, :])
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=q_mask)
    if STORE_LSE:
        tl.store(LSE + bh.to(tl.int64) * S + offs_m, natural_lse(lse), mask=offs_m < S)


# Autotuned twins for the GPU, keyed on a power-of-two length bucket so a model that calls it at
# many lengths tunes a handful of times, not once per length. None in the interpreter.
_KEY = ["HEAD_DIM", "CAUSAL", "S_BUCKET"]
_PRUNE = {"early_config_prune": fitting_configs}
_flash_fwd_tuned = (None if runtime.is_interpreter() else
                    triton.autotune(configs=AUTOTUNE_CONFIGS + _configs(SMALL_DEVICE_ROWS, tma=False), key=_KEY,
                                    prune_configs_by=_PRUNE)(_flash_fwd))
_flash_fwd_tuned_ptr = (None if runtime.is_interpreter() else
                        triton.autotune(configs=_configs(AUTOTUNE_ROWS + SMALL_DEVICE_ROWS, tma=False), key=_KEY,
                                        prune_configs_by=_PRUNE)(_flash_fwd))


def _tma_ok(x: torch.Tensor) -> bool:
    """Can K or V ``[B, Skv, Hkv, D]`` (on the kernel device) be read as one 2-D
    ``[B*Skv, Hkv*D]`` TMA descriptor? Needs TMA (:func:`minimax_lab.runtime.supports`), D a power
    of two in [16, 128], rows that follow each other across the batch, heads packed side by side,
    16-byte aligned base and row stride."""
    B, Skv, Hkv, D = x.shape
    if not runtime.supports("tma"):
        return False
    return (D in (16, 32, 64, 128) and x.stride(3) == 1 and (Hkv == 1 or x.stride(2) == D)
            and (B == 1 or x.stride(0) == Skv * x.stride(1)) and x.stride(1) >= Hkv * D
            and (x.stride(1) * x.element_size()) % 16 == 0 and x.data_ptr() % 16 == 0)


def _kv_descriptor(x: torch.Tensor, block_n: int) -> TensorDescriptor:
    B, Skv, Hkv, D = x.shape
    return TensorDescriptor(x, [B * Skv, Hkv * D], [x.stride(1), 1], [block_n, D])


def _launch(q, k, v, o, lse, *, causal, scale, config):
    B, S, Hq, D = q.shape
    Skv, Hkv = k.shape[1], k.shape[2]
    BLOCK_D = max(16, triton.next_power_of_2(D))
    tma = _tma_ok(k) and _tma_ok(v)
    cfg = None if config is None and _flash_fwd_tuned is not None else configs.launch_config(LAUNCH, config=config)
    use_tma = tma and (cfg is None or bool(cfg.get("USE_TMA", False)))
    block_n = 64 if cfg is None else cfg["BLOCK_N"]  # the autotuner's pre-hook resets it per config
    descs = (_kv_descriptor(k, block_n), _kv_descriptor(v, block_n)) if use_tma else (k, v)
    args = (q, k, v, *descs, o, lse if lse is not None else o, *(tuple(t.stride()[:3]) for t in (q, k, v, o)),
            S, Skv, Hq, Hq // Hkv, scale * LOG2E, triton.next_power_of_2(max(S, Skv)))
    meta = dict(HEAD_DIM=D, BLOCK_D=BLOCK_D, CAUSAL=causal, STORE_LSE=lse is not None)
    if cfg is None:
        grid = lambda m: (B * Hq * triton.cdiv(S, m["BLOCK_M"]),)  # noqa: E731
        (_flash_fwd_tuned if use_tma else _flash_fwd_tuned_ptr)[grid](*args, **meta)
        return
    grid = (B * Hq * triton.cdiv(S, cfg["BLOCK_M"]),)
    _flash_fwd[grid](*args, **meta, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], USE_TMA=use_tma,
                     GROUP_H=int(cfg.get("GROUP_H", 1)), WARP_SPEC=bool(cfg.get("WARP_SPEC", False)),
                     num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 2))


def autotuner(use_tma: bool = True):
    """The autotuned kernel a GPU launches without a ``config`` (``use_tma``: the one whose configs
    may load K/V through TMA, else the pointer-load one), ``None`` under the interpreter. Its
    ``best_config`` is the config it picked last."""
    return _flash_fwd_tuned if use_tma else _flash_fwd_tuned_ptr


def flash_attention(q, k, v, *, causal: bool = True, scale: float | None = None, return_lse: bool = False,
                    config: dict | None = None):
    """FlashAttention forward in Triton on the dense-attention contract.

    ``config`` (optional) overrides keys of the fixed launch config (``BLOCK_M``, ``BLOCK_N``,
    ``num_warps``, ``num_stages``, ``USE_TMA``, ``GROUP_H``, ``WARP_SPEC``) instead of autotuning;
    ``config={}`` runs the fixed config as it is (unknown keys raise ``ValueError``). Inputs must be on
    :func:`minimax_lab.runtime.kernel_device`, in fp16, bf16 or fp32 (float64 and inputs that
    require grad raise ``ValueError``: there is no backward; bf16 on a GPU without it raises
    :class:`minimax_lab.runtime.UnsupportedOnDevice`). Returns o (and lse ``[B, Hq, S]`` fp32).
    """
    B, S, Skv, Hq, Hkv, D = check_attention_inputs(q, k, v, scale=scale)
    check_triton_inputs(q=q, k=k, v=v)
    require_dtypes("the flash-attention kernel", q, k, v)
    if D > 256:
        raise ValueError(f"head_dim must be <= 256 for the Triton kernel, got {D}")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out_dtype = q.dtype
    q, k, v = interpreter_safe(q, k, v)  # interpreter: bf16 tl.dot is wrong
    # The kernel assumes unit stride along head_dim; other strides are free.
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    o = torch.empty(B, S, Hq, D, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, Hq, S, dtype=torch.float32, device=q.device) if return_lse else None
    if B * S * Hq > 0:
        if Skv == 0:
            o.zero_()
            if lse is not None:
                lse.fill_(float("-inf"))
        else:
            _launch(q, k, v, o, lse, causal=causal, scale=scale, config=config)
    o = o.to(out_dtype)
    return (o, lse) if return_lse else o


def tile_schedule(S: int, Skv: int, block_m: int, block_n: int, causal: bool = True):
    """What the kernel does with each (query tile, key tile): an int array ``[tiles_m, tiles_n]``
    with 0 = skipped, 1 = unmasked fast loop, 2 = masked loop. Mirrors the loop bounds of
    ``_flash_fwd`` in plain Python, for the notebook's picture of causal tiling."""
    tiles_m, tiles_n = triton.cdiv(S, block_m), triton.cdiv(Skv, block_n)
    grid = np.zeros((tiles_m, tiles_n), dtype=np.int8)
    off = Skv - S
    for m in range(tiles_m):
        if causal:
            full_end = min(m * block_m + off + 1, Skv)
            end = min(min(m * block_m + block_m, S) - 1 + off + 1, Skv)
        else:
            full_end = end = Skv
        full_end = max(full_end, 0) // block_n * block_n
        end = max(end, 0)
        for n in range(0, full_end, block_n):
            grid[m, n // block_n] = 1
        for n in range(full_end, end, block_n):
            grid[m, n // block_n] = 2
    return grid


def launch_order(n_heads: int, tiles_m: int, group_h: int = 1):
    """The (batch*head, query tile) each program id owns, in launch order: an int array
    ``[n_heads * tiles_m, 2]``. Mirrors the index math at the top of ``_flash_fwd`` in plain
    Python, for the notebook's picture of which tiles run side by side (and share K/V in L2)."""
    out = np.zeros((n_heads * tiles_m, 2), dtype=np.int64)
    for pid in range(n_heads * tiles_m):
        first = pid // (group_h * tiles_m) * group_h
        n_h = min(group_h, n_heads - first)
        r = pid - first * tiles_m
        out[pid] = (first + r % n_h, tiles_m - 1 - r // n_h)
    return out
