"""Bench suite ``moe``: the fused Triton MoE against ``torch._grouped_mm`` and the per-expert loop.

Cases (H200, bf16, SwiGLU, top-k softmax routing from random logits): two shapes,
E=128, k=8, d=2048, f=768 (Qwen3-30B-A3B-like) and E=256, k=8, d=3072, f=1536 (MiniMax-M2-like),
at T in {1, 16, 64, 256, 4096, 16384} tokens. Every implementation is timed from the same
``(x, weights, ids)`` -- routing itself is outside the timed region for all of them; token
sorting/alignment, gather and scatter-add/combine are inside.

For each shape a correctness check comes first (``measure.check`` against the fp32 loop
``reference``, at T=1 and ragged T that hit both the decode and the prefill configs), then ours and both peers are timed in one process with
``measure.time_fn`` (rotating ``x``/routing sets; the expert weights, 1.2 GB and 7.2 GB, are far
larger than L2 anyway). What is counted:

* ``flops`` = ``2 * T * k * 3 * d * f`` (gate, up and down GEMMs of the routed rows);
* ``bytes_moved`` = the weights of the experts that received at least one token, read once
  (``n_used * 3 * d * f * 2`` bytes), plus ``x`` and the output;
* the ceiling is ``"copy"`` (measured copy bandwidth) for decode sizes T <= 256 -- where the
  job is streaming the used experts' weights -- and ``"gemm"`` (measured bf16 GEMM rate) above.

Peer SGLang (``sglang_triton``): when the folder ``tools/fetch_peers.py`` lays out is present
(:mod:`minimax_lab.bench.peers`), SGLang's ``fused_experts`` (:mod:`minimax_lab.bench.peer_sglang_moe`, with its
own tuned-config lookup) is checked against the fp32 reference like ours, then timed beside ours and
``torch._grouped_mm`` (eager, and under CUDA graphs at decode sizes) from routing in its dtypes
(fp32 weights, int32 ids). Its three stand-in helpers are timed on their own (``peer_standin_ms``)
so their share of its time is visible. Records carry ``peer_sglang_version`` and the config used;
without the folder they carry ``peer_notes.sglang_triton = "absent: <why>"``.

At ``preset="cpu"`` the shapes are tiny (Triton interpreter, fp32); it runs in seconds.

FP8 cases (:func:`run_fp8`, case names ``fp8_E128_k8_d2048_f768_T{T}``): the same experts with
e4m3 weights and per-output-channel scales (:func:`~minimax_lab.moe.experts.quantize_experts`
of the bf16 weights), activations quantized per token inside. Each implementation is checked
against the FP8 reference first, and the FP8 reference against the unquantized bf16 experts (the
records carry both errors). Then, from the same bf16 ``(x, weights, ids)``: ours in FP8
(``triton_fp8``), ours in bf16 (``triton_bf16``) and ``torch._scaled_grouped_mm``
(``torch_scaled_grouped_mm``: the FP8 torch path, where this GPU runs it) -- eager at every T and
under CUDA graphs at decode sizes (T = 1, 64, 256); prefill at T = 16384. Bytes count the used
experts' fp8 weights and their scales; ``pct_of_fp8_gemm`` is the share of a measured fp8 GEMM
rate (``torch._scaled_mm`` 8192^3, fast accumulation).
``python -m minimax_lab.bench moe --cases fp8 [--fp8-sweep] [--tokens T ...]`` runs only these
cases; ``--fp8-sweep`` first times :data:`FP8_CANDIDATES` at T = 64, 256 and 16384 and uses each
winner there. Case groups: :data:`CASES`; options: :data:`OPTIONS`.
"""
from __future__ import annotations

import torch

from minimax_lab import measure, runtime
from minimax_lab.bench import peer_sglang_moe as peer_sglang
from minimax_lab.moe.experts import moe_experts, quantize_experts
from minimax_lab.moe.experts_reference import experts_fp8_reference, experts_loop, experts_reference
from minimax_lab.moe.experts_torch import can_use_grouped_mm, experts_fp8_torch, experts_grouped_mm, torch_fp8_backend
from minimax_lab.moe.experts_triton import SLOT_BLOCKS_MAX_SLOTS, pick_config, regime
from minimax_lab.moe.router import route_softmax

