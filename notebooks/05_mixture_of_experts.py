# %% [markdown]
# # 05 · Mixture of Experts: routers, load balance and a fused Triton MoE
#
# **What this chapter builds:** top-k routers with bias balancing; the token alignment and the two fused expert GEMMs of a Triton MoE, grown kernel by kernel in cells and each checked against `minimax_lab.moe`; FP8 experts; expert-parallel dispatch and combine.
#
# **It assumes:** [02 · FlashAttention in Triton](02_flash_attention_in_triton.ipynb) (Triton tiles, `tl.dot`, masks), the tiny model of [01 · Multimodal from step zero](01_multimodal_from_step_zero.ipynb) and the ceilings of [00 · Rooflines and honest benchmarks](00_roofline_and_honest_benchmarks.ipynb).
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/05_mixture_of_experts.ipynb)
#
# A Mixture-of-Experts (MoE) feed-forward layer holds `E` small SwiGLU FFNs, the *experts*, and a
# **router** that sends each token to `k` of them (Shazeer et al. 2017, arXiv 1701.06538). The
# model gets `E/k` times the FFN parameters for the same FLOPs per token: Qwen3-30B-A3B has 128
# experts and uses 8 per token, MiniMax-M2 has 256 and uses 8. Two things decide whether that pays:
# **balance** (a batch takes as long as its busiest expert) and **kernels** (each expert sees a
# ragged, data-dependent set of rows).

# %%
# In Colab, install the workbook's package first (locally, `make lab` already did).
import subprocess, sys
if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "minimax-lab[notebooks] @ git+https://github.com/minimax-lab/minimax-lab"], check=True)

# %% tags=["parameters"]
preset = "auto"          # "cpu" (tiny sizes, interpreter) or "gpu" (real sizes)
train_steps = None       # steps per training run in section 2 (None: 40 on the CPU, 500 on a GPU)
bias_rate = 0.01         # bias update rate of the balanced run (DeepSeek-V3 uses 1e-3 over far longer runs)
two_processes = False    # section 4: also run the package's expert parallelism in two gloo processes (~30 s)

# %%
import time

import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

from minimax_lab import exercises, measure, runtime  # runtime first: it picks the Triton interpreter on a CPU
import triton
import triton.language as tl
from minimax_lab.moe import (align_tokens, capacity_for, load_balance_loss, moe_experts, quantize_experts,
                             route_sigmoid_bias, route_softmax, update_bias)
from minimax_lab.viz import moe as vmoe, moe_records, noise, tuner as vtuner
from minimax_lab.viz.flash import show_edit

t_start = time.perf_counter()
P, dev, dtype = vmoe.setup(preset)

# %% [markdown]
# ## The idea in one picture
#
# Ten tokens, five experts, two experts per token. Left, the router's choice: each token's row has
# `k = 2` weights that sum to 1, and each expert's column collects a ragged number of tokens.
# Right, what a fused kernel does with that: number the routed copies (*slots*: slot `t·k + j` is
# token `t`'s `j`-th choice), sort them by expert, and pad each expert's group to whole blocks of
# `BLOCK_M` rows. Every block then belongs to one expert, so one program loads that expert's
# weight tile once and multiplies all the block's rows by it.

# %%
g = torch.Generator().manual_seed(3)
T_demo, E_demo, k_demo, bm_demo = 10, 5, 2, 4
logits_demo = torch.randn(T_demo, E_demo, generator=g) - 0.4 * torch.arange(E_demo)   # low experts popular
weights_demo, ids_demo = route_softmax(logits_demo, k_demo)
al = align_tokens(ids_demo, E_demo, bm_demo)
vmoe.idea_figure(weights_demo, ids_demo, al, block_m=bm_demo); plt.show()
print("slots per expert:", al.counts.tolist(), "| padded rows used:", int(al.num_rows), "of capacity", al.capacity)
print("sorted_ids:", al.sorted_ids.tolist(), "\nblock_expert:", al.block_expert.tolist())

# %% [markdown]
# In decode, with `T·k` small next to `E`, almost every used expert gets exactly one block, so the
# kernel streams each used expert's weights once. An expert whose rows overflow a block is streamed
# once *per block*: that is why the block height follows the expected rows per expert.
#
# ## 1. Routers: which `k` experts, with what weight
#
# Every router here returns `weights [T, k]` (float32) and `ids [T, k]` (int64), each row in
# order of decreasing score.
#
# * **Softmax top-k** (Mixtral, arXiv 2401.04088; Qwen3-MoE): softmax over the `E` logits, keep the
#   top `k`, renormalise the kept probabilities to sum to 1.
# * **Sigmoid + correction bias** (DeepSeek-V3, arXiv 2412.19437, Sec. 2.1.2; MiniMax-M2 routes the
#   same way): an independent sigmoid score per expert. A per-expert bias `b` is added **only to
#   choose** the experts; the weights come from the unbiased scores. After each step
#   `b_i += rate · sign(mean load − load_i)`: no gradient, no loss term.
# * The Switch-Transformer **balance loss** (arXiv 2101.03961), `E · Σ f_i P_i` (`f_i`: share of
#   slots routed to expert `i`, `P_i`: its mean router probability), is the classic alternative:
#   1.0 at perfect balance, `E` when everything goes to one expert.

# %%
g = torch.Generator().manual_seed(0)
logits = torch.randn(4, 6, generator=g)
w, ids = route_softmax(logits, 2)
print("softmax top-2 ids\n", ids, "\nweights (rows sum to 1)\n", w)
bias = torch.zeros(6)
bias[5] = 1.0                         # favour expert 5 when choosing
wb, idb = route_sigmoid_bias(logits, 2, bias)
print("sigmoid + bias[5]=1 ids\n", idb, "\nweights (unbiased scores of the chosen experts, renormalised)\n", wb)
print("bias after one update with loads [9, 1, 1, 1, 1, 3]:", update_bias(bias.clone(), torch.tensor([9, 1, 1, 1, 1, 3]), 0.1))
uniform = torch.full((8, 4), 0.25)
print("balance loss, perfectly balanced:", float(load_balance_loss(uniform, torch.arange(8).remainder(4)[:, None])),
      "| all on expert 0:", float(load_balance_loss(torch.eye(4)[[0] * 8], torch.zeros(8, 1, dtype=torch.long))))

