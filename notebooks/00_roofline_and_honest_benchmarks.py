# %% [markdown]
# # 00 · The roofline, and benchmarks you can trust
#
# **What this chapter builds:** a Triton copy kernel, the machine's two ceilings, a roofline that places the workbook's operators, and the harness that times them honestly.
#
# **It assumes:** nothing from earlier chapters; Python, PyTorch, and what a GPU kernel launch is.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/00_roofline_and_honest_benchmarks.ipynb)
#
# Every later chapter ends with a claim like *"our kernel is 1.3× faster than PyTorch's"*. This
# chapter earns the right to make such claims. You will:
#
# 1. measure the two ceilings of the machine you are on: how many bytes per second it can move,
#    and how many floating-point operations per second it can do;
# 2. use them to draw a **roofline**, which tells you how fast any operator *could* run;
# 3. write the smallest Triton kernel, a copy, check it, and time it against those ceilings;
# 4. meet the four classic timing mistakes, each producing a wrong number next to the harness's right one;
# 5. see the harness refuse a kernel that is fast because it is wrong.
#
# On a laptop or in CI the numbers are the CPU's (Triton kernels run in its interpreter); the
# H200's recorded numbers are drawn beside them.

# %%
# In Colab, install the workbook's package first (locally, `make lab` already did).
import subprocess, sys
if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "minimax-lab[notebooks] @ git+https://github.com/minimax-lab/minimax-lab"], check=True)

# %% tags=["parameters"]
preset = "auto"  # "auto": GPU sizes on a GPU, CPU sizes otherwise; CI passes "cpu"

# %%
import os

import matplotlib.pyplot as plt
import torch
import triton
import triton.language as tl

import minimax_lab
from minimax_lab import bench, exercises, runtime
from minimax_lab.bench import suite_pitfalls as timing_pitfalls
from minimax_lab.viz.source import show_source
from minimax_lab.viz import live_vs_recorded, roofline

preset = runtime.resolve_preset(preset)
runtime.describe()

# %% [markdown]
# ## Two numbers first
#
# Before timing anything, count two things for the operator: the floating-point operations it
# must do, and the fewest bytes it must move through memory (each input read once, each output
# written once). Divide each by the machine's rate and you get two times; **the larger one is the
# floor**: no implementation runs much faster. The ratio FLOPs / bytes is the operator's
# *arithmetic intensity*.
#
# The rates are not the datasheet's: we measure them. The copy ceiling is a large
# device-to-device copy (bytes read + bytes written over time); the compute ceiling is a large
# matrix product on random data (zeros run faster on an H200 and would flatter us).

# %%
here = bench.ceilings()
print(f"measured now on {here.device}: copy {here.copy_gbps:,.1f} GB/s, matmul {here.gemm_tflops:,.2f} TFLOP/s ({here.gemm_dtype})")
print("how:", here.method)

# %%
def recorded_ceilings(device="NVIDIA H200"):
    recs = bench.load_records(device, suite="ceilings")
    copy = next((r["gbps"] for r in recs if r["case"] == "copy"), None)
    gemm = next((r["tflops"] for r in recs if r["case"].startswith("gemm")), None)
    return (copy, gemm, live_vs_recorded.commits_label(recs)) if copy and gemm else None

h200 = recorded_ceilings()
if h200:
    print(f"recorded on the NVIDIA H200 ({h200[2]}): copy {h200[0]:,.0f} GB/s, bf16 matmul {h200[1]:,.0f} TFLOP/s")
else:
    print("no H200 ceilings recorded in results/ yet: run `python -m minimax_lab.bench ceilings` on one")

# %% [markdown]
# ## The roofline
#
# Attainable speed = min(peak FLOP/s, intensity × bandwidth). Operators left of the *ridge point*
# (peak / bandwidth) are memory-bound: making them faster means moving fewer bytes, not doing
# fewer FLOPs. The operators below come from later chapters (bf16, 2 bytes per element, unless
# marked). One computation counts their FLOPs and bytes; the table and the plot both read it.

# %%
def operator(label, flops, nbytes, how):
    return {"label": label, "flops": flops, "bytes": nbytes, "intensity": flops / nbytes, "how": how}

