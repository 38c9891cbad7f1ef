"""Exercises where the learner writes Triton: each one's checker refuses an answer that computes the
right numbers without launching a Triton kernel, and explains a wrong kernel in the learner's terms.

Every exercise registered with ``writes_triton=True`` has, beside its solution in
``exercises/solutions/chNN.py``, a pure-PyTorch version ``<stub name>_torch`` that the checker must
turn away with exactly :data:`minimax_lab.exercises.NO_TRITON`.
"""
from __future__ import annotations

import importlib

import pytest
import torch
import triton
import triton.language as tl

from minimax_lab import exercises, runtime
from minimax_lab.exercises import launches
from minimax_lab.moe import capacity_for
from tests.support.devices import fresh_seed

TRITON_EXERCISES = [e for e in exercises.all_exercises() if e.writes_triton]


def _torch_twin(ex):
    module = importlib.import_module(f"minimax_lab.exercises.solutions.ch{ex.chapter}")
    return getattr(module, ex.stub.__name__ + "_torch", None)


def test_the_kernel_chapters_of_this_area_have_a_triton_exercise():
    assert {"05.5", "06.3"} <= {e.key for e in TRITON_EXERCISES}


@pytest.mark.parametrize("key", [e.key for e in TRITON_EXERCISES])
def test_a_pytorch_answer_is_refused_with_no_triton(key):
    ex = exercises.get(key)
    twin = _torch_twin(ex)
    assert twin is not None, f"solutions/ch{ex.chapter}.py needs {ex.stub.__name__}_torch, a pure-PyTorch version"
    assert exercises.verdict(key, twin).problems == [exercises.NO_TRITON]


@triton.jit
def _noop_kernel(X):
    pass


@pytest.mark.parametrize("key", [e.key for e in TRITON_EXERCISES])
def test_a_pytorch_answer_behind_a_kernel_that_does_nothing_is_refused(key):
    """Launching some kernel is not enough: the result returned must be what a kernel wrote."""
    ex = exercises.get(key)
    twin = _torch_twin(ex)

    def cheat(*args, **kwargs):
        _noop_kernel[(1,)](torch.zeros(1, device=runtime.kernel_device()))
        return twin(*args, **kwargs)

    assert exercises.verdict(key, cheat).problems == [exercises.NOT_BY_TRITON]
    assert exercises.verdict(key, ex.solution()).problems == []


# --------------------------------------------------------------------------- wrong kernels, explained