# %% [markdown]
# ## 2. Balance in the tiny model
#
# Chapter 01's early-fusion model takes `ffn="moe"`: every block's FFN becomes an `MoEFFN` with 8
# experts, top-2, sigmoid routing. Here a model of that design is trained from scratch; on the CPU
# preset it is smaller than chapter 01's (the cell prints its layers and width). We train it twice
# from the same seed on the same mixed image/text stream: once with the bias frozen at 0 (no
# balancing at all), once with the bias update at `bias_rate`. Hooks on every MoE layer record each
# step's routed slots per expert and the bias after the step. On the CPU preset the runs are short:
# long enough for the router to pick favourites, too short to learn the task, as the printed
# accuracy against guessing says.

# %%
from minimax_lab.model import TinyMultimodalModel, TrainConfig, preset_config, train

E, K = 8, 2
steps = train_steps or runtime.pick(P, cpu=40, gpu=500)
small = runtime.pick(P, cpu=dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128), gpu={})
cfg = preset_config(P, ffn="moe", n_experts=E, moe_top_k=K, router="sigmoid_bias", **small)
tc = TrainConfig(steps=steps, batch_size=runtime.pick(P, cpu=16, gpu=64), warmup=min(50, steps // 5), eval_every=steps,
                 eval_examples=runtime.pick(P, cpu=64, gpu=256), schedule="mixed", aux_loss_weight=0.0)
chance = vmoe.guessing_accuracy(tc.eval_examples)
print(f"{cfg.n_layers} layers, d_model {cfg.d_model}, {E} experts top-{K} per layer")
runs = {}
for name, rate in [("no balancing", 0.0), (f"bias balancing (rate {bias_rate})", bias_rate)]:
    torch.manual_seed(0)
    model = TinyMultimodalModel(cfg)
    for blk in model.blocks:
        blk.ffn.bias_update_rate = rate                       # the only difference between the two runs
    log = vmoe.RoutingLog(model)                              # hooks: each step's loads and biases
    model, hist = train(cfg, tc, model=model, progress=False, device=runtime.pick(P, cpu=None, gpu=dev))
    runs[name] = dict(model=model, **log.result())
    print(f"{name:32s} after {steps} steps: val loss {hist['val_loss'][-1]:.3f}, answer accuracy "
          f"{hist['val_acc'][-1]:.0%}, {noise.versus_chance(hist['val_acc'][-1], chance, tc.eval_examples)}")

# %%
vmoe.balance_figure(runs); plt.show()
print(vmoe.balance_words(runs))

# %% [markdown]
# Without balancing, the router's preferences at initialisation and in the first gradient steps
# decide the loads, and nothing pulls an over-used expert back. The printed ratios say how far the
# bias update brought the busiest expert towards the mean (1.0 is perfect balance), with their range
# from one pair of steps to the next. The stripes in the heatmaps are the mixed schedule: even
# steps are image batches, odd steps text-only, and the two route differently. Follow the expert
# that image steps load most in the balanced run:

# %%
vmoe.sign_rule_figure(runs); plt.show()
print(vmoe.sign_rule_words(runs[list(runs)[-1]], rate=bias_rate))

# %% [markdown]
# The update `b_i += rate · sign(mean − load_i)` moves a bias by the same `rate` whatever the size
# of the imbalance: it sees only *whether* an expert is over the mean (section 1's printed update
# took as much from the expert barely over the mean as from the busiest). An expert that image batches
# overload and text batches leave under the mean is pushed down and pulled up in turn, and its bias
# goes nowhere (the line above says whether that happened here): the rule evens out how *often* an
# expert is over the mean, not by how much. DeepSeek-V3's batches mix every kind of data; batches
# that alternate whole modalities are where a per-step sign rule cannot settle. The bias never touches the
# weights, so no gradient fights the language-model loss: DeepSeek-V3's argument for dropping the
# auxiliary loss.
#
# The model is early-fusion: image patches and words share one sequence and the same experts.
# Route a batch of image questions through the balanced model and split its slots by modality:

# %%
from minimax_lab.data import collate, make_examples

balanced = runs[list(runs)[-1]]["model"].eval()
shares = vmoe.modality_shares(balanced, collate(make_examples("val", 128, seed=1)).to(next(balanced.parameters()).device))
vmoe.modality_figure(shares); plt.show()
print(vmoe.modality_words(shares, top_k=K))

# %% [markdown]
# The bias acts on each expert's load over all tokens; nothing makes the two modalities spread the
# same way. A token's `k` experts are distinct, so an expert's share of the image slots times `k`
# is the share of patches that pick it (printed above).
#
# ## 3. The fused MoE kernel, built in cells
#
# `moe_experts(x [T,d], w_gate_up [E,2f,d], w_down [E,d,f], weights [T,k], ids [T,k], impl=...)`
# returns `Σ_j weights[t,j] · expert_{ids[t,j]}(x_t)` with SwiGLU experts (Shazeer, arXiv 2002.05202):
# `expert_e(x) = W_down[e] · (silu(W_gate[e] x) ⊙ W_up[e] x)`. `impl="reference"` loops over the
# experts in fp32; `"torch"` sorts the slots by expert and runs one `torch._grouped_mm` per
# projection; `"triton"` is the fused kernel this section builds: the **alignment** of the picture
# above, then two GEMM kernels over its blocks.
#
# ### 3.1 The alignment, in three kernels
#
# The alignment is three tensors: `sorted_ids [capacity]`, the slot each padded row holds (padding
# rows hold the sentinel `T·k`); `block_expert [capacity / BLOCK_M]`, the expert of each block (`-1`
# past the used rows); and `num_rows`. They are sized by an upper bound (`capacity_for`: each used
# expert wastes fewer than `BLOCK_M` rows), so the GEMMs' grid is known without reading anything
# back from the GPU. For decode-sized batches one Triton program does it all, one lane per slot.
# The checks use skewed routings, so some experts get several blocks, some one, some none:

# %%
E_al, k_al, bm_al = runtime.pick(P, cpu=(8, 2, 4), gpu=(128, 8, 16))


def routing_ids(seed, T):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, E_al, generator=g) - 0.3 * torch.arange(E_al)   # low experts popular
    return {"ids": torch.topk(logits, k_al, dim=-1).indices.to(dev)}


