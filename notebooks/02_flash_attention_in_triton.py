# %% [markdown]
# # 02 · FlashAttention in Triton: from naive attention to a Hopper kernel, measured against the libraries
#
# **What this chapter builds:** the online softmax, then a 40-line FlashAttention forward in Triton, then the
# recorded steps (v1 → v6) that turn it into the package's kernel, each checked, with its H200 number.
#
# **It assumes:** chapter 00 (how `bench.check` and `bench.time_fn` check and time a kernel; rooflines) and
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
time_steps = True      # time each step on this machine

# %%
import difflib
import inspect
import math
import textwrap
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import Markdown
from tqdm.auto import tqdm

import minimax_lab
from minimax_lab import bench, exercises, runtime   # runtime first: it picks the Triton interpreter on a CPU
import triton
import triton.language as tl

from minimax_lab.attention import attention
from minimax_lab import triton_blocks
from minimax_lab.attention import dense_triton
from minimax_lab.bench.suite_attention import STEP_CONFIGS, attention_flops, case_name
from minimax_lab.attention.dense_triton import flash_attention, launch_order, tile_schedule
from minimax_lab.attention.online_softmax import SoftmaxState, online_attention, online_step
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
B, S, Hq, Hkv, D = 1, P == "gpu" and 512 or 48, 4, 2, 32
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(B, S, h, D, generator=g).to(dev) for h in (Hq, Hkv, Hkv))
o_ref, lse_ref = attention(q, k, v, causal=True, impl="reference", return_lse=True)
scores = (q[0, :, 0].float() @ k[0, :, 0].float().T / math.sqrt(D)).cpu()
scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))

seq = np.array([2**i for i in range(10, 18)])
hbm_gib = (torch.cuda.get_device_properties(0).total_memory if dev.type == "cuda" else 141e9) / 2**30
fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
ax[0].imshow(torch.softmax(scores, -1).numpy(), cmap="magma")
ax[0].set(title=f"causal attention probabilities (head 0, S={S})", xlabel="key", ylabel="query")
ax[1].loglog(seq, seq**2 * 4 / 2**30, "o-", label="naive: S×S fp32 scores, per head")
ax[1].loglog(seq, seq * (4 * 128 * 2 + 8) / 2**30, "s-", label="flash: only Q, K, V, O (bf16) + m, l, per head")
ax[1].axhline(hbm_gib, color="gray", ls="--",
              label=f"{'this GPU' if dev.type == 'cuda' else 'H200'}: {hbm_gib:.0f} GiB of memory")
