# %% [markdown]
# # 01 · Multimodal from step zero: a tiny early-fusion model and its attention maps
#
# **What this chapter builds:** one sequence of image patches and words, a tiny early-fusion transformer over it, and the attention maps that show whether it looks at the object a question is about.
#
# **It assumes:** [00 · Rooflines and honest benchmarks](00_roofline_and_honest_benchmarks.ipynb) for the package's conventions; PyTorch and the idea of a decoder-only transformer.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/01_multimodal_from_step_zero.ipynb)
#
# An *early-fusion* model has no separate vision tower glued on late: image patches and words
# are tokens of **one** sequence, seen by the same transformer layers from the first training
# step (Chameleon, arXiv 2405.09818, is a well-documented example of the recipe). The claim
# we can check at toy scale: if the model really uses the image, then when it answers a
# question about an object, some attention head at the answer position should look at **that
# object's patches** — more than at the rest of the image.
#
# This notebook builds the smallest setup where you can watch that happen:
#
# 1. generated data: 32×32 scenes of coloured shapes and questions about them,
# 2. one interleaved sequence, built by hand and checked against the model's own embedding,
#    and a decoder of about half a million parameters (RMSNorm, RoPE, grouped-query attention, SwiGLU),
# 3. training (or loading the shipped checkpoint, trained with the CPU preset),
# 4. attention maps, and the **grounding ratio** per layer and head,
# 5. an experiment: both modalities from step zero vs. text first, images later.
#
# The same model is reused later: the MSA chapter (03) trains an index branch on it, and the MoE
# chapter (05) trains the same design from scratch, with experts in place of its FFN.

# %%
# In Colab, install the workbook's package first (locally, `make lab` already did).
import subprocess, sys
if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "minimax-lab[notebooks] @ git+https://github.com/minimax-lab/minimax-lab"], check=True)

# %% tags=["parameters"]
preset = "auto"            # "cpu" (the shipped checkpoint's size) or "gpu" (a larger model)
train_model = False        # False: load the shipped checkpoint; True: train now with the preset
train_steps = None         # None: the preset's step count
n_test = 1000              # held-out examples to score (the set the shipped numbers were measured on)
rerun_experiment = False   # True: retrain both schedules of section 5 (minutes on a CPU)
experiment_steps = 600     # step budget of each schedule when rerunning (the shipped JSON used 600)
seed = 0

# %%
import json

import matplotlib.pyplot as plt
import numpy as np
import torch

from minimax_lab import exercises, runtime
from minimax_lab.data import PATCHES_PER_IMAGE, QTYPES, TOKENIZER, collate, make_examples
from minimax_lab.model import (TinyMultimodalModel, TrainConfig, accuracy, load_checkpoint, preset_config,
                               save_checkpoint, train)
from minimax_lab.model.experiments import grounding_ratios, step_zero_vs_text_first
from minimax_lab.model.layers import PatchEmbed
from minimax_lab.viz.source import show_source
from minimax_lab.model.train import DEFAULT_CHECKPOINT, preset_train_config
from minimax_lab.viz import attention_maps as amaps
from minimax_lab.viz import step_zero

P = runtime.resolve_preset(preset)
if P == "cpu":   # small matrices gain little from more threads, and on a busy machine each extra one waits for a core
    torch.set_num_threads(1)
DATA = DEFAULT_CHECKPOINT.parent
torch.manual_seed(seed)
print(f"device {runtime.device_name()}, preset {P}")

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
# *Why "left half" and not "left of"?* A relational question ("is the red square left of the blue
# circle ?") needs the model to find two objects and compare their positions, a harder circuit than
# reading one object's place; `make_question(objects, "left", rng)` still poses it, so a bigger
# model or a longer run can try.

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
# ## 2. The model
#
# `TinyMultimodalModel` (in `minimax_lab/model/`): token embedding for words; at every `<img>`
# placeholder a linear patch embedding of one 8×8×3 patch plus a learned 2-D (row + column)
# position; then pre-norm blocks of grouped-query attention with RoPE (Su et al. 2021,
# arXiv 2104.09864) and a SwiGLU FFN (Shazeer 2020, arXiv 2002.05202). The loss is next-token
# cross-entropy on text tokens only, with the answer token weighted up. Attention and FFN are
# chosen by config — the attention algorithm (`attention`: dense or MSA), its implementation
# (`attn_impl`: reference, PyTorch or Triton) and the FFN (`ffn`) — which is how later chapters
# plug in MSA and MoE.

# %%
cfg = preset_config(P)
tc = preset_train_config(P, seed=seed, **({"steps": train_steps} if train_steps else {}))
print(cfg)
print(f"{sum(p.numel() for p in TinyMultimodalModel(cfg).parameters()) / 1e6:.2f} M parameters")

