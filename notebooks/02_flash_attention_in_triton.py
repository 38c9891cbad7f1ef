# %% [markdown]
# # 02 · FlashAttention in Triton: from naive attention to a Hopper kernel
#
# **What this chapter builds:** the online softmax, then a FlashAttention forward in Triton written in
# front of you (one tile, a loop over key tiles, the online softmax, the causal mask) and six edits,
# v1 → v6, that turn it into a Hopper kernel: each version checked here, each step measured on an H200.
#
# **It assumes:** chapter 00 (how `measure.check` and `measure.time_fn` check and time a kernel; rooflines) and
# the attention contract `q [B, S, Hq, D]`, `k, v [B, Skv, Hkv, D]` used since chapter 01.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/02_flash_attention_in_triton.ipynb)
#
# Attention is `softmax(Q Kᵀ / √d) V`. Written that way it stores an `S × S` score matrix per
# head: at 64k tokens that is 16 GiB per head in fp32. FlashAttention (Dao et al. 2022,
# arXiv 2205.14135; FlashAttention-2, arXiv 2307.08691) never stores it: it streams tiles of K and V
# past a tile of Q and keeps a running softmax. This chapter writes that kernel cell by cell, checks
# every version against the reference on fresh inputs, and sets each step's speed on an H200 beside
# SDPA (FlashAttention-2 and cuDNN) and FlexAttention.

# %%
# In Colab, install the workbook's package first (locally, `make lab` already did).
import subprocess, sys
if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "minimax-lab[notebooks] @ git+https://github.com/minimax-lab/minimax-lab"], check=True)

# %% tags=["parameters"]
preset = "auto"        # "cpu" (tiny sizes, interpreter) or "gpu" (real sizes)
block_n_demo = 12      # key-tile width of the online-softmax demo (96 keys: 8 tiles)

# %%
import functools
import math
import time

import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

from minimax_lab import exercises, measure, runtime  # first: on a CPU it turns on Triton's interpreter
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor
from minimax_lab.attention import attention
from minimax_lab.attention.online_softmax import online_attention, online_step
from minimax_lab.viz import flash, flash_checks, flash_steps
from minimax_lab.viz.source import show_source
from minimax_lab.viz.widgets import explore

t_start = time.perf_counter()
P, dev, dtype = flash_checks.setup(preset)
live = {}  # with preset "gpu": each step's timing on this GPU

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
# ## 3. A FlashAttention forward, grown in four steps
#
# A Triton kernel is a function that one **program** runs at each point of a launch **grid**, and a
# program works on whole **tiles** (blocks of a tensor) at a time: the compiler spreads each tile over the
# program's threads. Four rules shape every kernel below.
#
# * **Shapes are compile-time constants.** `tl.arange(0, N)` needs an `N` that is a power of two and known
#   when the kernel compiles. Arguments annotated `tl.constexpr` (`D`, `BLOCK_M`, `BLOCK_N`, later `CAUSAL`)
#   are such constants: Triton compiles one binary per set of their values, and an `if` on one is decided
#   when compiling, so the branch not taken is not in the binary.
# * **Masks make padding harmless.** A tile is a power of two wide even where the tensor is not:
#   `tl.load(ptrs, mask=..., other=0.0)` reads nothing where the mask is False, and `tl.store(..., mask=...)`
#   writes nothing.
# * **`tl.dot(a, b)`** multiplies an `[M, K]` tile by a `[K, N]` tile on the tensor cores and accumulates in
#   fp32. M, N and K must each be at least 16 (and powers of two): query and key tiles of 16 rows or more,
#   and a head dim of at least 16.
# * **Addresses are arithmetic.** A tensor arrives as the address of its first element, and the kernel adds
#   index × stride along each dimension, so strided views (a transposed `q`; `k` and `v` sliced out of one
#   packed tensor) need no copy.
#
# One launcher serves the four steps: one program per (query tile, batch·head). After each step a check
# runs it on fresh random inputs against the fp32 reference: batch 2, two query heads sharing one kv head,
# lengths that are no multiple of any tile, and `q`, `k`, `v` all strided views. On the CPU all of it runs
# in Triton's interpreter (numpy, one program after another, in fp32 because its bf16 `tl.dot` gives wrong
# results),
# so the sizes stay tiny.
#
# ### 3a. One tile
#
# Start where all keys fit in one tile. A program loads its `BLOCK_M` query rows and every key and value of
# its kv head (GQA: query head `h` reads kv head `h // GROUP`; nothing is copied), computes the scores with
# one `tl.dot`, the softmax of each row and `p @ v`. `BLOCK_N` is the number of keys rounded up to a power
# of two, and the **tail mask** `cols < Skv` gives the padding columns a score of −∞: they weigh nothing.

