"""Tune the launch configs of the package's Triton kernels and write the winners per GPU.

    python -m minimax_lab.bench.tune <op> [--out FILE] [--quick]
    python -m minimax_lab.bench.tune all

For each op (``paged_decode``, ``paged_prefill``, ``flash``, ``msa_index``, ``msa_prefill``,
``msa_select``, ``msa_select_fp8``, ``moe_experts``) a short list of candidate configs -- the current config first --
is checked against the op's reference (a candidate whose output is wrong, or that fails to
compile, is dropped and reported), then timed with :func:`minimax_lab.bench.time_fn` on the op's
tuning shapes; the candidate with the smallest geometric mean of its times wins, unless the current
config is within :data:`KEEP_CURRENT_MARGIN` of it (then the current one stays: a difference that
small is run-to-run noise, and re-picking on noise churns the file). ``moe_experts``
is tuned per shape regime (``decode``, ``decode_wide``, ``prefill``).

The winners go into ``<gpu slug>.json`` in :func:`minimax_lab.configs.config_dir` (the package's
``configs/`` folder unless ``MINIMAX_LAB_CONFIG_DIR`` is set) or ``--out``; other ops' entries of
that file are kept. :func:`minimax_lab.configs.launch_config` reads it on that GPU from then on.

``--quick``: tiny shapes and two candidates per op (seconds under the Triton interpreter on a CPU,
where it is the only mode: a dry run of the machinery; the CPU's file is never read by the kernels).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from minimax_lab import bench, configs, resources, runtime


@dataclass
class Case:
    """One tuning shape: ``make(seed)`` builds its inputs; ``check``: compare each candidate's
    output with the reference here; ``time``: time the candidates here."""
    label: str
    make: Callable[[int], dict]
    key: str | None = None
    check: bool = True
    time: bool = True


@dataclass
class Op:
    """How to tune one op: its cases, its candidates (a list, or one per key), the variant that
    --quick tries beside the current config, the kernel and its reference."""
    name: str
    cases: Callable[[bool], list[Case]]               # quick -> cases
    candidates: list[dict] | dict[str, list[dict]]
    quick: dict
    run: Callable[..., object]                        # run(config, **inputs)
    reference: Callable[..., object]                  # reference(**inputs)
    error: Callable[[object, object], float]          # error(out, ref)
    tolerance: Callable[[], float]
    graphs: bool = False                              # time CUDA-graph replays (launch-bound kernels)


def _device_and_dtype() -> tuple[torch.device, torch.dtype]:
    dev = runtime.kernel_device()
    return dev, (torch.float32 if runtime.is_interpreter() else runtime.compute_dtype())


def _current(op: str, key: str | None = None) -> dict:
    """The config the kernel uses now (tuned or built-in; the interpreter's under the interpreter)."""
    return configs.launch_config(op, interpreter=_interpreter_config(op), key=key)


def _interpreter_config(op: str) -> dict:
    from minimax_lab.attention import dense_triton, msa_triton_decode, msa_triton_prefill, msa_triton_select
    from minimax_lab.kvcache import decode_triton, prefill_triton
    from minimax_lab.moe import experts_triton
    return dict({"paged_decode": decode_triton.INTERPRETER_CONFIG, "paged_prefill": prefill_triton.INTERPRETER_CONFIG,
                 "flash": dense_triton.INTERPRETER_CONFIG, "msa_index": msa_triton_decode.INDEX_INTERPRETER_CONFIG,
                 "msa_prefill": msa_triton_prefill.INTERPRETER_CONFIG,
                 "msa_select": msa_triton_select.INTERPRETER_CONFIG,
                 "msa_select_fp8": msa_triton_select.INTERPRETER_CONFIG,
                 "moe_experts": experts_triton.INTERPRETER_CONFIG}[op])


def _with_current(op: str, key: str | None, cands: list[dict]) -> list[dict]:
    """The current config first, then the candidates (each completed by it, duplicates dropped)."""
    cur = _current(op, key)
    out = []
    for c in [cur, *({**cur, **c} for c in cands)]:
        if c not in out:
            out.append(c)
    return out


def _rel_err(out, ref) -> float:
    return bench.relative_error(out, ref)


# --- paged decode / prefill (kvcache) -------------------------------------------------------------

#: BLOCK_N / warps / stages of the paged-decode kernel, and host split heuristics (programs per SM)
PAGED_DECODE_CANDIDATES = [dict(BLOCK_N=n, num_warps=w, num_stages=s) for n, w, s in [
    (32, 4, 2), (32, 4, 3), (32, 4, 4), (64, 4, 2), (64, 4, 3), (64, 4, 4), (64, 8, 2), (64, 8, 3),
    (128, 4, 2), (128, 4, 3), (128, 8, 2), (128, 8, 3)]] + [dict(programs_per_sm=p) for p in (1, 3, 4)]
PAGED_PREFILL_CANDIDATES = [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=st) for m, n, w, st in [
    (16, 64, 4, 3), (16, 64, 4, 2), (16, 128, 4, 2), (32, 64, 8, 3), (32, 64, 8, 2), (32, 128, 8, 2),
    (32, 64, 4, 2), (64, 64, 8, 2)]]
