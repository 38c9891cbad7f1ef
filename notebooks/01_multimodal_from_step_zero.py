# %% [markdown]
# # 01 · Multimodal from step zero: a tiny early-fusion model and its attention maps
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
# 2. a ~0.5M-parameter decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU),
# 3. training (or loading the shipped checkpoint, trained with the CPU preset),
# 4. attention maps, and the **grounding ratio** per layer and head,
# 5. an experiment: both modalities from step zero vs. text first, images later.
#
# The same model is reused later: the MSA chapter (03) trains an index branch on it, the MoE
# chapter (04) swaps its FFN for experts.

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
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

from minimax_lab import runtime
from minimax_lab.data import PATCHES_PER_IMAGE, QTYPES, TOKENIZER, collate, make_examples
from minimax_lab.model import (TinyMultimodalModel, TrainConfig, accuracy, load_checkpoint, preset_config,
                               save_checkpoint, train)
from minimax_lab.model.experiments import grounding_ratios, step_zero_vs_text_first
from minimax_lab.model.train import DEFAULT_CHECKPOINT, preset_train_config
from minimax_lab.viz import attention_maps as amaps

P = runtime.resolve_preset(preset)
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
# *A note on what is learnable here.* We first asked the relational "is the red square left of
# the blue circle ?". Within the CPU budget (2000 steps) this model learned colour and count
# questions perfectly but stayed at chance on that one (84 % overall), so the shipped "left"
# question asks about one object's half of the image. Comparing two retrieved positions is a
# harder circuit than reading one; a bigger model or a longer run is the experiment to try.

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
# chosen by config (`attn_impl`, `ffn`), which is how later chapters plug in MSA and MoE.

# %%
cfg = preset_config(P)
tc = preset_train_config(P, seed=seed, **({"steps": train_steps} if train_steps else {}))
print(cfg)
print(f"{sum(p.numel() for p in TinyMultimodalModel(cfg).parameters()) / 1e6:.2f} M parameters")

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
    print("loaded", DEFAULT_CHECKPOINT.name, "- trained", meta.get("trained_on", "?"))

fig, ax = plt.subplots(1, 2, figsize=(10, 3.2))
loss = np.array(hist["loss"])
k = 25
ax[0].plot(np.convolve(loss, np.ones(k) / k, mode="valid"))
ax[0].set(xlabel="step", ylabel="training loss (weighted, smoothed)", yscale="log", title="loss")
ax[1].plot(hist["val_step"], hist["val_acc"], "o-")
ax[1].set(xlabel="step", ylabel="validation accuracy", ylim=(0, 1.02), title="answer accuracy")
plt.show()

# %% [markdown]
# ## Held-out accuracy
#
# Argmax of the next-token prediction at the final "?", scored on test scenes the model never
# saw. The bar for this notebook is ≥ 95 % overall.

# %%
test = make_examples("test", n_test, 1)
acc = accuracy(model, test)
print("held-out accuracy:", {k: f"{v:.1%}" for k, v in acc.items()})

# %% [markdown]
# ## 4. Attention maps
#
# `model(tokens, images, capture=True)` also returns, per layer, the materialized softmax
# probabilities `[B, heads, S, S]`. Left: one head's whole map (image region shaded, text after
# it; the dashed line is the answer query). Right: the answer query's attention on the 16 patches,
# drawn over the image, with the asked-about object outlined. In Jupyter you get pickers for
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
top = torch.topk(g.flatten(), 3).indices.tolist()
fig, axs = plt.subplots(3, 6, figsize=(13, 6.8))
for row, flat in enumerate(top):
    li, hi = divmod(flat, g.shape[1])
    for col in range(6):
        a = attn[li][col, hi, int(batch.answer_pos[col]), 1:1 + PATCHES_PER_IMAGE]
        q = " ".join(test[col].question)
        amaps.image_overlay(batch.images[col, 0], a, focus=batch.focus[col].nonzero().flatten().tolist(),
                            ax=axs[row, col], title=(f"L{li}H{hi} " if col == 0 else "") + q)
plt.tight_layout()
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
fig, ax = plt.subplots(1, 2, figsize=(11, 3.3))
for name, colour in (("mixed", "tab:blue"), ("text_first", "tab:orange")):
    h = exp[name]["history"]
    ax[0].plot(np.convolve(h["loss"], np.ones(25) / 25, mode="valid"), color=colour, label=name)
    ax[1].plot(h["val_step"], h["val_acc"], "o-", color=colour, label=name)
ax[0].axvline(exp["steps"] * exp.get("text_first_frac", 0.5), color="gray", ls=":", label="images added (text first)")
ax[0].set(xlabel="step", ylabel="training loss (smoothed)", yscale="log")
ax[1].set(xlabel="step", ylabel="validation accuracy, image questions", ylim=(0, 1.02))
ax[0].legend(), ax[1].legend()
plt.show()
for name in ("mixed", "text_first"):
    r = exp[name]
    per_type = ", ".join(f"{q} {r['test_acc'][q]:.0%}" for q in QTYPES)
    print(f"{name:>10}: held-out image-QA accuracy {r['test_acc']['all']:.1%} ({per_type}), "
          f"best grounding ratio {r['best_grounding']:.1f}")

# %% [markdown]
# **What this measures, honestly.** The shipped run (CPU preset model, 600 steps per schedule —
# less than a third of the checkpoint's 2000, because two full runs do not fit the time we had)
# measured: *mixed* 44.8 % held-out image-QA accuracy with best grounding ratio 3.8; *text first*
# 46.8 % with best grounding 2.7 (chance is about 33 %). At this budget **neither schedule has
# learned the image questions yet**, so accuracy does not separate them, and text first did *not*
# collapse; the one difference we see is grounding: the model that saw images from step zero
# has a head that looks at the asked-about object more sharply (3.8 vs 2.7). One seed, one
# budget: treat it as a pointer, not a result. Rerun with `rerun_experiment = True` and a larger
# `experiment_steps` (e.g. 2000, ~15 minutes on two cores) to see whether the gap persists.
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
