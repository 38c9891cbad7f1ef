"""One KV block as self-describing, checksummed bytes: what a disk tier's file holds (the shared
pool's values have a layout of their own, signed: ``pool_value``).

A block (one page of every layer: K and V ``[2, n_layers, page_size, Hkv, D]``, see
``KVPages.page_block``) is named by its chained content hash (``blocks.page_hash``) and belongs to
one *block format*: ``model`` (a string naming the weights), dtype and shape. The bytes::

    MAGIC(8) | header_len(4) | header JSON {model, hash, dtype, shape, nbytes} | payload | blake2b-32 checksum

:func:`decode_block` returns the tensor only when every check passes -- the magic, a header naming
this block and format, a header that describes its payload (sizes, dtype, shape), the length and
the checksum -- and ``None`` otherwise; it never raises for the bytes. :func:`write_block_file`
writes a file **atomically** (a temporary file with a name no other writer uses, fsync,
``os.replace``), so a reader sees a whole file or none.

The checksum catches accidents -- a torn write, a flipped bit, a truncated file -- not a writer who
means harm: anyone who can write a file in the directory can write a valid checksum with it, so
**a writer with access to the directory can serve any tensor**. Keep a disk tier's directory
private to the engine's user; the shared pool, which other machines write to, signs its values
with a secret instead (``pool_value``).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import struct
import threading
from pathlib import Path

import torch

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
