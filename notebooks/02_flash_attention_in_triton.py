# %% [markdown]
# # 02 · FlashAttention in Triton: from naive attention to a Hopper kernel
#
# **What this chapter builds:** the online softmax, a 40-line FlashAttention forward in Triton, and the
# steps (v1 → v6) that turn it into the package's kernel, each checked here and measured on an H200.
#
# **It assumes:** chapter 00 (how `measure.check` and `measure.time_fn` check and time a kernel; rooflines) and
# the attention contract `q [B, S, Hq, D]`, `k, v [B, Skv, Hkv, D]` used since chapter 01.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/02_flash_attention_in_triton.ipynb)
#
# Attention is `softmax(Q Kᵀ / √d) V`. Written that way it stores an `S × S` score matrix per
# head: at 64k tokens that is 16 GiB per head in fp32. FlashAttention (Dao et al. 2022,
# arXiv 2205.14135; FlashAttention-2, arXiv 2307.08691) never stores it: it streams tiles of K and V
# past a tile of Q and keeps a running softmax. This chapter builds that in visible steps, checks
# every step against the package on the same inputs, and ends with the package's Triton kernel
# as recorded on an H200 beside SDPA (FlashAttention-2 and cuDNN) and FlexAttention.

# %%
# In Colab, install the workbook's package first (locally, `make lab` already did).
import subprocess, sys
if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "minimax-lab[notebooks] @ git+https://github.com/minimax-lab/minimax-lab"], check=True)

# %% tags=["parameters"]
preset = "auto"        # "cpu" (tiny sizes, interpreter) or "gpu" (real sizes)
block_n_demo = 12      # key-tile width of the online-softmax demo (96 keys: 8 tiles)
time_steps = True      # time the kernel and its peers on this machine (section 7)

# %%
import math

import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

from minimax_lab import exercises, measure, runtime, triton_blocks  # first: on a CPU it turns on Triton's interpreter
import triton
import triton.language as tl
from minimax_lab.attention import attention, dense_triton
from minimax_lab.attention.online_softmax import online_attention, online_step
from minimax_lab.viz import flash, flash_steps
from minimax_lab.viz.source import show_source
from minimax_lab.viz.widgets import explore

P = runtime.resolve_preset(preset)
dev, dtype = runtime.kernel_device(), runtime.compute_dtype()
print(f"device {runtime.device_name()}, preset {P}, compute dtype {dtype}, interpreter {runtime.is_interpreter()}")

# %% [markdown]
# ## 1. Naive attention and its S×S memory
#
# The contract (used by every chapter): `q [B, S, Hq, D]`, `k, v [B, Skv, Hkv, D]`, `Hq` a multiple of
# `Hkv` (grouped-query attention), causal queries aligned to the *end* of the keys. The reference
# materializes every score in fp32: the ground truth, and the thing that does not scale.

# %%
B, S, Hq, Hkv, D = 1, runtime.pick(P, cpu=48, gpu=512), 4, 2, 32
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(B, S, h, D, generator=g).to(dev) for h in (Hq, Hkv, Hkv))
o_ref, lse_ref = attention(q, k, v, causal=True, impl="reference", return_lse=True)
scores = (q[0, :, 0].float() @ k[0, :, 0].float().T / math.sqrt(D)).cpu()
scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
if dev.type == "cuda":
    flash.plot_naive_memory(scores, memory_bytes=torch.cuda.get_device_properties(0).total_memory, memory_label="this GPU")
else:
    flash.plot_naive_memory(scores)
plt.show()

# %% [markdown]
# ## 2. The online-softmax recurrence
#
# Consume the score row tile by tile, carrying per row the running max `m`, the running sum
# `l = Σ exp(s − m)` and the unnormalized output `acc = Σ exp(s − m)·v`. When a tile raises the max
# from `m` to `m'`, what was accumulated was measured against the wrong max: multiply it by
# `α = exp(m − m')` (Milakov & Gimelshein 2018, arXiv 1805.02867). At the end `o = acc / l` and
# `lse = m + log l`. The readable version is `minimax_lab.attention.online_softmax`: its
# `online_step` is the whole recurrence in a few lines.

# %%
show_source(online_step)