SUITE = "moe"
PEER = "sglang_triton"
GPU_SHAPES = [dict(E=128, k=8, d=2048, f=768), dict(E=256, k=8, d=3072, f=1536)]
GPU_TOKENS = [1, 16, 64, 256, 4096, 16384]
CPU_SHAPES = [dict(E=8, k=2, d=64, f=48)]
CPU_TOKENS = [1, 16, 40]
DECODE_MAX_T = 256


def shapes_and_tokens(preset: str = "auto"):
    if runtime.resolve_preset(preset) == "gpu":
        return GPU_SHAPES, GPU_TOKENS
    return CPU_SHAPES, CPU_TOKENS


def case_name(s: dict, T: int) -> str:
    return f"E{s['E']}_k{s['k']}_d{s['d']}_f{s['f']}_T{T}"


def make_weights(s: dict, dev, dtype, seed: int = 0):
    """Expert weights ``(w_gate_up [E, 2f, d], w_down [E, d, f])`` at init scale."""
    g = torch.Generator(device=dev).manual_seed(seed)
    E, d, f = s["E"], s["d"], s["f"]
    w_gate_up = (torch.randn(E, 2 * f, d, device=dev, generator=g) / d ** 0.5).to(dtype)
    w_down = (torch.randn(E, d, f, device=dev, generator=g) / f ** 0.5).to(dtype)
    return w_gate_up, w_down


def make_tokens(s: dict, T: int, dev, dtype, seed: int):
    """Random tokens and random-logit softmax routing: ``{"x", "weights", "ids"}``."""
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(T, s["d"], device=dev, generator=g).to(dtype)
    logits = torch.randn(T, s["E"], device=dev, generator=g)
    weights, ids = route_softmax(logits, s["k"])
    return {"x": x, "weights": weights.to(dtype), "ids": ids}


def moe_flops(s: dict, T: int) -> float:
    return 2.0 * T * s["k"] * 3 * s["d"] * s["f"]


def moe_bytes(s: dict, T: int, ids: torch.Tensor, elem: int) -> float:
    """Used experts' weights read once, plus x and the output."""
    n_used = int(torch.unique(ids).numel())
    return float(n_used * 3 * s["d"] * s["f"] * elem + 2 * T * s["d"] * elem)


#: the token counts of the checks on a GPU: T=1 and ragged T (257 lands in the decode config, 2049
#: in the prefill config); on the CPU (interpreter) T=1 and 13
CHECK_TOKENS = {"cuda": (1, 257, 2049), "cpu": (1, 13)}


def check_tokens(dev) -> tuple[int, ...]:
    """The :data:`CHECK_TOKENS` of ``dev``'s kind."""
    return CHECK_TOKENS["cuda" if dev.type == "cuda" else "cpu"]


def check_against_reference(fn, reference, name: str, s: dict, dev, dtype, *, tol=None) -> dict:
    """``measure.check`` of ``fn(x, weights, ids)`` against ``reference(x, weights, ids)`` at each
    of :data:`CHECK_TOKENS` (``tol(T)``: the bound at ``T`` tokens; default ``measure.check``'s):
    ``{f"{name}_T{T}": max error}``; raises ``AssertionError`` on a miss."""
    errs = {}
    for T in check_tokens(dev):
        res = measure.check(fn, reference, lambda seed: make_tokens(s, T, dev, dtype, seed),
                            name=f"{name} {case_name(s, T)}", tol=None if tol is None else tol(T), trials=2,
                            reference_dtype=torch.float32)
        print(res.summary())
        if not res.passed:
            raise AssertionError(res.summary())
        errs[f"{name}_T{T}"] = res.max_error
    return errs


def _reference(w_gate_up, w_down):
    """The fp32 reference experts of these weights, as ``fn(x, weights, ids)``."""
    return lambda x, weights, ids: experts_reference(x, w_gate_up.float(), w_down.float(), weights, ids)


def check_shape(s: dict, w_gate_up, w_down, dev, dtype, *, impls=("triton", "torch")) -> dict:
    """:func:`check_against_reference` of each impl of ``moe_experts``."""
    errs = {}
    for impl in impls:
        if impl == "torch" and not can_use_grouped_mm(torch.empty(0, device=dev, dtype=dtype), w_gate_up, w_down):
            continue
        errs.update(check_against_reference(
            lambda x, weights, ids, impl=impl: moe_experts(x, w_gate_up, w_down, weights, ids, impl=impl),
            _reference(w_gate_up, w_down), impl, s, dev, dtype))
    return errs