#: --quick: one variant beside the current config (warps: the interpreter runs any)
QUICK_VARIANT = {"num_warps": 2}


def _paged_decode() -> Op:
    from minimax_lab.bench import suite_kvcache as bs
    from minimax_lab.kvcache import decode

    def cases(quick):
        dev, dt = _device_and_dtype()
        return [Case(bs.decode_case_name(c), (lambda c: lambda seed: bs.make_decode_inputs(c, dev, dt, seed))(c))
                for c in (bs.CPU_DECODE[:1] if quick else bs.GPU_DECODE)]

    return Op("paged_decode", cases, PAGED_DECODE_CANDIDATES, QUICK_VARIANT,
              lambda config, **ins: decode.paged_decode_triton(**ins, config=config),
              lambda **ins: bs.gather_sdpa(**ins), _rel_err, lambda: 2e-2, graphs=True)


def _paged_prefill() -> Op:
    from minimax_lab.bench import suite_kvcache as bs
    from minimax_lab.kvcache import prefill

    def cases(quick):
        dev, dt = _device_and_dtype()
        c = bs.CPU_PREFILL[0] if quick else bs.GPU_PREFILL[0]
        return [Case(f"prefill_b{c['B']}_p{c['prefix']}_s{c['S']}",
                     lambda seed: bs.make_prefill_inputs(c, dev, dt, seed))]

    return Op("paged_prefill", cases, PAGED_PREFILL_CANDIDATES, QUICK_VARIANT,
              lambda config, **ins: prefill.paged_prefill_triton(**ins, config=config),
              lambda **ins: prefill.paged_prefill_torch(**ins), _rel_err, lambda: 2e-2, graphs=True)


# --- dense flash attention --------------------------------------------------------------------------

def _flash_cfg(bm, bn, w, s, tma, g):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s, "USE_TMA": tma, "GROUP_H": g}


#: GROUP_H=1024: every head at one query tile before the next tile; GROUP_H=1: all query tiles of
#: one head, then the next head. (Warp specialization, WARP_SPEC, is left out: its compile can hang.)
FLASH_CANDIDATES = [
    _flash_cfg(128, 128, 8, 3, False, 1024), _flash_cfg(128, 128, 8, 3, False, 1),
    _flash_cfg(128, 128, 8, 3, True, 1024), _flash_cfg(128, 128, 8, 3, True, 1), _flash_cfg(128, 128, 8, 3, True, 4),
    _flash_cfg(128, 128, 8, 3, True, 16), _flash_cfg(128, 128, 8, 2, True, 1), _flash_cfg(128, 64, 8, 3, True, 1),
    _flash_cfg(128, 64, 8, 4, True, 1),
    {"BLOCK_M": 256, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2},
]


