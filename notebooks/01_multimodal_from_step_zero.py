# %% [markdown]
# # 01 · Multimodal from step zero: a tiny early-fusion model and its attention maps
#
# **What this chapter builds:** one sequence of image patches and words and the padded batches that carry it, a tiny early-fusion transformer over it written in cells (embedding, RMSNorm, RoPE, causal grouped-query attention, SwiGLU) and the loop that trains it, each checked against the package; then the attention maps that show whether the model looks at the object a question is about.
#
# **It assumes:** [00 · Rooflines and honest benchmarks](00_roofline_and_honest_benchmarks.ipynb) for the package's conventions; PyTorch (tensors, `einsum`, `softmax`) and the idea of a decoder-only transformer.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/01_multimodal_from_step_zero.ipynb)
#
# An *early-fusion* model has no separate vision tower glued on late: image patches and words
# are tokens of **one** sequence, seen by the same transformer layers from the first training
# step. Chameleon (arXiv 2405.09818), a well-documented example, turns an image into discrete
# tokens with a learned image tokenizer (vector quantisation), whereas this model projects each
# continuous patch linearly; both put images and words into one sequence. The claim we can check at
# toy scale: if the model really uses the image, then when it answers a question about an object,
# some attention head at the answer position should look at **that object's patches** — more than
# at the rest of the image.
#
# This notebook builds the smallest setup where you can watch that happen:
#
# 1. generated data: 32×32 scenes of coloured shapes and questions about them, batched by our own
#    function,
# 2. the model of about half a million parameters, written part by part in cells, each part checked
#    against the package on the shipped checkpoint's weights,
# 3. training: our own loop, checked step by step against the package's, then the checkpoint's
#    curve (or training here) and held-out accuracy,
# 4. attention maps, and the **grounding ratio** per layer and head,
# 5. an experiment over several seeds: both modalities from step zero vs. text first, images later.
#
# The MSA chapter (03) trains an index branch on this model, and the MoE chapter (05) trains the
# same design from scratch with experts in place of its FFN.

# %%
# In Colab, install the workbook's package first (locally, `make lab` already did).
import subprocess, sys
if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "minimax-lab[notebooks] @ git+https://github.com/minimax-lab/minimax-lab"], check=True)

# %% tags=["parameters"]
preset = "auto"            # "cpu" (the shipped checkpoint's size) or "gpu" (a larger model when training)
train_model = False        # False: the shipped checkpoint's training curve; True: train now with the preset
train_steps = None         # None: the preset's step count
n_test = 1000              # held-out examples to score (the set the shipped numbers were measured on)
rerun_experiment = False   # True: retrain both schedules of section 5 for each seed (minutes a seed on a CPU)
experiment_steps = 600     # step budget of each schedule when rerunning (the shipped runs used 600)
experiment_seeds = [0, 1, 2]   # seeds when rerunning (the shipped runs used these three)
seed = 0

# %%
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from IPython.display import Markdown, display

from minimax_lab import exercises, runtime
from minimax_lab.attention import attention
from minimax_lab.data import PATCHES_PER_IMAGE, TOKENIZER, batches, collate, make_examples
from minimax_lab.model import TinyMultimodalModel, TrainConfig, accuracy, load_checkpoint, preset_config, train
from minimax_lab.model.layers import apply_rope, attention_probs, rope_cos_sin
from minimax_lab.model.train import DEFAULT_CHECKPOINT, lm_loss, preset_train_config
from minimax_lab.viz import attention_maps as amaps, early_fusion, step_zero

t_start = time.perf_counter()
P = early_fusion.setup(preset, seed)

# %% [markdown]
# ## 1. The data: scenes, questions, one sequence
#
# A scene is a 4×4 grid of 8×8-pixel cells; 2–4 objects (square, circle, triangle; red, green,
# blue, yellow — no (shape, colour) pair twice) sit in distinct cells. Every object fills one cell, so
# "the patches of the object" is exactly one patch of the model's 8×8 patch embedding. Three
# question types, each with a one-word answer drawn **uniformly first** (then a scene that has
# it), so no answer can be guessed from the words alone:
#
# | type | example | answers |
# | --- | --- | --- |
# | colour | what colour is the triangle ? | red / green / blue / yellow |
# | count | how many circles ? | 0 – 3 |
# | left | is the red square in the left half ? | yes / no |
#
# Scenes are hashed into train / validation / test, so the held-out split never shares a
# layout with training.
#
# *Why "left half", not "left of"?* Comparing two objects' positions is a harder circuit than
# reading one object's place; `make_question(objects, "left", rng)` still poses the relational
# question.

# %%
shown = make_examples("test", 6, seed + 1)
fig, axs = plt.subplots(1, 6, figsize=(13, 2.6))
for ax, e in zip(axs, shown):
    ax.imshow(e.image.permute(1, 2, 0).numpy())
    ax.set_title(" ".join(e.question) + f"\n→ {e.answer}", fontsize=7)
    ax.set_xticks([]), ax.set_yticks([])
plt.show()
b = collate(shown[:1])
print("token sequence:", TOKENIZER.decode(b.tokens[0]))
print(f"the {PATCHES_PER_IMAGE} <img> placeholders are replaced by the image's patch embeddings, in raster order")

