"""Tiers -- the KV cache as a file system: GPU pages -> pinned host memory -> files on disk -> a shared pool.

A block (one page of every layer: K and V ``[2, n_layers, page_size, Hkv, D]``, see
``KVPages.page_block``) is named by its chained content hash (``blocks.page_hash``). When the GPU
pool evicts a named page, ``TieredStore.spill`` keeps a copy in a host tier (pinned memory when a
GPU is present, LRU, ``host_blocks`` capacity); blocks falling out of the host tier are written to
disk. A lookup that misses on the GPU asks ``fetch(name)``: host first, then disk, then the remote
pool (``remote``: a ``kvcache.remote.RemoteTier`` on Mooncake Store, shared by every replica);
``fetch_prefix(names)`` walks a whole prefix that way, batching the remote part, and
``publish(names, blocks)`` puts freshly computed blocks into the pool for the other replicas.
``prefetch(names)`` starts the disk reads on a background thread, so they overlap with compute;
``fetch`` then waits on them.

**Whose block is it?** A name hashes only tokens, so a disk tier is opened for one *block
format*: ``model`` (a string naming the weights -- two models, or two checkpoints, must use two
names), ``dtype`` and ``block_shape`` (layers, page size, KV heads, head dim). File names and
headers include all three, so stores of different formats can share a directory and never see
each other's blocks; a block of another dtype or shape is refused at ``spill``.

Disk entries are written **atomically** -- a temporary file with a name no other writer uses
(process id, thread id, random suffix), fsync, ``os.replace`` -- so concurrent writers, threads or
processes, never tear a file, and a reader sees a whole file or none. The format::

    MAGIC(8) | header_len(4) | header JSON {model, hash, dtype, shape, nbytes} | payload | blake2b-32 checksum

Every read is verified: wrong magic, a header naming another block or format, a header that does
not describe its payload (sizes, dtype, shape), a wrong length (truncated) or a checksum mismatch
(corrupt) is a **miss** -- counted in ``stats.rejected_files``, the file dropped, never served. An
unreadable file is a miss too (``stats.read_errors``).

**Faults.** A failed disk write -- disk full, directory removed, permission denied -- drops that
block: it is counted in ``stats.write_errors``, its temporary file is removed, and ``spill`` does not
raise (the tier is a cache: the caller recomputes on a miss). A removed directory is created again
on the next write. What the tiers promise, then: a ``fetch`` returns exactly the bytes spilled
under that name in that format, or ``None``. Prefix identity is the name's job (128-bit chained
hash; the GPU pool verifies the tokens, ``blocks``), not the tier's.

Fetch or recompute? Fetching a block costs its bytes over the host link; recomputing costs its
prefill FLOPs. ``break_even`` compares bytes/token over the measured bandwidth with
FLOPs/token over the GPU's rate (see the function).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import struct
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from minimax_lab.model.config import preset_config
from minimax_lab.validate import check_positive_int

MAGIC = b"MMLKVv02"
_CHECKSUM = 32


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def _check_name(name) -> bytes:
    if not isinstance(name, bytes):
        raise TypeError(f"a block name must be bytes (blocks.page_hash), got {type(name).__name__}")
    return name


def encode_block(name: bytes, kv: torch.Tensor, *, model: str = "") -> bytes:
    """The self-describing bytes of block ``name`` of ``model`` (the format of the module docstring):
    what a disk file holds and what the remote tier (``kvcache.remote``) puts in the pool."""
    kv = kv.detach().contiguous().cpu()
    payload = kv.view(torch.uint8).numpy().tobytes() if kv.numel() else b""
    header = json.dumps(dict(model=model, hash=_check_name(name).hex(), dtype=_dtype_name(kv.dtype),
                             shape=list(kv.shape), nbytes=len(payload))).encode()
    digest = hashlib.blake2b(header + payload, digest_size=_CHECKSUM).digest()
    return MAGIC + struct.pack("<I", len(header)) + header + payload + digest


def write_block_file(path: Path, name: bytes, kv: torch.Tensor, *, model: str = "") -> None:
    """Write ``kv`` (any tensor) for block ``name`` of ``model`` atomically, with header and checksum
    (see the module docstring). Raises ``OSError`` when the write fails; the temporary file is then
    removed and an earlier file at ``path`` is left as it was."""
    path = Path(path)
    data = encode_block(name, kv, model=model)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:          # "x": never reuse another writer's temporary file
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def decode_block(data: bytes, name: bytes, model: str, dtype: torch.dtype | None = None,
                 shape: tuple | None = None) -> torch.Tensor | None:
    """The tensor in a block's bytes (``encode_block``), or None unless every check of the module
    docstring passes: it names block ``name`` of ``model`` (and ``dtype``/``shape`` when given),
    its header describes its payload and its checksum matches. Never raises for the bytes."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return None
    data = bytes(data)
    if len(data) < 12 + _CHECKSUM or data[:8] != MAGIC:
        return None
    (hlen,) = struct.unpack("<I", data[8:12])
    if 12 + hlen + _CHECKSUM > len(data):
        return None
    body_end = len(data) - _CHECKSUM
    if hashlib.blake2b(data[12:body_end], digest_size=_CHECKSUM).digest() != data[body_end:]:
        return None                                          # corrupt or truncated
    try:
        header = json.loads(data[12:12 + hlen])
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(header, dict) or header.get("hash") != name.hex() or header.get("model") != model:
        return None                                          # a file for another block or model
    dt = getattr(torch, header.get("dtype"), None) if isinstance(header.get("dtype"), str) else None
    shp, nbytes = header.get("shape"), header.get("nbytes")
    if not isinstance(dt, torch.dtype) or not isinstance(shp, list) or \
            not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shp) or \
            not isinstance(nbytes, int) or isinstance(nbytes, bool):
        return None                                          # a header that does not parse as a block
    if dtype is not None and dt != dtype or shape is not None and tuple(shp) != tuple(shape):
        return None                                          # another format
    try:
        itemsize = torch.empty((), dtype=dt).element_size()
    except (RuntimeError, TypeError):
        return None
    if nbytes != math.prod(shp) * itemsize or 12 + hlen + nbytes != body_end:
        return None                                          # the header lies about its payload
    try:
        raw = torch.frombuffer(bytearray(data[12 + hlen:body_end]), dtype=torch.uint8) if nbytes else \
            torch.empty(0, dtype=torch.uint8)
        return raw.view(dt).reshape(shp).clone()
    except (RuntimeError, TypeError, ValueError):
        return None