# %% [markdown]
# To *see* the rescale, one query row meets keys whose scores drift upward (each key is noise plus a
# growing multiple of the query's direction), so most tiles bring a new maximum.

# %%
q1, k1, v1 = flash.drifting_row(n_keys=96, d=32)
o1, lse1, states1 = online_attention(q1, k1, v1, causal=False, block_n=block_n_demo, return_states=True)
s1 = q1[0, 0, 0] @ k1[0, :, 0].T / math.sqrt(32)                   # the row's scores
flash.plot_online_softmax(s1, states1, block_n_demo)
plt.show()

# %% [markdown]
# Orange bars are tiles that brought a new maximum (grey: the max stayed, α = 1; the first tile has
# no past to rescale). In those tiles the sum so far (black tick) shrinks to the blue
# bar before the tile's own terms (green) are added. Nothing is lost, because every term of `l` is
# measured against the same max. The recurrence must give exactly what the one-shot softmax gives;
# here on this row and on the causal, GQA inputs of section 1 (fp32 throughout: tolerance 1e-5).

# %%
torch.testing.assert_close(o1, attention(q1, k1, v1, causal=False, impl="reference"), rtol=1e-5, atol=1e-5)
o_on, lse_on = online_attention(q.cpu(), k.cpu(), v.cpu(), causal=True, block_n=16)
torch.testing.assert_close(o_on, o_ref.cpu(), rtol=1e-5, atol=1e-5)
torch.testing.assert_close(lse_on, lse_ref.cpu(), rtol=1e-5, atol=1e-5)
print(f"online vs reference: rel err {measure.relative_error(o_on, o_ref.cpu()):.1e}; "
      f"lse max abs err {(lse_on - lse_ref.cpu()).abs().max().item():.1e}")

# %% [markdown]
# ## 3. A FlashAttention forward in 40 lines of Triton
#
# The same recurrence, one Triton program per (query tile, batch·head): the program loads its
# `BLOCK_M` query rows once, then walks the key/value tiles of its kv head (GQA: query head `h`
# reads kv head `h // GROUP`, nothing is copied). The two matmuls are `tl.dot`s, which the compiler
# maps to tensor cores; the scores of one tile live in registers and never reach memory. Causal
# programs stop at the last key their last row can see. Two masks keep it honest: the **tail
# mask** (a tile that runs past `Skv` must not read or count the padding) and the **causal mask**.
#
# On the CPU this runs in Triton's interpreter (numpy, one program after another, ~1000× slower
# than a GPU, and fp32, because the interpreter's bf16 `tl.dot` is wrong), so sizes stay tiny.
# To stay at 40 lines it leaves out what the package's kernel adds (sections 5 and 6): rows that
# see no key (`S > Skv` causal), head dims that are not a power of two, 64-bit offsets for huge tensors.

# %%
@triton.jit
def flash_fwd_v0(Q, K, V, O, S, Skv, H, GROUP, qk_scale,
                 stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                 stride_ob, stride_os, stride_oh,
                 D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_m, bh = tl.program_id(0), tl.program_id(1)       # this program: BLOCK_M query rows of one head
    b, h = bh // H, bh % H
    hk = h // GROUP                                        # GQA: the kv head this query head reads
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                mask=offs_m[:, None] < S, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)    # running max
    l_i = tl.zeros([BLOCK_M], tl.float32)                  # running sum of exp(s - m)
    acc = tl.zeros([BLOCK_M, D], tl.float32)               # running sum of exp(s - m) * v
    end = Skv
    if CAUSAL:                                             # row i sees keys j <= i + Skv - S
        end = tl.minimum(Skv, (start_m + 1) * BLOCK_M + Skv - S)
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + offs_n
        kv = b * stride_kb + hk * stride_kh + cols[:, None] * stride_ks + offs_d[None, :]
        k = tl.load(K + kv, mask=cols[:, None] < Skv, other=0.0)
        v = tl.load(V + kv, mask=cols[:, None] < Skv, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        visible = cols[None, :] < Skv                      # the tail mask
        if CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + Skv - S)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)                        # rescale the past when the max grew
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :], o.to(O.dtype.element_ty),
             mask=offs_m[:, None] < S)


