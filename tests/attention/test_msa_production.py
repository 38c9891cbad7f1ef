"""MSA at production shapes, on the GPU, against fp32 references on sampled query rows:
prefill at 16k tokens, Hq=64 / Hkv=4 / D=128, Bk=128, topk=16 (the index kernel's selection and
both schedules: KV-outer -- also in several memory chunks -- and query-outer), and paged decode at
128k context.

bf16 inputs, bf16 tolerances; the checks, and why only a GPU run can make them:
:mod:`tests.support.production_checks`."""
from __future__ import annotations

import pytest
import torch
from tests.support.devices import gpu_only
from tests.support.production_checks import check_msa_decode, check_msa_prefill, msa_schedules, msa_select_triton

from minimax_lab.attention import msa_decode_paged

BF16 = torch.bfloat16
CTX = 131072                                                        # 128k tokens of context
MSA = dict(Hq=64, G=4, D=128, Didx=128, Bk=128, topk=16)           # MiniMax's public MSA shape


@gpu_only
@pytest.mark.parametrize("S", [16384, 16384 - 37], ids=["s16k", "s16k_ragged"])
def test_msa_prefill_16k(S):
    err = check_msa_prefill(B=1, S=S, **MSA, dtype=BF16, n_rows=64, select=msa_select_triton(MSA["Bk"], MSA["topk"]),
                            attend=msa_schedules(MSA["Bk"], MSA["topk"], chunk_bytes=2**30))
    print(err)


@gpu_only
def test_msa_decode_paged_128k():
    decode = lambda *a: msa_decode_paged(*a, topk=MSA["topk"], impl="triton", return_selected=True)  # noqa: E731
    print(check_msa_decode(lengths=[CTX, CTX - 100], T=1, Hq=MSA["Hq"], G=MSA["G"], D=MSA["D"], Didx=MSA["Didx"],
                           page=MSA["Bk"], topk=MSA["topk"], dtype=BF16, decode=decode))
