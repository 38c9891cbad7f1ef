"""Workload generators: reproducible, Mooncake-shaped, and agent traffic reuses far more than chat."""
from minimax_lab.kvcache.trace import read_trace, replay_trace, write_trace
from minimax_lab.kvcache.workloads import agent_workload, chat_workload, package_sources, tokenize


def test_reproducible_and_well_formed(tmp_path):
    a = chat_workload(30, seed=3)
    b = chat_workload(30, seed=3)
    assert [r.hash_ids for r in a.requests] == [r.hash_ids for r in b.requests]
    for r, toks in zip(a.requests, a.tokens):
        assert r.input_length == len(toks) and len(r.hash_ids) == -(-len(toks) // 512)
    assert sorted(r.timestamp for r in a.requests) == [r.timestamp for r in a.requests]
    back = read_trace(write_trace(a.requests, tmp_path / "t.jsonl"))
    assert [r.hash_ids for r in back] == [r.hash_ids for r in a.requests]


def test_agent_reuses_more_than_chat():
    src = package_sources("json")
    assert "json/decoder.py" in src and len(tokenize(src["json/decoder.py"])) > 1000
    ag = agent_workload(2, 30, packages=("json",), keep_tokens=True)
    ch = chat_workload(60)
    assert len(ag.requests) == 60
    # consecutive requests of a session share their prefix blocks
    s0 = [r for r, s in zip(ag.requests, ag.sessions) if s == 0]
    full = len(s0[0].hash_ids) - 1
    assert s0[1].hash_ids[:full] == s0[0].hash_ids[:full]
    # both sessions read the same codebase: the second one's first request hits it
    ra = replay_trace(ag.requests, capacity_tokens=None)
    assert ra.hit_ratio > 0.9 > replay_trace(ch.requests, capacity_tokens=None).hit_ratio
    assert ag.ideal_reuse() == ra.hit_ratio