# %%
@triton.jit
def attn_one_tile(Q, K, V, O, S, Skv, H, GROUP, qk_scale,
                  stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                  stride_ob, stride_os, stride_oh,
                  D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m, bh = tl.program_id(0), tl.program_id(1)       # this program: BLOCK_M query rows of one head
    b, h = bh // H, bh % H
    hk = h // GROUP                                        # GQA: the kv head this query head reads
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)    # its query rows
    cols = tl.arange(0, BLOCK_N)                           # every key: one tile holds them all
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                mask=offs_m[:, None] < S, other=0.0)      # rows past the end are not read
    kv = b * stride_kb + hk * stride_kh + cols[:, None] * stride_ks + offs_d[None, :]
    k = tl.load(K + kv, mask=cols[:, None] < Skv, other=0.0)
    v = tl.load(V + kv, mask=cols[:, None] < Skv, other=0.0)
    s = tl.dot(q, tl.trans(k)) * qk_scale                  # [BLOCK_M, BLOCK_N] scores, in registers
    s = tl.where(cols[None, :] < Skv, s, float("-inf"))    # the tail mask
    p = tl.exp(s - tl.max(s, 1)[:, None])                  # each row's max subtracted: no overflow
    o = tl.dot(p.to(v.dtype), v) / tl.sum(p, 1)[:, None]
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :],
             o.to(O.dtype.element_ty), mask=offs_m[:, None] < S)


def launch(kernel, q, k, v, BLOCK_M=32, BLOCK_N=16, **meta):
    """Run `kernel` on q [B, S, Hq, D], k, v [B, Skv, Hkv, D] (S <= Skv): one program per (query tile,
    batch·head). `meta`: the kernel's other constexprs (CAUSAL, ...) and launch options (num_warps, ...)."""
    B, S, Hq, D = q.shape
    Skv, Hkv = k.shape[1], k.shape[2]
    assert S <= Skv and k.stride() == v.stride() and q.stride(-1) == k.stride(-1) == 1
    o = torch.empty_like(q)
    grid = (triton.cdiv(S, BLOCK_M), B * Hq)
    kernel[grid](q, k, v, o, S, Skv, Hq, Hq // Hkv, 1 / math.sqrt(D), *q.stride()[:3], *k.stride()[:3],
                 *o.stride()[:3], D=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **meta)
    return o

# %%
flash_checks.check(lambda q, k, v: launch(attn_one_tile, q, k, v, BLOCK_N=triton.next_power_of_2(k.shape[1])),
                   P, lengths=(37, 45), causal=None)

# %% [markdown]
# ### 3b. A loop over key tiles
#
# One tile cannot hold 64k keys, so walk them `BLOCK_N` at a time. A softmax needs each row's maximum
# before its first `exp`, so this version walks twice: the first pass finds the maximum, the second sums
# `exp(s − m)` and accumulates `p @ v` against it. It is right, but it loads every K tile, and multiplies
# it by Q, twice. Below the kernel, what changed since 3a.

