"""A broken alignment kernel fails loudly: the fused experts raise its error on every call (no
process-wide switch to another path), and a working kernel is used again right after."""
from __future__ import annotations

import pytest
import torch

from tests.support.devices import DEVICE, generator

from minimax_lab.moe import experts_triton as et


def _inputs(T: int, E: int = 8, k: int = 2, d: int = 32, f: int = 16):
    g = generator()
    x = torch.randn(T, d, generator=g).to(DEVICE)
    wgu = (torch.randn(E, 2 * f, d, generator=g) * 0.1).to(DEVICE)
    wd = (torch.randn(E, d, f, generator=g) * 0.1).to(DEVICE)
    weights = torch.rand(T, k, generator=g).to(DEVICE)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(DEVICE)
    return x, wgu, wd, weights, ids


def test_a_failing_alignment_kernel_raises_every_time_and_nothing_is_switched(monkeypatch):
    x, wgu, wd, w, ids = _inputs(T=40)          # 80 slots: above SLOT_BLOCKS_MAX_SLOTS, aligned
    calls = []
    real = et.align_decode

    def broken(*a, **kw):
        calls.append(1)
        raise RuntimeError("the alignment kernel broke")

    monkeypatch.setattr(et, "align_decode", broken)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="the alignment kernel broke"):
            et.experts_triton(x, wgu, wd, w, ids)
    assert len(calls) == 2                      # tried again: no process-wide fallback
    assert not any("BROKEN" in name for name in vars(et))
    monkeypatch.setattr(et, "align_decode", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    out = et.experts_triton(x, wgu, wd, w, ids)
    assert len(calls) == 3 and out.shape == x.shape and torch.isfinite(out).all()
