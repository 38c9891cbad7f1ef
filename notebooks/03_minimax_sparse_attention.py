# %% [markdown]
# # 03 · MiniMax Sparse Attention: blocks, an index branch, and the teacher it learns from
#
# **What this chapter builds:** MSA's block selection in PyTorch (the block scores, the top-k rule and
# the index branch's distillation loss), each checked against the package; then an index branch
# taught by a model's own attention on a lookup whose answers lie many blocks back, measured against
# a sliding window and a random pick of the same cost as the context grows; and the same recipe on
# chapter 01's tiny model.
#
# **It assumes:** [01 · Multimodal from step zero](01_multimodal_from_step_zero.ipynb) (the tiny
# model) and [02 · FlashAttention in Triton](02_flash_attention_in_triton.ipynb) (softmax over
# tiles, log-sum-exp, a Triton kernel).
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/03_minimax_sparse_attention.ipynb)
#
# Dense causal attention costs `O(S²)`: the setup cell prints what that means for one layer at a
# 1M-token context and MSA's public shape, and what an H200 recorded for it. MiniMax Sparse
# Attention (MSA; arXiv 2606.13392) lets every query attend to only `topk` **blocks** of `Bk`
# consecutive keys (16 × 128 = 2,048 keys at that shape), chosen by a cheap **index branch**. The
# choice is a top-k, which passes no gradient, so the index branch learns from a **teacher**: the
# main branch's own attention. This chapter asks:
#
# 1. *Why blocks?* How much attention mass the best blocks hold, against the best tokens.
# 2. *The index branch, in code*: block scores and the selection rule.
# 3. *A task where the selection decides*: a lookup whose answers lie many blocks back.
# 4. *The teacher*: the distillation loss in code, and what the index branch learns with the
#    teacher, with a shuffled one, and without one.
# 5. *The needle test as the context grows.*
# 6. *The same recipe on the tiny multimodal model*, whose attention is far more spread out.
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
distill_steps = None     # the lookup's index distillation steps (None: 60 on CPU, 120 on GPU)
held_out = None          # held-out lookup sequences per measurement (None: 64 on CPU, 256 on GPU)
tiny_steps = None        # the tiny model's index distillation steps (None: 48 on CPU, 400 on GPU)

# %%
import time

import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

from minimax_lab import exercises, runtime  # first: on a CPU it switches Triton to its interpreter

import triton  # noqa: E402 (after runtime, see above)
import triton.language as tl  # noqa: E402
from minimax_lab.attention import msa_select
from minimax_lab.attention.msa_backward_index import index_distill_loss
from minimax_lab.attention.msa_reference import block_scores_reference
from minimax_lab.model import load_pretrained
from minimax_lab.model import lookup as lk
from minimax_lab.model import lookup_index as li
from minimax_lab.model import msa_indexer as mi
from minimax_lab.viz import lookup as vlk
from minimax_lab.viz import msa as vmsa

# %%
t_start = time.perf_counter()
P = runtime.resolve_preset(preset)
torch.set_num_threads(runtime.pick(P, cpu=1, gpu=torch.get_num_threads()))  # small matrices: a 2nd thread only waits
distill_steps = distill_steps or runtime.pick(P, cpu=60, gpu=120)
held_out = held_out or runtime.pick(P, cpu=64, gpu=256)
tiny_steps = tiny_steps or runtime.pick(P, cpu=48, gpu=400)
print(f"device {runtime.device_name()}, preset {P}")
print(vmsa.why_sparse())
print("  (recorded with", vmsa.recorded_with() + ")")
model, cfg = load_pretrained(use_indexer=True)  # the tiny model of chapter 01, plus an untrained index branch
Bk, TOPK = cfg.msa_block_size, cfg.msa_topk