n_el = 1 << 20                      # elements of a·x+b
L, D, G = 8192, 128, 4              # decode: keys in the context, head dim, query heads per KV head
T, E, K, d, f = 64, 128, 8, 2048, 768   # MoE decode: tokens, experts, top-k, model dim, expert FFN dim
S = 16384                           # causal attention: sequence length (head dim D)
N = 8192                            # square GEMM
W = 3 * d * f                       # weights of one expert (gate, up, down)
OPERATORS = [
    operator("a·x+b (fp32)", 2 * n_el, 8 * n_el, "2 FLOPs per element; 4 B read + 4 B written"),
    operator(f"paged decode (GQA {G})", G * 4 * D * L, 2 * D * L * 2,
             "per KV head: G query heads × 4·D per key; K and V read once"),
    operator(f"MoE decode T={T}", 2 * T * K * W, E * W * 2,
             f"2 per weight per token, T·top-{K} visits; every expert's weights read once"),
    operator("causal attn 16k", 2 * S * S * D, 4 * S * D * 2,
             "per head: half of 2 matmuls of 2·S²·D; Q, K, V read and O written once"),
    operator(f"GEMM {N}³", 2 * N**3, 3 * N * N * 2, "2·n³; A, B read and C written once"),
]
print(f"{'operator':26s} {'FLOPs':>10s} {'bytes':>10s} {'intensity':>10s}   how counted")
for o in OPERATORS:
    print(f"{o['label']:26s} {o['flops']:10.3g} {o['bytes']:10.3g} {o['intensity']:10,.1f}   {o['how']}")

# %%
devices = [{"label": f"measured now on {here.device}", "copy_gbps": here.copy_gbps, "gemm_tflops": here.gemm_tflops}]
if h200:
    devices.insert(0, {"label": f"recorded on the H200 ({h200[2]})", "copy_gbps": h200[0], "gemm_tflops": h200[1],
                       "style": "--"})
roofline.plot_roofline(devices, [{"label": o["label"], "intensity": o["intensity"]} for o in OPERATORS],
                       title=f"Roofline: what each operator could reach ({'on the H200' if h200 else 'here'})")
plt.show()

# %% [markdown]
# The two decode operators share one intensity (nested markers): each weight or key that comes
# from memory is used by only a handful of queries or tokens, so, like `a·x+b`, they sit left of
# the ridge, memory-bound; their kernels (chapters 03 to 05) are judged in GB/s against the copy
# ceiling. Long causal attention and the large GEMM sit right of it and are judged in TFLOP/s
# against the matmul ceiling.
#
# ## The smallest kernel: a copy
#
# A Triton kernel is a function run by many *programs* at once; each program handles one block
# of `BLOCK` elements. The copy is six lines: find this program's offsets, **mask** the ones past
# the end (the last block overhangs whenever `n` is not a multiple of `BLOCK`), load, store. Its
# speed is the copy ceiling's business: it does no arithmetic at all.

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
# in every case), with `bench.check`: fresh random inputs per trial, and the output buffer
# poisoned with NaN first, so an element the kernel forgets to write cannot pass. A copy must be
# exact: tolerance 0.

# %%
drawn = []

def ragged(seed):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 3 * BLOCK, (1,), generator=g)) | 1        # odd: never a multiple of BLOCK
    drawn.append(n)
    return {"x": torch.randn(n, generator=g).to(kdev)}

res = bench.check(triton_copy, lambda x: x.clone(), ragged, make_out=lambda inp: torch.empty_like(inp["x"]),
                  tol=0.0, trials=4, name="copy_kernel")
print(res.summary())
print("sizes drawn:", drawn, f"(BLOCK = {BLOCK})")

# %% [markdown]
# Now time it beside `torch.Tensor.copy_`, with the package's harness `bench.time_fn` (why each
# of its steps matters is the next section's subject). Bandwidth counts the bytes read plus the
# bytes written.

# %%
n_copy = runtime.pick(preset, cpu=1 << 21, gpu=64 << 20)

def make_copy(seed):
    x = torch.randn(n_copy, device=kdev, generator=torch.Generator(kdev).manual_seed(seed))
    return {"x": x, "out": torch.empty_like(x)}

reps = runtime.pick(preset, cpu=10, gpu=100)
t_triton = bench.time_fn(triton_copy, make_copy, reps=reps)
t_torch = bench.time_fn(lambda x, out: out.copy_(x), make_copy, reps=reps)
moved = 2 * n_copy * 4
for name, t in (("Triton copy_kernel", t_triton), ("torch copy_", t_torch)):
    print(f"{name:20s} {t.ms:9.3f} ms  {moved / (t.ms * 1e-3) / 1e9:9.2f} GB/s  ({t.method}, {t.input_sets} input sets)")
if runtime.is_interpreter():
    print("On the CPU the Triton kernel runs in the interpreter (numpy per program): its time is the "
          "interpreter's, not a kernel's. On a GPU the two land close to the copy ceiling.")

# %% [markdown]
# The package's kernels are written the same way. Here is the kernel of the operator the next
# section times, `a·x + b`: the copy kernel with one line of arithmetic, and the harness's timer.

# %%
show_source(timing_pitfalls._axpb_kernel)