def read_block_file(path: Path, name: bytes, *, model: str = "", dtype: torch.dtype | None = None,
                    shape=None) -> torch.Tensor | None:
    """The tensor stored for block ``name`` of ``model`` at ``path`` (of ``dtype``/``shape`` when
    given), or None if the file is missing, unreadable, foreign, truncated, corrupt or lies in its
    header. Never raises for a file's contents."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return decode_block(data, _check_name(name), model, dtype, shape)


@dataclass
class TierStats:
    host_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    rejected_files: int = 0          # files that failed verification (dropped)
    read_errors: int = 0             # files that could not be read (left alone)
    write_errors: int = 0            # blocks dropped because their disk write failed
    spills_host: int = 0
    spills_disk: int = 0
    remote_hits: int = 0             # blocks served by the remote pool


class TieredStore:
    """Host (``host_blocks`` capacity, LRU) and disk (``disk_dir``, unbounded) tiers below the GPU pool.

    ``spill(name, kv)`` stores a block evicted from the GPU (a copy: later changes to ``kv`` do not
    reach the store); ``fetch(name)`` returns its tensor (on the CPU; shared with the host tier,
    so copy it, don't modify it) or None; ``prefetch(names)`` starts background disk reads.
    Safe to call from several threads; several processes may share ``disk_dir``.

    A disk tier needs ``model`` (a non-empty string naming the weights); ``dtype`` and
    ``block_shape``, when given (always, for a disk tier shared across runs), fix the block format:
    ``spill`` raises ``ValueError`` for another. ``for_pages`` fills them in from a ``KVPages`` pool.
    Raises ``TypeError``/``ValueError`` for a bad argument; disk faults never raise (see the module
    docstring).
    """

    def __init__(self, host_blocks: int, disk_dir: str | os.PathLike | None = None, *, model: str | None = None,
                 dtype: torch.dtype | None = None, block_shape=None, pin_memory: bool | None = None,
                 remote=None):
        self.host_blocks = check_positive_int(host_blocks, "host_blocks", minimum=0)
        if model is not None and (not isinstance(model, str) or not model):
            raise TypeError(f"model must be a non-empty string naming the weights, got {model!r}")
        if disk_dir is not None and model is None:
            raise ValueError("a disk tier needs model=... (a string naming the weights its blocks come from), "
                             "so that blocks of another model sharing the directory are never served")
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
        if block_shape is not None:
            block_shape = tuple(check_positive_int(d, "block_shape entries") for d in block_shape)
        self.model, self.dtype, self.block_shape = model or "", dtype, block_shape
        self.disk_dir = Path(disk_dir) if disk_dir is not None else None
        if self.disk_dir is not None:
            self.disk_dir.mkdir(parents=True, exist_ok=True)
            fmt = json.dumps([self.model, None if dtype is None else _dtype_name(dtype),
                              None if block_shape is None else list(block_shape)])
            self._format = hashlib.blake2b(fmt.encode(), digest_size=8).hexdigest()
        self.pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.host: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.stats = TierStats()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kv-fetch")
        self._inflight: dict[bytes, Future] = {}
        self._writing: dict[bytes, torch.Tensor] = {}   # blocks on their way to disk: still served
        self.remote = remote                            # a remote.RemoteTier (shared pool) or None

    @classmethod
    def for_pages(cls, kv, host_blocks: int, disk_dir=None, *, model: str | None = None,
                  pin_memory: bool | None = None, remote=None) -> "TieredStore":
        """A store for the blocks of ``kv`` (a ``blocks.KVPages``): dtype and block shape from the pool."""
        return cls(host_blocks, disk_dir, model=model, dtype=kv.k.dtype, block_shape=kv.block_shape,
                   pin_memory=pin_memory, remote=remote)

    def on_evict_hook(self, kv):
        """An ``on_evict`` hook for ``BlockManager(..., kv=kv)``: spill each evicted page's block here."""
        return lambda name, page, tokens: self.spill(name, kv.page_block(page))

    def path_for(self, name: bytes) -> Path:
        """The disk file of block ``name``: its hash and this store's format (model, dtype, shape)."""
        if self.disk_dir is None:
            raise ValueError("this store has no disk tier")
        return self.disk_dir / f"{_check_name(name).hex()}-{self._format}.kv"

    def _check_block(self, kv) -> None:
        if not isinstance(kv, torch.Tensor):
            raise TypeError(f"a block must be a torch.Tensor, got {type(kv).__name__}")
        if self.dtype is not None and kv.dtype != self.dtype:
            raise ValueError(f"this store holds {_dtype_name(self.dtype)} blocks, got {_dtype_name(kv.dtype)}")
        if self.block_shape is not None and tuple(kv.shape) != self.block_shape:
            raise ValueError(f"this store holds blocks of shape {list(self.block_shape)}, got {list(kv.shape)}")

    def spill(self, name: bytes, kv: torch.Tensor) -> None:
        """Keep a copy of block ``name``; the host tier's oldest blocks move to disk (or are dropped
        without one). Raises ``TypeError``/``ValueError`` for a bad name or block, never for a disk fault."""
        _check_name(name)
        self._check_block(kv)
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
            if self.disk_dir is not None:
                self._writing.update(over)
        for n, t in over:
            if self.disk_dir is not None:
                self._write_disk(n, t)

    def _write_disk(self, name: bytes, t: torch.Tensor) -> None:
        ok = False
        try:
            try:
                write_block_file(self.path_for(name), name, t, model=self.model)
            except FileNotFoundError:             # the directory was removed: make it again, once
                self.disk_dir.mkdir(parents=True, exist_ok=True)
                write_block_file(self.path_for(name), name, t, model=self.model)
            ok = True
        except OSError:
            pass                                  # disk full, permission denied, ...: the block is dropped
        finally:
            with self._lock:
                if self._writing.get(name) is t:
                    del self._writing[name]
                if ok:
                    self.stats.spills_disk += 1
                else:
                    self.stats.write_errors += 1

    def _read_disk(self, name: bytes) -> torch.Tensor | None:
        if self.disk_dir is None:
            return None
        p = self.path_for(name)
        try:
            with open(p, "rb") as f:
                ident = os.fstat(f.fileno())
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError:
            with self._lock:
                self.stats.read_errors += 1
            return None
        t = decode_block(data, name, self.model, self.dtype, self.block_shape)
        if t is None:
            with self._lock:
                self.stats.rejected_files += 1
            try:                                  # a bad file is dropped, never served -- unless another
                now = os.stat(p)                  # writer has just replaced it with a new one
                if (now.st_ino, now.st_dev) == (ident.st_ino, ident.st_dev):
                    p.unlink()
            except OSError:
                pass
        return t

    def prefetch(self, names) -> None:
        """Start reading these blocks from disk in the background (no-op for host-resident ones)."""
        for n in names:
            _check_name(n)
            with self._lock:
                if n in self.host or n in self._writing or n in self._inflight:
                    continue
                self._inflight[n] = self._pool.submit(self._read_disk, n)

    def fetch(self, name: bytes) -> torch.Tensor | None:
        """The block's tensor from host or disk (waiting on a prefetch if one runs), then from the
        remote pool, else None."""
        t = self._local(name)
        if t is None and self.remote is not None:
            t = self.remote.get_many([name])[0]
            if t is not None:
                with self._lock:
                    self.stats.remote_hits += 1
        if t is None:
            with self._lock:
                self.stats.misses += 1
        return t

    def fetch_prefix(self, names) -> list[torch.Tensor]:
        """The blocks of the longest prefix of ``names`` this ladder can serve: host and disk name by
        name, then the remote pool (one batched existence check and one batched get) for the rest."""
        names = list(names)
        out = []
        for n in names:
            t = self._local(n)
            if t is None:
                break
            out.append(t)
        if len(out) < len(names) and self.remote is not None:
            got = self.remote.get_prefix(names[len(out):])
            with self._lock:
                self.stats.remote_hits += len(got)
            out += got
        with self._lock:
            self.stats.misses += len(out) < len(names)
        return out

    def _local(self, name: bytes) -> torch.Tensor | None:
        """Host or disk, without counting a miss."""
        _check_name(name)
        with self._lock:
            t = self.host.get(name)
            if t is None:
                t = self._writing.get(name)
            if t is not None:
                if name in self.host:
                    self.host.move_to_end(name)
                self.stats.host_hits += 1
                return t
            fut = self._inflight.pop(name, None)
        t = fut.result() if fut is not None else self._read_disk(name)
        if t is not None:
            with self._lock:
                self.stats.disk_hits += 1
        return t

    def publish(self, names, blocks) -> int:
        """Put freshly computed blocks into the remote pool (a no-op without one); returns how many
        the pool holds now. Raises ``ValueError`` for a block of another format."""
        names, blocks = list(names), list(blocks)
        for b in blocks:
            self._check_block(b)
        return self.remote.put_many(names, blocks) if self.remote is not None and names else 0

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self.remote is not None:
            self.remote.close()


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
    sparse_tokens: int = 0            # sparse attention: tokens each query attends (0 = all, dense)
    index_dim: int = 0                # sparse attention's index branch: one query of this width per KV head

    def _attended_sum(self, start: int, end: int) -> float:
        """Sum over positions p in [start, end) of the tokens attended: p, or min(p, sparse_tokens)."""
        def tri(a, b):                # sum of p for p in [a, b)
            return (a + b - 1) * (b - a) / 2 if b > a else 0.0
        if not self.sparse_tokens:
            return tri(start, end)
        cut = min(max(start, self.sparse_tokens), end)
        return tri(start, cut) + (end - cut) * self.sparse_tokens

    def kv_bytes_per_token(self) -> float:
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.dtype_bytes

    def prefill_flops(self, start: int, end: int) -> float:
        """FLOPs to prefill tokens ``[start, end)`` after ``start`` cached ones: each token at
        position ``p`` pays ``prefill_flops_per_token(p)`` (summed in closed form)."""
        if end <= start:
            return 0.0
        n, pos_sum = end - start, (start + end - 1) * (end - start) / 2
        attn = 2 * 2 * self.n_heads * self.head_dim * self._attended_sum(start, end)
        index = 2 * self.n_kv_heads * self.index_dim * pos_sum
        return n * self.prefill_flops_per_token(0) + self.n_layers * (attn + index)

    def prefill_flops_per_token(self, context: int) -> float:
        """Projections + attention over ``context`` earlier tokens (causal average ~context/2
        would be the mean over a prompt; we charge the token at position ``context``) + FFN."""
        d, H, G, D = self.d_model, self.n_heads, self.n_kv_heads, self.head_dim
        proj = 2 * d * (H * D + 2 * G * D) + 2 * H * D * d
        attended = min(context, self.sparse_tokens) if self.sparse_tokens else context
        attn = 2 * 2 * H * D * attended + 2 * G * self.index_dim * context
        return self.n_layers * (proj + attn + self.ffn_flops_per_token)


def tiny_model_shape(cfg=None, preset: str = "auto") -> LayerShape:
    """The workbook's tiny model (``minimax_lab.model.preset_config(preset)``), dense SwiGLU FFN."""
    if cfg is None:
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


# The M3-shaped layer of ``engine.config.m3_config("gpu")``: GQA 64 query / 4 KV heads of 128,
# d_model 2048, 8 of 128 experts of width 768 (SwiGLU), MSA attending topk 16 blocks of 128
# tokens (2,048) plus its index branch (one 128-wide index query per KV group over the context).
M3_LAYER = LayerShape("M3-shaped layer", n_layers=1, d_model=2048, n_heads=64, n_kv_heads=4, head_dim=128,
                      ffn_flops_per_token=8 * 2 * 3 * 2048 * 768, dtype_bytes=2, sparse_tokens=16 * 128,
                      index_dim=128, source="minimax_lab.engine.config.m3_config('gpu')")

# LLaMA3-70B, the model of Mooncake's FAST'25 evaluation (320 KB of KV per token, their Table 1):
# 80 layers, d_model 8192, 64 query / 8 KV heads of 128, dense SwiGLU FFN of 28,672.
LLAMA3_70B = LayerShape("LLaMA3-70B", n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, head_dim=128,
                        ffn_flops_per_token=2 * 3 * 8192 * 28672, dtype_bytes=2,
                        source="huggingface.co/meta-llama/Meta-Llama-3-70B config.json")


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