#: Decode launch configs the GPU run sweeps at each of :data:`SWEEP_TOKENS`. ``BLOCK_M`` matters
#: most: an expert whose routed rows overflow one block is streamed once *per block*, so the more
#: rows per expert (T * k / E), the more a taller block can pay for its wasted rows.
DECODE_CANDIDATES = {
    "d16_n128_k128_w4_s3": dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, num_warps=4, num_stages=3),
    "d16_n64_k256_w4_s3": dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, num_warps=4, num_stages=3),
    "d32_n128_k128_w4_s3": dict(BLOCK_M=32, BLOCK_N=128, BLOCK_K=128, num_warps=4, num_stages=3),
    "d32_n64_k256_w4_s3": dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=256, num_warps=4, num_stages=3),
    "d64_n64_k128_w4_s3": dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3),
}
#: The decode sizes the sweep runs at; every decode T uses the winner of the smallest sweep T >= it.
SWEEP_TOKENS = (64, 256)


def _full(c: dict) -> dict:
    return {**c, "DOWN_BLOCK_N": c["BLOCK_N"], "DOWN_BLOCK_K": c["BLOCK_K"]}


def sweep_decode(s, w_gate_up, w_down, dev, dtype, *, T: int = 64, reps: int = 10) -> tuple[dict, dict]:
    """Time each decode candidate at ``T`` (output checked against the fp32 reference first);
    returns ``(best config, {name: ms})``."""
    mk = lambda seed: make_tokens(s, T, dev, dtype, seed)  # noqa: E731
    ins = mk(99)
    want = _reference(w_gate_up, w_down)(**ins)
    table = {}
    for name, c in DECODE_CANDIDATES.items():
        c = _full(c)
        try:
            got = moe_experts(ins["x"], w_gate_up, w_down, ins["weights"], ins["ids"], impl="triton", config=c)
            if not measure.relative_error(got, want) < 2e-2:
                print(f"   sweep {name}: WRONG")
                continue
            table[name] = measure.time_fn(lambda x, weights, ids: moe_experts(
                x, w_gate_up, w_down, weights, ids, impl="triton", check_ids=False, config=c), mk, reps=reps).ms
        except Exception as e:  # noqa: BLE001 - a config that fails to compile is skipped, with a note
            print(f"   sweep {name}: FAILED {type(e).__name__}: {str(e)[:100]}")
            continue
        print(f"   sweep {case_name(s, T)} {name:<22} {table[name]:.3f} ms", flush=True)
    best = min(table, key=table.get)
    return _full(DECODE_CANDIDATES[best]) | {"name": best}, table


def decode_config_for(T: int, sweeps: dict) -> tuple[dict | None, dict]:
    """The swept config (and its sweep table) for decode size ``T``; ``(None, {})`` without a sweep."""
    for Ts in sorted(sweeps):
        if T <= Ts:
            return sweeps[Ts]
    return (None, {})


def peer_status(dtype) -> dict:
    """``{"available": bool, "reason": str, "sglang": version}`` for the SGLang peer in this run;
    ``reason`` starts with ``absent:`` without the peers folder, ``skipped:`` when this run cannot use it."""
    ok, why = peer_sglang.available()
    if not ok:
        why = "absent: " + why
    elif dtype not in peer_sglang.DTYPES:
        ok, why = False, f"skipped: SGLang's fused MoE runs bf16/fp16; this run computes in {dtype} (GPU runs only)"
    return {"available": ok, "reason": why, "sglang": peer_sglang.peers.sglang_version() if ok else None}


def check_peer(s: dict, w_gate_up, w_down, dev, dtype) -> dict:
    """:func:`check_against_reference` of SGLang's ``fused_experts``."""
    return check_against_reference(
        lambda x, weights, ids: peer_sglang.fused_experts(x, w_gate_up, w_down, weights, ids),
        _reference(w_gate_up, w_down), PEER, s, dev, dtype)


