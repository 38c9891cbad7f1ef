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

Disk entries are files in the format of :mod:`.block_file`, written atomically, so concurrent
writers, threads or processes, never tear a file, and a reader sees a whole file or none. Every
read is verified: wrong magic, a header naming another block or format, a header that does
not describe its payload (sizes, dtype, shape), a wrong length (truncated) or a checksum mismatch
(corrupt) is a **miss** -- counted in ``stats.rejected_files``, the file dropped, never served. An
unreadable file is a miss too (``stats.read_errors``).

**Faults.** A failed disk write -- disk full, directory removed, permission denied -- drops that
block: it is counted in ``stats.write_errors``, its temporary file is removed, and ``spill`` does not
raise (the tier is a cache: the caller recomputes on a miss). A removed directory is created again
on the next write. What the tiers promise, then: a ``fetch`` returns exactly the bytes spilled
under that name in that format, or ``None``. Prefix identity is the name's job (128-bit chained
hash; the GPU pool verifies the tokens, ``blocks``), not the tier's.

Fetch or recompute? Fetching a block costs its bytes over the link; recomputing costs its prefill
FLOPs: :mod:`.cost` prices both.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from minimax_lab.kvcache.block_file import _check_name, _dtype_name, decode_block, write_block_file
from minimax_lab.validate import check_positive_int


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