# %%
@triton.jit
def attn_two_passes(Q, K, V, O, S, Skv, H, GROUP, qk_scale,
                    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                    stride_ob, stride_os, stride_oh,
                    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    hk = h // GROUP
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                mask=offs_m[:, None] < S, other=0.0)
    kv = b * stride_kb + hk * stride_kh + offs_d[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for start_n in range(0, Skv, BLOCK_N):                 # pass 1: each row's max
        cols = start_n + offs_n
        k = tl.load(K + kv + cols[:, None] * stride_ks, mask=cols[:, None] < Skv, other=0.0)
        s = tl.where(cols[None, :] < Skv, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_i = tl.maximum(m_i, tl.max(s, 1))
    l_i = tl.zeros([BLOCK_M], tl.float32)                  # sum of exp(s - m)
    acc = tl.zeros([BLOCK_M, D], tl.float32)               # sum of exp(s - m) * v
    for start_n in range(0, Skv, BLOCK_N):                 # pass 2: the weights against that max
        cols = start_n + offs_n
        k = tl.load(K + kv + cols[:, None] * stride_ks, mask=cols[:, None] < Skv, other=0.0)
        v = tl.load(V + kv + cols[:, None] * stride_ks, mask=cols[:, None] < Skv, other=0.0)
        s = tl.where(cols[None, :] < Skv, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        p = tl.exp(s - m_i[:, None])
        l_i += tl.sum(p, 1)
        acc += tl.dot(p.to(v.dtype), v)
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :],
             (acc / l_i[:, None]).to(O.dtype.element_ty), mask=offs_m[:, None] < S)

# %%
display(flash.show_edit(attn_one_tile, attn_two_passes))
flash_checks.check(lambda q, k, v: launch(attn_two_passes, q, k, v), P, lengths=(37, 45), causal=None)

# %% [markdown]
# ### 3c. The online softmax: one pass
#
# Section 2's recurrence merges the two passes: carry the running max, and whenever a tile raises it,
# rescale the sum and the accumulator by `α = exp(m − m')`. Every K and V tile is now loaded once.

# %%
@triton.jit
def attn_online(Q, K, V, O, S, Skv, H, GROUP, qk_scale,
                stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                stride_ob, stride_os, stride_oh,
                D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    hk = h // GROUP
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                mask=offs_m[:, None] < S, other=0.0)
    kv = b * stride_kb + hk * stride_kh + offs_d[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)    # running max
    l_i = tl.zeros([BLOCK_M], tl.float32)                  # running sum of exp(s - m)
    acc = tl.zeros([BLOCK_M, D], tl.float32)               # running sum of exp(s - m) * v
    for start_n in range(0, Skv, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(K + kv + cols[:, None] * stride_ks, mask=cols[:, None] < Skv, other=0.0)
        v = tl.load(V + kv + cols[:, None] * stride_ks, mask=cols[:, None] < Skv, other=0.0)
        s = tl.where(cols[None, :] < Skv, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)                        # rescale the past when the max grew
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :],
             (acc / l_i[:, None]).to(O.dtype.element_ty), mask=offs_m[:, None] < S)

# %%
display(flash.show_edit(attn_two_passes, attn_online))
flash_checks.check(lambda q, k, v: launch(attn_online, q, k, v), P, lengths=(37, 45), causal=None)

# %% [markdown]
# ### 3d. The causal mask: v0
#
# Causal attention, with the queries aligned to the end of the keys: query row `i` sees key `j` when
# `j ≤ i + Skv − S`. Two edits: the **causal mask** joins the tail mask, and the loop ends after the last key
# the tile's last row sees, so tiles right of the diagonal are never loaded. `CAUSAL` is a constexpr: the
# non-causal binary holds neither edit. This kernel is **v0**, where the steps of section 5 start; on a GPU
# (preset `gpu`) the cell also times it at the shape of section 5's records.

# %%
@triton.jit
def flash_fwd_v0(Q, K, V, O, S, Skv, H, GROUP, qk_scale,
                 stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                 stride_ob, stride_os, stride_oh,
                 D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    hk = h // GROUP
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                mask=offs_m[:, None] < S, other=0.0)
    kv = b * stride_kb + hk * stride_kh + offs_d[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    end = Skv
    if CAUSAL:                                             # the last key the tile's last row sees, plus one
        end = tl.minimum(Skv, (start_m + 1) * BLOCK_M + Skv - S)
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(K + kv + cols[:, None] * stride_ks, mask=cols[:, None] < Skv, other=0.0)
        v = tl.load(V + kv + cols[:, None] * stride_ks, mask=cols[:, None] < Skv, other=0.0)
        visible = cols[None, :] < Skv                      # the tail mask
        if CAUSAL:                                         # the causal mask
            visible = visible & (cols[None, :] <= offs_m[:, None] + Skv - S)
        s = tl.where(visible, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :],
             (acc / l_i[:, None]).to(O.dtype.element_ty), mask=offs_m[:, None] < S)