# %% [markdown]
# ## 1. Why sparse, and why blocks
#
# Sparse attention pays off only if, for most queries, a small part of the keys carries most of the
# softmax mass. We measure it directly: for each query, keep its top `f·n` visible keys by mass
# (`n` = the keys it can see) and add up what they hold. Uniform attention gives the diagonal. Then
# the same with **blocks** of consecutive keys. Blocks are what MSA can afford: a block is a
# contiguous tile of keys, read from memory in whole rows and fed to one tensor-core matmul, whereas
# a token-level top-k would gather scattered rows.
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
# loses little against choosing tokens. When the same content lies at random places, it is just as
# concentrated token by token, but every relevant key sits in a different block, among `Bk − 1`
# irrelevant ones, and the block curve drops towards the diagonal. Blocks are a bet on locality,
# and the generated rows show both ends of it. The tiny model was trained on ~25-token sequences; on
# a 16-image document, read its block line against its token line above: the gap between them is
# what choosing blocks costs it.
#
# ## 2. The index branch, in code
#
# Per token, the index branch computes one **index query** per KV group, `q_idx[t, g]`, and one
# **index key** shared by the groups, `k_idx[t]` (two small linear maps of the hidden state, with
# `D_idx` much smaller than the head dimension). Query `t` scores each key `j ≤ t` it can see by
# `q_idx[t, g]·k_idx[j]/√D_idx`, and a block by the **max** over its visible keys: one strongly
# matching key is enough to pick its block. Here it is for a batch, with a ragged last block, checked
# against the package's reference on small integers (which make equal scores common):