def flash_v0(q, k, v, causal=True, block_m=16, block_n=16):
    """Launch flash_fwd_v0 on the dense contract: q [B, S, Hq, D], k/v [B, Skv, Hkv, D], S <= Skv."""
    B, S, Hq, D = q.shape
    Skv, Hkv = k.shape[1], k.shape[2]
    assert S <= Skv and k.stride() == v.stride() and q.stride(-1) == k.stride(-1) == 1
    o = torch.empty_like(q)
    grid = (triton.cdiv(S, block_m), B * Hq)
    flash_fwd_v0[grid](q, k, v, o, S, Skv, Hq, Hq // Hkv, 1 / math.sqrt(D),
                       q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                       o.stride(0), o.stride(1), o.stride(2), D=D, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal)
    return o

# %% [markdown]
# Checked against the package's kernel (`flash_attention`; on a GPU with its default config, which
# spares the autotuner a tuning run per length) on the same fresh random inputs: ragged lengths (not
# multiples of any tile), GQA, `S < Skv` and non-causal. `measure.check` draws new inputs per trial and
# allows a relative error of 1e-3 in fp32 (the interpreter), 2e-2 in bf16.

# %%
v0_tiles = runtime.pick(P, cpu=dict(block_m=16, block_n=16), gpu=dict(block_m=64, block_n=64))
package_config = runtime.pick(P, cpu=None, gpu=dense_triton.DEFAULT_CONFIG)
D_chk, grow = runtime.pick(P, cpu=32, gpu=128), runtime.pick(P, cpu=1, gpu=27)   # GPU: ~1000-1600 tokens
for Sq, Skv, hq, hkv, causal in [(37, 37, 4, 1, True), (45, 61, 2, 2, True), (33, 50, 2, 1, False)]:
    Sq, Skv = Sq * grow, Skv * grow

    def mk(seed, Sq=Sq, Skv=Skv, hq=hq, hkv=hkv):
        g = torch.Generator(device=dev).manual_seed(seed)
        return {"q": torch.randn(1, Sq, hq, D_chk, device=dev, dtype=dtype, generator=g),
                "k": torch.randn(1, Skv, hkv, D_chk, device=dev, dtype=dtype, generator=g),
                "v": torch.randn(1, Skv, hkv, D_chk, device=dev, dtype=dtype, generator=g)}

    r = measure.check(lambda q, k, v, causal=causal: flash_v0(q, k, v, causal, **v0_tiles),
                      lambda q, k, v, causal=causal: dense_triton.flash_attention(q, k, v, causal=causal,
                                                                                config=package_config),
                    mk, trials=runtime.pick(P, cpu=1, gpu=2), reference_dtype=runtime.pick(P, cpu=torch.float32, gpu=dtype),
                    name=f"v0 S={Sq} Skv={Skv} Hq/Hkv={hq}/{hkv} causal={causal}")
    print(r.summary())
    assert r.passed, r.summary()

# %% [markdown]
# ## 4. Which tiles a query tile visits
#
# Causal attention only needs the lower triangle. Our 40-line kernel already stops at the diagonal,
# but it masks every tile it visits. The package's kernel splits the walk in two loops: tiles fully
# left of the diagonal run with **no masking** at all (no compare, no `where`), only tiles that
# cross the diagonal (or the ragged tail) run the masked loop, and tiles right of it are never
# loaded. The picture is computed from the kernel's own loop bounds (`tile_schedule` mirrors them).

# %%
explore(flash.plot_tile_schedule, block_m=[128, 64], block_n=[64, 128, 32], seq_len=[1024, 2048, 512])

# %% [markdown]
# ## 5. From 40 lines to the package's kernel: the recorded steps v1 → v6
#
# The package's kernel (`minimax_lab/attention/dense_triton.py`) is one kernel with knobs. Its first
# version differs from ours in the inner loop, shown here as the diff from our loop body to the
# package's tile step: `_tile_update` (the masks) calling `online_softmax_step` from
# `minimax_lab/triton_blocks.py`, the online-softmax step that every attention kernel of the package
# shares (Triton inlines it into each kernel when it compiles):
#
# * **exp2 with the scale folded in.** `exp(x·scale) = 2^(x·scale·log2 e)`: the host passes
#   `qk_scale = scale·log2 e`, so each score costs one multiply-add, and `exp2` is the native instruction.
# * **Two versions of the tile**, picked at compile time (`MASKED` is a `tl.constexpr`): the unmasked
#   one has no compares and no `where` on the scores. The shared step guards rows that have seen no
#   key yet (`m = -inf`, where `exp2(-inf − (-inf))` would be NaN) with one `where` per row, a case
#   our kernel cannot meet because it refuses `S > Skv`.
# * **`tl.dot(p, v, acc)`** accumulates into `acc` inside the matmul instead of adding after it.

