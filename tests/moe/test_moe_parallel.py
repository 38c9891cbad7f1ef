"""Expert parallelism: 2 ``gloo`` processes must give the single-process layer's output.

The ranks compute on the kernel device (the CPU with Triton's interpreter, or the GPU with the
compiled kernels -- both ranks then share it, gloo staging CUDA tensors through host memory); on
a GPU machine a second run keeps the ranks on the CPU, the interpreter started in the children.
One spawn runs every case (spawning costs more than the cases): ragged token splits, a rank
with no tokens, all tokens on rank 0's experts (rank 1 receives nothing), the sigmoid router
with a shared expert, and the torch and Triton expert impls. The helper kills its children and
raises ``TimeoutError`` rather than hang.
"""
from __future__ import annotations

import pytest
import torch
from tests.support.devices import DEVICE, ON_GPU, tol

from minimax_lab import runtime
from minimax_lab.moe.parallel import _token_split, run_gloo_check, shard_range

CASES = [
    dict(T=13, d=24, f=20, E=4, k=2, skew="ragged"),
    dict(T=9, d=24, f=20, E=4, k=2, skew="empty_rank", impl="torch", router="sigmoid_bias", shared_expert=True),
    dict(T=9, d=24, f=20, E=4, k=2, one_expert=True),
    dict(T=1, d=24, f=20, E=4, k=2, skew="empty_rank", impl="triton"),
    dict(T=17, d=16, f=12, E=8, k=3, seed=3),
]


@pytest.mark.parametrize("device", [None, pytest.param("cpu", marks=[pytest.mark.skipif(
    not ON_GPU, reason="on a CPU machine the kernel device is the CPU: the default run covers it"),
    pytest.mark.skipif(ON_GPU and runtime.interpreter_problem() is not None,
                       reason=f"CPU ranks need Triton's interpreter: {runtime.interpreter_problem()}")])],
    ids=["kernel_device", "cpu_ranks"])
def test_two_process_gloo_equals_single_process(device):
    results = run_gloo_check(CASES, world_size=2, timeout_s=240 if ON_GPU else 120, device=device)
    ranks_on = torch.device(device) if device else DEVICE
    assert len(results) == len(CASES)
    for case, per_rank in zip(CASES, results):
        assert sum(n for _, n in per_rank) == case["T"]           # every token was checked once
        # both sides run the same impl; fp32 Triton dots are TF32 on a GPU
        bound = tol(torch.float32, exact=1e-5, tf32=case.get("impl") == "triton" and ranks_on.type == "cuda")
        for err, n in per_rank:
            assert err < bound, (case, per_rank)


def test_shard_range_and_splits():
    assert [shard_range(8, 2, r) for r in range(2)] == [(0, 4), (4, 8)]
    with pytest.raises(ValueError, match="multiple"):
        shard_range(6, 4, 0)
    for T in (1, 2, 9, 13):
        for skew in ("even", "ragged", "empty_rank"):
            split = _token_split(T, 2, skew)
            assert sum(split) == T and min(split) >= 0
    assert _token_split(9, 2, "empty_rank")[-1] == 0


def test_bad_worker_input_is_reported_not_hung():
    with pytest.raises(RuntimeError, match="multiple"):
        run_gloo_check(dict(T=4, d=8, f=8, E=3, k=1), world_size=2, timeout_s=60)
    with pytest.raises(ValueError, match="device"):
        run_gloo_check(dict(T=4, d=8, f=8, E=4, k=1), device="meta")


def test_expert_parallel_refuses_mixed_devices_before_any_collective():
    """Checked locally, so no process group is needed to see the error."""
    from minimax_lab.moe.parallel import expert_parallel_experts
    x, w = torch.randn(3, 8, device=DEVICE), torch.ones(3, 1, device=DEVICE)
    ids = torch.zeros(3, 1, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match="one device"):
        expert_parallel_experts(x, torch.randn(2, 16, 8, device="meta"), torch.randn(2, 8, 8, device=DEVICE), w, ids,
                                n_experts=2)


def test_cpu_ranks_say_when_the_interpreter_cannot_run(monkeypatch):
    """On a GPU machine whose numpy breaks Triton's interpreter, CPU ranks fail at once with the
    reason instead of with an interpreter traceback from each child."""
    import minimax_lab.moe.parallel as par

    monkeypatch.setattr(par.runtime, "INTERPRET", False)
    monkeypatch.setattr(par.runtime, "interpreter_problem", lambda: "numpy too new (test)")
    with pytest.raises(RuntimeError, match="numpy too new"):
        run_gloo_check(dict(T=4, d=8, f=8, E=4, k=1), world_size=2, device="cpu")