def _flash() -> Op:
    from minimax_lab.bench import suite_attention as abs_
    from minimax_lab.attention.dense_reference import attention_reference
    from minimax_lab.attention.dense_triton import flash_attention

    def make(B, S, H, D, dev, dt):
        def mk(seed):
            g = torch.Generator(device=dev).manual_seed(seed)
            return {n: torch.randn(B, S, H, D, device=dev, generator=g).to(dt) for n in "qkv"}
        return mk

    def cases(quick):
        dev, dt = _device_and_dtype()
        if quick:
            c = abs_.cases("cpu")[0]
            return [Case(abs_.case_name(c), make(c["B"], c["S"], c["Hq"], c["D"], dev, dt))]
        c = abs_.cases("gpu")[0]  # timed at 16k; checked at 1000 tokens (the reference is S x S)
        return [Case("check_b1_s1000_h16_d128", make(1, 1000, 16, 128, dev, dt), time=False),
                Case(abs_.case_name(c), make(c["B"], c["S"], c["Hq"], c["D"], dev, dt), check=False)]

    return Op("flash", cases, FLASH_CANDIDATES, {"GROUP_H": 1024},
              lambda config, q, k, v: flash_attention(q, k, v, causal=True, config=config),
              lambda q, k, v: attention_reference(q, k, v, causal=True), _rel_err,
              lambda: bench.tolerance_for(_device_and_dtype()[1]))


# --- MSA: decode index pass, sparse prefill, block selection -----------------------------------------

#: pages per program, warps, stages of the decode index pass
MSA_INDEX_CANDIDATES = [{"PAGES": p, "num_warps": w, "num_stages": s}
                        for p, w, s in [(8, 4, 3), (16, 4, 3), (8, 8, 3), (16, 8, 4), (4, 4, 4), (8, 4, 5), (32, 8, 3)]]
#: the KV-outer prefill: L2 sub-chunk, the kernel's launch, the combine's warps (each a change of the current)
MSA_PREFILL_CANDIDATES = (
    [dict(L2_TOKENS=n) for n in (0, 8192)]
    + [dict(BLOCK_M=bm, TOKENS_PER_PROG=tp, num_warps=w, num_stages=st)
       for bm, tp, w, st in [(64, 128, 4, 2), (64, 256, 4, 2), (64, 256, 4, 1), (64, 64, 4, 2), (64, 128, 4, 1), (64, 128, 8, 2),
                             (32, 128, 4, 2), (32, 128, 2, 2), (32, 64, 4, 3), (128, 256, 8, 2)]]
    + [dict(COMBINE_WARPS=w) for w in (4, 8, 16)])
MSA_SELECT_CANDIDATES = [dict(BLOCK_M=bm, num_warps=w, num_stages=st) for bm, w, st in
                         [(128, 8, 3), (128, 8, 2), (128, 8, 4), (128, 4, 3), (64, 4, 3), (64, 4, 4),
                          (256, 8, 3), (256, 8, 2)]]
#: FP8 index tiles are half the bytes of bf16's: deeper pipelines and wider row tiles fit
MSA_SELECT_FP8_CANDIDATES = [dict(BLOCK_M=bm, num_warps=w, num_stages=st) for bm, w, st in
                             [(128, 8, 2), (128, 8, 3), (128, 8, 4), (128, 4, 3), (256, 8, 3), (256, 8, 4),
                              (64, 4, 4)]]
MSA_PREFILL_S = 131072


def _finite_error(out, ref) -> float:
    """Relative error where the reference is finite; ``inf`` where the -inf pattern differs."""
    fin = torch.isfinite(ref)
    if not torch.equal(fin, torch.isfinite(out)):
        return float("inf")
    return bench.relative_error(out[fin], ref[fin]) if fin.any() else 0.0


