"""Bench suite ``msa``: what its cases are built from -- the shapes (:data:`GPU`: MSA's public one;
:data:`CPU`: tiny, for the interpreter), seeded inputs (prefill; a paged cache with its pages
scattered at random; the index tensors in FP8; the backward's, with the output's gradient), the
counts its records carry (dense causal FLOPs, the (query, key) pairs a head attends over) -- and
the CPU preset's record: checked against a reference, then timed.
"""
from __future__ import annotations

import math

import torch

from minimax_lab import measure
from minimax_lab.attention.msa import MSA_SHAPE, MSA_SHAPE_CPU
from minimax_lab.attention.msa_index_fp8 import quantize_index_keys


SUITE = "msa"
GPU, CPU = MSA_SHAPE, MSA_SHAPE_CPU


def prefill_inputs(s: dict, S: int, dev, dtype, seed: int, B: int = 1) -> dict:
    g = torch.Generator(device=dev).manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, device=dev, generator=g).to(dtype)  # noqa: E731
    return {"q": r(B, S, s["Hq"], s["D"]), "k": r(B, S, s["G"], s["D"]), "v": r(B, S, s["G"], s["D"]),
            "q_idx": r(B, S, s["G"], s["Didx"]), "k_idx": r(B, S, s["Didx"])}


def selected_pairs(S: int, Bk: int, topk: int) -> int:
    """(query, key) pairs one head attends over: per query t, all t+1 keys when it sees at most
    ``topk`` blocks, else ``(topk-1) * Bk`` full blocks plus ``t % Bk + 1`` keys of the local one."""
    t = torch.arange(S, dtype=torch.int64)
    n = t // Bk + 1
    return int(torch.where(n <= topk, t + 1, (topk - 1) * Bk + t % Bk + 1).sum())


def dense_causal_flops(S: int, Hq: int, D: int, B: int = 1) -> float:
    return 4.0 * B * Hq * D * S * (S + 1) / 2


def _agree(sel_a, sel_b) -> float:
    return float((sel_a == sel_b).all(-1).float().mean())


#: what the FP8-index records say about their index tensors
FP8_INDEX_NOTE = "float8_e4m3fn, one power-of-two scale per vector, quantized in the timed call"


def fp8_index_inputs(q_idx, k_idx) -> dict:
    """The index tensors in FP8 with their scales, as ``msa_select``/``msa_attention`` take them
    (no host read: this runs inside timed calls)."""
    (q8, qs), (k8, ks) = (quantize_index_keys(x, check_values=False) for x in (q_idx, k_idx))
    return {"q_idx": q8, "k_idx": k8, "q_idx_scale": qs, "k_idx_scale": ks}


def decode_inputs(s: dict, B: int, L: int, dev, dtype, seed: int, T: int = 1) -> dict:
    """A paged cache holding B sequences of length L (pages scattered at random), and queries."""
    g = torch.Generator(device=dev).manual_seed(seed)
    ps = s["Bk"]
    maxp = math.ceil(L / ps)
    P = B * maxp
    r = lambda *shape: torch.randn(*shape, device=dev, generator=g).to(dtype)  # noqa: E731
    perm = torch.randperm(P, device=dev, generator=g).to(torch.int32)
    return {"q": r(B, T, s["Hq"], s["D"]), "k_cache": r(P, ps, s["G"], s["D"]), "v_cache": r(P, ps, s["G"], s["D"]),
            "block_table": perm.view(B, maxp).contiguous(), "seq_lens": torch.full((B,), L, dtype=torch.int32, device=dev),
            "q_idx": r(B, T, s["G"], s["Didx"]), "k_idx_cache": r(P, ps, s["Didx"])}


def backward_inputs(s: dict, S: int, dev, dtype, seed: int, B: int = 1) -> dict:
    """Prefill inputs with ``q, k, v`` requiring grad, and the output's gradient ``do``."""
    ins = prefill_inputs(s, S, dev, dtype, seed, B)
    g = torch.Generator(device=dev).manual_seed(seed + 1)
    ins["do"] = torch.randn(ins["q"].shape, device=dev, generator=g).to(dtype)
    for n in ("q", "k", "v"):
        ins[n].requires_grad_(True)
    return ins


def checked_cpu_record(fn, reference, mk, *, case: str, impl: str, shape: dict, dtype, reps: int,
                       reference_dtype: torch.dtype = torch.float64) -> dict:
    """``fn`` checked against ``reference`` on one fresh input (raises ``AssertionError`` when it
    fails), then timed: its record, carrying the check's error (a CPU run: not a speed figure)."""
    res = measure.check(fn, reference, mk, trials=1, name=impl, reference_dtype=reference_dtype)
    print(res.summary())
    if not res.passed:
        raise AssertionError(res.summary())
    t = measure.time_fn(fn, mk, reps=reps, warmup=1)
    return measure.make_record(SUITE, case, impl, t, shape=shape, dtype=dtype, extra={"check_rel_err": res.max_error})