# %%
display(flash.show_edit(attn_online, flash_fwd_v0))
flash_v0 = functools.partial(launch, flash_fwd_v0)
flash_steps.step("v0", flash_v0, P, live, lengths=(100, 117))

# %% [markdown]
# ## 4. Which tiles a query tile visits
#
# v0 stops at the diagonal but masks every tile it visits. Only the tiles that cross the diagonal (orange)
# and the ragged end need the mask; every row of the query tile sees all of a tile left of it (blue), and
# tiles right of it (white) are never loaded. v1 splits the walk along this line. The picture is computed
# from the same loop bounds (`dense_triton.tile_schedule` mirrors them).

# %%
explore(flash.plot_tile_schedule, block_m=[128, 64], block_n=[64, 128, 32], seq_len=[1024, 2048, 512])

# %% [markdown]
# ## 5. From v0 to a Hopper kernel, edit by edit
#
# Each step below is one edit of the kernel or of its launch, with its reason and a check here on the same
# kind of inputs, then its effect as recorded on an H200 by the workbook's bench suite
# (`python -m minimax_lab.bench attention`; the lines name the shape, device and versions). The suite
# runs the package's kernel (`minimax_lab/attention/dense_triton.py`) at each step's tiles, warps, stages,
# order and loads: the loops of these cells, plus what a library needs around them (64-bit offsets, head
# dims that are not a power of two, rows that see no key, a log-sum-exp output). A step counts as a change
# only when the p20–p80 ranges of all its recorded runs and of the step before's do not overlap. With preset
# `gpu` each cell also times its own kernel here.
#
# ### v1: exp2, two loops, the longest rows first
#
# Four edits, all on the path every key tile takes:
#
# * **exp2 with the scale folded in.** `exp(x) = 2^(x·log2 e)`, and `exp2` is the GPU's native instruction:
#   fold `log2 e` into the scale once, and each score costs one multiply-add and one `exp2`.
# * **Two loops.** Section 4's blue tiles go through a loop with no compare and no `where`; only the
#   diagonal and the ragged end (orange) take the masked one. The tile's work moves into a `@triton.jit`
#   function, `tile_step`, that the kernel calls in both loops with `MASKED` a constexpr: Triton inlines
#   it and compiles each call for its value.
# * **`tl.dot(p, v, acc)`** adds the product into the rescaled accumulator inside the matmul.
# * **The longest rows first.** Under the causal mask the last query tile visits every key tile, the first
#   only one. In practice (CUDA does not promise it) the GPU starts programs in the order of their linear
#   index `program_id(0) + program_id(1) · num_programs(0)`, as many at a time as fit on the SMs; v1 maps that
#   index so that every head's last query tile starts first, then every head's second-to-last, and so on,
#   and the short tiles fill the end.
#
# Its launch: 64 × 32 tiles on 4 **warps**. A warp is 32 threads that execute one instruction together;
# `num_warps` says how many warps run one program, and the compiler splits every tile among them.