T_checks = runtime.pick(P, cpu=[1, 7, 29, 64], gpu=[1, 5, 16, 64, 256])
for T_al in T_checks:
    counts = align_tokens(routing_ids(T_al, T_al)["ids"], E_al, bm_al).counts
    print(f"T={T_al:3d}: slots per expert {counts.tolist()}, blocks of {bm_al} per expert "
          f"{(-(-counts // bm_al)).tolist()}")

# %% [markdown]
# **Step 1: how many slots each expert got.** Compare every slot's expert id with every expert
# number and you get a one-hot matrix `[slots, experts]`; its column sums are the counts.
# `tl.histogram(x, num_bins)` returns the same column sums without building the matrix: an int32
# vector of `num_bins` counts, how many elements of `x` equal 0, 1, …, `num_bins − 1`. Every value
# must lie in that range, and `num_bins`, like every Triton block dimension, is a power of two, so
# the kernel rounds `E` up to `E_POW2` bins (the extra bins stay empty) and leaves the lanes past the
# last slot out with `mask=`. The kernel computes both, to show they agree:

# %%
@triton.jit
def expert_counts_kernel(ids_ptr, onehot_counts_ptr, counts_ptr, n_slots,
                         N_POW2: tl.constexpr, E_POW2: tl.constexpr):
    s = tl.arange(0, N_POW2)                                    # one lane per slot
    e = tl.arange(0, E_POW2)                                    # one bin per expert
    ok = s < n_slots                                            # lanes past the last slot
    ids = tl.load(ids_ptr + s, mask=ok, other=0).to(tl.int32)
    onehot = (ids[:, None] == e[None, :]) & ok[:, None]         # [slots, experts]: slot s chose expert e
    tl.store(onehot_counts_ptr + e, tl.sum(onehot.to(tl.int32), axis=0))
    tl.store(counts_ptr + e, tl.histogram(ids, E_POW2, mask=ok))   # the same column sums, no matrix


def expert_counts_both(ids, n_experts):
    """(one-hot column sums, histogram) of ``ids [T, k]``, int32 [n_experts] each."""
    n, e_pow2 = ids.numel(), max(16, triton.next_power_of_2(n_experts))
    onehot_counts, counts = (torch.empty(e_pow2, dtype=torch.int32, device=ids.device) for _ in range(2))
    expert_counts_kernel[(1,)](ids.reshape(-1).contiguous(), onehot_counts, counts, n,
                               N_POW2=max(16, triton.next_power_of_2(n)), E_POW2=e_pow2)
    return onehot_counts[:n_experts], counts[:n_experts]


def bincount_twice(ids):
    c = torch.bincount(ids.reshape(-1), minlength=E_al).to(torch.int32)
    return c, c


for T_al in T_checks[:3]:                        # the one-hot matrix is [slots, experts]: small batches only
    res = measure.check(lambda ids: expert_counts_both(ids, E_al), bincount_twice,
                        lambda seed, T=T_al: routing_ids(seed, T), name=f"counts, T={T_al}", trials=3, seed=T_al)
    print(res.summary(), "(one-hot sums and histogram, each against torch.bincount)")
    assert res.passed

# %% [markdown]
# **Step 2: the owner of every block.** Round each count up to whole blocks (`padded`); a running
# sum, `tl.cumsum`, gives where each expert's rows end (`pad_end`), and expert `e`'s rows start at
# `pad_end[e] − padded[e]`. Block `b` belongs to the number of experts that end at or before its
# first row `b·BLOCK_M`. A block past the used rows counts every expert, so it gets `-1`, and its
# GEMM programs just exit. The grid can hold more blocks than one tile, so the owners are written
# `B_CHUNK` blocks at a time. The edit from step 1:

