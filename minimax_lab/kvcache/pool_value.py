"""One KV block as a value in the shared pool: laid out to move without copies in Python, and
signed with the pool's secret.

The remote tier (:mod:`.remote`) writes values straight into a registered buffer and hands the
store pointers (Mooncake's zero-copy ``batch_put_from`` / ``batch_get_into``), so the layout is
fixed-size per block and its payload starts 64-byte aligned::

    MAGIC(8) | header_len(4) | header JSON {model, hash, dtype, shape, nbytes}, padded with spaces
             | payload (the tensor's bytes) | tag

The **tag** covers everything before it. With a pool secret (32 bytes, one per pool: see
``store.StoreServer.secret``) it is BLAKE3 in keyed mode (O'Connor et al., "BLAKE3: one function,
fast everywhere", 2020: a keyed hash that is a MAC): a value this codec accepts was written by
someone holding the secret. Without a secret it is xxh3-128 (xxHash, Collet): a checksum that
catches a torn, flipped or truncated value -- **not a writer who means harm**: anyone who can write
to the pool can compute it, so with no secret a writer with pool access can serve any tensor.

:meth:`ValueCodec.check` accepts a value only when its length, its whole header (this block's name,
this model, dtype and shape, this payload size, byte for byte) and its tag are what this codec
would write; a value of any other size, header or tag is refused. Nothing here raises for a
value's bytes.
"""
from __future__ import annotations

import json
import math

import numpy as np
import torch

MAGIC = b"MMLKVp01"
ALIGN = 64
SECRET_BYTES = 32


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def _tag_function(secret: bytes | None):
    """``(tag length, function of a buffer -> tag bytes)`` for this secret (None: xxh3-128)."""
    if secret is None:
        import xxhash  # deferred: only the pool needs it (minimax-lab[store] and requirements.txt carry it)
        return 16, xxhash.xxh3_128_digest
    import blake3  # deferred: only the pool needs it (minimax-lab[store] and requirements.txt carry it)
    return 32, lambda data: blake3.blake3(data, key=secret).digest()


def check_secret(secret) -> bytes | None:
    """``secret`` as bytes, or None. Raises ``TypeError``/``ValueError`` unless it is None or
    exactly ``SECRET_BYTES`` bytes."""
    if secret is None:
        return None
    if not isinstance(secret, (bytes, bytearray)):
        raise TypeError(f"a pool secret must be {SECRET_BYTES} bytes, got {type(secret).__name__}")
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"a pool secret must be {SECRET_BYTES} bytes, got {len(secret)}")
    return bytes(secret)


class ValueCodec:
    """Values of the blocks of one format: ``model`` (a string naming the weights), ``dtype`` and
    ``block_shape``; signed with ``secret`` (``SECRET_BYTES`` bytes) or, when None, checksummed
    (module docstring). ``keyed`` says which."""

    def __init__(self, model: str, dtype: torch.dtype, block_shape, secret: bytes | None = None):
        self.model, self.dtype = model, dtype
        self.block_shape = tuple(int(d) for d in block_shape)
        self.nbytes = math.prod(self.block_shape) * torch.empty((), dtype=dtype).element_size()
        self.secret = check_secret(secret)
        self.tag_bytes, self._tag = _tag_function(self.secret)
        self._headers: dict[bytes, bytes] = {}

    @property
    def keyed(self) -> bool:
        return self.secret is not None

    def header(self, name: bytes) -> bytes:
        """``MAGIC | header_len | header`` of block ``name``, padded so the payload is aligned."""
        h = self._headers.get(name)
        if h is None:
            body = json.dumps(dict(model=self.model, hash=name.hex(), dtype=_dtype_name(self.dtype),
                                   shape=list(self.block_shape), nbytes=self.nbytes)).encode()
            pad = -(12 + len(body)) % ALIGN
            body += b" " * pad
            h = MAGIC + len(body).to_bytes(4, "little") + body
            if len(self._headers) < 1 << 16:
                self._headers[name] = h
        return h

    def size(self, name: bytes) -> int:
        """Bytes of block ``name``'s value."""
        return len(self.header(name)) + self.nbytes + self.tag_bytes

    def pack_into(self, buf: np.ndarray, name: bytes, kv: torch.Tensor) -> int:
        """Write block ``name``'s value for ``kv`` (a CPU tensor of this format, any strides) at the
        start of ``buf`` (a uint8 array whose data is 64-byte aligned, at least ``size(name)``
        long); returns its size. One copy of the payload, one pass of the tag over the value."""
        head = self.header(name)
        h, end = len(head), len(head) + self.nbytes
        buf[:h] = np.frombuffer(head, dtype=np.uint8)
        kv = kv.detach()
        if kv.is_contiguous():                 # numpy's copy: one thread, no pool to wake on a busy machine
            np.copyto(buf[h:end], kv.reshape(-1).view(torch.uint8).numpy())
        else:
            torch.from_numpy(buf[h:end]).view(self.dtype).view(self.block_shape).copy_(kv)
        buf[end:end + self.tag_bytes] = np.frombuffer(self._tag(buf[:end]), dtype=np.uint8)
        return end + self.tag_bytes

    def check(self, buf: np.ndarray, name: bytes) -> bool:
        """Whether ``buf`` (a uint8 array of exactly the value's length) is block ``name``'s value:
        its size, header and tag (module docstring). Never raises for the bytes."""
        head = self.header(name)
        h, end = len(head), len(head) + self.nbytes
        if len(buf) != end + self.tag_bytes or bytes(buf[:h]) != head:
            return False
        return bytes(buf[end:]) == self._tag(buf[:end])

    def tensor(self, buf: np.ndarray, name: bytes) -> torch.Tensor:
        """A new tensor holding the payload of a value ``check`` accepted."""
        h = len(self.header(name))
        out = torch.empty(self.block_shape, dtype=self.dtype)
        np.copyto(out.view(-1).view(torch.uint8).numpy(), buf[h:h + self.nbytes])
        return out

    # ---- bytes in, bytes out: for clients without the zero-copy calls, and for inspection ----
    def encode(self, name: bytes, kv: torch.Tensor) -> bytes:
        """Block ``name``'s value for ``kv`` as bytes."""
        buf = aligned_buffer(self.size(name))
        self.pack_into(buf, name, kv)
        return buf.tobytes()

    def decode(self, data, name: bytes) -> torch.Tensor | None:
        """The tensor in ``data`` (bytes) if ``check`` accepts it, else None. Never raises for the bytes."""
        if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) != self.size(name):
            return None
        buf = np.frombuffer(data, dtype=np.uint8)
        return self.tensor(buf, name) if self.check(buf, name) else None


def aligned_buffer(nbytes: int) -> np.ndarray:
    """A zeroed uint8 array of ``nbytes`` whose data starts on a ``ALIGN``-byte boundary."""
    raw = np.zeros(nbytes + ALIGN, dtype=np.uint8)
    skip = -raw.ctypes.data % ALIGN
    return raw[skip:skip + nbytes]
