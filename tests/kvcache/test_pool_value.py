"""A pool value is served only when it is exactly this block's, and -- with the pool's secret --
only when someone holding the secret wrote it: a forged value with a checksum recomputed to match
is refused by a signed codec and served by a checksum-only one (the weakness the secret closes)."""
import hashlib

import numpy as np
import pytest
import torch

xxhash = pytest.importorskip("xxhash", reason="the pool's checksum needs xxhash (requirements.txt)")
pytest.importorskip("blake3", reason="the pool's signature needs blake3 (requirements.txt)")

from minimax_lab.kvcache.blocks import page_hash
from minimax_lab.kvcache.pool_value import ALIGN, MAGIC, ValueCodec, aligned_buffer, check_secret

SHAPE = (2, 3, 4, 2, 8)
SECRET = hashlib.blake2b(b"test pool", digest_size=32).digest()


def _block(seed=0, dtype=torch.float32):
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _forge(codec: ValueCodec, name: bytes, kv: torch.Tensor) -> bytes:
    """A value in the layout, with a payload of the forger's choosing and an xxh3-128 checksum
    recomputed over it: what anyone who can write to the pool can make."""
    head = codec.header(name)
    body = head + kv.contiguous().view(torch.uint8).numpy().tobytes()
    return body + xxhash.xxh3_128_digest(body)


@pytest.mark.parametrize("secret", [None, SECRET])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_roundtrip_is_bit_exact_and_aligned(secret, dtype):
    codec = ValueCodec("m", dtype, SHAPE, secret)
    name = page_hash(None, [1, 2, 3])
    kv = _block(1, dtype)
    value = codec.encode(name, kv)
    assert value[:8] == MAGIC and len(value) == codec.size(name)
    assert len(codec.header(name)) % ALIGN == 0 and codec.tag_bytes == (32 if secret else 16)
    got = codec.decode(value, name)
    assert got.dtype == dtype and got.shape == SHAPE
    assert torch.equal(got.view(torch.uint8), kv.view(torch.uint8))
    # a non-contiguous view packs the same bytes as its contiguous copy
    wide = torch.randn(2, 3, 2, 4, 8).to(dtype).transpose(2, 3)
    assert not wide.is_contiguous()
    assert codec.encode(name, wide) == codec.encode(name, wide.contiguous())


@pytest.mark.parametrize("secret", [None, SECRET])
def test_any_damage_is_refused(secret):
    codec = ValueCodec("m", torch.float32, SHAPE, secret)
    name, other = page_hash(None, [1]), page_hash(None, [2])
    value = codec.encode(name, _block())
    h = len(codec.header(name))
    flips = [0, 9, 20, h - 1, h, h + len(value) // 3, len(value) - 1]
    for at in flips:
        bad = bytearray(value)
        bad[at] ^= 0x10
        assert codec.decode(bytes(bad), name) is None, at
    for bad in (value[:-1], value + b"\0", value[:h], b"", b"garbage", codec.encode(other, _block()),
                ValueCodec("other-model", torch.float32, SHAPE, secret).encode(name, _block()),
                ValueCodec("m", torch.float16, SHAPE, secret).encode(name, _block().half())):
        assert codec.decode(bad, name) is None
    assert codec.decode(None, name) is None and codec.decode(12, name) is None


def test_a_forged_value_is_refused_with_the_secret_and_served_without_it():
    name = page_hash(None, [7])
    wrong = torch.full(SHAPE, 42.0)                       # the tensor a forger wants served
    plain = ValueCodec("m", torch.float32, SHAPE, None)
    forged = _forge(plain, name, wrong)
    served = plain.decode(forged, name)                   # checksum only: the forgery is a "good" value
    assert served is not None and torch.equal(served, wrong)
    signed = ValueCodec("m", torch.float32, SHAPE, SECRET)
    assert signed.decode(_forge(signed, name, wrong), name) is None          # the checksum does not sign
    # nor does a tag made with another secret, or a signed value of another block moved here
    other = ValueCodec("m", torch.float32, SHAPE, bytes(32))
    assert signed.decode(other.encode(name, wrong), name) is None
    moved = signed.encode(page_hash(None, [8]), wrong)
    assert signed.decode(moved, name) is None
    assert torch.equal(signed.decode(signed.encode(name, wrong), name), wrong)


def test_secrets_are_checked():
    assert check_secret(None) is None and check_secret(bytearray(32)) == bytes(32)
    with pytest.raises(ValueError, match="32 bytes"):
        check_secret(b"short")
    with pytest.raises(TypeError, match="32 bytes"):
        check_secret("a string")


def test_aligned_buffers():
    for n in (1, 63, 4096):
        buf = aligned_buffer(n)
        assert len(buf) == n and buf.ctypes.data % ALIGN == 0 and buf.dtype == np.uint8 and not buf.any()