# %%
@triton.jit
def block_owner_kernel(ids_ptr, block_expert_ptr, num_rows_ptr, n_slots, n_blocks,
                       BLOCK_M: tl.constexpr, N_POW2: tl.constexpr, E_POW2: tl.constexpr, B_CHUNK: tl.constexpr):
    s = tl.arange(0, N_POW2)                                    # one lane per slot
    ok = s < n_slots                                            # lanes past the last slot
    ids = tl.load(ids_ptr + s, mask=ok, other=0).to(tl.int32)
    counts = tl.histogram(ids, E_POW2, mask=ok)                 # slots per expert
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M        # rounded up to whole blocks
    pad_end = tl.cumsum(padded, axis=0)                         # where each expert's rows end
    tl.store(num_rows_ptr, tl.sum(padded, axis=0))
    for b0 in range(0, n_blocks, B_CHUNK):                      # owner: the experts that end at or before the block
        b = b0 + tl.arange(0, B_CHUNK)
        owner = tl.sum((pad_end[None, :] <= (b * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + b, tl.where(owner < E_POW2, owner, -1), mask=b < n_blocks)


def launch_sizes(ids, n_experts, block_m):
    """(slots, slots rounded up to a power of two, experts rounded up, blocks in the capacity)."""
    n = ids.numel()
    return (n, max(16, triton.next_power_of_2(n)), max(16, triton.next_power_of_2(n_experts)),
            capacity_for(n, n_experts, block_m) // block_m)


def block_owners(ids, n_experts, block_m):
    """(block_expert [capacity // block_m], num_rows [1]), laid out like the package's align_tokens."""
    n, n_pow2, e_pow2, n_blocks = launch_sizes(ids, n_experts, block_m)
    block_expert = torch.empty(n_blocks, dtype=torch.int32, device=ids.device)
    num_rows = torch.empty(1, dtype=torch.int32, device=ids.device)
    block_owner_kernel[(1,)](ids.reshape(-1).contiguous(), block_expert, num_rows, n, n_blocks,
                             BLOCK_M=block_m, N_POW2=n_pow2, E_POW2=e_pow2, B_CHUNK=64)
    return block_expert, num_rows


display(show_edit(expert_counts_kernel, block_owner_kernel))

# %% [markdown]
# Checked against the package on fresh routings (integer outputs must match element for element):

# %%
def package_owners(ids):
    a = align_tokens(ids, E_al, bm_al)
    return a.block_expert, a.num_rows


for T_al in T_checks:
    res = measure.check(lambda ids: block_owners(ids, E_al, bm_al), package_owners,
                        lambda seed, T=T_al: routing_ids(seed, T), name=f"block owners, T={T_al}", trials=3, seed=T_al)
    print(res.summary(), f"(E={E_al}, k={k_al}, BLOCK_M={bm_al})")
    assert res.passed

# %% [markdown]
# **Step 3: each slot's row, `sorted_ids`.** A slot's row is its expert's padded start plus its
# rank among that expert's slots. Sort the keys `expert · N_POW2 + slot`: they are unique (`key //
# N_POW2` is the expert, `key % N_POW2` the slot), and `tl.sort` orders them by expert and, inside
# an expert, by slot, the order `align_tokens` promises; lanes past the last slot get larger keys
# and sort to the end. Lane `p` then holds the `p`-th slot in that order, and expert `e`'s slots
# fill lanes `start[e]` onwards (`start`: the counts of the experts before `e`, summed), so lane
# `p`'s row is `p + shift[e]`, with one shift per expert: `shift[e] = pad_start[e] − start[e]`.
#
# Each lane needs the shift of its own expert: the kernel writes the shifts to a small buffer in
# global memory, then each lane loads its entry. **`tl.debug_barrier()`** sits between the two. A
# program runs as `num_warps` warps of 32 threads, each holding part of every tile, so the thread
# that stores `shift[e]` is not the one that loads it, and nothing orders one thread's store before
# another's load. The barrier makes every thread of the program wait until all have reached it,
# with the stores made before it visible after it (CUDA's `__syncthreads()`). The interpreter runs
# each line on the whole tile at once, so the check here passes with or without it; a GPU needs it.
# The host fills `sorted_ids` with the sentinel before the launch, so the kernel writes only real
# slots. The edit from step 2:

# %%
@triton.jit
def align_kernel(ids_ptr, sorted_ids_ptr, block_expert_ptr, num_rows_ptr, shift_ptr, n_slots, n_blocks,
                 BLOCK_M: tl.constexpr, N_POW2: tl.constexpr, E_POW2: tl.constexpr, B_CHUNK: tl.constexpr):
    s = tl.arange(0, N_POW2)                                    # one lane per slot
    ok = s < n_slots                                            # lanes past the last slot
    ids = tl.load(ids_ptr + s, mask=ok, other=0).to(tl.int32)
    counts = tl.histogram(ids, E_POW2, mask=ok)                 # slots per expert
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M        # rounded up to whole blocks
    pad_end = tl.cumsum(padded, axis=0)                         # where each expert's rows end
    tl.store(num_rows_ptr, tl.sum(padded, axis=0))
    for b0 in range(0, n_blocks, B_CHUNK):                      # owner: the experts that end at or before the block
        b = b0 + tl.arange(0, B_CHUNK)
        owner = tl.sum((pad_end[None, :] <= (b * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + b, tl.where(owner < E_POW2, owner, -1), mask=b < n_blocks)
    start = tl.cumsum(counts, axis=0) - counts                  # where each expert's slots start, sorted
    tl.store(shift_ptr + tl.arange(0, E_POW2), (pad_end - padded) - start)   # sorted position -> padded row
    keys = tl.sort(tl.where(ok, ids * N_POW2 + s, E_POW2 * N_POW2 + s))       # experts ascending, then slots
    expert, slot = keys // N_POW2, keys % N_POW2                # lane p: the p-th slot in that order
    tl.debug_barrier()                                          # every thread's shift store lands before the loads
    row = s + tl.load(shift_ptr + expert, mask=ok, other=0)
    tl.store(sorted_ids_ptr + row, slot, mask=ok)


def align(ids, n_experts, block_m):
    """Our alignment: (sorted_ids [capacity], block_expert [capacity // block_m], num_rows [1]), int32."""
    n, n_pow2, e_pow2, n_blocks = launch_sizes(ids, n_experts, block_m)
    sorted_ids = torch.full((n_blocks * block_m,), n, dtype=torch.int32, device=ids.device)   # the sentinel
    block_expert = torch.empty(n_blocks, dtype=torch.int32, device=ids.device)
    num_rows = torch.empty(1, dtype=torch.int32, device=ids.device)
    shift = torch.empty(e_pow2, dtype=torch.int32, device=ids.device)                        # scratch
    align_kernel[(1,)](ids.reshape(-1).contiguous(), sorted_ids, block_expert, num_rows, shift, n, n_blocks,
                       BLOCK_M=block_m, N_POW2=n_pow2, E_POW2=e_pow2, B_CHUNK=64)
    return sorted_ids, block_expert, num_rows


display(show_edit(block_owner_kernel, align_kernel))

# %% [markdown]
# Checked against `align_tokens`, all three outputs, element for element:

# %%
def package_alignment(ids):
    a = align_tokens(ids, E_al, bm_al)
    return a.sorted_ids, a.block_expert, a.num_rows


for T_al in T_checks:
    res = measure.check(lambda ids: align(ids, E_al, bm_al), package_alignment,
                        lambda seed, T=T_al: routing_ids(seed, T), name=f"alignment, T={T_al}", trials=3, seed=T_al)
    print(res.summary(), f"(E={E_al}, k={k_al}, BLOCK_M={bm_al})")
    assert res.passed
ours = align(ids_demo.to(dev), E_demo, bm_demo)
print("the picture's routing, sorted_ids:", ours[0][:int(ours[2])].tolist())

# %% [markdown]
# The package's one-launch decode alignment, `align_triton.align_decode`, is this kernel with the
# sentinel written inside it too (the same barrier orders those stores before the slots'); for
# prefill-sized batches `align_prefill` splits the same steps over many programs: per-chunk
# histograms, one program for the offsets, then per-chunk sorts and scatters.

# %% [markdown]
# ### 3.2 The fused expert GEMMs over aligned blocks
#
# Two kernels over the blocks of section 3.1's alignment, each with one program per (block of
# `BLOCK_M` rows, tile of `BLOCK_N` output columns). The block's expert is one load; the rows are
# *gathered*: row `r` holds slot `sorted_ids[r]`, whose token is `slot // k`, and padding rows load
# zeros and store nothing.
#
# * `gate_up_kernel`: `x[token rows] @ W_gateᵀ` and `@ W_upᵀ` with two accumulators over `d`,
#   SwiGLU in the epilogue (`silu(g) · u`, in fp32), written to `h [capacity, f]` in row order.
# * `down_kernel`: `h[block rows] @ W_downᵀ` over `f`, times each row's routing weight, stored to
#   the row's *slot* `y[slot, :]`. Every slot is written once, so the combine is
#   `y.view(T, k, d).sum(1)`: no atomics, deterministic.
#
# The weights keep `nn.Linear`'s `[out, in]` layout, so a `[BLOCK_K, BLOCK_N]` tile of `Wᵀ` is a
# strided view (`cols * d + kk`), no transpose in memory.

# %%
@triton.jit
def gate_up_kernel(x_ptr, w_ptr, h_ptr, sorted_ids_ptr, block_expert_ptr, n_slots, top_k, d, f,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)           # block of rows, tile of f columns
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert < 0:                                              # block past the used rows
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(sorted_ids_ptr + rows)
    real = slots < n_slots                                      # padding rows hold the sentinel n_slots
    tok = slots // top_k                                        # the token each row gathers
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w_e = w_ptr + expert * 2 * f * d                            # this expert's [2f, d]: gate rows, then up rows
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, d, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        xa = tl.load(x_ptr + tok[:, None] * d + kk[None, :], mask=real[:, None] & (kk[None, :] < d), other=0.0)
        w_ok = (kk[:, None] < d) & (cols[None, :] < f)
        wg = tl.load(w_e + cols[None, :] * d + kk[:, None], mask=w_ok, other=0.0)          # [BLOCK_K, BLOCK_N] of W_gate^T
        wu = tl.load(w_e + (f + cols[None, :]) * d + kk[:, None], mask=w_ok, other=0.0)    # ... of W_up^T
        acc_g = tl.dot(xa, wg, acc_g)
        acc_u = tl.dot(xa, wu, acc_u)
    h = acc_g * tl.sigmoid(acc_g) * acc_u                       # SwiGLU epilogue
    tl.store(h_ptr + rows[:, None] * f + cols[None, :], h.to(h_ptr.dtype.element_ty),
             mask=real[:, None] & (cols[None, :] < f))


@triton.jit
def down_kernel(h_ptr, w_ptr, y_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, n_slots, d, f,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)           # block of rows, tile of d columns
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(sorted_ids_ptr + rows)
    real = slots < n_slots
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w_e = w_ptr + expert * d * f                                # this expert's [d, f]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, f, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(h_ptr + rows[:, None] * f + kk[None, :], mask=real[:, None] & (kk[None, :] < f), other=0.0)
        w = tl.load(w_e + cols[None, :] * f + kk[:, None], mask=(kk[:, None] < f) & (cols[None, :] < d), other=0.0)
        acc = tl.dot(a, w, acc)
    rw = tl.load(weights_ptr + slots, mask=real, other=0.0).to(tl.float32)   # routing weight of each row's slot
    tl.store(y_ptr + slots[:, None] * d + cols[None, :], (acc * rw[:, None]).to(y_ptr.dtype.element_ty),
             mask=real[:, None] & (cols[None, :] < d))


def fused_moe(x, w_gate_up, w_down, weights, ids, *, block_m=16, block_n=16, block_k=16):
    """Our fused MoE forward: align, gate/up + SwiGLU, down + routing weight, sum over k."""
    T, k = ids.shape
    E, d, f = w_down.shape
    sorted_ids, block_expert, _ = align(ids, E, block_m)      # section 3.1's kernel
    n_blocks = block_expert.numel()
    h = torch.empty(sorted_ids.numel(), f, dtype=x.dtype, device=x.device)
    y = torch.empty(T * k, d, dtype=x.dtype, device=x.device)
    gate_up_kernel[(n_blocks, triton.cdiv(f, block_n))](x.contiguous(), w_gate_up.contiguous(), h, sorted_ids,
                                                        block_expert, T * k, k, d, f,
                                                        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    down_kernel[(n_blocks, triton.cdiv(d, block_n))](h, w_down.contiguous(), y, sorted_ids, block_expert,
                                                     weights.reshape(-1).contiguous(), T * k, d, f,
                                                     BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return y.view(T, k, d).sum(dim=1)

# %% [markdown]
# Checked against the package's fused kernels (`impl="triton"`), its grouped-GEMM path
# (`impl="torch"`) and the fp32 loop (`impl="reference"`), on ragged token counts and sizes `d`,
# `f` that are not multiples of the tiles (the masks matter). Tolerance: `measure.tolerance_for(dtype)`,
# a relative norm error (1e-3 in fp32, 2e-2 in bf16).

# %%
s_k = runtime.pick(P, cpu=dict(E=8, k=2, d=40, f=24), gpu=dict(E=128, k=8, d=2048, f=768))
tiles = runtime.pick(P, cpu=dict(block_m=16, block_n=16, block_k=16), gpu=dict(block_m=16, block_n=64, block_k=64))
g = torch.Generator().manual_seed(5)
wgu_k = (torch.randn(s_k["E"], 2 * s_k["f"], s_k["d"], generator=g) / s_k["d"] ** 0.5).to(dev, dtype)
wd_k = (torch.randn(s_k["E"], s_k["d"], s_k["f"], generator=g) / s_k["f"] ** 0.5).to(dev, dtype)


def moe_inputs(seed, T, n_experts=None):
    """x, routing weights and ids of T tokens; with n_experts, only the first n_experts are routed to."""
    gg = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, s_k["E"], generator=gg) - 0.2 * torch.arange(s_k["E"])   # ragged expert loads
    logits[:, n_experts or s_k["E"]:] = float("-inf")
    wts, ii = route_softmax(logits, s_k["k"])
    return {"x": torch.randn(T, s_k["d"], generator=gg).to(dev, dtype), "weights": wts.to(dev, dtype), "ids": ii.to(dev)}


tol = measure.tolerance_for(dtype)
for i, T_k in enumerate(runtime.pick(P, cpu=[1, 23], gpu=[1, 77, 256])):
    inp = moe_inputs(100 + i, T_k)
    ours = fused_moe(inp["x"], wgu_k, wd_k, inp["weights"], inp["ids"], **tiles)
    errs = {impl: measure.relative_error(ours, moe_experts(**inp, w_gate_up=wgu_k, w_down=wd_k, impl=impl))
            for impl in ("triton", "torch", "reference")}
    print(f"T={T_k:4d} {s_k}: rel. error of ours vs " + ", ".join(f"{i_} {e:.1e}" for i_, e in errs.items())
          + f" (tol {tol:.0e})")
    assert max(errs.values()) <= tol

# %% [markdown]
# ### 3.3 What the package's kernels add (shown, not built here)
#
# `minimax_lab.moe.experts_triton` runs the same two kernels, with additions a GPU rewards:
#
# 1. **Tiles by regime** (`pick_config`): 16- or 32-row blocks in decode, where an expert gets a
#    handful of rows; 128 in prefill, where it gets hundreds.
# 2. **Swapped operands in decode** (`SWAP_AB`): the weight tile becomes the MMA's M side, so a
#    16-row block still feeds full-size tensor-core instructions (excerpt below).
# 3. **No alignment for a step of a few tokens** (`SLOT_BLOCKS`): each slot is a block of its own,
#    its expert read straight from the router's ids: one launch fewer in a one-token step.
# 4. **Weight tiles through TMA in prefill** (`USE_TMA`, section 3.5), **FP8 weights** (`FP8`,
#    section 3.4) and 64-bit offsets for large weight tensors.

# %%
from minimax_lab.moe import experts_triton
from minimax_lab.viz.excerpt import excerpt

excerpt(experts_triton._gate_up_kernel, "if SWAP_AB:", 10)

# %% [markdown]
# ### 3.4 FP8 experts
#
# `quantize_experts` stores each expert's weights as e4m3 with one power-of-two scale per output
# channel; the kernels quantize each token's row (and each SwiGLU row) on the fly, run both GEMMs
# fp8 × fp8 on the tensor cores, and apply the scales after the dot. Decode streams the used
# experts' weights, so fewer bytes is what it can gain; prefill can gain the faster FP8 matrix
# units; whether either happens is measured in section 5. A GPU without FP8 tensor cores (before
# compute capability 8.9) skips the kernel here; Triton's interpreter emulates it.

# %%
w13, s13, w2, s2 = quantize_experts(wgu_k, wd_k)
inp = moe_inputs(7, 23)
fp8_ref = moe_experts(**inp, w_gate_up=w13, w_down=w2, w_gate_up_scale=s13, w_down_scale=s2, impl="reference")
exact = moe_experts(**inp, w_gate_up=wgu_k, w_down=wd_k, impl="reference")
print(vmoe.fp8_bytes_words(w13, s13, w2, s2, wgu_k, wd_k))
print(f"FP8 reference vs the unquantized experts: rel. error {measure.relative_error(fp8_ref, exact):.1e}")
print(vmoe.check_fp8_kernel(inp, w13, s13, w2, s2, fp8_ref))

# %% [markdown]
# The error against the unquantized experts is the price of e4m3's three mantissa bits on both
# operands; what FP8 buys, or costs, on an H200 is the last panel of section 5's figure.
#
# ### 3.5 Prefill: weight tiles through TMA
#
# An expert's weights are one dense matrix, so in prefill each weight tile can arrive by one bulk
# tensor copy (Hopper's TMA engine) into swizzled shared memory, instead of every thread computing
# and loading its own addresses. The gathered token rows are scattered, so they stay pointer loads.
# The kernels do not choose this by hand: `python -m minimax_lab.bench.tune moe_experts --keys prefill`
# checked every candidate against the fp32 reference, timed it at several prefill cases on an H200
# and kept the one it measured fastest. What it measured:

# %%
tuned = vtuner.tuner_measurements("moe_experts", "prefill")
if tuned:
    vtuner.tuner_candidates(*tuned, title="prefill candidates timed on an H200"); plt.show()
    print(vtuner.tuner_words(*tuned))
excerpt(experts_triton._gate_up_kernel, "if USE_TMA:", 4)

# %% [markdown]
# ## 4. Expert parallelism: experts on different GPUs
#
# When the experts do not fit one GPU (MiniMax-M2's 256 experts are ~7 GB per layer in bf16) they
# are **sharded**: rank `r` of `W` holds experts `[r·E/W, (r+1)·E/W)`, and every rank keeps its own
# tokens and a copy of the small router. A forward is route → **dispatch** (each routed slot's
# token row to the rank that holds its expert) → each rank runs its experts on what arrived →
# **combine** (the outputs back to the token's rank, weighted and summed over `k`): GShard's scheme
# (arXiv 2006.16668), dropless here, no token turned away for lack of room. Both moves are one
# collective, **all-to-all**: every rank sends one piece to every rank, itself included (pieces of
# any size, empty ones too), and receives one from each. On lists of tensors, `send[src][dst]` the
# piece rank `src` sends to rank `dst`, it is a transpose. Below, one process plays every rank.

# %%
def all_to_all(send):
    """send[src][dst]: the piece rank src sends to rank dst. Returns recv[dst][src], what each rank gets."""
    return [[send[src][dst] for src in range(len(send))] for dst in range(len(send))]


def dispatch(x, ids, world, per_rank):
    """One rank's routed slots grouped by the rank that holds their expert: per destination, the token
    rows and the expert's number on that rank; and the order that undoes the grouping."""
    flat = ids.reshape(-1)                                    # slot t·k + j: token t's j-th expert
    owner = flat // per_rank                                  # the rank that holds that expert
    order = torch.sort(owner, stable=True).indices            # slots grouped by owner, slot order kept inside
    sizes = torch.bincount(owner, minlength=world).tolist()   # split sizes: a collective needs them on the host
    return x[order // ids.shape[1]].split(sizes), (flat[order] % per_rank).split(sizes), order

# %% [markdown]
# Each rank then runs its experts on what arrived (as `k = 1` routing with weight 1), the results
# travel back along the same pieces, and the tokens' rank undoes the grouping and weights them:

# %%
def expert_compute(rows_in, local_in, w_gate_up_shard, w_down_shard):
    """On one rank: every arrived row through its expert (one expert, weight 1), in the pieces it came in."""
    rows, local = torch.cat(rows_in), torch.cat(local_in)
    ones = torch.ones(len(rows), 1, dtype=rows.dtype, device=rows.device)
    y = moe_experts(rows, w_gate_up_shard, w_down_shard, ones, local[:, None], impl="torch")
    return y.split([len(r) for r in rows_in])


def combine(y_back, order, weights):
    """On the tokens' rank: outputs back in slot order, weighted, summed over each token's k slots."""
    y_sorted = torch.cat(y_back).float()
    y_slots = torch.empty_like(y_sorted)
    y_slots[order] = y_sorted                                 # undo the dispatch's grouping
    T, k = weights.shape
    return (y_slots.view(T, k, y_sorted.shape[1]) * weights.float()[..., None]).sum(1)

# %%
def expert_parallel(xs, weights, ids, w_gate_up, w_down):
    """Each rank's tokens (lists with one entry per rank) through the experts sharded over len(xs) ranks."""
    world = len(xs)
    per = w_gate_up.shape[0] // world
    plans = [dispatch(x, i, world, per) for x, i in zip(xs, ids)]
    rows_in, local_in = all_to_all([p[0] for p in plans]), all_to_all([p[1] for p in plans])
    y_out = [expert_compute(rows_in[r], local_in[r], w_gate_up[r * per:(r + 1) * per], w_down[r * per:(r + 1) * per])
             for r in range(world)]
    y_back = all_to_all(y_out)                                # the reverse trip: every piece back to its sender
    return [combine(y_back[r], plans[r][2], weights[r]).to(xs[r].dtype) for r in range(world)]

# %% [markdown]
# Checked against `moe_experts` on all the tokens on one device, with section 3's experts and ragged
# routing: uneven token counts, a rank with no tokens, every slot on rank 0's experts, four ranks.
# The matrix printed is the all-to-all's traffic, slots from each rank (row) to each rank (column):

# %%
ep_cases = [([13, 10], "uneven tokens", None), ([23, 0], "rank 1 has no tokens", None),
            ([12, 11], "every slot on rank 0's experts", s_k["E"] // 2), ([5, 5, 6, 7], "four ranks", None)]
for tokens_per_rank, what, only_first in ep_cases:
    inp = moe_inputs(11, sum(tokens_per_rank), n_experts=only_first)
    xs, ws, ids_r = (list(inp[n].split(tokens_per_rank)) for n in ("x", "weights", "ids"))
    got = torch.cat(expert_parallel(xs, ws, ids_r, wgu_k, wd_k))
    want = moe_experts(**inp, w_gate_up=wgu_k, w_down=wd_k, impl="torch")
    per = s_k["E"] // len(tokens_per_rank)
    traffic = [torch.bincount(i.reshape(-1) // per, minlength=len(tokens_per_rank)).tolist() for i in ids_r]
    err = measure.relative_error(got, want)
    print(f"{what:31s} tokens per rank {tokens_per_rank}: traffic {traffic}, rel. error vs one device {err:.1e}")
    assert err <= tol

# %% [markdown]
# `minimax_lab.moe.parallel.expert_parallel_experts` is these steps with `torch.distributed`: each
# `all_to_all` becomes `dist.all_to_all_single` on one flat tensor with the split sizes (the rows of
# each piece) as arguments, after one small all-to-all of the sizes themselves so that every rank
# can size what it receives. With `two_processes = True` the next cell runs it in two `gloo`
# processes on this machine against the single-process layer (a shared expert and the fused Triton
# experts among the cases).

# %%
if two_processes:
    cases = [dict(T=13, d=24, f=20, E=4, k=2, skew="ragged"),
             dict(T=9, d=24, f=20, E=4, k=2, skew="empty_rank", router="sigmoid_bias", shared_expert=True),
             dict(T=11, d=24, f=20, E=4, k=2, skew="ragged", impl="triton")]
    print(*vmoe.run_parallel_check(cases, device=dev), sep="\n")

# %% [markdown]
# ## 5. On a GPU
#
# The `moe` bench suite (`python -m minimax_lab.bench moe`; full tables: `python -m minimax_lab.bench report`)
# checks and times ours, `torch._grouped_mm` and SGLang's Triton fused MoE from the same routing, bf16,
# k=8, at a Qwen3-30B-A3B-like shape (E=128, d=2048, f=768) and a MiniMax-M2-like one (E=256, d=3072,
# f=1536): decode against the measured copy bandwidth (the used experts' weights, read once), prefill
# against the measured bf16 GEMM rate. Error bars span each timing's p20-p80 over every recorded run
# that repeats it; with preset `gpu`, stars mark ours timed now on this machine.

# %%
recs = moe_records.gpu_records()
measured = moe_records.measure_here(P)
if recs:
    vmoe.on_a_gpu(recs, measured=measured, device_now=runtime.device_name()); plt.show()
display(Markdown(vmoe.on_a_gpu_words(recs)))

# %% [markdown]
# ## 6. Exercises
#
# Each checker draws fresh random routing with ragged expert loads and says what it expected.
# Solutions: `minimax_lab/exercises/solutions/ch05.py` (try first). In increasing difficulty:
# the router; one expert's FFN; the combine; the alignment in PyTorch; and the alignment as a
# Triton kernel.
#
# **05.1, top-k routing.** Section 1's softmax router, written by you. The checker compares weights and
# ids with the package's router, which your answer may not call.

# %%
def route_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k routing (Mixtral, Qwen3-MoE).

    ``logits [T, E]`` (one row of router scores per token). Take the softmax over the ``E``
    experts, keep the ``k`` largest probabilities of each row, and divide them by their sum so
    each token's ``k`` weights add up to 1. Return ``(weights [T, k] float32, ids [T, k] int64)``,
    each row in order of decreasing probability."""
    raise NotImplementedError  # your code here (three lines)


exercises.check("05.1", route_topk)

# %% [markdown]
# **05.2, the expert FFN.** What one expert computes on the rows routed to it: the SwiGLU of
# section 3's contract, on one expert's weights. The checker compares with the package's expert on
# fresh shapes, an empty batch among them.

# %%
def expert_swiglu(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """One expert's SwiGLU feed-forward on the ``n`` rows routed to it.

    ``x [n, d]``; ``w_gate_up [2f, d]``: rows ``0..f-1`` are the gate projection, rows
    ``f..2f-1`` the up projection (``nn.Linear``'s ``[out, in]`` layout); ``w_down [d, f]``.
    Return ``[n, d]``: ``down(silu(gate(x)) * up(x))``, where ``gate(x) = x @ W_gate^T`` and so on."""
    raise NotImplementedError  # your code here


exercises.check("05.2", expert_swiglu)

# %% [markdown]
# **05.3, the combine.** Read each slot's output from the aligned rows, weight it, add it to its
# token, and skip the padding rows. The checker compares on fresh routings whose padding rows hold NaN.

# %%
def combine_slots(y: torch.Tensor, sorted_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The combine step: each token's output is the weighted sum of its ``k`` expert outputs.

    ``weights [T, k]``: token ``t``'s routing weights; its ``k`` routed copies are the flat
    *slots* ``t*k + 0 .. t*k + k-1``. ``y [R, d]``: the experts' outputs in the aligned layout,
    row ``r`` holding the output for slot ``sorted_ids[r]`` (``sorted_ids [R]`` int). Rows whose
    ``sorted_ids`` is ``T*k`` are padding: their ``y`` is garbage (NaN here) and must not reach
    the result. Return ``[T, d]`` with ``out[t] = sum_j weights[t, j] * y[row of slot t*k + j]``."""
    raise NotImplementedError  # your code here


exercises.check("05.3", combine_slots)

# %% [markdown]
# **05.4, the alignment in PyTorch.** The layout of the picture at the top of the chapter: slots
# grouped by expert, each group padded to whole blocks. The checker compares both tensors with
# `align_tokens`, which your answer may not call (nor the package's other alignments).

# %%
def align_slots(ids: torch.Tensor, n_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The layout the fused MoE kernel reads: routed slots grouped by expert, padded to blocks.

    ``ids [T, k]``: the experts of each token; flat slot ``s = t*k + j`` is token ``t``'s
    ``j``-th choice, ``ids.reshape(-1)[s]``. Lay the slots out expert by expert (expert 0 first;
    inside an expert, slots in increasing order), then pad each expert's group with the sentinel
    ``T*k`` up to a multiple of ``block_m`` rows (an expert with no slot gets no rows).
    Return ``(sorted_ids, block_expert)``: ``sorted_ids`` int32 ``[R]`` (``R`` = all padded rows)
    and ``block_expert`` int32 ``[R // block_m]``, the expert that owns each block of ``block_m`` rows."""
    raise NotImplementedError  # your code here


exercises.check("05.4", align_slots)

# %% [markdown]
# **05.5, the alignment in Triton, without a sort.** Section 3.1 placed each slot by sorting keys;
# here you place them by counting instead. Copy `block_owner_kernel` into a new kernel
# that also receives `sorted_ids`, fill `sorted_ids` with the sentinel before the launch, and give
# each slot its row without sorting: in the one-hot matrix (a row per slot, a column per expert),
# a running sum (`tl.cumsum`) down a column numbers that expert's slots in slot order. The checker
# runs it on the kernel device, with one case that gives every expert several blocks, verifies that
# your kernel placed the slots, and refuses a kernel that sorts.

# %%
def align_in_triton(ids: torch.Tensor, n_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The alignment as one Triton program without a sort: complete the chapter's ``block_owner_kernel``.

    ``ids [T, k]`` (on the kernel device; small: ``T*k <= 96``, ``n_experts <= 40``). Return
    ``(sorted_ids, block_expert, num_rows)`` laid out exactly like ``align_tokens(ids, n_experts,
    block_m)``: ``sorted_ids`` int32 ``[capacity_for(T*k, n_experts, block_m)]`` with each
    expert's slots in slot order, every other row holding the sentinel ``T*k``;
    ``block_expert`` int32 ``[capacity // block_m]`` (-1 past the used blocks); ``num_rows``
    int32 ``[1]``. A slot's row is its expert's padded start plus its rank among that expert's
    slots, and a running sum (``tl.cumsum``) down each column of the one-hot matrix counts them.
    A kernel that calls ``tl.sort`` (or any sort) is refused."""
    raise NotImplementedError  # your code here


exercises.check("05.5", align_in_triton)

# %% [markdown]
# ## What limits us
#
# In decode the job is streaming the used experts' weights; at one token the step is too small to
# hide the launches (CUDA graphs remove the host's part), and an expert whose rows overflow one
# block is streamed once per block. In prefill the gathered token rows cannot use TMA's bulk loads,
# the intermediate `[rows, f]` makes a round trip through HBM between the two kernels, and each
# expert's ragged last block wastes up to `BLOCK_M − 1` rows of tensor-core work. FP8 stores a
# weight in one byte where bf16 takes two (section 3.4 counts the scales) but adds the activations'
# quantization, which pays only once launches are not the bottleneck (section 5's last panel).
# Expert parallelism adds two all-to-alls per layer, as uneven as the routing, whose sizes must
# reach the host before the rows move. On the CPU the Triton kernels run in the interpreter: they
# are checked there, never timed.
#
# ---
# **Previous:** [04 · Sparse attention kernels](04_sparse_attention_kernels.ipynb) · **Next:** [06 · A paged KV cache for agents](06_paged_kv_cache_for_agents.ipynb)
#
# **Read more:** Triton's [matrix multiplication](https://triton-lang.org/main/getting-started/tutorials/03-matrix-multiplication.html)
# and [grouped GEMM](https://triton-lang.org/main/getting-started/tutorials/08-grouped-gemm.html) tutorials;
# Switch Transformer (arXiv 2101.03961), GShard (arXiv 2006.16668), MegaBlocks (arXiv 2211.15841) and
# DeepSeek-V3 (arXiv 2412.19437); vLLM's `fused_moe` and its `moe_align_block_size`, the same layout as section 3.1's.
#
# **Package code used here:** `minimax_lab/moe/router.py`, `minimax_lab/moe/align.py`, `minimax_lab/moe/align_triton.py`, `minimax_lab/moe/experts.py`, `minimax_lab/moe/experts_reference.py`, `minimax_lab/moe/experts_torch.py`, `minimax_lab/moe/experts_triton.py`, `minimax_lab/moe/layer.py`, `minimax_lab/moe/parallel.py`, `minimax_lab/bench/suite_moe.py`, `minimax_lab/viz/moe.py`, `minimax_lab/viz/moe_records.py`, `minimax_lab/viz/tuner.py`

# %%
display(Markdown(moe_records.provenance(preset=P, seconds=time.perf_counter() - t_start, records=recs,
                                        measured=measured)))