def _msa_index() -> Op:
    from minimax_lab.bench import suite_msa as mb
    from minimax_lab.attention.msa_torch import paged_block_scores_torch
    from minimax_lab.attention.msa_triton_decode import paged_index_scores_triton

    def cases(quick):
        dev, dt = _device_and_dtype()
        s = mb.CPU if quick else mb.GPU
        sizes = [(2, 70)] if quick else [(32, 32768), (64, 131072)]
        out = [Case(f"decode_b{B}_l{L}", (lambda B, L: lambda seed: _index_inputs(
                    mb.decode_inputs(s, B, L, dev, dt, seed)))(B, L)) for B, L in sizes]
        if not quick:  # a ragged batch: the last page of each sequence part full
            out.insert(0, Case("check_ragged_b3", lambda seed: _index_inputs(_ragged(mb, s, dev, dt, seed)),
                               time=False))
        return out

    return Op("msa_index", cases, MSA_INDEX_CANDIDATES, {"PAGES": 4},
              lambda config, **ins: paged_index_scores_triton(**ins, config=config),
              lambda q_idx, k_idx_cache, block_table, seq_lens: paged_block_scores_torch(
                  q_idx.float(), k_idx_cache.float(), block_table, seq_lens),
              _finite_error, lambda: bench.tolerance_for(_device_and_dtype()[1]))


def _index_inputs(ins: dict) -> dict:
    return {n: ins[n] for n in ("q_idx", "k_idx_cache", "block_table", "seq_lens")}


def _ragged(mb, s, dev, dt, seed):
    ins = mb.decode_inputs(s, 3, 5000, dev, dt, seed)
    full = ins["block_table"].shape[1] * s["Bk"]
    ins["seq_lens"] = torch.tensor([full - 3, s["Bk"] + 1, 40], dtype=torch.int32, device=dev)
    return ins


def _msa_prefill() -> Op:
    from minimax_lab.bench import suite_msa as mb
    from minimax_lab.attention.msa import msa_attention, msa_select
    from minimax_lab.attention.msa_triton_prefill import msa_attention_triton

    def make(s, S, dev, dt):
        def mk(seed):
            ins = mb.prefill_inputs(s, S, dev, dt, seed)
            ins["selected"] = msa_select(ins["q_idx"], ins["k_idx"], block_size=s["Bk"], topk=s["topk"], impl="triton")
            return {**ins, "block_size": s["Bk"], "topk": s["topk"]}
        return mk

    def cases(quick):
        dev, dt = _device_and_dtype()
        if quick:
            return [Case("prefill_s40", make(mb.CPU, 40, dev, dt))]
        return [Case("check_s4173", make(mb.GPU, 4096 + 77, dev, dt), time=False),
                Case(f"prefill_s{MSA_PREFILL_S}", make(mb.GPU, MSA_PREFILL_S, dev, dt), check=False)]

    return Op("msa_prefill", cases, MSA_PREFILL_CANDIDATES, {"COMBINE_WARPS": 2},
              lambda config, **ins: msa_attention_triton(**ins, schedule="kv", config=config),
              lambda **ins: msa_attention(**ins, impl="torch"), _rel_err,
              lambda: bench.tolerance_for(_device_and_dtype()[1]))


def _selection_error(out, ref) -> float:
    """Fraction of (token, group) rows whose set of selected blocks differs from the reference's."""
    a, b = out.sort(dim=-1).values, ref.sort(dim=-1).values
    return float((a != b).any(dim=-1).float().mean()) if a.numel() else 0.0


def _select_cases(fp8: bool) -> Callable[[bool], list[Case]]:
    """The index + top-k tuning shapes (``fp8``: the index tensors quantized to e4m3 with their scales)."""
    from minimax_lab.bench import suite_msa as mb

    def make(s, S, dev, dt):
        def mk(seed):
            ins = mb.prefill_inputs(s, S, dev, dt, seed)
            idx = mb.fp8_index_inputs(ins["q_idx"], ins["k_idx"]) if fp8 else \
                {"q_idx": ins["q_idx"], "k_idx": ins["k_idx"]}
            return {**idx, "block_size": s["Bk"], "topk": s["topk"]}
        return mk

    def cases(quick):
        dev, dt = _device_and_dtype()
        if quick:
            return [Case("select_s80", make(mb.CPU, 80, dev, dt))]  # 5 blocks > topk: a real top-k
        return [Case("check_s8192", make(mb.GPU, 8192, dev, dt), time=False),
                Case(f"select_s{MSA_PREFILL_S}", make(mb.GPU, MSA_PREFILL_S, dev, dt), check=False)]
    return cases