# %% [markdown]
# ### From examples to a batch
#
# The model reads a rectangle of token ids `[B, S]`, but questions differ in length. So each example
# becomes a row: `<bos>`, 16 `<img>` placeholders (or, in a text-only example, the scene in words),
# the question, the answer, `<eos>`, right-padded with `<pad>`. The targets are the tokens shifted
# left by one; the answer is predicted at the "?". The batch also carries the loss mask (exercise 01.1).

# %%
def to_batch(examples):
    """Examples, all with an image or all text-only -> tokens [B, S], targets [B, S], answer_pos [B],
    images [B, 1, 3, H, W] (None for text-only)."""
    with_image = examples[0].image is not None
    rows, answer_pos = [], []
    for e in examples:
        ids = [TOKENIZER.bos_id] + [TOKENIZER.img_id] * (PATCHES_PER_IMAGE if with_image else 0)
        ids += TOKENIZER.encode(e.question)
        answer_pos.append(len(ids) - 1)                                       # the "?": its next token is the answer
        rows.append(ids + TOKENIZER.encode([e.answer]) + [TOKENIZER.eos_id])
    tokens = torch.full((len(rows), max(map(len, rows))), TOKENIZER.pad_id)   # right padding
    for i, row in enumerate(rows):
        tokens[i, :len(row)] = torch.tensor(row)
    targets = torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], TOKENIZER.pad_id)], dim=1)   # the next token
    images = torch.stack([e.image for e in examples])[:, None] if with_image else None
    return tokens, targets, torch.tensor(answer_pos), images

# %%
described = make_examples("test", 6, seed + 1, with_image=False)   # each scene described in words (section 5)
for kind, examples in [("image", shown), ("text-only", described)]:
    tokens, targets, answer_pos, _ = to_batch(examples)
    pkg = collate(examples)
    early_fusion.same(f"{kind} tokens", tokens, pkg.tokens, rtol=0, atol=0)    # integer ids: exactly equal
    early_fusion.same(f"{kind} targets", targets, pkg.targets, rtol=0, atol=0)
    early_fusion.same(f"{kind} answer_pos", answer_pos, pkg.answer_pos, rtol=0, atol=0)
print("a text-only row:", TOKENIZER.decode(tokens[0]))

# %% [markdown]
# ## 2. The model, built in cells
#
# The package's `TinyMultimodalModel` (in `minimax_lab/model/`) is a decoder-only transformer:
# an embedding that puts patches and words into one sequence, then pre-norm blocks of causal
# grouped-query attention with RoPE and a SwiGLU feed-forward network, then a last norm and a
# linear head over the vocabulary. We write each part as a few lines of PyTorch taking its weights
# as plain tensors copied from the shipped checkpoint (`minimax_lab/assets/tiny_cpu.pt`, trained
# with the CPU preset), and check it against the package's module on the same input. Every check
# compares fp32 results with `torch.testing.assert_close`, which raises unless
# `|ours − theirs| ≤ atol + rtol·|theirs|` everywhere, and prints the `rtol` and `atol` it used:
# fp32's defaults unless the cell asks for looser ones. The inputs are a batch of held-out questions.

# %%
model, cfg, meta = load_checkpoint(DEFAULT_CHECKPOINT)
params = {name: w.detach().clone() for name, w in model.state_dict().items()}   # our copy of every weight
print(cfg)
print(f"{sum(w.numel() for w in params.values()) / 1e6:.2f} M parameters in {len(params)} tensors, e.g.",
      {k: tuple(params[k].shape) for k in ("tok_emb.weight", "blocks.0.wq.weight", "blocks.0.wk.weight")})

# %% [markdown]
# ### One sequence: the embedding
#
# *Early fusion* is a statement about the first layer: after it, a patch and a word are the same
# kind of thing, a `d_model` vector at one position of one sequence. So build that sequence:
#
# 1. cut each image into 8×8 patches in raster order and flatten each one (channel, row, column);
# 2. project each patch to `d_model` and add a learned 2-D position: a row vector plus a column vector;
# 3. embed the words, then put the k-th patch vector at the k-th `<img>` placeholder.

