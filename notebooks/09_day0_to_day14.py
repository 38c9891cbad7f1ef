# %% [markdown]
# # 09 · Day 0 to day 14: serving the model, one switch at a time
#
# **What this chapter builds:** an engine that serves an M3-shaped model (early fusion, MSA and dense attention layers, a Mixture-of-Experts FFN) end to end — scheduler, paged KV cache, sampling — first plainly correct (day 0), then faster one switch per day: Triton MSA, the fused MoE, paged kernels, CUDA graphs, prefix caching, continuous batching, and on day 14 an FP8 KV cache and FP8 experts. Each switch is measured on chat and agent workloads and checked against day 0.
#
# **It assumes:** [03 · MiniMax Sparse Attention](03_minimax_sparse_attention.ipynb) (MSA's prefill and paged decode), [05 · Mixture of Experts](05_mixture_of_experts.ipynb) (routing and the fused expert kernels), [06 · A paged KV cache for agents](06_paged_kv_cache_for_agents.ipynb) (pages, block tables, prefix sharing) and [00 · Rooflines and honest benchmarks](00_roofline_and_honest_benchmarks.ipynb) (how every number here is timed).
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/09_day0_to_day14.ipynb)
#
# The earlier chapters built kernels and measured each alone. A user never sees a kernel: they see
# how long the first token of an answer takes (**TTFT**), how fast the rest arrive (**inter-token
# latency**), how many users one GPU serves at once (**decode tokens/s** at a batch), and whether
# the model still fits (**memory**). An engine is where kernels turn into those four numbers, and
# where a kernel that is 5× faster alone can buy almost nothing, because the time was going
# somewhere else.
#
# So this chapter starts from an engine that is *correct and nothing else* — day 0 — and turns
# one switch a day, each time asking what it changes, why it should help, and whether it did. Every
# day must give day 0's answers: a speed-up that changes the output is a bug until proven otherwise.

# %%
# In Colab, install the workbook's package first (locally, `make lab` already did).
import subprocess, sys
if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "minimax-lab[notebooks] @ git+https://github.com/minimax-lab/minimax-lab"], check=True)

# %% tags=["parameters"]
preset = "auto"        # "cpu" (tiny model, Triton's interpreter) or "gpu" (the 2.8 B-parameter model)
days = None            # which days to serve live (None: the preset's subset, printed below)

# %%
import time

import matplotlib.pyplot as plt
import torch

from minimax_lab import bench, exercises, runtime   # runtime first: it picks the Triton interpreter on a CPU
from minimax_lab.engine import (DAY_LABELS, DAYS, Engine, M3Model, SamplingParams, day_options, kv_bytes_per_token,
                                m3_config, param_count)
from minimax_lab.bench import suite_engine as engine_bench
from minimax_lab.engine import quality
from minimax_lab.engine.config import CPU as CPU_SIZE, GPU as GPU_SIZE
from minimax_lab.engine.paged_attention import PagedKVCache, StepAttention
from minimax_lab.engine.scheduler import Scheduler
from minimax_lab.viz.source import show_source
from minimax_lab.viz import engine as veng

T0 = time.perf_counter()
P = runtime.resolve_preset(preset)
dev = runtime.kernel_device()
# CPU: the interpreter pays per kernel launch, so the live run serves day 0, day 6 (every switch of
# days 1-6 on but CUDA graphs, which need a GPU) and day 14, on the chat and long-agent cases.
# GPU: every day and case.
days = list(days) if days is not None else runtime.pick(P, cpu=[0, 6, 7], gpu=list(range(len(DAYS))))
cases = runtime.pick(P, cpu=["chat", "agent_long"], gpu=["chat", "agent", "agent_long"])
print(f"device {runtime.device_name()}, preset {P}, interpreter {runtime.is_interpreter()}, live days {days}, "
      f"cases {cases}")