def time_peer(s: dict, T: int, w_gate_up, w_down, mk, *, reps: int, graphs: bool) -> tuple[dict, dict]:
    """SGLang's ``fused_experts`` at T tokens: ``({impl: Timing}, extra for its records)``."""
    def mk_sgl(seed):
        t = mk(seed)
        weights, ids = peer_sglang.routing(t["weights"], t["ids"])
        return {"x": t["x"], "weights": weights, "ids": ids}

    fn = lambda x, weights, ids: peer_sglang.fused_experts(x, w_gate_up, w_down, weights, ids, check=False)  # noqa: E731
    times = {PEER: measure.time_fn(fn, mk_sgl, reps=reps)}
    if graphs:
        times[PEER + "_cudagraph"] = measure.time_fn(fn, mk_sgl, reps=reps, cuda_graph=True)
    ins = mk_sgl(0)
    standin_ms = {}
    for name, call in peer_sglang.standin_calls(ins["x"], w_gate_up, w_down, ins["weights"], ins["ids"]).items():
        standin_ms[name] = round(measure.time_fn(lambda x, call=call: call(), inputs={"x": ins["x"]}, reps=reps).ms, 5)
    align_mine = peer_sglang.align_is_standin(T, s["k"], s["E"])
    cfg = peer_sglang.config_for(s["E"], s["f"], s["d"], s["k"], T, ins["x"].dtype)
    from sglang.kernels.jit.utils import is_arch_support_pdl   # deferred: optional dependency (SGLang's wheel, where fetched)

    extra = {"peer_sglang_version": peer_sglang.peers.sglang_version(), "sglang_config": cfg["config"],
             "sglang_pdl": is_arch_support_pdl(),
             "sglang_config_source": cfg["source"], "peer_standin_ms": standin_ms,
             "peer_standins": ("align: minimax-lab stand-in" if align_mine else "align: SGLang's own small-batch Triton kernel")
             + "; silu_and_mul: minimax-lab Triton stand-in"
             + ("; moe_sum_reduce: SGLang's Triton reduction via the stand-in" if "moe_sum_reduce" in standin_ms else "")}
    return times, extra