# %%
def embed(tokens, images, params):
    """tokens [B, S] (16 <img> placeholders a row), images [B, 3, H, W] -> h [B, S, d_model]."""
    B, C, H, W = images.shape
    p = cfg.patch_size
    g = H // p
    patches = images.reshape(B, C, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(B, g * g, C * p * p)   # 1. the cut
    pos2d = params["patch_embed.row.weight"][:, None] + params["patch_embed.col.weight"][None, :]    # [g, g, d]: row r + col c
    patch_vecs = (patches @ params["patch_embed.proj.weight"].T + params["patch_embed.proj.bias"]
                  + pos2d.reshape(g * g, -1))                                                         # 2. [B, 16, d]
    h = params["tok_emb.weight"][tokens]                                                              # 3. words
    is_img = tokens == TOKENIZER.img_id
    return h.masked_scatter(is_img[..., None], patch_vecs)   # row-major: the k-th <img> of a row gets its k-th patch


b = collate(make_examples("test", 8, seed + 2))
tokens, images = b.tokens, b.images[:, 0]                    # one image per row: [B, 3, 32, 32]
h = embed(tokens, images, params)
h_pkg, positions = model.embed(tokens, images)
early_fusion.same("embedding", h, h_pkg)
print(f"sequence lengths {(tokens != TOKENIZER.pad_id).sum(1).tolist()}, padded to {tokens.shape[1]}; "
      f"positions of row 0: {positions[0].tolist()}")

# %% [markdown]
# The positions are plain 1-D sequence positions, patches included; the patches' 2-D place in the
# image was added to their vectors above. RoPE will use the 1-D ones.
#
# ### RMSNorm
#
# Every sublayer starts by normalising its input. RMSNorm (Zhang & Sennrich 2019, arXiv 1910.07467)
# divides each vector by its root mean square and scales each dimension by a learned weight: a
# LayerNorm without the mean subtraction and the bias. The block uses it in four places: before
# attention, before the FFN, and on each query and key head (*QK-norm*: it bounds the attention
# scores, which Chameleon needed to keep early-fusion training from diverging).

# %%
def rms_norm(x, weight, eps=cfg.norm_eps):
    """x [..., d] / sqrt(mean(x²) + eps) * weight [d]."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


blk = model.blocks[0]                                         # the package's first block, to check against
w0 = {k.removeprefix("blocks.0."): v for k, v in params.items() if k.startswith("blocks.0.")}   # its weights
x = rms_norm(h, w0["attn_norm.weight"])
early_fusion.same("RMSNorm", x, blk.attn_norm(h))

# %% [markdown]
# ### RoPE: position as a rotation
#
# Attention compares a query with a key by their dot product, which knows nothing of where the two
# tokens are. Rotary position embedding (Su et al. 2021, arXiv 2104.09864) rotates both before
# the dot product. The `D` dimensions of a head form `D/2` pairs — here dim `i` with dim `i + D/2`
# ("rotate half") — and pair `i` at position `m` is turned by the angle `m·θᵢ`, with
# `θᵢ = base^(−2i/D)`: the first pair turns by a radian per position, the last one barely moves.
# A rotation by `m·θ` of the query and by `n·θ` of the key leaves their dot product depending on
# `n − m` only, so the score sees the *distance* between the tokens, whatever their absolute places.

# %%
def rope(x, positions, base=cfg.rope_base):
    """Rotate x [B, S, H, D] by its positions [B, S]: pair (i, i + D/2) turns by positions * base^(-2i/D)."""
    D = x.shape[-1]
    theta = base ** (-torch.arange(0, D, 2) / D)                       # [D/2] radians per position
    angle = positions[:, :, None, None] * theta                         # [B, S, 1, D/2]: same for every head
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * angle.cos() - x2 * angle.sin(),              # each pair (x1, x2) rotated by `angle`
                      x1 * angle.sin() + x2 * angle.cos()], dim=-1)


B, S = tokens.shape
q = (x @ w0["wq.weight"].T).view(B, S, cfg.n_heads, cfg.head_dim)      # block 0's queries, before RoPE
early_fusion.same("RoPE", rope(q, positions), apply_rope(q, *rope_cos_sin(positions, cfg.head_dim, cfg.rope_base)))
early_fusion.plot_rope(rope, cfg.head_dim, cfg.rope_base, seq_len=S)
plt.show()

# %% [markdown]
# Left: three pairs of one vector turned position by position by our `rope` — the fast pair goes
# round the circle in about six positions, the slow one hardly moves, so fast pairs tell near
# tokens apart and slow ones carry far distances. Right: a unit vector rotated to two positions,
# dotted with itself, against their distance. The curves from first positions 0 and 1000 coincide:
# only the distance counts. On average (black) the score falls fast over the first ten or so
# positions, then drifts lower with ripples (the RoPE paper's long-term decay: of the average, not a
# steady fall); our sequences are short (green line), so here RoPE mostly tells the model which
# token is next to which.
#
# ### Causal attention with grouped-query heads
#
# Each query head scores every key (`q · k / √D`), masks the keys after the query (a decoder
# predicts the next token, so it may not read it), turns each row of scores into weights that sum
# to 1 with a softmax, and returns the weighted sum of the values. *Grouped-query attention* (GQA,
# Ainslie et al. 2023, arXiv 2305.13245) stores fewer key/value heads than query heads: here
# `n_heads` query heads share `n_kv_heads` kv heads, query head `h` reading kv head
# `h // (n_heads / n_kv_heads)`, which shrinks the KV cache a server keeps per token by the same
# factor (chapter 06). Right padding needs no mask of its own: a real token never sees the padding
# after it.

# %%
def causal_gqa_attention(q, k, v):
    """q [B, S, Hq, D], k, v [B, S, Hkv, D] -> out [B, S, Hq, D] and the weights [B, Hq, S, S]."""
    B, S, Hq, D = q.shape
    group = Hq // k.shape[2]                                            # query heads per kv head
    k = k.repeat_interleave(group, dim=2)                               # query head h reads kv head h // group
    v = v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D)       # [B, Hq, S, S]
    future = torch.ones(S, S, dtype=torch.bool).triu(1)                 # True where key j comes after query i
    weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)  # each row sums to 1 over j <= i
    return torch.einsum("bhqk,bkhd->bqhd", weights, v), weights


q_pkg, k_pkg, v_pkg = blk.qkv(h_pkg, positions)                        # the package's normed, rotated q, k and v
out, weights = causal_gqa_attention(q_pkg, k_pkg, v_pkg)
early_fusion.same("attention output", out, attention(q_pkg, k_pkg, v_pkg, causal=True, impl=cfg.attn_impl))
early_fusion.same("attention weights", weights, attention_probs(q_pkg, k_pkg))

# %% [markdown]
# The first check is against the attention the model runs (`impl="torch"`: PyTorch's
# `scaled_dot_product_attention`, which returns only the output); the second against the weights
# section 4 draws. Chapter 02 writes this attention as a Triton kernel that never stores the
# `S × S` weights at all.
#
# ### The SwiGLU feed-forward network
#
# After attention mixes information across positions, the FFN transforms each position on its own.
# SwiGLU (Shazeer 2020, arXiv 2002.05202) computes two projections of the input to `d_ff`
# dimensions, `gate` and `up`, multiplies `silu(gate)` by `up` element by element — the gate
# decides how much of each hidden unit passes — and projects back down to `d_model`.
# `silu(g) = g · sigmoid(g)`.

# %%
def swiglu(x, w_gate, w_up, w_down):
    """x [..., d_model] -> [..., d_model]; w_gate, w_up [d_ff, d_model], w_down [d_model, d_ff]."""
    gate = x @ w_gate.T
    return (gate * torch.sigmoid(gate) * (x @ w_up.T)) @ w_down.T


x_ffn = blk.ffn_norm(h_pkg)
early_fusion.same("SwiGLU", swiglu(x_ffn, w0["ffn.gate.weight"], w0["ffn.up.weight"], w0["ffn.down.weight"]),
                  blk.ffn(x_ffn))

# %% [markdown]
# ### A block, and the whole model
#
# A pre-norm block adds each sublayer's output to its input (the *residual stream*): attention,
# then the FFN. The model embeds, runs its blocks, normalises and projects to one logit per word
# of the vocabulary. Both are assembled from the parts above only.

# %%
def block(h, positions, w):
    """One pre-norm block: h [B, S, d_model] -> [B, S, d_model]; w: the block's weights by name."""
    B, S, _ = h.shape
    x = rms_norm(h, w["attn_norm.weight"])
    q = rms_norm((x @ w["wq.weight"].T).view(B, S, cfg.n_heads, cfg.head_dim), w["q_norm.weight"])      # QK-norm
    k = rms_norm((x @ w["wk.weight"].T).view(B, S, cfg.n_kv_heads, cfg.head_dim), w["k_norm.weight"])
    v = (x @ w["wv.weight"].T).view(B, S, cfg.n_kv_heads, cfg.head_dim)
    out, _ = causal_gqa_attention(rope(q, positions), rope(k, positions), v)
    h = h + out.reshape(B, S, -1) @ w["wo.weight"].T                                                    # residual
    return h + swiglu(rms_norm(h, w["ffn_norm.weight"]), w["ffn.gate.weight"], w["ffn.up.weight"],
                      w["ffn.down.weight"])


with torch.no_grad():
    early_fusion.same("one block", block(h, positions, w0), blk(h_pkg, positions))

# %%
def tiny_model(tokens, images, params):
    """tokens [B, S], images [B, 3, H, W] -> logits [B, S, vocab]."""
    h = embed(tokens, images, params)
    positions = torch.arange(tokens.shape[1]).expand(tokens.shape)
    for i in range(cfg.n_layers):
        h = block(h, positions, {k.removeprefix(f"blocks.{i}."): v for k, v in params.items()
                                 if k.startswith(f"blocks.{i}.")})
    return rms_norm(h, params["norm.weight"]) @ params["head.weight"].T


with torch.no_grad():
    logits, logits_pkg = tiny_model(tokens, images, params), model(tokens, images)
early_fusion.same("whole model's logits", logits, logits_pkg, rtol=1e-5, atol=1e-4)
at_answer = lambda lg: TOKENIZER.decode(lg[torch.arange(B), b.answer_pos].argmax(-1))   # noqa: E731
print(f"answers: ours [{at_answer(logits)}], the package's [{at_answer(logits_pkg)}], "
      f"right [{TOKENIZER.decode(b.answer_id)}]")

# %% [markdown]
# Some parts round differently from the package's (its fused attention and linear layers add the
# same terms in another order), and the differences grow through the blocks, so the whole model's
# check allows more rounding. Apart from our training loop, we use the package's
# model from here on: the same computation, with clear errors, and hooks for the attention
# algorithms and FFNs of later chapters (`attention`: dense or MSA, `attn_impl`: reference, PyTorch
# or Triton, `ffn`: dense or MoE).

# %% [markdown]
# ## 3. Training, and held-out accuracy
#
# Training minimises next-token cross-entropy: at each position, minus the log of the probability
# the model gave the token that actually comes next. Only positions whose next token is a word
# count (a patch is given, never predicted, and padding is nothing): the batch's loss mask. The
# answer word is what the questions test, so its position counts `answer_weight` times.

# %%
def weighted_lm_loss(logits, targets, loss_mask, answer_pos, answer_weight):
    """logits [B, S, vocab], targets [B, S] (the next tokens), loss_mask [B, S] bool, answer_pos [B] -> scalar."""
    nll = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)
    weight = loss_mask.float()
    weight[torch.arange(len(weight)), answer_pos] *= answer_weight
    return (nll * weight).sum() / weight.sum()