def _msa_select() -> Op:
    from minimax_lab.attention.msa import msa_select
    from minimax_lab.attention.msa_triton_select import msa_select_triton

    return Op("msa_select", _select_cases(fp8=False), MSA_SELECT_CANDIDATES, {"num_warps": 2},
              lambda config, **ins: msa_select_triton(**ins, config=config),
              lambda q_idx, k_idx, **kw: msa_select(q_idx.float(), k_idx.float(), impl="torch", **kw),
              _selection_error, lambda: 1e-3)  # near-ties of fp32 scores may flip a rare row


def _msa_select_fp8() -> Op:
    from minimax_lab.bench import suite_msa as mb
    from minimax_lab.attention.msa_index_fp8 import dequantize_index_keys
    from minimax_lab.attention.msa_triton_select import msa_select_triton

    def reference(q_idx, k_idx, q_idx_scale, k_idx_scale, block_size, topk):
        deq = dequantize_index_keys(q_idx, q_idx_scale), dequantize_index_keys(k_idx, k_idx_scale)
        return deq, block_size, topk

    # the kernel ranks without the query's scale (one positive power of two per row); FP8 tensor
    # cores sum with fewer bits than fp32, so near-tied blocks may swap: the error is the score gap
    # of msa_compare.selection_score_gap, not the share of equal rows
    return Op("msa_select_fp8", _select_cases(fp8=True), MSA_SELECT_FP8_CANDIDATES, {"num_warps": 2},
              lambda config, q_idx_scale, **ins: msa_select_triton(**ins, config=config),
              reference, lambda out, ref: msa_compare.selection_score_gap(out, *ref[0], ref[1], ref[2]),
              lambda: msa_compare.FP8_TIE_TOLERANCE)


# --- MoE experts (per regime) -----------------------------------------------------------------------

def _moe_cfg(bm, bn, bk, w, s, dbn=None, dbk=None, dw=None, ds=None, *, swap=False):
    c = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "num_stages": s,
         "DOWN_BLOCK_N": dbn or bn, "DOWN_BLOCK_K": dbk or bk, "SWAP_AB": swap, "DOWN_SWAP_AB": swap}
    if dw:
        c["DOWN_num_warps"] = dw
    if ds:
        c["DOWN_num_stages"] = ds
    return c


#: end-to-end candidates of the decode regimes (``decode``, ``decode_wide``) and of prefill
MOE_DECODE_CANDIDATES = [
    _moe_cfg(16, 128, 128, 4, 3), _moe_cfg(32, 128, 128, 4, 3), _moe_cfg(16, 64, 256, 4, 3),
    _moe_cfg(16, 128, 128, 4, 3, swap=True), _moe_cfg(16, 64, 128, 4, 4, swap=True),
    _moe_cfg(16, 64, 256, 4, 2, swap=True), _moe_cfg(32, 128, 128, 4, 3, swap=True),
    _moe_cfg(32, 64, 128, 4, 4, swap=True), _moe_cfg(32, 128, 128, 4, 2, swap=True),
    _moe_cfg(64, 128, 128, 4, 2, swap=True),
    # narrower weight tiles: at T=1 the 8 used experts give too few programs to fill the SMs
    _moe_cfg(16, 32, 128, 4, 4, 64, 128, swap=True), _moe_cfg(16, 32, 64, 4, 5, 128, 64, swap=True),
    _moe_cfg(16, 64, 64, 4, 5, 64, 128, swap=True), _moe_cfg(16, 64, 128, 4, 3, 64, 128, swap=True)]