# %%
print(flash.loop_diff(flash_fwd_v0))
x = torch.randn(1000, dtype=torch.float64) * 5
sc = 1 / math.sqrt(128)
print("\nmax |exp(x·scale) − exp2(x·(scale·log2 e))| over 1000 scores:",
      f"{(torch.exp(x * sc) - torch.exp2(x * (sc * 1.4426950408889634))).abs().max().item():.1e}")

# %% [markdown]
# The steps that follow are fixed configs of that kernel, each **one change** on top of the step
# before, recorded on the H200 in the same run as the autotuned kernel (v6) and the libraries. For
# each step: the config as a diff to the step before, the recorded throughput at S = 16k and how
# much it moved, the lines of the kernel the change acts on, and a check of that exact config here
# against the fp32 reference on ragged inputs. The interpreter ignores warps and stages, but it
# does run each step's tile shapes, launch order and TMA descriptors, so the check exercises the
# same code paths the GPU compiles.

# %%
display(Markdown(flash_steps.steps_table()))

# %% [markdown]
# ### v1: the package's kernel at small tiles
#
# 64 query rows × 32 keys per tile, 4 warps, no prefetching (`num_stages=1`), pointer loads, and
# the head index fastest in the launch order (every head's last, longest query tile, then every
# head's next one, ...). Beyond our 40 lines it has the inner loop above and the split walk of
# section 4: these are its loop bounds.

# %%
flash_steps.show_step("v1_small_tiles", P)
flash_steps.excerpt(dense_triton._flash_fwd, "causal_off = Skv - S", "end = tl.maximum(end, 0)")

# %% [markdown]
# ### v2: tiles shaped for Hopper's tensor cores
#
# A K/V tile loaded once serves `BLOCK_M` query rows, so doubling `BLOCK_M` to 128 halves the K/V
# traffic per FLOP. Hopper's `wgmma` instruction is issued by a *warpgroup* (4 warps) on 64 rows, so
# 128 rows want 8 warps (two warpgroups). `num_stages=3` lets the compiler software-pipeline the
# unmasked loop (`tl.range`): while tile `n` is multiplied, the loads of tiles `n+1` and `n+2` are in flight.

# %%
flash_steps.show_step("v2_hopper_tiles", P)
flash_steps.excerpt(dense_triton._launch, "grid = (B * Hq * triton.cdiv", "num_warps=cfg.get")

# %% [markdown]
# ### v3: 128×128 tiles
#
# Twice the keys per iteration: half as many loop trips, so half as many rescales of the
# `128 × D` accumulator and half as many row maxima per key. The line below says how far the
# recorded throughput moved.

# %%
flash_steps.show_step("v3_128x128_tiles", P)
display(flash_steps.excerpt(triton_blocks.softmax_tile_weights, "alpha = tl.math.exp2", "l_new = l_i * alpha"))
flash_steps.excerpt(triton_blocks.online_softmax_step, "acc = tl.dot", "acc = tl.dot")

# %% [markdown]
# ### v4: a launch order that keeps K/V in L2
#
# The GPU runs about one program per SM at these tile sizes (an H200 has 132 SMs). With the head
# index fastest (`GROUP_H=1024`, every head in one group), the programs running side by side are
# one or two query tiles of *every* head, each streaming its own head's K and V. `GROUP_H=1` walks
# one head's query tiles together (FlashAttention's own grid order), so the programs running side
# by side read the same K/V and find it in L2. Inside a group the longest causal rows launch first,
# so short tiles fill the tail. The arithmetic and the picture are computed from the kernel's own
# index math.