# %%
show_source(bench.time_fn)

# %% [markdown]
# ## Four ways to get a wrong number
#
# We time one memory-bound operator, `y = a·x + b`, five ways. The first four are mistakes:
#
# 1. **no synchronize**: GPU launches return before the work is done, so a host clock measures
#    the launch (on a CPU this mistake is harmless: there is nothing asynchronous to forget);
# 2. **no warm-up**: the first call pays for compiling the Triton kernel (on the GPU) or for
#    first-touch allocation (on the CPU);
# 3. **a cache-resident input**: the same small buffer every time stays in cache, so we time the
#    cache, not memory; its honest twin is the same size rotated through buffers that together
#    exceed the cache (its size, read from the running device, is printed below);
# 4. **a single run**: one sample; look at how far apart thirty of them land.
#
# The harness's `bench.time_fn` warms up, rotates through input sets that together exceed twice
# the cache, brackets each call with CUDA events (or a wall clock on a CPU, and says so) and takes
# the median. The large input is twice the cache or more, so its honest number is memory's.

# %%
cache, cache_name = runtime.cache_bytes()
print(f"cache to overflow on {runtime.device_name()}: {cache_name}, {cache / 2**20:.0f} MiB")
d = timing_pitfalls.demo(preset)
single = sorted(d["single_runs_ms"])
big, small = d["bytes"], d["cache_bytes"]
rows = [("1. no synchronize", d["no_sync_ms"], big, False),
        ("2. no warm-up (first call)", d["first_call_ms"], big, False),
        ("4. single run (fastest of 30)", single[0], big, False),
        ("4. single run (slowest of 30)", single[-1], big, False),
        ("harness median", d["honest_ms"], big, True),
        ("3. cache-resident input (small)", d["cache_resident_ms"], small, False),
        ("harness, same small size rotated", d["cache_rotating_ms"], small, True)]
ceiling = d["copy_gbps"]   # a plain copy of the large input, timed the harness's way
print(f"input: large {big / 2**20:.0f} MiB moved per call, small {small / 2**20:.0f} MiB; "
      + (f"torch on {d['threads']} thread" if d["threads"] else "Triton kernel on the GPU"))
print(f"{'timing':34s} {'ms':>9s} {'GB/s':>9s} {'% of copy':>10s}")
for name, ms, nbytes, _ in rows:
    gbps = nbytes / (ms * 1e-3) / 1e9
    print(f"{name:34s} {ms:9.4f} {gbps:9.1f} {100 * gbps / ceiling:9.0f}%")
print("harness:", d["honest_method"])
if d["threads"] and hasattr(os, "getloadavg"):
    load, cores = os.getloadavg()[0], os.cpu_count()
    print(f"CPU load average {load:.1f} on {cores} cores"
          + (": other processes share the cores, so a long call is often paused for them" if load > 0.7 * cores else ""))

# %% [markdown]
# **Reading the percentages.** The ceiling here is a plain copy of the large input timed the same
# way (the dashed line). A bar past it is not memory's speed: the small cache-resident input is
# served from the cache, which is several times faster than memory (that is mistake 3's point),
# and on a GPU the no-synchronize bar divides the bytes by the launch time alone. On a CPU two
# more things can put a bar past the line. Rows 1, 2 and 4 are single samples, and one of them
# can beat the copy's *median*: that is mistake 4 itself. And on a busy CPU (see the load printed
# above) a call of several milliseconds, like the large copy, is often paused while another
# process runs, which a wall clock counts; a call of a tenth of a millisecond rarely is. So the
# small rotated row can pass the large copy there: it is a busy machine's number, not memory's.
# On a quiet machine, and on a GPU, the harness's rows stay at or below the copy.

# %%
roofline.plot_timings(rows, ceiling, title=f"a·x+b measured now on {d['device']}: what each timing claims",
                      ceiling_label="copy of the large input, same harness")
plt.show()

# %% [markdown]
# ### The same five timings, recorded on the H200
#
# On the GPU the mistakes are dramatic: mistake 1 reports the launch latency, mistake 2 the
# compiler. These records come from `python -m minimax_lab.bench pitfalls` on the H200; the
# percentage is of the copy ceiling recorded there, and the last column says what each timing
# really measured.

# %%
MEASURED = {"no_sync": "the launch only: bytes / launch time is no bandwidth",
            "no_warmup": "the Triton compiler plus one run",
            "single_run_min": "one lucky sample", "single_run_max": "one unlucky sample",
            "honest": "memory: the harness's number",
            "cache_resident": "the L2 cache, not memory", "cache_rotating": "memory: the harness's number"}
