# %% [markdown]
# # 00 · Rooflines and honest benchmarks
#
# **What this chapter builds:** the machine's two ceilings, a roofline that places the workbook's operators, a Triton copy kernel, and a harness that times kernels honestly.
#
# **It assumes:** nothing from earlier chapters; Python, PyTorch, and what a GPU kernel launch is.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/00_roofline_and_honest_benchmarks.ipynb)
#
# Every later chapter ends with a claim like *"this kernel is 1.3× faster than PyTorch's"*. This
# chapter earns the right to make such claims: it measures what the machine can do at best, writes
# the smallest Triton kernel and checks it, then times one operator four wrong ways and one right
# way. Without a GPU the Triton kernels run in Triton's interpreter on the CPU; the H200's recorded
# numbers are drawn beside, in their own panels.

# %%
# In Colab, install the workbook's package first (locally, `make lab` already did).
import subprocess, sys
if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "minimax-lab[notebooks] @ git+https://github.com/minimax-lab/minimax-lab"], check=True)

# %% tags=["parameters"]
preset = "auto"  # "auto": GPU sizes on a GPU, CPU sizes otherwise; CI passes "cpu"

# %%
import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

from minimax_lab import exercises, measure, runtime  # first: on a CPU it turns on Triton's interpreter
import triton
import triton.language as tl
from minimax_lab.bench import suite_pitfalls
from minimax_lab.viz import pitfalls, roofline
from minimax_lab.viz.source import show_source

preset = pitfalls.setup(preset)  # on a CPU every timing below runs on one thread

# %% [markdown]
# ## 1. Two numbers, two ceilings
#
# Before timing anything, count two things for the operator: the floating-point operations it
# must do, and the fewest bytes it must move through memory (each input read once, each output
# written once). Divide each by the machine's rate and you get two times; **the larger one is the
# floor**: no implementation runs much faster. The ratio FLOPs / bytes is the operator's
# *arithmetic intensity*.
#
# The rates are not the datasheet's: we measure them. The copy ceiling is a large
# device-to-device copy (bytes read + bytes written over time); the compute ceiling is a large
# matrix product on random data (zeros run faster on an H200 and would flatter it).

# %%
here = measure.ceilings()
machines = roofline.machines(here)          # measured now, and the H200's recorded ceilings if shipped
print(roofline.describe_machines(machines))
print("how, here:", roofline.how_measured(here))

# %% [markdown]
# ## 2. The roofline
#
# Attainable speed = min(peak FLOP/s, intensity × bandwidth). An operator left of the *ridge
# point* (peak / bandwidth) is memory-bound: making it faster means moving fewer bytes, not doing
# fewer FLOPs. The operators below come from later chapters (bf16, 2 bytes per element, unless
# marked); the cell counts their FLOPs and bytes, and the table and the plot both read the count.

# %%
n_el = 1 << 20                      # elements of a·x+b
L, D, G = 8192, 128, 4              # decode: keys in the context, head dim, query heads per KV head
T, E, K, d, f = 64, 128, 8, 2048, 768   # MoE decode: tokens, experts, top-k, model dim, expert FFN dim
S = 16384                           # causal attention: sequence length (head dim D)
N = 8192                            # square GEMM
W = 3 * d * f                       # weights of one expert (gate, up, down)
OPERATORS = [
    roofline.operator("a·x+b (fp32)", 2 * n_el, 8 * n_el, "2 FLOPs per element; 4 B read + 4 B written"),
    roofline.operator(f"paged decode (GQA {G})", G * 4 * D * L, 2 * D * L * 2,
                      "per KV head: G query heads × 4·D per key; K and V read once"),
    roofline.operator(f"MoE decode T={T}", 2 * T * K * W, E * W * 2,
                      f"2 per weight per token, T·top-{K} visits; every expert's weights read once"),
    roofline.operator("causal attn 16k", 2 * S * S * D, 4 * S * D * 2,
                      "per head: half of 2 matmuls of 2·S²·D; Q, K, V read and O written once"),
    roofline.operator(f"GEMM {N}³", 2 * N**3, 3 * N * N * 2, "2·n³; A, B read and C written once"),
]
print(roofline.operator_table(OPERATORS))

