"""Preemption: a pool too small for every running request's future pages; the newest decoding
sequence is preempted (recompute or swap) and resumes with the tokens it would have generated
unpreempted. Forks count against max_batch."""
import dataclasses

import pytest
import torch
from tests.support.devices import DEVICE, ON_GPU, TF32_TOL, generator, relative_error

from minimax_lab.engine import Engine, EngineOptions, M3Model, SamplingParams, m3_config
from minimax_lab.engine.paged_attention import PagedKVCache
from minimax_lab.engine.scheduler import HostSwap, Scheduler
from minimax_lab.engine.sequence import Status
from minimax_lab.kvcache.blocks import BlockManager

TOL = TF32_TOL if ON_GPU else 1e-4
BATCHED = EngineOptions(continuous_batching=True, max_batch=6, step_tokens=40)


@pytest.fixture(scope="module")
def model():
    return M3Model.create(m3_config("cpu"), DEVICE)


def prompts(cfg, lengths=(20, 35, 9, 28, 40, 13), seed=0):
    g = generator(seed)
    return [torch.randint(0, cfg.vocab_size - 1, (n,), generator=g).tolist() for n in lengths]


def serve(model, opts, kv_tokens, params, reqs):
    eng = Engine(model, opts, kv_tokens=kv_tokens, record_logits=True)
    ids = [eng.add_request(p, sampling=params) for p in reqs]
    while eng.has_work():
        eng.step()
        eng.blocks.check_invariants()
        assert len(eng.scheduler.running) <= opts.max_batch
    return eng, [eng.sequences[i] for i in ids]


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["no_prefix_cache", "prefix_cache"])
@pytest.mark.parametrize("policy", ["recompute", "swap"])
@pytest.mark.parametrize("sampling", ["greedy", "top_p"])
def test_preempted_sequences_resume_with_identical_tokens(model, policy, prefix_caching, sampling):
    params = SamplingParams(max_tokens=24) if sampling == "greedy" else \
        SamplingParams(max_tokens=24, temperature=1.0, top_p=0.9, seed=3)
    reqs = prompts(model.cfg)
    _, ref = serve(model, BATCHED, 4096, params, reqs)
    opts = dataclasses.replace(BATCHED, preemption=policy, prefix_caching=prefix_caching)
    eng, got = serve(model, opts, 9 * model.cfg.block_size, params, reqs)
    assert eng.scheduler.preemptions >= 1 and any(s.preemptions for s in got)
    assert [s.output for s in got] == [s.output for s in ref]
    for a, b in zip(got, ref):
        assert relative_error(torch.stack(a.logits), torch.stack(b.logits)) < TOL
    if policy == "swap":
        assert eng.swap.bytes_out > 0 and eng.swap.bytes_in > 0
    else:
        assert eng.swap.bytes_out == 0


def test_preemption_takes_the_newest_decoding_sequence(model):
    """With every running sequence decoding and the pool short by one page, the one that arrived last goes."""
    cfg = model.cfg
    eng = Engine(model, dataclasses.replace(BATCHED, preemption="recompute"), kv_tokens=9 * cfg.block_size)
    reqs = prompts(cfg)
    ids = [eng.add_request(p, sampling=SamplingParams(max_tokens=24), arrival=float(i)) for i, p in enumerate(reqs)]
    first = None
    while eng.has_work() and first is None:
        decoding = [s for s in eng.scheduler.running if s.status is Status.DECODE]
        eng.step()
        if eng.last_plan.preempted:
            first = eng.last_plan.preempted[0]
            assert first.arrival == max(s.arrival for s in decoding) and first.status is Status.WAITING
            assert first is eng.scheduler.waiting[0]        # it arrived before every request still waiting
    assert first is not None and len(ids) == 6


def test_reserving_up_front_never_preempts_and_admits_fewer(model):
    cfg = model.cfg
    reqs = prompts(cfg)
    params = SamplingParams(max_tokens=24)
    reserve, _ = serve(model, BATCHED, 9 * cfg.block_size, params, reqs)
    preempt, _ = serve(model, dataclasses.replace(BATCHED, preemption="swap"), 9 * cfg.block_size, params, reqs)
    assert reserve.scheduler.preemptions == 0
    most = lambda e: max(st.decodes for st in e.step_times)  # noqa: E731
    assert most(preempt) > most(reserve)


