"""Bad input to the KV cache's bookkeeping gets a clear error, never a plausible wrong answer."""
import numpy as np
import pytest
import torch

from minimax_lab.kvcache import BlockManager, Request, read_trace, replay_trace
from minimax_lab.kvcache.routing import route_trace
from minimax_lab.kvcache.tiers import TieredStore


# ---- token ids --------------------------------------------------------------------------------

@pytest.mark.parametrize("bad,err", [([1.5, 2.5, 3], TypeError), ([1.0, 2.0, 3.0], TypeError), (["1", "2"], TypeError),
                                     ("123", TypeError), ([1, None], TypeError), ([True, 2], TypeError),
                                     ([1, -2, 3], ValueError), (torch.tensor([1.0, 2.0, 3.0]), TypeError),
                                     (torch.tensor([[1, 2]]), TypeError), (7, TypeError)])
def test_allocate_rejects_non_integer_tokens(bad, err):
    """Float ids were truncated (1.5 -> 1) and served the cached prefix of other tokens."""
    m = BlockManager(8, 2)
    m.allocate("a", [1, 2, 3])
    with pytest.raises(err, match="token"):
        m.allocate("b", bad)
    assert "b" not in m.seqs
    with pytest.raises(err, match="token"):
        m.lookup(bad)
    m.check_invariants()


def test_integer_kinds_are_token_ids():
    m = BlockManager(8, 2)
    m.allocate("a", [1, 2, 3])
    assert m.allocate("b", np.array([1, 2, 5])) == 2
    assert m.allocate("c", torch.tensor([1, 2, 6], dtype=torch.int32)) == 2
    assert m.allocate("d", [np.int64(1), torch.tensor(2), 7]) == 2
    assert m.seqs["d"].tokens == [1, 2, 7] and all(type(t) is int for t in m.seqs["d"].tokens)
    with pytest.raises(TypeError, match="token"):
        m.append("a", 4.0)
    with pytest.raises(ValueError, match=">= 0"):
        m.append("a", -1)
    assert m.seqs["a"].tokens == [1, 2, 3]
    m.check_invariants()


# ---- trace replay -----------------------------------------------------------------------------

def test_replay_rejects_negative_lengths():
    """A negative input_length gave a hit ratio of 1.26."""
    with pytest.raises(ValueError, match="input_length must be >= 0"):
        replay_trace([Request(0, 8, 1, [1, 2]), Request(1, -100, 1, [1, 2])], capacity_tokens=None, block_tokens=4)
    with pytest.raises(ValueError, match="output_length"):
        replay_trace([dict(input_length=8, output_length=-1, hash_ids=[1])], capacity_tokens=None, block_tokens=4)


@pytest.mark.parametrize("hash_ids", ["123", b"12", 123, {1: 2}, [1.5], ["1"], [True], None])
def test_replay_rejects_hash_ids_that_are_not_a_list_of_ints(hash_ids):
    """A string "123" was read as the ids [1, 2, 3]."""
    with pytest.raises(TypeError, match=r"trace\[0\]: hash_ids"):
        replay_trace([dict(input_length=12, hash_ids=hash_ids)], capacity_tokens=None, block_tokens=4)


@pytest.mark.parametrize("field,value", [("input_length", 8.7), ("input_length", "8"), ("timestamp", 1.5),
                                         ("output_length", None)])
def test_replay_rejects_counts_that_are_not_ints(field, value):
    r = dict(timestamp=0, input_length=8, output_length=1, hash_ids=[1, 2])
    r[field] = value
    with pytest.raises(TypeError, match=field):
        replay_trace([r], capacity_tokens=None, block_tokens=4)


@pytest.mark.parametrize("block_tokens,err", [(0, ValueError), (-4, ValueError), (2.5, TypeError), (True, TypeError)])
def test_replay_rejects_bad_block_tokens(block_tokens, err):
    trace = [Request(0, 8, 1, [1, 2])]
    with pytest.raises(err, match="block_tokens"):
        replay_trace(trace, capacity_tokens=None, block_tokens=block_tokens)
    with pytest.raises(err, match="block_tokens"):
        route_trace(trace, replicas=2, block_tokens=block_tokens)


