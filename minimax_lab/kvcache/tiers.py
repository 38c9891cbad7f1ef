"""Tiers -- the KV cache as a file system: GPU pages -> pinned host memory -> files on disk.

A block (one page of every layer: K and V ``[n_layers, page_size, Hkv, D]``) is named by its
chained content hash (``blocks.page_hash``). When the GPU pool evicts a named page,
``TieredStore.spill`` keeps a copy in a host tier (pinned memory when a GPU is present, LRU,
``host_blocks`` capacity); blocks falling out of the host tier are written to disk. A lookup
that misses on the GPU asks ``fetch(name)``: host first, then disk. ``prefetch(names)`` starts
the disk reads on a background thread, so they overlap with compute; ``fetch`` then waits on them.

Disk entries are written **atomically** (write ``name.tmp``, fsync, ``os.replace``) as::

    MAGIC(8) | header_len(4) | header JSON {hash, dtype, shape, nbytes} | payload | blake2b-32 checksum

and verified on read: wrong magic, a header naming another block, a wrong size (truncated) or a
checksum mismatch (corrupt) is a **miss** -- logged in ``stats`` and never served. The caller then
recomputes, so results stay correct.

Fetch or recompute? Fetching a block costs its bytes over the host link; recomputing costs its
prefill FLOPs. ``break_even`` compares bytes/token over the measured bandwidth with
FLOPs/token over the GPU's rate (see the function).
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

MAGIC = b"MMLKVv01"


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def write_block_file(path: Path, name: bytes, kv: torch.Tensor) -> None:
    """Write ``kv`` (any tensor) atomically with header and checksum; see the module docstring."""
    kv = kv.detach().contiguous().cpu()
    payload = kv.view(torch.uint8).numpy().tobytes() if kv.numel() else b""
    header = json.dumps(dict(hash=name.hex(), dtype=_dtype_name(kv.dtype), shape=list(kv.shape),
                             nbytes=len(payload))).encode()
    digest = hashlib.blake2b(header + payload, digest_size=32).digest()
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(MAGIC + struct.pack("<I", len(header)) + header + payload + digest)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_block_file(path: Path, name: bytes) -> torch.Tensor | None:
    """The tensor stored for ``name`` at ``path``, or None if the file is missing, foreign, truncated or corrupt."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    if len(data) < 12 + 32 or data[:8] != MAGIC:
        return None
    (hlen,) = struct.unpack("<I", data[8:12])
    try:
        header = json.loads(data[12:12 + hlen])
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(header, dict) or header.get("hash") != name.hex():
        return None                                          # a file for another block
    nbytes = header.get("nbytes", -1)
    body_end = 12 + hlen + nbytes
    if nbytes < 0 or len(data) != body_end + 32:
        return None                                          # truncated (or padded)
    if hashlib.blake2b(data[12:body_end], digest_size=32).digest() != data[body_end:]:
        return None                                          # corrupt
    dtype = getattr(torch, header["dtype"], None)
    if not isinstance(dtype, torch.dtype):
        return None
    raw = torch.frombuffer(bytearray(data[12 + hlen:body_end]), dtype=torch.uint8)
    return raw.view(dtype).reshape(header["shape"]).clone()


@dataclass
class TierStats:
    host_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    rejected_files: int = 0
    spills_host: int = 0
    spills_disk: int = 0


class TieredStore:
    """Host (``host_blocks`` capacity, LRU) and disk (``disk_dir``, unbounded) tiers below the GPU pool.

    ``spill(name, kv)`` stores a block evicted from the GPU; ``fetch(name)`` returns its tensor (on
    the CPU) or None; ``prefetch(names)`` starts background disk reads. Thread-safe.
    """

    def __init__(self, host_blocks: int, disk_dir: str | os.PathLike | None = None, *, pin_memory: bool | None = None):
        self.host_blocks = host_blocks
        self.disk_dir = Path(disk_dir) if disk_dir is not None else None
        if self.disk_dir is not None:
            self.disk_dir.mkdir(parents=True, exist_ok=True)
        self.pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.host: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.stats = TierStats()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kv-fetch")
        self._inflight: dict[bytes, Future] = {}

    def path_for(self, name: bytes) -> Path:
        if self.disk_dir is None:
            raise ValueError("this store has no disk tier")
        return self.disk_dir / f"{name.hex()}.kv"

    def spill(self, name: bytes, kv: torch.Tensor) -> None:
        host = kv.detach().to("cpu", copy=True)
        if self.pin:
            host = host.pin_memory()
        with self._lock:
            self.host[name] = host
            self.host.move_to_end(name)
            self.stats.spills_host += 1
            over = []
            while len(self.host) > self.host_blocks:
                over.append(self.host.popitem(last=False))
        for n, t in over:
            if self.disk_dir is not None:
                write_block_file(self.path_for(n), n, t)
                self.stats.spills_disk += 1

    def _read_disk(self, name: bytes) -> torch.Tensor | None:
        if self.disk_dir is None:
            return None
        p = self.path_for(name)
        if not p.exists():
            return None
        t = read_block_file(p, name)
        if t is None:
            with self._lock:
                self.stats.rejected_files += 1
            try:
                p.unlink()                   # a bad file is dropped, never served
            except OSError:
                pass
        return t

    def prefetch(self, names) -> None:
        """Start reading these blocks from disk in the background (no-op for host-resident ones)."""
        for n in names:
            with self._lock:
                if n in self.host or n in self._inflight:
                    continue
                self._inflight[n] = self._pool.submit(self._read_disk, n)

    def fetch(self, name: bytes) -> torch.Tensor | None:
        """The block's tensor from host or disk (waiting on a prefetch if one runs), else None."""
        with self._lock:
            t = self.host.get(name)
            if t is not None:
                self.host.move_to_end(name)
                self.stats.host_hits += 1
                return t
            fut = self._inflight.pop(name, None)
        t = fut.result() if fut is not None else self._read_disk(name)
        with self._lock:
            if t is None:
                self.stats.misses += 1
            else:
                self.stats.disk_hits += 1
        return t

    def close(self) -> None:
        self._pool.shutdown(wait=True)


