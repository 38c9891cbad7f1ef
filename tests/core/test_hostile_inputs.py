"""Regression tests for inputs a new user hands the public operators, where one finding held for
several operators at once and one test sweeps them all: every Triton entry point refuses autograd
instead of detaching, float64 is exact in the reference and torch impls and refused by Triton, the
paged kernels and MSA's paged decode read a strided cache without copying it and, unchecked, never
read outside their tensors. Each test used to give a silent wrong answer, a crash or a cryptic
error. Findings about one operator live beside its tests
(``tests/<area>/test_<op>_hostile_inputs.py``). Inputs live on the kernel device (the GPU, or the
CPU under the Triton interpreter); tolerances follow the dtype actually computed."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from minimax_lab.attention import attention, msa_attention, msa_decode_paged, msa_select
from minimax_lab.paged_kv.decode import paged_decode
from minimax_lab.paged_kv.prefill import paged_prefill
from minimax_lab.paged_kv.write import write_kv
from minimax_lab.moe import moe_experts
from tests.support.devices import DEVICE, generator, randn, relative_error
from tests.support.operator_inputs import (DeviceWork, moe_inputs, msa_decode_inputs, msa_prefill_inputs,
                                           paged_cache, relayout)

IMPLS = ("reference", "torch", "triton")


# --------------------------------------------------------------------------- silent wrong answers


def test_triton_paged_kernels_do_not_copy_the_cache():
    # a strided cache used to be copied whole (.contiguous()) on every decode step: at 128k
    # context that is a full cache copy per token. The kernels take the stride instead.
    g = generator(3)
    ins = paged_cache([200, 150], page=16, Hkv=1, D=16, gen=g, spare=40, d_idx=16)
    strided = {n: relayout(ins[n], "last_dim_strided") for n in ("k_cache", "v_cache", "k_idx_cache")}
    cache_numel = strided["k_cache"].numel()
    calls = {
        "paged_decode": lambda: paged_decode(randn(2, 2, 16, gen=g), strided["k_cache"], strided["v_cache"],
                                             ins["block_table"], ins["seq_lens"], impl="triton",
                                             check_values=False),
        "paged_prefill": lambda: paged_prefill(randn(2, 2, 2, 16, gen=g), strided["k_cache"], strided["v_cache"],
                                               ins["block_table"], ins["seq_lens"], impl="triton",
                                               check_values=False),
        "msa_decode_paged": lambda: msa_decode_paged(randn(2, 2, 16, gen=g), strided["k_cache"], strided["v_cache"],
                                                     ins["block_table"], ins["seq_lens"], randn(2, 1, 16, gen=g),
                                                     strided["k_idx_cache"], topk=2, impl="triton",
                                                     check_values=False),
    }
    for name, call in calls.items():
        with DeviceWork() as work:
            call()
        assert work.largest_new < cache_numel // 4, f"{name} made a tensor of {work.largest_new} elements " \
                                                     f"(cache: {cache_numel})"


def _grad_calls():
    """Every Triton entry point whose float inputs can carry autograd, as ``(name, fn(requires_grad))``."""
    g = generator(6)

    def dense(rg):
        q, k, v = (randn(1, 20, 2, 16, gen=g).requires_grad_(rg) for _ in range(3))
        return attention(q, k, v, impl="triton")

    def msa_decode(rg):
        ins = msa_decode_inputs([30])
        ins["k_cache"].requires_grad_(rg)
        return msa_decode_paged(**ins, topk=2, impl="triton")

    def decode(rg):
        ins = paged_cache([30], page=16, Hkv=1, D=16, gen=g)
        return paged_decode(randn(1, 2, 16, gen=g).requires_grad_(rg), **ins, impl="triton")

    def prefill(rg):
        ins = paged_cache([30], page=16, Hkv=1, D=16, gen=g)
        return paged_prefill(randn(1, 3, 2, 16, gen=g).requires_grad_(rg), **ins, impl="triton")

    def write(rg):
        ins = paged_cache([30], page=16, Hkv=1, D=16, gen=g)
        write_kv(randn(1, 1, 16, gen=g).requires_grad_(rg), randn(1, 1, 16, gen=g), ins["k_cache"], ins["v_cache"],
                 torch.tensor([3], device=DEVICE), impl="triton")
        return ins["k_cache"]

    def moe(rg):
        x, wgu, wd, w, ids = moe_inputs()
        return moe_experts(x, wgu.requires_grad_(rg), wd, w, ids, impl="triton")

    def kernelbench_ops(rg):
        from minimax_lab.kernelbench import ops
        x = randn(4, 32, gen=g).requires_grad_(rg)
        ops.rmsnorm_residual(x, randn(4, 32, gen=g), torch.ones(32, device=DEVICE), impl="triton")
        ops.rope(randn(1, 4, 2, 32, gen=g).requires_grad_(rg), torch.arange(4, device=DEVICE)[None], impl="triton")
        return ops.softmax(x, impl="triton")

    def axpb(rg):
        from minimax_lab.bench.suite_pitfalls import axpb
        return axpb(randn(64, gen=g).requires_grad_(rg), impl="triton")

    return {"attention": dense, "msa_decode_paged": msa_decode, "paged_decode": decode,
            "paged_prefill": prefill, "write_kv": write, "moe_experts": moe, "kernelbench_ops": kernelbench_ops,
            "timing_pitfalls_axpb": axpb}


@pytest.mark.parametrize("name", list(_grad_calls()))
def test_triton_entry_points_refuse_autograd_instead_of_detaching(name):
    # finding: attention(impl="triton") returned a tensor with no grad_fn: q/k/v projections of a
    # model built with attn_impl="triton" silently trained without gradients
    call = _grad_calls()[name]
    with pytest.raises(ValueError, match="no backward"):
        call(True)
    with torch.no_grad():
        call(True)  # inference on trainable tensors is fine
    call(False)


# --------------------------------------------------------------------------- crashes, cryptic errors


def test_unchecked_fast_paths_never_read_outside_their_tensors():
    # with check_values=False (CUDA graphs, hot loops) nothing is read back to the host; the
    # kernels then clamp page ids and lengths, so wild values give garbage but never a fault.
    # A fresh process: a wild read would take the interpreter (or the CUDA context) down with it.
    script = textwrap.dedent("""
        import sys, torch
        sys.path.insert(0, "tests")
        from tests.support.devices import DEVICE, generator, randn
        from tests.support.operator_inputs import paged_cache
        from minimax_lab.attention import msa_decode_paged
        from minimax_lab.paged_kv.decode import paged_decode
        from minimax_lab.paged_kv.prefill import paged_prefill
        from minimax_lab.paged_kv.write import write_kv
        g = generator(9)
        ins = paged_cache([40, 20], page=16, Hkv=1, D=16, gen=g, d_idx=16)
        table = ins["block_table"].clone()
        table[0, 0], table[0, 1], table[1, 0] = 10**6, -10**6, -1
        lens = torch.tensor([10**6, -5], dtype=torch.int32, device=DEVICE)
        kw = dict(block_table=table, seq_lens=lens, check_values=False)
        paged_decode(randn(2, 2, 16, gen=g), ins["k_cache"], ins["v_cache"], **kw, impl="triton")
        paged_prefill(randn(2, 3, 2, 16, gen=g), ins["k_cache"], ins["v_cache"], **kw, impl="triton",
                      q_lens=torch.tensor([10**6, -3], dtype=torch.int32, device=DEVICE))
        msa_decode_paged(randn(2, 2, 16, gen=g), ins["k_cache"], ins["v_cache"], **kw, q_idx=randn(2, 1, 16, gen=g),
                         k_idx_cache=ins["k_idx_cache"], topk=2, impl="triton")
        from minimax_lab.attention import msa_attention
        q, kk = randn(1, 40, 2, 16, gen=g), randn(1, 40, 1, 16, gen=g)
        wild = torch.tensor([2**30, -5, 1, 1], dtype=torch.int32, device=DEVICE).repeat(1, 40, 1, 1)
        for schedule in ("kv", "query"):
            msa_attention(q, kk, kk, randn(1, 40, 1, 16, gen=g), randn(1, 40, 16, gen=g), block_size=16, topk=4,
                          impl="triton", selected=wild, check_selected=False, schedule=schedule)
        before = ins["k_cache"].clone()
        write_kv(randn(2, 1, 16, gen=g), randn(2, 1, 16, gen=g), ins["k_cache"], ins["v_cache"],
                 torch.tensor([10**9, 3], device=DEVICE), impl="triton", check_values=False)
        assert torch.equal(ins["k_cache"][1:], before[1:])  # the wild slot wrote nothing
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
        print("survived")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                       cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert r.returncode == 0 and "survived" in r.stdout, r.stderr[-3000:]