def run_shape(s: dict, tokens, *, reps: int = 20, sweep: bool = False, peer: dict | None = None,
              with_loop: bool = True) -> list[dict]:
    dev = runtime.kernel_device()
    dtype = runtime.compute_dtype() if dev.type == "cuda" else torch.float32
    w_gate_up, w_down = make_weights(s, dev, dtype)
    errs = check_shape(s, w_gate_up, w_down, dev, dtype)
    peer = peer if peer is not None else peer_status(dtype)
    peer_note = None
    if peer["available"]:
        try:
            errs.update(check_peer(s, w_gate_up, w_down, dev, dtype))
        except Exception as e:  # noqa: BLE001 - a failing peer is recorded, ours still count
            peer_note = f"check failed: {type(e).__name__}: {e}"[:400]
    else:
        peer_note = peer["reason"]
    if peer_note:
        print(f"  peer {PEER}: {peer_note}")
    sweeps = {Ts: sweep_decode(s, w_gate_up, w_down, dev, dtype, T=Ts) for Ts in SWEEP_TOKENS} if sweep else {}
    peers = {}
    if can_use_grouped_mm(torch.empty(0, device=dev, dtype=dtype), w_gate_up, w_down):
        peers["torch_grouped_mm"] = lambda x, weights, ids: experts_grouped_mm(x, w_gate_up, w_down, weights, ids)
    if with_loop:
        peers["loop"] = lambda x, weights, ids: experts_loop(x, w_gate_up, w_down, weights, ids)
    records = []
    for T in tokens:
        config, sweep_table = decode_config_for(T, sweeps) if T <= DECODE_MAX_T else (None, {})
        if config is not None:
            config = {k: v for k, v in config.items() if k != "name"}
        fns = {"triton": (lambda config: lambda x, weights, ids: moe_experts(
            x, w_gate_up, w_down, weights, ids, impl="triton", check_ids=False, config=config))(config)}
        mk = (lambda T: lambda seed: make_tokens(s, T, dev, dtype, seed))(T)
        ids0 = mk(0)["ids"]
        flops, nbytes = moe_flops(s, T), moe_bytes(s, T, ids0, torch.empty(0, dtype=dtype).element_size())
        ceiling = "copy" if T <= DECODE_MAX_T else "gemm"
        shape = {**s, "T": T}
        times = {}
        for name, fn in {**fns, **peers}.items():
            times[name] = measure.time_fn(fn, mk, reps=max(3, reps // 4) if name == "loop" else reps)
        peer_extra = {}
        if peer_note is None:
            try:
                sgl_times, peer_extra = time_peer(s, T, w_gate_up, w_down, mk, reps=reps,
                                                  graphs=dev.type == "cuda" and T <= DECODE_MAX_T)
                times.update(sgl_times)
            except Exception as e:  # noqa: BLE001
                peer_extra = {"peer_notes": {PEER: f"{type(e).__name__}: {e}"[:400]}}
        peer_ms = {n: times[n].ms for n in (*peers, PEER) if n in times}
        if dev.type == "cuda" and T <= DECODE_MAX_T:
            # launch-bound sizes: also replay CUDA graphs (how a decode engine runs), ours and the peer
            for name in ("triton", "torch_grouped_mm"):
                fn = fns.get(name) or peers.get(name)
                if fn is None:
                    continue
                try:
                    times[name + "_cudagraph"] = measure.time_fn(fn, mk, reps=reps, cuda_graph=True)
                except Exception as e:  # noqa: BLE001
                    print(f"   {name} under CUDA graph failed: {type(e).__name__}: {str(e)[:100]}")
        graph_peer = {k: times[k].ms for k in ("torch_grouped_mm_cudagraph", PEER + "_cudagraph") if k in times}
        extra = {"check_rel_err": errs, "regime": "decode" if T <= DECODE_MAX_T else "prefill",
                 "bytes_counted": "used experts' weights + x + out", "routing": "softmax top-k, random logits",
                 **({"peer_notes": {PEER: peer_note}} if peer_note else {})}
        for name, t in times.items():
            mine = name.startswith("triton")
            cfg_used = config if config is not None else pick_config(T * s["k"], s["E"], s["d"], s["f"])
            if T * s["k"] <= cfg_used.get("SLOT_BLOCKS_MAX", SLOT_BLOCKS_MAX_SLOTS):
                cfg_used = {**cfg_used, "alignment": "none: one slot per block"}
            rec_peers = (peer_ms if name == "triton" else graph_peer if name == "triton_cudagraph" else None)
            records.append(measure.make_record(
                SUITE, case_name(s, T), name, t, shape=shape, dtype=dtype, flops=flops, bytes_moved=nbytes,
                ceiling=ceiling, peers=rec_peers,
                extra={**extra, **({"config": cfg_used} if mine else {}),
                       **({"decode_sweep_ms": sweep_table} if mine and sweep_table else {}),
                       **(peer_extra if name.startswith(PEER) or "peer_notes" in peer_extra else {})}))
        r = records[-len(times)]
        print(f"  {case_name(s, T):<30} triton {r['ms']:8.3f} ms  {r.get('tflops', 0):7.1f} TFLOP/s "
              f"{r.get('gbps', 0):8.0f} GB/s  {r.get('pct_of_ceiling', 0):5.1f}% of {ceiling}  "
              + " ".join(f"{n} {ms:.3f} ms" for n, ms in peer_ms.items())
              + "".join(f" | graphs: triton {times['triton_cudagraph'].ms:.3f} ms" if "triton_cudagraph" in times else "")
              + "".join(f" grouped_mm {graph_peer['torch_grouped_mm_cudagraph']:.3f} ms"
                        if "torch_grouped_mm_cudagraph" in graph_peer else "")
              + "".join(f" {PEER} {graph_peer[PEER + '_cudagraph']:.3f} ms" if PEER + "_cudagraph" in graph_peer else "")
              + (f" | {PEER} stand-ins {peer_extra['peer_standin_ms']} ms" if "peer_standin_ms" in peer_extra else ""))
    return records


#: case groups (both by default): ``bf16`` -- both shapes at every T, ours beside the peers;
#: ``fp8`` -- the FP8 cases (:func:`run_fp8`)
CASES = ("bf16", "fp8")

#: options of :func:`run` as ``python -m minimax_lab.bench moe`` arguments
OPTIONS = {
    "tokens": dict(type=int, nargs="+", metavar="T", help="token counts T (default: the preset's, per group)"),
    "fp8_sweep": dict(action="store_true",
                      help="fp8: time FP8_CANDIDATES first at T = 64, 256, 16384 and use each winner there"),
}


def run(preset: str = "auto", cases=None, *, tokens=None, fp8_sweep: bool = False) -> list[dict]:
    """The case groups ``cases`` (default both), bf16 then FP8, at ``tokens`` (default the
    preset's); returns the records (the CLI writes them)."""
    chosen = measure.select_cases(cases, CASES)
    shapes, default_tokens = shapes_and_tokens(preset)
    gpu = runtime.resolve_preset(preset) == "gpu"
    records = []
    if "bf16" in chosen:
        for s in shapes:
            records += run_shape(s, list(tokens or default_tokens), reps=20 if gpu else 3, sweep=gpu)
    if "fp8" in chosen:
        records += run_fp8(preset, tokens=tokens, sweep=fp8_sweep)
    return records


# --------------------------------------------------------------------------- FP8 experts

FP8_GPU_SHAPE = dict(E=128, k=8, d=2048, f=768)
FP8_GPU_TOKENS = [1, 64, 256, 16384]
FP8_CPU_TOKENS = [1, 16, 40]
FP8_PEER = "torch_scaled_grouped_mm"

#: FP8 launch configs the ``--sweep`` run times end to end, per regime (each overrides this GPU's
#: config of :data:`~minimax_lab.moe.experts_triton.FP8_LAUNCH` key by key).
FP8_CANDIDATES = {
    "decode": {
        "default": {},
        "gu_n128_k128": dict(BLOCK_N=128, BLOCK_K=128),
        "gu_k128_s4": dict(BLOCK_K=128, num_stages=4),
        "dn_n128_k256_s3": dict(DOWN_BLOCK_N=128, DOWN_BLOCK_K=256, DOWN_num_stages=3),
        "dn_n256_k128": dict(DOWN_BLOCK_N=256, DOWN_BLOCK_K=128, DOWN_num_stages=3),
        "chained_acc": dict(FP32_PROMOTE=False),
    },
    "prefill": {
        "default": {},
        "chained_acc": dict(FP32_PROMOTE=False),
        "n128_k128_s3": dict(BLOCK_N=128, num_stages=3),
        "k64_s5": dict(BLOCK_K=64, num_stages=5, DOWN_BLOCK_K=64, DOWN_num_stages=5),
        "m64": dict(BLOCK_M=64, num_warps=4),
        "dn_n256_s3": dict(DOWN_BLOCK_N=256, DOWN_num_stages=3),
    },
}
FP8_SWEEP_TOKENS = (64, 256, 16384)
_FP8_GEMM: list = []


def fp8_gemm_tflops() -> float | None:
    """The measured fp8 GEMM rate here (``torch._scaled_mm`` of 8192^3 e4m3 with fast
    accumulation, bf16 out), once per process; ``None`` where it does not run."""
    if _FP8_GEMM:
        return _FP8_GEMM[0]
    rate = None
    if runtime.kernel_device().type == "cuda" and hasattr(torch, "_scaled_mm"):
        try:
            n, dev = 8192, runtime.kernel_device()
            a = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
            b = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn).t()
            one = torch.ones((), device=dev)
            t = measure.time_fn(lambda a, b: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                                              use_fast_accum=True), inputs={"a": a, "b": b}, reps=20,
                              rotate=False)
            rate = 2 * n ** 3 / (t.ms * 1e-3) / 1e12
        except Exception as e:  # noqa: BLE001 - no fp8 ceiling on this GPU: records say so
            print(f"  fp8 GEMM ceiling not measured: {type(e).__name__}: {str(e)[:100]}")
    _FP8_GEMM.append(rate)
    return rate