# %%
@triton.jit
def tile_step(acc, m_i, l_i, q, k, v, cols, offs_m, Skv, causal_off, qk_scale,
              MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    s = tl.dot(q, tl.trans(k))                             # raw scores: the scale goes into exp2's argument
    if MASKED:                                             # compiled into the masked loop only
        visible = cols[None, :] < Skv
        if CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + causal_off)
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)     # the running max, in log2 units
    p = tl.math.exp2(s * qk_scale - m_new[:, None])       # one multiply-add and one exp2 per score
    alpha = tl.math.exp2(m_i - m_new)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])  # the matmul adds into the rescaled acc
    return acc, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def flash_fwd_v1(Q, K, V, O, S, Skv, H, GROUP, qk_scale,
                 stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                 stride_ob, stride_os, stride_oh,
                 D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    pid = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)   # the order programs start in
    bh = pid % tl.num_programs(1)                          # batch·head fastest,
    start_m = tl.num_programs(0) - 1 - pid // tl.num_programs(1)     # every head's last query tile first
    b, h = bh // H, bh % H
    hk = h // GROUP
    qk_scale = qk_scale * 1.4426950408889634               # log2(e): exp(x) = exp2(x * log2 e)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                mask=offs_m[:, None] < S, other=0.0)
    kv = b * stride_kb + hk * stride_kh + offs_d[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    full_end = Skv                                         # keys every row of the tile sees
    end = Skv                                              # keys some row of the tile sees
    if CAUSAL:
        full_end = tl.minimum(start_m * BLOCK_M + Skv - S + 1, Skv)
        end = tl.minimum(tl.minimum((start_m + 1) * BLOCK_M, S) + Skv - S, Skv)
    full_end = full_end // BLOCK_N * BLOCK_N               # whole tiles only; the rest is masked
    for start_n in range(0, full_end, BLOCK_N):            # left of the diagonal: no mask at all
        cols = start_n + offs_n
        k = tl.load(K + kv + cols[:, None] * stride_ks)
        v = tl.load(V + kv + cols[:, None] * stride_ks)
        acc, m_i, l_i = tile_step(acc, m_i, l_i, q, k, v, cols, offs_m, Skv, Skv - S, qk_scale, False, CAUSAL)
    for start_n in range(full_end, end, BLOCK_N):          # the diagonal and the ragged end
        cols = start_n + offs_n
        k = tl.load(K + kv + cols[:, None] * stride_ks, mask=cols[:, None] < Skv, other=0.0)
        v = tl.load(V + kv + cols[:, None] * stride_ks, mask=cols[:, None] < Skv, other=0.0)
        acc, m_i, l_i = tile_step(acc, m_i, l_i, q, k, v, cols, offs_m, Skv, Skv - S, qk_scale, True, CAUSAL)
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :],
             (acc / l_i[:, None]).to(O.dtype.element_ty), mask=offs_m[:, None] < S)

# %%
display(flash.show_edit(flash_fwd_v0, flash_fwd_v1))
flash_v1 = functools.partial(launch, flash_fwd_v1, BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1)
flash_steps.step("v1", flash_v1, P, live, lengths=(100, 117))

# %% [markdown]
# ### v2: tiles for Hopper's tensor cores (an edit of the launch)
#
# No line of the kernel changes: tile sizes are constexprs, warps and stages are launch options, and Triton
# compiles a new binary for them.
#
# * **`BLOCK_M` 64 → 128.** Each K/V tile loaded serves twice as many query rows: half the K/V traffic per FLOP.
# * **8 warps, two warpgroups.** Hopper's matrix instruction (`wgmma`) is issued by a **warpgroup**, four
#   warps (128 threads) together, on 64 rows of the tile: 128 rows want two of them.
# * **`num_stages=3`: software pipelining.** The compiler rewrites the loop so that the loads of tiles `n+1`
#   and `n+2` are in flight, into buffers in shared memory, while tile `n` is multiplied.

