"""The ``attention`` bench suite at the CPU preset: checks first, then records ours and peers."""
from __future__ import annotations

import minimax_lab  # noqa: F401
from minimax_lab.attention import bench_suite


def test_suite_cpu_records():
    recs = bench_suite.run(preset="cpu")
    ours = [r for r in recs if r["impl"] == "triton"]
    assert len(ours) == len(bench_suite.cases("cpu"))
    for r in ours:
        assert r["suite"] == "attention" and r["ms"] > 0 and r["ceiling"] == "gemm"
        assert "sdpa_flash" in r["peers_ms"] and r["check_rel_err"] < 1e-3
        assert "flex_compiled" in r["peer_notes"]  # skipped on the CPU, and says so
    assert any(r["impl"] == "sdpa_flash" for r in recs)


def test_causal_flops_count_the_triangle():
    full = bench_suite.attention_flops(1, 8, 8, 1, 4, causal=False)
    causal = bench_suite.attention_flops(1, 8, 8, 1, 4, causal=True)
    assert full == 4 * 8 * 8 * 4 and causal == 4 * 4 * (8 * 9 / 2)
