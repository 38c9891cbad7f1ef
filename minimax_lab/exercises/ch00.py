"""Exercises of chapter 00 (Rooflines and honest benchmarks): the mask every Triton tile needs, the
two numbers that place an operator on the roofline, the floor they set, and a timer you can trust.

* 00.1 the tile mask: which elements of a 2-D tile lie inside the matrix;
* 00.2 FLOPs and bytes of a matrix product, the two numbers behind its arithmetic intensity;
* 00.3 the roofline floor: the least time an operator can take on a machine;
* 00.4 an honest timer, checked by behaviour against a stand-in for an asynchronous GPU;
* 00.5 a 2-D tiled copy in Triton: the learner's own kernel, with the tile mask of 00.1 and strides.

Each checker draws fresh random sizes on every call. The answer to 00.4 may not call the package's
timer; in 00.5 PyTorch may not copy the matrix either (the copy is the kernel's): the kernel reads
``src`` through its strides and writes ``dst`` itself.
"""
from __future__ import annotations

import math
import time

import torch

from minimax_lab import measure, runtime
from minimax_lab.exercises import exercise, fresh_rng, tensor_problem


# --------------------------------------------------------------------------- 00.1 the tile mask


def tile_mask(pid_m: int, pid_n: int, block_m: int, block_n: int, M: int, N: int) -> torch.Tensor:
    """A 2-D kernel copies an ``(M, N)`` matrix tile by tile: program ``(pid_m, pid_n)`` handles the
    rows ``pid_m*block_m ... pid_m*block_m + block_m - 1`` and the columns
    ``pid_n*block_n ... pid_n*block_n + block_n - 1``. Tiles on the right and bottom edges overhang
    the matrix. Return a bool tensor of shape ``(block_m, block_n)``: True where the element lies
    inside the matrix (the kernel loads and stores it), False where it overhangs."""
    raise NotImplementedError  # your code here (the 2-D version of the copy kernel's `offs < n`)


@exercise("00.1", "the tile mask", "Mark which elements of a 2-D tile lie inside the matrix, so the edge "
          "tiles neither read nor write past its end.", tile_mask)
def _check_tile_mask(fn) -> list[str]:
    rng, problems, cases = fresh_rng(), [], []
    for _ in range(6):
        bm, bn = rng.choice([4, 8, 16]), rng.choice([4, 8, 16, 32])
        M, N = rng.randint(1, 4 * bm), rng.randint(1, 4 * bn)
        last_m, last_n = (M - 1) // bm, (N - 1) // bn
        cases += [(last_m, last_n, bm, bn, M, N), (rng.randint(0, last_m), rng.randint(0, last_n), bm, bn, M, N)]
    cases += [(0, 0, 8, 8, 8, 8), (1, 0, 8, 8, 12, 8), (0, 1, 4, 8, 4, 10)]  # full, bottom edge, right edge
    for pid_m, pid_n, bm, bn, M, N in cases:
        call = f"tile_mask({pid_m}, {pid_n}, {bm}, {bn}, M={M}, N={N})"
        got = fn(pid_m, pid_n, bm, bn, M, N)
        rows = pid_m * bm + torch.arange(bm)
        cols = pid_n * bn + torch.arange(bn)
        want = (rows[:, None] < M) & (cols[None, :] < N)
        wrong = tensor_problem(got, call, (bm, bn), torch.bool)
        if wrong:
            problems.append(wrong)
            break
        if not torch.equal(got.cpu(), want):
            problems.append(f"{call}: expected {int(want.sum())} True ({int((rows < M).sum())} rows x "
                            f"{int((cols < N).sum())} columns inside), got {int(got.sum())} True")
            if len(problems) >= 3:
                break
    return problems


# --------------------------------------------------------------------------- 00.2 FLOPs and bytes of a matmul


def matmul_flops_bytes(M: int, N: int, K: int, bytes_per_element: int) -> tuple[float, float]:
    """``C = A @ B`` with ``A`` of shape ``(M, K)`` and ``B`` of shape ``(K, N)``, all three matrices
    stored with ``bytes_per_element`` bytes per element. Return ``(flops, bytes)``: the
    floating-point operations the product must do (a multiply and an add count as two), and the
    fewest bytes it must move through memory (each input read once, the output written once).
    Their ratio is the product's arithmetic intensity."""
    raise NotImplementedError  # your code here


@exercise("00.2", "FLOPs and bytes of a matmul", "Count the work and the memory traffic of a matrix "
          "product; their ratio places it on the roofline.", matmul_flops_bytes)