answer_weight = meta["train_config"]["answer_weight"]
with torch.no_grad():
    loss = weighted_lm_loss(logits, b.targets, b.loss_mask, b.answer_pos, answer_weight)
    early_fusion.same("training loss", loss, lm_loss(model, b, answer_weight), rtol=1e-5, atol=1e-5)
    plain = weighted_lm_loss(logits, b.targets, b.loss_mask, b.answer_pos, 1.0)
print(f"the checkpoint's loss on this batch: {loss.item():.3f} nats, the mean over the predicted words "
      f"with the answer counted {answer_weight:g} times ({plain.item():.3f} with every word counted once)")

# %% [markdown]
# ### The training loop
#
# Each step draws a fresh batch, computes this loss, backpropagates and updates every weight, with
# three guards for stability: the learning rate warms up linearly for `warmup` steps (Adam's first
# updates move every weight by about `lr`, whatever its gradient), then falls along a cosine to
# `min_lr_frac` of its peak; AdamW (Loshchilov & Hutter, arXiv 1711.05101) shrinks every weight
# slightly each step, separately from the gradient step; the gradient is clipped to norm 1, so one odd batch
# cannot throw the weights far. The weights start as the package's, `TinyMultimodalModel(cfg)` right
# after `torch.manual_seed(seed)`, given to our `tiny_model` as a dict of tensors that require
# gradients.

