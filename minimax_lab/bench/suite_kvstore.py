"""The shared KV pool over loopback: put/get bandwidth and latency against block size, and where
fetching a prefix beats recomputing it.

``store_rows(sizes)`` starts a ``kvcache.store.StoreServer`` on 127.0.0.1, joins it with one
client and, for each value size, times

* **latency**: one ``put`` / one ``get`` of one value (median of ``repeats``, ms);
* **bandwidth**: one ``put_batch`` / ``get_batch`` of values adding up to ~``batch_bytes``
  (median GB/s), the way the remote tier moves a prompt's pages.

``fetch_vs_recompute(rows, ...)`` turns the measured get bandwidth (``typical_get_gbps``: the
median of the batched gets of values of 64 KiB and more, where a value is no longer one round
trip) into ``cost.break_even`` verdicts for the tiny model (recomputing at a rate measured on this
CPU) and the M3-shaped layer on a *modelled* H200 (989 TFLOP/s bf16 at 50%: no GPU is involved). ``python -m minimax_lab.bench.suite_kvstore --out results/kvstore_bandwidth.json``
writes both; ``run`` gives the same as bench records (suite ``kvstore``).
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
from minimax_lab.model.config import tiny_model_shape
from minimax_lab.model.train import load_pretrained

SUITE = "kvstore"
SIZES = tuple(4 << (2 * i) << 10 for i in range(7))            # 4 KiB .. 16 MiB
H200_BF16_TFLOPS = 989.0
#: what a break-even record is: a model's verdict at a measured link rate, not a timing
MODELLED = ("modelled: cost.break_even at the measured loopback get rate; the tiny model's rate measured on "
            "this CPU, the M3-shaped layer's an H200 at 50% of 989 TFLOP/s (no GPU ran)")


def _client(server):
    mc.client_environment()
    import mooncake.store  # deferred: optional dependency (minimax-lab[store])
    c = mooncake.store.MooncakeDistributedStore()
    rc = c.setup(mc.HOST, server.metadata_url, 0, 256 << 20, "tcp", "", server.master_address)
    if rc != 0:
        raise RuntimeError(f"could not join the pool (setup returned {rc})")
    return c


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
            if rc != 0 or len(got) != size:
                raise RuntimeError(f"put/get of {size} bytes failed ({rc}, {len(got)})")
            lat_put.append(t1 - t0)
            lat_get.append(t2 - t1)
        n = max(1, min(256, batch_bytes // size))
        bw_put, bw_get = [], []
        for i in range(repeats):
            keys = [f"bw-{size}-{i}-{j}" for j in range(n)]
            t0 = time.perf_counter()
            rc = c.put_batch(keys, [val] * n)
            t1 = time.perf_counter()
            got = c.get_batch(keys)
            t2 = time.perf_counter()
            if rc != 0 or any(len(g) != size for g in got):
                raise RuntimeError(f"batch put/get of {n} x {size} bytes failed ({rc})")
            bw_put.append(n * size / (t1 - t0) / 1e9)
            bw_get.append(n * size / (t2 - t1) / 1e9)
            c.batch_remove(keys, True)
        rows.append(dict(block_bytes=size, put_ms=statistics.median(lat_put) * 1e3,
                         get_ms=statistics.median(lat_get) * 1e3, batch=n,
                         put_gbps=statistics.median(bw_put), get_gbps=statistics.median(bw_get)))
    c.close()                                  # before the master goes: a quick unmount
    return rows


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


def typical_get_gbps(rows: list[dict], min_bytes: int = 64 << 10) -> float:
    """The median batched get rate over values of at least ``min_bytes`` (all values if none is)."""
    big = [r["get_gbps"] for r in rows if r["block_bytes"] >= min_bytes] or [r["get_gbps"] for r in rows]
    return statistics.median(big)


def fetch_vs_recompute(rows: list[dict], *, cpu_tflops: float, contexts=(1024, 32768, 131072)) -> list[dict]:
    """``break_even`` at the typical measured get rate (``typical_get_gbps``): the tiny model at
    ``cpu_tflops`` (mfu 1, a measured rate) and the M3-shaped layer on a modelled H200 (989
    TFLOP/s bf16, mfu 0.5)."""
    link = typical_get_gbps(rows)
    out = []
    for ctx in contexts:
        tiny = replace(tiny_model_shape(), dtype_bytes=4)          # its CPU cache is fp32
        out.append(break_even(tiny, link_gbps=link, gpu_tflops=cpu_tflops, context=ctx, mfu=1.0))
        out.append(break_even(M3_LAYER, link_gbps=link, gpu_tflops=H200_BF16_TFLOPS, context=ctx, mfu=0.5))
    for r in out:
        r["link_gbps"] = link
    return out


#: the suite's case groups: ``loopback`` (put/get against value size) and ``break_even``
CASES = ("loopback", "break_even")


def run(preset: str = "auto", cases=None, sink=None) -> list[dict]:
    """Bench records: ``loopback`` -- ``put_<size>`` / ``get_<size>`` (batched; the one-value
    latency in ``extra``); ``break_even`` -- ``break_even_<model>_<context>`` with the verdict in
    ``extra``. Where the store cannot start it says why (stderr) and returns no records."""
    chosen = measure.select_cases(cases, CASES)
    try:
        rows = store_rows()
    except mc.StoreUnavailable as e:
        print(f"suite kvstore: {e}", file=sys.stderr)
        return []
    recs = []
    if "loopback" in chosen:
        for r in rows:
            for op in ("put", "get"):
                ms = r["block_bytes"] * r["batch"] / (r[f"{op}_gbps"] * 1e9) * 1e3
                recs.append(measure.make_record(SUITE, f"{op}_{r['block_bytes']}", "mooncake_tcp_loopback", ms,
                                                shape=dict(block_bytes=r["block_bytes"], batch=r["batch"]),
                                                dtype="uint8", bytes_moved=r["block_bytes"] * r["batch"],
                                                extra=dict(latency_ms=r[f"{op}_ms"])))
                if sink is not None:
                    sink(recs[-1])
    if "break_even" in chosen:
        for b in fetch_vs_recompute(rows, cpu_tflops=cpu_prefill_tflops()):
            slug = b["model"].split(" ")[0].replace("-", "_").lower()
            recs.append(measure.make_record(SUITE, f"break_even_{slug}_{b['context']}", "cost.break_even",
                                            b["t_fetch_s"] * 1e3, shape=dict(context=b["context"]),
                                            extra={k: v for k, v in b.items() if k != "model"} | dict(
                                              model=b["model"], note=MODELLED)))
            if sink is not None:
                sink(recs[-1])
    return recs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Mooncake Store put/get over loopback against block size.")
    p.add_argument("--out", default="results/kvstore_bandwidth.json")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    try:
        rows = store_rows(repeats=a.repeats)
    except (mc.StoreUnavailable, RuntimeError) as e:
        print(f"suite_kvstore: {e}", file=sys.stderr)
        return 2
    cpu = cpu_prefill_tflops()
    doc = dict(machine="CPU machine (2 cores), TCP over 127.0.0.1", rows=rows, cpu_prefill_tflops=cpu,
               link="typical_get_gbps: median batched get of values >= 64 KiB",
               gpu="modelled, not measured: an H200 at 50% of 989 TFLOP/s bf16",
               break_even=fetch_vs_recompute(rows, cpu_tflops=cpu))
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    for r in rows:
        print(f"{r['block_bytes']:>9} B  put {r['put_ms']:7.3f} ms {r['put_gbps']:6.2f} GB/s   "
              f"get {r['get_ms']:7.3f} ms {r['get_gbps']:6.2f} GB/s   (batch {r['batch']})")
    for b in doc["break_even"]:
        print(f"{b['model']:<28} ctx {b['context']:>7}: fetch {'wins' if b['fetch_wins'] else 'loses'} "
              f"(recompute/fetch = {b['ratio']:.2f}, break-even {b['break_even_gbps']:.3f} GB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
