"""Exercise 07.3's values are the pool's: the checker lays a value out exactly as
``kvcache.pool_value`` does, and every value it marks as signed carries a valid keyed tag, so only
the header, length or magic checks can refuse it (a reader that checks the tag alone fails)."""
import random

import pytest
import torch

pytest.importorskip("blake3", reason="the pool's keyed tags need blake3 (requirements.txt)")

import blake3  # noqa: E402

from minimax_lab import exercises  # noqa: E402
from minimax_lab.exercises import ch07  # noqa: E402
from minimax_lab.kvcache.blocks import page_hash  # noqa: E402
from minimax_lab.kvcache.pool_value import ValueCodec  # noqa: E402


def _case():
    kv = torch.randn(2, 1, 4, 1, 8, generator=torch.Generator().manual_seed(0))
    return kv, page_hash(None, [1, 2]), bytes(range(32))


def test_the_checkers_layout_is_the_pools():
    kv, name, secret = _case()
    header = dict(model="m", hash=name.hex(), dtype="float32", shape=list(kv.shape), nbytes=kv.numel() * 4)
    assert ch07._signed(header, kv.numpy().tobytes(), secret) == ValueCodec("m", kv.dtype, kv.shape, secret).encode(name, kv)


def test_signed_bad_values_carry_a_valid_tag_and_forged_ones_do_not():
    kv, name, secret = _case()
    bad = ch07._damaged(kv, name, "m", secret, random.Random(0))
    for what, value in bad.items():
        valid = len(value) > 32 and blake3.blake3(value[:-32], key=secret).digest() == value[-32:]
        assert valid == ("(signed)" in what), what


def test_a_reader_that_checks_only_the_tag_is_refused():
    def tag_only(value, name, model, dtype, shape, secret):
        if len(value) < 44 or blake3.blake3(value[:-32], key=secret).digest() != value[-32:]:
            return None
        hlen = int.from_bytes(value[8:12], "little")
        payload = bytearray(value[12 + hlen:-32])
        return torch.frombuffer(payload, dtype=torch.uint8).view(dtype).reshape(shape) if payload else None

    v = exercises.verdict("07.3", tag_only)
    assert not v.passed and any("(signed): served it" in p or "raised" in p for p in v.problems), v.problems


def test_the_pools_own_reader_is_refused_as_the_packages_answer():
    def package(value, name, model, dtype, shape, secret):
        return ValueCodec(model, dtype, shape, secret).decode(value, name)

    v = exercises.verdict("07.3", package)
    assert not v.passed and any("the package's own answer" in p for p in v.problems), v.problems