# %%
def lr_at(step, tc):
    """Learning rate at `step`: linear warm-up over tc.warmup steps, then a cosine to tc.min_lr_frac * tc.lr."""
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    t = min(1.0, (step - tc.warmup) / max(1, tc.steps - tc.warmup))           # 0 -> 1 over the other steps
    return tc.lr * (tc.min_lr_frac + (1 - tc.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))

# %%
def train_loop(tc):
    """Train our tiny_model of `cfg` for tc.steps steps on image batches -> (weights, the loss of each step)."""
    torch.manual_seed(tc.seed)                                                # the package's initial weights
    weights = {name: w.detach().requires_grad_() for name, w in TinyMultimodalModel(cfg).named_parameters()}
    opt = torch.optim.AdamW(weights.values(), lr=tc.lr, betas=(0.9, 0.98), weight_decay=tc.weight_decay)
    stream = batches("train", tc.batch_size, tc.seed, with_image=True)         # fresh scenes every step
    losses = []
    for step in range(tc.steps):
        b = next(stream)
        logits = tiny_model(b.tokens, b.images[:, 0], weights)
        loss = weighted_lm_loss(logits, b.targets, b.loss_mask, b.answer_pos, tc.answer_weight)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(weights.values(), max_norm=1.0)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, tc)
        opt.step()
        losses.append(loss.item())
    return weights, losses

# %%
# 10 steps of 16 questions: 3 of warm-up, 7 of cosine; the package validates only after the last one
tc_check = TrainConfig(steps=10, batch_size=16, warmup=3, seed=seed, answer_weight=answer_weight,
                       eval_every=10**9, eval_examples=16)
_, our_losses = train_loop(tc_check)
_, pkg_hist = train(cfg, tc_check, progress=False)
early_fusion.same("learning rates", torch.tensor([lr_at(s, tc_check) for s in range(tc_check.steps)]),
                  torch.tensor(pkg_hist["lr"]), atol=0)      # relative: the rates are about 1e-3
early_fusion.same("training losses", torch.tensor(our_losses), torch.tensor(pkg_hist["loss"]))
print("step  learning rate  loss: ours  the package's")
for step, (lr, a, b_pkg) in enumerate(zip(pkg_hist["lr"], our_losses, pkg_hist["loss"])):
    print(f"{step:>4}  {lr:13.2e}  {a:10.4f}  {b_pkg:13.4f}")

# %% [markdown]
# The package's `train` is this loop plus validation every `eval_every` steps, the schedules of
# section 5 (mixed and text first alternate image and text batches) and the extra losses of later
# chapters (MoE's balance loss, MSA's index loss).
#
# With `train_model = False` we draw the checkpoint's recorded training curve; set
# `train_model = True` to train here (the CPU preset takes a few minutes on two cores). Then the
# model answers held-out questions (scenes it never saw) by the argmax of its prediction at the
# final "?". The right panel shows the validation questions scored during training (circles) and
# the held-out test questions scored now (the diamond, its accuracy printed below).

# %%
if train_model:
    cfg = preset_config(P)
    tc = preset_train_config(P, seed=seed, **({"steps": train_steps} if train_steps else {}))
    model, hist = train(cfg, tc, device=runtime.device() if P == "gpu" else "cpu")
    model, n_val = model.cpu(), tc.eval_examples
else:
    hist = step_zero.shipped_history()
    n_val = meta["train_config"]["eval_examples"]