# %%
flash_steps.show_step("v4_l2_order", P)
print(flash_steps.l2_lines())
flash_steps.plot_launch_order()
plt.show()
flash_steps.excerpt(dense_triton._flash_fwd, "pid = tl.program_id(0)", "start_m = tiles_m - 1")

# %% [markdown]
# ### v5: TMA loads
#
# Hopper's Tensor Memory Accelerator copies a whole K or V tile into swizzled shared memory with
# one instruction, from a *tensor descriptor* built on the host over K/V seen as 2-D `[B·Skv, Hkv·D]`.
# With pointer loads every thread computes 64-bit addresses for its share of the tile and issues
# the copies, spending registers and issue slots the softmax needs. Only the unmasked loop uses
# TMA: its tiles never leave one (batch, kv head), so no box crosses into the next batch.
#
# Why the launch order and the loads matter here: a 128×128 K/V tile pair in bf16 is 64 KB and
# feeds `2·2·128·128·128` FLOP, 128 FLOP/byte. The line below divides the recorded throughput by
# that and sets it beside the H200's recorded copy bandwidth. Where the two are close, the K/V
# tiles could not all come from HBM at that speed: they come from L2 (v4), and loading them must
# cost the SMs as little as possible (v5).

# %%
flash_steps.show_step("v5_tma", P)
print(flash_steps.tma_line())
display(flash_steps.excerpt(dense_triton._flash_fwd, "kv_row = b * Skv", "acc, m_i, l_i = _tile_update"))
flash_steps.excerpt(dense_triton._kv_descriptor, "def _kv_descriptor", "return TensorDescriptor")

# %% [markdown]
# ### v6: autotuned
#
# `@triton.autotune` times a handful of configs on the GPU the first time it meets a head dim,
# causality and power-of-two length bucket, and keeps the fastest. When two candidates time within
# the noise of one timing, which of them it keeps is chance: the lines below compare its pick with
# v5's config in the autotuner's own timings. The candidates follow, then what it picked at each
# recorded size. In the interpreter the autotuner cannot run, so the CPU check uses the fixed
# interpreter config (16×16 tiles).

# %%
flash_steps.show_step("v6_autotuned", P)
display(flash_steps.excerpt(dense_triton, "AUTOTUNE_ROWS = [", "(128, 128, 8, 3, False, 1), (128, 64"))
Markdown(flash_steps.autotune_table())

# %% [markdown]
# ## 6. The production kernel
#
# All of it together: the shared online-softmax step (`minimax_lab/triton_blocks.py`: the tile's
# weights, then `p @ V` into the rescaled accumulator), `_tile_update` (one key tile, masked or not)
# and `_flash_fwd` (one program: its query tile, the unmasked loop, the masked loop, the epilogue that
# writes `o` and `lse`).

# %%
display(show_source(triton_blocks.softmax_tile_weights))
display(show_source(triton_blocks.online_softmax_step))
show_source(dense_triton._tile_update)

# %%
show_source(dense_triton._flash_fwd)

# %% [markdown]
# ## 7. Timing here
#
# The bench suite's own case, run here (`suite_attention.run_case`): it checks the autotuned kernel
# and the steps against the fp32 reference at a ragged length, then times them and PyTorch's SDPA
# (and, on a GPU, its cuDNN backend and FlexAttention) with the harness, in the same process. On a
# GPU this is the shape of the H200 run (causal, B = 4, S = 16k, 16 heads, D = 128), so the two can
# be read side by side. On the CPU these are wall-clock times of the *interpreter* at a tiny size,
# with two steps at 16×16 tiles: they show the harness working, not GPU speed.

# %%
measured = flash_steps.time_here(P, reps=runtime.pick(P, cpu=3, gpu=20)) if time_steps else []
print(flash_steps.measured_vs_recorded(measured))

# %% [markdown]
# ## 8. On a GPU
#
# The `attention` bench suite (`python -m minimax_lab.bench attention`) times ours and the peers in
# the same run: SDPA's flash backend (FlashAttention-2), SDPA's cuDNN backend, and FlexAttention
# compiled with a causal block mask. Causal bf16 forward, B·S = 64k tokens, 16 heads, D = 128; FLOPs
# count the visible triangle. The figure is the steps and the libraries at S = 16k, as recorded on
# the H200; `python -m minimax_lab.bench report` has every recorded size and every ratio.