# %% [markdown]
# ## 1. The model we serve
#
# `M3Model` has the architecture the workbook rebuilds, with random weights (nothing to
# download): 64 query heads over 4 KV heads of 128, MSA layers that pick 16 blocks of 128 tokens per
# query, one dense-attention layer, and 128 experts of which each token uses 8. At the GPU size it
# has 2.8 B parameters — small enough that every day of the bench, day 0's PyTorch prefill of a
# 128k-token context included, runs in minutes, large enough that a decode step moves real bytes.
# On the CPU the same code serves a miniature (two layers, 32-wide) through Triton's interpreter.

# %%
for name, c in (("gpu", GPU_SIZE), ("cpu", CPU_SIZE)):
    print(f"{name}: {param_count(c) / 1e9:8.4f} B parameters ({param_count(c, activated=True) / 1e9:.4f} B read per "
          f"token), {c.n_layers} layers (dense {list(c.dense_layers)}), {c.dtype}, KV {kv_bytes_per_token(c):,} bytes "
          f"per token, a 128k context = {131_072 * kv_bytes_per_token(c) / 2**30:.2f} GiB")
cfg = m3_config(P)
model = M3Model.create(cfg, dev)

# %% [markdown]
# ## 2. Day 0: correct
#
# An engine step does four things: **schedule** (which sequences decode a token, which prompt
# chunks are computed, which pages they get), **prepare** (one flat batch of token ids, positions
# and KV slots), **run** the model over it (each layer writes its new K/V into the pages, then
# attends through the block tables), and **sample** the next tokens. Day 0 does all of it in plain
# PyTorch, one request at a time, with no cache reuse. It is slow on purpose: it is the reference
# every later day is compared with.

# %%
show_source(Engine.step)

# %% [markdown]
# The scheduler decides what a step computes. With continuous batching off it serves one request:
# its whole prompt, then one token per step. The same code, with the switch on, decodes every
# running sequence each step and fills the rest of a token budget with prompt chunks (day 6).

# %%
show_source(Scheduler.schedule)

# %% [markdown]
# ### Exercise 09.1 — one scheduler step
#
# Four exercises in this chapter, each checked in well under a second on the CPU against the
# package's own code (09.2 below, 09.3 in section 5, 09.4 in section 6). Solutions are in
# `minimax_lab/exercises/solutions/ch09.py`; try first.
#
# Take the scheduler's rule without its bookkeeping: given the running sequences (how much of each
# prompt is still to compute; 0 means decoding), the waiting queue, the token budget and the batch
# limit, say who computes how many tokens in the next step. Decodes never wait for a prompt; a long
# prompt is cut into chunks that fit what is left of the budget. The checker builds the same state
# in a real `Scheduler` (fresh sizes each time: no token limit, a budget the decodes nearly use
# up, a full batch) and compares the plans.

# %%
def next_step(running: list, waiting: list, step_tokens: int | None, max_batch: int) -> list:
    """One step of continuous batching with chunked prefill. `running` lists the admitted
    sequences, oldest first, as (seq_id, prompt tokens still to compute): 0 means it is decoding.
    `waiting` lists the queued requests in arrival order as (seq_id, prompt length). At most
    `max_batch` sequences run at once; `step_tokens` is the step's token budget (None: no limit);
    the KV pool always has room. Return the step's work as (seq_id, n_tokens) pairs in the order
    Scheduler.schedule plans them: every decode (one token), then prompt chunks of running
    sequences, then newly admitted requests."""
    raise NotImplementedError  # your code here

# %%
exercises.check("09.1", next_step)

# %% [markdown]
# Serve two requests on day 0: the first carries an image (its patches are placeholders in the
# prompt, replaced by patch embeddings: early fusion), the second shares the first's opening
# pages.

# %%
import numpy as np
from minimax_lab.data.examples import random_scene
from minimax_lab.data.shapes import render

rng = np.random.default_rng(0)
img = render(random_scene(rng), size=cfg.image_size, rng=rng)[None]
text = lambda n, seed: torch.randint(0, cfg.vocab_size - 1, (n,), generator=torch.Generator().manual_seed(seed)).tolist()  # noqa: E731
first = text(6, 1) + [cfg.img_id] * cfg.patches_per_image + text(3 * cfg.block_size, 2)
second = first[:2 * cfg.block_size] + text(5, 3)
eng0 = Engine(model, day_options(0), kv_tokens=8 * len(first), record_logits=True)
ids = [eng0.add_request(first, images=img, sampling=SamplingParams(max_tokens=4)),
       eng0.add_request(second, images=img if cfg.img_id in second else None, sampling=SamplingParams(max_tokens=4))]