test = make_examples("test", n_test, 1)
acc = accuracy(model, test)
step_zero.plot_history(hist, n_val=n_val, test_acc=acc["all"], n_test=len(test))
plt.show()
print(step_zero.accuracy_lines(acc, test))

# %% [markdown]
# ## 4. Attention maps
#
# `model(tokens, images, capture=True)` also returns, per layer, the attention weights
# `[B, heads, S, S]` — the `weights` our `causal_gqa_attention` returned. Left: one head's whole
# map (image region shaded, text after it; the dashed line is the answer query). Right: the answer query's attention on the 16 patches,
# painted in gray on each patch's background (black: none, light gray: the most; see the colour
# bar), so every object keeps its own colour; the asked-about object has a dashed magenta outline.
# In Jupyter you get pickers for layer, head, example and query token (`token = -1` = the answer
# position); under papermill one static picture.

# %%
grounding, image_share = amaps.grounding_per_question(model, test)   # each [questions with a focus, layers, heads]
(best_layer, best_head), _ = amaps.best_heads(grounding)
batch, attn = amaps.capture_attention(model, test[:12])
amaps.explore_attention(batch, attn, defaults={"layer": best_layer, "head": best_head, "example": 0, "token": -1})

# %% [markdown]
# ### The grounding ratio
#
# Take one head's row of weights at the answer position. Its *image share* is the part of the row
# on the 16 patches; the rest goes to words. The fraction of the image share on the patches the
# question is about, divided by their share of the patches (`n_focus / 16`), is the *grounding
# ratio*. 1 means no preference for the right object within the image; one focus patch caps it at
# 16. A head can prefer the object strongly while
# reading the image little, so the image share stays beside it. The cell computes both for the
# held-out questions that have a focus (count questions with answer 0 have none) and checks them
# against the package's `grounding_per_question`; the table averages them, with two standard errors.

# %%
def grounding_ratio(attn, batch):
    """attn: per layer [B, heads, S, S] -> (grounding ratio, image share), each [B, layers, heads]."""
    rows = torch.stack([a[torch.arange(len(batch.tokens)), :, batch.answer_pos] for a in attn], 1)  # answer rows [B, L, H, S]
    on_image = rows[..., 1:1 + PATCHES_PER_IMAGE]                   # the weights on the 16 patches (they follow <bos>)
    image_share = on_image.sum(-1)                                  # how much of the row reads the image
    focus = batch.focus.float()[:, None, None, :]                   # 1 on the asked-about object's patches
    object_share = (on_image * focus).sum(-1) / image_share         # the object's part of the image's attention
    return object_share / (focus.sum(-1) / PATCHES_PER_IMAGE), image_share   # over its part of the patches


batch_f, attn_f = amaps.capture_attention(model, [e for e in test if e.focus])
ours, ours_share = grounding_ratio(attn_f, batch_f)
early_fusion.same("grounding ratio", ours, grounding)
early_fusion.same("image share", ours_share, image_share)

# %%
amaps.grounding_table(grounding, image_share)
plt.show()
print(amaps.grounding_lines(grounding, image_share))
amaps.plot_top_heads(grounding.mean(0), batch, attn, n_heads=3, n_examples=6)
plt.show()

# %% [markdown]
# ## 5. From step zero vs. text first
#
# Same model, same step budget, two schedules:
#
# * **mixed** — both modalities from step zero: even steps image + question, odd steps the same
#   kind of question about a scene described in words (the text-only rows of section 1).
# * **text first** — only the described scenes for the first half of the steps, then the mixed
#   schedule.
#
# We compare loss curves, accuracy on the *image* questions, and grounding. Each schedule was
# trained with several seeds (a seed draws the initial weights, the training stream and its own
# held-out questions), so the schedules can be compared seed by seed, against how much the seeds
# disagree. The shipped runs come from `minimax_lab/assets/experiment_step_zero.json`; set
# `rerun_experiment = True` to measure them again.
# Grounding here is the grounding ratio of section 4, the best layer and head of each run.

# %%
if rerun_experiment:
    exp = step_zero.run_experiment(preset_config(P), experiment_steps, experiment_seeds,
                                   tc=preset_train_config(P, seed=seed))
else:
    exp = step_zero.shipped_experiment()
step_zero.plot_schedules(exp)
plt.show()
print(step_zero.schedule_lines(exp, rerun=rerun_experiment))

# %% [markdown]
# **What this measures.** Each run is short (the first line gives its steps), so compare the
# schedules with each other, not with section 3. Seeds of one schedule can differ by more than
# question sampling explains (the line after the two schedules says whether they do here), so one
# seed could point either way: a gap between the schedules counts only when it exceeds two standard
# errors over the seeds of the seed-by-seed difference, and with a handful of seeds a gap inside
# that rough noise says "not measurable at this budget", not "equal". The last line gives, seed by
# seed, how far text first's loss jumps when the images arrive. Rerun with `rerun_experiment = True`
# and a larger `experiment_steps` to see whether the differences grow (on two CPU cores, a quarter
# of an hour a seed at the checkpoint's length).
#
# ## Clear errors
#
# The model checks its inputs: a wrong image size, an unknown word or a sequence longer than
# `max_seq_len` raise an error that says what was expected.