# %%
def block_scores(q_idx, k_idx, block_size):
    """q_idx [B, S, G, D], k_idx [B, S, D] -> fp32 [B, S, G, n_blocks]: each block's best visible key."""
    B, S, G, D = q_idx.shape
    n_blocks = -(-S // block_size)                                                  # ceil
    scores = torch.einsum("btgd,bjd->btgj", q_idx.float(), k_idx.float()) / D**0.5  # [B, S(query), G, S(key)]
    future = torch.arange(S)[None, :] > torch.arange(S)[:, None]                    # key j after query t
    scores = scores.masked_fill(future[None, :, None, :], float("-inf"))
    scores = torch.nn.functional.pad(scores, (0, n_blocks * block_size - S), value=float("-inf"))
    return scores.view(B, S, G, n_blocks, block_size).amax(-1)  # -inf: a block with no visible key


g = torch.Generator().manual_seed(0)
q_idx = torch.randint(-2, 3, (2, 125, 2, 8), generator=g).float()  # B=2, S=125 (last block: 13 keys), G=2
k_idx = torch.randint(-2, 3, (2, 125, 8), generator=g).float()
scores = block_scores(q_idx, k_idx, 16)
print("block scores", list(scores.shape), "equal to the package's reference:",
      torch.equal(scores, block_scores_reference(q_idx, k_idx, 16)))

# %% [markdown]
# The **selection rule** of MSA: the query's own block (the **local** block, `t // Bk`) is always
# selected, and placed **last**. Before it come the `topk − 1` earlier blocks with the highest
# scores, best first; equal scores go to the **lower** block id. A query that sees at most `topk`
# blocks takes all of them in order and fills the unused slots with `-1`. Here is the rule for one
# (query, group) row in plain Python (exercise 03.2 asks for it on whole tensors), checked on every
# row against `msa_select(..., impl="reference")`:

# %%
def select_row(scores, t, block_size, topk):
    """One row's selection: ``scores`` (a list, one per block) of query ``t`` -> ``topk`` block ids."""
    local = t // block_size
    if local + 1 <= topk:                                            # few blocks visible: take them all
        return list(range(local + 1)) + [-1] * (topk - local - 1)
    earlier = sorted(range(local), key=lambda j: (-scores[j], j))    # best score first; ties: lower id
    return earlier[:topk - 1] + [local]                              # the local block last


B, S, G = scores.shape[:3]
ours = torch.tensor([[[select_row(scores[b, t, h].tolist(), t, 16, 4) for h in range(G)] for t in range(S)]
                     for b in range(B)], dtype=torch.int32)
package = msa_select(q_idx, k_idx, block_size=16, topk=4, impl="reference")
ranking = [scores[b, t, h, :t // 16].tolist() for b in range(B) for t in range(S) for h in range(G) if t // 16 >= 4]
print(f"all {B * S * G} rows equal to msa_select's: {torch.equal(ours, package)}; "
      f"{sum(len(set(r)) < len(r) for r in ranking)} of the {len(ranking)} rows that rank hold equal scores")

# %% [markdown]
# ## 3. A task where the selection decides
#
# Section 1 measured attention mass; the question MSA raises is sharper: when what a query needs lies
# far back, does the index branch find it? We need a task where it must: a **key-value lookup**. A
# sequence holds a few (key, value) pairs at random places among filler words; its last block holds
# questions, each repeating one pair's key, whose answer is that pair's value:
#
#     filler filler (k7, v3) filler … (k12, v0) … filler | k12? k7? k12? …   ← the last block: questions
#
# Most answers then lie many blocks back. A **sliding window** of the `topk` most recent blocks sees
# one only when its pair happens to fall inside, and a **random pick** of `topk − 1` earlier blocks
# finds it only by chance. Both keep `topk` blocks, as MSA does: the same cost.
#
# The **main branch** is one causal attention layer (two query heads sharing one key/value head, so
# one GQA group) with a linear read-out of the values. It has no positions, so it must look up by
# content. Trained dense on short sequences, it answers long ones:

# %%
lcfg = lk.LookupConfig()
lookup, main_history = lk.train_lookup(lcfg)                         # dense attention, fixed seed
held = lk.lookup_batch(lcfg, held_out, lcfg.seq_len, seed=2)         # held-out sequences, never trained on
print(f"main branch: trained dense on {lcfg.train_len}-token sequences ({main_history['seconds']:.1f} s); "
      f"on {held_out} held-out {lcfg.seq_len}-token sequences with {lcfg.n_pairs} pairs it answers "
      f"{li.measure(lookup, held, None)['answered'].mean():.3f} of the questions right")
print(vlk.teacher_words(lookup, held))
vlk.rows_figure([("the teacher: the main branch's attention per block", *vlk.question_rows(lookup, held))],
                held, 0, block_size=lcfg.block_size, topk=lcfg.topk)
plt.show()

# %% [markdown]
# One held-out sequence: a row per question, a column per key block, the colour the share of the
# question's attention (heads averaged) that falls in the block. This is the **teacher** the index
# branch will learn from. It knows where every answer is, because it is dense attention: it scores
# every key, which is exactly the cost MSA exists to avoid at long context.
#
# ## 4. The teacher
#
# **Why a teacher.** The selection is a top-k of block ids, integers. Train the index branch on the
# answers alone, through the sparse attention over its own selection, and autograd finds no path from
# the loss back to its weights:

# %%
lk.init_index(lookup, seed=0)  # an untrained index branch: small random weights
print("gradients of the answer loss for the index weights (W_qi, W_ki):", li.answer_loss_index_grads(lookup, held))

# %% [markdown]
# So MSA gives the index branch a target of its own (DeepSeek-V3.2's lightning indexer is trained the
# same way). For query `t` and group `g`, the **teacher**
# `P[t, g, :]` is the main branch's attention mass on each key block, detached (the group's heads
# averaged); the **student** `Q[t, g, :]` is the softmax of the index branch's block scores over the
# blocks it can see. The loss is `KL(P ‖ Q)`, averaged over the queries that see at least two
# blocks. Its gradient reaches `q_idx` and `k_idx` through each block's max, that is through the
# one key that holds the block's score. Here is the loss, checked against the package's reference,
# value and gradients:

# %%
def distill_loss(q_idx, k_idx, mass, block_size):
    """KL(teacher || student): ``mass [B, S, G, n_blocks]`` (rows sum to 1) against the index branch's scores."""
    logits = block_scores(q_idx, k_idx, block_size)
    logits = logits.masked_fill(logits.isinf(), -1e9)         # a block with no visible key: finite, no NaN
    log_q = logits.log_softmax(-1)
    p = mass.detach()
    kl = torch.where(p > 0, p * (p.clamp_min(1e-30).log() - log_q), 0.0).sum(-1)  # [B, S, G]; 0·log 0 = 0
    has_a_choice = torch.arange(q_idx.shape[1]) >= block_size  # queries that see two blocks or more
    return kl[:, has_a_choice].mean()


q = torch.randn(2, 75, 2, 8, generator=g, requires_grad=True)
k = torch.randn(2, 75, 8, generator=g, requires_grad=True)
visible = torch.arange(5) <= torch.arange(75)[:, None, None] // 16             # [S, 1, n_blocks]
mass = torch.rand(2, 75, 2, 5, generator=g) * visible
mass = mass / mass.sum(-1, keepdim=True)                                         # a teacher: rows sum to 1
ours, theirs = distill_loss(q, k, mass, 16), index_distill_loss(q, k, mass, block_size=16, impl="reference")
grads = [torch.autograd.grad(loss, [q, k]) for loss in (ours, theirs)]
print(f"loss {ours.item():.6f}, the package's {theirs.item():.6f}; the gradients differ by at most "
      f"{max((a - b).abs().max().item() for a, b in zip(*grads)):.1e}")

# %% [markdown]
# Now distill. `li.distill_index` draws the index weights afresh (small random values), computes
# the teacher once per batch (the main branch is frozen, so its attention never changes) and takes
# Adam steps on the package's loss, the one the cell above matches, over short sequences; only the
# index weights move. We run it twice: with the teacher, and with a **shuffled teacher**, where each
# sequence gets the teacher of another sequence in its batch (targets of the same kind, nearly all
# of a question's mass on one block, about the wrong content). Then every selection of the same cost,
# on the held-out sequences:

# %%
untrained = li.measure(lookup, held, li.learned_selection(lookup, held))
before = vlk.question_rows(lookup, held, what="index")  # the untrained index, for the picture below
runs = {t: li.distill_index(lookup, teacher=t, steps=distill_steps, held=held) for t in ("shuffled", "attention")}
results = li.compare(lookup, held, untrained=untrained, shuffled=runs["shuffled"]["final"])  # the teacher's run last
print(f"each index branch: {distill_steps} steps on {lcfg.index_len}-token sequences "
      f"({runs['attention']['seconds']:.1f} s with the teacher)")
vlk.result_figure(results, runs, chance=1 / lcfg.n_values)
plt.show()
print(vlk.result_summary(results))
print(vlk.result_table(results))
print(vlk.result_words(results))

# %% [markdown]
# Bars and `±` are two standard errors over the held-out sequences (each sequence's share of its
# questions is one sample). Comparisons pair two selections on the same sequences and call a gap a
# lead only beyond two standard errors of the paired differences. The **oracle** is the teacher's own
# `topk` best blocks: what a perfect student would pick. The right panel runs the main branch on
# each selection's blocks only: where the answer's block is missing, it can only guess among the
# values.
#
# What the teacher adds shows in the left panel: from the same start, the index that learns from
# the teacher climbs, and the one that learns from a shuffled teacher does not. The untrained index
# is no random pick either: it is a fixed random function of the tokens, so it favours whatever its
# weights happen to favour (its line under the table says how that compares with a random pick).
# Here is what each one selects, on the question rows of section 3's sequence:

# %%
vlk.rows_figure([("the teacher", *vlk.question_rows(lookup, held)), ("index branch, untrained", *before),
                 ("index branch, distilled", *vlk.question_rows(lookup, held, what="index"))],
                held, 0, block_size=lcfg.block_size, topk=lcfg.topk)
plt.show()

# %% [markdown]
# The index panels show the student's distribution `Q` with its picks as dots (the local block, the
# last column, is picked by rule). Untrained, `Q` is flat: with small random weights, the many
# identical filler tokens give equal block scores, ties go to the lower ids, and the picks pile up on
# the first blocks. Distilled, `Q` is less sharp than the teacher's `P` and spreads some probability
# over other blocks holding pairs, but each row's picks cover the outlined block. That is all the
# selection needs: not to copy the teacher's distribution, only to rank the block the teacher cares
# about among its `topk − 1` best.
#
# ## 5. The needle test as the context grows
#
# The index branch learned on shorter sequences than these held-out ones (the printed sizes above).
# Now the same measurement at several lengths with the same number of pairs: the haystack grows
# while the budget of `topk` blocks stays, so each question reads a shrinking share of the keys
# (under each tick). Dense attention reads them all.

# %%
bl = li.by_length(lookup, runtime.pick(P, cpu=(128, 256, 512, 1024), gpu=(128, 256, 512, 1024, 2048)),
                  n=runtime.pick(P, cpu=32, gpu=128))
vlk.length_figure(bl, block_size=lcfg.block_size, topk=lcfg.topk, chance=1 / lcfg.n_values)
plt.show()
print(vlk.length_words(bl))

# %% [markdown]
# The window and the random pick find the answer about as often as their share of the earlier blocks
# allows, and that share falls as the context grows. The distilled index does not depend on where
# the pair lies, only on its content; the lines above give its gap to dense attention and to the
# window at each length, with two standard errors over that length's sequences.
#
# ## 6. The same recipe on the tiny multimodal model
#
# The lookup's teacher is sharp: nearly all of a question's attention sits in one block. Chapter
# 01's tiny model is another matter: on a long document its text queries spread their attention
# over many images (section 1). Its index branch (two linear maps per layer, `Block.idx_q` and
# `Block.idx_k`, not in the checkpoint, so they start random) learns from the same loss, with two
# additions:
#
# * **Positions.** The tiny model's attention also leans on "the blocks just before me", and its
#   first layer's hidden states carry no position (RoPE acts inside attention), so we rotate `q_idx`
#   and `k_idx` by RoPE as well (`index_rope=True`; DeepSeek's lightning indexer does the same on
#   part of its index dims).
# * **A dense warm-up, then a sparse stage.** First the main branch runs dense and its attention is
#   computed once per batch; then it attends only to the blocks the index selects, so the later
#   layers' teachers see the hidden states of the sparse model.
#
# With no single answer block, we measure **recall**: the share of the dense attention mass that the
# selected blocks hold on held-out documents, against the window and the **oracle** (the `topk`
# blocks with the most mass: the best any selection of that size can do).

# %%
dc = mi.DistillConfig(steps=tiny_steps, warmup_steps=max(1, tiny_steps * 3 // 8), eval_every=max(1, tiny_steps // 8),
                      n_images=12)
histories = {"RoPE on q_idx, k_idx": mi.distill_indexer(model, dc, progress=False)}
vmsa.distill_figure(histories, topk=TOPK, block_size=Bk)
plt.show()
ctx = vmsa.recall_by_length(model, runtime.pick(P, cpu=(8, 12, 16, 32), gpu=(8, 12, 16, 32, 64)),
                            n_docs=runtime.pick(P, cpu=4, gpu=16))
print(vmsa.recall_length_table(ctx))

# %% [markdown]
# Read the table row by row. The oracle's lead over the window is all that any choice of `topk`
# blocks can gain on this model; the last column says whether the distilled index took a measurable
# part of it (two standard errors over the documents, the gap measured on the same documents). Set
# it beside the lookup: the same loss, the same rule, and a teacher whose attention is spread out
# leaves far less for the index branch to find.
#
# ## 7. Exercises
#
# Each is checked on fresh random inputs with a ragged last block (`exercises.check` says what is
# right or wrong; it never stops the notebook). Solutions are in
# `minimax_lab/exercises/solutions/ch03.py`; try first.
#
# **03.1 Block scores from mean-pooled keys.** MSA scores a block by the *max* over its tokens of
# `q_idx·k_idx` (what `msa_select` does): `Bk` dots per (query, block). A cheaper family of
# indexers (MoBA, for one) pools the block's keys first and takes one dot with the *mean* key, which
# is the mean of the token scores. Write that score table. The checker compares with a float64 table
# on fresh ragged lengths, one block only among them.

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
# must ignore. It compares with `msa_select` row for row; your answer may not call it.

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
# The checker draws ragged lengths and non-contiguous views on the kernel device, compares with a
# float64 reference, and verifies that your kernel did the sums.

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
# The index branch is only as good as its teacher, and it learns most where the teacher is sharp:
# on the lookup a question's attention sits in one block, which the distilled index learns to find;
# on the tiny model the oracle's lead over the window bounds what any index can gain, and MSA's
# paper also adapts the main weights to sparsity, which takes far more training than a CPU gives.
# The lookup's main branch is a single layer that looks up by content alone; a real model mixes
# content and position over many layers and far longer contexts. The teacher here is the full
# `S × S` attention, which cannot exist at 1M tokens (exercise 03.3 computes its block mass a tile at
# a time from each row's log-sum-exp). And the selection itself costs `O(S²·D_idx)` multiply-adds
# (every key is scored, then max-pooled), against `O(S·topk·Bk·D)` for the attention: the first grows
# with the square of the context, the second only linearly, so at long enough context the index
# branch, not the attention, does most of the arithmetic, and the kernels of chapter 04 are built
# around that.

# %% [markdown]
# ---
# **Previous:** [02 · FlashAttention in Triton](02_flash_attention_in_triton.ipynb) · **Next:** [04 · Sparse attention kernels](04_sparse_attention_kernels.ipynb)
#
# **Read more:** the MSA paper (arXiv 2606.13392); DeepSeek-V3.2-Exp's report (2025), whose
# lightning indexer learns by the same distillation; MoBA (Lu et al. 2025, arXiv 2502.13189) and
# Native Sparse Attention (Yuan et al. 2025, arXiv 2502.11089), two other ways of choosing key blocks.
#
# **Package code used here:** `minimax_lab/attention/msa_reference.py`, `minimax_lab/attention/msa_backward_index_reference.py`, `minimax_lab/model/lookup.py`, `minimax_lab/model/lookup_index.py`, `minimax_lab/model/msa_indexer.py`, `minimax_lab/viz/lookup.py`, `minimax_lab/viz/msa.py`, `minimax_lab/exercises/ch03.py`

# %%
display(Markdown(vlk.provenance(preset=P, cfg=lcfg, n_held=held_out, main_history=main_history, histories=runs,
                                seconds=time.perf_counter() - t_start, tiny_history=histories["RoPE on q_idx, k_idx"],
                                recorded_with=vmsa.recorded_with())))
