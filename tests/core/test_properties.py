"""Properties that span operators, drawn by hypothesis: the contracts the paged kernels
(``paged_decode``, ``paged_prefill``, ``write_kv``) share with MSA's paged decode
(``msa_decode_paged``), which reads the same page pool. One test sweeps all four because the
contract is one: a block table, sequence lengths and slots out of range raise ``ValueError`` in every
impl, and the ``check_values=False`` fast paths a decode loop (or a CUDA graph) runs read nothing
back to the host. Each operator's own properties live beside its tests
(``tests/<area>/test_<op>_properties.py``); the shared settings in :mod:`tests.support.properties`.

Inputs live on the kernel device (the GPU, or the CPU under the Triton interpreter).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.support.devices import DEVICE, ON_GPU, generator, randn
from tests.support.operator_inputs import coarse, paged_cache
from tests.support.properties import IMPLS, PROPERTY, seeds
from minimax_lab.attention import msa_decode_paged
from minimax_lab.paged_kv.decode import paged_decode
from minimax_lab.paged_kv.prefill import paged_prefill
from minimax_lab.paged_kv.write import write_kv


# --------------------------------------------------------------------------- the block table contract


@PROPERTY
@given(data=st.data(), bad=st.sampled_from(["page_id", "hole", "long", "negative_len"]), lengths=st.lists(
    st.integers(1, 40), min_size=1, max_size=3), seed=seeds)
def test_paged_kernels_out_of_range_raise(data, bad, lengths, seed):
    g = generator(seed)
    ins = paged_cache(lengths, page=16, Hkv=1, D=16, gen=g, d_idx=16)
    P, maxp = ins["k_cache"].shape[0], ins["block_table"].shape[1]
    b = data.draw(st.integers(0, len(lengths) - 1), label="sequence")
    used = -(-lengths[b] // 16)
    table, lens = ins["block_table"].clone(), ins["seq_lens"].clone()
    if bad == "page_id":
        table[b, data.draw(st.integers(0, maxp - 1))] = data.draw(st.sampled_from([P, P + 7, 10**6, -2, -10**6]))
        match = "page ids"
    elif bad == "hole":
        table[b, data.draw(st.integers(0, used - 1))] = -1
        match = "-1"
    elif bad == "long":
        lens[b] = maxp * 16 + data.draw(st.integers(1, 10**6))
        match = "seq_lens"
    else:
        lens[b] = data.draw(st.integers(-10**6, -1))
        match = "seq_lens"
    B = len(lengths)
    kw = dict(k_cache=ins["k_cache"], v_cache=ins["v_cache"], block_table=table, seq_lens=lens)
    for impl in IMPLS:
        with pytest.raises(ValueError, match=match):
            paged_decode(randn(B, 2, 16, gen=g), **kw, impl=impl)
        with pytest.raises(ValueError, match=match):
            paged_prefill(randn(B, 1, 2, 16, gen=g), **kw, impl=impl)
        with pytest.raises(ValueError, match=match):
            msa_decode_paged(randn(B, 2, 16, gen=g), **kw, q_idx=coarse(B, 1, 16, gen=g),
                             k_idx_cache=ins["k_idx_cache"], topk=2, impl=impl)
        with pytest.raises(ValueError, match="slot_mapping"):
            write_kv(randn(1, 1, 16, gen=g), randn(1, 1, 16, gen=g), ins["k_cache"], ins["v_cache"],
                     torch.tensor([P * 16 + data.draw(st.integers(0, 10**6))], device=DEVICE), impl=impl)


# --------------------------------------------------------------------------- claims the docstrings make


def _unchecked_fast_paths(g):
    """The ``check_values=False`` paths a decode loop or a CUDA graph runs, on valid inputs:
    ``{name: call}``, each returning the tensor it produced."""
    ins = paged_cache([40, 20], page=16, Hkv=2, D=16, gen=g, d_idx=16)
    kv = {n: ins[n] for n in ("k_cache", "v_cache", "block_table", "seq_lens")}
    q, q4, q_idx = randn(2, 4, 16, gen=g), randn(2, 3, 4, 16, gen=g), coarse(2, 2, 16, gen=g)
    k_new, slots = randn(2, 2, 16, gen=g), torch.tensor([3, 40], device=DEVICE)
    k_cache, v_cache = ins["k_cache"].clone(), ins["v_cache"].clone()

    def write():
        write_kv(k_new, k_new, k_cache, v_cache, slots, impl="triton", check_values=False)
        return k_cache
    return {
        "paged_decode": lambda: paged_decode(q, **kv, impl="triton", check_values=False),
        "paged_prefill": lambda: paged_prefill(q4, **kv, impl="triton", check_values=False),
        "msa_decode_paged": lambda: msa_decode_paged(q, **kv, q_idx=q_idx, k_idx_cache=ins["k_idx_cache"], topk=2,
                                                     impl="triton", check_values=False),
        "write_kv": write,
    }


def test_unchecked_fast_paths_read_nothing_back_to_the_host():
    # paged.py / msa.py / write.py: check_values=False skips every host read (CUDA graphs need that)
    from tests.support.operator_inputs import DeviceWork

    for name, call in _unchecked_fast_paths(generator(3)).items():
        with torch.no_grad(), DeviceWork() as work:
            call()
        assert not work.syncs, f"{name} synchronised with the host: {work.syncs}"


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (CUDA graphs); the CPU run checks the ops instead")
def test_unchecked_fast_paths_capture_in_a_cuda_graph():
    # a host sync inside capture raises; replaying the graph must give the eager answer
    for name, call in _unchecked_fast_paths(generator(4)).items():
        with torch.no_grad():
            eager = call().clone()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                call()  # warm-up: compile and autotune outside the capture
            torch.cuda.current_stream().wait_stream(stream)
            with torch.cuda.graph(graph):
                out = call()
            graph.replay()
            torch.cuda.synchronize()
        assert torch.equal(out, eager), name