@triton.jit
def _owners_only_kernel(ids_ptr, block_expert_ptr, num_rows_ptr, n_slots, n_experts, n_blocks,
                        BLOCK_M: tl.constexpr, N_POW2: tl.constexpr, E_POW2: tl.constexpr):
    s = tl.arange(0, N_POW2)
    e = tl.arange(0, E_POW2)
    ids = tl.load(ids_ptr + s, mask=s < n_slots, other=-1)
    onehot = (ids[:, None] == e[None, :]).to(tl.int32)
    padded = (tl.sum(onehot, axis=0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_end = tl.cumsum(padded, axis=0)
    tl.store(num_rows_ptr, tl.sum(padded, axis=0))
    b = tl.arange(0, 64)
    owner = tl.sum((pad_end[None, :] <= (b * BLOCK_M)[:, None]).to(tl.int32), axis=1)
    tl.store(block_expert_ptr + b, tl.where(owner < n_experts, owner, -1), mask=b < n_blocks)


def _owners_only(ids, n_experts, block_m):
    """A Triton answer that forgets the slots: block owners right, sorted_ids all sentinel."""
    n = ids.numel()
    cap = capacity_for(n, n_experts, block_m)
    sorted_ids = torch.full((cap,), n, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(cap // block_m, dtype=torch.int32, device=ids.device)
    num_rows = torch.empty(1, dtype=torch.int32, device=ids.device)
    _owners_only_kernel[(1,)](ids.reshape(-1).contiguous(), block_expert, num_rows, n, n_experts, cap // block_m,
                              BLOCK_M=block_m, N_POW2=max(16, triton.next_power_of_2(n)),
                              E_POW2=max(16, triton.next_power_of_2(n_experts)))
    return sorted_ids, block_expert, num_rows


def test_align_in_triton_says_which_row_holds_the_wrong_slot():
    problems = exercises.verdict("05.5", _owners_only).problems
    assert problems and problems != [exercises.NO_TRITON]
    assert "row 0" in problems[0] and "should hold slot" in problems[0] and "yours holds padding" in problems[0]
    assert not any("block_expert" in p or "num_rows" in p for p in problems), problems


def test_sliding_window_decode_that_ignores_the_window_is_told_so():
    solution = exercises.get("06.3").solution()

    def whole_sequence(q, k_cache, v_cache, block_table, seq_lens, window):
        return solution(q, k_cache, v_cache, block_table, seq_lens, window=2**30)   # a Triton kernel, no window

    problems = exercises.verdict("06.3", whole_sequence).problems
    assert problems and problems != [exercises.NO_TRITON]
    assert all("window" in p for p in problems)
    assert any(p.startswith("window 1,") for p in problems), problems
    assert not any(p.startswith("window 200,") for p in problems), "a window longer than every sequence is plain decode"


def test_rms_norm_checker_draws_strided_rows_ragged_widths_fp16_and_a_batch():
    """01.5's inputs need the exercise's idea: rows further apart than D and batches further apart
    than S rows (strides), a width that is never a power of two (the mask), B > 1, and an fp16 call
    with a value whose square overflows fp16 (the fp32 sum); fresh sizes on each check."""
    seen = []

    def spy(x, weight, eps=1e-6):
        seen.append((tuple(x.shape), x.stride(), x.dtype, float(x.float().abs().max())))
        return exercises.get("01.5").solution()(x, weight, eps)

    for _ in range(2):
        assert exercises.verdict("01.5", spy).passed
    assert len({shape for shape, *_ in seen}) > 1, "the checker drew the same sizes twice"
    for (B, S, D), (sb, ss, sd), dtype, _ in seen:
        assert B > 1 and D & (D - 1) != 0 and sd == 1
        assert ss > D and sb > S * ss, "rows and batches must lie further apart than a contiguous tensor's"
    assert any(dtype == torch.float16 and big > 256 for *_, dtype, big in seen)


# --------------------------------------------------------------------------- the kernel device


class _Probed(Exception):
    """Raised by the probe below once it has seen a checker's first call."""


@pytest.mark.parametrize("key", [e.key for e in TRITON_EXERCISES])
def test_every_tensor_a_checker_hands_a_triton_answer_is_on_the_kernel_device(key, monkeypatch):
    """On a GPU a checker that builds CPU tensors fails its own solution ("cannot be accessed from
    Triton (cpu tensor?)"). Caught here on the CPU: the kernel device is made a fake one (meta), and
    the answer reports the devices of the tensors it is handed."""
    fake = torch.device("meta")
    monkeypatch.setattr(runtime, "kernel_device", lambda: fake)
    seen = []

    def probe(*args, **kwargs):
        seen.extend(launches.tensors_in(list(args) + list(kwargs.values())))
        raise _Probed

    with pytest.raises(_Probed):
        exercises.get(key).checker(probe)
    assert seen, f"{key}: the checker handed its answer no tensor"
    assert all(t.device == fake for t in seen), (
        f"{key}: the checker handed its Triton answer tensors on {sorted({str(t.device) for t in seen})}, not on "
        f"runtime.kernel_device()")


def test_a_view_handed_to_the_kernel_device_stays_a_view_of_its_buffer(monkeypatch):
    """A checker's strided view keeps its strides and offset on the kernel device (``.to`` would
    make a contiguous copy of it)."""
    monkeypatch.setattr(runtime, "kernel_device", lambda: torch.device("meta"))
    base = torch.randn(6, 10, generator=torch.Generator().manual_seed(fresh_seed()))
    view = base[1:5, 2:9].T
    moved = exercises.on_kernel_device(view)
    assert moved.device.type == "meta"
    assert (moved.shape, moved.stride(), moved.storage_offset()) == (view.shape, view.stride(), view.storage_offset())
