"""Bench suite ``moe``: the fused Triton MoE against ``torch._grouped_mm`` and the per-expert loop.

Cases (H200, bf16, SwiGLU, top-k softmax routing from random logits): two shapes,
E=128, k=8, d=2048, f=768 (Qwen3-30B-A3B-like) and E=256, k=8, d=3072, f=1536 (MiniMax-M2-like),
at T in {1, 16, 64, 256, 4096, 16384} tokens. Every implementation is timed from the same
``(x, weights, ids)`` -- routing itself is outside the timed region for all of them; token
sorting/alignment, gather and scatter-add/combine are inside.

For each shape a correctness check comes first (``bench.check`` against the fp32 loop
``reference``, at T=1 and ragged T that hit both the decode and the prefill configs), then ours and both peers are timed in one process with
``bench.time_fn`` (rotating ``x``/routing sets; the expert weights, 1.2 GB and 7.2 GB, are far
larger than L2 anyway). What is counted:

* ``flops`` = ``2 * T * k * 3 * d * f`` (gate, up and down GEMMs of the routed rows);
* ``bytes_moved`` = the weights of the experts that received at least one token, read once
  (``n_used * 3 * d * f * 2`` bytes), plus ``x`` and the output;
* the ceiling is ``"copy"`` (measured copy bandwidth) for decode sizes T <= 256 -- where the
  job is streaming the used experts' weights -- and ``"gemm"`` (measured bf16 GEMM rate) above.

Peer SGLang (``sglang_triton``): when the folder ``tools/fetch_peers.py`` lays out is present
(:mod:`minimax_lab.peers`), SGLang's ``fused_experts`` (:mod:`minimax_lab.moe.peer_sglang`, with its
own tuned-config lookup) is checked against the fp32 reference like ours, then timed beside ours and
``torch._grouped_mm`` (eager, and under CUDA graphs at decode sizes) from routing in its dtypes
(fp32 weights, int32 ids). Its three stand-in helpers are timed on their own (``peer_standin_ms``)
so their share of its time is visible. Records carry ``peer_sglang_version`` and the config used;
without the folder they carry ``peer_notes.sglang_triton = "absent: <why>"``.

At ``preset="cpu"`` the shapes are tiny (Triton interpreter, fp32); it runs in seconds.
"""
from __future__ import annotations

import torch

from minimax_lab import bench, runtime
from minimax_lab.moe import peer_sglang
from minimax_lab.moe.experts import moe_experts
from minimax_lab.moe.experts_reference import experts_loop, experts_reference
from minimax_lab.moe.experts_torch import can_use_grouped_mm, experts_grouped_mm
from minimax_lab.moe.experts_triton import pick_config
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


def check_shape(s: dict, w_gate_up, w_down, dev, dtype, *, impls=("triton", "torch")) -> dict:
    """``bench.check`` of each impl against the fp32 reference at T=1 and a ragged T."""
    # ragged T: 257 lands in the decode config, 2049 in the prefill config on the GPU
    T_chk = (1, 257, 2049) if dev.type == "cuda" else (1, 13)
    errs = {}
    for impl in impls:
        if impl == "torch" and not can_use_grouped_mm(torch.empty(0, device=dev, dtype=dtype), w_gate_up, w_down):
            continue
        for T in T_chk:
            res = bench.check(
                lambda x, weights, ids: moe_experts(x, w_gate_up, w_down, weights, ids, impl=impl),
                lambda x, weights, ids: experts_reference(x, w_gate_up.float(), w_down.float(), weights, ids),
                lambda seed: make_tokens(s, T, dev, dtype, seed),
                name=f"{impl} {case_name(s, T)}", trials=2, reference_dtype=torch.float32)
            print(res.summary())
            if not res.passed:
                raise AssertionError(res.summary())
            errs[f"{impl}_T{T}"] = res.max_error
    return errs