# %%
b = collate(test[:1])
for what, fn in [("48×48 image", lambda: model(b.tokens, torch.zeros(1, 1, 3, 48, 48))),
                 ("unknown word", lambda: TOKENIZER.encode("what colour is the hexagon ?")),
                 ("too long", lambda: model(torch.ones(1, cfg.max_seq_len + 1, dtype=torch.long)))]:
    try:
        fn()
    except ValueError as e:
        print(f"{what:>12}: ValueError: {e}")

# %% [markdown]
# ## Exercises
#
# Fill in each function and run the cell after it: the checker draws fresh sequences, images or rows
# every time and says what is wrong. Solutions are in `minimax_lab/exercises/solutions/ch01.py`.
#
# **01.1 The loss mask.** Training predicts the next token everywhere, but only words are targets:
# predicting an image placeholder (a patch is given, not generated) or padding would teach nothing.
# The checker compares with the mask the package's batches carry, on fresh padded interleaved sequences.

# %%
def loss_mask(tokens: torch.Tensor, img_id: int, pad_id: int) -> torch.Tensor:
    """``tokens [B, S]``: interleaved sequences (words, ``img_id`` placeholders for image patches,
    right padding with ``pad_id``). Position ``t`` is trained to predict ``tokens[:, t + 1]``.
    Return a bool tensor ``[B, S]``: True where that next token is a word (``<eos>`` included), so
    its loss counts; False where it is an image placeholder or padding, and at the last position
    (nothing follows)."""
    raise NotImplementedError  # your code here

# %%
exercises.check("01.1", loss_mask)

# %% [markdown]
# **01.2 Unpatchify.** The inverse of the cut built by hand above; the checker cuts fresh images, some
# not square, the way the patch embedding does and wants them back pixel for pixel.

# %%
def unpatchify(patches: torch.Tensor, H: int, W: int, patch: int) -> torch.Tensor:
    """The inverse of the patch embedding's cut. ``patches [N, P, C*patch*patch]`` holds, for each
    of ``N`` images of ``H x W`` pixels, its ``P = (H/patch) * (W/patch)`` patches in raster order
    (left to right, then top to bottom); each patch is flattened channel first, then row, then
    column (``C, patch, patch``). Return the images ``[N, C, H, W]``."""
    raise NotImplementedError  # your code here (a reshape, a permute, a reshape)

# %%
exercises.check("01.2", unpatchify)

# %% [markdown]
# **01.3 Image segments.** With several images in one sequence, each position needs to know which
# image it belongs to and where in it (the 2-D position of a patch comes from that place). The checker
# compares both tensors on fresh sequences, images back to back among them.