# %%
roofline.plot_machines(machines, OPERATORS)
plt.show()
print(roofline.bound_lines(OPERATORS, machines))

# %% [markdown]
# Each panel is one machine, with the operators placed on its own roof. The two decode operators
# share one intensity (nested markers): each weight or key that comes from memory serves only a
# handful of queries or tokens. Which side of the ridge an operator lands on depends on the
# machine: the lines under the plot say it for each. An operator on the memory side is judged in
# GB/s against the copy ceiling, one on the compute side in TFLOP/s against the matmul ceiling.
#
# ## 3. The smallest kernel: a copy
#
# A Triton kernel is a function run by many *programs* at once; each program handles one block
# of `BLOCK` elements. The copy is four lines: find this program's offsets, **mask** the ones past
# the end (the last block overhangs whenever `n` is not a multiple of `BLOCK`), load, store. It
# does no arithmetic at all: its speed is the copy ceiling's business.

# %%
@triton.jit
def copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)   # this program's block of indices
    mask = offs < n                                         # the tail: the last block overhangs n
    x = tl.load(src + offs, mask=mask)
    tl.store(dst + offs, x, mask=mask)


# On a GPU a 1024-element block is typical. The CPU interpreter runs each program as numpy calls,
# so fewer, larger blocks are much faster there.
BLOCK = runtime.pick(preset, cpu=1 << 16, gpu=1024)
kdev = runtime.kernel_device()

def triton_copy(x, out):
    n = x.numel()
    copy_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)
    return out

# %% [markdown]
# Check it first, against torch's copy, on sizes that are **not** multiples of `BLOCK` (a tail
# in every case), with `measure.check`: fresh random inputs per trial, and the output buffer
# poisoned with NaN first, so an element the kernel forgets to write cannot pass. A copy must be
# exact: tolerance 0.

# %%
drawn = []

def ragged(seed):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 3 * BLOCK, (1,), generator=g)) | 1        # odd: never a multiple of BLOCK
    drawn.append(n)
    return {"x": torch.randn(n, generator=g).to(kdev)}

res = measure.check(triton_copy, lambda x: x.clone(), ragged, make_out=lambda inp: torch.empty_like(inp["x"]),
                    tol=0.0, trials=4, name="copy_kernel")
print(res.summary())
print("sizes drawn:", drawn, f"(BLOCK = {BLOCK})")

# %% [markdown]
# Now time it beside `torch.Tensor.copy_`, with the package's harness `measure.time_fn` (why each
# of its steps matters is the next section's subject). Bandwidth counts the bytes read plus the
# bytes written; each row is also a share of the copy ceiling of section 1, timed the same way
# (on a CPU, by a wall clock on one thread). The last lines say what the harness rotated its inputs
# through, against this machine's cache.

# %%
n_copy = runtime.pick(preset, cpu=1 << 21, gpu=64 << 20)

def make_copy(seed):
    x = torch.randn(n_copy, device=kdev, generator=torch.Generator(kdev).manual_seed(seed))
    return {"x": x, "out": torch.empty_like(x)}

t_copy = {"Triton copy_kernel": measure.time_fn(triton_copy, make_copy, reps=50),
          "torch copy_": measure.time_fn(lambda x, out: out.copy_(x), make_copy, reps=50)}
print(pitfalls.copy_lines(t_copy, bytes_per_call=2 * n_copy * 4, set_bytes=2 * n_copy * 4, ceiling_gbps=here.copy_gbps))

# %% [markdown]
# The package's kernels are written the same way. Here is the kernel of the operator the next
# section times, `a·x + b`: the copy kernel with one line of arithmetic.

# %%
show_source(suite_pitfalls._axpb_kernel)