MOE_PREFILL_CANDIDATES = [
    _moe_cfg(128, 64, 64, 8, 3, 128, 64), _moe_cfg(128, 128, 64, 8, 3), _moe_cfg(128, 128, 64, 8, 4),
    _moe_cfg(128, 64, 64, 8, 4, 128, 64),
    # weight tiles through TMA descriptors (USE_TMA) and the grouped launch order (GROUP_M)
    {**_moe_cfg(128, 64, 64, 8, 3, 128, 64), "USE_TMA": True}, {**_moe_cfg(128, 128, 64, 8, 3), "USE_TMA": True},
    {**_moe_cfg(128, 128, 64, 8, 4), "USE_TMA": True}, {**_moe_cfg(128, 64, 64, 8, 3, 128, 64), "GROUP_M": 8},
    {**_moe_cfg(128, 128, 64, 8, 3), "USE_TMA": True, "GROUP_M": 8},
    {**_moe_cfg(128, 64, 64, 8, 3, 256, 64), "USE_TMA": True}, {**_moe_cfg(128, 128, 32, 8, 4), "USE_TMA": True},
    {**_moe_cfg(64, 128, 64, 4, 4), "USE_TMA": True}]
MOE_TOKENS = (1, 64, 256, 4096, 16384)
MOE_QUICK_TOKENS = (1, 40)


def _moe_experts() -> Op:
    from minimax_lab.bench import suite_moe as bs
    from minimax_lab.moe.experts_reference import experts_reference
    from minimax_lab.moe.experts_triton import experts_triton, regime

    weights: dict = {}

    def make(s, T, dev, dt):
        def mk(seed):
            name = json.dumps(s, sort_keys=True)
            if name not in weights:  # one set of weights per shape (GBs at GPU sizes)
                weights[name] = bs.make_weights(s, dev, dt)
            wgu, wd = weights[name]
            return {**bs.make_tokens(s, T, dev, dt, seed), "w_gate_up": wgu, "w_down": wd}
        return mk

    def cases(quick):
        dev, dt = _device_and_dtype()
        weights.clear()
        shapes, tokens = (bs.CPU_SHAPES[:1], MOE_QUICK_TOKENS) if quick else (bs.GPU_SHAPES, MOE_TOKENS)
        return [Case(bs.case_name(s, T), make(s, T, dev, dt), key=regime(T * s["k"], s["E"]))
                for s in shapes for T in tokens]

    cands = {"decode": MOE_DECODE_CANDIDATES, "decode_wide": MOE_DECODE_CANDIDATES, "prefill": MOE_PREFILL_CANDIDATES}
    return Op("moe_experts", cases, cands, {"BLOCK_K": 32},
              lambda config, x, w_gate_up, w_down, weights, ids: experts_triton(x, w_gate_up, w_down, weights, ids,
                                                                                 config=config),
              lambda x, w_gate_up, w_down, weights, ids: experts_reference(x.float(), w_gate_up.float(),
                                                                           w_down.float(), weights.float(), ids),
              _rel_err, lambda: 2e-2, graphs=True)  # decode sizes are launch-bound eagerly


#: op name -> builder of its :class:`Op` (the names of :data:`minimax_lab.configs.OPS` that are tuned here)
TUNERS: dict[str, Callable[[], Op]] = {
    "paged_decode": _paged_decode, "paged_prefill": _paged_prefill, "flash": _flash, "msa_index": _msa_index,
    "msa_prefill": _msa_prefill, "msa_select": _msa_select, "msa_select_fp8": _msa_select_fp8,
    "moe_experts": _moe_experts,
}


#: a candidate must beat the current config's geometric mean by more than this share to replace it
#: (repeat timings of one config on an H200 move by ~0.5-1%; earlier tuning runs crowned 0.4% winners)
KEEP_CURRENT_MARGIN = 0.01


def pick_winner(score: dict[str, float], current: str | None, margin: float = KEEP_CURRENT_MARGIN) -> str:
    """The label with the smallest score, unless ``current`` scores within ``margin`` of it."""
    best = min(score, key=score.get)
    if current in score and score[current] <= score[best] * (1 + margin):
        return current
    return best


def _label(cfg: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in cfg.items())


