"""The exercise cheat gallery (``tests/workbook/exercise_cheats.py``): every cheat is refused with a
message that says what the answer did not do; every shipped solution passes (``test_exercises.py``)
and so does a second honest solution written differently (``exercise_honest.py``), so a checker
does not demand one particular code."""
from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from minimax_lab import exercises, runtime
from minimax_lab.attention.dense import attention
from minimax_lab.engine.sampling import SamplingParams, sample
from minimax_lab.engine.workloads import quality
from minimax_lab.exercises import ch01, ch09
from minimax_lab.exercises.solutions import ch00 as sol00, ch02 as sol02, ch05 as sol05
from minimax_lab.fp8 import quantize_fp8
from minimax_lab.kernelbench.ops_triton import rmsnorm_residual_triton, softmax_triton
from minimax_lab.kvcache import block_file
from minimax_lab.kvcache.eviction import LRUPolicy
from minimax_lab.kvcache.routing import PrefillCost, choose_replica
from minimax_lab.model.layers import RMSNorm
from minimax_lab.moe.align import align_tokens, align_tokens_triton
from tests.workbook import exercise_cheats as ec, exercise_honest
from tests.workbook.exercise_cheats import Cheat

PACKAGE = "the package's own answer"
CHECKERS = "the checker's own reference"


# --------------------------------------------------------------------------- kernels without the idea


@triton.jit
def _one_tile_softmax_kernel(X, Y, C, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + row * stride_x + cols, mask=cols < C, other=float("-inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(Y + row * stride_y + cols, e / tl.sum(e, 0), mask=cols < C)


def one_tile_softmax(x, block_n=16):
    """Ignores block_n: the whole row in one tile, no running max or sum."""
    y = torch.empty_like(x)
    _one_tile_softmax_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0),
                                            BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


@triton.jit
def _softmax_no_max_kernel(X, Y, C, stride_x, stride_y, BLOCK_N: tl.constexpr, RESCALE: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_N)
    m = tl.full([], float("-inf"), tl.float32) if RESCALE else tl.full([], 0.0, tl.float32)
    l = tl.full([], 0.0, tl.float32)
    for start in range(0, C, BLOCK_N):
        x = tl.load(X + row * stride_x + start + offs, mask=start + offs < C, other=float("-inf"))
        if RESCALE:   # a running max, but the sum so far is never rescaled when it grows
            m = tl.maximum(m, tl.max(x, 0))
        l += tl.sum(tl.exp(x - m), 0)
    for start in range(0, C, BLOCK_N):
        x = tl.load(X + row * stride_x + start + offs, mask=start + offs < C, other=float("-inf"))
        tl.store(Y + row * stride_y + start + offs, tl.exp(x - m) / l, mask=start + offs < C)


def softmax_without_max(x, block_n=16):
    y = torch.empty_like(x)
    _softmax_no_max_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0), BLOCK_N=block_n, RESCALE=False)
    return y


def softmax_without_rescale(x, block_n=16):
    y = torch.empty_like(x)
    _softmax_no_max_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0), BLOCK_N=block_n, RESCALE=True)
    return y


@triton.jit
def _flash_no_rescale_kernel(Q, K, V, O, LSE, S, Skv, H, GROUP, qk_scale,
                             stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_ob, stride_os,
                             stride_oh, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             CAUSAL: tl.constexpr):
    start_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n, offs_d = tl.arange(0, BLOCK_N), tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                mask=offs_m[:, None] < S, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start_n in range(0, Skv, BLOCK_N):
        cols = start_n + offs_n
        kv = b * stride_kb + (h // GROUP) * stride_kh + cols[:, None] * stride_ks + offs_d[None, :]
        k = tl.load(K + kv, mask=cols[:, None] < Skv, other=0.0)
        v = tl.load(V + kv, mask=cols[:, None] < Skv, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        visible = cols[None, :] < Skv
        if CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + Skv - S)
        s = tl.where(visible, s, float("-inf"))
        m_i = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_i[:, None])
        l_i += tl.sum(p, 1)                       # the old sum and acc are never rescaled
        acc += tl.dot(p, v)
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :], acc / l_i[:, None],
             mask=offs_m[:, None] < S)
    tl.store(LSE + bh * S + offs_m, m_i + tl.log(l_i), mask=offs_m < S)