# %% [markdown]
# ## 4. Four ways to get a wrong number
#
# We time one memory-bound operator, `y = a·x + b`, the four classic wrong ways and the harness's
# way (at the large size, and at mistake 3's small one). The mistakes:
#
# 1. **no synchronize**: GPU launches return before the work is done, so a host clock measures
#    the launch (on a CPU there is nothing asynchronous to forget, so this one is harmless there);
# 2. **no warm-up**: the first call pays for compiling the Triton kernel (on the GPU) or for
#    first-touch allocation (on the CPU);
# 3. **a cache-resident input**: the same small buffer every time stays in cache, so we time the
#    cache, not memory; its honest twin is the same size rotated through buffers that together
#    exceed the cache;
# 4. **a single run**: one sample; the table shows the fastest and the slowest of thirty.
#
# The harness's `measure.time_fn` warms up, rotates through enough input sets that together they
# exceed twice the cache it sizes them on (a GPU's L2; section 3's last lines show what it rotated
# here, against this machine's own cache), brackets each call with CUDA events (or a wall clock on
# a CPU, and says so) and reports the median with its p20-p80 spread. The large input is sized on
# the machine's own cache. Each row is compared with a plain copy of the large input, timed the
# harness's way. Under the table, one line per mistake says what it did in this run, judged
# against the spread: a difference inside the p20-p80 ranges of the two timings is no difference.

# %%
d = suite_pitfalls.demo(preset)
print(pitfalls.describe_now(d, earlier_copy_gbps=here.copy_gbps))
pitfalls.plot_now(d)
plt.show()

# %% [markdown]
# **Reading the bars.** Every bar starts at the dashed line, the plain copy; on the log axis its
# length is the factor by which a timing claims more (right) or less (left) than memory delivered
# to that copy. Error bars are the p20-p80 spread of the harness's medians, the grey band the
# copy's; rows 1, 2 and 4 are single readings and have none, which is mistake 4 again. Mistake 3 is
# judged against its own twin (the last row, the same small size rotated through memory), not
# against the line: the two small rows move far fewer bytes per call than the copy. On a CPU the
# mistakes that matter on a GPU may not show at all: torch works in the calling thread, so there
# is nothing to forget to synchronize, and a busy machine pauses long calls, which a wall clock
# counts.
#
# Here is the harness, the part of the package every measurement in the workbook goes through:

# %%
show_source(measure.time_fn)

# %% [markdown]
# ## 5. Fast because it is wrong
#
# Speed means nothing without correctness, so the harness checks before it times. `measure.check`
# draws **fresh random inputs** for every trial (a kernel cannot memorise one answer), **poisons**
# the output buffer with NaN first (elements a kernel forgets to write stay NaN), compares with a
# float64 reference by relative norm error, and never lets a NaN pass. Here is a kernel that
# "forgets" the last partial block, a classic off-by-one in the grid size:

# %%
def axpb_forgets_tail(x, out):
    n_full = (x.numel() // 1024) * 1024          # bug: the grid should be cdiv(n, 1024)
    out[:n_full] = 2.0 * x[:n_full] + 1.0
    return out

make = lambda seed: {"x": torch.randn(5000, generator=torch.Generator().manual_seed(seed))}
make_out = lambda inp: torch.empty_like(inp["x"])
print(measure.check(axpb_forgets_tail, lambda x: 2.0 * x + 1.0, make, make_out=make_out).summary())
print(measure.check(lambda x, out: suite_pitfalls.axpb(x, out=out), lambda x: 2.0 * x + 1.0, make,
                    make_out=make_out).summary())

# %% [markdown]
# ## 6. On a GPU
#
# The same seven timings, recorded on an H200 (percentages of the copy ceiling recorded there). The
# lines under the figure read them as section 4's lines read this machine's.

# %%
pitfalls.plot_recorded()
plt.show()
print(pitfalls.recorded_summary())

# %% [markdown]
# ## Exercises
#
# Fill in each function and run the cell after it: the checker draws fresh inputs every time and
# says what is wrong. Solutions are in `minimax_lab/exercises/solutions/ch00.py` (try first).
#
# **00.1 The tile mask.** The copy kernel's mask in two dimensions: the mask a matrix kernel needs
# on its right and bottom edge tiles. The checker compares your mask with the rows and columns inside
# the matrix, on fresh ragged sizes and every kind of edge tile.

# %%
def tile_mask(pid_m: int, pid_n: int, block_m: int, block_n: int, M: int, N: int) -> torch.Tensor:
    """A 2-D kernel copies an ``(M, N)`` matrix tile by tile: program ``(pid_m, pid_n)`` handles the
    rows ``pid_m*block_m ... pid_m*block_m + block_m - 1`` and the columns
    ``pid_n*block_n ... pid_n*block_n + block_n - 1``. Tiles on the right and bottom edges overhang
    the matrix. Return a bool tensor of shape ``(block_m, block_n)``: True where the element lies
    inside the matrix (the kernel loads and stores it), False where it overhangs."""
    raise NotImplementedError  # your code here (the 2-D version of the copy kernel's `offs < n`)

# %%
exercises.check("00.1", tile_mask)

# %% [markdown]
# **00.2 FLOPs and bytes of a matrix product.** The two numbers that place an operator on the
# roofline (compare your intensity for a square product with the GEMM row of the table above; try
# `M = 1` too: a decode step's matrix-vector product). The checker compares both numbers on fresh sizes,
# a decode product and a large square among them.

# %%
def matmul_flops_bytes(M: int, N: int, K: int, bytes_per_element: int) -> tuple[float, float]:
    """``C = A @ B`` with ``A`` of shape ``(M, K)`` and ``B`` of shape ``(K, N)``, all three matrices
    stored with ``bytes_per_element`` bytes per element. Return ``(flops, bytes)``: the
    floating-point operations the product must do (a multiply and an add count as two), and the
    fewest bytes it must move through memory (each input read once, the output written once).
    Their ratio is the product's arithmetic intensity."""
    raise NotImplementedError  # your code here

# %%
exercises.check("00.2", matmul_flops_bytes)

# %% [markdown]
# **00.3 The roofline floor.** The least time an operator can take, from its two numbers and the
# machine's two ceilings. The checker compares with the larger of the two times on fresh machines and
# operators on both sides of the ridge point.

# %%
def roofline_ms(flops: float, bytes_moved: float, peak_tflops: float, bandwidth_gbps: float) -> float:
    """The least time, in milliseconds, an operator doing ``flops`` floating-point operations and
    moving ``bytes_moved`` bytes can take on a machine that does at most ``peak_tflops`` TFLOP/s
    and moves at most ``bandwidth_gbps`` GB/s (1 TFLOP/s = 1e12 FLOP/s, 1 GB/s = 1e9 B/s), when
    computing and moving overlap perfectly."""
    raise NotImplementedError  # your code here

# %%
exercises.check("00.3", roofline_ms)

# %% [markdown]
# **00.4 An honest timer.** The checker hands your timer a stand-in for an asynchronous GPU: calls
# return before their work is done, the first ones compile, an input used twice in a row comes
# from cache, and some calls are disturbed. Only a timer that avoids all four mistakes reads the
# work's own time. The checker draws that time anew each check and counts your calls, inputs and syncs.

# %%
def honest_time_ms(fn, make_inputs, sync, reps: int = 10, warmup: int = 3) -> float:
    """Return the median time, in milliseconds, of one call ``fn(**make_inputs(seed))`` on an
    asynchronous device. ``fn`` queues work and returns before the work is done; ``sync()``
    waits until all queued work has finished (like ``torch.cuda.synchronize``). Time it honestly:
    first call ``fn`` ``warmup`` times (the first calls compile), then time ``reps`` calls, each
    with inputs that differ from the previous call's (the same input twice in a row is served from
    cache), reading the clock (``time.perf_counter()``) only when the device is idle, and return
    the median (a few calls are disturbed by other work)."""
    raise NotImplementedError  # your code here

# %%
exercises.check("00.4", honest_time_ms)

# %% [markdown]
# **00.5 A 2-D tiled copy in Triton.** Section 3's copy kernel, grown to a matrix: a 2-D grid of
# `BLOCK_M × BLOCK_N` tiles, 00.1's mask on the edge tiles, and each matrix's own strides, so a
# transposed view or a block cut out of a bigger matrix copies as well as a contiguous one. Write
# the kernel in the cell below (the skeleton gives its arguments), then launch it in `copy_tiles`.
# The checker draws ragged sizes and strided views, surrounds each matrix with memory it watches,
# and verifies that your kernel itself reads `src` through its strides and writes `dst`: PyTorch may
# allocate around it, but here the copy is the exercise, so it may not copy the matrix.

# %%
@triton.jit
def copy_tiles_kernel(src, dst, M, N, stride_sm, stride_sn, stride_dm, stride_dn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    # your code here: the tile's rows and columns, the 2-D mask, one masked load and one masked store


def copy_tiles(src: torch.Tensor, dst: torch.Tensor, block_m: int = 16, block_n: int = 16) -> torch.Tensor:
    """Copy the ``(M, N)`` matrix ``src`` into ``dst`` (same shape, fp32, on ``runtime.kernel_device()``)
    with a ``@triton.jit`` kernel that you write above this function and launch here: one program per
    ``block_m x block_n`` tile, on a 2-D grid. Either matrix may be a view with any strides (a
    transposed matrix, a block cut out of a bigger one): pass ``src.stride(0), src.stride(1)`` and
    ``dst``'s to the kernel rather than assuming that rows are contiguous. ``M`` and ``N`` are rarely
    multiples of the tile: mask the edge tiles (00.1's mask) so that they neither read nor write
    outside the matrix. Return ``dst``."""
    raise NotImplementedError  # your code here

# %%
exercises.check("00.5", copy_tiles)

# %% [markdown]
# ## What limits us
#
# A ceiling is a measurement, not a law: the copy ceiling is one copy's median, and a kernel that
# only reads (decode) can stream slightly faster than a copy's mix of reads and writes, while a
# sparse kernel measured against dense FLOPs can pass the matmul ceiling many times over without
# the matrix units working any harder. On a CPU the picture is blurrier still: Triton's interpreter
# times numpy, not a kernel; a wall clock counts every pause the operating system makes; and a
# shared machine moves its own ceiling from run to run. So trust ratios measured in one run (a
# kernel and its peer, timed side by side, each with its spread) more than absolute times, and quote
# any number together with the machine and the versions it was measured with.

# %% [markdown]
# ---
# **Next:** [01 · Multimodal from step zero](01_multimodal_from_step_zero.ipynb)
#
# **Read more:** Williams, Waterman & Patterson, "Roofline: an insightful visual performance model for
# multicore architectures" (Communications of the ACM, 2009); Triton's
# [vector-add tutorial](https://triton-lang.org/main/getting-started/tutorials/01-vector-add.html), the
# copy kernel's closest relative; Triton's own timer,
# [`triton.testing.do_bench`](https://triton-lang.org/main/python-api/generated/triton.testing.do_bench.html),
# which also reports a median with its 20th and 80th percentiles.
#
# **Package code used here:** `minimax_lab/measure/timing.py`, `minimax_lab/measure/check.py`, `minimax_lab/bench/suite_pitfalls.py`, `minimax_lab/bench/report.py`, `minimax_lab/runtime.py`, `minimax_lab/viz/roofline.py`, `minimax_lab/viz/pitfalls.py`, `minimax_lab/exercises/ch00.py`

# %%
display(Markdown(pitfalls.provenance(preset, here, d)))