def tune_op(name: str, *, quick: bool = False, keys=None, log=print) -> dict:
    """Check and time every candidate of ``name``; returns ``{key: {"config", "ms", "timings",
    "rejected"}}`` (key ``None`` for ops not tuned per key). ``keys`` limits an op tuned per key
    to those keys (unknown ones raise ValueError)."""
    if name not in TUNERS:
        raise ValueError(f"unknown op {name!r}; expected one of {sorted(TUNERS)}")
    if runtime.is_interpreter() and not quick:
        raise ValueError("under the Triton interpreter (no GPU) only --quick runs (tiny shapes)")
    op = TUNERS[name]()
    cases = op.cases(quick)
    if keys:
        known = list(dict.fromkeys(c.key for c in cases))
        if None in known or not set(keys) <= set(known):
            raise ValueError(f"{name}: keys {sorted(keys)} not among its tuned keys {known}")
        cases = [c for c in cases if c.key in keys]
    reps, warmup, min_s = (3, 1, 0.0) if quick else (20, 3, 0.2)
    n_sets = 1 if quick else 2
    results: dict = {}
    for key in dict.fromkeys(c.key for c in cases):
        mine = [c for c in cases if c.key == key]
        sets = {c.label: [c.make(seed) for seed in range(n_sets)] for c in mine}
        refs = {c.label: op.reference(**sets[c.label][0]) for c in mine if c.check}
        timings, rejected = {}, {}
        cands = op.candidates[key] if isinstance(op.candidates, dict) else op.candidates
        ordered = _with_current(name, key, [op.quick] if quick else cands)
        timed = [c for c in mine if c.time]
        if not quick and timed and not runtime.is_interpreter():
            _warm_up(lambda: op.run(ordered[0], **sets[timed[0].label][0]), WARM_UP_S)
        for cfg in ordered:
            label = _label(cfg)
            try:
                for c in mine:
                    if c.check:
                        err = op.error(op.run(cfg, **sets[c.label][0]), refs[c.label])
                        if not err <= op.tolerance():
                            raise _Wrong(f"wrong output on {c.label}: error {err:.3g} > {op.tolerance():.3g}")
                per_case = {}
                for c in mine:
                    if c.time:
                        ins = sets[c.label]
                        per_case[c.label] = bench.time_fn(
                            (lambda cfg: lambda **a: op.run(cfg, **a))(cfg), lambda i, ins=ins: ins[i % len(ins)],
                            reps=reps, warmup=warmup, min_time_s=min_s, max_sets=len(ins),
                            cuda_graph=op.graphs and not runtime.is_interpreter()).ms
            except _Wrong as e:
                rejected[label] = str(e)
                log(f"[tune {name}{'' if key is None else ' ' + key}] REJECTED {label}: {e}")
                continue
            except Exception as e:  # noqa: BLE001 - a config that does not compile or launch is a result too
                rejected[label] = f"failed: {type(e).__name__}: {str(e)[:200]}"
                log(f"[tune {name}{'' if key is None else ' ' + key}] FAILED {label}: {rejected[label]}")
                continue
            timings[label] = (cfg, per_case)
            log(f"[tune {name}{'' if key is None else ' ' + key}] {label}: "
                + ", ".join(f"{k} {v:.4f} ms" for k, v in per_case.items()))
        if not timings:
            raise RuntimeError(f"{name}{'' if key is None else ' ' + key}: every candidate was rejected: {rejected}")
        score = {lbl: math.exp(sum(math.log(max(v, 1e-9)) for v in pc.values()) / max(1, len(pc)))
                 for lbl, (_, pc) in timings.items()}
        fastest = min(score, key=score.get)
        best = pick_winner(score, _label(ordered[0]))  # ordered[0]: the current config
        results[key] = {"config": timings[best][0], "ms": round(score[best], 6),
                        "timings": {lbl: {k: round(v, 6) for k, v in pc.items()} for lbl, (_, pc) in timings.items()},
                        "rejected": rejected}
        if best != fastest:
            results[key]["kept_current"] = (f"within {KEEP_CURRENT_MARGIN:.0%} of the fastest, {fastest} "
                                            f"({score[fastest]:.4f} ms)")
        log(f"[tune {name}{'' if key is None else ' ' + key}] best {best} ({score[best]:.4f} ms geometric mean"
            f"{'; kept: ' + results[key]['kept_current'] if best != fastest else ''})")
    return results