# %% [markdown]
# ### One sequence, built by hand
#
# *Early fusion* is a statement about the first layer: after it, a patch and a word are the same
# kind of thing, a `d_model` vector at one position of one sequence. So build that sequence
# ourselves, on a freshly initialised model (the check holds for any weights), random images and
# questions of different lengths (the rows are right-padded to the longest):
#
# 1. cut each image into 8×8 patches in raster order and flatten each one (channel, row, column);
# 2. project each patch to `d_model` and add a learned 2-D position: a row vector plus a column vector;
# 3. embed the words, then put the k-th patch vector at the k-th `<img>` placeholder.

# %%
m = TinyMultimodalModel(cfg)
b = collate(make_examples("train", 5, seed + 2))
images = torch.rand_like(b.images)                     # fresh pixels: nothing about real scenes is assumed
imgs = images[:, 0]                                    # [B, 3, H, W], one image per row
B, C, H, W = imgs.shape
p = cfg.patch_size
g = H // p
patches = imgs.reshape(B, C, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(B, g * g, C * p * p)   # 1. the cut
rc = torch.arange(g)
pos2d = (m.patch_embed.row(rc)[:, None] + m.patch_embed.col(rc)[None, :]).reshape(g * g, -1)
patch_vecs = m.patch_embed.proj(patches) + pos2d                                                  # 2. [B, 16, d]
h = m.tok_emb(b.tokens)                                                                           # 3. words
is_img = b.tokens == TOKENIZER.img_id
h = h.masked_scatter(is_img[..., None], patch_vecs)   # row-major: the k-th <img> of a row gets its k-th patch

h_pkg, positions = m.embed(b.tokens, images)
torch.testing.assert_close(h, h_pkg, rtol=1e-6, atol=1e-6)   # same operations in the same order: equal to fp32 rounding
print(f"sequence lengths {(b.tokens != TOKENIZER.pad_id).sum(1).tolist()}, padded to {b.tokens.shape[1]}: "
      f"built by hand = model.embed, max difference {(h - h_pkg).abs().max().item():.1e}")
print("positions of row 0:", positions[0].tolist(), "(RoPE's 1-D positions; the 2-D ones were added to the patches)")

# %% [markdown]
# The package's code for the same steps: the patch embedding, the model's `embed` (the same
# three steps, plus the checks that give clear errors), and the forward pass that runs the blocks
# over the one sequence.

# %%
show_source(PatchEmbed.forward)

# %%
show_source(TinyMultimodalModel.embed)

# %%
show_source(TinyMultimodalModel.forward)

# %% [markdown]
# ## 3. Train — or load the shipped checkpoint
#
# With `train_model = False` we load `minimax_lab/assets/tiny_cpu.pt` (plain tensors + a JSON-able config,
# loaded with `torch.load(weights_only=True)`) and its recorded training history. Set
# `train_model = True` to train here: the CPU preset takes a few minutes on two cores.

# %%
if train_model:
    dev = runtime.device() if P == "gpu" else "cpu"
    model, hist = train(cfg, tc, device=dev)
    model = model.cpu()
else:
    model, cfg, meta = load_checkpoint(DEFAULT_CHECKPOINT)
    hist = json.loads((DATA / "tiny_cpu_history.json").read_text())["history"]
    print(f"loaded {DEFAULT_CHECKPOINT.name}: {meta['train_config']['steps']} training steps on a CPU")
step_zero.plot_history(hist)
plt.show()

# %% [markdown]
# ## Held-out accuracy
#
# Argmax of the next-token prediction at the final "?", scored on test scenes the model never
# saw, beside what guessing would score (every answer of a question type equally likely).

# %%
test = make_examples("test", n_test, 1)
acc = accuracy(model, test)
print("held-out accuracy:", {k: f"{v:.1%}" for k, v in acc.items()})
print("guessing:", {k: f"{v:.0%}" for k, v in step_zero.CHANCE.items()}, f"all {step_zero.chance():.0%}")

# %% [markdown]
# ## 4. Attention maps
#
# `model(tokens, images, capture=True)` also returns, per layer, the materialized softmax
# probabilities `[B, heads, S, S]`. Left: one head's whole map (image region shaded, text after
# it; the dashed line is the answer query). Right: the answer query's attention on the 16 patches,
# painted on each patch's background in gray (black: none, light gray: the most; the colour bar
# gives the weights), so every object keeps its own colour, the one a colour question asks about
# included; the asked-about object has a dashed magenta outline. In Jupyter you get pickers for
# layer, head, example and query token (`token = -1` = the answer position); under papermill one
# static picture.

# %%
g = grounding_ratios(model, test)
best = np.unravel_index(int(g.argmax()), g.shape)
batch, attn = amaps.capture_attention(model, test[:12])
# one picture; in Jupyter / Colab it comes with pickers for layer, head, example and token
amaps.explore_attention(batch, attn, defaults={"layer": int(best[0]), "head": int(best[1]), "example": 0,
                                               "token": -1})

# %% [markdown]
# ## The grounding ratio
#
# For each question, take the attention mass the answer position puts on the patches of the
# object(s) the question is about, and divide by what uniform attention over the image would put
# there (`n_focus / 16`). 1 means "no preference for the right object"; one focus patch caps it at
# 16. Averaged over held-out questions (count questions with answer 0 have no focus and are
# skipped).

# %%
_ = amaps.grounding_table(g.numpy())
plt.show()
print(f"best head: layer {best[0]} head {best[1]}, grounding ratio {float(g.max()):.1f}")
amaps.plot_top_heads(g, batch, attn, n_heads=3, n_examples=6)
plt.show()

# %% [markdown]
# ## 5. From step zero vs. text first
#
# Same model, same step budget, two schedules:
#
# * **mixed** — both modalities from step zero: even steps image + question, odd steps the same
#   kind of question about a scene described in words ("scene red square at row 1 col 2 , … ;").
# * **text first** — only the described scenes for the first half of the steps, then the mixed
#   schedule.
#
# We compare loss curves, held-out accuracy on the *image* questions, and grounding. The shipped
# numbers come from `minimax_lab/assets/experiment_step_zero.json` (CPU preset, measured once); set
# `rerun_experiment = True` to measure them again here.

# %%
if rerun_experiment:
    exp = step_zero_vs_text_first(cfg, experiment_steps, seed=seed, tc=tc)
else:
    exp = json.loads((DATA / "experiment_step_zero.json").read_text())
step_zero.plot_schedules(exp)
plt.show()
print(step_zero.schedule_lines(exp, rerun=rerun_experiment))

# %% [markdown]
# **What this measures.** The shipped run is short: the first line above gives its steps per
# schedule, against the checkpoint's 2000, and how many held-out questions score it. Each accuracy
# is judged against guessing, and the gap between the schedules against two standard errors of
# those questions: a gap inside them is no measurable difference, whichever way it points. The
# last lines say which model has the sharper head, and how far text first's loss jumps when the
# images arrive: the first image batches are new inputs to a model that has seen none. One seed,
# one budget: treat it as a pointer, not a result. Rerun with `rerun_experiment = True` and a larger `experiment_steps` (2000 take about 15
# minutes on two cores) to see whether the differences persist.
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
# Fill in each function and run the cell after it: the checker draws fresh sequences or images
# every time and says what is wrong. Solutions are in `minimax_lab/exercises/solutions/ch01.py`.
#
# **01.1 The loss mask.** Training predicts the next token everywhere, but only words are targets:
# predicting an image placeholder (a patch is given, not generated) or padding would teach nothing.
# The checker compares with the mask the package's batches carry, on fresh padded interleaved sequences.

# %%
def loss_mask(tokens: torch.Tensor, img_id: int, pad_id: int) -> torch.Tensor:
    """``tokens [B, S]``: interleaved sequences (words, ``img_id`` placeholders for image patches,
    right padding with ``pad_id``). Position ``t`` is trained to predict ``tokens[:, t + 1]``.
    Return a bool tensor ``[B, S]``: True where that next token is a word, so its loss counts;
    False where it is an image placeholder or padding, and at the last position (nothing follows)."""
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
# ## What limits us
#
# Everything here is small on purpose: half a million parameters, 32×32 scenes of three shapes in
# four colours, one patch per object, a vocabulary of 141 words. That makes the attention maps
# readable and the training a few minutes on a CPU, but it also makes finding an object as easy as
# finding one patch, which real images never are. The grounding ratio measures where attention goes, not
# whether the answer depends on it: a model can look at the right patch and still answer from
# elsewhere, which an ablation (zeroing that patch) would test. And the step-zero experiment is one
# seed at one budget; real early-fusion models settle such questions with many runs at scale.

# %% [markdown]
# ---
# **Previous:** [00 · Rooflines and honest benchmarks](00_roofline_and_honest_benchmarks.ipynb) · **Next:** [02 · FlashAttention in Triton](02_flash_attention_in_triton.ipynb)
#
# **Package code used here:** `minimax_lab/model/model.py`, `minimax_lab/model/layers.py`, `minimax_lab/model/train.py`, `minimax_lab/model/experiments.py`, `minimax_lab/data/examples.py`, `minimax_lab/viz/attention_maps.py`, `minimax_lab/exercises/ch01.py`
