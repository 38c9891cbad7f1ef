"""Aborting requests: waiting, decoding, forked, or in the middle of a prompt whose full pages are
already named for the prefix cache (they are written before the request leaves)."""
import dataclasses

import pytest
import torch
from tests.support.devices import DEVICE, generator

from minimax_lab.engine import Engine, EngineOptions, M3Model, SamplingParams, m3_config
from minimax_lab.engine.sequence import Status

BATCHED = EngineOptions(continuous_batching=True, max_batch=4, step_tokens=24, prefix_caching=True)


@pytest.fixture(scope="module")
def model():
    return M3Model.create(m3_config("cpu"), DEVICE)


def text(n, seed, vocab=256):
    return torch.randint(0, vocab - 1, (n,), generator=generator(seed)).tolist()


def alone(model, prompt, n):
    eng = Engine(model, EngineOptions(), kv_tokens=1024)
    rid = eng.add_request(prompt, sampling=SamplingParams(max_tokens=n))
    return eng.run()[rid]


def filled(eng):
    """The pool starts filled with a large value: a page read before any step wrote it shows."""
    for t in (eng.cache.pages.k, eng.cache.pages.v, eng.cache.index_keys):
        t.fill_(100.0)
    return eng


def test_a_request_aborted_mid_prompt_leaves_no_unwritten_page_in_the_cache(model):
    """Its prompt's full pages are named when admitted; it runs until they are written, then
    leaves without a token, and a later request sharing them gets the right answer."""
    c = model.cfg
    prompt = text(5 * c.block_size + 3, 1)
    eng = filled(Engine(model, BATCHED, kv_tokens=1024))
    rid = eng.add_request(prompt, sampling=SamplingParams(max_tokens=4))
    eng.step()                                           # 24 of 83 prompt tokens computed
    seq = eng.sequences[rid]
    assert seq.status is Status.PREFILL and seq.computed < 2 * c.block_size
    assert eng.abort(rid) is True and seq.aborted and seq.status is Status.PREFILL
    assert eng.abort(rid) is False
    while eng.sequences[rid].status is not Status.FINISHED:
        eng.step()
        eng.blocks.check_invariants()
    assert seq.output == [] and seq.computed == 5 * c.block_size and not eng.blocks.seqs
    later = prompt + text(7, 2)
    lid = eng.add_request(later, sampling=SamplingParams(max_tokens=4))
    out = eng.run()
    assert eng.sequences[lid].cached_tokens == 5 * c.block_size
    assert out[lid] == alone(model, later, 4)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_aborted_requests_stop_at_once_and_the_rest_are_unchanged(model, prefix_caching):
    c = model.cfg
    opts = dataclasses.replace(BATCHED, max_batch=2, prefix_caching=prefix_caching)
    eng = filled(Engine(model, opts, kv_tokens=1024))
    prompts = [text(n, 10 + n) for n in (20, 9, 30, 12)]
    ids = [eng.add_request(p, sampling=SamplingParams(max_tokens=6)) for p in prompts]
    eng.step()
    eng.step()
    assert eng.sequences[ids[3]].status is Status.WAITING
    assert eng.abort(ids[3])                            # waiting: gone at once
    decoding = next(i for i in ids if eng.sequences[i].status is Status.DECODE)
    child = eng.fork(decoding) if len(eng.scheduler.running) < 2 else None
    n_out = len(eng.sequences[decoding].output)
    assert eng.abort(decoding)                          # decoding: gone at once, its pages back
    assert eng.sequences[decoding].status is Status.FINISHED and decoding not in eng.blocks.seqs
    while eng.has_work():
        eng.step()
        eng.blocks.check_invariants()
    assert len(eng.sequences[decoding].output) == n_out and eng.sequences[ids[3]].output == []
    for i, p in zip(ids, prompts):
        if i not in (decoding, ids[3]):
            assert eng.sequences[i].output == alone(model, p, 6)
    if child is not None:
        assert eng.sequences[child].output == alone(model, prompts[ids.index(decoding)], 6)
    assert not eng.blocks.seqs and eng.abort(ids[0]) is False
    with pytest.raises(KeyError, match="unknown"):
        eng.abort("nobody")
