"""Solutions of chapter 00's exercises (one function per exercise, named like its stub)."""
from __future__ import annotations

import statistics
import time

import torch
import triton
import triton.language as tl


def tile_mask(pid_m: int, pid_n: int, block_m: int, block_n: int, M: int, N: int) -> torch.Tensor:
    rows = pid_m * block_m + torch.arange(block_m)
    cols = pid_n * block_n + torch.arange(block_n)
    return (rows[:, None] < M) & (cols[None, :] < N)


def matmul_flops_bytes(M: int, N: int, K: int, bytes_per_element: int) -> tuple[float, float]:
    return 2.0 * M * N * K, float((M * K + K * N + M * N) * bytes_per_element)


def roofline_ms(flops: float, bytes_moved: float, peak_tflops: float, bandwidth_gbps: float) -> float:
    return max(flops / (peak_tflops * 1e12), bytes_moved / (bandwidth_gbps * 1e9)) * 1e3


def honest_time_ms(fn, make_inputs, sync, reps: int = 10, warmup: int = 3) -> float:
    sets = [make_inputs(seed) for seed in range(2)]      # two sets, alternated: no call sees the last one's
    for i in range(warmup):
        fn(**sets[i % 2])
    samples = []
    for i in range(reps):
        inputs = sets[(warmup + i) % 2]
        sync()                                   # the device is idle: nothing queued before leaks in
        t0 = time.perf_counter()
        fn(**inputs)
        sync()                                   # wait for the work itself, not just its launch
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


@triton.jit
def _copy_tiles_kernel(src, dst, M, N, stride_sm, stride_sn, stride_dm, stride_dn,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(src + rows[:, None] * stride_sm + cols[None, :] * stride_sn, mask=mask)
    tl.store(dst + rows[:, None] * stride_dm + cols[None, :] * stride_dn, x, mask=mask)


def copy_tiles(src: torch.Tensor, dst: torch.Tensor, block_m: int = 16, block_n: int = 16) -> torch.Tensor:
    M, N = src.shape
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    _copy_tiles_kernel[grid](src, dst, M, N, src.stride(0), src.stride(1), dst.stride(0), dst.stride(1),
                             BLOCK_M=block_m, BLOCK_N=block_n)
    return dst


def copy_tiles_torch(src: torch.Tensor, dst: torch.Tensor, block_m: int = 16, block_n: int = 16) -> torch.Tensor:
    """The same numbers without a kernel: the checker of 00.5 must refuse it."""
    return dst.copy_(src)