# %%
def image_segments(tokens: torch.Tensor, img_id: int, patches_per_image: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``tokens [S]``: one interleaved sequence in which every image is ``patches_per_image``
    consecutive ``img_id`` tokens (two images may follow each other directly). Return
    ``(segment, patch_index)``, two int64 tensors ``[S]``: ``segment`` is 0 for a word and ``k``
    for the patches of the ``k``-th image (1, 2, ...); ``patch_index`` is the patch's place in its
    image (0 .. patches_per_image - 1, raster order) and -1 for a word."""
    raise NotImplementedError  # your code here

# %%
exercises.check("01.3", image_segments)

# %% [markdown]
# **01.4 The interleaved attention mask.** This chapter's model is causal everywhere, so a patch
# never sees the patches after it in its own image. Some early-fusion models (Transfusion,
# arXiv 2408.11039) let the patches of one image see each other in both directions while words
# stay causal. Build that mask from the segments of 01.3. The checker compares the whole mask on fresh
# interleaved sequences.

# %%
def interleaved_mask(segment: torch.Tensor) -> torch.Tensor:
    """``segment [S]`` as in 01.3 (0 for a word, k for the patches of the k-th image). Return a bool
    tensor ``[S, S]``, True where query position ``i`` may attend to key position ``j``: every
    position sees itself and everything before it (causal), and the patches of one image also see
    each other in both directions (a patch may look at a later patch of its own image)."""
    raise NotImplementedError  # your code here

# %%
exercises.check("01.4", interleaved_mask)

# %% [markdown]
# **A first Triton kernel, worked.** A Triton kernel is written for one *program*; the launch runs
# many programs in parallel, `tl.program_id(0)` tells each which one it is, and the grid in
# `kernel[(n,)](...)` says how many there are. A program works on tiles: `tl.arange(0, BLOCK)` is a
# vector of lane indices (its length a power of two fixed at compile time), a pointer plus that vector
# addresses a tile, and the `mask=` of `tl.load`/`tl.store` keeps the lanes past a row's end from
# being read or written. The kernel below scales each row of a matrix by one number, one program per
# row. On a GPU it compiles to GPU code; on a CPU it runs in Triton's interpreter, which `minimax_lab`
# switched on when it was imported, before triton.

# %%
import triton
import triton.language as tl


@triton.jit
def scale_rows_kernel(X, S, Y, D, stride_x, stride_y, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)                              # one program per row
    cols = tl.arange(0, BLOCK_D)                        # lanes 0 .. BLOCK_D - 1
    inside = cols < D                                   # BLOCK_D >= D: the extra lanes are masked off
    x = tl.load(X + row * stride_x + cols, mask=inside, other=0.0)
    tl.store(Y + row * stride_y + cols, x * tl.load(S + row), mask=inside)


def scale_rows(x, s):
    """y[i] = x[i] * s[i] for x [N, D] (each row contiguous, rows stride(0) apart), s [N]."""
    y = torch.empty_like(x)
    scale_rows_kernel[(x.shape[0],)](x, s, y, x.shape[1], x.stride(0), y.stride(0),
                                     BLOCK_D=triton.next_power_of_2(x.shape[1]))
    return y


x_rows = torch.randn(5, 40, device=runtime.kernel_device())[:, 3:33]     # 5 rows of 30, cut out of wider rows
s_rows = torch.randn(5, device=x_rows.device)
torch.testing.assert_close(scale_rows(x_rows, s_rows), x_rows * s_rows[:, None])   # raises if the kernel is wrong
print(f"scale_rows: {x_rows.shape[0]} programs, tiles of {triton.next_power_of_2(x_rows.shape[1])} lanes "
      f"for rows of {x_rows.shape[1]}: equal to PyTorch's x * s")

# %% [markdown]
# **01.5 RMSNorm in Triton.** The `rms_norm` cell above, as your first kernel. A norm is a good first
# kernel: each row is one reduction (a sum of squares) and one elementwise pass, and memory-bound
# (each element read and written once for a few operations), so one program per row, holding its
# row in one masked tile, is already the right shape. Write the kernel in the cell below (the
# skeleton gives its arguments), then launch it in `rms_norm_rows`. The checker
# draws rows cut out of wider tensors, widths that are never a power of two and fp16 values whose
# squares overflow fp16, and verifies that your kernel, not PyTorch, computed the result.

# %%
import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(X, W, Y, D, eps, stride_xb, stride_xs, stride_yb, stride_ys, BLOCK_D: tl.constexpr):
    b, s = tl.program_id(0), tl.program_id(1)
    # your code here: the row's masked tile, its mean square in fp32, one masked store


def rms_norm_rows(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm of each row of ``x [B, S, D]`` times ``weight [D]``, ``x[b, s] / sqrt(mean(x[b, s]²) + eps)
    * weight``, computed by a ``@triton.jit`` kernel that you write above this function and launch
    here, one program per row (a grid of ``B x S`` programs). ``x`` is fp32 or fp16 on
    ``runtime.kernel_device()``; return a new tensor of its shape and dtype. ``x`` may be a view cut
    out of a larger tensor: row ``(b, s)`` starts ``b * x.stride(0) + s * x.stride(1)`` elements in,
    and its ``D`` elements are contiguous. ``D`` is rarely a power of two: load the row as one tile of
    ``triton.next_power_of_2(D)`` lanes, masked, and divide by ``D``. Square and sum in fp32 (the
    square of an fp16 value above 256 overflows fp16); cast to ``x``'s dtype only when storing."""
    raise NotImplementedError  # your code here

# %%
exercises.check("01.5", rms_norm_rows)

# %% [markdown]
# ## What limits us
#
# Everything here is small on purpose: half a million parameters, 32×32 scenes of three shapes in
# four colours, one patch per object, a vocabulary of 141 words. That keeps the attention maps
# readable, the model a few cells long and training a few minutes on a CPU, but it makes finding
# an object as easy as finding one patch, which real images never are. The grounding ratio measures
# where attention goes, not whether the answer depends on it: a model can look at the right patch
# and still answer from elsewhere, which an ablation (zeroing that patch) would test. And the
# step-zero experiment is a handful of seeds at one short budget; real early-fusion models settle
# such questions with many runs at scale.

# %% [markdown]
# ---
# **Previous:** [00 · Rooflines and honest benchmarks](00_roofline_and_honest_benchmarks.ipynb) · **Next:** [02 · FlashAttention in Triton](02_flash_attention_in_triton.ipynb)
#
# **Read more:** Chameleon (arXiv 2405.09818) and Transfusion (arXiv 2408.11039), two early-fusion
# recipes; RoFormer (Su et al., arXiv 2104.09864), rotary position embedding; GQA (Ainslie et al.,
# arXiv 2305.13245); GLU variants (Shazeer, arXiv 2002.05202); RMSNorm (Zhang & Sennrich, arXiv
# 1910.07467); the Annotated Transformer (nlp.seas.harvard.edu/annotated-transformer) and
# LLMs-from-scratch (github.com/rasbt/LLMs-from-scratch), the same parts built for text.
#
# **Package code used here:** `minimax_lab/model/model.py`, `minimax_lab/model/layers.py`, `minimax_lab/model/train.py`, `minimax_lab/model/experiments.py`, `minimax_lab/data/examples.py`, `minimax_lab/viz/early_fusion.py`, `minimax_lab/viz/attention_maps.py`, `minimax_lab/viz/step_zero.py`, `minimax_lab/exercises/ch01.py`

# %%
display(Markdown(early_fusion.provenance(P, time.perf_counter() - t_start, meta, exp, n_test=len(test),
                                         rerun=rerun_experiment)))
