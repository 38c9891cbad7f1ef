# %% [markdown]
# # 05 · Mixture of Experts: routers, load balance and a fused Triton MoE
#
# **What this chapter builds:** top-k routers with bias balancing, the token alignment and the two fused expert GEMMs of a Triton MoE (each checked against `minimax_lab.moe`), FP8 experts, and expert parallelism over two processes.
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
run_parallel = True      # section 4: two gloo processes on this machine

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
from minimax_lab.viz import moe as vmoe
from minimax_lab.viz import tuner as vtuner

P = runtime.resolve_preset(preset)
dev, dtype = runtime.kernel_device(), runtime.compute_dtype()
print(f"device {runtime.device_name()}, preset {P}, compute dtype {dtype}, interpreter {runtime.is_interpreter()}")

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
# from the same seed on the same
# mixed image/text stream: once with the bias frozen at 0 (no balancing at all), once with the bias
# update at `bias_rate`. A hook on every MoE layer counts the routed slots of each expert at each
# step. On the CPU preset the runs are short (40 steps of 16 examples): long enough for the router
# to pick favourites, too short to learn the task; the cell prints the accuracy next to guessing.

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
threads = torch.get_num_threads()
torch.set_num_threads(runtime.pick(P, cpu=1, gpu=threads))   # matrices this small are not worth splitting
runs = {}
for name, rate in [("no balancing", 0.0), (f"bias balancing (rate {bias_rate})", bias_rate)]:
    torch.manual_seed(0)
    model = TinyMultimodalModel(cfg)
    for blk in model.blocks:
        blk.ffn.bias_update_rate = rate                       # the only difference between the two runs
    logs = vmoe.attach_load_logger(model)
    model, hist = train(cfg, tc, model=model, progress=False, device=runtime.pick(P, cpu=None, gpu=dev))
    runs[name] = dict(model=model, loads=[torch.stack(l).cpu() for l in logs])
    print(f"{name:32s} after {steps} steps: val loss {hist['val_loss'][-1]:.3f}, answer accuracy "
          f"{hist['val_acc'][-1]:.0%} (guessing: {chance:.0%}), {hist['seconds']:.1f} s")
torch.set_num_threads(threads)

# %%
vmoe.balance_figure(runs); plt.show()
print(vmoe.balance_words(runs))

# %% [markdown]
# Without balancing, the router's preferences at initialisation and in the first gradient steps
# decide the loads, and nothing pulls an over-used expert back; the bias update pushes the busiest
# expert towards the mean (compare the printed ratios; 1.0 is perfect balance). The bias changes
# *which* experts are picked, never the weights, so no gradient fights the language-model loss:
# DeepSeek-V3's argument for dropping the auxiliary loss. The stripes in the heatmaps are the mixed
# schedule: even steps are image batches, odd steps text-only, and the two route differently.
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
# The bias keeps each expert's *total* load near `1/E`; nothing makes the two modalities spread the
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
# ### 3.1 The alignment: which block belongs to which expert
#
# One Triton program, one lane per slot. A one-hot matrix `[slots, experts]` gives the counts (its
# column sums); each count rounded up to whole blocks, summed in expert order, says where each
# expert's rows end; the owner of block `b` is the number of experts that end at or before its
# first row. The buffers are sized by an upper bound (`capacity_for`: each used expert wastes fewer
# than `BLOCK_M` rows), so blocks past the end get the owner `-1` and their programs just exit.