def test_forks_respect_max_batch(model):
    cfg = model.cfg
    prompt = prompts(cfg, (30,))[0]
    eng = Engine(model, dataclasses.replace(BATCHED, max_batch=3), kv_tokens=1024)
    rid = eng.add_request(prompt, sampling=SamplingParams(max_tokens=6))
    eng.step()
    eng.fork(rid)
    eng.fork(rid)
    with pytest.raises(ValueError, match="max_batch"):
        eng.fork(rid)
    one = Engine(model, EngineOptions(), kv_tokens=1024)            # one request at a time: no fork at all
    rid = one.add_request(prompt, sampling=SamplingParams(max_tokens=6))
    one.step()
    with pytest.raises(ValueError, match="one at a time"):
        one.fork(rid)
    eng.run()
    assert max(st.decodes for st in eng.step_times) == 3


def test_swap_round_trip_restores_fp8_pages_and_scales():
    """HostSwap copies K, V, index keys and their FP8 scales out and back into other pages, bit for bit."""
    cfg = m3_config("cpu")
    cache = PagedKVCache(cfg, 8, device=DEVICE, kv_dtype="fp8_e4m3")
    g = generator(5)
    for t in cache.tensors():
        if t.dtype == torch.float8_e4m3fn:
            t.view(torch.uint8).copy_(torch.randint(0, 120, t.shape, generator=g, dtype=torch.uint8).to(DEVICE))
        else:
            t.copy_(torch.rand(t.shape, generator=g).to(DEVICE))
    before = [t.clone() for t in cache.tensors()]
    swap = HostSwap(cache)
    saved = swap.save([1, 4, 6])
    swap.load(saved, [0, 2, 7], first=1)
    for t, b in zip(cache.tensors(), before):
        view = (lambda x: x.view(torch.uint8)) if t.dtype == torch.float8_e4m3fn else (lambda x: x)
        assert torch.equal(view(t[:, 2]), view(b[:, 4])) and torch.equal(view(t[:, 7]), view(b[:, 6]))
        assert torch.equal(view(t[:, 0]), view(b[:, 0]))                 # page 0: before `first`, untouched
    assert swap.bytes_out == 3 * cache.page_bytes() and swap.bytes_in == 2 * cache.page_bytes()


def test_bad_preemption_settings_raise():
    with pytest.raises(ValueError, match="preemption"):
        EngineOptions(preemption="evict")
    with pytest.raises(ValueError, match="HostSwap"):
        Scheduler(BlockManager(8, 16), continuous_batching=True, max_batch=2, step_tokens=8, max_seq_len=64,
                  preemption="swap")


def _swap_run(model, kv_tokens, opts, lengths, max_tokens):
    eng = Engine(model, opts, kv_tokens=kv_tokens)
    ids = [eng.add_request(p, sampling=SamplingParams(max_tokens=max_tokens)) for p in prompts(model.cfg, lengths, 11)]
    while eng.has_work():
        eng.step()
        eng.blocks.check_invariants()
    return eng, [eng.sequences[i].output for i in ids]


def test_a_swapped_out_sequence_readmitted_alone_decodes_in_that_step(model):
    """The last running sequence finishes while the only waiting one is swapped out: readmitting it
    is a decode of that step (a swap-in alone is not an empty step)."""
    opts = EngineOptions(continuous_batching=True, max_batch=4, step_tokens=96, preemption="swap")
    eng, got = _swap_run(model, 7 * model.cfg.block_size, opts, (40, 40), 40)
    _, want = _swap_run(model, 4096, dataclasses.replace(opts, preemption=None), (40, 40), 40)
    assert eng.scheduler.preemptions >= 1 and eng.swap.bytes_in > 0
    assert got == want
    swapped_in = [st for st in eng.step_times if st.shape.swap_bytes and st.decodes]
    assert swapped_in, "no step both swapped pages in and decoded"
