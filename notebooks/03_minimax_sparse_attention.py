# %% [markdown]
# # 03 · MiniMax Sparse Attention: why blocks, and an index branch that learns from its teacher
#
# **What this chapter builds:** MSA's block selection on the tiny model: an index branch that
# scores key blocks, distilled from the model's own attention, measured by recall against a sliding
# window and an oracle, and a needle test of dense against sparse attention as the context grows.
#
# **It assumes:** [01 · Multimodal from step zero](01_multimodal_from_step_zero.ipynb) (the tiny
# model) and [02 · FlashAttention in Triton](02_flash_attention_in_triton.ipynb) (softmax over
# tiles, log-sum-exp, a Triton kernel).
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/03_minimax_sparse_attention.ipynb)
#
# Dense causal attention costs `O(S²)`: the setup cell prints what that means for one layer at a
# 1M-token context and MSA's public shape, and what the H200 recorded for it. MiniMax Sparse
# Attention (MSA; arXiv 2606.13392) lets every query attend to only `topk` **blocks** of `Bk`
# consecutive keys (16 × 128 = 2,048 keys), chosen by a cheap **index branch**. This chapter asks:
#
# 1. *Why sparse, why blocks?* Does a small part of the keys hold most of the attention mass?
# 2. *What does the index branch select?* Selection maps over a multi-image document.
# 3. *The indexer needs a teacher*: distill it from the model's own attention.
# 4. *Needle retrieval*: dense against sparse as the context grows.
#
# Chapter 04 builds the kernels that make the selection and the sparse attention fast.

# %%
# In Colab, install the workbook's package first (locally, `make lab` already did).
import subprocess, sys
if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "minimax-lab[notebooks] @ git+https://github.com/minimax-lab/minimax-lab"], check=True)

# %% tags=["parameters"]
preset = "auto"          # "cpu" (tiny sizes, Triton interpreter) or "gpu"
distill_steps = None     # indexer distillation steps (None: 48 on CPU, 400 on GPU)
needle_docs = None       # documents per needle point (None: 24 on CPU, 128 on GPU)
train_no_rope = None     # also train the indexer without positions, for comparison (None: on GPU only)

# %%
import matplotlib.pyplot as plt
import torch

from minimax_lab import exercises, runtime  # first: on a CPU it switches Triton to its interpreter

import triton  # noqa: E402 (after runtime, see above)
import triton.language as tl  # noqa: E402
from minimax_lab.model import load_pretrained
from minimax_lab.model import msa_indexer as mi
from minimax_lab.model.needle import answer_words, format_needle, needle_batch, needle_document, needle_eval
from minimax_lab.viz import msa as vmsa
from minimax_lab.viz import selection as vsel

P = runtime.resolve_preset(preset)
torch.set_num_threads(runtime.pick(P, cpu=1, gpu=torch.get_num_threads()))  # small matrices: a 2nd thread only waits
distill_steps = distill_steps or runtime.pick(P, cpu=48, gpu=400)
needle_docs = needle_docs or runtime.pick(P, cpu=24, gpu=128)
train_no_rope = runtime.pick(P, cpu=False, gpu=True) if train_no_rope is None else train_no_rope
torch.manual_seed(0)
print(vmsa.why_sparse())
model, cfg = load_pretrained(use_indexer=True)  # the tiny model of chapter 01, plus an untrained index branch
Bk, TOPK, G = cfg.msa_block_size, cfg.msa_topk, cfg.n_kv_heads
print(f"tiny model: {cfg.n_layers} layers, {cfg.n_heads} query heads in {G} groups, head dim {cfg.head_dim}; "
      f"MSA at this size: Bk = {Bk}, topk = {TOPK} (a budget of {Bk * TOPK} keys per query)")

# %% [markdown]
# ## 1. Why sparse, and why blocks
#
# Sparse attention pays off only if, for most queries, a small part of the keys carries most of the
# softmax mass. We measure it directly: for each query, keep its top `f·n` visible keys by mass
# (`n` = the keys it can see) and add up what they hold. Uniform attention gives the diagonal. Then
# the same with **blocks** of consecutive keys. Blocks are what MSA can afford: a block is a
# contiguous tile that one tensor-core matmul and one memory transaction can read, whereas a
# token-level top-k would gather scattered rows.
#
# Left: the tiny model on one image and a question (its training distribution), and on a 16-image
# document. Right: generated rows, where each query looks for one pattern planted in a few earlier
# keys, either as one contiguous span (**clustered**, like an image or a paragraph) or at random
# places (**scattered**).

# %%
conc = vmsa.concentration_curves(model, P)
vmsa.concentration_figure(conc)
plt.show()
print(vmsa.concentration_table(conc))