def flash_without_rescale(q, k, v, causal=True):
    B, S, Hq, D = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(B, Hq, S, device=q.device)
    _flash_no_rescale_kernel[(triton.cdiv(S, 16), B * Hq)](
        q, k, v, o, lse, S, k.shape[1], Hq, Hq // k.shape[2], 1 / math.sqrt(D), q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2), o.stride(0), o.stride(1), o.stride(2), D=D, BLOCK_M=16, BLOCK_N=16,
        CAUSAL=causal)
    return o, lse


@triton.jit
def _local_softmax_backward_kernel(Q, K, V, dO, LSE, Delta, QPos, KPos, dQ, dK, dV, M, N, D, scale,
                                   BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    rows, cols, d = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, BD)
    rmask, cmask, dmask = rows < M, cols < N, d < D
    q = tl.load(Q + rows[:, None] * D + d[None, :], mask=rmask[:, None] & dmask[None, :], other=0.0)
    do = tl.load(dO + rows[:, None] * D + d[None, :], mask=rmask[:, None] & dmask[None, :], other=0.0)
    k = tl.load(K + cols[:, None] * D + d[None, :], mask=cmask[:, None] & dmask[None, :], other=0.0)
    v = tl.load(V + cols[:, None] * D + d[None, :], mask=cmask[:, None] & dmask[None, :], other=0.0)
    delta = tl.load(Delta + rows, mask=rmask, other=0.0)
    qp = tl.load(QPos + rows, mask=rmask, other=-1)
    kp = tl.load(KPos + cols, mask=cmask, other=2**30)
    visible = rmask[:, None] & cmask[None, :] & (kp[None, :] <= qp[:, None])
    s = tl.where(visible, tl.dot(q, tl.trans(k)) * scale, float("-inf"))
    e = tl.where(visible, tl.exp(s - tl.max(s, 1)[:, None]), 0.0)
    p = e / tl.maximum(tl.sum(e, 1), 1e-30)[:, None]       # a softmax over this block alone: LSE never read
    dv = tl.dot(tl.trans(p), do)
    ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
    tl.store(dQ + rows[:, None] * D + d[None, :], tl.dot(ds, k) * scale, mask=rmask[:, None] & dmask[None, :])
    tl.store(dK + cols[:, None] * D + d[None, :], tl.dot(tl.trans(ds), q) * scale, mask=cmask[:, None] & dmask[None, :])
    tl.store(dV + cols[:, None] * D + d[None, :], dv, mask=cmask[:, None] & dmask[None, :])


def backward_without_lse(q, k, v, do, lse, delta, q_pos, k_pos, scale):
    (M, D), N = q.shape, k.shape[0]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    pad = lambda n: max(16, triton.next_power_of_2(n))  # noqa: E731
    _local_softmax_backward_kernel[(1,)](q, k, v, do, lse, delta, q_pos, k_pos, dq, dk, dv, M, N, D, scale,
                                         BM=pad(M), BN=pad(N), BD=pad(D))
    return dq, dk, dv


@triton.jit
def _flawed_rms_norm_kernel(X, W, Y, S, D, eps, stride_xb, stride_xs, BLOCK_D: tl.constexpr, STRIDES: tl.constexpr,
                            LOAD_MASK_PAST_D: tl.constexpr, MEAN_OVER_TILE: tl.constexpr, FP32: tl.constexpr,
                            EPS: tl.constexpr):
    b, s = tl.program_id(0), tl.program_id(1)
    cols = tl.arange(0, BLOCK_D)
    if STRIDES:
        x_row = X + b * stride_xb + s * stride_xs
    else:                                  # as if x were contiguous: rows D apart, batches S * D apart
        x_row = X + (b * S + s) * D
    load_mask = cols <= D if LOAD_MASK_PAST_D else cols < D
    x = tl.load(x_row + cols, mask=load_mask, other=0.0)
    w = tl.load(W + cols, mask=cols < D, other=0.0)
    if FP32:
        x, w = x.to(tl.float32), w.to(tl.float32)
    ms = tl.sum(x * x, axis=0) / (BLOCK_D if MEAN_OVER_TILE else D)
    rstd = 1.0 / tl.sqrt(ms + eps) if EPS else 1.0 / tl.sqrt(ms)
    tl.store(Y + (b * S + s) * D + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=cols < D)