# %%
flash_v2 = functools.partial(launch, flash_fwd_v1, BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
flash_steps.step("v2", flash_v2, P, live, lengths=(150, 171))

# %% [markdown]
# ### v3: 128 × 128 tiles (an edit of the launch)
#
# Twice the keys per trip through the loop: half as many trips, so half as many rescales of the `128 × D`
# accumulator and half as many row maxima per key.

# %%
flash_v3 = functools.partial(launch, flash_fwd_v1, BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)
flash_steps.step("v3", flash_v3, P, live, lengths=(150, 171))

# %% [markdown]
# ### v4: one head's tiles together, for L2
#
# At these tile sizes one program fills an SM's shared memory, so programs start roughly in waves of one per
# SM. With the batch·head index fastest (v1–v3), the first wave holds the last query tiles of every (batch,
# head), each reading its own head's K and V (the line below sets their bytes beside the L2 cache), and a
# head's K/V is read again in wave after wave, from memory, since the other heads' pass through L2 in
# between. v4 edits only the index map: the programs of `HEADS_TOGETHER` heads are numbered together
# (1 here: one head's query tiles, the longest first, then the next head's), so the programs in flight
# share one head's K/V and find it in L2. The figure colours each (batch·head, query tile) by the wave it
# starts in, from the kernel's index math. (The package's kernel, which the records time, calls this number
# `GROUP_H`; any number at least the count of (batch, head) pairs gives v1–v3's order, as `ALL_HEADS` does
# in v6.)

# %%
@triton.jit
def flash_fwd_v4(Q, K, V, O, S, Skv, H, GROUP, qk_scale,
                 stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                 stride_ob, stride_os, stride_oh,
                 D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                 HEADS_TOGETHER: tl.constexpr):
    pid = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)
    tiles_m, n_bh = tl.num_programs(0), tl.num_programs(1)
    first = pid // (HEADS_TOGETHER * tiles_m) * HEADS_TOGETHER   # the first (batch, head) of its group
    n_h = tl.minimum(HEADS_TOGETHER, n_bh - first)          # heads in the group (the last may be short)
    r = pid - first * tiles_m                               # this program's place in its group
    bh = first + r % n_h                                    # the group's heads alternate fastest,
    start_m = tiles_m - 1 - r // n_h                        # then its query tiles, the longest first
    b, h = bh // H, bh % H
    hk = h // GROUP
    qk_scale = qk_scale * 1.4426950408889634
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                mask=offs_m[:, None] < S, other=0.0)
    kv = b * stride_kb + hk * stride_kh + offs_d[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    full_end = Skv
    end = Skv
    if CAUSAL:
        full_end = tl.minimum(start_m * BLOCK_M + Skv - S + 1, Skv)
        end = tl.minimum(tl.minimum((start_m + 1) * BLOCK_M, S) + Skv - S, Skv)
    full_end = full_end // BLOCK_N * BLOCK_N
    for start_n in range(0, full_end, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(K + kv + cols[:, None] * stride_ks)
        v = tl.load(V + kv + cols[:, None] * stride_ks)
        acc, m_i, l_i = tile_step(acc, m_i, l_i, q, k, v, cols, offs_m, Skv, Skv - S, qk_scale, False, CAUSAL)
    for start_n in range(full_end, end, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(K + kv + cols[:, None] * stride_ks, mask=cols[:, None] < Skv, other=0.0)
        v = tl.load(V + kv + cols[:, None] * stride_ks, mask=cols[:, None] < Skv, other=0.0)
        acc, m_i, l_i = tile_step(acc, m_i, l_i, q, k, v, cols, offs_m, Skv, Skv - S, qk_scale, True, CAUSAL)
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :],
             (acc / l_i[:, None]).to(O.dtype.element_ty), mask=offs_m[:, None] < S)

# %%
display(flash.show_edit(flash_fwd_v1, flash_fwd_v4))
flash_v4 = functools.partial(launch, flash_fwd_v4, BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3,
                             HEADS_TOGETHER=1)
flash_steps.step("v4", flash_v4, P, live, lengths=(150, 171))
print(flash_steps.l2_lines())
flash_steps.plot_launch_order()
plt.show()

# %% [markdown]
# ### v5: TMA loads
#
# Hopper's **Tensor Memory Accelerator** (TMA) is a copy engine beside each SM: one thread hands it a
# tile's coordinates and a **tensor descriptor** (base address, shape, strides and tile shape, built on the
# host), and it moves the whole tile from global into shared memory while the threads compute. With pointer
# loads every thread computes addresses for its share of the tile and issues its own loads, spending
# registers and issue slots the softmax needs. TMA also writes the tile **swizzled**: the 16-byte chunks of
# each row change places (chunk `c` of row `r` goes to `c XOR (r mod 8)`), so that when the tensor cores
# read down a column, consecutive rows fall in different shared-memory banks instead of queuing on one.
#
# The edit: the launcher builds descriptors that see K and V as 2-D `[B·Skv, Hkv·D]` tensors, and the
# unmasked loop loads through them. Only that loop: its tiles never leave one (batch, kv head), so no tile
# crosses into the next batch's rows; the masked loop keeps its pointer loads. The last line divides the
# recorded throughput by the FLOPs a 128 × 128 K/V tile pair feeds per byte it brings (128): at v5's speed
# the programs consume K/V tiles about as fast as the H200's memory can copy. Served from memory alone, the
# kernel would sit at memory's limit; v4's order lets most tiles come from L2, and TMA makes each load
# cheap for the SM.

# %%
@triton.jit
def flash_fwd_v5(Q, K, V, K_desc, V_desc, O, S, Skv, H, GROUP, qk_scale,
                 stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                 stride_ob, stride_os, stride_oh,
                 D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                 HEADS_TOGETHER: tl.constexpr):
    pid = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)
    tiles_m, n_bh = tl.num_programs(0), tl.num_programs(1)
    first = pid // (HEADS_TOGETHER * tiles_m) * HEADS_TOGETHER
    n_h = tl.minimum(HEADS_TOGETHER, n_bh - first)
    r = pid - first * tiles_m
    bh = first + r % n_h
    start_m = tiles_m - 1 - r // n_h
    b, h = bh // H, bh % H
    hk = h // GROUP
    qk_scale = qk_scale * 1.4426950408889634
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                mask=offs_m[:, None] < S, other=0.0)
    kv = b * stride_kb + hk * stride_kh + offs_d[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    full_end = Skv
    end = Skv
    if CAUSAL:
        full_end = tl.minimum(start_m * BLOCK_M + Skv - S + 1, Skv)
        end = tl.minimum(tl.minimum((start_m + 1) * BLOCK_M, S) + Skv - S, Skv)
    full_end = full_end // BLOCK_N * BLOCK_N
    for start_n in range(0, full_end, BLOCK_N):
        cols = start_n + offs_n
        k = K_desc.load([b * Skv + start_n, hk * D])       # one TMA copy of the [BLOCK_N, D] tile
        v = V_desc.load([b * Skv + start_n, hk * D])
        acc, m_i, l_i = tile_step(acc, m_i, l_i, q, k, v, cols, offs_m, Skv, Skv - S, qk_scale, False, CAUSAL)
    for start_n in range(full_end, end, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(K + kv + cols[:, None] * stride_ks, mask=cols[:, None] < Skv, other=0.0)
        v = tl.load(V + kv + cols[:, None] * stride_ks, mask=cols[:, None] < Skv, other=0.0)
        acc, m_i, l_i = tile_step(acc, m_i, l_i, q, k, v, cols, offs_m, Skv, Skv - S, qk_scale, True, CAUSAL)
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :],
             (acc / l_i[:, None]).to(O.dtype.element_ty), mask=offs_m[:, None] < S)


