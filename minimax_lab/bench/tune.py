"""Tune the launch configs of the package's Triton kernels and write the winners per GPU.

    python -m minimax_lab.bench.tune <op> [--out FILE] [--results FILE] [--quick] [--keys KEY ...]
    python -m minimax_lab.bench.tune all

For each op (``paged_decode``, ``paged_decode_fp8``, ``paged_prefill``, ``flash``, ``msa_index``,
``msa_prefill``, ``msa_select``, ``msa_select_fp8``, ``msa_backward``, ``moe_experts``) the
candidates of the op's launch block (:class:`minimax_lab.configs.Launch`, beside its kernel) -- the
current config first -- are checked against the op's reference (a candidate whose output is wrong,
or that fails to compile, is dropped and reported), then timed with :func:`minimax_lab.measure.time_fn`
on the op's tuning shapes; the candidate with the smallest geometric mean of its times wins, unless
the current config is within :data:`KEEP_CURRENT_MARGIN` of it (then the current one stays: a
difference that small is run-to-run noise, and re-picking on noise churns the file). ``moe_experts``
is tuned per shape regime (``decode``, ``decode_wide``, ``prefill``).

The winners go into ``<gpu slug>.json`` in :func:`minimax_lab.configs.config_dir` (the package's
``configs/`` folder unless ``MINIMAX_LAB_CONFIG_DIR`` is set) or ``--out``, each with the run that
produced it as its ``source``; other ops' entries of that file are kept.
:func:`minimax_lab.configs.launch_config` reads it on that GPU from then on. What was measured --
every candidate's times, the rejected ones and why -- is appended to the runs of
``tune_<gpu slug>.json`` in the results folder (:func:`minimax_lab.resources.user_results_dir`) or
``--results``; :func:`recorded_run` reads them back.

``--quick``: tiny shapes and two candidates per op (seconds under the Triton interpreter on a CPU,
where it is the only mode: a dry run of the machinery; the CPU's file is never read by the kernels).
Mistakes on the command line, and config or results files that cannot be read, end with a
one-line message and exit status 2; a key whose every candidate is rejected, with one line and 1.
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

from minimax_lab import configs, measure, resources, runtime
from minimax_lab.attention import (dense_triton, msa_backward_triton, msa_compare, msa_triton_decode,
                                   msa_triton_prefill, msa_triton_select)
from minimax_lab.attention.dense_reference import attention_reference
from minimax_lab.attention.msa import msa_attention, msa_select
from minimax_lab.attention.msa_backward_torch import msa_attention_backward_torch
from minimax_lab.attention.msa_index_fp8 import dequantize_index_keys
from minimax_lab.attention.msa_torch import paged_block_scores_torch
from minimax_lab.bench import suite_attention, suite_kvcache, suite_moe
from minimax_lab.bench import suite_msa_inputs as suite_msa
from minimax_lab.bench.suite_msa_backward import backward_inputs
from minimax_lab.bench.parsing import Parser
from minimax_lab.paged_kv import decode, decode_triton, prefill, prefill_triton
from minimax_lab.moe import experts_triton
from minimax_lab.moe.experts_reference import experts_reference


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
    """How to tune one op: its launch block (candidates and the ``--quick`` variant), its cases,
    the kernel and its reference."""
    launch: configs.Launch
    cases: Callable[[bool], list[Case]]               # quick -> cases
    run: Callable[..., object]                        # run(config, **inputs)
    reference: Callable[..., object]                  # reference(**inputs)
    error: Callable[[object, object], float]          # error(out, ref)
    tolerance: Callable[[], float]
    graphs: bool = False                              # time CUDA-graph replays (launch-bound kernels)

    @property
    def name(self) -> str:
        return self.launch.op


def _device_and_dtype() -> tuple[torch.device, torch.dtype]:
    dev = runtime.kernel_device()
    return dev, (torch.float32 if runtime.is_interpreter() else runtime.compute_dtype())


def _with_current(launch: configs.Launch, key: str | None, cands: list[dict]) -> list[dict]:
    """The current config first, then the candidates (each completed by it, duplicates dropped)."""
    cur = configs.launch_config(launch, key=key)
    out = []
    for c in [cur, *({**cur, **c} for c in cands)]:
        if c not in out:
            out.append(c)
    return out


def _rel_err(out, ref) -> float:
    return measure.relative_error(out, ref)


# --- paged decode / prefill (kvcache) -------------------------------------------------------------

def _paged_decode() -> Op:
    def cases(quick):
        dev, dt = _device_and_dtype()
        return [Case(suite_kvcache.decode_case_name(c),
                     (lambda c: lambda seed: suite_kvcache.make_decode_inputs(c, dev, dt, seed))(c))
                for c in (suite_kvcache.CPU_DECODE[:1] if quick else suite_kvcache.GPU_DECODE)]

    return Op(decode_triton.LAUNCH, cases,
              lambda config, **ins: decode.paged_decode_triton(**ins, config=config),
              lambda **ins: suite_kvcache.gather_sdpa(**ins), _rel_err, lambda: 2e-2, graphs=True)


def _paged_decode_fp8() -> Op:
    """The FP8 read path, on per-token scales (the engine's layout) at the bf16 decode's shapes."""
    def cases(quick):
        dev, dt = _device_and_dtype()
        return [Case(suite_kvcache.decode_case_name(c) + "_fp8",
                     (lambda c: lambda seed: suite_kvcache.make_fp8_decode_inputs(c, dev, dt, seed, "token"))(c))
                for c in (suite_kvcache.CPU_FP8_DECODE[:1] if quick else suite_kvcache.GPU_FP8_DECODE)]

    return Op(decode_triton.FP8_LAUNCH, cases,
              lambda config, **ins: decode.paged_decode_triton(**ins, config=config),
              lambda **ins: decode.paged_decode(**ins, impl="torch"), _rel_err, lambda: 3e-2, graphs=True)


def _paged_prefill() -> Op:
    def cases(quick):
        dev, dt = _device_and_dtype()
        c = suite_kvcache.CPU_PREFILL[0] if quick else suite_kvcache.GPU_PREFILL[0]
        return [Case(f"prefill_b{c['B']}_p{c['prefix']}_s{c['S']}",
                     lambda seed: suite_kvcache.make_prefill_inputs(c, dev, dt, seed))]

    return Op(prefill_triton.LAUNCH, cases,
              lambda config, **ins: prefill.paged_prefill_triton(**ins, config=config),
              lambda **ins: prefill.paged_prefill_torch(**ins), _rel_err, lambda: 2e-2, graphs=True)


# --- dense flash attention --------------------------------------------------------------------------

def _flash() -> Op:
    def make(B, S, H, D, dev, dt):
        def mk(seed):
            g = torch.Generator(device=dev).manual_seed(seed)
            return {n: torch.randn(B, S, H, D, device=dev, generator=g).to(dt) for n in "qkv"}
        return mk

    def cases(quick):
        dev, dt = _device_and_dtype()
        if quick:
            c = suite_attention.cases("cpu")[0]
            return [Case(suite_attention.case_name(c), make(c["B"], c["S"], c["Hq"], c["D"], dev, dt))]
        c = suite_attention.cases("gpu")[0]  # timed at 16k; checked at 1000 tokens (the reference is S x S)
        return [Case("check_b1_s1000_h16_d128", make(1, 1000, 16, 128, dev, dt), time=False),
                Case(suite_attention.case_name(c), make(c["B"], c["S"], c["Hq"], c["D"], dev, dt), check=False)]

    return Op(dense_triton.LAUNCH, cases,
              lambda config, q, k, v: dense_triton.flash_attention(q, k, v, causal=True, config=config),
              lambda q, k, v: attention_reference(q, k, v, causal=True), _rel_err,
              lambda: measure.tolerance_for(_device_and_dtype()[1]))


# --- MSA: decode index pass, sparse prefill, block selection -----------------------------------------

MSA_PREFILL_S = 131072


def _finite_error(out, ref) -> float:
    """Relative error where the reference is finite; ``inf`` where the -inf pattern differs."""
    fin = torch.isfinite(ref)
    if not torch.equal(fin, torch.isfinite(out)):
        return float("inf")
    return measure.relative_error(out[fin], ref[fin]) if fin.any() else 0.0


def _msa_index() -> Op:
    def cases(quick):
        dev, dt = _device_and_dtype()
        s = suite_msa.CPU if quick else suite_msa.GPU
        sizes = [(2, 70)] if quick else [(32, 32768), (64, 131072)]
        out = [Case(f"decode_b{B}_l{L}", (lambda B, L: lambda seed: _index_inputs(
                    suite_msa.decode_inputs(s, B, L, dev, dt, seed)))(B, L)) for B, L in sizes]
        if not quick:  # a ragged batch: the last page of each sequence part full
            out.insert(0, Case("check_ragged_b3", lambda seed: _index_inputs(_ragged(s, dev, dt, seed)), time=False))
        return out

    return Op(msa_triton_decode.INDEX_LAUNCH, cases,
              lambda config, **ins: msa_triton_decode.paged_index_scores_triton(**ins, config=config),
              lambda q_idx, k_idx_cache, block_table, seq_lens: paged_block_scores_torch(
                  q_idx.float(), k_idx_cache.float(), block_table, seq_lens),
              _finite_error, lambda: measure.tolerance_for(_device_and_dtype()[1]))


def _index_inputs(ins: dict) -> dict:
    return {n: ins[n] for n in ("q_idx", "k_idx_cache", "block_table", "seq_lens")}


def _ragged(s, dev, dt, seed):
    ins = suite_msa.decode_inputs(s, 3, 5000, dev, dt, seed)
    full = ins["block_table"].shape[1] * s["Bk"]
    ins["seq_lens"] = torch.tensor([full - 3, s["Bk"] + 1, 40], dtype=torch.int32, device=dev)
    return ins


def _msa_prefill() -> Op:
    def make(s, S, dev, dt):
        def mk(seed):
            ins = suite_msa.prefill_inputs(s, S, dev, dt, seed)
            ins["selected"] = msa_select(ins["q_idx"], ins["k_idx"], block_size=s["Bk"], topk=s["topk"], impl="triton")
            return {**ins, "block_size": s["Bk"], "topk": s["topk"]}
        return mk

    def cases(quick):
        dev, dt = _device_and_dtype()
        if quick:
            return [Case("prefill_s40", make(suite_msa.CPU, 40, dev, dt))]
        return [Case("check_s4173", make(suite_msa.GPU, 4096 + 77, dev, dt), time=False),
                Case(f"prefill_s{MSA_PREFILL_S}", make(suite_msa.GPU, MSA_PREFILL_S, dev, dt), check=False)]

    return Op(msa_triton_prefill.LAUNCH, cases,
              lambda config, **ins: msa_triton_prefill.msa_attention_triton(**ins, schedule="kv", config=config),
              lambda **ins: msa_attention(**ins, impl="torch"), _rel_err,
              lambda: measure.tolerance_for(_device_and_dtype()[1]))


def _selection_error(out, ref) -> float:
    """Fraction of (token, group) rows whose set of selected blocks differs from the reference's."""
    a, b = out.sort(dim=-1).values, ref.sort(dim=-1).values
    return float((a != b).any(dim=-1).float().mean()) if a.numel() else 0.0


def _select_cases(fp8: bool) -> Callable[[bool], list[Case]]:
    """The index + top-k tuning shapes (``fp8``: the index tensors quantized to e4m3 with their scales)."""
    def make(s, S, dev, dt):
        def mk(seed):
            ins = suite_msa.prefill_inputs(s, S, dev, dt, seed)
            idx = suite_msa.fp8_index_inputs(ins["q_idx"], ins["k_idx"]) if fp8 else \
                {"q_idx": ins["q_idx"], "k_idx": ins["k_idx"]}
            return {**idx, "block_size": s["Bk"], "topk": s["topk"]}
        return mk

    def cases(quick):
        dev, dt = _device_and_dtype()
        if quick:
            return [Case("select_s80", make(suite_msa.CPU, 80, dev, dt))]  # 5 blocks > topk: a real top-k
        return [Case("check_s8192", make(suite_msa.GPU, 8192, dev, dt), time=False),
                Case(f"select_s{MSA_PREFILL_S}", make(suite_msa.GPU, MSA_PREFILL_S, dev, dt), check=False)]
    return cases


def _msa_select() -> Op:
    return Op(msa_triton_select.LAUNCH, _select_cases(fp8=False),
              lambda config, **ins: msa_triton_select.msa_select_triton(**ins, config=config),
              lambda q_idx, k_idx, **kw: msa_select(q_idx.float(), k_idx.float(), impl="torch", **kw),
              _selection_error, lambda: 1e-3)  # near-ties of fp32 scores may flip a rare row


def _msa_select_fp8() -> Op:
    def reference(q_idx, k_idx, q_idx_scale, k_idx_scale, block_size, topk):
        deq = dequantize_index_keys(q_idx, q_idx_scale), dequantize_index_keys(k_idx, k_idx_scale)
        return deq, block_size, topk

    # the kernel ranks without the query's scale (one positive power of two per row); FP8 tensor
    # cores sum with fewer bits than fp32, so near-tied blocks may swap: the error is the score gap
    # of msa_compare.selection_score_gap, not the share of equal rows
    return Op(msa_triton_select.FP8_LAUNCH, _select_cases(fp8=True),
              lambda config, q_idx_scale, **ins: msa_triton_select.msa_select_triton(**ins, config=config),
              reference, lambda out, ref: msa_compare.selection_score_gap(out, *ref[0], ref[1], ref[2]),
              lambda: msa_compare.FP8_TIE_TOLERANCE)


# --- MSA backward ----------------------------------------------------------------------------------

def _msa_backward() -> Op:
    """The backward kernels from what the Triton forward saves (``o``, ``lse``, the selection),
    against the torch backward in fp32 over the same forward's outputs."""
    def make(s, S, dev, dt):
        def mk(seed):
            ins = backward_inputs(s, S, dev, dt, seed)
            q, k, v = (ins[n].detach() for n in "qkv")
            kw = dict(block_size=s["Bk"], topk=s["topk"])
            with torch.no_grad():
                sel = msa_select(ins["q_idx"], ins["k_idx"], impl="triton", **kw)
                o, lse = msa_attention(q, k, v, ins["q_idx"], ins["k_idx"], impl="triton", selected=sel,
                                       return_lse=True, **kw)
            return {"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": ins["do"], "selected": sel,
                    "block_size": s["Bk"]}
        return mk

    def cases(quick):
        dev, dt = _device_and_dtype()
        if quick:
            return [Case("backward_s40", make(suite_msa.CPU, 40, dev, dt))]
        return [Case("check_s4173", make(suite_msa.GPU, 4096 + 77, dev, dt), time=False)] + [
            Case(f"backward_s{S}", make(suite_msa.GPU, S, dev, dt), check=False) for S in (16384, 65536)]

    def reference(q, k, v, o, lse, do, selected, block_size):
        f32 = (t.float() for t in (q, k, v, o, lse, do))
        return msa_attention_backward_torch(*f32, selected, block_size=block_size)

    return Op(msa_backward_triton.LAUNCH, cases,
              lambda config, **ins: msa_backward_triton.msa_attention_backward_triton(**ins, config=config),
              reference, lambda out, ref: max(_rel_err(a, b) for a, b in zip(out, ref)),
              lambda: measure.tolerance_for(_device_and_dtype()[1]))


# --- MoE experts (per regime) -----------------------------------------------------------------------

MOE_TOKENS = (1, 64, 256, 4096, 16384)
MOE_QUICK_TOKENS = (1, 40)


def _moe_experts() -> Op:
    weights: dict = {}

    def make(s, T, dev, dt):
        def mk(seed):
            name = json.dumps(s, sort_keys=True)
            if name not in weights:  # one set of weights per shape (GBs at GPU sizes)
                weights[name] = suite_moe.make_weights(s, dev, dt)
            wgu, wd = weights[name]
            return {**suite_moe.make_tokens(s, T, dev, dt, seed), "w_gate_up": wgu, "w_down": wd}
        return mk

    def cases(quick):
        dev, dt = _device_and_dtype()
        weights.clear()
        shapes, tokens = (suite_moe.CPU_SHAPES[:1], MOE_QUICK_TOKENS) if quick else (suite_moe.GPU_SHAPES, MOE_TOKENS)
        return [Case(suite_moe.case_name(s, T), make(s, T, dev, dt), key=experts_triton.regime(T * s["k"], s["E"]))
                for s in shapes for T in tokens]

    return Op(experts_triton.LAUNCH, cases,
              lambda config, x, w_gate_up, w_down, weights, ids: experts_triton.experts_triton(
                  x, w_gate_up, w_down, weights, ids, config=config),
              lambda x, w_gate_up, w_down, weights, ids: experts_reference(x.float(), w_gate_up.float(),
                                                                           w_down.float(), weights.float(), ids),
              _rel_err, lambda: 2e-2, graphs=True)  # decode sizes are launch-bound eagerly


#: op name -> builder of its :class:`Op` (every launch block with candidates)
TUNERS: dict[str, Callable[[], Op]] = {
    "paged_decode": _paged_decode, "paged_decode_fp8": _paged_decode_fp8, "paged_prefill": _paged_prefill,
    "flash": _flash, "msa_index": _msa_index, "msa_prefill": _msa_prefill, "msa_select": _msa_select,
    "msa_select_fp8": _msa_select_fp8, "msa_backward": _msa_backward, "moe_experts": _moe_experts,
}


#: a candidate must beat the current config's geometric mean by more than this share to replace it
#: (repeat timings of one config move by about this much)
KEEP_CURRENT_MARGIN = 0.01


def pick_winner(score: dict[str, float], current: str | None, margin: float = KEEP_CURRENT_MARGIN) -> str:
    """The label with the smallest score, unless ``current`` scores within ``margin`` of it."""
    best = min(score, key=score.get)
    if current in score and score[current] <= score[best] * (1 + margin):
        return current
    return best


def label(cfg: dict) -> str:
    """A config as the tuner names it: ``"BLOCK_N=64,num_warps=4,..."``."""
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
        tag = f"[tune {name}{'' if key is None else ' ' + key}]"
        mine = [c for c in cases if c.key == key]
        sets = {c.label: [c.make(seed) for seed in range(n_sets)] for c in mine}
        refs = {c.label: op.reference(**sets[c.label][0]) for c in mine if c.check}
        timings, rejected = {}, {}
        ordered = _with_current(op.launch, key, [dict(op.launch.quick)] if quick else op.launch.candidates_for(key))
        timed = [c for c in mine if c.time]
        if not quick and timed and not runtime.is_interpreter():
            _warm_up(lambda: op.run(ordered[0], **sets[timed[0].label][0]), WARM_UP_S)
        for cfg in ordered:
            name_of = label(cfg)
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
                        per_case[c.label] = measure.time_fn(
                            (lambda cfg: lambda **a: op.run(cfg, **a))(cfg), lambda i, ins=ins: ins[i % len(ins)],
                            reps=reps, warmup=warmup, min_time_s=min_s, max_sets=len(ins),
                            cuda_graph=op.graphs and not runtime.is_interpreter()).ms
            except _Wrong as e:
                rejected[name_of] = str(e)
                log(f"{tag} REJECTED {name_of}: {e}")
                continue
            except Exception as e:  # noqa: BLE001 - a config that does not compile or launch is a result too
                rejected[name_of] = f"failed: {type(e).__name__}: {str(e)[:200]}"
                log(f"{tag} FAILED {name_of}: {rejected[name_of]}")
                continue
            timings[name_of] = (cfg, per_case)
            log(f"{tag} {name_of}: " + ", ".join(f"{k} {v:.4f} ms" for k, v in per_case.items()))
        if not timings:
            raise RuntimeError(f"{name}{'' if key is None else ' ' + key}: every candidate was rejected: {rejected}")
        score = {lbl: math.exp(sum(math.log(max(v, 1e-9)) for v in pc.values()) / max(1, len(pc)))
                 for lbl, (_, pc) in timings.items()}
        fastest = min(score, key=score.get)
        best = pick_winner(score, label(ordered[0]))  # ordered[0]: the current config
        results[key] = {"config": timings[best][0], "ms": round(score[best], 6),
                        "timings": {lbl: {k: round(v, 6) for k, v in pc.items()} for lbl, (_, pc) in timings.items()},
                        "rejected": rejected}
        if best != fastest:
            results[key]["kept_current"] = (f"within {KEEP_CURRENT_MARGIN:.0%} of the fastest, {fastest} "
                                            f"({score[fastest]:.4f} ms)")
        log(f"{tag} best {best} ({score[best]:.4f} ms geometric mean"
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


def run_source(name: str, keys: list | None, *, quick: bool = False) -> str:
    """How a tuner run is named in the files it writes: the command, the GPU and the day."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    tail = "" if not keys or keys == [None] else " --keys " + " ".join(keys)
    return (f"python -m minimax_lab.bench.tune {name}{' --quick' if quick else ''}{tail} on "
            f"{runtime.device_name()}, {stamp}")


def _atomic_write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def write_results(name: str, results: dict, path: Path, *, quick: bool = False) -> Path:
    """Put ``name``'s winners into the config file ``path``: values and the run that produced
    them, nothing else (other ops' entries stay; for an op tuned per key, so do the keys not tuned
    this time, with their own source)."""
    path = Path(path)
    data = configs.read_file(path) if path.exists() else None
    data = json.loads(json.dumps(data)) if data else {"device": runtime.device_name(), "ops": {}}
    source = run_source(name, list(results), quick=quick)
    if list(results) == [None]:
        entry = {"source": source, "config": results[None]["config"]}
    else:
        prev = data["ops"].get(name, {})
        old_source = prev.get("source", {})
        old_source = old_source if isinstance(old_source, dict) else {k: old_source for k in prev.get("by_key", {})}
        entry = {"source": {**old_source, **{k: source for k in results}},
                 "by_key": {**prev.get("by_key", {}), **{k: r["config"] for k, r in results.items()}}}
    data["ops"][name] = entry
    _atomic_write(path, data)
    return path


def results_path(slug: str | None = None) -> Path:
    """The measurements file of a GPU (default: this one) in the user's results folder."""
    return resources.user_results_dir() / f"tune_{slug or runtime.device_slug()}.json"


def _read_runs(path: Path) -> dict:
    """A measurements file's content: ``{"device": ..., "runs": [...]}`` (empty if it does not
    exist); ``ValueError`` naming the file when it cannot be read as one."""
    if not path.exists():
        return {"device": None, "runs": []}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise ValueError(f"{path}: expected an object with a 'runs' list")
    return data


def write_measurements(name: str, results: dict, path: Path, *, quick: bool = False) -> Path:
    """Append one run per tuned key to the measurements file ``path``: the op, the key, the run's
    source, the winner, its score and every candidate's times and rejections."""
    path = Path(path)
    data = _read_runs(path)
    data["device"] = data["device"] or runtime.device_name()
    source = run_source(name, list(results), quick=quick)
    data["runs"] += [{"op": name, "key": key, "source": source, **r} for key, r in results.items()]
    _atomic_write(path, data)
    return path


def recorded_run(op: str, key: str | None = None, *, device: str = "NVIDIA H200") -> dict | None:
    """The newest tuner run of ``op`` (and ``key``) measured on ``device``, from the shipped
    measurements and the user's own (:func:`minimax_lab.resources.results_dirs`), or ``None``:
    ``{"op", "key", "source", "config", "ms", "timings": {label: {case: ms}}, "rejected"}``."""
    found = None
    for folder in resources.results_dirs():
        for run in _read_runs(folder / f"tune_{runtime.device_slug(device)}.json")["runs"]:
            if run.get("op") == op and run.get("key") == key:
                found = run
    return found


def main(argv=None) -> int:
    ap = Parser(prog="python -m minimax_lab.bench.tune",
                 description="Tune a Triton kernel's launch config on this GPU and save the winner.")
    ap.add_argument("op", choices=[*TUNERS, "all"], help="the kernel to tune (all: every one in turn)")
    ap.add_argument("--out", default=None,
                    help="config file to write (default: <config dir>/<gpu slug>.json, the file the kernels read)")
    ap.add_argument("--results", default=None,
                    help="measurements file to append to (default: <results>/tune_<gpu slug>.json)")
    ap.add_argument("--quick", action="store_true",
                    help="tiny shapes and two candidates (the only mode under the Triton interpreter)")
    ap.add_argument("--keys", nargs="+", default=None,
                    help="only these keys of an op tuned per key (moe_experts: decode, decode_wide, prefill)")
    args = ap.parse_args(argv)
    if runtime.is_interpreter() and not args.quick:
        ap.error("no GPU here (Triton interpreter): pass --quick for a dry run at tiny shapes")
    path = Path(args.out) if args.out else configs.config_path(runtime.device_slug())
    if not args.out and path.parent == configs.PACKAGE_DIR and resources.checkout_root() is None:
        ap.error(f"minimax_lab is installed (not a clone): its folder {path.parent} is not for writing. Set "
                 f"{configs.ENV_DIR} to a folder of yours (the kernels read it from there too) or pass --out FILE")
    try:
        measured = Path(args.results) if args.results else results_path()
        configs.read_file(path) if path.exists() else None   # damaged files: say so before tuning
        _read_runs(measured)
        for name in (list(TUNERS) if args.op == "all" else [args.op]):
            results = tune_op(name, quick=args.quick, keys=args.keys)
            write_results(name, results, path, quick=args.quick)
            write_measurements(name, results, measured, quick=args.quick)
            print(f"{name}: " + "; ".join(f"{k or 'config'} {label(r['config'])}" for k, r in results.items())
                  + f" -> {path}, measurements -> {measured}")
    except (ValueError, OSError) as e:
        ap.error(str(e).splitlines()[0] if str(e) else type(e).__name__)
    except RuntimeError as e:  # every candidate of a key rejected: the run found nothing to write
        ap.exit(1, f"{ap.prog}: {str(e).splitlines()[0]}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