# %% [markdown]
# Compare each block curve with its token curve (the lines above compare them at 10%). When the
# relevant content is clustered, a query's mass falls in a couple of blocks, and choosing blocks
# should lose little against choosing tokens. When the same content lies at random places, it is
# just as concentrated token by token, but every relevant key sits in a different block, among
# `Bk − 1` irrelevant ones, and the block curve drops towards the diagonal. Blocks are a bet on
# locality, which image patches and text mostly honour. The tiny model was trained on ~25-token
# sequences; on a long document it spreads its text queries over many images, and its curves say
# how concentrated that leaves it.
#
# ## 2. The index branch and the selection, drawn
#
# The contract (`minimax_lab.attention.msa_select`): per token, one index query per group
# `q_idx[t, g]` and one shared index key `k_idx[t]`. A token's score is `q_idx·k_idx/√D_idx`, and
# a block's score is the max over its causally visible tokens. The local block is always selected
# and placed last, after the `topk − 1` best earlier blocks (ties go to the lower id). A row that
# sees at most `topk` blocks selects all of them, and unused slots hold `-1`. In the tiny model the
# index branch is two small linear maps per layer (`Block.idx_q`, `Block.idx_k`). They are not in
# the checkpoint, so they start random. Here is what a random indexer selects on a 12-image
# document.

# %%
doc = needle_document(12, seed=7)
mi.init_indexer(model, seed=0)
_, recall = vmsa.selection_figure(model, doc, "untrained indexer")
plt.show()
print(f"untrained indexer: this document's recall of the attention mass (last layer) {recall:.3f}")

# %% [markdown]
# Cyan bands mark the images (alternating shades; the needle image, the only one with the asked
# shape, in red), on the key-block axis at the top and on the query axis at the left. The arrow
# marks the answer position. The right panel's background is the **teacher**: how much dense
# attention mass each block gets. A random indexer's picks do not follow the bright cells. The
# recall printed under the picture is the share of the mass they catch anyway.
#
# ## 3. The indexer needs a teacher
#
# `minimax_lab.model.msa_indexer.distill_indexer` trains only the index branch (the model is
# frozen) by `KL(P ‖ Q)`. `P` is the main branch's detached attention summed over each block (the
# heads of a group averaged); `Q` is the softmax of the indexer's max-pooled block scores. First
# comes a short **dense warm-up**, where the main branch runs dense; its attention does not depend
# on the indexer, so it is computed once per batch. Then a **sparse stage**, where the main branch
# attends only to the blocks the indexer selects, so later layers see the hidden states of the
# sparse model. We track **recall**, the fraction of the dense attention mass that the selected
# blocks capture on held-out documents (over queries that see more than `topk` blocks), against the
# **sliding window** (the `topk` most recent blocks: the same FLOPs) and the **oracle** (the best
# `topk` blocks by mass: an upper bound).
#
# One design point matters on this model. The index projections see the hidden state, and the
# first layer's hidden states carry no position (the tiny model applies RoPE only inside
# attention). A teacher whose queries lean on "the blocks just before me" cannot be imitated
# without positions, so we rotate `q_idx` and `k_idx` by RoPE (`index_rope=True`; DeepSeek's
# lightning indexer does the same on part of its index dims). With `train_no_rope=True` (the
# default on a GPU; it doubles the training time on a CPU) the variant without positions is trained
# too, for comparison.

