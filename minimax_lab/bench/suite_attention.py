"""Bench suite ``attention``: our Triton FlashAttention forward against SDPA and FlexAttention.

For each case: first a correctness check of ours against the fp32 ``reference`` at a size where
the reference is affordable (ragged length included), then ours and every peer timed in the same
process with :func:`minimax_lab.measure.time_fn` on rotating inputs. FLOPs of causal attention
count the visible half: ``2 * 2 * B * H * S * Skv * D * (1/2)`` (two matmuls of 2 flops per MAC).

Peers: SDPA pinned to its flash backend (FlashAttention-2) and to cuDNN where present, and
FlexAttention compiled with a causal block mask. A peer that fails is skipped with a note in
the record's ``peer_notes``. At ``preset="cpu"`` the shapes are tiny (interpreter; seconds).
Case groups: :data:`CASES` (``python -m minimax_lab.bench attention --cases gqa``).
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from minimax_lab import configs, measure, runtime
from minimax_lab.attention import dense_triton
from minimax_lab.attention.dense import attention
from minimax_lab.attention.dense_reference import attention_reference
from minimax_lab.attention.dense_triton import flash_attention

SUITE = "attention"


def cases(preset: str = "auto") -> list[dict]:
    """The suite's cases: B*S = 64k tokens, 16 heads, D=128 causal (GPU) and a GQA case."""
    if runtime.resolve_preset(preset) == "gpu":
        out = [dict(B=65536 // S, S=S, Hq=16, Hkv=16, D=128, causal=True) for S in (16384, 65536, 4096)]
        out.append(dict(B=1, S=32768, Hq=64, Hkv=4, D=128, causal=True))
        return out
    return [dict(B=1, S=64, Hq=2, Hkv=2, D=32, causal=True), dict(B=1, S=48, Hq=4, Hkv=1, D=32, causal=True)]


_shapes = cases  # run's ``cases`` argument (the groups) hides the function inside run


def case_name(c: dict) -> str:
    gqa = f"_gqa{c['Hq']}-{c['Hkv']}" if c["Hq"] != c["Hkv"] else f"_h{c['Hq']}"
    return f"{'causal' if c['causal'] else 'full'}_b{c['B']}_s{c['S']}{gqa}_d{c['D']}"


def attention_flops(B, S, Skv, Hq, D, causal) -> float:
    """Matmul FLOPs of one forward pass (causal: the visible triangle, ~half)."""
    pairs = S * Skv - (S * (S - 1) / 2 if causal and S == Skv else 0)
    return 4.0 * B * Hq * D * (pairs if causal else S * Skv)


def tuned_config(use_tma: bool = True) -> dict | None:
    """The config the flash kernel's autotuner picked last (:func:`.dense_triton.autotuner`;
    ``None`` before the first tuned call or in the interpreter), as a plain dict for records."""
    best = getattr(dense_triton.autotuner(use_tma), "best_config", None)
    if best is None:
        return None
    return {**best.kwargs, "num_warps": best.num_warps, "num_stages": best.num_stages}


def autotune_timings(use_tma: bool = True) -> dict:
    """``{config label: ms}`` of the flash autotuner's last benchmark (its own inputs, not rotated)."""
    out = {}
    for c, t in (getattr(dense_triton.autotuner(use_tma), "configs_timings", None) or {}).items():
        kw = c.kwargs
        label = (f"{kw['BLOCK_M']}x{kw['BLOCK_N']}_w{c.num_warps}_s{c.num_stages}_g{kw.get('GROUP_H', 1)}"
                 + ("_tma" if kw.get("USE_TMA") else ""))
        out[label] = float(t[0] if isinstance(t, (list, tuple)) else t)
    return out


def _peers(c: dict, dev, dtype):
    """{name: fn(q, k, v) on [B, H, S, D]} for the peers available here, plus notes."""
    gqa = {"enable_gqa": True} if c["Hq"] != c["Hkv"] else {}
    peers, notes = {}, {}

    def sdpa_with(backend):
        def fn(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=c["causal"], **gqa)
        return fn

    peers["sdpa_flash"] = sdpa_with(SDPBackend.FLASH_ATTENTION)
    if dev.type == "cuda" and hasattr(SDPBackend, "CUDNN_ATTENTION"):
        peers["sdpa_cudnn"] = sdpa_with(SDPBackend.CUDNN_ATTENTION)
    else:
        notes["sdpa_cudnn"] = "no cuDNN attention backend on this device"
    if dev.type == "cuda":
        try:
            mask = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, c["S"], c["S"], device=dev) \
                if c["causal"] else None
            compiled = torch.compile(flex_attention, dynamic=False)
            peers["flex_compiled"] = lambda q, k, v: compiled(q, k, v, block_mask=mask, enable_gqa=bool(gqa))
        except Exception as e:  # noqa: BLE001 - a missing peer is a note, not a failure
            notes["flex_compiled"] = f"{type(e).__name__}: {e}"[:200]
    else:
        notes["flex_compiled"] = "FlexAttention needs torch.compile on a GPU; skipped on the CPU"
    return peers, notes


def run_case(c: dict, *, reps: int = 20, configs: dict | None = None) -> list[dict]:
    """Check, then time ours (autotuned, plus any fixed ``configs``) and the peers for one case."""
    dev = runtime.kernel_device()
    dtype = runtime.compute_dtype() if dev.type == "cuda" else torch.float32
    B, S, Hq, Hkv, D, causal = c["B"], c["S"], c["Hq"], c["Hkv"], c["D"], c["causal"]

    # 1. correctness at an affordable size, ragged on purpose (not a multiple of any block)
    S_chk = min(S, 1000 if dev.type == "cuda" else 37)

    def chk_inputs(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        mk = lambda h: torch.randn(1, S_chk, h, D, device=dev, dtype=dtype, generator=g)  # noqa: E731
        return {"q": mk(Hq), "k": mk(Hkv), "v": mk(Hkv)}

    variants = {"triton": lambda q, k, v: flash_attention(q, k, v, causal=causal)}
    for label, cfg in (configs or {}).items():
        variants[f"triton_{label}"] = (lambda cfg: lambda q, k, v: flash_attention(q, k, v, causal=causal,
                                                                                   config=cfg))(cfg)
    check_err, failed = {}, {}
    for impl, fn in list(variants.items()):  # every variant we time is checked first
        try:
            r = measure.check(fn, lambda q, k, v: attention_reference(q, k, v, causal=causal), chk_inputs,
                              name=f"{impl} {case_name(c)} S={S_chk}", trials=2, reference_dtype=torch.float32)
        except Exception as e:  # noqa: BLE001 - a fixed step config that does not compile is a note
            if impl == "triton":
                raise
            failed[impl] = f"{type(e).__name__}: {e}"[:200]
            print(f"{impl}: skipped, {failed[impl]}")
            del variants[impl]
            continue
        print(r.summary())
        if not r.passed:
            raise AssertionError(r.summary())
        check_err[impl] = r.max_error

    # 2. timing, ours on [B, S, H, D] and peers on their native [B, H, S, D]
    def ours_inputs(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        mk = lambda h: torch.randn(B, S, h, D, device=dev, dtype=dtype, generator=g)  # noqa: E731
        return {"q": mk(Hq), "k": mk(Hkv), "v": mk(Hkv)}

    def peer_inputs(seed):
        return {n: t.transpose(1, 2).contiguous() for n, t in ours_inputs(seed).items()}

    flops = attention_flops(B, S, S, Hq, D, causal)
    shape = dict(B=B, S=S, Hq=Hq, Hkv=Hkv, D=D, causal=causal)
    peers, notes = _peers(c, dev, dtype)
    peer_ms = {}
    for name, fn in peers.items():
        try:
            peer_ms[name] = measure.time_fn(fn, peer_inputs, reps=reps)
        except Exception as e:  # noqa: BLE001
            notes[name] = f"{type(e).__name__}: {e}"[:200]
    records = []
    extra = {"check_S": S_chk, **({"peer_notes": notes} if notes else {}),
             **({"failed_variants": failed} if failed else {})}
    for impl, fn in variants.items():
        t = measure.time_fn(fn, ours_inputs, reps=reps)
        if impl == "triton":  # what the autotuner chose at this size, and what it measured for each config
            tuned = tuned_config()
            more = {"config": tuned, "autotune_ms": autotune_timings()} if tuned else {}
        else:
            more = {"config": configs[impl[7:]]}
        records.append(measure.make_record(SUITE, case_name(c), impl, t, shape=shape, dtype=dtype, flops=flops,
                                           ceiling="gemm", peers={k: v.ms for k, v in peer_ms.items()},
                                           extra={**extra, "check_rel_err": check_err[impl], **more}))
    for name, t in peer_ms.items():
        records.append(measure.make_record(SUITE, case_name(c), name, t, shape=shape, dtype=dtype, flops=flops,
                                           ceiling="gemm"))
    for r in records:
        print(f"  {r['case']:<32} {r['impl']:<16} {r['ms']:9.3f} ms {r.get('tflops', 0):8.1f} TFLOP/s")
    return records


#: Fixed configs timed beside the autotuned kernel: the notebook's "steps", each one change on top
#: of the one before. GROUP_H=1024 means "all heads in one group": the launch order that walks
#: every head at the same query tile before the next tile (the order of v1-v3).
STEP_CONFIGS = {
    "gpu": {"v1_small_tiles": {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "USE_TMA": False,
                               "GROUP_H": 1024},
            "v2_hopper_tiles": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "USE_TMA": False,
                                "GROUP_H": 1024},
            "v3_128x128_tiles": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "USE_TMA": False,
                                 "GROUP_H": 1024},
            "v4_l2_order": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "USE_TMA": False,
                            "GROUP_H": 1},
            "v5_tma": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "USE_TMA": True,
                       "GROUP_H": 1}},
    "cpu": {"v1_small_tiles": {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "USE_TMA": False,
                               "GROUP_H": 1024},
            "v5_tma": {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "USE_TMA": True, "GROUP_H": 1}},
}


