"""Bench suite ``kvcache`` (kernels): paged decode against its peers, plus ``write_kv`` and
``paged_prefill`` timed briefly.

Paged decode cases (H200, bf16, GQA 32 query / 8 KV heads, D=128; every sequence at its full
context so the peers need no mask): B=64 at 8k context with page 16 (also page 64
and 128), and B=8 at 32k and 128k, page 16. Per case, in one process:

* ``triton`` -- :func:`minimax_lab.kvcache.decode.paged_decode`, ``impl="triton"``, pages
  drawn at random from the pool (``randperm``: no two neighbours adjacent);
* ``gather_sdpa`` -- the first thing a user writes: ``k_cache[block_table]`` into a contiguous
  copy, then ``F.scaled_dot_product_attention(..., enable_gqa=True)``;
* ``sdpa_contiguous`` -- SDPA on a contiguous ``[B, Hkv, L, D]`` cache: no paging at all,
  the speed paging must not lose.

The peers are written the plain way a user would write them. Each is timed twice: CUDA events around every call (the harness default,
launch overhead included) and replaying a CUDA graph (how a decode engine runs, launch gaps
removed); the records of each method compare with peers timed the same way.
What is counted: ``bytes_moved`` = the K/V bytes the attention must read,
``2 * B * L * Hkv * D * 2``, the same for all three (the gather peer really moves 3x that), and
``pct_of_ceiling`` is of the measured device-to-device copy bandwidth.

Before timing, ``bench.check`` compares each kernel with its fp32 ``reference`` on ragged
random block tables (lengths 1, mid-page, several pages; page sizes 16/64/128).

``write_kv``: T = 64 (one decode step of B=64) and T = 8192 new tokens into a 128k-slot pool;
GB/s of new K/V read plus cache written; peer ``torch.index_copy_``. ``paged_prefill``: 2,048
new tokens over an 8k cached prefix (B=2); TFLOP/s of the causal attention FLOPs; peers the
gather + masked-SDPA ``impl="torch"`` and the workbook's dense FlashAttention
(:mod:`minimax_lab.attention.flash`) on a contiguous copy -- no paging.

At ``preset="cpu"`` the shapes are tiny (Triton interpreter, fp32); it runs in seconds.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from minimax_lab import bench, runtime
from minimax_lab.kvcache.decode import (GPU_CONFIG, INTERPRETER_CONFIG, choose_num_splits, paged_decode,
                                        paged_decode_reference, sm_count)
from minimax_lab.kvcache.prefill import GPU_CONFIG as PREFILL_GPU_CONFIG
from minimax_lab.kvcache.prefill import INTERPRETER_CONFIG as PREFILL_INTERPRETER_CONFIG
from minimax_lab.kvcache.prefill import paged_prefill, paged_prefill_reference
from minimax_lab.kvcache.write import write_kv, write_kv_reference

SUITE = "kvcache"
GPU_DECODE = [dict(B=64, L=8192, Hq=32, Hkv=8, D=128, page=16), dict(B=64, L=8192, Hq=32, Hkv=8, D=128, page=64),
              dict(B=64, L=8192, Hq=32, Hkv=8, D=128, page=128), dict(B=8, L=32768, Hq=32, Hkv=8, D=128, page=16),
              dict(B=8, L=131072, Hq=32, Hkv=8, D=128, page=16)]
CPU_DECODE = [dict(B=2, L=64, Hq=4, Hkv=2, D=16, page=16)]
GPU_WRITE = [dict(T=64, pages=8192, page=16, Hkv=8, D=128), dict(T=8192, pages=8192, page=16, Hkv=8, D=128)]
CPU_WRITE = [dict(T=8, pages=16, page=16, Hkv=2, D=16)]
GPU_PREFILL = [dict(B=2, prefix=8192, S=2048, Hq=32, Hkv=8, D=128, page=16)]
CPU_PREFILL = [dict(B=1, prefix=20, S=16, Hq=4, Hkv=2, D=16, page=16)]


def _setup(preset: str):
    dev = runtime.kernel_device()
    gpu = runtime.resolve_preset(preset) == "gpu" and dev.type == "cuda"
    dtype = runtime.compute_dtype() if dev.type == "cuda" else torch.float32
    return dev, dtype, gpu


def decode_case_name(c: dict) -> str:
    return f"decode_B{c['B']}_L{c['L']}_Hq{c['Hq']}_Hkv{c['Hkv']}_D{c['D']}_p{c['page']}"


def random_block_table(lengths, page: int, num_pages: int, dev, g: torch.Generator) -> torch.Tensor:
    """Each sequence gets its pages drawn at random from a shuffled pool: int32 ``[B, max_pages]``, -1 unused."""
    lengths = [int(x) for x in lengths]
    max_pages = max(1, max(-(-n // page) for n in lengths))
    perm = torch.randperm(num_pages, generator=g, device="cpu")
    bt = torch.full((len(lengths), max_pages), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(lengths):
        k = -(-n // page)
        bt[b, :k] = perm[used:used + k].to(torch.int32)
        used += k
    if used > num_pages:
        raise ValueError(f"pool of {num_pages} pages too small for {used}")
    return bt.to(dev)


def make_decode_inputs(c: dict, dev, dtype, seed: int, lengths=None) -> dict:
    """Paged decode inputs; every sequence at length ``L`` unless ``lengths`` is given."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    lengths = [c["L"]] * c["B"] if lengths is None else list(lengths)
    pages_needed = sum(-(-n // c["page"]) for n in lengths)
    num_pages = pages_needed + 3  # a few spare pages the block tables never name
    gd = torch.Generator(device=dev).manual_seed(seed)
    shape = (num_pages, c["page"], c["Hkv"], c["D"])
    return {"q": torch.randn(c["B"], c["Hq"], c["D"], device=dev, generator=gd).to(dtype),
            "k_cache": torch.randn(shape, device=dev, generator=gd).to(dtype),
            "v_cache": torch.randn(shape, device=dev, generator=gd).to(dtype),
            "block_table": random_block_table(lengths, c["page"], num_pages, dev, g),
            "seq_lens": torch.tensor(lengths, dtype=torch.int32, device=dev)}


def gather_sdpa(q, k_cache, v_cache, block_table, seq_lens):
    """Peer: gather every page into a contiguous copy, then SDPA (all sequences at full length)."""
    B, Hq, D = q.shape
    ps, Hkv = k_cache.shape[1], k_cache.shape[2]
    L = block_table.shape[1] * ps
    pages = block_table.long()
    k = k_cache[pages].view(B, L, Hkv, D).transpose(1, 2)
    v = v_cache[pages].view(B, L, Hkv, D).transpose(1, 2)
    return F.scaled_dot_product_attention(q[:, :, None, :], k, v, enable_gqa=True)[:, :, 0]


def make_contiguous_inputs(c: dict, dev, dtype, seed: int) -> dict:
    gd = torch.Generator(device=dev).manual_seed(seed)
    shape = (c["B"], c["Hkv"], c["L"], c["D"])
    return {"q": torch.randn(c["B"], c["Hq"], 1, c["D"], device=dev, generator=gd).to(dtype),
            "k": torch.randn(shape, device=dev, generator=gd).to(dtype),
            "v": torch.randn(shape, device=dev, generator=gd).to(dtype)}


def sdpa_contiguous(q, k, v):
    """Peer: SDPA decode on a contiguous ``[B, Hkv, L, D]`` cache (no paging)."""
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def ragged_lengths(B: int, max_len: int, page: int, g: torch.Generator) -> list[int]:
    """Lengths of 1, mid-page, exactly a page, and random ones up to ``max_len``."""
    fixed = [1, page // 2 + 1, page, max_len]
    rand = torch.randint(1, max_len + 1, (max(0, B - len(fixed)),), generator=g).tolist()
    return (fixed + rand)[:B]


def check_decode(dev, dtype, gpu: bool) -> dict:
    """``bench.check`` of the Triton decode against the fp32 reference on ragged random block tables."""
    errs = {}
    pages = (16, 64, 128) if gpu else (16,)
    base = dict(B=7, Hq=32, Hkv=8, D=128) if gpu else dict(B=4, Hq=4, Hkv=1, D=16)
    max_len = 5000 if gpu else 40
    for page in pages:
        for splits in (None, 3):
            c = {**base, "page": page, "L": max_len}
            res = bench.check(
                lambda splits=splits, **kw: paged_decode(**kw, impl="triton", num_splits=splits),
                lambda **kw: paged_decode_reference(**kw),
                lambda seed, c=c: make_decode_inputs(c, dev, dtype, seed, ragged_lengths(
                    c["B"], max_len, c["page"], torch.Generator().manual_seed(seed))),
                name=f"paged_decode triton page {page} splits {splits or 'auto'}", trials=2,
                reference_dtype=torch.float32)
            print(res.summary())
            if not res.passed:
                raise AssertionError(res.summary())
            errs[f"p{page}_s{splits or 'auto'}"] = res.max_error
    return errs


def _time_pair(fns: dict, makers: dict, reps: int, gpu: bool) -> dict:
    """Time each fn on its inputs: CUDA events per call, and (GPU) CUDA-graph replay."""
    times = {}
    for name, fn in fns.items():
        times[name] = bench.time_fn(fn, makers[name], reps=reps)
        if gpu:
            try:
                times[name + "_cudagraph"] = bench.time_fn(fn, makers[name], reps=reps, cuda_graph=True)
            except Exception as e:  # noqa: BLE001 - report, keep going
                print(f"   {name} under CUDA graph failed: {type(e).__name__}: {str(e)[:120]}")
    return times


def run_decode(c: dict, dev, dtype, gpu: bool, errs: dict, reps: int) -> list[dict]:
    elem = torch.empty(0, dtype=dtype).element_size()
    kv_bytes = 2.0 * c["B"] * c["L"] * c["Hkv"] * c["D"] * elem
    paged = lambda seed: make_decode_inputs(c, dev, dtype, seed)  # noqa: E731
    contig = lambda seed: make_contiguous_inputs(c, dev, dtype, seed)  # noqa: E731
    ours = lambda **kw: paged_decode(**kw, impl="triton", check_values=False)  # noqa: E731
    fns = {"triton": ours, "gather_sdpa": gather_sdpa, "sdpa_contiguous": sdpa_contiguous}
    makers = {"triton": paged, "gather_sdpa": paged, "sdpa_contiguous": contig}
    times = _time_pair(fns, makers, reps, gpu)
    cfg = GPU_CONFIG if gpu else INTERPRETER_CONFIG
    splits = choose_num_splits(c["B"], c["Hkv"], c["L"], sms=sm_count(), block_n=cfg["BLOCK_N"],
                               programs_per_sm=cfg["programs_per_sm"])
    records = []
    shape = dict(c)
    for method in ("", "_cudagraph"):
        if "triton" + method not in times:
            continue
        peers = {p: times[p + method].ms for p in ("gather_sdpa", "sdpa_contiguous") if p + method in times}
        for name in fns:
            if name + method not in times:
                continue
            mine = name == "triton"
            extra = {"bytes_counted": "K/V bytes attention must read (2*B*L*Hkv*D*elem)",
                     "timing": "CUDA graph replay" if method else "CUDA events per call"}
            if mine:
                extra.update(check_rel_err=errs, num_splits=splits, config=dict(cfg))
            records.append(bench.make_record(SUITE, decode_case_name(c), name + method, times[name + method],
                                             shape=shape, dtype=dtype, bytes_moved=kv_bytes, ceiling="copy",
                                             peers=peers if mine else None, extra=extra))
    r = next(x for x in records if x["impl"] == "triton")
    line = "  ".join(f"{n} {t.ms:.3f} ms" for n, t in times.items())
    print(f"  {decode_case_name(c):<40} {r['gbps']:7.0f} GB/s {r.get('pct_of_ceiling', 0):5.1f}% copy | {line}")
    return records


def index_copy_peer(k_new, v_new, k_cache, v_cache, slot_mapping):
    """Peer: ``index_copy_`` into the flattened pools (all slots valid; no masking, no sync)."""
    P, ps, Hkv, D = k_cache.shape
    k_cache.view(P * ps, Hkv, D).index_copy_(0, slot_mapping, k_new)
    v_cache.view(P * ps, Hkv, D).index_copy_(0, slot_mapping, v_new)


def run_write(c: dict, dev, dtype, gpu: bool, reps: int) -> list[dict]:
    def mk(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        shape = (c["pages"], c["page"], c["Hkv"], c["D"])
        slots = torch.randperm(c["pages"] * c["page"], device="cpu",
                               generator=torch.Generator().manual_seed(seed))[:c["T"]].to(dev)
        return {"k_new": torch.randn(c["T"], c["Hkv"], c["D"], device=dev, generator=g).to(dtype),
                "v_new": torch.randn(c["T"], c["Hkv"], c["D"], device=dev, generator=g).to(dtype),
                "k_cache": torch.zeros(shape, device=dev, dtype=dtype), "v_cache": torch.zeros(shape, device=dev, dtype=dtype),
                "slot_mapping": slots}

    def written(fn):
        def run(k_new, v_new, k_cache, v_cache, slot_mapping):
            kc, vc = k_cache.clone(), v_cache.clone()
            fn(k_new, v_new, kc, vc, slot_mapping)
            return kc, vc
        return run

    res = bench.check(written(lambda *a: write_kv(*a, impl="triton")), written(write_kv_reference), mk,
                      name=f"write_kv T{c['T']}", trials=2, reference_dtype=dtype, tol=0.0)
    print(res.summary())
    if not res.passed:
        raise AssertionError(res.summary())
    elem = torch.empty(0, dtype=dtype).element_size()
    nbytes = 2.0 * 2 * c["T"] * c["Hkv"] * c["D"] * elem  # K and V: read new, write cache
    fns = {"triton": lambda **kw: write_kv(**kw, impl="triton", check_values=False), 
           "torch_index_copy": index_copy_peer}
    times = _time_pair(fns, {n: mk for n in fns}, reps, gpu)
    name = f"write_kv_T{c['T']}_Hkv{c['Hkv']}_D{c['D']}_p{c['page']}"
    records = []
    for method in ("", "_cudagraph"):
        if "triton" + method not in times:
            continue
        peers = {"torch_index_copy": times["torch_index_copy" + method].ms} if "torch_index_copy" + method in times else None
        for impl in fns:
            if impl + method in times:
                records.append(bench.make_record(SUITE, name, impl + method, times[impl + method], shape=c, dtype=dtype,
                                                 bytes_moved=nbytes, ceiling="copy",
                                                 peers=peers if impl == "triton" else None,
                                                 extra={"bytes_counted": "new K/V read + cache slots written"}))
    print(f"  {name:<40} " + "  ".join(f"{n} {t.ms:.4f} ms" for n, t in times.items()))
    return records


def prefill_flops(c: dict) -> float:
    """Causal attention FLOPs of the new tokens: token i sees prefix + i + 1 keys; 4*D per (query head, key)."""
    keys = c["S"] * c["prefix"] + c["S"] * (c["S"] + 1) / 2
    return 4.0 * c["B"] * c["Hq"] * c["D"] * keys


def make_prefill_inputs(c: dict, dev, dtype, seed: int) -> dict:
    """``S`` new tokens (already written) after a ``prefix``-token cached prefix, every sequence alike."""
    lay = dict(B=c["B"], Hq=c["Hq"], Hkv=c["Hkv"], D=c["D"], page=c["page"], L=c["prefix"] + c["S"])
    ins = make_decode_inputs(lay, dev, dtype, seed)
    g = torch.Generator(device=dev).manual_seed(seed + 1)
    ins["q"] = torch.randn(c["B"], c["S"], c["Hq"], c["D"], device=dev, generator=g).to(dtype)
    return ins


def run_prefill(c: dict, dev, dtype, gpu: bool, reps: int) -> list[dict]:
    L = c["prefix"] + c["S"]
    lay = dict(B=c["B"], Hq=c["Hq"], Hkv=c["Hkv"], D=c["D"], page=c["page"], L=L)
    mk = lambda seed: make_prefill_inputs(c, dev, dtype, seed)  # noqa: E731

    def mk_ragged(seed):  # ragged prefixes (one of them empty) and ragged new-token counts
        g = torch.Generator().manual_seed(seed)
        B, S = c["B"] + 1, min(c["S"], 300)
        lens = [S] + [S + int(x) for x in torch.randint(0, c["prefix"] + 1, (B - 1,), generator=g)]
        ins = make_decode_inputs({**lay, "B": B}, dev, dtype, seed, lens)
        ins["q"] = torch.randn(B, S, c["Hq"], c["D"], generator=g).to(dev, dtype)
        ins["q_lens"] = torch.tensor([S, 1] + torch.randint(0, S + 1, (B - 2,), generator=g).tolist(),
                                     dtype=torch.int32, device=dev)
        return ins

    res = bench.check(lambda **kw: paged_prefill(**kw, impl="triton"), lambda **kw: paged_prefill_reference(**kw),
                      mk_ragged, name="paged_prefill triton (ragged)", trials=2, reference_dtype=torch.float32)
    print(res.summary())
    if not res.passed:
        raise AssertionError(res.summary())

    def mk_contig(seed):
        ins = mk(seed)
        B, Hkv, D, ps = c["B"], c["Hkv"], c["D"], c["page"]
        n = ins["block_table"].shape[1]
        k = ins["k_cache"][ins["block_table"].long()].reshape(B, n * ps, Hkv, D)[:, :L].contiguous()
        v = ins["v_cache"][ins["block_table"].long()].reshape(B, n * ps, Hkv, D)[:, :L].contiguous()
        return {"q": ins["q"], "k": k, "v": v}

    fns = {"triton": lambda **kw: paged_prefill(**kw, impl="triton", check_values=False),
           "gather_sdpa_masked": lambda **kw: paged_prefill(**kw, impl="torch", check_values=False)}
    makers = {"triton": mk, "gather_sdpa_masked": mk}
    if gpu:
        from minimax_lab.attention.flash import DEFAULT_CONFIG, flash_attention
        fns["flash_contiguous"] = lambda q, k, v: flash_attention(q, k, v, causal=True, config=DEFAULT_CONFIG)
        makers["flash_contiguous"] = mk_contig
    times = {}
    for n in fns:
        try:
            times[n] = bench.time_fn(fns[n], makers[n], reps=reps)
        except Exception as e:  # noqa: BLE001 - a broken peer must not hide our numbers
            if n == "triton":
                raise
            print(f"   peer {n} failed: {type(e).__name__}: {str(e)[:120]}")
    name = f"prefill_B{c['B']}_prefix{c['prefix']}_S{c['S']}_Hq{c['Hq']}_Hkv{c['Hkv']}_D{c['D']}_p{c['page']}"
    flops = prefill_flops(c)
    peers = {n: t.ms for n, t in times.items() if n != "triton"}
    records = [bench.make_record(SUITE, name, n, t, shape=c, dtype=dtype, flops=flops, ceiling="gemm",
                                 peers=peers if n == "triton" else None,
                                 extra={"check_rel_err": res.max_error, "config": dict(PREFILL_GPU_CONFIG if gpu else
                                        PREFILL_INTERPRETER_CONFIG)} if n == "triton" else None)
               for n, t in times.items()]
    print(f"  {name:<40} " + "  ".join(f"{n} {t.ms:.3f} ms" for n, t in times.items()))
    return records


def cases(preset: str = "auto") -> dict:
    gpu = runtime.resolve_preset(preset) == "gpu"
    return {"decode": GPU_DECODE if gpu else CPU_DECODE, "write": GPU_WRITE if gpu else CPU_WRITE,
            "prefill": GPU_PREFILL if gpu else CPU_PREFILL}


def run(preset: str = "auto") -> list[dict]:
    """Check, then time every case; returns the records (the CLI writes them)."""
    dev, dtype, gpu = _setup(preset)
    cs = cases(preset)
    reps = 50 if gpu else 3
    errs = check_decode(dev, dtype, gpu)
    records = []
    for c in cs["decode"]:
        records += run_decode(c, dev, dtype, gpu, errs, reps)
        if gpu:
            torch.cuda.empty_cache()
    # write_kv and prefill are timed briefly; a failure there (a failed check included: no record
    # is written for a kernel that failed it) is reported and does not discard the decode records
    for kind, fn, r in (("write", run_write, reps), ("prefill", run_prefill, max(3, reps // 2))):
        for c in cs[kind]:
            try:
                records += fn(c, dev, dtype, gpu, r)
            except Exception as e:  # noqa: BLE001
                print(f"[kvcache] {kind} case {c} FAILED: {type(e).__name__}: {str(e)[:300]}")
    return records