# ---- bandwidth and break-even -------------------------------------------------------------------

def measure_host_device_bandwidth(nbytes: int = 256 * 2**20, *, repeats: int = 10, device="cuda") -> dict:
    """Median GB/s of host->device and device->host copies, pinned and pageable host memory.

    Uses CUDA events around ``copy_`` with ``non_blocking`` for pinned buffers; returns
    ``{"h2d_pinned": GB/s, "d2h_pinned": ..., "h2d_pageable": ..., "d2h_pageable": ...}``.
    Raises ``RuntimeError`` without a GPU.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("measuring host<->device bandwidth needs a CUDA GPU")
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out = {}
    for kind in ("pinned", "pageable"):
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=(kind == "pinned"))
        for direction in ("h2d", "d2h"):
            times = []
            for i in range(repeats + 2):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                if direction == "h2d":
                    dev.copy_(host, non_blocking=(kind == "pinned"))
                else:
                    host.copy_(dev, non_blocking=(kind == "pinned"))
                e.record()
                e.synchronize()
                if i >= 2:
                    times.append(s.elapsed_time(e) / 1e3)
            times.sort()
            out[f"{direction}_{kind}"] = nbytes / times[len(times) // 2] / 1e9
    return out


@dataclass
class LayerShape:
    """What one token costs a model: KV bytes it leaves behind and prefill FLOPs to make them."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_flops_per_token: float        # per layer (active experts only for MoE)
    dtype_bytes: int = 2
    source: str = ""

    def kv_bytes_per_token(self) -> float:
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.dtype_bytes

    def prefill_flops_per_token(self, context: int) -> float:
        """Projections + attention over ``context`` earlier tokens (causal average ~context/2
        would be the mean over a prompt; we charge the token at position ``context``) + FFN."""
        d, H, G, D = self.d_model, self.n_heads, self.n_kv_heads, self.head_dim
        proj = 2 * d * (H * D + 2 * G * D) + 2 * H * D * d
        attn = 2 * 2 * H * D * context
        return self.n_layers * (proj + attn + self.ffn_flops_per_token)


def tiny_model_shape(cfg=None, preset: str = "auto") -> LayerShape:
    """The workbook's tiny model (``minimax_lab.model.preset_config(preset)``), dense SwiGLU FFN."""
    if cfg is None:
        from minimax_lab.model import preset_config
        cfg = preset_config(preset)
    return LayerShape(f"tiny (d={cfg.d_model}, {cfg.n_layers} layers)", cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                      ffn_flops_per_token=2 * 3 * cfg.d_model * cfg.d_ff, dtype_bytes=2,
                      source="minimax_lab.model.config.preset_config")


# MiniMax-M2 (config.json of https://huggingface.co/MiniMaxAI/MiniMax-M2): hidden_size 3072,
# num_hidden_layers 62, num_attention_heads 48, num_key_value_heads 8, head_dim 128,
# 256 local experts with intermediate_size 1536, num_experts_per_tok 8. Full attention in every layer.
MINIMAX_M2 = LayerShape("MiniMax-M2", n_layers=62, d_model=3072, n_heads=48, n_kv_heads=8, head_dim=128,
                        ffn_flops_per_token=8 * 2 * 3 * 3072 * 1536, dtype_bytes=2,
                        source="huggingface.co/MiniMaxAI/MiniMax-M2 config.json")


def break_even(shape: LayerShape, *, link_gbps: float, gpu_tflops: float, context: int = 32_768,
               mfu: float = 0.5) -> dict:
    """Seconds per token to fetch its KV over a ``link_gbps`` link vs to recompute it at ``mfu`` of
    ``gpu_tflops``. ``fetch_wins`` when fetching is faster; ``ratio`` = recompute time / fetch time.
    Also the link bandwidth at which the two are equal (``break_even_gbps``)."""
    b = shape.kv_bytes_per_token()
    f = shape.prefill_flops_per_token(context)
    t_fetch = b / (link_gbps * 1e9)
    t_comp = f / (gpu_tflops * 1e12 * mfu)
    return dict(model=shape.name, kv_bytes_per_token=b, prefill_flops_per_token=f, t_fetch_s=t_fetch,
                t_recompute_s=t_comp, ratio=t_comp / t_fetch, fetch_wins=t_fetch < t_comp,
                break_even_gbps=b / t_comp / 1e9, context=context)