# %%
dc = mi.DistillConfig(steps=distill_steps, warmup_steps=max(1, distill_steps * 3 // 8),
                      eval_every=max(1, distill_steps // 8), n_images=12)
histories = {}
if train_no_rope:
    histories["no positions"] = mi.distill_indexer(model, mi.DistillConfig(**{**dc.__dict__, "index_rope": False}))
histories["RoPE on q_idx, k_idx"] = mi.distill_indexer(model, dc)  # trained last: the model keeps this one
vmsa.distill_figure(histories, topk=TOPK, block_size=Bk)
plt.show()
print(vmsa.distill_summary(histories))

# %% [markdown]
# **FP8 index keys.** At decode the index branch reads every page's index key at every step, so
# the decode kernels can store those keys in FP8 (e4m3, one power-of-two scale per token: half the
# bytes). Rounding a key to 3 mantissa bits can reorder blocks whose scores are close. Here is what
# it does to the trained indexer on held-out documents:

# %%
fp8 = mi.fp8_index_recall(model, needle_batch(12, runtime.pick(P, cpu=16, gpu=64), seed=21), block_size=Bk, topk=TOPK)
print(vmsa.fp8_summary(fp8))

# %% [markdown]
# Next, the same recall on other held-out documents: of the 12-image training length, and shorter
# and longer ones (the indexer never saw those lengths). As the context grows, a fixed `topk·Bk` budget covers a shrinking share
# of a diffuse attention, so every recall should fall. What to read is the gap between the indexer,
# the window and the oracle at each length; the last column gives the indexer's gap to the window,
# measured on the same documents, with two standard errors over them.

# %%
ctx = vmsa.recall_by_length(model, runtime.pick(P, cpu=(8, 12, 16, 32), gpu=(8, 12, 16, 32, 64)),
                            n_docs=runtime.pick(P, cpu=4, gpu=16))
print(vmsa.recall_length_table(ctx))

# %% [markdown]
# Now the trained indexer's selection on the same document as before. Below it, which blocks the
# **answer token** (the final "?") picks in that document, over all layers and groups (the local
# block, hatched, is selected by rule), and then how often it picks the needle's block over 24 other
# documents, against a random pick. Does it pick the needle?

# %%
_, recall = vmsa.selection_figure(model, doc, "trained indexer")
plt.show()
print(f"trained indexer: this document's recall of the attention mass (last layer) {recall:.3f}")
ans = vmsa.answer_token_blocks(model, doc, n_images=12, n_docs=24, seed=9)
plt.show()
print(ans.summary)

# %% [markdown]
# ## 4. Needle retrieval, dense against MSA, as the context grows
#
# `minimax_lab.model.needle.needle_eval` builds documents of 1 to 32 images (23 to 519 tokens). In
# each, exactly one image (the needle) holds the asked shape ("what colour is the triangle ?"). At
# the answer position it measures three things:
#
# * **accuracy**: the model's own argmax answer. There are four colours, so a model that guesses
#   among them scores 0.25;
# * **needle selected**: the fraction of (layer, group) rows whose selected blocks hold the needle
#   object's patch, a retrieval probe of the index branch alone;
# * the attention mass on the needle image.
#
# Modes: `dense`, `msa` (the trained indexer), `window` (the `topk` most recent blocks: the same
# FLOPs) and `oracle` (the `topk` blocks with the most dense attention mass: the best any selection
# of that size can do). The tiny model was trained on **one** image per sequence (~25 tokens), so
# long documents are pure length generalization. Dense attention is the baseline here, not a
# ceiling.

# %%
res = needle_eval(model, (1, 4, 8, 16, 32), n_docs=needle_docs, modes=("dense", "msa", "window", "oracle"))
print(format_needle(res))
vsel.needle_plot(res)
plt.show()
print(vsel.needle_verdict(res, answers=answer_words(model, res["n_images"][-1], needle_docs)))

# %% [markdown]
# How to read it. Each point carries two standard errors (counting documents), and the sentences
# under the plot compare the modes at every length: a gap inside two standard errors is called level,
# never a win or a loss. Their last line is the result at this number of documents.
#
# * **Dense against guessing.** A model that merely lost the needle still answers with a colour and
#   scores about 0.25 by luck. Below that, with few colour words among its answers, it fails
#   systematically: at the answer token the dense softmax is spread over hundreds of image patches,
#   a context unlike anything the model was trained on.
# * **The oracle against dense.** Where the oracle is ahead, the selection does more than save FLOPs:
#   each query sees only `topk·Bk` keys, a context about as short as the training sequences, so the
#   model stays in the regime it was trained for.
# * **The indexer against the window** is the test of the index branch, since both cost the same.
#   Section 3 measured recall of attention *mass*; this measures retrieval of one fact. The two need
#   not agree: an indexer can keep more mass than the window and still miss the one block that
#   holds the answer. Two standard errors shrink with the square root of the documents: four times
#   as many halve them (`needle_docs`; the GPU preset uses 128).
#
# ## 5. Exercises
#
# Each is checked on fresh random inputs with a ragged last block (`exercises.check` says what is
# right or wrong; it never stops the notebook). Solutions are in
# `minimax_lab/exercises/solutions/ch03.py`; try first.
#
# **03.1 Block scores from mean-pooled keys.** MSA scores a block by the *max* over its tokens of
# `q_idx·k_idx` (what `msa_select` does): `Bk` dots per (query, block). A cheaper family of
# indexers (MoBA, for one) pools the block's keys first and takes one dot with the *mean* key, which
# is the mean of the token scores. Write that score table.

# %%
def block_scores_mean(q_idx: torch.Tensor, k_idx: torch.Tensor, block_size: int) -> torch.Tensor:
    """Score every earlier key block for every query, from mean-pooled keys.

    ``q_idx [S, G, D]`` (one index query per token and group), ``k_idx [S, D]`` (one index key per
    token). Key block ``j`` holds the tokens ``j*block_size .. (j+1)*block_size - 1``; query ``t``'s
    own (local) block is ``t // block_size``. Return fp32 ``[S, G, n_blocks]``
    (``n_blocks = ceil(S / block_size)``) with

        score[t, g, j] = q_idx[t, g] . mean(k_idx[j*block_size : (j+1)*block_size]) / sqrt(D)

    for the blocks ``j < t // block_size`` (they are complete and fully visible), and ``-inf``
    for the local block and every later one (MSA always keeps the local block: it is not ranked)."""
    raise NotImplementedError  # your code here (pool the keys once, then one matmul)


exercises.check("03.1", block_scores_mean)

# %% [markdown]
# **03.2 The top-k rule.** Given a table of block scores (the checker passes MSA's max-pooled
# ones), apply MSA's rule exactly as `msa_select` does, including the order of ties: the checker
# also draws integer-valued index vectors, whose scores tie often, and puts junk in the entries you
# must ignore.

# %%
def select_blocks(scores: torch.Tensor, block_size: int, topk: int) -> torch.Tensor:
    """MSA's selection rule. ``scores [S, G, n_blocks]`` fp32: a score per (query t, group g,
    key block j); the entries for the local block ``t // block_size`` and later ones hold
    anything (ignore them). Return int32 ``[S, G, topk]``, per row:

    * ``n = t // block_size + 1`` blocks are visible. If ``n <= topk``: all of them, ascending ids
      ``0, 1, ..., n-1``, then ``-1`` in the unused slots.
    * Otherwise the ``topk - 1`` earlier blocks with the highest scores, in descending score order
      (equal scores: the lower block id first), then the local block last."""
    raise NotImplementedError  # your code here


exercises.check("03.2", select_blocks)

# %% [markdown]
# **03.3 The teacher, in Triton.** This chapter computes the teacher's block mass from the full
# `S × S` attention probabilities. At 1M tokens that matrix cannot exist. A kernel can compute the
# mass a tile at a time instead, given each row's log-sum-exp (chapter 02's kernel returns it): the
# probability of key `j` for query `t` is `exp(q·k/√D − lse[t])`, so a (row tile, key block)
# program sums those over its block. Complete `block_mass_kernel` and launch it from `block_mass`.
# The checker draws ragged lengths and non-contiguous views.

# %%
@triton.jit
def block_mass_kernel(Q, K, Lse, Out, S, n_blocks, scale, stride_q, stride_k,
                      D: tl.constexpr, BLOCK_M: tl.constexpr, BK: tl.constexpr):
    pid_m, j = tl.program_id(0), tl.program_id(1)      # a tile of query rows, one key block
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    keys = j * BK + tl.arange(0, BK)
    d = tl.arange(0, D)
    # your code here: load the q rows and the k rows of block j (masked past S), the scores
    # q . k * scale with tl.dot (input_precision="ieee": full fp32), the causal mask keys <= rows,
    # exp(score - lse[row]), and store each row's sum over the block at Out[row, j]


def block_mass(q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, block_size: int) -> torch.Tensor:
    """The teacher's block mass for one head, computed by a Triton kernel a tile at a time.

    ``q, k`` fp32 ``[S, D]`` (``D`` a power of two >= 16; either may be a non-contiguous view),
    ``lse`` fp32 ``[S]``: row ``t``'s log-sum-exp of its causal scores ``q[t] . k[j] / sqrt(D)``
    over ``j <= t`` (chapter 02's kernel returns it). Return fp32 ``[S, n_blocks]``
    (``n_blocks = ceil(S / block_size)``) with

        mass[t, b] = sum over keys j of block b with j <= t of exp(q[t] . k[j] / sqrt(D) - lse[t])

    so each row sums to 1, and blocks after ``t``'s own block get 0."""
    raise NotImplementedError  # your code here: launch the kernel above, one program per (row tile, key block)


exercises.check("03.3", block_mass)

# %% [markdown]
# ## What limits us
#
# The indexer is only as good as its teacher: distillation can move its recall towards the oracle's,
# but the oracle itself is bounded by how concentrated the main branch's attention is. The MSA
# paper also adapts the main weights to sparsity, which takes far more training than a CPU gives.
# The tiny model's documents are short and its training sequences shorter, so its needle curves
# measure length generalization as much as selection; a model trained on long documents is what
# makes those curves mean what they would at 1M tokens. And the selection itself costs `O(S²·D_idx)`
# dot products (every key is scored, then max-pooled), against `O(S·topk·Bk·D)` for the attention.
# At long context the index branch, not the attention, becomes the larger term: the kernels of
# chapter 04 are built around that.

# %% [markdown]
# ---
# **Previous:** [02 · FlashAttention in Triton](02_flash_attention_in_triton.ipynb) · **Next:** [04 · Sparse attention kernels](04_sparse_attention_kernels.ipynb)
#
# **Package code used here:** `minimax_lab/attention/msa.py`, `minimax_lab/model/msa_indexer.py`, `minimax_lab/model/needle.py`, `minimax_lab/data/needle.py`, `minimax_lab/viz/msa.py`, `minimax_lab/viz/selection.py`, `minimax_lab/exercises/ch03.py`