def fp8_bytes(s: dict, T: int, ids: torch.Tensor, x_elem: int) -> float:
    """Used experts' fp8 weights (1 byte) and fp32 scales read once, plus x and the output."""
    n_used = int(torch.unique(ids).numel())
    return float(n_used * (3 * s["d"] * s["f"] + 4 * (2 * s["f"] + s["d"])) + 2 * T * s["d"] * x_elem)


def fp8_check_tolerance(ours: bool, T: int, dev) -> float:
    """Relative error allowed against the FP8 reference: ours (``ours=True``) or the torch peer.

    On a GPU the GEMMs' sums differ from the reference's in the last bits, and the intermediate
    passes two roundings (to bf16, then to e4m3) where such a difference can flip a value by one
    e4m3 step (1/16 of it). The torch peer also gets its gate/up product back in bf16 (what
    ``torch._scaled_grouped_mm`` returns), so it flips more often. Averaged over many tokens a flip
    hardly shows; one token's output of a small layer moves by several percent. The bounds sit
    above the largest errors seen on an H200 over many fresh draws at the test's shape (E=8, k=2,
    d=64, f=48), one token and 257 tokens; a wrong scale, expert or token is off by far more."""
    if dev.type != "cuda":
        return 1e-4
    if T == 1:
        return 8e-2 if ours else 1.5e-1
    return 2e-2 if ours else 4e-2