ax[1].set(xlabel="sequence length S (tokens)", ylabel="memory (GiB)", title="memory of one head's attention (D=128)")
ax[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
plt.tight_layout(); plt.show()

# %% [markdown]
# ## 2. The online-softmax recurrence
#
# Consume the score row tile by tile, carrying per row the running max `m`, the running sum
# `l = Σ exp(s − m)` and the unnormalized output `acc = Σ exp(s − m)·v`. When a tile raises the max
# from `m` to `m'`, what was accumulated was measured against the wrong max: multiply it by
# `α = exp(m − m')` (Milakov & Gimelshein 2018, arXiv 1805.02867). At the end `o = acc / l` and
# `lse = m + log l`. The readable version is `minimax_lab.attention.online_softmax`.
#
# To *see* the rescale, one query row meets keys whose scores drift upward (each key is noise plus a
# growing multiple of the query's direction), so most tiles bring a new maximum.

# %%
Skv_demo, D_demo = 96, 32
gd = torch.Generator().manual_seed(1)
q1 = torch.randn(1, 1, 1, D_demo, generator=gd)
drift = torch.linspace(0, 0.8, Skv_demo)[None, :, None, None] * q1 / q1.norm() * math.sqrt(D_demo)
k1 = torch.randn(1, Skv_demo, 1, D_demo, generator=gd) + drift
v1 = torch.randn(1, Skv_demo, 1, D_demo, generator=gd)
o1, lse1, states1 = online_attention(q1, k1, v1, causal=False, block_n=block_n_demo, return_states=True)
s1 = (q1[0, 0, 0] @ k1[0, :, 0].T / math.sqrt(D_demo))                  # the row's scores
m = np.array([st.m.item() for st in states1]); l = np.array([st.l.item() for st in states1])  # noqa: E741
m_prev = np.concatenate([[-np.inf], m[:-1]]); l_prev = np.concatenate([[0.0], l[:-1]])
alpha = np.exp(m_prev - m)                                             # rescale factor of the past
tiles = np.arange(len(states1))

fig, ax = plt.subplots(1, 3, figsize=(13, 3.4))
ax[0].plot(s1.numpy(), ".", color="tab:gray", label="score s")
ax[0].step((tiles + 1) * block_n_demo - 0.5, m, where="pre", color="tab:red", label="running max m")
for t in tiles:
    ax[0].axvline(t * block_n_demo - 0.5, color="k", lw=0.3)
ax[0].set(xlabel="key index (thin lines: tile edges)", ylabel="scaled score", title="the max grows tile by tile")
ax[0].legend(fontsize=8, loc="upper left")
ax[1].bar(tiles[1:], alpha[1:], color=["tab:orange" if a < 0.999 else "tab:gray" for a in alpha[1:]])
ax[1].set(xlabel="key tile", ylabel="α = exp(m_old − m_new)", ylim=(0, 1.1),
          title=f"rescale: {int((alpha[1:] < 0.999).sum())} of {len(tiles) - 1} later tiles shrink the past")
ax[2].bar(tiles, l_prev * np.where(np.isfinite(alpha), alpha, 0), color="tab:blue", label="past sum, rescaled: l·α")
ax[2].bar(tiles, l - l_prev * np.where(np.isfinite(alpha), alpha, 0), bottom=l_prev * np.where(np.isfinite(alpha), alpha, 0),
          color="tab:green", label="this tile: Σ exp(s − m_new)")
ax[2].plot(tiles, l_prev, "k_", ms=14, mew=2, label="past sum before the rescale")
ax[2].set(xlabel="key tile", ylabel="running sum l", title="l after each tile")
ax[2].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
plt.tight_layout(); plt.show()

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
print(f"online vs reference: rel err {bench.relative_error(o_on, o_ref.cpu()):.1e} (demo row: "
      f"{bench.relative_error(o1, attention(q1, k1, v1, causal=False, impl='reference')):.1e}); "
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
# To stay at 40 lines it leaves out what the package's kernel adds (section 4): rows that see no key
# (`S > Skv` causal), head dims that are not a power of two, 64-bit offsets for huge tensors.

# %%
@triton.jit
def flash_fwd_v0(Q, K, V, O, S, Skv, H, GROUP, qk_scale,
                 sqb, sqs, sqh, skb, sks, skh, sob, sos, soh,
                 D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_m, bh = tl.program_id(0), tl.program_id(1)       # this program: BLOCK_M query rows of one head
    b, h = bh // H, bh % H
    hk = h // GROUP                                        # GQA: the kv head this query head reads
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :], mask=offs_m[:, None] < S, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)    # running max
    l_i = tl.zeros([BLOCK_M], tl.float32)                  # running sum of exp(s - m)
    acc = tl.zeros([BLOCK_M, D], tl.float32)               # running sum of exp(s - m) * v
    end = Skv
    if CAUSAL:                                             # row i sees keys j <= i + Skv - S
        end = tl.minimum(Skv, (start_m + 1) * BLOCK_M + Skv - S)
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + offs_n
        kv = b * skb + hk * skh + cols[:, None] * sks + offs_d[None, :]
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
    tl.store(O + b * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :], o.to(O.dtype.element_ty),
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
# Checked against the package's kernel (`attention(impl="triton")`; on a GPU with its default config,
# which spares the autotuner a tuning run per length) on the same fresh random inputs: ragged
# lengths (not multiples of any tile), GQA, `S < Skv` and non-causal. `bench.check` draws new
# inputs per trial and allows a relative error of 1e-3 in fp32 (the interpreter), 2e-2 in bf16.

# %%
v0_tiles = dict(block_m=16, block_n=16) if P == "cpu" else dict(block_m=64, block_n=64)
if P == "cpu":
    package_kernel = lambda q, k, v, causal: attention(q, k, v, causal=causal, impl="triton")  # noqa: E731
else:   # its default config: the autotuner would tune again for every new length bucket
    package_kernel = lambda q, k, v, causal: flash_attention(q, k, v, causal=causal, config=dense_triton.DEFAULT_CONFIG)  # noqa: E731
D_chk = 32 if P == "cpu" else 128
for (Sq, Skv, hq, hkv, causal) in [(37, 37, 4, 1, True), (45, 61, 2, 2, True), (33, 50, 2, 1, False)]:
    if P == "gpu":
        Sq, Skv = Sq * 27, Skv * 27                  # ~1000-1600 tokens: ragged, and still quick

    def mk(seed, Sq=Sq, Skv=Skv, hq=hq, hkv=hkv):
        g = torch.Generator(device=dev).manual_seed(seed)
        return {"q": torch.randn(1, Sq, hq, D_chk, device=dev, dtype=dtype, generator=g),
                "k": torch.randn(1, Skv, hkv, D_chk, device=dev, dtype=dtype, generator=g),
                "v": torch.randn(1, Skv, hkv, D_chk, device=dev, dtype=dtype, generator=g)}

    r = bench.check(lambda q, k, v, causal=causal: flash_v0(q, k, v, causal, **v0_tiles),
                    lambda q, k, v, causal=causal: package_kernel(q, k, v, causal=causal),
                    mk, trials=1 if P == "cpu" else 2, reference_dtype=torch.float32 if P == "cpu" else dtype,
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
def draw_schedule(block_m=128, block_n=64, seq_len=1024):
    grid = tile_schedule(seq_len, seq_len, block_m, block_n, causal=True)
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.imshow(grid, cmap=plt.matplotlib.colors.ListedColormap(["white", "tab:blue", "tab:orange"]), vmin=0, vmax=2)
    n_fast, n_mask = int((grid == 1).sum()), int((grid == 2).sum())
    ax.set(title=f"S={seq_len}, {block_m}×{block_n} tiles\nblue: unmasked {n_fast}, orange: masked {n_mask}, "
           f"white: skipped {int((grid == 0).sum())}", xlabel="key tile", ylabel="query tile")
    plt.tight_layout(); plt.show()

explore(draw_schedule, block_m=[128, 64], block_n=[64, 128, 32], seq_len=[1024, 2048, 512])

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
src_v0 = inspect.getsource(getattr(flash_fwd_v0, "fn", flash_fwd_v0))   # the Python function under @triton.jit
body_v0 = textwrap.dedent(src_v0[src_v0.index("        s = tl.dot"):src_v0.index("        m_i = m_new")])
src_tile = show_source(dense_triton._tile_update).text
src_weights = show_source(triton_blocks.softmax_tile_weights).text
src_step = show_source(triton_blocks.online_softmax_step).text
body_tile = textwrap.dedent(   # the masks, then the shared step with its two functions inlined
    src_tile[src_tile.index("    qk = tl.dot"):src_tile.index("    return online_softmax_step")]
    + src_weights[src_weights.index("    m_new ="):src_weights.index("    return p")]
    + src_step[src_step.index("    acc = tl.dot"):src_step.index("    return acc")])
print("\n".join(difflib.unified_diff(body_v0.splitlines(), body_tile.splitlines(), "our flash_fwd_v0 loop body",
                                     "the package: _tile_update + triton_blocks.online_softmax_step",
                                     lineterm="", n=1)))
x = torch.randn(1000, dtype=torch.float64) * 5
sc = 1 / math.sqrt(128)
print("\nmax |exp(x·scale) − exp2(x·(scale·log2 e))| over 1000 scores:",
      f"{(torch.exp(x * sc) - torch.exp2(x * (sc * 1.4426950408889634))).abs().max().item():.1e}")

# %% [markdown]
# The steps that follow are the package's `STEP_CONFIGS["gpu"]` (`minimax_lab/bench/suite_attention.py`):
# fixed configs of that kernel, each **one change** on top of the step before, recorded on the H200
# in the same run as the autotuned kernel (v6) and the libraries. For each step: the config as a
# diff to the step before, the recorded throughput at S = 16k, the lines of the kernel the change
# acts on, and a check of that exact config here against the fp32 reference on ragged inputs.
# The interpreter ignores warps and stages, but it does run each step's tile shapes, launch order
# and TMA descriptors, so the check exercises the same code paths the GPU compiles.

# %%
recs = bench.load_records("NVIDIA H200", suite="attention")
STEPS = {**STEP_CONFIGS["gpu"], "v6_autotuned": None}     # v1..v5: fixed configs; v6: the autotuner's pick
steps_case = next((r["case"] for r in recs if r["impl"].startswith("triton_v")), None)
l2_bytes = runtime.l2_cache_bytes() if dev.type == "cuda" else 50 * 2**20   # the H200's L2


def recorded(impl, case=None):
    """The recorded H200 record of ``impl`` at ``case`` (the steps' case by default), or None."""
    return next((r for r in recs if r["case"] == (case or steps_case) and r["impl"] == impl), None)


def step_config(name):
    if name == "v6_autotuned":  # what the autotuner picked at the steps' size, as recorded
        return dict((recorded("triton") or {}).get("config") or {})
    return dict(STEPS[name])


def check_step(name):
    """This step's config (v6: the autotuned kernel) against the fp32 reference on ragged inputs."""
    cfg = step_config(name) if name != "v6_autotuned" else None
    Sc = 200 if P == "cpu" else 1000              # the GPU check shape is section 7's: kernels compiled once
    hq, hkv, dc = (2, 1, 32) if P == "cpu" else (16, 16, 128)

    def mk(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        return {n: torch.randn(1, Sc, hq if n == "q" else hkv, dc, device=dev, dtype=dtype, generator=g) for n in "qkv"}
    fn = (lambda q, k, v: flash_attention(q, k, v, config=cfg)) if cfg else (lambda q, k, v: attention(q, k, v, impl="triton"))
    return bench.check(fn, lambda q, k, v: attention(q, k, v, impl="reference"), mk, trials=1,
                       reference_dtype=torch.float32, name=f"{name} at S={Sc}, Hq/Hkv={hq}/{hkv}, D={dc}")


def show_step(name):
    """The step's config as a diff to the one before, its recorded number, and its check here."""
    names = list(STEPS)
    prev = names[names.index(name) - 1] if names.index(name) else None
    fmt = lambda cfg: [f"{k} = {cfg[k]}" for k in sorted(cfg)]  # noqa: E731
    if prev is None:
        print(f"{name}:\n" + "\n".join("  " + line for line in fmt(step_config(name))))
    else:
        diff = list(difflib.unified_diff(fmt(step_config(prev)), fmt(step_config(name)), prev, name, lineterm="", n=9))
        print("\n".join(diff) or f"{name}: the same config as {prev}")
    now, before = recorded("triton" if name == "v6_autotuned" else f"triton_{name}"), \
        prev and recorded("triton" if prev == "v6_autotuned" else f"triton_{prev}")
    if now:
        gain = f" ({now['tflops'] / before['tflops'] - 1:+.0%} over {prev})" if before else ""
        print(f"\nrecorded on the H200 at {steps_case}: {now['tflops']:.0f} TFLOP/s, {now['ms']:.2f} ms{gain}")
    r = check_step(name)
    print(f"checked here: {r.summary()}")
    assert r.passed, r.summary()


def excerpt(obj, start, stop):
    """The lines of the package's ``obj`` from the first that contains ``start`` through the next that contains ``stop``."""
    src = show_source(obj)
    lines = src.text.splitlines()
    i = next(n for n, line in enumerate(lines) if start in line)
    j = next(n for n in range(i, len(lines)) if stop in lines[n])
    src.text, src.first, src.last = "\n".join(lines[i:j + 1]), src.first + i, src.first + j
    return src


rows = ["| step | tiles (M×N) | warps | stages | launch order | K/V loads | recorded TFLOP/s |", "|---|---|---|---|---|---|---|"]
for name in STEPS:
    cfg, rec = step_config(name), recorded("triton" if name == "v6_autotuned" else f"triton_{name}")
    order = {1: "one head's tiles together", 1024: "head index fastest"}.get(cfg.get("GROUP_H"), f"{cfg.get('GROUP_H')} heads per group")
    rows.append(f"| {name} | {cfg.get('BLOCK_M')}×{cfg.get('BLOCK_N')} | {cfg.get('num_warps')} | {cfg.get('num_stages')} | "
                f"{order} | {'TMA' if cfg.get('USE_TMA') else 'pointers'} | {rec['tflops']:.0f} |" if rec else "| n/a |")
display(Markdown(f"Recorded on the H200 at `{steps_case}` (causal, bf16):\n\n" + "\n".join(rows)))

# %% [markdown]
# ### v1: the package's kernel at small tiles
#
# 64 query rows × 32 keys per tile, 4 warps, no prefetching (`num_stages=1`), pointer loads, and
# the head index fastest in the launch order (every head's last, longest query tile, then every
# head's next one, ...). Beyond our
# 40 lines it has the inner loop above and the split walk of section 4: these are its loop bounds.

# %%
show_step("v1_small_tiles")
excerpt(dense_triton._flash_fwd, "causal_off = Skv - S", "end = tl.maximum(end, 0)")

# %% [markdown]
# ### v2: tiles shaped for Hopper's tensor cores
#
# A K/V tile loaded once serves `BLOCK_M` query rows, so doubling `BLOCK_M` to 128 halves the K/V
# traffic per FLOP. Hopper's `wgmma` instruction is issued by a *warpgroup* (4 warps) on 64 rows, so
# 128 rows want 8 warps (two warpgroups). `num_stages=3` lets the compiler software-pipeline the
# unmasked loop (`tl.range`): while tile `n` is multiplied, the loads of tiles `n+1` and `n+2` are in flight.

# %%
show_step("v2_hopper_tiles")
excerpt(dense_triton._launch, "grid = (B * Hq * triton.cdiv", "num_warps=cfg.get")

# %% [markdown]
# ### v3: 128×128 tiles
#
# Twice the keys per iteration: half as many loop trips, so half as many rescales of the
# `128 × D` accumulator and half as many row maxima per key. The recorded gain is small:
# the kernel is now limited elsewhere.

# %%
show_step("v3_128x128_tiles")
display(excerpt(triton_blocks.softmax_tile_weights, "alpha = tl.math.exp2", "l_new = l_i * alpha"))
excerpt(triton_blocks.online_softmax_step, "acc = tl.dot", "acc = tl.dot")

# %% [markdown]
# ### v4: a launch order that keeps K/V in L2
#
# The GPU runs one program per SM at these tile sizes, so ~132 programs at once on an H200. With
# the head index fastest (`GROUP_H=1024`, every head in one group), those are one or two query tiles
# of *every* head, each streaming its own head's K and V. `GROUP_H=1` walks one head's query tiles
# together (FlashAttention's own grid order), so the programs running side by side read the same K/V
# and find it in L2. Inside a group the longest causal rows launch first, so short tiles fill the
# tail. The arithmetic below and the picture are computed from the kernel's own index math.

# %%
show_step("v4_l2_order")
sc_ = dict(B=4, S=16384, Hq=16, D=128)
kv_head = 2 * sc_["S"] * sc_["D"] * 2                                   # K and V of one head, bf16
n_sm = runtime.describe().get("sm_count", 132)
print(f"\nat S={sc_['S']}: K+V of one head = {kv_head / 2**20:.0f} MB; head index fastest, the {n_sm} programs "
      f"in flight touch all {sc_['B'] * sc_['Hq']} heads: {sc_['B'] * sc_['Hq'] * kv_head / 2**20:.0f} MB against "
      f"{l2_bytes / 2**20:.0f} MB of L2{'' if dev.type == 'cuda' else ' (the H200)'}; one head's tiles together: "
      f"{kv_head / 2**20:.0f} MB")

n_heads, tiles_m, resident = 16, 32, 40     # a small picture: 16 (batch, head) pairs, 32 query tiles each
fig, ax = plt.subplots(1, 2, figsize=(10, 3.4))
for a, grp, title in ((ax[0], 1024, "GROUP_H=1024: head index fastest (v1-v3)"), (ax[1], 1, "GROUP_H=1: one head's tiles together (v4)")):
    wave = np.zeros((n_heads, tiles_m))
    for h, mt in launch_order(n_heads, tiles_m, grp)[:resident]:
        wave[h, mt] = 1
    a.imshow(wave, cmap="Blues", aspect="auto")
    a.set(title=f"{title}\nfirst {resident} programs: {int(wave.any(1).sum())} heads' K/V in flight",
          xlabel="query tile", ylabel="(batch, head)")
plt.tight_layout(); plt.show()
excerpt(dense_triton._flash_fwd, "pid = tl.program_id(0)", "start_m = tiles_m - 1")

# %% [markdown]
# ### v5: TMA loads
#
# Hopper's Tensor Memory Accelerator copies a whole K or V tile into swizzled shared memory with
# one instruction, from a *tensor descriptor* built on the host over K/V seen as 2-D `[B·Skv, Hkv·D]`.
# With pointer loads every thread computes 64-bit addresses for its share of the tile and issues
# the copies, spending registers and issue slots the softmax needs. Only the unmasked loop uses
# TMA: its tiles never leave one (batch, kv head), so no box crosses into the next batch.
#
# Why the last two steps pay: a 128×128 K/V tile pair in bf16 is 64 KB and feeds
# `2·2·128·128·128` FLOP, 128 FLOP/byte. The line below divides the recorded throughput by that and
# sets it beside the H200's recorded copy bandwidth: at this speed the K/V tiles alone would take
# all of HBM, so they must come from L2 (v4) and cost the SMs as little as possible to load (v5).

# %%
show_step("v5_tma")
ceil = {r["case"]: r for r in bench.load_records("NVIDIA H200", suite="ceilings")}
v5 = recorded("triton_v5_tma")
if v5 and "copy" in ceil:
    print(f"\n{v5['tflops']:.0f} TFLOP/s / 128 FLOP/byte = {v5['tflops'] / 128:.1f} TB/s of K/V tiles; "
          f"recorded H200 copy bandwidth: {ceil['copy']['gbps'] / 1000:.2f} TB/s")
display(excerpt(dense_triton._flash_fwd, "kv_row = b * Skv", "acc, m_i, l_i = _tile_update"))
excerpt(dense_triton._kv_descriptor, "def _kv_descriptor", "return TensorDescriptor")

# %% [markdown]
# ### v6: autotuned
#
# `@triton.autotune` times a handful of configs on the GPU the first time it meets a head dim,
# causality and power-of-two length bucket, and keeps the fastest. The candidates are below; the
# table after them shows what it picked at each recorded size; the first line below says whether
# at S = 16k that was v5's config (then the two numbers differ only by run-to-run noise). In the
# interpreter the autotuner cannot run, so the CPU check uses the fixed interpreter config (16×16 tiles).

# %%
show_step("v6_autotuned")
display(excerpt(dense_triton, "AUTOTUNE_ROWS = [", "(128, 128, 8, 3, False, 1), (128, 64"))
picked = ["| case | picked config | TFLOP/s |", "|---|---|---|"]
for r in sorted((r for r in recs if r["impl"] == "triton"), key=lambda r: r["shape"]["S"]):
    c = r.get("config") or {}
    picked.append(f"| {r['case']} | {c.get('BLOCK_M')}×{c.get('BLOCK_N')}, {c.get('num_warps')} warps, "
                  f"{c.get('num_stages')} stages, GROUP_H={c.get('GROUP_H')}, {'TMA' if c.get('USE_TMA') else 'pointers'} | {r['tflops']:.0f} |")
Markdown("\n".join(picked))

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
# ## 7. Timing here, at the recorded shape
#
# The kernel's steps timed on this machine with the harness (`bench.time_fn`: warm-up, inputs
# rotated past the cache, medians of device events), the autotuned kernel, and PyTorch's SDPA with
# its FlashAttention-2 and cuDNN backends; each of ours is checked against the fp32 reference
# first. On a GPU this runs at the shape of the H200 run recorded below (causal, B = 4, S = 16k,
# 16 heads, D = 128), so the two can be read side by side.
#
# On the CPU these are wall-clock times of the *interpreter* at a tiny size: they show the harness
# working, not GPU speed. There the suite times two steps, both at 16×16 tiles (v1's head-fastest
# pointer loads and v5's grouped TMA loads): the interpreter runs programs one after another in
# numpy, so warps, stages and cache-friendly orders change nothing it could measure.

# %%
from torch.nn.attention import SDPBackend, sdpa_kernel

measured = []   # records, in the format of the recorded ones
if time_steps:
    c = dict(B=4, S=16384, Hq=16, Hkv=16, D=128, causal=True) if P == "gpu" else \
        dict(B=1, S=64, Hq=2, Hkv=2, D=32, causal=True)

    def mk(seed, S=c["S"], B=c["B"]):  # [B, S, H, D], fresh random inputs for every set
        g = torch.Generator(device=dev).manual_seed(seed)
        return {n: torch.randn(B, S, c["Hq"] if n == "q" else c["Hkv"], c["D"], device=dev, dtype=dtype, generator=g)
                for n in "qkv"}

    def mk_sdpa(seed):                 # SDPA's own layout, [B, H, S, D]
        return {n: t.transpose(1, 2).contiguous() for n, t in mk(seed).items()}

    def sdpa_with(backend):
        def fn(q, k, v):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return fn

    ours = {f"triton_{name}": (lambda cfg: lambda q, k, v: flash_attention(q, k, v, config=cfg))(cfg)
            for name, cfg in STEP_CONFIGS[P].items()}
    ours["triton"] = lambda q, k, v: attention(q, k, v, impl="triton")       # autotuned on a GPU
    peers = {"sdpa_flash": sdpa_with(SDPBackend.FLASH_ATTENTION)}
    if dev.type == "cuda" and hasattr(SDPBackend, "CUDNN_ATTENTION"):
        peers["sdpa_cudnn"] = sdpa_with(SDPBackend.CUDNN_ATTENTION)
    reference = lambda q, k, v: attention(q, k, v, impl="reference")   # noqa: E731
    baseline = {"reference": reference} if P == "cpu" else {}          # fp32 S×S scores: CPU sizes only
    flops = attention_flops(c["B"], c["S"], c["S"], c["Hq"], c["D"], True)
    for name, fn in tqdm([*ours.items(), *peers.items(), *baseline.items()], desc="checking, then timing"):
        try:
            chk = None if name not in ours else bench.check(   # check first, at a ragged length
                fn, reference, lambda seed: mk(seed, S=1000 if P == "gpu" else 77, B=1), trials=1,
                reference_dtype=torch.float32, name=name)
            if chk is None or chk.passed:
                t = bench.time_fn(fn, mk_sdpa if name in peers else mk, reps=20 if P == "gpu" else 3)
        except Exception as e:  # a fixed step config or a peer this device cannot run (e.g. TMA before Hopper)
            if name == "triton":
                raise
            print(f"{name:30s} does not run here: {type(e).__name__}: {str(e)[:150]}")
            continue
        if chk is not None and not chk.passed:                  # it ran, and it is wrong: stop here
            raise AssertionError(chk.summary())
        measured.append(bench.make_record("attention", case_name(c), name, t, shape=c, dtype=dtype, flops=flops))
        print(f"{name:30s} {t.ms:10.4f} ms  {measured[-1]['tflops']:9.3g} TFLOP/s  ({t.method})")

# %% [markdown]
# ## 8. Recorded on the H200, and measured now
#
# The `attention` bench suite (`python -m minimax_lab.bench attention`) checks the kernel against the
# reference at a ragged size, then times ours and the peers **in the same run**: SDPA's flash backend
# (FlashAttention-2), SDPA's cuDNN backend, and FlexAttention compiled with a causal block mask.
# Causal bf16 forward, B·S = 64k tokens, 16 heads, D = 128 (and one GQA case, 64 query heads on 4 kv
# heads). FLOPs count the visible triangle. The bars are read from `results/NVIDIA_H200.json`:
# they were **recorded** there, at the commit named in the title. On a GPU, section 7's
# measurements are drawn beside them.

# %%
from minimax_lab.viz import live_vs_recorded

labels = {"sdpa_flash": "SDPA flash (FA2)", "flex_compiled": "FlexAttention (compiled)",
          "triton": "ours (Triton, autotuned)", "sdpa_cudnn": "SDPA cuDNN"}
if not recs:
    print("No H200 records for the 'attention' suite yet: run `python -m minimax_lab.bench attention` on the GPU.")
else:
    cases_rec = sorted({r["case"] for r in recs if r["impl"] == "triton"},
                       key=lambda c: (recorded("triton", c)["shape"]["Hq"] != recorded("triton", c)["shape"]["Hkv"],
                                      recorded("triton", c)["shape"]["S"]))
    short = {c: (lambda s: f"S={s['S'] // 1024}k" + (f"\nGQA {s['Hq']}/{s['Hkv']}" if s["Hq"] != s["Hkv"] else ""))(
        recorded("triton", c)["shape"]) for c in cases_rec}
    fig, ax = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.2
    for i, impl in enumerate(labels):
        vals = [(recorded(impl, c) or {}).get("tflops", 0) for c in cases_rec]
        ax[0].bar(np.arange(len(cases_rec)) + (i - 1.5) * width, vals, width, label=labels[impl])
    if (gemm := {r["case"]: r for r in bench.load_records("NVIDIA H200", suite="ceilings")}.get("gemm_bfloat16")):
        ax[0].axhline(gemm["tflops"], color="k", ls="--", lw=1, label=f"bf16 GEMM ceiling ({gemm['tflops']:.0f})")
    ax[0].set_xticks(np.arange(len(cases_rec)), [short[c] for c in cases_rec])
    ax[0].set(ylabel="TFLOP/s", title=f"recorded on H200 ({live_vs_recorded.commits_label(recs)}): causal fwd, bf16, D=128")
    ax[0].title.set_fontsize(9)
    ax[0].legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3)
    names = {f"triton_{n}": n for n in STEPS}
    order = [*names, "triton", "sdpa_flash", "flex_compiled", "sdpa_cudnn"]
    got = [({**names, **labels, "triton": "v6_autotuned"}[o], recorded(o)["tflops"]) for o in order if recorded(o)]
    ax[1].barh([n for n, _ in got][::-1], [t for _, t in got][::-1],
               color=["tab:green" if n.startswith("v") else "tab:gray" for n, _ in got][::-1])
    ax[1].set(xlabel="TFLOP/s", title=f"recorded on H200: steps (green) and libraries at {steps_case}")
    ax[1].title.set_fontsize(9)
    plt.tight_layout(); plt.show()

    table = ["| case | ours (TFLOP/s) | vs SDPA flash (FA2) | vs FlexAttention | vs SDPA cuDNN |", "|---|---|---|---|---|"]
    ratios = {p: [] for p in ("sdpa_flash", "flex_compiled", "sdpa_cudnn")}
    for c in cases_rec:
        ours_r = recorded("triton", c)
        cells = []
        for p in ratios:
            if recorded(p, c):
                ratios[p].append(ours_r["tflops"] / recorded(p, c)["tflops"])
                cells.append(f"{ratios[p][-1]:.2f}×")
            else:
                cells.append("n/a")
        table.append(f"| {c} | {ours_r['tflops']:.0f} | " + " | ".join(cells) + " |")
    span = lambda xs: f"{min(xs):.2f}×–{max(xs):.2f}×"  # noqa: E731
    verdict = "slower than cuDNN at every recorded size" if max(ratios["sdpa_cudnn"], default=0) < 1 else \
        "faster than cuDNN at some sizes"
    display(Markdown("\n".join(table) + f"\n\n**What the records show:** ours is {span(ratios['sdpa_flash'])} SDPA's "
                     f"FlashAttention-2 and {span(ratios['flex_compiled'])} FlexAttention, and {verdict} "
                     f"({span(ratios['sdpa_cudnn'])} of cuDNN's throughput)."))

    if any(r["case"] == m["case"] for r in recs for m in measured):
        print("\n" + live_vs_recorded.format_rows(measured, recs, "tflops", device_now=runtime.device_name()))
        live_vs_recorded.plot(measured, recs, "tflops", device_now=runtime.device_name(),
                              title=f"causal attention at {measured[0]['case']}: measured now vs recorded")
        plt.tight_layout(); plt.show()
    else:
        print("(nothing measured here at a recorded shape: at the CPU preset section 7 times tiny sizes in the "
              "interpreter; run this notebook on a GPU to see your own numbers beside the H200's)")

# %% [markdown]
# ## What limits us
#
# The summary above says where we stand: ahead of SDPA's FlashAttention-2 backend and of
# FlexAttention at every recorded size, behind cuDNN at every recorded size. The two steps that
# moved us past FlexAttention were the L2-friendly launch order (v4) and TMA loads (v5); the step
# table gives each one's share. cuDNN's kernel is FlashAttention-3-like (Shah et al. 2024,
# arXiv 2407.08608): producer warps issue the TMA copies while two consumer warpgroups ping-pong,
# so one warpgroup's softmax overlaps the other's matmuls. Our loop is FlashAttention-2-shaped:
# each warpgroup waits for its own QKᵀ, computes the exponentials, then runs PV, and the tensor
# cores idle during the exponentials. That overlap is what the remaining gap is made of; Triton 3.6
# does not express it for this loop (`results/notes_attention.md` has the measurements).

# %% [markdown]
# ## Exercises
#
# Four exercises, from one line to a small kernel; each checker draws fresh random sizes and says
# what it expected. Fill in a stub, run its cell and the check below it. Solutions are in
# `minimax_lab/exercises/solutions/ch02.py` (try first).
#
# **02.1 The tail mask.** The last key tile of a ragged row runs past the end (section 3's `cols < Skv`).

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
# the mask? Section 4's picture, for one row of tiles (the checker compares with the kernel's own bounds).

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
# that have not seen a key yet.

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
# tiles with the tail mask and the running max and sum. Write the `@triton.jit` kernel in the cell
# above the stub (start from section 3's loop), then launch it in `softmax_rows`.

# %%
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
# ---
# **Previous:** [01 · Multimodal from step zero](01_multimodal_from_step_zero.ipynb) · **Next:** [03 · MiniMax Sparse Attention](03_minimax_sparse_attention.ipynb)
#
# **Package code used here:** `minimax_lab/attention/online_softmax.py`, `minimax_lab/attention/dense_triton.py`, `minimax_lab/bench/suite_attention.py`, `minimax_lab/attention/dense.py`, `minimax_lab/attention/dense_reference.py`, `minimax_lab/bench/`, `minimax_lab/viz/source.py`, `minimax_lab/exercises/ch02.py`