def launch_tma(kernel, q, k, v, BLOCK_M=128, BLOCK_N=128, **meta):
    """`launch`, plus TMA descriptors of K and V seen as 2-D [B·Skv, Hkv·D] tensors, in [BLOCK_N, D] tiles."""
    B, S, Hq, D = q.shape
    Skv, Hkv = k.shape[1], k.shape[2]
    assert S <= Skv and k.stride() == v.stride() and q.stride(-1) == k.stride(-1) == 1
    assert k.stride(2) == D and k.stride(0) == Skv * k.stride(1), "K/V must be viewable as [B*Skv, Hkv*D]"
    descs = [TensorDescriptor(x, [B * Skv, Hkv * D], [x.stride(1), 1], [BLOCK_N, D]) for x in (k, v)]
    o = torch.empty_like(q)
    grid = (triton.cdiv(S, BLOCK_M), B * Hq)
    kernel[grid](q, k, v, *descs, o, S, Skv, Hq, Hq // Hkv, 1 / math.sqrt(D), *q.stride()[:3], *k.stride()[:3],
                 *o.stride()[:3], D=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **meta)
    return o

# %%
display(flash.show_edit(flash_fwd_v4, flash_fwd_v5), flash.show_edit(launch, launch_tma))
flash_v5 = functools.partial(launch_tma, flash_fwd_v5, num_warps=8, num_stages=3, HEADS_TOGETHER=1)
flash_steps.step("v5", flash_v5, P, live, lengths=(150, 171))
print(flash_steps.tma_line())

# %% [markdown]
# ### v6: autotuned
#
# `triton.autotune` wraps a kernel with a list of candidate configs. The first time it meets a new value of
# its `key` (here the lengths and causality) it runs every candidate, times each, and launches the fastest
# from then on. The candidates below vary the launch order (1, 4 or all heads together) and the pipelining
# depth. The interpreter cannot time, so on the CPU each candidate is checked instead. The H200 record of
# v6 is the package's autotuned kernel, whose list also holds 128 × 64 tiles and pointer loads; the last
# line says what it picked and whether its own timings could tell that pick from v5's config.