#: seconds of untimed calls before the first candidate: a GPU ramps its clocks up under load, and
#: the first config timed (the current one) would otherwise pay for it
WARM_UP_S = 1.0


def _warm_up(fn: Callable[[], object], seconds: float) -> None:
    """Call ``fn`` for about ``seconds`` (at least once), untimed; a failure is left to the timing."""
    end = time.perf_counter() + seconds
    try:
        while True:
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            if time.perf_counter() >= end:
                return
    except Exception:  # noqa: BLE001 - the candidate loop reports it
        return


class _Wrong(Exception):
    """A candidate's output differs from the reference."""


def write_results(name: str, results: dict, path: Path, *, quick: bool = False) -> Path:
    """Put ``name``'s winners into the config file ``path`` (other ops' entries stay; for an op
    tuned per key, so do the keys not tuned this time, with their earlier source)."""
    path = Path(path)
    data = configs.read_file(path) if path.exists() else None
    data = json.loads(json.dumps(data)) if data else {"device": runtime.device_name(), "ops": {}}
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    commit = bench.git_commit()
    keys = "" if list(results) == [None] else " --keys " + " ".join(results)
    entry = {"source": f"python -m minimax_lab.bench.tune {name}{' --quick' if quick else ''}{keys}"
                       f"{f' at {commit[:12]}' if commit else ''} on {runtime.device_name()}, {stamp}"}
    if list(results) == [None]:
        entry["config"] = results[None]["config"]
        entry["measured"] = {k: v for k, v in results[None].items() if k != "config"}
    else:
        prev = data["ops"].get(name, {})
        old = prev.get("by_key", {})
        entry["by_key"] = {**old, **{k: r["config"] for k, r in results.items()}}
        kept = sorted(set(old) - set(results))
        if kept:        # keys not tuned this time keep their config; say where it came from
            entry["earlier_source"] = {**prev.get("earlier_source", {}),
                                       **{k: prev.get("source", "unknown") for k in kept
                                          if k not in prev.get("earlier_source", {})}}
        entry["measured"] = {**prev.get("measured", {}),
                             **{k: {kk: vv for kk, vv in r.items() if kk != "config"} for k, r in results.items()}}
    data["ops"][name] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minimax_lab.bench.tune",
                                 description="Tune a Triton kernel's launch config on this GPU and save the winner.")
    ap.add_argument("op", choices=[*TUNERS, "all"], help="the kernel to tune (all: every one in turn)")
    ap.add_argument("--out", default=None,
                    help="config file to write (default: <config dir>/<gpu slug>.json, the file the kernels read)")
    ap.add_argument("--quick", action="store_true",
                    help="tiny shapes and two candidates (the only mode under the Triton interpreter)")
    ap.add_argument("--keys", nargs="+", default=None,
                    help="only these keys of an op tuned per key (moe_experts: decode, decode_wide, prefill)")
    args = ap.parse_args(argv)
    if runtime.is_interpreter() and not args.quick:
        ap.error("no GPU here (Triton interpreter): pass --quick for a dry run at tiny shapes")
    path = Path(args.out) if args.out else configs.config_path()
    if not args.out and path.parent == configs.PACKAGE_DIR and resources.checkout_root() is None:
        ap.error(f"minimax_lab is installed (not a clone): its folder {path.parent} is not for writing. Set "
                 f"{configs.ENV_DIR} to a folder of yours (the kernels read it from there too) or pass --out FILE")
    for name in (list(TUNERS) if args.op == "all" else [args.op]):
        results = tune_op(name, quick=args.quick, keys=args.keys)
        write_results(name, results, path, quick=args.quick)
        print(f"{name}: " + "; ".join(f"{k or 'config'} {_label(r['config'])}" for k, r in results.items())
              + f" -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
