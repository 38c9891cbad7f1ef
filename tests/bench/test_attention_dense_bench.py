"""The ``attention`` bench suite at the CPU preset: checks first, then records ours and peers.

On a GPU the same tiny cases run on the GPU in its compute dtype (bf16), so the check's error is
held to that dtype's tolerance and FlexAttention is a real peer (timed, or noted if it fails)."""
from __future__ import annotations

import torch
from tests.support.devices import ON_GPU, tol

from minimax_lab import runtime
from minimax_lab.bench import suite_attention as bench_suite


def test_suite_cpu_records():
    recs = bench_suite.run(preset="cpu")
    ours = [r for r in recs if r["impl"] == "triton"]
    assert len(ours) == len(bench_suite.cases("cpu"))
    dtype = runtime.compute_dtype() if ON_GPU else torch.float32
    for r in ours:
        assert r["suite"] == "attention" and r["ms"] > 0 and r["ceiling"] == "gemm"
        assert r["dtype"] == str(dtype).replace("torch.", "")
        assert "sdpa_flash" in r["peers_ms"] and r["check_rel_err"] < tol(dtype, exact=1e-3)
        if ON_GPU:  # compiled on the GPU: timed beside ours, or a note saying why not
            assert "flex_compiled" in r["peers_ms"] or "flex_compiled" in r.get("peer_notes", {})
        else:
            assert "flex_compiled" in r["peer_notes"]  # skipped on the CPU, and says so
    assert any(r["impl"] == "sdpa_flash" for r in recs)


def test_causal_flops_count_the_triangle():
    full = bench_suite.attention_flops(1, 8, 8, 1, 4, causal=False)
    causal = bench_suite.attention_flops(1, 8, 8, 1, 4, causal=True)
    assert full == 4 * 8 * 8 * 4 and causal == 4 * 4 * (8 * 9 / 2)