def check_fp8(s: dict, q: tuple, w_gate_up, w_down, dev, dtype) -> dict:
    """``measure.check`` of ours and the torch peer against the FP8 reference (T=1 and ragged T hitting
    the decode and prefill configs), and the FP8 reference's error against the bf16 experts."""
    w13, s13, w2, s2 = q
    ref = lambda x, weights, ids: experts_fp8_reference(x, w13, s13, w2, s2, weights, ids)  # noqa: E731
    torch_name = f"torch_fp8_{torch_fp8_backend(torch.empty(0, device=dev, dtype=dtype), w13, w2)}"
    fns = {"triton_fp8": lambda x, weights, ids: moe_experts(x, w13, w2, weights, ids, impl="triton",
                                                             w_gate_up_scale=s13, w_down_scale=s2),
           torch_name: lambda x, weights, ids: experts_fp8_torch(x, w13, s13, w2, s2, weights, ids)}
    errs = {}
    for name, fn in fns.items():
        errs.update(check_against_reference(fn, ref, name, s, dev, dtype,
                                            tol=lambda T, ours=name == "triton_fp8": fp8_check_tolerance(ours, T, dev)))
    ins = make_tokens(s, check_tokens(dev)[-1], dev, dtype, 5)
    unq = _reference(w_gate_up, w_down)(**ins)
    errs["fp8_reference_vs_bf16_experts"] = measure.relative_error(ref(**ins).float(), unq)
    print(f"  FP8 reference vs the unquantized experts: rel. err {errs['fp8_reference_vs_bf16_experts']:.4f}")
    return errs


def sweep_fp8(s: dict, q: tuple, dev, dtype, T: int, *, reps: int = 10) -> tuple[dict, dict]:
    """Time each :data:`FP8_CANDIDATES` config of ``T``'s regime (checked first); ``(best overrides, {name: ms})``."""
    w13, s13, w2, s2 = q
    group = "prefill" if regime(T * s["k"], s["E"]) == "prefill" else "decode"
    mk = lambda seed: make_tokens(s, T, dev, dtype, seed)  # noqa: E731
    ins = mk(99)
    want = experts_fp8_reference(ins["x"], w13, s13, w2, s2, ins["weights"], ins["ids"])
    table = {}
    for name, c in FP8_CANDIDATES[group].items():
        fn = (lambda c: lambda x, weights, ids: moe_experts(x, w13, w2, weights, ids, impl="triton", check_ids=False,
                                                            config=c, w_gate_up_scale=s13, w_down_scale=s2))(c)
        try:
            if not measure.relative_error(fn(**ins).float(), want.float()) < 2e-2:
                print(f"   fp8 sweep {name}: WRONG")
                continue
            table[name] = measure.time_fn(fn, mk, reps=reps).ms
        except Exception as e:  # noqa: BLE001 - a config that fails to compile is skipped, with a note
            print(f"   fp8 sweep {name}: FAILED {type(e).__name__}: {str(e)[:100]}")
            continue
        print(f"   fp8 sweep T={T} {name:<18} {table[name]:.4f} ms", flush=True)
    best = min(table, key=table.get)
    return dict(FP8_CANDIDATES[group][best]), {**table, "picked": best}