def flawed_rms_norm(strides=True, load_mask_past_d=False, mean_over_tile=False, fp32=True, eps_inside=True):
    """A Triton RMSNorm with one flaw switched on."""
    def answer(x, weight, eps=1e-6):
        B, S, D = x.shape
        y = torch.empty((B, S, D), dtype=x.dtype, device=x.device)
        _flawed_rms_norm_kernel[(B, S)](x, weight, y, S, D, eps, x.stride(0), x.stride(1),
                                        BLOCK_D=triton.next_power_of_2(D), STRIDES=strides,
                                        LOAD_MASK_PAST_D=load_mask_past_d, MEAN_OVER_TILE=mean_over_tile, FP32=fp32,
                                        EPS=eps_inside)
        return y
    return answer


def rms_norm_with_the_package_module(x, weight, eps=1e-6):
    norm = RMSNorm(x.shape[-1], eps).to(x.device)
    return ec.kernel_copy(norm(x))


def rms_norm_with_the_package_kernel(x, weight, eps=1e-6):
    rows = x.reshape(-1, x.shape[-1])
    y, _ = rmsnorm_residual_triton(rows, torch.zeros_like(rows), weight, eps)
    return y.reshape(x.shape)


def copy_rows_as_if_contiguous(src, dst, block_m=16, block_n=16):
    """A 2-D tiled copy that passes (N, 1) as every matrix's strides: right for row-major only."""
    M, N = src.shape
    sol00._copy_tiles_kernel[(triton.cdiv(M, block_m), triton.cdiv(N, block_n))](
        src, dst, M, N, N, 1, N, 1, BLOCK_M=block_m, BLOCK_N=block_n)
    return dst


def copy_through_flat_copies(src, dst, block_m=16, block_n=16):
    """The issue's laundering of 00.5: PyTorch makes contiguous copies, a 1-D kernel copies them."""
    flat = ec.kernel_copy(src.contiguous())
    dst.copy_(flat)
    return dst