recorded = {r["case"]: r for r in bench.load_records("NVIDIA H200", suite="pitfalls")}
if "cache_rotating" in recorded:
    order = list(MEASURED)
    rows_h200 = [(k, recorded[k]["ms"], recorded[k]["gbps"] * 1e6 * recorded[k]["ms"], k in ("honest", "cache_rotating"))
                 for k in order]
    print(f"{'case':16s} {'ms':>9s} {'GB/s':>7s} {'% copy':>7s} {'n':>12s}   what it measured")
    for k in order:
        r = recorded[k]
        print(f"{k:16s} {r['ms']:9.4f} {r.get('gbps', 0):7.0f} {r.get('pct_of_ceiling', 0):6.0f}% {r['shape']['n']:12,}   {MEASURED[k]}")
    h200_copy = {r["case"]: r for r in bench.load_records("NVIDIA H200", suite="ceilings")}.get("copy", {}).get("gbps")
    roofline.plot_timings(rows_h200, h200_copy,
                          title=f"a·x+b, recorded on the H200 ({live_vs_recorded.commits_label(list(recorded.values()))})")
    plt.show()
else:
    print("no H200 records for the 'pitfalls' suite in results/ yet")

# %% [markdown]
# ## When a record says more than 100%
#
# Every record carries `pct_of_ceiling`: its TFLOP/s as a share of the measured matmul ceiling,
# or its GB/s as a share of the copy ceiling. Some recorded values pass 100%, and each has a
# reason you should know before you quote it:
#
# * **far past 100% of the matmul ceiling** (sparse attention prefill, chapter 03): the FLOPs
#   counted are those of *dense* causal attention, which the sparse kernel mostly skips. The
#   percentage says how much faster than dense-at-peak it finished, not how busy the matrix
#   units were;
# * **a few % past the copy ceiling** (decode kernels, chapters 03-05): the copy ceiling is a
#   copy, half reads and half writes. A decode kernel almost only reads, and memory streams pure
#   reads slightly faster than a read/write mix (no turnarounds between the two), so a copy is a
#   close ceiling for it, not an exact one;
# * **the pitfalls' no-synchronize row**: a mistake, shown as one.
#
# The table lists the recorded ones, grouped by suite and ceiling.

# %%
over = {}
for r in bench.load_records("NVIDIA H200"):
    if (r.get("pct_of_ceiling") or 0) > 100:
        over.setdefault((r["suite"], r["ceiling"]), []).append(r)
print(f"{'suite':10s} {'ceiling':8s} {'records':>8s} {'highest %':>10s}   highest case")
for (suite, ceil_name), recs in sorted(over.items()):
    top = max(recs, key=lambda r: r["pct_of_ceiling"])
    print(f"{suite:10s} {ceil_name:8s} {len(recs):8d} {top['pct_of_ceiling']:9.0f}%   {top['case']} [{top['impl']}]")
if not over:
    print("no recorded value passes its ceiling")

# %% [markdown]
# ## Fast because it is wrong
#
# Speed means nothing without correctness, so the harness checks before it times. `bench.check`
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
print(bench.check(axpb_forgets_tail, lambda x: 2.0 * x + 1.0, make, make_out=make_out).summary())
print(bench.check(lambda x, out: timing_pitfalls.axpb(x, out=out), lambda x: 2.0 * x + 1.0, make, make_out=make_out).summary())

# %% [markdown]
# ## Exercises
#
# Fill in each function and run the cell after it: the checker draws fresh inputs every time and
# says what is wrong. Solutions are in `minimax_lab/exercises/solutions/ch00.py`.
#
# **00.1 The tile mask.** The copy kernel's mask in two dimensions: the mask a matrix kernel needs
# on its right and bottom edge tiles.

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
# `M = 1` too: a decode step's matrix-vector product).

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
# machine's two ceilings.

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
# work's own time.

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
# ## Running the benchmarks on a GPU
#
# ```
# python -m minimax_lab.bench all          # every suite: checks, times ours and the peers, records
# python -m minimax_lab.bench ceilings msa # just some suites
# ```
#
# Each suite prints a table and appends records (commit, versions, shape, dtype, ms, TFLOP/s or
# GB/s, % of the measured ceiling, speed-up against each peer timed *in the same run*) to
# `results/<gpu-name>.json`, which the notebooks read. A ratio measured in one run holds across
# machines; an absolute time does not.

# %% [markdown]
# ---
# **Next:** [01 · Multimodal from step zero](01_multimodal_from_step_zero.ipynb)
#
# **Package code used here:** `minimax_lab/bench/`, `minimax_lab/bench/suite_pitfalls.py`, `minimax_lab/runtime.py`, `minimax_lab/viz/roofline.py`, `minimax_lab/exercises/ch00.py`