# %%
if flash_steps.plot_recorded() is not None:
    plt.show()
display(Markdown(flash_steps.summary()))

# %% [markdown]
# ## Exercises
#
# Five exercises, from one line to two small kernels; each checker draws fresh random sizes and
# says what it expected. Fill in a stub, run its cell and the check below it. Solutions are in
# `minimax_lab/exercises/solutions/ch02.py` (try first).
#
# **02.1 The tail mask.** The last key tile of a ragged row runs past the end (section 3's `cols < Skv`).
# The checker compares on fresh tiles: full, ragged and past the end.

# %%
def tail_mask(start_n: int, block_n: int, n_keys: int) -> torch.Tensor:
    """The key tile that starts at column ``start_n`` covers the columns
    ``start_n, start_n + 1, ..., start_n + block_n - 1``, but only the columns below ``n_keys``
    exist. Return a bool tensor of shape ``(block_n,)``: True where the column exists (the kernel
    loads it and lets it into the softmax), False past the end."""
    raise NotImplementedError  # your code here (one line, like the kernel's `cols < Skv`)

# %%
exercises.check("02.1", tail_mask)

# %% [markdown]
# **02.2 The causal tile skip.** Which key tiles does a query tile visit, and which of them need
# the mask? Section 4's picture, for one row of tiles. The checker compares every query tile's two lists
# with the kernel's own bounds, which your answer may not call.

# %%
def kv_tiles(m: int, block_m: int, block_n: int, S: int, Skv: int) -> tuple[list[int], list[int]]:
    """Causal attention, aligned to the end of the keys: query row ``i`` (of ``S``) sees the keys
    ``j <= i + (Skv - S)`` (of ``Skv``). Query tile ``m`` holds the rows
    ``m*block_m .. min((m+1)*block_m, S) - 1``; key tile ``n`` the keys ``n*block_n .. (n+1)*block_n - 1``.

    Return ``(unmasked, masked)``: the indices of the key tiles the query tile must visit,
    split in two sorted lists. ``unmasked``: every row of the query tile sees every key of the
    tile, and all of its keys exist (< ``Skv``), so the kernel can skip the masking.
    ``masked``: some row sees some key of the tile, but not all rows see all of it (the diagonal,
    or the ragged last tile). Tiles no row sees are in neither list: the kernel never loads them."""
    raise NotImplementedError  # your code here

# %%
exercises.check("02.2", kv_tiles)

# %% [markdown]
# **02.3 The online-softmax rescale.** One tile update of `m`, `l`, `acc` (section 2), including rows
# that have not seen a key yet. The checker compares with the package's `online_step` (your answer may
# not call it) on states whose max grows, with rows that saw nothing.