@triton.jit
def _first_block_only_align_kernel(ids_ptr, sorted_ids_ptr, block_expert_ptr, num_rows_ptr, n_slots, n_experts,
                                   n_blocks, BLOCK_M: tl.constexpr, N_POW2: tl.constexpr, E_POW2: tl.constexpr,
                                   B_CHUNK: tl.constexpr):
    s = tl.arange(0, N_POW2)
    e = tl.arange(0, E_POW2)
    ids = tl.load(ids_ptr + s, mask=s < n_slots, other=-1)
    onehot = (ids[:, None] == e[None, :]).to(tl.int32)
    padded = (tl.sum(onehot, axis=0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_end = tl.cumsum(padded, axis=0)
    rank = (tl.cumsum(onehot, axis=0) - 1) % BLOCK_M            # the rank inside the expert's first block only
    row = tl.sum(onehot * ((pad_end - padded)[None, :] + rank), axis=1)
    tl.store(sorted_ids_ptr + row, s, mask=s < n_slots)
    tl.store(num_rows_ptr, tl.sum(padded, axis=0))
    for b0 in range(0, n_blocks, B_CHUNK):
        b = b0 + tl.arange(0, B_CHUNK)
        owner = tl.sum((pad_end[None, :] <= (b * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + b, tl.where(owner < n_experts, owner, -1), mask=b < n_blocks)


@triton.jit
def _sorting_align_kernel(ids_ptr, sorted_ids_ptr, block_expert_ptr, num_rows_ptr, n_slots, n_experts,
                          n_blocks, BLOCK_M: tl.constexpr, N_POW2: tl.constexpr, E_POW2: tl.constexpr,
                          B_CHUNK: tl.constexpr):
    # a correct alignment the chapter's way (keys sorted by expert, then slot): 05.5 asks for no sort
    s = tl.arange(0, N_POW2)
    e = tl.arange(0, E_POW2)
    ok = s < n_slots
    ids = tl.load(ids_ptr + s, mask=ok, other=-1)
    onehot = (ids[:, None] == e[None, :]).to(tl.int32)
    counts = tl.sum(onehot, axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_end = tl.cumsum(padded, axis=0)
    start = tl.cumsum(counts, axis=0) - counts
    keys = tl.sort(tl.where(ok, ids * N_POW2 + s, E_POW2 * N_POW2 + s))
    expert, slot = keys // N_POW2, keys % N_POW2
    pick = (expert[:, None] == e[None, :]).to(tl.int32)
    row = s + tl.sum(pick * ((pad_end - padded) - start)[None, :], axis=1)
    tl.store(sorted_ids_ptr + row, slot, mask=ok)
    tl.store(num_rows_ptr, tl.sum(padded, axis=0))
    for b0 in range(0, n_blocks, B_CHUNK):
        b = b0 + tl.arange(0, B_CHUNK)
        owner = tl.sum((pad_end[None, :] <= (b * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + b, tl.where(owner < n_experts, owner, -1), mask=b < n_blocks)


def align_by_sorting(ids, n_experts, block_m):
    n = ids.numel()
    cap = sol05.capacity_for(n, n_experts, block_m)
    sorted_ids = torch.full((cap,), n, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(cap // block_m, dtype=torch.int32, device=ids.device)
    num_rows = torch.empty(1, dtype=torch.int32, device=ids.device)
    _sorting_align_kernel[(1,)](ids.reshape(-1).contiguous(), sorted_ids, block_expert, num_rows, n, n_experts,
                                cap // block_m, BLOCK_M=block_m, N_POW2=max(16, triton.next_power_of_2(n)),
                                E_POW2=max(16, triton.next_power_of_2(n_experts)), B_CHUNK=64)
    return sorted_ids, block_expert, num_rows


def align_first_block_only(ids, n_experts, block_m):
    n = ids.numel()
    cap = sol05.capacity_for(n, n_experts, block_m)
    sorted_ids = torch.full((cap,), n, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(cap // block_m, dtype=torch.int32, device=ids.device)
    num_rows = torch.empty(1, dtype=torch.int32, device=ids.device)
    _first_block_only_align_kernel[(1,)](ids.reshape(-1).contiguous(), sorted_ids, block_expert, num_rows, n,
                                         n_experts, cap // block_m, BLOCK_M=block_m,
                                         N_POW2=max(16, triton.next_power_of_2(n)),
                                         E_POW2=max(16, triton.next_power_of_2(n_experts)), B_CHUNK=64)
    return sorted_ids, block_expert, num_rows


# --------------------------------------------------------------------------- the gallery


#: in 00.5 the copy is the exercise: a laundering that copies with PyTorch on the way is refused for that first
COPY_IS_THE_EXERCISE = "here the copy is the exercise"


def _triton_cheats() -> list[Cheat]:
    found = [Cheat(key, family, name, (lambda b=build, k=key: b(k)),
                   COPY_IS_THE_EXERCISE if key == "00.5" and name in ("copy-kernel", "in-a-new-thread",
                                                                      "in-a-thread-made-earlier", "through-numpy")
                   else refused)
             for key in ec.TRITON_KEYS for family, name, build, refused in ec.LAUNDRY]
    found += [
        Cheat("02.4", "launder", "custom-torch-library-op", lambda: ec.launder_through_custom_op("02.4"),
              "PyTorch computed (mine.answer_02_4"),
        Cheat("00.5", "launder", "issue-flat-copies", lambda: copy_through_flat_copies, "here the copy is the exercise"),
        Cheat("02.4", "package", "package-softmax-kernel", lambda: lambda x, block_n=16: softmax_triton(x),
              "a kernel of the package"),
        Cheat("02.5", "package", "dense-attention", lambda: lambda q, k, v, causal=True: attention(
            q, k, v, causal=causal, impl="triton", return_lse=True), PACKAGE),
        Cheat("05.5", "package", "align-tokens-triton", lambda: lambda ids, n_experts, block_m: tuple(
            getattr(align_tokens_triton(ids, n_experts, block_m), f) for f in ("sorted_ids", "block_expert", "num_rows")),
            PACKAGE),
        Cheat("05.5", "package", "align-tokens-in-a-new-thread", lambda: ec.in_new_thread(
            align_tokens, lambda a: (ec.kernel_copy(a.sorted_ids), ec.kernel_copy(a.block_expert),
                                     ec.kernel_copy(a.num_rows))), PACKAGE),
        Cheat("09.4", "package", "quantize-fp8-then-copy", lambda: lambda x: ec.copied_out(quantize_fp8(x, dims=(-1,))),
              PACKAGE),
        Cheat("02.4", "judge", "replace-torch-softmax", lambda: ec.patched_softmax(None), "torch.softmax"),
        Cheat("02.4", "judge", "torch-library-aten-softmax", ec.registered_softmax, "torch.library kernels"),
        Cheat("02.4", "structure", "one-tile", lambda: one_tile_softmax, "largest tile Triton allows"),
        Cheat("02.4", "structure", "no-running-max", lambda: softmax_without_max, "subtract the running max"),
        Cheat("02.4", "structure", "no-rescaled-sum", lambda: softmax_without_rescale, "must be rescaled"),
        Cheat("02.5", "structure", "no-rescaled-acc", lambda: flash_without_rescale, "o differs from the reference"),
        Cheat("04.9", "structure", "softmax-over-the-block", lambda: backward_without_lse, "saved lse"),
        Cheat("00.5", "structure", "row-major-strides-only", lambda: copy_rows_as_if_contiguous, "stride"),
        Cheat("05.5", "structure", "first-block-only", lambda: align_first_block_only, "should hold"),
        Cheat("05.5", "structure", "sorts-the-chapters-way", lambda: align_by_sorting, "sorts: section 3.1"),
        Cheat("01.5", "package", "package-rmsnorm-module", lambda: rms_norm_with_the_package_module, PACKAGE),
        Cheat("01.5", "package", "package-rmsnorm-kernel", lambda: rms_norm_with_the_package_kernel,
              "a kernel of the package"),
        Cheat("01.5", "package", "checkers-reference", lambda: lambda x, weight, eps=1e-6: ec.kernel_copy(
            ch01._rms_reference(x, weight, eps).to(x.dtype)), CHECKERS),
        Cheat("01.5", "judge", "reads-the-checkers-frame", lambda: ec.frame_reader("want", lambda *a: None),
              "looked into the call stack"),
        Cheat("01.5", "structure", "rows-as-if-contiguous", lambda: flawed_rms_norm(strides=False), "x.stride(1)"),
        Cheat("01.5", "structure", "load-mask-past-the-row", lambda: flawed_rms_norm(load_mask_past_d=True),
              "mask the load with cols < D"),
        Cheat("01.5", "structure", "mean-over-the-tile", lambda: flawed_rms_norm(mean_over_tile=True),
              "divided the sum of squares by the tile"),
        Cheat("01.5", "structure", "squares-in-fp16", lambda: flawed_rms_norm(fp32=False), "larger than fp16 can hold"),
        Cheat("01.5", "structure", "no-eps", lambda: flawed_rms_norm(eps_inside=False), "add eps inside the square root"),
    ]
    return found


def _plan(n, local, pool, shape, link, tflops, mfu=0.5):
    return PrefillCost(shape, link, tflops, mfu).plan(n, local, pool)


_aliased_plan = PrefillCost.plan


def _sample_with_package(logits, temperature, top_p, generator):
    return sample(logits[None], [SamplingParams(max_tokens=1, temperature=temperature, top_p=top_p)], [generator], [0])[0]


def _quality_with_package(logits, reference):
    return quality(ch09._run(logits), ch09._run(reference))


def _names_only(candidate, rows, cols):
    return "honest" not in getattr(candidate, "__name__", "")


def _calls_then_names(candidate, rows, cols):
    for _ in range(5):
        candidate(torch.randn(rows, cols))
    return "honest" not in getattr(candidate, "__name__", "")


def _constant_timer(fn, make_input, reps=5):
    return 20.0


def _calls_then_constant(fn, make_input, reps=5):
    for _ in range(reps):
        fn(make_input())
    return 20.0


class _LRUWithAnotherName(LRUPolicy):
    name = "mine"


def _other_cheats() -> list[Cheat]:
    def pick_by_plan(n, local, pool, queue, cost):
        return min(range(len(local)), key=lambda r: queue[r] + cost.plan(n, local[r], pool)[0])

    return [
        Cheat("07.1", "package", "method-of-an-object", lambda: _plan, PACKAGE),
        Cheat("07.1", "package", "alias", lambda: lambda n, local, pool, shape, link, tflops, mfu=0.5: _aliased_plan(
            PrefillCost(shape, link, tflops, mfu), n, local, pool), PACKAGE),
        Cheat("07.1", "package", "in-a-new-thread", lambda: ec.in_new_thread(_plan), PACKAGE),
        Cheat("07.1", "package", "in-a-thread-made-earlier", lambda: ec.in_old_thread(_plan), PACKAGE),
        Cheat("07.1", "package", "in-a-raw-thread", lambda: ec.in_raw_thread(_plan), PACKAGE),
        Cheat("07.1", "package", "in-a-process-pool", lambda: ec.in_process_pool(_plan), "another process"),
        Cheat("07.3", "package", "in-a-new-thread", lambda: ec.in_new_thread(block_file.decode_block), PACKAGE),
        Cheat("07.3", "package", "in-a-thread-made-earlier", lambda: ec.in_old_thread(block_file.decode_block), PACKAGE),
        Cheat("07.4", "package", "in-a-new-thread", lambda: ec.in_new_thread(choose_replica, lambda r: r[0]), PACKAGE),
        Cheat("07.4", "package", "in-a-thread-made-earlier", lambda: ec.in_old_thread(choose_replica, lambda r: r[0]),
              PACKAGE),
        Cheat("07.4", "package", "in-a-process-pool", lambda: ec.in_process_pool(choose_replica, lambda r: r[0]),
              "another process"),
        Cheat("07.4", "package", "cost-plan", lambda: pick_by_plan, PACKAGE),
        Cheat("08.1", "no calls", "reads-the-name", lambda: _names_only, "none of its 0 answers"),
        Cheat("08.1", "no calls", "calls-then-reads-the-name", lambda: _calls_then_names, "answered True, but none"),
        Cheat("08.2", "no calls", "returns-20", lambda: _constant_timer, "called fn 0 time(s)"),
        Cheat("08.2", "no calls", "calls-then-returns-20", lambda: _calls_then_constant, "your timer said 20"),
        Cheat("09.1", "package", "checkers-scheduler-plan", lambda: ch09._scheduler_plan, CHECKERS),
        Cheat("09.1", "package", "scheduler-plan-in-a-new-thread", lambda: ec.in_new_thread(ch09._scheduler_plan), CHECKERS),
        Cheat("09.1", "judge", "reads-the-checkers-frame", lambda: ec.frame_reader("want", lambda *a: []),
              "looked into the call stack"),
        Cheat("09.1", "judge", "replaces-the-checkers-reference", lambda: ec.replaced_reference(
            "minimax_lab.exercises.ch09", "_scheduler_plan", lambda *a: [], lambda *a: []), "_scheduler_plan"),
        Cheat("09.2", "package", "engine-sample", lambda: _sample_with_package, PACKAGE),
        Cheat("09.2", "package", "engine-sample-in-a-thread-made-earlier", lambda: ec.in_old_thread(_sample_with_package),
              PACKAGE),
        Cheat("09.3", "package", "workloads-quality", lambda: _quality_with_package, PACKAGE),
        Cheat("09.3", "judge", "walks-the-garbage-collector", lambda: ec.gc_reader(lambda *a: {}), "garbage collector"),
        Cheat("05.4", "package", "align-tokens", lambda: lambda ids, n_experts, block_m: (
            align_tokens(ids, n_experts, block_m).sorted_ids[:int(align_tokens(ids, n_experts, block_m).num_rows)],
            align_tokens(ids, n_experts, block_m).block_expert), PACKAGE),
        Cheat("06.4", "package", "inherits-lru", lambda: _LRUWithAnotherName, PACKAGE),
    ]


CHEATS = _triton_cheats() + _other_cheats()


@pytest.mark.parametrize("cheat", CHEATS, ids=[c.id for c in CHEATS])
def test_the_cheat_is_refused_saying_what_is_missing(cheat):
    v = exercises.verdict(cheat.key, cheat.build())
    assert not v.passed, f"{cheat.id}: the checker passed a cheat ({cheat.family})"
    assert any(cheat.refused in p for p in v.problems), f"{cheat.id}: refused for another reason: {v.problems}"


def test_the_gallery_covers_every_triton_exercise_and_the_issues_table():
    triton_keys = {e.key for e in exercises.all_exercises() if e.writes_triton}
    assert triton_keys == set(ec.TRITON_KEYS)
    keys = {c.key for c in CHEATS}
    assert {"00.5", "01.5", "02.4", "02.5", "03.3", "04.3", "04.9", "05.5", "06.3", "07.1", "07.3", "07.4", "08.1", "08.2",
            "09.1", "09.2", "09.3", "09.4"} <= keys


@pytest.mark.parametrize("key", sorted(exercise_honest.SECOND_SOLUTIONS))
def test_a_second_honest_solution_written_differently_passes(key):
    v = exercises.verdict(key, exercise_honest.SECOND_SOLUTIONS[key])
    assert v.passed, str(v)


def test_a_second_solution_exists_for_every_triton_exercise():
    assert set(exercise_honest.SECOND_SOLUTIONS) >= set(ec.TRITON_KEYS)


def test_the_guard_leaves_nothing_behind():
    """After every verdict, torch, the checker's modules and the launch hooks are as they were."""
    import threading

    from triton.runtime.jit import JITFunction

    run, thread_run, softmax, plan = JITFunction.run, threading.Thread.run, torch.softmax, ch09._scheduler_plan
    code = PrefillCost.plan.__code__
    for cheat in [c for c in CHEATS if c.family == "judge"]:
        exercises.verdict(cheat.key, cheat.build())
    exercises.verdict("07.1", _plan)
    assert (JITFunction.run, threading.Thread.run, torch.softmax, ch09._scheduler_plan) == (run, thread_run, softmax, plan)
    assert PrefillCost.plan.__code__ is code
    x = torch.randn(3, 5, device=runtime.kernel_device())
    assert torch.allclose(torch.softmax(x, -1).sum(-1), torch.ones(3, device=x.device))
    assert sol02.softmax_rows is not None


def test_every_listed_answer_is_refused_while_watched_and_put_back_after():
    from minimax_lab.exercises import forbidden

    for ex in exercises.all_exercises():
        functions = [f for target in ex.answers for f in forbidden.functions_of(target)]
        codes = [f.__code__ for f in functions]
        with forbidden.refused_calls({target: "{name}" for target in ex.answers}, []):
            assert all(f.__code__ is not code for f, code in zip(functions, codes)), ex.key
        assert [f.__code__ for f in functions] == codes, ex.key