def _float64_calls():
    g = generator(10)
    f64 = torch.float64
    ins = paged_cache([30], page=16, Hkv=1, D=16, gen=g, dtype=f64, d_idx=16)
    x, wgu, wd, w, ids = moe_inputs(dtype=f64)
    m = msa_prefill_inputs(B=1, S=20, dtype=f64)
    d = msa_decode_inputs([30], dtype=f64)
    q, q1, q2 = (randn(*shape, gen=g, dtype=f64) for shape in ((1, 20, 2, 16), (1, 2, 16), (1, 2, 2, 16)))
    return {
        "attention": lambda impl: attention(q, q, q, impl=impl),
        "msa_select": lambda impl: msa_select(m["q_idx"], m["k_idx"], block_size=16, topk=2, impl=impl),
        "msa_attention": lambda impl: msa_attention(**m, block_size=16, topk=2, impl=impl),
        "msa_decode_paged": lambda impl: msa_decode_paged(**d, topk=2, impl=impl),
        "paged_decode": lambda impl: paged_decode(q1, ins["k_cache"], ins["v_cache"], ins["block_table"],
                                                  ins["seq_lens"], impl=impl),
        "paged_prefill": lambda impl: paged_prefill(q2, ins["k_cache"], ins["v_cache"], ins["block_table"],
                                                    ins["seq_lens"], impl=impl),
        "moe_experts": lambda impl: moe_experts(x, wgu, wd, w, ids, impl=impl),
    }


@pytest.mark.parametrize("name", list(_float64_calls()))
def test_float64_is_exact_in_reference_and_torch_and_refused_by_triton(name):
    # finding: Triton paths listed float64 as accepted, then failed inside the interpreter with
    # InterpreterError(AssertionError()). The Triton kernels compute in fp16/bf16/fp32 only.
    call = _float64_calls()[name]
    want = call("reference")
    got = call("torch")
    assert got.dtype == want.dtype
    if got.is_floating_point():
        assert want.dtype == torch.float64 and relative_error(got, want) < 1e-9
    else:
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="float64"):
        call("triton")


