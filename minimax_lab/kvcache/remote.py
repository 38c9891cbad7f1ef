"""The remote tier: KV blocks in a shared pool on Mooncake Store, below GPU, host and disk.

A block's name (``blocks.page_hash``: a chained content hash of every token up to the end of the
page) is already a global content address: two engines that computed the same prefix with the
same weights hold the same bytes under the same name. The pool key adds the *format* -- the
model, the dtype, the block shape and how values are signed -- so blocks of another model, layout
or pool secret are never found::

    key = "mmlkv-<format: blake2b-64 of model, dtype, shape, signer>-<name hex>"

A value is a block in the layout of :mod:`.pool_value`: magic, a header naming the block, model,
dtype and shape, the payload, and a **tag**. With the pool's secret (``secret``, by default the one
``store.pool_secret`` finds for this master) the tag is keyed BLAKE3: a value forged by a writer
who can reach the pool but lacks the secret -- even with a checksum recomputed to match -- is
refused. Without a secret (``keyed`` False) the tag is an xxh3-128 checksum, which catches
accidents only: **then a writer with pool access can serve any tensor**. A value that is not exactly
this block's -- corrupted, truncated, forged, another block's bytes under this key -- is a
**miss**: counted in ``stats.rejected``, removed from the pool, never served.

**Moving the bytes.** Values are packed into (and read back from) a buffer registered with the
client once (``register_buffer``), and moved with Mooncake's zero-copy batch calls
(``batch_put_from`` / ``batch_get_into``, as Mooncake's Python API advises for throughput): Python
copies a payload once (tensor to buffer, or buffer to a new tensor) and hashes it once, in C. A
client without those calls (``client=`` a stand-in) gets bytes through ``put_batch``/``get_batch``.

**Calls.** ``put_many``, ``get_many`` and ``prefix`` are batched (one call to the store each,
split so a batch fits the buffer, ``buffer_bytes``). Every call runs on a worker thread and waits at
most ``timeout_s``; a call that fails or times out counts in ``stats``, returns what a miss returns and
opens the *circuit*: for ``retry_s`` seconds calls return a miss at once (``stats.skipped``)
instead of waiting again; then one call is let through to probe. A stuck call leaves its thread
behind (the next call gets a fresh one) and keeps its buffer: a new one is registered, so a
transfer that lands late never writes into bytes being checked. The client's own RPC timeout
(``store.CLIENT_ENV``) ends it.

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

import numpy as np
import torch

from minimax_lab.kvcache import store as mc
from minimax_lab.kvcache.block_file import _dtype_name
from minimax_lab.kvcache.pool_value import ALIGN, ValueCodec, aligned_buffer, check_secret

KEY_PREFIX = "mmlkv"
#: Mooncake's codes for a key it does not hold, and for a value longer than the buffer given for it
OBJECT_NOT_FOUND = -704
VALUE_TOO_LARGE = -600
_SAID: set = set()


def say_once(reason: str) -> None:
    """Warn with ``reason`` once per process (later calls with the same sentence are silent)."""
    if reason not in _SAID:
        _SAID.add(reason)
        warnings.warn(reason, RuntimeWarning, stacklevel=3)


def block_format(model: str, dtype: torch.dtype, block_shape, secret: bytes | None = None) -> str:
    """16 hex digits naming a block format: the model, the dtype, the block shape and the signer
    (a one-way digest of the pool secret, or "xxh3" without one)."""
    signer = hashlib.blake2b(secret, digest_size=8, person=b"mmlkv-signer").hexdigest() if secret else "xxh3"
    fmt = json.dumps([model, _dtype_name(dtype), [int(d) for d in block_shape], signer])
    return hashlib.blake2b(fmt.encode(), digest_size=8).hexdigest()


class _Buffer:
    """A registered staging buffer: values are packed here and read back here (module docstring)."""

    def __init__(self, nbytes: int):
        self.array = aligned_buffer(nbytes)
        self.ptr = self.array.ctypes.data
        self.registered = False


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
    ``block_shape`` the block (``KVPages.block_shape``). ``secret`` signs and checks values (32
    bytes; None, the default: ``store.pool_secret(master)``, the secret of a ``StoreServer`` on this
    machine, else none; False: none -- see ``keyed``). ``buffer_bytes`` is the staging buffer (a batch is split to fit it).
    ``client`` replaces the Mooncake client (any object with ``put_batch``, ``get_batch``,
    ``batch_is_exist`` and ``remove`` behaving as Mooncake's; with ``register_buffer``,
    ``batch_put_from`` and ``batch_get_into`` too, it is used without copies). Raises
    ``TypeError``/``ValueError`` for bad arguments, never for the store.
    """

    def __init__(self, master: str | None, metadata: str | None, *, model: str, dtype: torch.dtype, block_shape,
                 timeout_s: float = 2.0, retry_s: float = 1.0, buffer_bytes: int = 32 << 20, client=None,
                 netns: str | None = None, secret: bytes | None | bool = None):
        if not isinstance(model, str) or not model:
            raise TypeError(f"model must be a non-empty string naming the weights, got {model!r}")
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
        for name, v in (("timeout_s", timeout_s), ("retry_s", retry_s)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {v!r}")
        self.model, self.dtype, self.block_shape = model, dtype, tuple(int(d) for d in block_shape)
        secret = None if secret is False else check_secret(secret) if secret is not None else mc.pool_secret(master)
        self.format = block_format(model, dtype, self.block_shape, secret)
        try:
            self.codec = ValueCodec(model, dtype, self.block_shape, secret)
        except ImportError as e:            # xxhash or blake3 missing: no value could be checked
            self.codec, client = None, None
            master = metadata = None
            self._missing = f"the pool's value checks need xxhash and blake3 ({e}); {mc.INSTALL_HINT}"
        self.timeout_s, self.retry_s, self.buffer_bytes = float(timeout_s), float(retry_s), int(buffer_bytes)
        self.stats = RemoteStats()
        self.reason: str | None = None
        self._lock = threading.Lock()
        self._open_until = 0.0
        self.netns = netns
        self._pool = self._executor()
        self._io = threading.Lock()                     # one put_many/get_many at a time uses the buffer
        self._buf: _Buffer | None = None
        self._retired: list = []                        # (call, buffer) of calls that timed out and may still write
        self.client = client if client is not None else self._connect(master, metadata)
        self.zero_copy = all(hasattr(self.client, m) for m in ("register_buffer", "batch_put_from", "batch_get_into"))

    @property
    def keyed(self) -> bool:
        """Whether values are signed with the pool's secret (else checksummed only: a writer with
        pool access could then serve any tensor)."""
        return self.codec is not None and self.codec.keyed

    def value_size(self, name: bytes) -> int:
        """Bytes of block ``name``'s value in the pool."""
        return self.codec.size(name)

    def encode(self, name: bytes, kv: torch.Tensor) -> bytes:
        """Block ``name``'s value for ``kv``, as this tier would put it (for inspection and tests)."""
        self._check_block(kv)
        return self.codec.encode(name, kv)

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
        reason = getattr(self, "_missing", None) or mc.store_unavailable()
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
        """``fn(*args)`` on the worker thread within the timeout, else ``fallback`` (module docstring).
        A call that times out keeps the staging buffer (it may still write into it) until it ends:
        the next call registers a new one."""
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
                self._retired = [(f, b) for f, b in self._retired if not f.done()]
                if self._buf is not None:
                    self._retired.append((fut, self._buf))   # ... and its buffer, which it may still write
                    self._buf = None
            return fallback
        except Exception:
            self._failed()
            return fallback

    def _failed(self) -> None:
        with self._lock:
            self.stats.errors += 1
            self._open_until = time.monotonic() + self.retry_s

    def _batches(self, sizes: list[int]):
        """Index ranges whose values (each rounded up to ``ALIGN``) fit the buffer, one value at least."""
        start, total = 0, 0
        for i, n in enumerate(sizes):
            n = -(-n // ALIGN) * ALIGN
            if i > start and total + n > self.buffer_bytes:
                yield start, i
                start, total = i, 0
            total += n
        if start < len(sizes):
            yield start, len(sizes)

    def _buffer(self, nbytes: int) -> _Buffer | None:
        """The staging buffer, at least ``nbytes`` (and ``buffer_bytes``) long, registered with the
        client when it can be; None when registration fails (the call is then made with bytes)."""
        buf = self._buf
        if buf is None or len(buf.array) < nbytes:
            buf = _Buffer(max(nbytes, self.buffer_bytes))
            if self.zero_copy:
                rc = self._call(self.client.register_buffer, buf.ptr, len(buf.array), fallback=None)
                buf.registered = rc == 0
            if self._buf is not None and self._buf.registered:
                self._call(self.client.unregister_buffer, self._buf.ptr, fallback=None)
            self._buf = buf
        return buf

    @staticmethod
    def _offsets(sizes: list[int]) -> list[int]:
        out, at = [], 0
        for n in sizes:
            out.append(at)
            at += -(-n // ALIGN) * ALIGN
        return out

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
        sizes = [self.codec.size(n) for n in names]
        stored = 0
        with self._io:
            for lo, hi in self._batches(sizes):
                ok = self._put_batch(keys[lo:hi], names[lo:hi], blocks[lo:hi], sizes[lo:hi])
                stored += ok
                self.stats.puts += ok
                self.stats.put_errors += hi - lo - ok
        return stored

    def _put_batch(self, keys, names, blocks, sizes) -> int:
        """One batch: packed into the buffer and put from it (or as bytes); how many landed."""
        offs = self._offsets(sizes)
        buf = self._buffer(offs[-1] + sizes[-1])
        for o, n, b in zip(offs, names, blocks):
            self.codec.pack_into(buf.array[o:], n, b.cpu() if b.device.type != "cpu" else b)
        if buf.registered:
            rcs = self._call(self.client.batch_put_from, keys, [buf.ptr + o for o in offs], sizes, fallback=None)
            if not isinstance(rcs, list) or len(rcs) != len(keys):
                return 0
            if any(rc != 0 for rc in rcs):
                self._failed()
            return sum(rc == 0 for rc in rcs)
        values = [buf.array[o:o + n].tobytes() for o, n in zip(offs, sizes)]
        rc = self._call(self.client.put_batch, keys, values, fallback=None)
        if rc != 0 and rc is not None:
            self._failed()
        return len(keys) if rc == 0 else 0

    def get_many(self, names) -> list[torch.Tensor | None]:
        """The verified block of each name, or None (a miss: absent, rejected, or the store failed)."""
        names = list(names)
        keys = [self.key(n) for n in names]
        self.stats.gets += len(keys)
        out: list[torch.Tensor | None] = [None] * len(keys)
        if not keys or not self.enabled:
            self.stats.misses += len(keys)
            return out
        sizes = [self.codec.size(n) for n in names]
        with self._io:
            for lo, hi in self._batches(sizes):
                out[lo:hi] = self._get_batch(keys[lo:hi], names[lo:hi], sizes[lo:hi])
        hits = sum(t is not None for t in out)
        self.stats.hits += hits
        self.stats.misses += len(keys) - hits
        return out

    def _get_batch(self, keys, names, sizes) -> list:
        """One batch read into the buffer (or as bytes), each value checked before it is copied out."""
        got: list = [None] * len(keys)
        offs = self._offsets(sizes)
        buf = self._buffer(offs[-1] + sizes[-1])
        if buf.registered:
            rcs = self._call(self.client.batch_get_into, keys, [buf.ptr + o for o in offs], sizes, fallback=None)
            if not isinstance(rcs, list) or len(rcs) != len(keys):
                return got
            views = [buf.array[o:o + rc] if isinstance(rc, int) and rc >= 0 else rc for o, rc in zip(offs, rcs)]
            if buf is not self._buf:                   # the call failed late: its buffer is not ours any more
                return got
        else:
            vals = self._call(self.client.get_batch, keys, fallback=None)
            if not isinstance(vals, list) or len(vals) != len(keys):
                return got
            views = [np.frombuffer(v, dtype=np.uint8) if v else OBJECT_NOT_FOUND for v in vals]
        for i, v in enumerate(views):
            if isinstance(v, int):                     # a code: absent (a miss), or the value's size is wrong
                if v == VALUE_TOO_LARGE:
                    self._reject(keys[i])
                elif v != OBJECT_NOT_FOUND:
                    self._failed()
                continue
            if self.codec.check(v, names[i]):
                got[i] = self.codec.tensor(v, names[i])
            else:
                self._reject(keys[i])
        return got

    def _reject(self, key: str) -> None:
        """A value that is not this block's: counted, removed (so the next put can land), never served."""
        self.stats.rejected += 1
        self._call(self.client.remove, key, True, fallback=None)

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
        """Unregister the staging buffer and stop the worker thread (the client is left to the
        process's exit)."""
        with self._io:
            if self._buf is not None and self._buf.registered:
                self._call(self.client.unregister_buffer, self._buf.ptr, fallback=None)
        self._pool.shutdown(wait=False)
