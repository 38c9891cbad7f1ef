"""The shared KV pool over loopback: put/get bandwidth and latency against block size, and where
fetching a prefix beats recomputing it.

``store_rows(sizes)`` starts a ``kvcache.store.StoreServer`` on 127.0.0.1, joins it with one
client and, for each value size, times

* **latency**: one ``put`` / one ``get`` of one value (median of ``repeats``, ms);
* **bandwidth**: one ``put_batch`` / ``get_batch`` of values adding up to ~``batch_bytes``
  (median GB/s), the way the remote tier moves a prompt's pages.

``tier_rows(sizes)`` times, in the same run and interleaved repeat by repeat, what the engine's
remote tier (``kvcache.remote.RemoteTier``) moves against the raw client under it, for blocks of
64 KiB to 4 MiB, ~16 MiB per call: the raw client's ``put_batch``/``get_batch`` of bytes and its
zero-copy ``batch_put_from``/``batch_get_into`` on a registered buffer, and the tier's
``put_many``/``get_many`` with values signed by the pool's secret (keyed BLAKE3) and checksummed
only (xxh3-128). Each row has MiB/s per path and the tier's time over the faster raw path's
(``*_vs_raw``), plus the codec alone (packing and checking a value in memory).

``fetch_vs_recompute(rows, ...)`` turns a get bandwidth -- the tier's (``typical_tier_gbps``: the
median signed-tier get rate over 64 KiB-4 MiB blocks, what the engine's own path moves) -- into
``cost.break_even`` verdicts for the tiny model (recomputing at a rate measured on this CPU) and
the M3-shaped layer on a *modelled* H200 (989 TFLOP/s bf16 at 50%: no GPU is involved).
``python -m minimax_lab.bench.suite_kvstore --out results/kvstore_bandwidth.json`` writes all of it;
``run`` gives the same as bench records (suite ``kvstore``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from minimax_lab import measure
from minimax_lab.engine.slice import PagedEngine
from minimax_lab.kvcache import store as mc
from minimax_lab.kvcache.cost import M3_LAYER, break_even
from minimax_lab.kvcache.pool_value import ValueCodec, aligned_buffer
from minimax_lab.kvcache import remote as remote_mod
from minimax_lab.kvcache.remote import RemoteTier
from minimax_lab.model.config import tiny_model_shape
from minimax_lab.model.train import load_pretrained

SUITE = "kvstore"
SIZES = tuple(4 << (2 * i) << 10 for i in range(7))            # 4 KiB .. 16 MiB
TIER_SIZES = (64 << 10, 256 << 10, 1 << 20, 4 << 20)
#: the paths ``tier_rows`` times: the raw client's two, the tier signed and checksummed
TIER_PATHS = ("raw_bytes", "raw_zero_copy", "tier_keyed", "tier_checksum")
H200_BF16_TFLOPS = 989.0
#: what a break-even record is: a model's verdict at a measured link rate, not a timing
MODELLED = ("modelled: cost.break_even at the measured loopback get rate; the tiny model's rate measured on "
            "this CPU, the M3-shaped layer's an H200 at 50% of 989 TFLOP/s (no GPU ran)")


def _client(server):
    mc.client_environment()
    import mooncake.store  # deferred: optional dependency (minimax-lab[store])
    for attempt in range(5):                   # a busy machine can miss the client's 2 s RPC deadline
        c = mooncake.store.MooncakeDistributedStore()
        rc = c.setup(mc.HOST, server.metadata_url, 0, 256 << 20, "tcp", "", server.master_address)
        if rc == 0:
            return c
        time.sleep(1.0 + attempt)
    raise RuntimeError(f"could not join the pool (setup returned {rc}, 5 tries)")


def store_rows(sizes=SIZES, *, repeats: int = 5, batch_bytes: int = 16 << 20, pool_bytes: int = 1 << 30) -> list[dict]:
    """Measured rows, one per value size (module docstring). Raises ``mc.StoreUnavailable``."""
    with mc.StoreServer(pool_bytes=pool_bytes) as server:
        return mc.in_netns(server.netns, _measure, server, sizes, repeats, batch_bytes, timeout_s=3600)


def _measure(server, sizes, repeats: int, batch_bytes: int) -> list[dict]:
    """``store_rows``'s measurements, from one client on this thread."""
    rows = []
    c = _client(server)
    for size in sizes:
        val = bytes(torch.randint(0, 256, (size,), dtype=torch.uint8).numpy())
        lat_put, lat_get = [], []
        for i in range(repeats):
            k = f"lat-{size}-{i}"
            t0 = time.perf_counter()
            rc = c.put(k, val)
            t1 = time.perf_counter()
            got = c.get(k)
            t2 = time.perf_counter()
            c.remove(k, True)
            if rc != 0 or len(got) != size:
                raise RuntimeError(f"put/get of {size} bytes failed ({rc}, {len(got)})")
            lat_put.append(t1 - t0)
            lat_get.append(t2 - t1)
        n = max(1, min(256, batch_bytes // size))
        bw_put, bw_get = [], []
        failed = 0
        for i in range(repeats):
            for attempt in range(3):               # a busy machine can make a call miss its deadline
                keys = [f"bw-{size}-{i}-{attempt}-{j}" for j in range(n)]
                t0 = time.perf_counter()
                rc = c.put_batch(keys, [val] * n)
                t1 = time.perf_counter()
                got = c.get_batch(keys)
                t2 = time.perf_counter()
                c.batch_remove(keys, True)
                if rc == 0 and all(len(g) == size for g in got):
                    break
                failed += 1
            else:
                raise RuntimeError(f"batch put/get of {n} x {size} bytes failed 3 times ({rc})")
            bw_put.append(n * size / (t1 - t0) / 1e9)
            bw_get.append(n * size / (t2 - t1) / 1e9)
        rows.append(dict(block_bytes=size, put_ms=statistics.median(lat_put) * 1e3,
                         get_ms=statistics.median(lat_get) * 1e3, batch=n, failed_repeats=failed,
                         put_gbps=statistics.median(bw_put), get_gbps=statistics.median(bw_get)))
    c.close()                                  # before the master goes: a quick unmount
    return rows


def tier_rows(sizes=TIER_SIZES, *, repeats: int = 5, batch_bytes: int = 16 << 20,
              pool_bytes: int = 1 << 30) -> list[dict]:
    """Measured rows, one per block size (module docstring). Raises ``mc.StoreUnavailable``."""
    return all_rows((), sizes, repeats=repeats, batch_bytes=batch_bytes, pool_bytes=pool_bytes)[1]


def all_rows(sizes=SIZES, tier_sizes=TIER_SIZES, *, repeats: int = 5, batch_bytes: int = 16 << 20,
             pool_bytes: int = 1 << 30) -> tuple[list[dict], list[dict]]:
    """``(store_rows, tier_rows)`` measured against one store, from one thread inside its namespace
    (a process's Mooncake clients must share a network namespace). Raises ``mc.StoreUnavailable``."""
    def measure(server):
        raw = _measure(server, sizes, repeats, batch_bytes) if sizes else []
        return raw, _measure_tiers(server, tier_sizes, repeats, batch_bytes) if tier_sizes else []
    with mc.StoreServer(pool_bytes=pool_bytes) as server:
        return mc.in_netns(server.netns, measure, server, timeout_s=3600)


def _tier(server, model: str, shape, buffer_bytes: int, secret) -> RemoteTier:
    """A remote tier on ``server`` for fp16 blocks of ``shape`` (joining again, as ``_client`` does,
    when a busy machine makes the client miss its RPC deadline)."""
    for attempt in range(5):
        t = RemoteTier(server.master_address, server.metadata_url, model=model, dtype=torch.float16,
                       block_shape=shape, buffer_bytes=buffer_bytes, timeout_s=60.0, secret=secret)
        if t.enabled:
            return t
        t.close()
        remote_mod._SAID.clear()
        time.sleep(1.0 + attempt)
    raise RuntimeError(f"{model}: {t.reason}")


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _measure_tiers(server, sizes, repeats: int, batch_bytes: int) -> list[dict]:
    """``tier_rows``'s measurements: one raw client and two tiers in this process, on this thread."""
    c = _client(server)
    g = torch.Generator().manual_seed(0)
    rows = []
    for size in sizes:
        n = max(1, batch_bytes // size)
        shape = (size // 2,)                                   # fp16 blocks of `size` payload bytes
        blocks = [torch.randn(shape, generator=g).half() for _ in range(n)]
        tiers = {"tier_keyed": _tier(server, "bench", shape, n * (size + 4096), server.secret),
                 "tier_checksum": _tier(server, "bench-xxh3", shape, n * (size + 4096), False)}
        src = aligned_buffer(n * size)
        dst = aligned_buffer(n * size)
        for j, b in enumerate(blocks):
            src[j * size:(j + 1) * size] = b.view(torch.uint8).numpy()
        values = [src[j * size:(j + 1) * size].tobytes() for j in range(n)]
        for buf in (src, dst):
            if c.register_buffer(buf.ctypes.data, len(buf)) != 0:
                raise RuntimeError("could not register a buffer with the client")
        secs = {f"{p}_{op}": [] for p in TIER_PATHS for op in ("put", "get")}
        failed = 0
        for rep in range(repeats):
            for attempt in range(3):               # a busy machine can make a call miss its deadline
                timed = _tier_repeat(c, tiers, f"{size}-{rep}-{attempt}", src, dst, values, blocks, size)
                if timed is not None:
                    break
                failed += 1
            else:
                raise RuntimeError(f"put/get of {n} x {size} bytes failed 3 times")
            for key, sec in timed.items():
                secs[key].append(sec)
        for buf in (src, dst):
            c.unregister_buffer(buf.ctypes.data)
        for t in tiers.values():
            t.close()
        row = dict(block_bytes=size, batch=n, repeats=repeats, failed_repeats=failed)
        for key, v in secs.items():
            row[f"{key}_mibps"] = n * size / statistics.median(v) / 2**20
        for p in ("tier_keyed", "tier_checksum"):
            for op in ("put", "get"):
                raw = max(row[f"raw_bytes_{op}_mibps"], row[f"raw_zero_copy_{op}_mibps"])
                row[f"{p}_{op}_vs_raw"] = raw / row[f"{p}_{op}_mibps"]
        row.update(_codec_rates(shape, blocks[0]))
        rows.append(row)
    c.close()
    return rows


def _tier_repeat(c, tiers: dict, tag: str, src, dst, values: list, blocks: list, size: int) -> dict | None:
    """One repeat of every path of ``TIER_PATHS``, put then get, each checked: seconds per
    ``<path>_<op>``, or None when a call failed (its keys are removed either way)."""
    n = len(blocks)
    keys = {p: [f"{p}-{tag}-{j}" for j in range(n)] for p in ("raw_bytes", "raw_zero_copy")}
    names = [f"{tag}-{j}".encode().ljust(16, b".") for j in range(n)]
    got, secs, ok = {}, {}, True
    secs["raw_bytes_put"] = _timed(lambda: got.__setitem__("rc", c.put_batch(keys["raw_bytes"], values)))
    secs["raw_bytes_get"] = _timed(lambda: got.__setitem__("v", c.get_batch(keys["raw_bytes"])))
    ok &= got["rc"] == 0 and all(v == w for v, w in zip(got["v"], values))
    dst[:] = 0
    secs["raw_zero_copy_put"] = _timed(lambda: got.__setitem__("rc", c.batch_put_from(
        keys["raw_zero_copy"], [src.ctypes.data + j * size for j in range(n)], [size] * n)))
    secs["raw_zero_copy_get"] = _timed(lambda: got.__setitem__("v", c.batch_get_into(
        keys["raw_zero_copy"], [dst.ctypes.data + j * size for j in range(n)], [size] * n)))
    ok &= all(rc == 0 for rc in got["rc"]) and all(v == size for v in got["v"]) and bool((src == dst).all())
    for p, t in tiers.items():
        secs[f"{p}_put"] = _timed(lambda: got.__setitem__("n", t.put_many(names, blocks)))
        secs[f"{p}_get"] = _timed(lambda: got.__setitem__("v", t.get_many(names)))
        ok &= got["n"] == n and all(v is not None and torch.equal(v, b) for v, b in zip(got["v"], blocks))
        c.batch_remove([t.key(x) for x in names], True)
        t._open_until = 0.0                        # a failed call must not skip the next repeat's calls
    for ks in keys.values():
        c.batch_remove(ks, True)
    return secs if ok else None


def _codec_rates(shape, block: torch.Tensor, reps: int = 20) -> dict:
    """MiB/s of packing a value (copy + tag) and of checking one and copying its tensor out, in memory."""
    out = {}
    name = b"codec-rate-block"
    for label, secret in (("keyed", bytes(32)), ("checksum", None)):
        codec = ValueCodec("bench", torch.float16, shape, secret)
        buf = aligned_buffer(codec.size(name))
        pack = statistics.median(_timed(lambda: codec.pack_into(buf, name, block)) for _ in range(reps))
        check = statistics.median(_timed(lambda: codec.check(buf, name) and codec.tensor(buf, name))
                                  for _ in range(reps))
        out[f"pack_{label}_mibps"] = block.numel() * 2 / pack / 2**20
        out[f"check_{label}_mibps"] = block.numel() * 2 / check / 2**20
    return out


def typical_tier_gbps(rows: list[dict]) -> float:
    """The median get rate (GB/s) of the signed tier over the block sizes of ``tier_rows``."""
    return statistics.median(r["tier_keyed_get_mibps"] * 2**20 / 1e9 for r in rows)


def cpu_prefill_tflops(tokens: int = 256) -> float:
    """The FLOP rate (TFLOP/s) of the tiny model's prefill on this machine, from one timed prompt."""
    model, cfg = load_pretrained()
    eng = PagedEngine(model, num_pages=64, page_size=16, prefix_caching=False)
    prompt = [4 + i % (cfg.vocab_size - 4) for i in range(tokens)]
    eng.generate("warm", prompt[:32], 1)
    t0 = time.perf_counter()
    eng.prefill("x", prompt)
    dt = time.perf_counter() - t0
    return tiny_model_shape(cfg).prefill_flops(0, tokens) / dt / 1e12


def fetch_vs_recompute(link: float, *, cpu_tflops: float, contexts=(1024, 32768, 131072)) -> list[dict]:
    """``break_even`` at a measured get rate ``link`` (GB/s; the chapter uses ``typical_tier_gbps``):
    the tiny model at ``cpu_tflops`` (mfu 1, a measured rate) and the M3-shaped layer on a modelled
    H200 (989 TFLOP/s bf16, mfu 0.5)."""
    out = []
    for ctx in contexts:
        tiny = replace(tiny_model_shape(), dtype_bytes=4)          # its CPU cache is fp32
        out.append(break_even(tiny, link_gbps=link, gpu_tflops=cpu_tflops, context=ctx, mfu=1.0))
        out.append(break_even(M3_LAYER, link_gbps=link, gpu_tflops=H200_BF16_TFLOPS, context=ctx, mfu=0.5))
    for r in out:
        r["link_gbps"] = link
    return out


#: the suite's case groups: ``loopback`` (put/get against value size), ``tier_speed`` (the tier
#: beside the raw client) and ``break_even`` (at the tier's measured get rate)
CASES = ("loopback", "tier_speed", "break_even")


def run(preset: str = "auto", cases=None, sink=None) -> list[dict]:
    """Bench records: ``loopback`` -- ``put_<size>`` / ``get_<size>`` (batched; the one-value
    latency in ``extra``); ``tier_speed`` -- ``<op>_<size>`` for each path of ``TIER_PATHS`` (impl),
    the tier's records carrying the faster raw path as a peer; ``break_even`` --
    ``break_even_<model>_<context>`` at the tier's rate, the verdict in ``extra``. Where the store
    cannot start it says why (stderr) and returns no records."""
    chosen = measure.select_cases(cases, CASES)
    try:
        rows, tiers = all_rows(SIZES if "loopback" in chosen else (),
                               TIER_SIZES if {"tier_speed", "break_even"} & set(chosen) else ())
    except mc.StoreUnavailable as e:
        print(f"suite kvstore: {e}", file=sys.stderr)
        return []
    recs = []

    def emit(rec):
        recs.append(rec)
        if sink is not None:
            sink(rec)
    if "loopback" in chosen:
        for r in rows:
            for op in ("put", "get"):
                ms = r["block_bytes"] * r["batch"] / (r[f"{op}_gbps"] * 1e9) * 1e3
                emit(measure.make_record(SUITE, f"{op}_{r['block_bytes']}", "mooncake_tcp_loopback", ms,
                                         shape=dict(block_bytes=r["block_bytes"], batch=r["batch"]),
                                         dtype="uint8", bytes_moved=r["block_bytes"] * r["batch"],
                                         extra=dict(latency_ms=r[f"{op}_ms"])))
    if "tier_speed" in chosen:
        for r in tiers:
            moved = r["block_bytes"] * r["batch"]
            for op in ("put", "get"):
                ms = {p: moved / (r[f"{p}_{op}_mibps"] * 2**20) * 1e3 for p in TIER_PATHS}
                raw = min(ms["raw_bytes"], ms["raw_zero_copy"])
                for p in TIER_PATHS:
                    emit(measure.make_record(SUITE, f"{op}_{r['block_bytes']}", p, ms[p],
                                             shape=dict(block_bytes=r["block_bytes"], batch=r["batch"]),
                                             dtype="float16", bytes_moved=moved,
                                             peers=dict(raw_client=raw) if p.startswith("tier") else None))
    if "break_even" in chosen:
        for b in fetch_vs_recompute(typical_tier_gbps(tiers), cpu_tflops=cpu_prefill_tflops()):
            slug = b["model"].split(" ")[0].replace("-", "_").lower()
            emit(measure.make_record(SUITE, f"break_even_{slug}_{b['context']}", "cost.break_even",
                                     b["t_fetch_s"] * 1e3, shape=dict(context=b["context"]),
                                     extra={k: v for k, v in b.items() if k != "model"} | dict(
                                         model=b["model"], note=MODELLED)))
    return recs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Mooncake Store put/get over loopback against block size, and the "
                                            "remote tier beside the raw client.")
    p.add_argument("--out", default="results/kvstore_bandwidth.json")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error("--repeats must be at least 1")
    try:
        rows, tiers = all_rows(repeats=a.repeats)
    except (mc.StoreUnavailable, RuntimeError) as e:
        print(f"suite_kvstore: {e}", file=sys.stderr)
        return 2
    cpu = cpu_prefill_tflops()
    link = typical_tier_gbps(tiers)
    doc = dict(machine="CPU machine (2 cores, shared), TCP over 127.0.0.1: no GPU, no RDMA", rows=rows, tier=tiers,
               tier_paths=dict(raw_bytes="client put_batch/get_batch of bytes",
                               raw_zero_copy="client batch_put_from/batch_get_into on a registered buffer",
                               tier_keyed="RemoteTier put_many/get_many, values signed with the pool secret "
                                          "(keyed BLAKE3)",
                               tier_checksum="RemoteTier put_many/get_many, values checksummed only (xxh3-128)"),
               cpu_prefill_tflops=cpu, link_gbps=link,
               link="typical_tier_gbps: median get rate of the signed tier over 64 KiB-4 MiB blocks",
               gpu="modelled, not measured: an H200 at 50% of 989 TFLOP/s bf16",
               break_even=fetch_vs_recompute(link, cpu_tflops=cpu))
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    for r in rows:
        print(f"{r['block_bytes']:>9} B  put {r['put_ms']:7.3f} ms {r['put_gbps']:6.2f} GB/s   "
              f"get {r['get_ms']:7.3f} ms {r['get_gbps']:6.2f} GB/s   (batch {r['batch']})")
    for r in tiers:
        for op in ("put", "get"):
            print(f"{r['block_bytes'] >> 10:>6} KiB {op}: " + "  ".join(
                f"{p} {r[f'{p}_{op}_mibps']:6.0f}" for p in TIER_PATHS) + " MiB/s   tier/raw: keyed "
                f"{r[f'tier_keyed_{op}_vs_raw']:.2f}x, checksum {r[f'tier_checksum_{op}_vs_raw']:.2f}x")
    for b in doc["break_even"]:
        print(f"{b['model']:<28} ctx {b['context']:>7}: fetch {'wins' if b['fetch_wins'] else 'loses'} "
              f"(recompute/fetch = {b['ratio']:.2f}, break-even {b['break_even_gbps']:.3f} GB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