# %%
ALL_HEADS = 1 << 16  # more (batch, head) pairs than these launches have: one group holds all, v1-v3's order
flash_fwd_v6 = triton.autotune(
    configs=[triton.Config({"HEADS_TOGETHER": n}, num_warps=8, num_stages=s) for n in (1, 4, ALL_HEADS) for s in (2, 3)],
    key=["S", "Skv", "CAUSAL"])(flash_fwd_v5)
flash_v6 = functools.partial(launch_tma, flash_fwd_v6)
flash_steps.step("v6", flash_v6, P, live, lengths=(150, 171),
                 candidates=[functools.partial(launch_tma, flash_fwd_v5, **c.all_kwargs()) for c in flash_fwd_v6.configs])
print(flash_steps.autotune_line())

# %% [markdown]
# ## 6. On a GPU: the steps beside the libraries
#
# In the same runs as the steps, the bench suite timed SDPA's flash backend (FlashAttention-2), SDPA's cuDNN
# backend and FlexAttention compiled with a causal block mask; FLOPs count the visible triangle. Error bars
# span the p20–p80 of every recorded run. With preset `gpu` the chapter's own kernels, timed above, are
# drawn beside them.

# %%
flash_steps.plot_recorded(live)
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
# Where cuDNN is ahead (section 6 says at which sizes, and by how much), the difference is overlap. cuDNN's
# kernel is FlashAttention-3-like (Shah et al. 2024, arXiv 2407.08608): producer warps issue the TMA copies
# while two consumer warpgroups ping-pong, so one warpgroup's softmax overlaps the other's matmuls. The loop
# built here is FlashAttention-2-shaped: each warpgroup waits for its own `QKᵀ`, computes the
# exponentials, then runs `PV`, and the tensor cores idle during the exponentials. Triton can be asked for
# that split: `tl.range(..., warp_specialize=True)` lets the compiler try to partition a loop's loads,
# matmuls and other work into separate groups of warps. Triton 3.6's documentation of `tl.range` says this
# works on Blackwell GPUs and on simple matmul loops; on Hopper, two-loop causal attention kernels like
# this one were [reported](https://github.com/triton-lang/triton/issues/9728) to fail to compile with it
# (Triton 3.4), and no record here was taken with it, so this chapter claims nothing about its speed.
# Writing the warpgroups out by hand, with registers moved from the producer to the consumers as
# FlashAttention-3 does, takes Triton's lower-level Gluon dialect. The kernel built here also leaves out
# what the package's adds for a library: 64-bit offsets for tensors past 2³¹ elements, head dims that are
# not a power of two, rows that see no key (`S > Skv`), and the log-sum-exp a backward pass needs
# (exercise 02.5).

# %% [markdown]
# ---
# **Previous:** [01 · Multimodal from step zero](01_multimodal_from_step_zero.ipynb) · **Next:** [03 · MiniMax Sparse Attention](03_minimax_sparse_attention.ipynb)
#
# **Read more:** Triton's [fused-attention tutorial](https://triton-lang.org/main/getting-started/tutorials/06-fused-attention.html)
# and [Triton-Puzzles](https://github.com/srush/Triton-Puzzles); FlashAttention (arXiv 2205.14135), FlashAttention-2
# (arXiv 2307.08691) and FlashAttention-3 (arXiv 2407.08608); Milakov & Gimelshein on the online softmax (arXiv 1805.02867).
#
# **Package code used here:** `minimax_lab/attention/online_softmax.py`, `minimax_lab/attention/dense_reference.py`, `minimax_lab/attention/dense_triton.py`, `minimax_lab/bench/suite_attention.py`, `minimax_lab/viz/flash.py`, `minimax_lab/viz/flash_checks.py`, `minimax_lab/viz/flash_steps.py`, `minimax_lab/exercises/ch02.py`

# %%
display(Markdown(flash_steps.provenance(P, time.perf_counter() - t_start, live)))
