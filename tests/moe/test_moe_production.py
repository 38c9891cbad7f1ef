"""The MoE experts and token alignment at production shapes, on the GPU: experts E=128, k=8,
d=2048, f=768 at decode (T=64, 512) and prefill (T=4096) sizes against the fp32 reference, both MMA
orientations; the one-launch alignment kernels and the prefill alignment against the torch chain.

bf16 inputs, bf16 tolerances; the checks, and why only a GPU run can make them:
:mod:`tests.support.production_checks`."""
from __future__ import annotations

import pytest
import torch
from tests.support.devices import DEVICE, gpu_only
from tests.support.production_checks import check_moe

BF16 = torch.bfloat16
MOE = dict(E=128, k=8, d=2048, f=768)                               # the MoE bench's first GPU shape
MOE_VARIANTS = {  # (T, config override, decode alignment kernel)
    "decode_t64": (64, None, "sort"),
    "decode_t64_unswapped": (64, {"SWAP_AB": False, "DOWN_SWAP_AB": False}, "sort"),
    "decode_t64_chunked_align": (64, None, "chunked"),
    "decode_wide_t512": (512, None, "sort"),
    "prefill_t4096": (4096, None, "sort"),
    "prefill_t4096_tma_grouped": (4096, {"USE_TMA": True, "GROUP_M": 8, "BLOCK_N": 128}, "sort"),
}


@gpu_only
@pytest.mark.parametrize("variant", list(MOE_VARIANTS))
def test_moe_experts_production(variant, monkeypatch):
    from minimax_lab.moe import experts_triton as et
    T, config, align = MOE_VARIANTS[variant]
    monkeypatch.setattr(et, "DECODE_ALIGN", align)
    print(check_moe(T=T, **MOE, dtype=BF16, experts=lambda *a: et.experts_triton(*a, config=config)))


@gpu_only
@pytest.mark.parametrize("T,block_m", [(64, 16), (512, 32)])
def test_moe_alignment_kernels_production(T, block_m):
    from minimax_lab.moe.align import align_decode, align_tokens_triton, align_tokens_unchecked
    g = torch.Generator(device=DEVICE).manual_seed(T)
    ids = torch.randint(0, MOE["E"], (T, MOE["k"]), generator=g, device=DEVICE)
    want = align_tokens_unchecked(ids, MOE["E"], block_m)
    for fn in (align_decode, align_tokens_triton):
        got = fn(ids, MOE["E"], block_m)
        assert torch.equal(got.sorted_ids, want.sorted_ids) and torch.equal(got.block_expert, want.block_expert)
        assert int(got.num_rows) == int(want.num_rows) and torch.equal(got.counts.long(), want.counts.long())


@gpu_only
@pytest.mark.parametrize("T,E,block_m", [(4096, 128, 128), (16384, 128, 128), (16384, 256, 64), (3001, 37, 128),
                                         (131072, 256, 128)])
def test_moe_prefill_alignment_production(T, E, block_m, monkeypatch):
    """align_prefill at prefill sizes (compiled, default chunk) equals the torch chain; and the
    experts take it (not the torch chain) above 4096 slots."""
    from minimax_lab.moe import experts_triton as et
    from minimax_lab.moe.align import align_prefill, align_tokens_unchecked
    g = torch.Generator(device=DEVICE).manual_seed(T)
    ids = torch.randint(0, E, (T, 8), generator=g, device=DEVICE)
    want = align_tokens_unchecked(ids, E, block_m)
    got = align_prefill(ids, E, block_m)
    assert torch.equal(got.sorted_ids, want.sorted_ids) and torch.equal(got.block_expert, want.block_expert)
    assert int(got.num_rows) == int(want.num_rows) and torch.equal(got.counts.long(), want.counts.long())
    assert et.PREFILL_ALIGN == "triton"
    monkeypatch.setattr(et, "align_tokens_unchecked", lambda *a: pytest.fail("the experts took the torch chain"))
    assert torch.equal(et._align(ids, E, block_m).sorted_ids, want.sorted_ids)