#: Decode launch configs the GPU run sweeps at each of :data:`SWEEP_TOKENS`. ``BLOCK_M`` matters
#: most: an expert whose routed rows overflow one block is streamed once *per block*, so at
#: T=256 on E=128 (16 rows per expert on average, up to ~30) 32-row blocks beat 16-row ones.
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
    want = experts_reference(ins["x"], w_gate_up.float(), w_down.float(), ins["weights"], ins["ids"])
    table = {}
    for name, c in DECODE_CANDIDATES.items():
        c = _full(c)
        try:
            got = moe_experts(ins["x"], w_gate_up, w_down, ins["weights"], ins["ids"], impl="triton", config=c)
            if not bench.relative_error(got, want) < 2e-2:
                print(f"   sweep {name}: WRONG")
                continue
            table[name] = bench.time_fn(lambda x, weights, ids: moe_experts(
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
    """``bench.check`` of SGLang's ``fused_experts`` against the fp32 reference, at the T of :func:`check_shape`."""
    errs = {}
    for T in ((1, 257, 2049) if dev.type == "cuda" else (1, 40)):
        res = bench.check(
            lambda x, weights, ids: peer_sglang.fused_experts(x, w_gate_up, w_down, weights, ids),
            lambda x, weights, ids: experts_reference(x, w_gate_up.float(), w_down.float(), weights, ids),
            lambda seed: make_tokens(s, T, dev, dtype, seed),
            name=f"{PEER} {case_name(s, T)}", trials=2, reference_dtype=torch.float32)
        print(res.summary())
        if not res.passed:
            raise AssertionError(res.summary())
        errs[f"{PEER}_T{T}"] = res.max_error
    return errs


def time_peer(s: dict, T: int, w_gate_up, w_down, mk, *, reps: int, graphs: bool) -> tuple[dict, dict]:
    """SGLang's ``fused_experts`` at T tokens: ``({impl: Timing}, extra for its records)``."""
    def mk_sgl(seed):
        t = mk(seed)
        weights, ids = peer_sglang.routing(t["weights"], t["ids"])
        return {"x": t["x"], "weights": weights, "ids": ids}

    fn = lambda x, weights, ids: peer_sglang.fused_experts(x, w_gate_up, w_down, weights, ids, check=False)  # noqa: E731
    times = {PEER: bench.time_fn(fn, mk_sgl, reps=reps)}
    if graphs:
        times[PEER + "_cudagraph"] = bench.time_fn(fn, mk_sgl, reps=reps, cuda_graph=True)
    ins = mk_sgl(0)
    standin_ms = {}
    for name, call in peer_sglang.standin_calls(ins["x"], w_gate_up, w_down, ins["weights"], ins["ids"]).items():
        standin_ms[name] = round(bench.time_fn(lambda x, call=call: call(), inputs={"x": ins["x"]}, reps=reps).ms, 5)
    align_mine = peer_sglang.align_is_standin(T, s["k"], s["E"])
    cfg = peer_sglang.config_for(s["E"], s["f"], s["d"], s["k"], T, ins["x"].dtype)
    from sglang.kernels.jit.utils import is_arch_support_pdl

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
            times[name] = bench.time_fn(fn, mk, reps=max(3, reps // 4) if name == "loop" else reps)
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
                    times[name + "_cudagraph"] = bench.time_fn(fn, mk, reps=reps, cuda_graph=True)
                except Exception as e:  # noqa: BLE001
                    print(f"   {name} under CUDA graph failed: {type(e).__name__}: {str(e)[:100]}")
        graph_peer = {k: times[k].ms for k in ("torch_grouped_mm_cudagraph", PEER + "_cudagraph") if k in times}
        extra = {"check_rel_err": errs, "regime": "decode" if T <= DECODE_MAX_T else "prefill",
                 "bytes_counted": "used experts' weights + x + out", "routing": "softmax top-k, random logits",
                 **({"peer_notes": {PEER: peer_note}} if peer_note else {})}
        for name, t in times.items():
            mine = name.startswith("triton")
            cfg_used = config if config is not None else pick_config(T * s["k"], s["E"], s["d"], s["f"])
            rec_peers = (peer_ms if name == "triton" else graph_peer if name == "triton_cudagraph" else None)
            records.append(bench.make_record(
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


def run(preset: str = "auto") -> list[dict]:
    """All cases; returns the records (the CLI writes them)."""
    shapes, tokens = shapes_and_tokens(preset)
    gpu = runtime.resolve_preset(preset) == "gpu"
    records = []
    for s in shapes:
        records += run_shape(s, tokens, reps=20 if gpu else 3, sweep=gpu)
    return records