@pytest.mark.parametrize("cap,err", [(3, ValueError), (0, ValueError), (-8, ValueError), (8.0, TypeError),
                                     ("8", TypeError)])
def test_replay_rejects_bad_capacity(cap, err):
    trace = [Request(0, 8, 1, [1, 2])]
    with pytest.raises(err, match="capacity_tokens"):
        replay_trace(trace, capacity_tokens=cap, block_tokens=4)
    with pytest.raises(err, match="capacity_tokens"):
        route_trace(trace, replicas=2, capacity_tokens=cap, block_tokens=4)


@pytest.mark.parametrize("bad", [5, Request, [5], [None], {"input_length": 3}])
def test_replay_rejects_traces_that_are_not_requests(bad):
    with pytest.raises((TypeError, ValueError)):
        replay_trace(bad, capacity_tokens=None)


@pytest.mark.parametrize("line,what", [('{"timestamp": 0, "input_length": 8, "output_length": 1, "hash_ids": "12"}', "hash_ids"),
                                       ('{"timestamp": 0, "input_length": -8, "output_length": 1, "hash_ids": [1]}', "input_length"),
                                       ('{"timestamp": 0, "input_length": 8.5, "output_length": 1, "hash_ids": [1]}', "input_length"),
                                       ('{"timestamp": 0, "input_length": 8, "hash_ids": [1]}', "output_length"),
                                       ('[1, 2]', "JSON object")])
def test_read_trace_names_the_bad_line(tmp_path, line, what):
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 8, "output_length": 1, "hash_ids": [1, 2]}\n' + line + "\n")
    with pytest.raises(ValueError, match=rf"t.jsonl:2: .*{what}"):
        read_trace(p)


def test_hit_ratio_stays_a_ratio():
    """Whatever valid requests come, 0 <= hit ratio <= 1 and hits never exceed a request's input."""
    import random
    rng = random.Random(1)
    for _ in range(50):
        reqs = [Request(i, rng.randint(0, 40), 1, [rng.randrange(5) for _ in range(rng.randint(0, 6))])
                for i in range(rng.randint(1, 30))]
        for cap in (None, 4, 12):
            r = replay_trace(reqs, capacity_tokens=cap, block_tokens=4)
            assert 0.0 <= r.hit_ratio <= 1.0
            assert all(0 <= h <= q.input_length for h, q in zip(r.per_request_hits, reqs))


# ---- tier arguments ---------------------------------------------------------------------------

def test_tier_arguments(tmp_path):
    with pytest.raises(ValueError, match="model="):
        TieredStore(2, tmp_path)
    with pytest.raises(TypeError, match="model"):
        TieredStore(2, tmp_path, model="")
    with pytest.raises(ValueError, match="host_blocks"):
        TieredStore(-1)
    with pytest.raises(TypeError, match="host_blocks"):
        TieredStore(1.5)
    with pytest.raises(TypeError, match="dtype"):
        TieredStore(2, dtype="float32")
    st = TieredStore(2, pin_memory=False)
    with pytest.raises(TypeError, match="bytes"):
        st.spill("name", torch.ones(2))
    with pytest.raises(TypeError, match="torch.Tensor"):
        st.spill(b"n", [1.0])
    with pytest.raises(TypeError, match="bytes"):
        st.fetch(12)
    with pytest.raises(ValueError, match="no disk tier"):
        st.path_for(b"n")
    st.close()


def test_engine_rejects_non_integer_tokens():
    from minimax_lab.engine.slice import PagedEngine
    from minimax_lab.model import ModelConfig, TinyMultimodalModel
    torch.manual_seed(0)
    model = TinyMultimodalModel(ModelConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32))
    eng = PagedEngine(model, num_pages=8, page_size=4)
    with pytest.raises(TypeError, match="token"):
        eng.prefill("a", [5.0, 6.5, 7])
    assert "a" not in eng.mgr.seqs
    eng.prefill("a", [5, 6, 7])
    with pytest.raises(TypeError, match="token"):
        eng.decode("a", 8.0)
    assert eng.mgr.seqs["a"].tokens == [5, 6, 7]
