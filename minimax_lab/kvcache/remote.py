"""The remote tier: KV blocks in a shared pool on Mooncake Store, below GPU, host and disk.

A block's name (``blocks.page_hash``: a chained content hash of every token up to the end of the
page) is already a global content address: two engines that computed the same prefix with the
same weights hold the same bytes under the same name. The pool key adds the *format* -- the
model, the dtype and the block shape -- so blocks of another model or layout are never found::

    key = "mmlkv-<format: blake2b-64 of model, dtype, shape>-<name hex>"

A value is the disk tier's self-describing payload (``block_file.encode_block``: magic, a header
naming the block, model, dtype and shape, the payload, a blake2b checksum). A value that does not
decode to exactly that block -- corrupted, truncated, another block's bytes under this key -- is
a **miss**: counted in ``stats.rejected``, removed from the pool, never served.

**Calls.** ``put_many``, ``get_many`` and ``prefix`` are batched (one call to the store each,
split so a batch fits the client's buffer). Every call runs on a worker thread and waits at most
``timeout_s``; a call that fails or times out counts in ``stats``, returns what a miss returns and
opens the *circuit*: for ``retry_s`` seconds calls return a miss at once (``stats.skipped``)
instead of waiting again; then one call is let through to probe. A stuck call leaves its thread
behind (the next call gets a fresh one); the client's own RPC timeout (``store.CLIENT_ENV``) ends it.

**Leases.** The master refuses to remove a value for a lease after it was read; the only removal
here is of a rejected value, which uses ``force=True``.

**When the store cannot start** -- its client or system libraries missing, the master down at
setup -- the tier is *disabled*: it says why once (a ``RuntimeWarning``), every call is a miss and
the cache above it keeps working. ``RemoteTier.reason`` holds the sentence.

A value put under a key that exists is not replaced (Mooncake keeps the first value), which is
what content addressing wants: both writers computed the same bytes.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import torch

from minimax_lab.kvcache import store as mc
from minimax_lab.kvcache.block_file import _dtype_name, decode_block, encode_block

KEY_PREFIX = "mmlkv"
_SAID: set = set()


def say_once(reason: str) -> None:
    """Warn with ``reason`` once per process (later calls with the same sentence are silent)."""
    if reason not in _SAID:
        _SAID.add(reason)
        warnings.warn(reason, RuntimeWarning, stacklevel=3)


def block_format(model: str, dtype: torch.dtype, block_shape) -> str:
    """16 hex digits naming a block format: the model, the dtype and the block shape."""
    fmt = json.dumps([model, _dtype_name(dtype), [int(d) for d in block_shape]])
    return hashlib.blake2b(fmt.encode(), digest_size=8).hexdigest()


@dataclass
class RemoteStats:
    puts: int = 0            # blocks put
    put_errors: int = 0      # blocks whose put failed (not in the pool)
    gets: int = 0            # blocks asked for
    hits: int = 0            # blocks served (verified)
    misses: int = 0          # blocks not in the pool, or not served because a call failed
    rejected: int = 0        # values that failed verification (removed, never served)
    errors: int = 0          # calls that returned an error
    timeouts: int = 0        # calls that did not answer within timeout_s
    skipped: int = 0         # calls not made because the circuit was open


class RemoteTier:
    """Blocks of one format in a Mooncake Store pool (see the module docstring).

    ``master``/``metadata`` are the addresses a ``store.StoreServer`` gives
    (``master_address``, ``metadata_url``), ``netns`` its network namespace (``server.netns``). ``model`` names the weights, ``dtype`` and
    ``block_shape`` the block (``KVPages.block_shape``). ``client`` replaces the Mooncake client
    (any object with ``put_batch``, ``get_batch``, ``batch_is_exist`` and ``remove`` behaving as
    Mooncake's). Raises ``TypeError``/``ValueError`` for bad arguments, never for the store.
    """

    def __init__(self, master: str | None, metadata: str | None, *, model: str, dtype: torch.dtype, block_shape,
                 timeout_s: float = 2.0, retry_s: float = 1.0, buffer_bytes: int = 32 << 20, client=None,
                 netns: str | None = None):
        if not isinstance(model, str) or not model:
            raise TypeError(f"model must be a non-empty string naming the weights, got {model!r}")
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
        for name, v in (("timeout_s", timeout_s), ("retry_s", retry_s)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {v!r}")
        self.model, self.dtype, self.block_shape = model, dtype, tuple(int(d) for d in block_shape)
        self.format = block_format(model, dtype, self.block_shape)
        self.timeout_s, self.retry_s, self.buffer_bytes = float(timeout_s), float(retry_s), int(buffer_bytes)
        self.stats = RemoteStats()
        self.reason: str | None = None
        self._lock = threading.Lock()
        self._open_until = 0.0
        self.netns = netns
        self._pool = self._executor()
        self.client = client if client is not None else self._connect(master, metadata)

    def _executor(self) -> ThreadPoolExecutor:
        """The worker thread every call runs on (inside the store's network namespace, if any)."""
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-remote", initializer=mc.join_netns,
                                  initargs=(self.netns,))

    def raw(self, method: str, *args):
        """``client.<method>(*args)`` on the worker thread, bounded like every call (None on failure):
        for fault injection and inspection (``get``, ``upsert``, ``is_exist``)."""
        return self._call(getattr(self.client, method), *args, fallback=None)

    @classmethod
    def for_pages(cls, kv, master, metadata, *, model: str, **kw) -> "RemoteTier":
        """A remote tier for the blocks of ``kv`` (a ``blocks.KVPages``)."""
        return cls(master, metadata, model=model, dtype=kv.k.dtype, block_shape=kv.block_shape, **kw)

    def _connect(self, master, metadata):
        reason = mc.store_unavailable()
        if reason is None and (not master or not metadata):
            reason = "Mooncake Store: no master address given"
        if reason is None:
            import mooncake.store  # deferred: optional dependency (minimax-lab[store]), checked just above
            client = mooncake.store.MooncakeDistributedStore()
            rc = self._call(client.setup, mc.HOST, metadata, 0, self.buffer_bytes, "tcp", "", master,
                            fallback=None, timeout_s=max(self.timeout_s, 10.0))
            if rc == 0:
                return client
            reason = f"Mooncake Store: could not join the pool at {master} (setup returned {rc!r})"
        self.disable(reason + "; the KV cache keeps working without the remote tier")
        return None

    def disable(self, reason: str) -> None:
        """Turn the tier off for good: every call is a miss from now on; says ``reason`` once."""
        self.reason = reason
        say_once(reason)

    @property
    def enabled(self) -> bool:
        return self.reason is None and self.client is not None

    def key(self, name: bytes) -> str:
        if not isinstance(name, bytes):
            raise TypeError(f"a block name must be bytes (blocks.page_hash), got {type(name).__name__}")
        return f"{KEY_PREFIX}-{self.format}-{name.hex()}"

    # ---- bounded calls -----------------------------------------------------------------------
    def _call(self, fn, *args, fallback, timeout_s: float | None = None):
        """``fn(*args)`` on the worker thread within the timeout, else ``fallback`` (module docstring)."""
        now = time.monotonic()
        with self._lock:
            if now < self._open_until:
                self.stats.skipped += 1
                return fallback
            try:
                fut = self._pool.submit(fn, *args)
            except RuntimeError:                     # closed: every call is a miss
                self.stats.skipped += 1
                return fallback
        try:
            return fut.result(timeout=timeout_s or self.timeout_s)
        except FutureTimeout:
            with self._lock:
                self.stats.timeouts += 1
                self._open_until = time.monotonic() + self.retry_s
                self._pool.shutdown(wait=False)          # the stuck call keeps its thread; the next gets a new one
                self._pool = self._executor()
            return fallback
        except Exception:
            self._failed()
            return fallback

    def _failed(self) -> None:
        with self._lock:
            self.stats.errors += 1
            self._open_until = time.monotonic() + self.retry_s

    def _batches(self, sizes: list[int]):
        """Index ranges whose values fit half the client's buffer (at least one value each)."""
        start, total = 0, 0
        for i, n in enumerate(sizes):
            if i > start and total + n > self.buffer_bytes // 2:
                yield start, i
                start, total = i, 0
            total += n
        if start < len(sizes):
            yield start, len(sizes)

    # ---- the tier ----------------------------------------------------------------------------
    def _check_block(self, kv) -> None:
        if not isinstance(kv, torch.Tensor) or kv.dtype != self.dtype or tuple(kv.shape) != self.block_shape:
            got = f"{kv.dtype} {list(kv.shape)}" if isinstance(kv, torch.Tensor) else type(kv).__name__
            raise ValueError(f"this tier holds {_dtype_name(self.dtype)} blocks of shape {list(self.block_shape)}, "
                             f"got {got}")

    def put_many(self, names, blocks) -> int:
        """Put each block under its name (batched); returns how many are in the pool now (put, or
        already there). Raises ``ValueError`` for a block of another format or unequal lengths."""
        names, blocks = list(names), list(blocks)
        if len(names) != len(blocks):
            raise ValueError(f"{len(names)} names for {len(blocks)} blocks")
        for b in blocks:
            self._check_block(b)
        keys = [self.key(n) for n in names]
        if not keys or not self.enabled:
            return 0
        values = [encode_block(n, b, model=self.model) for n, b in zip(names, blocks)]
        stored = 0
        for lo, hi in self._batches([len(v) for v in values]):
            rc = self._call(self.client.put_batch, keys[lo:hi], values[lo:hi], fallback=None)
            if rc == 0:
                stored += hi - lo
                self.stats.puts += hi - lo
            else:
                self.stats.put_errors += hi - lo
                if rc is not None:
                    self._failed()
        return stored

    def get_many(self, names) -> list[torch.Tensor | None]:
        """The verified block of each name, or None (a miss: absent, rejected, or the store failed)."""
        names = list(names)
        keys = [self.key(n) for n in names]
        self.stats.gets += len(keys)
        out: list[torch.Tensor | None] = [None] * len(keys)
        if not keys or not self.enabled:
            self.stats.misses += len(keys)
            return out
        size = len(encode_block(names[0], torch.empty(self.block_shape, dtype=self.dtype), model=self.model))
        for lo, hi in self._batches([size] * len(keys)):
            vals = self._call(self.client.get_batch, keys[lo:hi], fallback=None)
            if not isinstance(vals, list) or len(vals) != hi - lo:
                continue
            for i, v in zip(range(lo, hi), vals):
                if not v:
                    continue
                t = decode_block(v, names[i], self.model, self.dtype, self.block_shape)
                if t is None:
                    self.stats.rejected += 1
                    self._call(self.client.remove, keys[i], True, fallback=None)
                out[i] = t
        hits = sum(t is not None for t in out)
        self.stats.hits += hits
        self.stats.misses += len(keys) - hits
        return out

    def prefix(self, names) -> int:
        """How many leading names the pool holds (one ``batch_is_exist``; 0 when the store fails)."""
        keys = [self.key(n) for n in names]
        if not keys or not self.enabled:
            return 0
        found = self._call(self.client.batch_is_exist, keys, fallback=None)
        if not isinstance(found, list):
            return 0
        n = 0
        for f in found:
            if f != 1:
                if f not in (0, 1):
                    self._failed()
                break
            n += 1
        return n

    def get_prefix(self, names) -> list[torch.Tensor]:
        """The verified blocks of the longest prefix of ``names`` the pool can serve."""
        names = list(names)
        n = self.prefix(names)
        out = []
        for t in self.get_many(names[:n]):
            if t is None:
                break
            out.append(t)
        return out

    def close(self) -> None:
        """Stop the worker thread (the client is left to the process's exit)."""
        self._pool.shutdown(wait=False)