def _check_matmul_flops_bytes(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    cases = [(rng.randint(1, 5000), rng.randint(1, 5000), rng.randint(1, 5000), rng.choice([1, 2, 4]))
             for _ in range(8)] + [(1, 4096, 4096, 2), (8192, 8192, 8192, 2)]   # a decode GEMV, a big square
    for M, N, K, b in cases:
        call = f"matmul_flops_bytes(M={M}, N={N}, K={K}, bytes_per_element={b})"
        got = fn(M, N, K, b)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            problems.append(f"{call} should return a pair (flops, bytes); got {got!r}")
            break
        flops, nbytes = (float(v) for v in got)
        want_f, want_b = 2.0 * M * N * K, float((M * K + K * N + M * N) * b)
        if not math.isclose(flops, want_f, rel_tol=1e-9):
            hint = " (a multiply-add is 2 FLOPs)" if math.isclose(flops, want_f / 2, rel_tol=1e-9) else ""
            problems.append(f"{call}: expected {want_f:,.0f} FLOPs, got {flops:,.0f}{hint}")
        if not math.isclose(nbytes, want_b, rel_tol=1e-9):
            problems.append(f"{call}: expected {want_b:,.0f} bytes (A, B read once, C written once), got {nbytes:,.0f}")
        if len(problems) >= 3:
            break
    return problems


# --------------------------------------------------------------------------- 00.3 the roofline floor


def roofline_ms(flops: float, bytes_moved: float, peak_tflops: float, bandwidth_gbps: float) -> float:
    """The least time, in milliseconds, an operator doing ``flops`` floating-point operations and
    moving ``bytes_moved`` bytes can take on a machine that does at most ``peak_tflops`` TFLOP/s
    and moves at most ``bandwidth_gbps`` GB/s (1 TFLOP/s = 1e12 FLOP/s, 1 GB/s = 1e9 B/s), when
    computing and moving overlap perfectly."""
    raise NotImplementedError  # your code here


@exercise("00.3", "the roofline floor", "Turn FLOPs, bytes and the two ceilings into the least time an "
          "operator can take.", roofline_ms)
def _check_roofline_ms(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    cases = []
    for _ in range(8):
        peak, bw = rng.uniform(0.05, 1000), rng.uniform(5, 5000)
        nbytes = 10 ** rng.uniform(3, 11)
        intensity = 10 ** rng.uniform(-1, 4)   # both sides of the ridge point
        cases.append((intensity * nbytes, nbytes, peak, bw))
    cases += [(2 * 8192**3, 3 * 8192**2 * 2, 800.0, 4300.0), (2e6, 8e6, 800.0, 4300.0)]   # compute- / memory-bound
    for flops, nbytes, peak, bw in cases:
        call = f"roofline_ms({flops:.4g}, {nbytes:.4g}, peak_tflops={peak:.4g}, bandwidth_gbps={bw:.4g})"
        got = float(fn(flops, nbytes, peak, bw))
        t_compute, t_memory = flops / (peak * 1e12) * 1e3, nbytes / (bw * 1e9) * 1e3
        want = max(t_compute, t_memory)
        if not math.isclose(got, want, rel_tol=1e-6):
            bound = "memory" if t_memory >= t_compute else "compute"
            why = (" (that is the smaller of the two times: the floor is the larger one)"
                   if math.isclose(got, min(t_compute, t_memory), rel_tol=1e-6) else
                   " (check the units: TFLOP/s = 1e12 FLOP/s, GB/s = 1e9 B/s, the answer in ms)")
            problems.append(f"{call}: expected {want:.6g} ms ({bound}-bound: compute {t_compute:.4g} ms, "
                            f"memory {t_memory:.4g} ms), got {got:.6g}{why}")
            if len(problems) >= 3:
                break
    return problems


# --------------------------------------------------------------------------- 00.4 an honest timer


def honest_time_ms(fn, make_inputs, sync, reps: int = 10, warmup: int = 3) -> float:
    """Return the median time, in milliseconds, of one call ``fn(**make_inputs(seed))`` on an
    asynchronous device. ``fn`` queues work and returns before the work is done; ``sync()``
    waits until all queued work has finished (like ``torch.cuda.synchronize``). Time it honestly:
    first call ``fn`` ``warmup`` times (the first calls compile), then time ``reps`` calls, each
    with inputs that differ from the previous call's (the same input twice in a row is served from
    cache), reading the clock (``time.perf_counter()``) only when the device is idle, and return
    the median (a few calls are disturbed by other work)."""
    raise NotImplementedError  # your code here


class _FakeDevice:
    """A stand-in for an asynchronous GPU, in wall-clock time. Each call queues ``work`` seconds
    of work and returns at once; ``sync()`` sleeps until the queue is empty. The first
    ``compile_calls`` calls block the host for ``compile_s`` (a JIT compiling); a call on the
    previous call's input takes ``cached`` (it is in cache); every ``every``-th call is disturbed
    and takes ``outlier`` more."""

    def __init__(self, work=0.020, cached=0.004, compile_s=0.15, compile_calls=3, outlier=0.1, every=4):
        self.work, self.cached, self.compile_s, self.compile_calls = work, cached, compile_s, compile_calls
        self.outlier, self.every = outlier, every
        self.busy_until = time.perf_counter()
        self.calls, self.syncs, self.last, self.same_input = 0, 0, None, 0

    def fn(self, x):
        self.calls += 1
        if self.calls <= self.compile_calls:
            time.sleep(self.compile_s)
        same = x is self.last
        self.same_input += same
        work = (self.cached if same else self.work) + (self.outlier if self.calls % self.every == 0 else 0.0)
        self.last = x
        self.busy_until = max(self.busy_until, time.perf_counter()) + work
        return x

    def sync(self):
        self.syncs += 1
        wait = self.busy_until - time.perf_counter()
        if wait > 0:
            time.sleep(wait)


@exercise("00.4", "an honest timer", "Time an asynchronous device: warm up, change inputs, synchronize "
          "before reading the clock, take the median.", honest_time_ms, answers=(measure.time_fn,))
def _check_honest_time_ms(fn) -> list[str]:
    dev = _FakeDevice(work=fresh_rng().uniform(0.012, 0.030))   # no fixed number passes
    made = []

    def make_inputs(seed):
        made.append(seed)
        return {"x": torch.full((4,), float(seed))}

    reps, warmup = 10, 3
    got = fn(dev.fn, make_inputs, dev.sync, reps=reps, warmup=warmup)
    problems = []
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        return [f"expected a number of milliseconds, got {got!r}"]
    got, want = float(got), dev.work * 1e3
    if dev.calls < reps + warmup:
        problems.append(f"fn was called {dev.calls} times; expected at least {warmup} warm-up + {reps} timed calls")
    if dev.syncs == 0:
        problems.append("sync() was never called: the clock read the time to queue the work, not to do it")
    if dev.same_input > 0:
        problems.append(f"{dev.same_input} calls got the previous call's input, which is served from cache: "
                        "draw new inputs (make_inputs with another seed) for each call")
    if not 0.8 * want <= got <= 1.6 * want:
        if got < 0.5 * want and dev.same_input:
            why = "that is the time of a call whose input is still in cache"
        elif got < 0.5 * want and dev.syncs:
            why = "read the clock only after sync(): the work of a call finishes long after fn returns"
        elif got < 0.5 * want:
            why = "the clock stopped before the device finished"
        elif dev.calls >= reps + warmup and got > 1.6 * want:
            why = ("slower than one call's work: the warm-up calls (compilation) or the disturbed calls leaked in; "
                   "warm up first, and take the median, not the mean")
        else:
            why = "see the other problems"
        problems.append(f"measured {got:.2f} ms; one call's work takes {want:.0f} ms ({why})")
    return problems


# --------------------------------------------------------------------------- 00.5 a 2-D tiled copy in Triton


def copy_tiles(src: torch.Tensor, dst: torch.Tensor, block_m: int = 16, block_n: int = 16) -> torch.Tensor:
    """Copy the ``(M, N)`` matrix ``src`` into ``dst`` (same shape, fp32, on ``runtime.kernel_device()``)
    with a ``@triton.jit`` kernel that you write above this function and launch here: one program per
    ``block_m x block_n`` tile, on a 2-D grid. Either matrix may be a view with any strides (a
    transposed matrix, a block cut out of a bigger one): pass ``src.stride(0), src.stride(1)`` and
    ``dst``'s to the kernel rather than assuming that rows are contiguous. ``M`` and ``N`` are rarely
    multiples of the tile: mask the edge tiles (00.1's mask) so that they neither read nor write
    outside the matrix. Return ``dst``."""
    raise NotImplementedError  # your code here


def _padded(M: int, N: int, pad: int, transposed: bool, fill: float | None, g: torch.Generator):
    """A ``(M, N)`` view inside a larger buffer with ``pad`` rows and columns all around (what an
    unmasked tile would touch past the edge is this buffer's padding, never foreign memory).
    Returns ``(buffer, view, inside)``: ``inside`` is True on the buffer's elements the view covers."""
    rows, cols = (N, M) if transposed else (M, N)
    shape = (rows + 2 * pad, cols + 2 * pad)
    buf = torch.randn(shape, generator=g) if fill is None else torch.full(shape, fill)
    buf = buf.to(runtime.kernel_device())
    inside = torch.zeros(shape, dtype=torch.bool)
    inside[pad:pad + rows, pad:pad + cols] = True
    view = buf[pad:pad + rows, pad:pad + cols]
    return buf, (view.T if transposed else view), inside


def _edges(where: torch.Tensor, inside: torch.Tensor) -> str:
    """Which side of the matrix the changed padding elements ``where`` lie on, in words."""
    rows, cols = inside.any(1).nonzero().flatten(), inside.any(0).nonzero().flatten()
    r, c = where.nonzero()[:, 0], where.nonzero()[:, 1]
    sides = [name for name, hit in (("below the last row", r > rows.max()), ("right of the last column", c > cols.max()),
                                    ("above the first row", r < rows.min()), ("left of the first column", c < cols.min()))
             if bool(hit.any())]
    return ", ".join(sides) or "outside the matrix"


@exercise("00.5", "a 2-D tiled copy in Triton", "Write the copy kernel in two dimensions: a 2-D grid of tiles, "
          "strides for any layout, and the tile mask on the right and bottom edges.", copy_tiles, writes_triton=True,
          copies=False)
def _check_copy_tiles(fn) -> list[str]:
    rng = fresh_rng()
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    layouts = ["row-major", "transposed", rng.choice(["row-major", "transposed"])]
    for trial, layout in enumerate(layouts):
        bm, bn = rng.choice([8, 16]), rng.choice([8, 16, 32])
        M, N = rng.randint(bm + 1, 4 * bm) | 1, rng.randint(bn + 1, 4 * bn) | 1   # odd: never a multiple of a tile
        pad = max(bm, bn)
        _, src, _ = _padded(M, N, pad, layout == "transposed", None, g)
        dst_t = rng.random() < 0.5
        dst_buf, dst, inside = _padded(M, N, pad, dst_t, math.nan, g)
        call = (f"copy_tiles(src {M}x{N} {layout} (strides {src.stride()}), dst {'transposed' if dst_t else 'row-major'} "
                f"(strides {dst.stride()}), block_m={bm}, block_n={bn})")
        got = fn(src, dst, bm, bn)
        buf = dst_buf.cpu()
        written_outside = ~torch.isnan(buf) & ~inside
        if written_outside.any():
            sides = _edges(written_outside, inside)
            if "above" in sides or "left" in sides:   # an unmasked overhang only reaches right and below
                why = ("an element (r, c) lives at base + r * stride(0) + c * stride(1), with each matrix's own "
                       "strides: passing N and 1 fits a row-major matrix only")
            else:
                why = "mask the stores of the edge tiles with (rows < M) & (cols < N), as in 00.1"
            return [f"{call}: wrote {int(written_outside.sum())} elements outside the matrix ({sides}): {why}"]
        out = dst.cpu()
        missing = torch.isnan(out)
        if missing.any():
            rows, cols = missing.all(1).nonzero().flatten(), missing.all(0).nonzero().flatten()
            where = " and ".join(f"{name} {int(ix.min())}..{int(ix.max())}" for name, ix in (("rows", rows), ("columns", cols))
                                 if len(ix)) or "some tiles"
            return [f"{call}: {int(missing.sum())} elements were never written ({where}): the grid needs "
                    f"cdiv(M, block_m) x cdiv(N, block_n) = {-(-M // bm)} x {-(-N // bn)} programs, the partial "
                    f"tiles at the bottom and right edges included"]
        want = src.cpu()
        if not torch.equal(out, want):
            bad = (out != want).nonzero()[0].tolist()
            return [f"{call}: dst[{bad[0]}, {bad[1]}] = {out[bad[0], bad[1]].item():.4g}, but src[{bad[0]}, {bad[1]}] = "
                    f"{want[bad[0], bad[1]].item():.4g}: address element (r, c) as base + r * stride(0) + c * stride(1), "
                    f"with each matrix's own strides"]
        if got is not dst:
            return [f"{call}: return dst (the matrix you copied into), not {type(got).__name__}"]
    return []
