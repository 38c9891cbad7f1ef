"""Bench suite ``kvcache`` (kernels): paged decode against its peers, plus ``write_kv`` and
``paged_prefill`` timed briefly.

Paged decode cases (H200, bf16, GQA 32 query / 8 KV heads, D=128; every sequence at its full
context so the peers need no mask): B=64 at 8k context with page 16 (also page 64
and 128), and B=8 at 32k and 128k, page 16. Per case, in one process:

* ``triton`` -- :func:`minimax_lab.paged_kv.decode.paged_decode`, ``impl="triton"``, pages
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

Before timing, ``measure.check`` compares each kernel with its fp32 ``reference`` on ragged
random block tables (lengths 1, mid-page, several pages; page sizes 16/64/128).

``write_kv``: T = 64 (one decode step of B=64) and T = 8192 new tokens into a 128k-slot pool;
GB/s of new K/V read plus cache written; peer ``torch.index_copy_``. ``paged_prefill``: 2,048
new tokens over an 8k cached prefix (B=2); TFLOP/s of the causal attention FLOPs; peers the
gather + masked-SDPA ``impl="torch"`` and the workbook's dense FlashAttention
(:mod:`minimax_lab.attention.dense_triton`) on a contiguous copy -- no paging.

FP8 paged decode (``fp8_decode_*``, B=32 at 128k context, the decode shape above): the same
kernel on a bf16 cache (``triton_bf16``; the suite's dtype: ``triton_fp32`` at preset cpu) and
on FP8 (e4m3) caches with per-token (``triton_fp8_token``) and per-page (``triton_fp8_page``)
scales, in one process. Each record's ``bytes_moved`` is what that impl must read (K/V at its
width plus the scales), ``pct_of_ceiling`` is of the measured copy bandwidth, and the FP8
records compare with the bf16 time. Before timing, ``measure.check`` compares the FP8 kernel with the reference on
ragged tables (both layouts); the records carry :func:`fp8_accuracy` -- the decode output's
relative error against the fp32 reference on the *unquantized* cache, per layout, on random
and outlier-heavy K/V.

Two more groups run only when named (:mod:`minimax_lab.bench.suite_kvcache_tiers`): ``bandwidth`` --
host<->device copies of 256 MiB, pinned and pageable (``h2d_pinned`` ... ``d2h_pageable``, GB/s;
on a GPU only) -- and ``engine`` -- the chapter's engine slice on a multi-turn agent session with
and without prefix caching (``engine_ttft_cached`` / ``engine_ttft_nocache``, mean time to first
token per turn).

Case groups (:data:`CASES`; ``run(cases=...)`` or ``--cases``): ``decode``, ``fp8``, ``write``,
``prefill`` (the default, :data:`DEFAULT_CASES`), ``bandwidth``, ``engine``::

    python -m minimax_lab.bench kvcache --cases fp8
    python -m minimax_lab.bench kvcache --cases bandwidth engine

At ``preset="cpu"`` the shapes are tiny (Triton interpreter, fp32); it runs in seconds.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from minimax_lab import configs, measure, runtime
from minimax_lab.attention.dense_triton import DEFAULT_CONFIG, flash_attention
from minimax_lab.bench import suite_kvcache_tiers
from minimax_lab.fp8 import quantize_fp8
from minimax_lab.paged_kv.decode import paged_decode
from minimax_lab.paged_kv.decode_reference import paged_decode_reference
from minimax_lab.paged_kv import decode_triton, prefill_triton
from minimax_lab.paged_kv.decode_triton import choose_num_splits, sm_count
from minimax_lab.paged_kv.prefill import paged_prefill
from minimax_lab.paged_kv.prefill_reference import paged_prefill_reference
from minimax_lab.paged_kv.write import write_kv
from minimax_lab.paged_kv.write_reference import write_kv_reference

SUITE = "kvcache"
GPU_DECODE = [dict(B=64, L=8192, Hq=32, Hkv=8, D=128, page=16), dict(B=64, L=8192, Hq=32, Hkv=8, D=128, page=64),
              dict(B=64, L=8192, Hq=32, Hkv=8, D=128, page=128), dict(B=8, L=32768, Hq=32, Hkv=8, D=128, page=16),
              dict(B=8, L=131072, Hq=32, Hkv=8, D=128, page=16)]
CPU_DECODE = [dict(B=2, L=64, Hq=4, Hkv=2, D=16, page=16)]
GPU_WRITE = [dict(T=64, pages=8192, page=16, Hkv=8, D=128), dict(T=8192, pages=8192, page=16, Hkv=8, D=128)]
CPU_WRITE = [dict(T=8, pages=16, page=16, Hkv=2, D=16)]
GPU_PREFILL = [dict(B=2, prefix=8192, S=2048, Hq=32, Hkv=8, D=128, page=16)]
CPU_PREFILL = [dict(B=1, prefix=20, S=16, Hq=4, Hkv=2, D=16, page=16)]
GPU_FP8_DECODE = [dict(B=32, L=131072, Hq=32, Hkv=8, D=128, page=16)]
CPU_FP8_DECODE = [dict(B=2, L=64, Hq=4, Hkv=2, D=16, page=16)]
#: the scale layouts of an FP8 cache: quantize_fp8's dims for each
FP8_LAYOUTS = {"token": (-1,), "page": (1, 3)}


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
    """``measure.check`` of the Triton decode against the fp32 reference on ragged random block tables."""
    errs = {}
    pages = (16, 64, 128) if gpu else (16,)
    base = dict(B=7, Hq=32, Hkv=8, D=128) if gpu else dict(B=4, Hq=4, Hkv=1, D=16)
    max_len = 5000 if gpu else 40
    for page in pages:
        for splits in (None, 3):
            c = {**base, "page": page, "L": max_len}
            res = measure.check(
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
        times[name] = measure.time_fn(fn, makers[name], reps=reps)
        if gpu:
            try:
                times[name + "_cudagraph"] = measure.time_fn(fn, makers[name], reps=reps, cuda_graph=True)
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
    cfg = configs.launch_config(decode_triton.LAUNCH)  # what the kernel ran with
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
            records.append(measure.make_record(SUITE, decode_case_name(c), name + method, times[name + method],
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

    res = measure.check(written(lambda *a: write_kv(*a, impl="triton")), written(write_kv_reference), mk,
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
                records.append(measure.make_record(SUITE, name, impl + method, times[impl + method], shape=c, dtype=dtype,
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

    res = measure.check(lambda **kw: paged_prefill(**kw, impl="triton"), lambda **kw: paged_prefill_reference(**kw),
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
        fns["flash_contiguous"] = lambda q, k, v: flash_attention(q, k, v, causal=True, config=DEFAULT_CONFIG)
        makers["flash_contiguous"] = mk_contig
    times = {}
    for n in fns:
        try:
            times[n] = measure.time_fn(fns[n], makers[n], reps=reps)
        except Exception as e:  # noqa: BLE001 - a broken peer must not hide our numbers
            if n == "triton":
                raise
            print(f"   peer {n} failed: {type(e).__name__}: {str(e)[:120]}")
    name = f"prefill_B{c['B']}_prefix{c['prefix']}_S{c['S']}_Hq{c['Hq']}_Hkv{c['Hkv']}_D{c['D']}_p{c['page']}"
    flops = prefill_flops(c)
    peers = {n: t.ms for n, t in times.items() if n != "triton"}
    records = [measure.make_record(SUITE, name, n, t, shape=c, dtype=dtype, flops=flops, ceiling="gemm",
                                   peers=peers if n == "triton" else None,
                                   extra={"check_rel_err": res.max_error, "config": configs.launch_config(
                                     prefill_triton.LAUNCH)} if n == "triton" else None)
               for n, t in times.items()]
    print(f"  {name:<40} " + "  ".join(f"{n} {t.ms:.3f} ms" for n, t in times.items()))
    return records


# --------------------------------------------------------------------------- FP8 KV cache


def quantize_cache(cache: torch.Tensor, layout: str, *, chunk_pages: int = 4096):
    """``(cache8, scale)`` of a ``[num_pages, page_size, Hkv, D]`` cache with ``layout`` ``"token"``
    or ``"page"`` scales (:data:`FP8_LAYOUTS`), quantized ``chunk_pages`` pages at a time so a
    many-GB cache never needs an fp32 copy of itself."""
    dims = FP8_LAYOUTS[layout]
    parts = [quantize_fp8(cache[i:i + chunk_pages], dims=dims, check_values=False)
             for i in range(0, cache.shape[0], chunk_pages)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def fp8_kv_kinds(k: torch.Tensor, v: torch.Tensor, g: torch.Generator) -> dict:
    """Random K/V ``[num_pages, page_size, Hkv, D]`` and outlier-heavy variants of them:

    * ``random`` -- standard normal;
    * ``k_channel_outliers_x100`` -- 4 of the D key channels 100x larger for every token (keys
      have per-channel outliers: Liu et al. 2024, KIVI, arXiv 2402.02750);
    * ``token_outliers_x1000`` -- one token in 64 (per page and head) with K and V 1000x larger;
    """
    P, ps, Hkv, D = k.shape
    ch = torch.ones(D, device=k.device)
    ch[:4] = 100.0
    pick = (torch.rand(P, ps, Hkv, 1, generator=g) < 1 / 64).to(k.device)
    return {"random": (k, v), "k_channel_outliers_x100": (k * ch, v),
            "token_outliers_x1000": (torch.where(pick, k * 1000, k), torch.where(pick, v * 1000, v))}


def fp8_accuracy(dev, *, B: int = 4, L: int = 512, Hq: int = 8, Hkv: int = 2, D: int = 64, page: int = 16,
                 seed: int = 0, impl: str = "torch") -> dict:
    """Relative error of FP8 paged decode against the fp32 reference on the unquantized cache,
    ``{kind: {"token": err, "page": err}}`` for the kinds of :func:`fp8_kv_kinds` plus
    ``small_token_in_loud_page``: in every page one token's V is 10**-4 of its neighbours' (which
    are 100x louder than normal) while its key points along its group's queries, so the output
    leans on the quiet values -- the case a per-page scale is worst at (they fall into e4m3's
    subnormals). ``impl`` computes the FP8 decode (``"torch"``:
    fast anywhere; the kernels agree with it within their dtype's tolerance)."""
    c = dict(B=B, L=L, Hq=Hq, Hkv=Hkv, D=D, page=page)
    ins = make_decode_inputs(c, dev, torch.float32, seed)
    g = torch.Generator().manual_seed(seed)
    kinds = fp8_kv_kinds(ins["k_cache"], ins["v_cache"], g)
    # small_token_in_loud_page: slot 0 of every page holds a quiet value (1e-2) under a key that
    # points along all of its group's queries (so it takes nearly all their weight); the other
    # slots' values are 100x loud
    k, v = ins["k_cache"].clone(), ins["v_cache"] * 100.0
    qdir = ins["q"] / ins["q"].norm(dim=-1, keepdim=True)  # [B, Hq, D]
    toward = qdir.view(B, Hkv, Hq // Hkv, D).sum(2) * 8.0 * math.sqrt(D)  # [B, Hkv, D]
    for b in range(B):
        pages = ins["block_table"][b][ins["block_table"][b] >= 0].long()
        k[pages, 0] = toward[b]
    v[:, 0] = ins["v_cache"][:, 0] * 1e-2
    kinds["small_token_in_loud_page"] = (k, v)
    out = {}
    for kind, (kc, vc) in kinds.items():
        ref = paged_decode_reference(ins["q"], kc, vc, ins["block_table"], ins["seq_lens"])
        out[kind] = {}
        for layout, dims in FP8_LAYOUTS.items():
            k8, ks = quantize_fp8(kc, dims=dims)
            v8, vs = quantize_fp8(vc, dims=dims)
            o = paged_decode(ins["q"], k8, v8, ins["block_table"], ins["seq_lens"], impl=impl, k_scale=ks,
                             v_scale=vs)
            out[kind][layout] = round(measure.relative_error(o, ref), 6)
    return out


def fp8_case_name(c: dict) -> str:
    return "fp8_" + decode_case_name(c)


def make_fp8_decode_inputs(c: dict, dev, dtype, seed: int, layout: str | None, lengths=None) -> dict:
    """:func:`make_decode_inputs` with the caches quantized to FP8 with ``layout`` scales (``None``: as they are)."""
    ins = make_decode_inputs(c, dev, dtype, seed, lengths)
    if layout is not None:
        ins["k_cache"], ins["k_scale"] = quantize_cache(ins["k_cache"], layout)
        ins["v_cache"], ins["v_scale"] = quantize_cache(ins["v_cache"], layout)
    return ins


def check_fp8_decode(dev, dtype, gpu: bool) -> dict:
    """``measure.check`` of the Triton decode on FP8 caches (both layouts) against the fp32
    reference of the same stored values, on ragged random block tables."""
    errs = {}
    base = dict(B=7, Hq=32, Hkv=8, D=128, page=16, L=5000) if gpu else dict(B=4, Hq=4, Hkv=2, D=16, page=16, L=40)

    def reference(q, k_cache, v_cache, block_table, seq_lens, k_scale, v_scale):
        # measure.check hands the reference fp32 copies of the fp8 caches: the stored values are them times the scales
        ps = k_cache.shape[1]
        deq = lambda x, s: x * (s if s.ndim == 3 else s[:, None, :].expand(-1, ps, -1))[..., None]  # noqa: E731
        return paged_decode_reference(q, deq(k_cache, k_scale), deq(v_cache, v_scale), block_table, seq_lens)

    for layout in FP8_LAYOUTS:
        res = measure.check(
            lambda **kw: paged_decode(**kw, impl="triton"), reference,
            lambda seed, layout=layout: make_fp8_decode_inputs(base, dev, dtype, seed, layout, ragged_lengths(
                base["B"], base["L"], base["page"], torch.Generator().manual_seed(seed))),
            name=f"paged_decode triton fp8 ({layout} scales)", trials=2, reference_dtype=torch.float32)
        print(res.summary())
        if not res.passed:
            raise AssertionError(res.summary())
        errs[layout] = res.max_error
    return errs


def run_fp8_decode(c: dict, dev, dtype, gpu: bool, reps: int) -> list[dict]:
    """bf16 vs FP8 (per-token and per-page scales) paged decode on one shape, timed in one process."""
    errs = check_fp8_decode(dev, dtype, gpu)
    accuracy = fp8_accuracy(dev) if gpu else fp8_accuracy(dev, B=2, L=64, Hq=4, D=16)
    print(f"  fp8 accuracy vs unquantized fp32 reference (rel err per layout): {accuracy}")
    elem = torch.empty(0, dtype=dtype).element_size()
    n_tok = c["B"] * c["L"] * c["Hkv"]  # (token, kv head) rows of K (and of V)
    n_page = c["B"] * (-(-c["L"] // c["page"])) * c["Hkv"]
    plain = "triton_" + {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")  # the unquantized cache
    nbytes = {plain: 2.0 * n_tok * c["D"] * elem,
              "triton_fp8_token": 2.0 * n_tok * (c["D"] + 4), "triton_fp8_page": 2.0 * (n_tok * c["D"] + n_page * 4)}
    counted = {plain: "K/V the attention must read (2*B*L*Hkv*D*elem)",
               "triton_fp8_token": "fp8 K/V + an fp32 scale per token and head (2*B*L*Hkv*(D+4))",
               "triton_fp8_page": "fp8 K/V + an fp32 scale per page and head"}
    layouts = {plain: None, "triton_fp8_token": "token", "triton_fp8_page": "page"}
    fn = lambda **kw: paged_decode(**kw, impl="triton", check_values=False)  # noqa: E731
    # FP8 tiles are half the bytes: on the GPU also time twice the tokens per tile (a tuning datum)
    base = configs.launch_config(decode_triton.FP8_LAUNCH)
    wide = {**base, "BLOCK_N": 2 * base["BLOCK_N"]}
    if gpu:
        layouts["triton_fp8_token_wide_tile"] = "token"
        nbytes["triton_fp8_token_wide_tile"] = nbytes["triton_fp8_token"]
        counted["triton_fp8_token_wide_tile"] = counted["triton_fp8_token"] + f"; config {wide}"
    times = {}
    for name, layout in layouts.items():
        if name.endswith("_wide_tile"):
            continue
        ins = make_fp8_decode_inputs(c, dev, dtype, 0, layout)
        # one input set: at 128k a set is GBs, far past the L2, so nothing is cache-resident
        fns = {name: fn}
        if name + "_wide_tile" in layouts:
            fns[name + "_wide_tile"] = lambda **kw: paged_decode(**kw, impl="triton", check_values=False, config=wide)
        times.update(_time_pair(fns, {n: (lambda seed, ins=ins: ins) for n in fns}, reps, gpu))
        del ins
        if gpu:
            torch.cuda.empty_cache()
    records = []
    for method in ("", "_cudagraph"):
        base = times.get(plain + method)
        for name in layouts:
            if name + method not in times:
                continue
            extra = {"bytes_counted": counted[name], "bytes_moved": nbytes[name],
                     "timing": "CUDA graph replay" if method else "CUDA events per call",
                     "kv_dtype": str(dtype).replace("torch.", "") if layouts[name] is None else "float8_e4m3fn",
                     "scale_layout": layouts[name]}
            if layouts[name] is not None:
                extra.update(check_rel_err=errs, accuracy_rel_err_vs_unquantized=accuracy)
            peers = {plain + method: base.ms} if layouts[name] is not None and base is not None else None
            records.append(measure.make_record(SUITE, fp8_case_name(c), name + method, times[name + method],
                                               shape=dict(c), dtype=dtype, bytes_moved=nbytes[name], ceiling="copy",
                                               peers=peers, extra=extra))
    line = "  ".join(f"{r['impl']} {r['ms']:.3f} ms ({r.get('pct_of_ceiling', 0):.0f}% copy)" for r in records)
    print(f"  {fp8_case_name(c):<40} {line}")
    return records


def cases(preset: str = "auto") -> dict:
    gpu = runtime.resolve_preset(preset) == "gpu"
    return {"decode": GPU_DECODE if gpu else CPU_DECODE, "write": GPU_WRITE if gpu else CPU_WRITE,
            "prefill": GPU_PREFILL if gpu else CPU_PREFILL, "fp8": GPU_FP8_DECODE if gpu else CPU_FP8_DECODE}


_shapes = cases  # run's ``cases`` argument (the groups) hides the function inside run


#: case groups; :data:`DEFAULT_CASES` run unless ``cases`` names others
CASES = ("decode", "fp8", "write", "prefill", "bandwidth", "engine")
DEFAULT_CASES = ("decode", "fp8", "write", "prefill")


def run(preset: str = "auto", cases=None) -> list[dict]:
    """Check, then time the case groups ``cases`` (default :data:`DEFAULT_CASES`); returns the
    records (the CLI writes them)."""
    parts = set(measure.select_cases(cases, CASES, DEFAULT_CASES))
    dev, dtype, gpu = _setup(preset)
    cs = _shapes(preset)
    reps = 50 if gpu else 3
    records = []
    if "decode" in parts:
        errs = check_decode(dev, dtype, gpu)
        for c in cs["decode"]:
            records += run_decode(c, dev, dtype, gpu, errs, reps)
            if gpu:
                torch.cuda.empty_cache()
    # FP8 decode, write_kv and prefill: a failure there (a failed check included: no record is
    # written for a kernel that failed it) is reported and does not discard the other records
    for kind, fn, r in (("fp8", run_fp8_decode, reps), ("write", run_write, reps),
                        ("prefill", run_prefill, max(3, reps // 2))):
        if kind not in parts:
            continue
        for c in cs[kind]:
            try:
                records += fn(c, dev, dtype, gpu, r)
            except Exception as e:  # noqa: BLE001
                print(f"[kvcache] {kind} case {c} FAILED: {type(e).__name__}: {str(e)[:300]}")
    if "bandwidth" in parts or "engine" in parts:
        if "bandwidth" in parts:
            if torch.cuda.is_available():
                records += suite_kvcache_tiers.bandwidth_records()
            else:
                print("[kvcache] bandwidth: host<->device copies need a GPU; no records")
        if "engine" in parts:
            records += suite_kvcache_tiers.engine_records(preset)[0]
    return records