def run_fp8(preset: str = "auto", *, tokens=None, sweep: bool = False, reps: int | None = None) -> list[dict]:
    """The FP8 cases of the module doc; returns their records."""
    gpu = runtime.resolve_preset(preset) == "gpu"
    s = FP8_GPU_SHAPE if gpu else CPU_SHAPES[0]
    tokens = list(tokens or (FP8_GPU_TOKENS if gpu else FP8_CPU_TOKENS))
    reps = reps or (20 if gpu else 3)
    dev = runtime.kernel_device()
    dtype = runtime.compute_dtype() if dev.type == "cuda" else torch.float32
    w_gate_up, w_down = make_weights(s, dev, dtype)
    q = quantize_experts(w_gate_up, w_down)
    w13, s13, w2, s2 = q
    errs = check_fp8(s, q, w_gate_up, w_down, dev, dtype)
    backend = torch_fp8_backend(torch.empty(0, device=dev, dtype=dtype), w13, w2)
    peer_note = None if backend == "scaled_grouped_mm" else f"absent: torch._scaled_grouped_mm does not run here " \
                                                             f"(torch path uses {backend!r})"
    sweeps = {T: sweep_fp8(s, q, dev, dtype, T) for T in FP8_SWEEP_TOKENS if T in tokens} if sweep and gpu else {}
    fp8_rate = fp8_gemm_tflops() if gpu else None
    records = []
    for T in tokens:
        cfg, sweep_table = sweeps.get(T, (None, {}))
        fns = {
            "triton_fp8": (lambda c: lambda x, weights, ids: moe_experts(
                x, w13, w2, weights, ids, impl="triton", check_ids=False, config=c, w_gate_up_scale=s13,
                w_down_scale=s2))(cfg),
            "triton_bf16": lambda x, weights, ids: moe_experts(x, w_gate_up, w_down, weights, ids, impl="triton",
                                                               check_ids=False),
        }
        if peer_note is None:
            fns[FP8_PEER] = lambda x, weights, ids: experts_fp8_torch(x, w13, s13, w2, s2, weights, ids)
        mk = (lambda T: lambda seed: make_tokens(s, T, dev, dtype, seed))(T)
        ids0 = mk(0)["ids"]
        decode = T <= DECODE_MAX_T
        elem = torch.empty(0, dtype=dtype).element_size()
        flops = moe_flops(s, T)
        nbytes = {"triton_fp8": fp8_bytes(s, T, ids0, elem), FP8_PEER: fp8_bytes(s, T, ids0, elem),
                  "triton_bf16": moe_bytes(s, T, ids0, elem)}
        times = {name: measure.time_fn(fn, mk, reps=reps) for name, fn in fns.items()}
        if dev.type == "cuda" and decode:
            for name in list(fns):
                try:
                    times[name + "_cudagraph"] = measure.time_fn(fns[name], mk, reps=reps, cuda_graph=True)
                except Exception as e:  # noqa: BLE001
                    print(f"   {name} under CUDA graph failed: {type(e).__name__}: {str(e)[:100]}")
        used_cfg = {**pick_config(T * s["k"], s["E"], s["d"], s["f"], 1, fp8=True), **(cfg or {})}
        extra = {"check_rel_err": errs, "regime": "decode" if decode else "prefill", "weights": "fp8 e4m3, per-channel",
                 "activations": "fp8 e4m3 per token (x and the SwiGLU rows)", "torch_fp8_backend": backend,
                 "bytes_counted": "used experts' fp8 weights + scales + x + out (bf16 weights for triton_bf16)",
                 "routing": "softmax top-k, random logits", "fp8_gemm_tflops": round(fp8_rate, 1) if fp8_rate else None,
                 **({"peer_notes": {FP8_PEER: peer_note}} if peer_note else {})}
        for name, t in times.items():
            base = name.removesuffix("_cudagraph")
            graph = name.endswith("_cudagraph")
            peers = None
            if base == "triton_fp8":
                peers = {n + ("_cudagraph" if graph else ""): times[n + ("_cudagraph" if graph else "")].ms
                         for n in ("triton_bf16", FP8_PEER) if n + ("_cudagraph" if graph else "") in times}
            rec_extra = dict(extra)
            if base == "triton_fp8":
                rec_extra["config"] = used_cfg
                if sweep_table:
                    rec_extra["fp8_sweep_ms"] = sweep_table
            rec = measure.make_record(SUITE, "fp8_" + case_name(s, T), name, t, shape={**s, "T": T},
                                      dtype=dtype if base == "triton_bf16" else "float8_e4m3fn", flops=flops,
                                      bytes_moved=nbytes[base], ceiling="copy" if decode else "gemm", peers=peers,
                                      extra=rec_extra)
            if fp8_rate and base != "triton_bf16":
                rec["pct_of_fp8_gemm"] = round(100 * rec["tflops"] / fp8_rate, 1)
            records.append(rec)
        mine = next(r for r in records[-len(times):] if r["impl"] == "triton_fp8")
        print(f"  fp8 {case_name(s, T):<30} triton_fp8 {mine['ms']:8.4f} ms {mine.get('tflops', 0):7.1f} TFLOP/s "
              f"{mine.get('gbps', 0):7.0f} GB/s {mine.get('pct_of_ceiling', 0):5.1f}% of {mine.get('ceiling')} | "
              + " ".join(f"{n} {t.ms:.4f} ms" for n, t in times.items() if n != "triton_fp8")
              + " | speed-up " + " ".join(f"{k} {v:.2f}x" for k, v in mine.get("speedup_vs", {}).items()))
    return records