out0 = eng0.run()
for i in ids:
    s = eng0.sequences[i]
    print(f"request {i}: {s.prompt_len} prompt tokens, answer {out0[i]}, TTFT {1e3 * (s.first_token - s.arrival):.1f} ms, "
          f"{s.cached_tokens} tokens served from cache")

# %% [markdown]
# ### Exercise 09.2 — temperature and top-p sampling
#
# The answers above are greedy (`SamplingParams()` has `temperature=0`). With a temperature the
# engine samples from the *nucleus* (top-p; Holtzman et al. 2019, arXiv 1904.09751): the smallest
# set of most likely tokens whose probability reaches `top_p`. Each request owns a
# `torch.Generator` seeded from its `seed`, so it draws the same tokens whatever else shares its
# batch. Write the sampler for one row of logits; the checker draws a dozen tokens per setting
# with the same seed as `engine.sampling.sample` and compares them draw for draw, then checks
# which tokens a few hundred of your draws can reach.

# %%
def sample_next(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> int:
    """The next token id from one row of fp32 `logits` [V]. temperature == 0: greedy (argmax).
    Otherwise: probs = softmax(logits / temperature); keep the smallest set of most likely tokens
    whose probability reaches top_p (always at least the most likely one), zero the rest and
    renormalise, keeping the vocabulary's order; then draw with
    torch.multinomial(probs, 1, generator=generator) so a seeded request draws the same tokens.
    Do not modify `logits`."""
    raise NotImplementedError  # your code here

# %%
exercises.check("09.2", sample_next)

# %% [markdown]
# ## 3. The switches, one a day
#
# | day | switch | what changes | why it should help |
# | --- | --- | --- | --- |
# | 1 | `triton_msa` | MSA's index scores, block selection, sparse prefill and paged sparse decode run as Triton kernels (chapter 03) | the PyTorch path gathers the selected blocks into new tensors; the kernels read them in place |
# | 2 | `fused_moe` | the experts run as the fused Triton kernels (chapter 04) | one launch per GEMM for all experts, no sorted copies of the tokens |
# | 3 | `paged_kernels` | `write_kv`, `paged_prefill`, `paged_decode` in Triton (chapter 05) | attention reads pages through the block table instead of gathering a contiguous copy of the context |
# | 4 | `cuda_graphs` | decode steps replay a CUDA graph per batch-size bucket | a decode step launches hundreds of small kernels; at small batch the GPU waits for the CPU to launch them |
# | 5 | `prefix_caching` | full pages are named by their content and reused across requests (chapter 05) | an agent's next turn repeats its whole context: only the new tokens are computed |
# | 6 | `continuous_batching` | requests join and leave the batch every step; long prompts are prefilled in chunks beside the decodes | one weight read serves the whole batch; a long prefill no longer stalls everyone else's tokens |
# | 14 | `fp8` | K, V and MSA's index keys stored in FP8 (e4m3) with an fp32 scale per token (and head); the experts' weights in FP8 with a scale per output channel | decode is bandwidth-bound: half the bytes per KV token and per expert weight, and half the KV memory |
#
# Days 1 to 6 change *how* the same numbers are computed, so each must reproduce day 0's logits up
# to rounding order. Day 14 changes the numbers themselves — every stored value is rounded to
# 3 mantissa bits — so it has a quality budget instead, measured in section 5. (Why "day 14": the
# first six switches took a day each; FP8 — one quantizer, FP8 paths in two kernels and the quality
# checks — took the second week.)
#
# Each switch is one field of `EngineOptions`; a day's options are every switch up to it:

# %%
for n in range(len(DAYS)):
    o = day_options(n, cuda_graphs_available=dev.type == "cuda")
    print(f"{DAY_LABELS[n]:36s} msa={o.msa_impl:6s} moe={o.moe_impl:6s} paged={o.paged_impl:6s} graphs={o.cuda_graphs!s:5s} "
          f"prefix={o.prefix_caching!s:5s} batching={o.continuous_batching!s:5s} kv={o.kv_dtype} experts={o.expert_dtype}")

# %% [markdown]
# ## 4. Serving the workloads, day by day
#
# Three cases, built from the chapter-05 workload generators (system prompts, a codebase of
# standard-library sources, generated images):
#
# * **chat** — users sharing one long system prompt, each sending a message with an image;
# * **agent** — coding-agent sessions sharing a codebase in context; every turn appends a tool
#   result (a file read, once a screenshot) and asks for a short answer;
# * **agent_long** — one agent on a long context (128k tokens on the GPU): the first turn, then
#   `B` forks decoding side by side (decode tokens/s at batch `B`), then a follow-up turn.
#
# The bench serves each case on each day with a fresh engine, answers forced to day 0's tokens
# (so every day sees the same contexts and its logits can be compared with day 0's), and returns
# one record per measurement — the same records `python -m minimax_lab.bench engine` writes.
# On the CPU the times are the interpreter's: every Triton day is *slower* than PyTorch there;
# what the live run shows is that each day serves and gives day 0's answers. The speeds are the
# H200's, below. (The CPU run serves three days — 0, 6, 14 — on chat and the long agent, whose
# follow-up turn is the agent workload's; the GPU run every day and case.)

# %%
if P == "gpu":   # the bench's sizes, with the long context cut to 32k and fewer agent turns: a few minutes
    sizes = {**engine_bench.GPU_SIZES,
             "agent": dict(sessions=2, turns=2, codebase_tokens=16_384, tool_tokens=(200, 2000), max_tokens=32),
             "agent_long": {**engine_bench.GPU_SIZES["agent_long"], "codebase_tokens": 32_768}}
else:
    sizes = engine_bench.CPU_SIZES
t = time.perf_counter()
# no rehearsal here (it would double the run): the live Triton days include compiling each new
# kernel shape the first time, the recorded H200 ones do not (section 7)
live = engine_bench.run(P, cases=cases, days=days, sizes=sizes, verbose=False, rehearse=False)
print(f"{len(live)} records from {len(days)} days x {len(cases)} cases in {time.perf_counter() - t:.1f} s")
print(bench.format_table([r for r in live if r["case"].endswith((".ttft_followup", ".itl"))]))

# %% [markdown]
# ## 5. Did each day keep day 0's answers?
#
# Every day after day 0 emitted day 0's tokens (forced), so its logits are compared on the same
# contexts: the relative error of all answer logits and the share of answer tokens whose top-1 id
# is day 0's. Days 1–6 should sit at rounding noise (fp32 on the CPU, bf16 and TF32 on the GPU);
# the FP8 day's figures are what FP8 costs. A case whose error stands out from the others is
# worth a look before trusting the average: MSA's top-k is a discrete choice, so rounding the
# index keys can change which blocks a query reads (`msa_select` on the rounded keys shows it).

# %%
print(veng.format_quality(live))

# %% [markdown]
# ### Exercise 09.3 — did the answers change?
#
# The two columns above come from one small function of the bench. Write it: the answer logits of a
# day and of day 0, one `[tokens, vocab]` tensor per served turn. The relative error is **one** norm
# ratio over every turn's logits together — an average of per-turn ratios would let a short turn
# with small logits count as much as a long one. The checker compares with
# `engine.workloads.quality` on turns of ragged lengths and scales, at rounding noise, FP8-sized
# errors and a broken day.

# %%
def logits_agreement(logits: list, reference: list) -> dict:
    """`logits` and `reference` hold one fp32 tensor [n_i, V] per answered turn (the same turns,
    the same contexts): a day's answer logits and day 0's. Return {"logits_rel_err":
    ||all logits - all reference|| / ||all reference|| (norms over every turn's logits together),
    "top1_agreement": the share of answer tokens whose argmax ids agree, "compared_tokens": the
    number of answer tokens}."""
    raise NotImplementedError  # your code here

# %%
exercises.check("09.3", logits_agreement)

# %% [markdown]
# A model with random weights cannot say whether an error of a percent *matters*. The workbook's
# tiny model from chapter 01 has learned to answer questions about images, so on it FP8 can be
# scored by held-out accuracy: its keys and values rounded as an FP8 cache stores them (per token
# and head), its FFN weights as FP8 experts are (per output channel) — the same quantizer,
# `minimax_lab.fp8.quantize_fp8`.

# %%
rows = quality.fp8_accuracy(runtime.pick(P, cpu=512, gpu=2048))
print(quality.format_rows(rows))

# %% [markdown]
# ## 6. Day 14 in code: where the scales live
#
# FP8 (e4m3) keeps 3 mantissa bits and 4 exponent bits; its largest value is 448. Each stored
# group (a token's head of K, a token's index key, an expert's output channel) gets one fp32 scale,
# a power of two chosen so the group's largest value lands in (224, 448]: dividing by it and
# multiplying back are exact, so the only loss is rounding each value (a relative error of at most
# 2⁻⁴). The pool allocates FP8 pages and their scales; the index keys are quantized on the way in;
# every kernel gets the scales beside the pages.

# %%
show_source(PagedKVCache.write_index)

# %%
show_source(StepAttention.__call__)

# %% [markdown]
# The experts are quantized once per model (`M3Model.quantize_experts`), and the engine of the FP8
# day passes the FP8 weights and their scales to `moe_experts`. The memory this saves:

# %%
c = GPU_SIZE
with torch.device("meta"):
    big = M3Model(c)
bf16_experts = sum(l.w_gate_up.numel() + l.w_down.numel() for l in big.layers) * 2  # noqa: E741
print(f"GPU size: experts {bf16_experts / 2**30:.2f} GiB in bf16 -> {big.expert_bytes(fp8=True) / 2**30:.2f} GiB "
      f"in FP8 with scales; KV per token {kv_bytes_per_token(c):,} B in bf16 -> "
      f"{kv_bytes_per_token(c) // 2 + 4 * (2 * c.n_layers * c.n_kv_heads + len(c.sparse_layers)):,} B in FP8 with scales")

# %% [markdown]
# ### Exercise 09.4 — FP8 with a power-of-two scale per row
#
# Write the quantizer day 14 stores everything with, for one scale per row (a token's key, an
# expert's output channel). The checker compares with `minimax_lab.fp8.quantize_fp8` **bit for bit**
# — scales and stored bytes — on rows from 2⁻²⁰ to 2²⁰, an all-zero row, and rows whose largest
# value sits exactly on 448·2ᵏ or one ulp above it. That last row is the trap: in fp32,
# `log2(amax / 448)` can come out an integer when it should be a hair above, giving half the scale,
# and the row's largest value then saturates at 448. Find the exponent exactly.

# %%
def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 (e4m3, torch.float8_e4m3fn) storage of a float tensor x [..., D] with one fp32 scale per
    row (per slice along the last dim): scale is the smallest power of two with
    max|row| / scale <= 448 (1 for an all-zero row), and x8 = x / scale cast to float8_e4m3fn.
    Return (x8 shaped like x, scale of shape x.shape[:-1]). Do not modify x."""
    raise NotImplementedError  # your code here

# %%
exercises.check("09.4", quantize_rows_fp8)

# %% [markdown]
# ## 7. The waterfall: this run beside the H200
#
# One bar per day, four panels: the TTFT of the agent's follow-up turn, decode tokens/s at the
# long context, inter-token latency, and the memory the day needs (weights + KV pool). Each day
# keeps the earlier switches, so the step from one bar to the next — the `x` factor — is that
# switch's gain with everything else fixed. Grey bars are the recorded H200 run
# (`bench.load_records(suite="engine")`), orange ones this run.

# %%
recorded = bench.load_records(suite="engine")
fig = veng.plot_waterfall(live, recorded, device_now=runtime.device_name())
plt.show()
print(veng.format_waterfall(live, recorded, device_now=runtime.device_name()))

# %% [markdown]
# How to read it, and what to expect where a record exists:
#
# * **Kernels (days 1–3)** speed up prefill and decode where MSA, the experts or attention were
#   the time; a day whose bar barely moves tells you that part was not the bottleneck.
# * **CUDA graphs (day 4)** shrink the inter-token latency at small batch, where launching a few
#   hundred kernels costs more than running them; at large batch the GPU is busy anyway.
# * **Prefix caching (day 5)** is the large step on the follow-up turn: only the appended tool
#   result is computed, not the whole context.
# * **Continuous batching (day 6)** is about throughput under load: many requests share each
#   weight read.
# * **FP8 (day 14)** halves the KV pool and the expert weights. Whether decode gets faster depends
#   on whether each FP8 kernel turns half the bytes into less time — the next section checks that
#   kernel by kernel.
#
# On the CPU every Triton bar is slower than day 0's PyTorch one: the interpreter runs each kernel
# program in Python. That is why the live run here checks answers and the H200 record gives
# speed. The H200 records are *rehearsed*: before a Triton day is timed it serves the same workload
# once on a throwaway engine, so Triton has compiled every kernel shape the workload needs (as in a
# server that has been up for a while); a line under the table names any record made without it.

# %% [markdown]
# ## 8. The targets, and what limits the next step
#
# What the story set out to reach on the H200, each figure a ratio read from the records (the
# engine's waterfall above, and the `kvcache` and `moe` suites' FP8 cases, which time the FP8
# kernel beside the bf16 one in the same run):

# %%
all_recorded = bench.load_records()
print(veng.format_targets(all_recorded))

# %% [markdown]
# Where a row says **NO**, the reason is in the kernels, not the engine:
#
# * **FP8 paged decode** reads half the bytes of the bf16 one and is still slower. The bf16 kernel
#   is bandwidth-bound; with FP8 pages each tile of tokens costs the same page-table lookups, two
#   more scale loads and the e4m3 → bf16 conversions, for half the bytes — so the FP8 kernel is
#   bound by the work per tile, not by memory. Twice the tokens per tile (`wide_tile` in the
#   `kvcache` records) already recovers part of the gap; a tile shape tuned for FP8, or keeping the
#   scores' dot in FP8 itself, is the next step. It is also why the FP8 day decodes a little slower
#   than day 6 at 128k: the dense layer reads the whole context of every sequence.
# * **FP8 MoE prefill** gains little over bf16 at 16k tokens: there the grouped GEMMs are
#   compute-bound, and the FP8 kernel runs the bf16 kernel's tile shapes at a small share of the
#   H200's measured FP8 GEMM rate (`pct_of_fp8_gemm` in the records). FP8-specific tiles (a sweep of
#   them is built into the `moe` bench, `--sweep`) are the next step. At decode sizes, where reading
#   the weights is the time, FP8's halved bytes do show.

# %%
fp8_rows = [r for r in all_recorded if r.get("suite") in ("kvcache", "moe") and r["case"].startswith("fp8_")
            and not r["impl"].endswith("_cudagraph")]
print(bench.format_table(fp8_rows))

# %%
print(f"notebook ran in {time.perf_counter() - T0:.0f} s (preset {P})")

# %% [markdown]
# **What to take away.** An engine's speed is decided by where the time goes at each point of a
# request's life — prefill, decode, the CPU launching kernels, recomputing what was already
# computed — and each switch attacks one of them. Turn them on one at a time, measure each, and
# check each against a correct day 0: that is how you know what a switch bought and that it did not
# change the answers.

# %% [markdown]
# ---
# **Previous:** [08 · A kernel bench that hacks cannot fool](08_kernel_bench_that_hacks_cannot_fool.ipynb)
#
# **Package code used here:** `minimax_lab/engine/engine.py`, `minimax_lab/engine/scheduler.py`, `minimax_lab/engine/paged_attention.py`, `minimax_lab/engine/model_m3.py`, `minimax_lab/engine/options.py`, `minimax_lab/engine/precision.py`, `minimax_lab/engine/quality.py`, `minimax_lab/engine/workloads.py`, `minimax_lab/bench/suite_engine.py`, `minimax_lab/fp8.py`, `minimax_lab/viz/engine.py`, `minimax_lab/exercises/ch09.py`
