"""The paged KV kernels at production shapes, on the GPU, against their fp32 references: paged
decode at 128k context, paged prefill over an 8k prefix, write_kv.

bf16 inputs, bf16 tolerances; the checks, and why only a GPU run can make them:
:mod:`tests.support.production_checks`."""
from __future__ import annotations

import pytest
import torch
from tests.support.devices import gpu_only
from tests.support.production_checks import check_paged_decode, check_paged_prefill, check_write_kv

from minimax_lab.paged_kv.decode import paged_decode
from minimax_lab.paged_kv.prefill import paged_prefill
from minimax_lab.paged_kv.write import write_kv

BF16 = torch.bfloat16
CTX = 131072                                                        # 128k tokens of context


@gpu_only
@pytest.mark.parametrize("page,splits", [(16, None), (128, None), (16, 1)], ids=["p16", "p128", "p16_one_split"])
def test_paged_decode_128k(page, splits):
    lengths = [CTX, CTX - 37, 65537, 1]
    print(check_paged_decode(lengths=lengths, Hq=32, Hkv=8, D=128, page=page, dtype=BF16,
                             decode=lambda *a: paged_decode(*a, impl="triton", num_splits=splits)))


@gpu_only
def test_paged_prefill_production():
    prefill = lambda q, kc, vc, bt, lens, ql: paged_prefill(q, kc, vc, bt, lens, q_lens=ql, impl="triton")  # noqa: E731
    print(check_paged_prefill(prefix_lens=[8192, 8192 - 5], S=2048, Hq=32, Hkv=8, D=128, page=16, dtype=BF16,
                              prefill=prefill))


@gpu_only
def test_write_kv_production():
    assert check_write_kv(T=8192, pages=8192, page=16, Hkv=8, D=128, dtype=BF16,
                          write=lambda *a: write_kv(*a, impl="triton")) == 8191