# %%
def online_update(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor,  # noqa: E741 - the paper's names
                  s: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one key tile into the online-softmax state of ``R`` query rows.

    ``m [R]``: the running max of the scores seen so far (``-inf`` for a row that has seen no key);
    ``l [R]``: the running sum of ``exp(score - m)``; ``acc [R, D]``: the running sum of
    ``exp(score - m) * v``. ``s [R, N]``: this tile's scores, already scaled, ``-inf`` where masked;
    ``v [N, D]``: this tile's values. Return the new ``(m, l, acc)``; a row that has still seen
    no key keeps ``m = -inf``, ``l = 0``, ``acc = 0`` (and no NaN)."""
    raise NotImplementedError  # your code here

# %%
exercises.check("02.3", online_update)

# %% [markdown]
# **02.4 An online softmax in Triton.** A kernel of your own: one program per row, the row walked in
# tiles with the tail mask and the running max and sum. Write the kernel in the cell below (start
# from section 3's loop), then launch it in `softmax_rows`. The checker verifies that your kernel
# computes the softmax (around it PyTorch may only allocate, reshape, copy and cast: `torch.softmax`
# computes the same numbers, but it is not the exercise), on rows whose maximum lies in a later tile,
# large enough that `exp` overflows without the running max, and on a row longer than the largest
# tile Triton allows.

# %%
@triton.jit
def softmax_rows_kernel(X, Y, C, stride_x, stride_y, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    # your code here: walk the row in BLOCK_N-column tiles (running max and sum), then walk it again to write


def softmax_rows(x: torch.Tensor, block_n: int = 16) -> torch.Tensor:
    """Softmax over each row of ``x [R, C]`` (fp32, on ``runtime.kernel_device()``), computed by a
    ``@triton.jit`` kernel that you write above this function and launch here, one program per row.

    The row is longer than one tile: walk it ``block_n`` columns at a time (mask the ragged tail),
    carrying the running max ``m`` and the running sum ``l = sum(exp(x - m))``, rescaled by
    ``exp(m_old - m_new)`` whenever the max grows. A second walk writes ``exp(x - m) / l``.
    The values can be large (hundreds): exponentiating without subtracting the max overflows."""
    raise NotImplementedError  # your code here

# %%
exercises.check("02.4", softmax_rows)

# %% [markdown]
# **02.5 FlashAttention with its log-sum-exp.** The backward pass and a split-KV decode (several
# programs each take a slice of the keys, then their partial outputs are merged) need, besides
# `o`, each row's `lse = log Σ exp(s)`. Copy section 3's kernel into the cell below, add an `LSE`
# output, and store `lse` for every row after the loop: the running max and sum the kernel already
# carries give it in one line. The checker draws ragged GQA shapes, `S < Skv`, strided views, both
# causal settings and a late key scoring in the hundreds (only the running max and the rescaled sums
# survive it), compares `o` and `lse` with the reference, verifies that your kernel computed them,
# and names the usual slips.

# %%
@triton.jit
def flash_fwd_lse(Q, K, V, O, LSE, S, Skv, H, GROUP, qk_scale,
                  stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                  stride_ob, stride_os, stride_oh,
                  D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_m, bh = tl.program_id(0), tl.program_id(1)
    # your code here: flash_fwd_v0's body, then one masked store of each row's lse into LSE [B, H, S]


def flash_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention on the dense contract (``q [B, S, Hq, D]``, ``k, v [B, Skv, Hkv, D]``, fp32 on
    ``runtime.kernel_device()``, ``S <= Skv``, causal queries aligned to the end of the keys), computed
    by a ``@triton.jit`` kernel that you write above this function and launch here: start from
    section 3's ``flash_fwd_v0``. Return ``(o, lse)``: ``o`` shaped like ``q``, and ``lse [B, Hq, S]``
    (fp32), the natural log of each row's softmax denominator, ``log(sum_j exp(s_ij))`` over the keys
    ``j`` that row ``i`` sees, with ``s_ij = q_i . k_j / sqrt(D)``. The running max ``m`` and sum ``l``
    the kernel carries give it in one line. ``q`` may be a non-contiguous view; ``k`` and ``v`` share
    one layout."""
    raise NotImplementedError  # your code here

# %%
exercises.check("02.5", flash_with_lse)

# %% [markdown]
# ## What limits us
#
# Where cuDNN is ahead (the last sentence of section 8 says at which sizes, and by how much), the
# difference is overlap. cuDNN's kernel is FlashAttention-3-like (Shah et al. 2024, arXiv
# 2407.08608): producer warps issue the TMA copies while two consumer warpgroups ping-pong, so one
# warpgroup's softmax overlaps the other's matmuls. This kernel's loop is FlashAttention-2-shaped:
# each warpgroup waits for its own QKᵀ, computes the exponentials, then runs PV, and the tensor
# cores idle during the exponentials. Triton 3.6 does not express that warp specialization for
# this loop, and no launch config adds it: the autotuner chooses among configs of the same schedule.

# %% [markdown]
# ---
# **Previous:** [01 · Multimodal from step zero](01_multimodal_from_step_zero.ipynb) · **Next:** [03 · MiniMax Sparse Attention](03_minimax_sparse_attention.ipynb)
#
# **Package code used here:** `minimax_lab/attention/online_softmax.py`, `minimax_lab/attention/dense_triton.py`, `minimax_lab/triton_blocks.py`, `minimax_lab/attention/dense.py`, `minimax_lab/bench/suite_attention.py`, `minimax_lab/viz/flash.py`, `minimax_lab/viz/flash_steps.py`, `minimax_lab/exercises/ch02.py`