# %%
@triton.jit
def block_owner_kernel(ids_ptr, block_expert_ptr, num_rows_ptr, n_slots, n_experts, n_blocks,
                       BLOCK_M: tl.constexpr, N_POW2: tl.constexpr, E_POW2: tl.constexpr, B_CHUNK: tl.constexpr):
    s = tl.arange(0, N_POW2)                                    # one lane per slot
    e = tl.arange(0, E_POW2)                                    # one column per expert
    ids = tl.load(ids_ptr + s, mask=s < n_slots, other=-1)      # lanes past the end match no expert
    onehot = (ids[:, None] == e[None, :]).to(tl.int32)          # [slots, experts]
    counts = tl.sum(onehot, axis=0)                             # slots per expert
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M        # rounded up to whole blocks
    pad_end = tl.cumsum(padded, axis=0)                         # where each expert's rows end
    tl.store(num_rows_ptr, tl.sum(padded, axis=0))
    for b0 in range(0, n_blocks, B_CHUNK):                      # owner: the experts that end at or before the block
        b = b0 + tl.arange(0, B_CHUNK)
        owner = tl.sum((pad_end[None, :] <= (b * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + b, tl.where(owner < n_experts, owner, -1), mask=b < n_blocks)


def block_owners(ids, n_experts, block_m):
    """(block_expert [capacity // block_m], num_rows [1]), laid out like the package's align_tokens."""
    n = ids.numel()
    n_pow2, e_pow2 = max(16, triton.next_power_of_2(n)), max(16, triton.next_power_of_2(n_experts))
    assert n_pow2 * e_pow2 <= 16384, "one program holds the whole [slots, experts] matrix: decode-sized batches"
    n_blocks = capacity_for(n, n_experts, block_m) // block_m
    block_expert = torch.empty(n_blocks, dtype=torch.int32, device=ids.device)
    num_rows = torch.empty(1, dtype=torch.int32, device=ids.device)
    block_owner_kernel[(1,)](ids.reshape(-1).contiguous(), block_expert, num_rows, n, n_experts, n_blocks,
                             BLOCK_M=block_m, N_POW2=n_pow2, E_POW2=e_pow2, B_CHUNK=64)
    return block_expert, num_rows


print("ours   :", [t.tolist() for t in block_owners(ids_demo.to(dev), E_demo, bm_demo)])
print("package:", [al.block_expert.tolist(), al.num_rows.tolist()])

# %% [markdown]
# Checked against the package on random routing with ragged loads (`k` distinct experts per token
# from skewed logits: some experts get many slots, some one, some none). Integer outputs must match
# element for element.

# %%
E_al, k_al, bm_al = runtime.pick(P, cpu=(8, 2, 4), gpu=(128, 8, 16))


def routing_ids(seed, T):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, E_al, generator=g) - 0.3 * torch.arange(E_al)   # low experts popular
    return {"ids": torch.topk(logits, k_al, dim=-1).indices.to(dev)}


def package_owners(ids):
    a = align_tokens(ids, E_al, bm_al)
    return a.block_expert, a.num_rows


for T_al in runtime.pick(P, cpu=[1, 7, 29, 64], gpu=[1, 5, 16]):
    res = measure.check(lambda ids: block_owners(ids, E_al, bm_al), package_owners,
                        lambda seed, T=T_al: routing_ids(seed, T), name=f"block owners, T={T_al}", trials=3, seed=T_al)
    print(res.summary(), f"(E={E_al}, k={k_al}, BLOCK_M={bm_al})")
    assert res.passed

# %% [markdown]
# What is left is `sorted_ids`, the slot in each row: a slot's row is its expert's padded start plus
# its rank among that expert's slots, and a running sum down each column of the one-hot matrix
# counts those. That completion is **exercise 05.5**. The package's decode alignment does the same
# job with one `tl.sort` of the keys `expert·4096 + slot` instead of the one-hot matrix:

# %%
from minimax_lab.moe import align_triton
from minimax_lab.viz.source import show_source

show_source(align_triton._align_sort_kernel)

# %% [markdown]
# ### 3.2 The fused expert GEMMs over aligned blocks
#
# Two kernels, each with one program per (block of `BLOCK_M` rows, tile of `BLOCK_N` output
# columns). The block's expert is one load; the rows are *gathered*: row `r` holds slot
# `sorted_ids[r]`, whose token is `slot // k`, and padding rows load zeros and store nothing.
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
    a = align_tokens(ids, E, block_m)          # the package's alignment (any size)
    n_blocks = a.block_expert.numel()
    h = torch.empty(a.capacity, f, dtype=x.dtype, device=x.device)
    y = torch.empty(T * k, d, dtype=x.dtype, device=x.device)
    gate_up_kernel[(n_blocks, triton.cdiv(f, block_n))](x.contiguous(), w_gate_up.contiguous(), h, a.sorted_ids,
                                                        a.block_expert, T * k, k, d, f,
                                                        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    down_kernel[(n_blocks, triton.cdiv(d, block_n))](h, w_down.contiguous(), y, a.sorted_ids, a.block_expert,
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


def moe_inputs(seed, T):
    gg = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, s_k["E"], generator=gg) - 0.2 * torch.arange(s_k["E"])   # ragged expert loads
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
# ### 3.3 What the package's kernels add, step by step
#
# `minimax_lab.moe.experts_triton` runs the same two kernels; each addition has a reason on the GPU:
#
# 1. **Tiles by regime** (`pick_config`): 16- or 32-row blocks in decode, where an expert gets a
#    handful of rows; 128 in prefill, where it gets hundreds.
# 2. **Swapped operands in decode** (`SWAP_AB`): the weight tile becomes the MMA's M side, so a
#    16-row block still feeds full-size tensor-core instructions (excerpt below).
# 3. **No alignment at all for a step of a few tokens** (`SLOT_BLOCKS`): each slot is a block of its
#    own and its expert is read straight from the router's ids. The weights streamed are the same;
#    one launch fewer is a visible part of a one-token step.
# 4. **Weight tiles through TMA in prefill** (`USE_TMA`, section 3.5) and **FP8 weights** (`FP8`,
#    section 3.4), plus 64-bit offsets for large weight tensors.

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
from minimax_lab.bench import suite_moe as moe_bench
from minimax_lab.notebook import words

w13, s13, w2, s2 = quantize_experts(wgu_k, wd_k)
fp8_kernel = runtime.supports("fp8")
inp = moe_inputs(7, 23)
fp8_ref = moe_experts(**inp, w_gate_up=w13, w_down=w2, w_gate_up_scale=s13, w_down_scale=s2, impl="reference")
exact = moe_experts(**inp, w_gate_up=wgu_k, w_down=wd_k, impl="reference")
fp8_bytes, full_bytes = w13.nbytes + w2.nbytes + s13.nbytes + s2.nbytes, wgu_k.nbytes + wd_k.nbytes
print(f"weights + scales: {fp8_bytes:,} bytes, {words.more_or_less(fp8_bytes, full_bytes, smaller='fewer')} "
      f"{full_bytes:,} in {dtype}; FP8 reference vs unquantized experts: rel. error {measure.relative_error(fp8_ref, exact):.1e}")
if fp8_kernel:
    err = measure.relative_error(moe_experts(**inp, w_gate_up=w13, w_down=w2, w_gate_up_scale=s13, w_down_scale=s2,
                                             impl="triton"), fp8_ref)
    print(f"FP8 Triton kernels vs the FP8 reference: rel. error {err:.1e}")
    assert err <= moe_bench.fp8_check_tolerance(True, 23, dev)   # e4m3 rounding steps on a GPU, rounding only here
else:
    print(f"{runtime.device_name()}: runtime.capabilities() reports no FP8 tensor cores, so the FP8 kernels are "
          "skipped here (section 5 shows them on an H200)")

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
# checked every candidate against the fp32 reference, timed it at four prefill cases on an H200 and
# kept the fastest. What it measured:

# %%
tuned = vtuner.tuner_measurements("moe_experts", "prefill")
if tuned:
    vtuner.tuner_candidates(*tuned, title="prefill candidates timed on an H200"); plt.show()
    print(vtuner.tuner_words(*tuned))
excerpt(experts_triton._gate_up_kernel, "if USE_TMA:", 4)

# %% [markdown]
# ## 4. Expert parallelism: experts on different processes
#
# When the experts do not fit one GPU (MiniMax-M2's 256 experts are ~7 GB per layer in bf16) they
# are **sharded**: rank `r` of `W` holds experts `[r·E/W, (r+1)·E/W)`, every rank keeps its own
# tokens and a copy of the small router. A forward is route → **dispatch** (sort slots by owning
# rank, swap counts, `all_to_all_single` the rows there) → each rank runs its experts on what
# arrived → **combine** (`all_to_all_single` back, unsort, weight, sum over `k`): GShard's scheme
# (arXiv 2006.16668), dropless. `minimax_lab.moe.parallel` implements it with collectives that both
# `gloo` and `nccl` provide; two `gloo` processes check that it equals the single-process layer,
# including a rank with no tokens, every token on rank 0's experts, and the fused Triton experts.

# %%
if run_parallel:
    cases = [dict(T=13, d=24, f=20, E=4, k=2, skew="ragged"),
             dict(T=9, d=24, f=20, E=4, k=2, skew="empty_rank", router="sigmoid_bias", shared_expert=True),
             dict(T=9, d=24, f=20, E=4, k=2, one_expert=True),
             dict(T=11, d=24, f=20, E=4, k=2, skew="ragged", impl="triton")]
    t0 = time.perf_counter()
    print(*vmoe.run_parallel_check(cases, device=dev), sep="\n")
    print(f"2 gloo processes on {dev}, {time.perf_counter() - t0:.1f} s including process start")

# %% [markdown]
# ## 5. On a GPU
#
# The `moe` bench suite (`python -m minimax_lab.bench moe`; full tables: `python -m minimax_lab.bench report`)
# checks and times ours, `torch._grouped_mm` and SGLang's Triton fused MoE from the same routing, bf16,
# k=8, at a Qwen3-30B-A3B-like shape (E=128, d=2048, f=768) and a MiniMax-M2-like one (E=256, d=3072,
# f=1536): decode against the measured copy bandwidth (the used experts' weights, read once), prefill
# against the measured bf16 GEMM rate; on a GPU, stars mark this machine, measured now.

# %%
from minimax_lab.notebook import recorded

recs = recorded.all_of("moe")
measured = moe_bench.run_shape(moe_bench.GPU_SHAPES[0], [64, 4096], reps=20, with_loop=False) if P == "gpu" else []
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
# **05.5, the alignment in Triton.** Copy section 3.1's `block_owner_kernel` into a new kernel that also receives `sorted_ids`,
# fill `sorted_ids` with the sentinel before the launch (so padding needs no work in the kernel),
# and store each slot at its row. The checker runs it on the kernel device, with one case that gives
# every expert several blocks, and verifies that your kernel placed the slots.

# %%
def align_in_triton(ids: torch.Tensor, n_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The alignment as one Triton program: complete the chapter's ``block_owner_kernel``.

    ``ids [T, k]`` (on the kernel device; small: ``T*k <= 96``, ``n_experts <= 40``). Return
    ``(sorted_ids, block_expert, num_rows)`` laid out exactly like ``align_tokens(ids, n_experts,
    block_m)``: ``sorted_ids`` int32 ``[capacity_for(T*k, n_experts, block_m)]`` with each
    expert's slots in slot order, every other row holding the sentinel ``T*k``;
    ``block_expert`` int32 ``[capacity // block_m]`` (-1 past the used blocks); ``num_rows``
    int32 ``[1]``. A slot's row is its expert's padded start plus its rank among that expert's
    slots, and a running sum (``tl.cumsum``) down each column of the one-hot matrix counts them."""
    raise NotImplementedError  # your code here


exercises.check("05.5", align_in_triton)

# %% [markdown]
# ## What limits us
#
# In decode the job is streaming the used experts' weights, and two things keep a kernel from the
# copy ceiling: at one token the step is too small to hide the launches (CUDA graphs remove the
# host's part), and an expert whose rows overflow one block is streamed once per block. In prefill
# the gathered token rows cannot use TMA's bulk loads (they are scattered), the intermediate
# `[rows, f]` makes a round trip through HBM between the two kernels, and the ragged last block of
# each expert wastes up to `BLOCK_M − 1` rows of tensor-core work. FP8 halves the weight bytes but
# adds the activations' quantization, which only pays once launches are not the bottleneck. And on
# the CPU the Triton kernels run in the interpreter, about a thousand times slower than compiled:
# they are checked there, never timed.
#
# ---
# **Previous:** [04 · Sparse attention kernels](04_sparse_attention_kernels.ipynb) · **Next:** [06 · A paged KV cache for agents](06_paged_kv_cache_for_agents.ipynb)
#
# **Package code used here:** `minimax_lab/moe/router.py`, `minimax_lab/moe/align.py`, `minimax_lab/moe/align_triton.py`, `minimax_lab/moe/experts.py`, `minimax_lab/moe/experts_reference.py`, `minimax_lab/moe/experts_torch.py`, `minimax_lab/moe/experts_triton.py`, `minimax_lab/moe/layer.py`, `minimax_lab/moe/parallel.py`, `minimax_lab/bench/suite_moe.py`, `minimax_lab/viz/moe.py`, `minimax_lab/viz/tuner.py`