def check_config(config: dict | None, preset: str = "auto", *, name: str = "") -> measure.CheckResult:
    """One launch config of the kernel (``None``: the autotuned kernel, or the interpreter's fixed
    config) against the fp32 reference on fresh ragged inputs: S = 200 with GQA 2/1 and D = 32 at
    the CPU preset, S = 1000 with 16 heads and D = 128 on a GPU (one trial)."""
    dev = runtime.kernel_device()
    dtype = runtime.compute_dtype() if dev.type == "cuda" else torch.float32
    gpu = runtime.resolve_preset(preset) == "gpu"
    S, hq, hkv, d = (1000, 16, 16, 128) if gpu else (200, 2, 1, 32)

    def make(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        return {n: torch.randn(1, S, hq if n == "q" else hkv, d, device=dev, dtype=dtype, generator=g) for n in "qkv"}
    fn = (lambda q, k, v: flash_attention(q, k, v, config=config)) if config else \
        (lambda q, k, v: attention(q, k, v, impl="triton"))
    return measure.check(fn, lambda q, k, v: attention_reference(q, k, v), make, trials=1,
                         reference_dtype=torch.float32, name=f"{name or 'config'} at S={S}, Hq/Hkv={hq}/{hkv}, D={d}")


#: case groups (all by default): ``mha`` -- the causal cases with as many K/V heads as query heads;
def steps_for(preset: str, *, head_dim: int = 128) -> dict:
    """The steps of :data:`STEP_CONFIGS` this device can run at ``preset``: a step that loads through
    TMA needs Hopper's TMA (:func:`minimax_lab.runtime.supports`), and a step's tiles must fit the
    device's shared memory (the flash launch block's estimate at ``head_dim`` in the compute dtype).
    Under the interpreter every step runs."""
    itemsize = torch.empty((), dtype=runtime.compute_dtype()).element_size()
    out = {}
    for name, cfg in STEP_CONFIGS[runtime.resolve_preset(preset)].items():
        if cfg.get("USE_TMA") and not runtime.supports("tma"):
            continue
        need = configs.attention_smem(cfg["BLOCK_M"], cfg["BLOCK_N"], head_dim, q_itemsize=itemsize,
                                      kv_itemsize=itemsize, num_stages=cfg["num_stages"])
        if configs.shared_memory_fits(need):
            out[name] = cfg
    return out


#: ``gqa`` -- the grouped-query case; ``steps`` -- the fixed configs of :data:`STEP_CONFIGS` timed
#: beside the autotuned kernel on the first ``mha`` case (alone: that case with its steps)
CASES = ("mha", "gqa", "steps")


def run(preset: str = "auto", cases=None) -> list[dict]:
    """The case groups ``cases`` (default all of :data:`CASES`); returns the records (the CLI writes them)."""
    chosen = measure.select_cases(cases, CASES)
    p = runtime.resolve_preset(preset)
    records, first_mha = [], True
    for c in _shapes(preset):
        group = "gqa" if c["Hq"] != c["Hkv"] else "mha"
        steps = group == "mha" and first_mha and "steps" in chosen
        first_mha = first_mha and group != "mha"
        if group in chosen or steps:
            records += run_case(c, reps=20 if p == "gpu" else 3, configs=STEP_CONFIGS[p] if steps else None)
    return records
