# %% [markdown]
# # 09 · Day 0 to day 14: serving the model, one switch at a time
#
# **What this chapter builds:** an engine that serves an M3-shaped model (early fusion, MSA and dense attention layers, a Mixture-of-Experts FFN) — scheduler, paged KV cache, sampling — first plainly correct (day 0), then one switch a day: Triton MSA, the fused MoE, paged kernels, CUDA graphs, prefix caching, continuous batching, and on day 14 an FP8 KV cache and FP8 experts. Each day is checked against day 0, measured on chat and agent workloads, and put under load: requests arriving over time, a pool that runs out, tail latency.
#
# **It assumes:** [04 · Sparse attention kernels](04_sparse_attention_kernels.ipynb) (MSA's prefill and paged decode), [05 · Mixture of Experts](05_mixture_of_experts.ipynb) (the fused expert kernels), [06 · A paged KV cache for agents](06_paged_kv_cache_for_agents.ipynb) (pages, block tables, prefix sharing) and [00 · The roofline, and benchmarks you can trust](00_roofline_and_honest_benchmarks.ipynb) (the roofline, and timing without fooling yourself).
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/09_day0_to_day14.ipynb)
#
# A user never sees a kernel. They see how long the first token takes (**TTFT**), how fast the
# rest arrive (**inter-token latency**), and whether the answer still comes when many others ask
# at once. An engine is where kernels turn into those numbers, and where a kernel 5× faster alone
# can buy nothing because the time was going somewhere else. So we start from an engine that is
# *correct and nothing else*, turn one switch a day, and ask of each: what does it buy, what does it
# cost, and did it keep day 0's answers?

# %%
# In Colab, install the workbook's package first (locally, `make lab` already did).
import subprocess, sys
if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "minimax-lab[notebooks] @ git+https://github.com/minimax-lab/minimax-lab"], check=True)

# %% tags=["parameters"]
preset = "auto"        # "cpu" (tiny model, Triton's interpreter) or "gpu" (the 2.8 B-parameter model)

# %%
import time

import matplotlib.pyplot as plt
import torch

from minimax_lab import exercises, runtime   # runtime first: it picks the Triton interpreter on a CPU
from minimax_lab.bench import suite_engine as engine_bench
from minimax_lab.bench.suite_engine_sessions import chat_breakdown
from minimax_lab.bench.suite_engine_timeline import timeline_example
from minimax_lab.engine import DAY_LABELS, DAYS, Engine, M3Model, SamplingParams, day_options, m3_config
from minimax_lab.engine import quality
from minimax_lab.engine.paged_attention import PagedKVCache
from minimax_lab.engine.workloads import two_requests
from minimax_lab.notebook import recorded
from minimax_lab.viz import engine as veng
from minimax_lab.viz.source import show_source

T0 = time.perf_counter()
P = runtime.resolve_preset(preset)
dev = runtime.kernel_device()
cfg = m3_config(P)
model = M3Model.create(cfg, dev)
print(f"{runtime.device_name()}, preset {P}: {sum(p.numel() for p in model.parameters()):,} parameters, {cfg.dtype}")

# %% [markdown]
# ## 1. The idea: an engine is a loop, and requests arrive while it runs
#
# Every step the engine decides which sequences compute how many tokens, runs the model once over
# all of them, and samples one token for each sequence that reached the end of its prompt. Requests
# do not wait politely for each other: they arrive whenever their users press enter. The picture is
# ten requests arriving faster than one-at-a-time serving could keep up with, served with every
# switch of day 6 on: a **blue** bar is a step that computes part of a request's prompt, **green** a step
# that decodes one token for it, grey is waiting. Decodes of different requests share steps
# (continuous batching), a long prompt is cut into chunks beside them (chunked prefill), and when
# the page pool runs out the newest request is **preempted** (red cross): its pages are freed and
# it comes back later to recompute them. Time here is *simulated*: each step is priced by a cost
# model fitted to measured step times (section 5 explains), so the picture is exact and instant.

# %%
events = timeline_example(model, engine_bench.sizes_for(P))
veng.plot_timeline(events, title=f"{DAY_LABELS[events['day']]}, 16 KV pages, preemption by recompute "
                                 f"(steps priced by: {events['prices']})")
plt.show()

# %% [markdown]
# ## 2. Day 0: correct
#
# A step is four things: **schedule** (the plan: decodes, prompt chunks, pages), **prepare** one
# flat batch of ids, positions and KV slots, **run** the model over it (each layer writes its new
# K/V into the pages, then attends through the block tables), and **sample**. Day 0 does all of it
# in plain PyTorch, one request at a time, with no cache reuse: slow on purpose, the reference every
# later day is compared with. Two branches in it belong to later sections: a plan whose decodes were
# all preempted is planned again (section 6), and an engine that does not `compute` prices the step
# on a simulated clock instead of running the model (section 5).

# %%
show_source(Engine.step)

# %% [markdown]
# Two requests on day 0: the first carries an image (its patches are placeholders in the prompt,
# replaced by patch embeddings: early fusion), the second opens with the first's first two pages.
# Day 0 keeps no cache between requests, so it computes those pages again (day 5 will not).

# %%
prompts = two_requests(cfg)
eng0 = Engine(model, day_options(0), kv_tokens=8 * len(prompts[0][0]), record_logits=True)
ids = [eng0.add_request(p, images=im, sampling=SamplingParams(max_tokens=4)) for p, im in prompts]
out0 = eng0.run()
for i in ids:
    s = eng0.sequences[i]
    print(f"request {i}: {s.prompt_len} prompt tokens, answer {out0[i]}, TTFT {1e3 * (s.first_token - s.arrival):.1f} "
          f"ms, {s.cached_tokens} tokens served from cache")

# %% [markdown]
# ## 3. The switches, one a day
#
# | day | switch | what changes | why it should help |
# | --- | --- | --- | --- |
# | 1 | `triton_msa` | MSA's index scores, block selection, sparse prefill and paged sparse decode in Triton (chapter 04) | the PyTorch path gathers the selected blocks into new tensors; the kernels read them in place |
# | 2 | `fused_moe` | the experts as the fused Triton kernels (chapter 05) | one launch per GEMM for all experts, no sorted copies of the tokens |
# | 3 | `paged_kernels` | `write_kv`, `paged_prefill`, `paged_decode` in Triton (chapter 06) | attention reads pages through the block table instead of gathering a contiguous copy |
# | 4 | `cuda_graphs` | decode steps replay a CUDA graph per batch-size bucket | a decode step launches hundreds of small kernels; at small batch the GPU waits for the CPU |
# | 5 | `prefix_caching` | full pages named by their content and reused across requests | an agent's next turn repeats its whole context: only the new tokens are computed |
# | 6 | `continuous_batching` | up to `max_batch` requests in flight, joining and leaving every step; prompts prefilled in chunks | one weight read serves the whole batch; a long prompt no longer stalls everyone's tokens |
# | 14 | `fp8` | K, V and MSA's index keys stored in FP8 (e4m3) with an fp32 scale per token (and head); the experts' weights in FP8 per output channel | half the bytes per KV token and per expert weight, and twice the tokens in the same memory |
#
# Days 1 to 6 change *how* the same numbers are computed, so each must reproduce day 0's logits up
# to rounding order. Day 14 changes the numbers themselves: every stored value is rounded to 3
# mantissa bits, so it gets a quality budget instead (section 7). Without continuous batching the
# engine serves **one request at a time**, forks included: a day before day 6 cannot decode
# several sequences at once, whatever the workload asks for.

# %%
for n in range(len(DAYS)):
    o = day_options(n, cuda_graphs_available=dev.type == "cuda")
    print(f"{DAY_LABELS[n]:36s} msa={o.msa_impl:6s} moe={o.moe_impl:6s} paged={o.paged_impl:6s} graphs={o.cuda_graphs!s:5s} "
          f"prefix={o.prefix_caching!s:5s} batching={o.continuous_batching!s:5s} kv={o.kv_dtype} experts={o.expert_dtype}")
if dev.type != "cuda":
    print("(CUDA graphs need a GPU: on this machine day 4 runs as day 3 does)")

# %% [markdown]
# ## 4. The workloads, day by day
#
# The bench serves each workload on each day with a fresh engine, answers forced to day 0's tokens
# (so every day sees the same contexts and its logits can be compared with day 0's):
#
# * **chat**: users sharing one long system prompt, each message with an image;
# * **agent** (served on the GPU only): coding agents taking turns on a shared codebase, a tool
#   result appended each turn;
# * **agent_long**: one coding agent on a long context (128k tokens on the GPU). Its **first turn**
#   prefills the whole context; then the day's batch decodes side by side (forks of the agent, as
#   many as the day may run at once); then a **follow-up turn** appends a tool result, which with
#   prefix caching computes only the new tokens. First and follow-up TTFT are different questions,
#   and a switch can help one and hurt the other.
#
# Triton compiles a kernel the first time it meets a new shape, so on a GPU every day is first
# **rehearsed**: it serves the same workload once on a throwaway engine, untimed, and only then on
# a fresh engine, timed. A rehearsed day's times are the day's and not the compiler's; the
# rehearsal's own are kept as the *first call* columns. Two days' times are compared only when both
# were rehearsed. On this CPU the Triton days run in Triton's interpreter, which compiles nothing
# and is far slower than PyTorch: the live run checks that each day serves and keeps day 0's
# answers; speed comes from the GPU records (section 9). The CPU serves day 0 and day 14, which has
# every switch on (but CUDA graphs, which need a GPU).

# %%
live_days = runtime.pick(P, cpu=[0, 7], gpu=list(range(len(DAYS))))
t = time.perf_counter()
live = engine_bench.run(P, cases=["chat", "agent_long"], days=live_days, verbose=False)
print(f"measured now on {runtime.device_name()} ({len(live)} records, {time.perf_counter() - t:.0f} s):")
print(veng.day_table(live))

# %% [markdown]
# ## 5. Under load: arrivals, tail latency and goodput
#
# A served model's question is not "how fast is one request" but "how many requests per second can
# arrive before the users wait too long". Two arrival processes: **Poisson** (independent users:
# exponential gaps at a given rate) and **Mooncake's trace** (real request lengths, outputs and shared
# prefixes, its timestamps squeezed to the rate we sweep, each 512-token block of the trace one KV
# page of our model). For each rate the bench reports throughput, p50 and p99 TTFT, p50 and p99
# inter-token latency (ITL), and **goodput**: requests per second that met a service-level
# objective (**SLO**) on TTFT and on time per output token. A rate is *sustained* while a stated
# share of requests (90%) meets the SLO: the dotted line of the right panel.
#
# The engine's clock is *simulated* here. Each step is priced by a cost model
# (`engine.clock.StepCost`: a fixed cost, plus per decoding sequence, per prompt token, per
# query-key pair of attention) fitted to step times measured on a device, and the engine runs its
# real scheduler and page pool without computing the model. That makes the sweep exact and quick:
# the run below is identical every time for the same prices. Where the workbook ships recorded
# H200 step prices they price the GPU-size model, one price per day; otherwise this machine's
# PyTorch steps price every day alike, so the curves differ only by how each day schedules. The
# lines under the figure say which prices, and how the SLO was set. On a GPU the bench also serves
# the sweep on the wall clock and fits the H200 prices to it.

# %%
sweep = engine_bench.run(P, cases=["load"], days=[5, 6, 7], verbose=False)
veng.plot_sweep(sweep)
plt.show()
print("\n".join(veng.sweep_lines(sweep) + veng.goodput_sentences(sweep) + veng.curve_comparison(sweep)))

# %% [markdown]
# Read each curve from left to right: the rate rises, throughput rises with it until the engine is
# saturated, and then only the queue grows: p99 TTFT shoots up at the same throughput. One request
# at a time (day 5) has only one sequence to decode per step; continuous batching (day 6) shares
# every step among the running requests, which is what the lines above measure. What it costs shows
# in the middle panel: a step that also computes a prompt chunk, or decodes for many, takes longer,
# and every running request waits for it; the last lines compare the curves' inter-token latency.
# Day 14 differs from day 6 in its prices (where each day has its own) and in its pool, which FP8
# makes larger; where the lines say the two give the same numbers, the prices are shared and this
# load never filled day 6's pool.

# %% [markdown]
# ## 6. When the pool runs out: reserve, or preempt
#
# Up to here admission **reserves** every page a request's `max_tokens` could need, so a running
# sequence never finds the pool full, and a full pool simply stops admitting. vLLM and SGLang
# instead admit on the prompt's pages alone and, when the decodes of a step need pages that are not
# there, **preempt** the newest request: by *recompute* (free its pages; later prefill its prompt and
# everything it generated again; with prefix caching its full pages often still hit) or by *swap*
# (copy its pages to host memory and back, priced by the measured host bandwidth). A preempted
# request resumes with the tokens it would have produced anyway. Decode-heavy Poisson arrivals into
# a small pool, day 6:

# %%
pre = engine_bench.run(P, cases=["preemption"], days=[6], verbose=False)
veng.plot_preemption(pre)
plt.show()
print("\n".join(veng.sweep_lines(pre, case="preemption") + veng.goodput_sentences(pre, case="preemption", by="policy")
                + veng.curve_comparison(pre, case="preemption", by="policy")))

# %% [markdown]
# Reserving up front wastes the pages of answers not yet written: fewer requests run, so each
# step's weight read serves fewer tokens. Preemption runs more of them and pays when it guesses
# wrong: recomputed prompt tokens, or bytes over the host link.

# %% [markdown]
# ## 7. Did each day keep day 0's answers?
#
# Every day answered with day 0's tokens, so its logits are compared on the same contexts: the
# *pooled* relative error over all answer tokens, the *median* token's, and top-1 agreement.

# %%
print(veng.format_quality(live))

# %% [markdown]
# A pooled error over a handful of tokens can be one token's. The breakdown below scores the chat
# turns again with one FP8 component at a time: one layer's K and V, one MSA layer's index keys,
# one layer's experts. MSA's block selection is a discrete choice: a perturbation moves the hidden
# state a little, and where two blocks' index scores are nearly tied the selection can flip, and
# that token then attends to a different block altogether. The columns count the selections that
# changed, the smallest *margin* among them (how far apart, in full precision, the two blocks'
# scores were), and the pooled error once more with the same rounding but the full-precision
# selections kept: where that error is much smaller, the flips carry it, not the rounding.

# %%
breakdown = chat_breakdown(model, engine_bench.sizes_for(P))
print(veng.format_breakdown(breakdown))
print("\n".join(veng.breakdown_lines(breakdown)))

# %% [markdown]
# Few tokens are compared on the CPU, so a token whose selection flipped can dominate the pooled
# number: read the median token's error of section 7 beside it. A model with random weights cannot
# tell whether such errors *matter*. The tiny model of chapter 01 has learned to answer questions
# about images, so there FP8 is scored by held-out accuracy, with a 95% interval from a paired
# bootstrap (the same examples scored both ways): where the interval contains zero, no change can
# be claimed.

# %%
print(quality.format_rows(quality.fp8_accuracy(runtime.pick(P, cpu=512, gpu=2048))))

# %% [markdown]
# ## 8. Day 14 in code: where the scales live
#
# FP8 (e4m3) keeps 3 mantissa bits and 4 exponent bits; its largest value is 448. Each stored group
# (a token's head of K, a token's index key, an expert's output channel) gets one fp32 scale, the
# smallest power of two that brings the group's largest value to at most 448: dividing by it and
# multiplying back are exact, so the only loss is rounding each value. The pool allocates FP8 pages
# with their scales, and the index keys are quantized as they are written (exercise 09.4 writes that
# quantizer as a Triton kernel):

# %%
show_source(PagedKVCache.write_index)

# %%
print("\n".join(veng.memory_lines()))

# %% [markdown]
# ## 9. On a GPU
#
# The H200 records, drawn where they exist: each day (top; a bar's ratio to the day above only
# where both days were rehearsed), the wall-clock load and preemption sweeps, and each day's decode
# step on chapter 00's roofline. The lines under the figure say what the records lack, then what
# each day buys and costs.

# %%
h200 = recorded.all_of("engine")
copy_gbps, gemm = veng.recorded_ceilings()
if veng.plot_gpu_story(h200, copy_gbps=copy_gbps, gemm_tflops=gemm):
    plt.show()
print("\n".join(veng.gpu_story_lines(h200, copy_gbps=copy_gbps) + veng.day_ledger(h200)
                + veng.roofline_sentences(h200, copy_gbps)))

# %% [markdown]
# ## 10. Exercises
#
# Each checker draws fresh inputs every time and says what is wrong; solutions are in
# `minimax_lab.exercises.solutions.ch09`. Try first.
#
# ### Exercise 09.1 — one scheduler step
#
# The scheduler's rule without its bookkeeping: given the running sequences (how much of each prompt
# is still to compute; 0 means decoding), the waiting queue, the token budget and the batch limit,
# say who computes how many tokens in the next step. Decodes never wait for a prompt; a long prompt
# is cut into chunks that fit what is left of the budget. The checker builds the same state in a real
# `Scheduler` and compares the plans; your answer may not use the scheduler.

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
# ### Exercise 09.2 — temperature and top-p sampling
#
# With a temperature the engine samples from the *nucleus* (top-p; Holtzman et al. 2019, arXiv
# 1904.09751): the smallest set of most likely tokens whose probability reaches `top_p`. Each
# request owns a `torch.Generator` seeded from its `seed`, so it draws the same tokens whatever else
# shares its batch (and after a preemption). The checker draws with the same seed as
# `engine.sampling.sample` and compares draw for draw; your answer may not call it.

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
# ### Exercise 09.3 — did the answers change?
#
# The pooled error of section 7: the answer logits of a day and of day 0, one `[tokens, vocab]`
# tensor per served turn. The relative error is **one** norm ratio over every turn's logits together.
# The checker compares all three numbers with `workloads.quality` (your answer may not call it).

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
# ### Exercise 09.4 — FP8 quantize-on-write, in Triton
#
# Write the kernel day 14 runs as K and V enter the cache: one program per row, the row's largest
# magnitude, the power-of-two scale, `row / scale`. Rows are ragged (a block of
# `triton.next_power_of_2(D)` columns, loads and stores masked) and may be strided views or bf16.
# The trap: `ceil(log2(amax / 448))` in fp32 is sometimes one off, and a scale half as large as it
# should be saturates the row's largest value. Estimate, then check `amax / scale <= 448` exactly
# (dividing by a power of two is exact). Let torch do the final cast to `float8_e4m3fn`: Triton's
# interpreter rounds its own fp32 → fp8 conversion wrongly near powers of two. The checker compares
# with `minimax_lab.fp8.quantize_fp8` bit for bit on the kernel device, and verifies that your kernel
# computed the scales and `row / scale` (the package's quantizer may not).
# (In a script of your own, import `minimax_lab` before `triton`: on a machine without a GPU it
# switches Triton to its interpreter, which must happen before the first `@triton.jit`.)

# %%
import triton
import triton.language as tl


@triton.jit
def quantize_rows_kernel(X, Y, SCALE, n_cols, stride_row, stride_col, BLOCK: tl.constexpr):
    """One program per row: store row / scale (fp32) into Y[row, :] and the scale into SCALE[row]."""
    row = tl.program_id(0)
    # your code here: masked load, amax, the power-of-two scale, the stores


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 (e4m3) storage of a float tensor x [..., D] with one fp32 scale per row (per slice
    along the last dim), computed by a Triton kernel you write and launch here: scale is the
    smallest power of two with max|row| / scale <= 448 (1 for an all-zero row), and x8 =
    x / scale cast to torch.float8_e4m3fn. Rows may be any length and x any view (strided,
    bf16). Return (x8 shaped like x, scale of shape x.shape[:-1]). Do not modify x."""
    raise NotImplementedError  # your code here

# %%
exercises.check("09.4", quantize_rows_fp8)

# %%
print(f"notebook ran in {time.perf_counter() - T0:.0f} s (preset {P})")

# %% [markdown]
# ## What limits us
#
# The engine is as fast as its slowest honest number, and each day moves a different one. Kernels
# and CUDA graphs shorten a step; prefix caching skips recomputing what an agent already sent;
# continuous batching shares a step among requests, at the price of a longer step for everyone
# whenever a prompt chunk rides along, and of a first turn prefilled in chunks. FP8 halves the bytes
# a step must read, and then gives it back if the kernels spend the saving on conversions: the
# roofline shows how far each day's decode sits below the copy ceiling, and where that gap is wide
# the kernels, not the scheduler, are where a day can gain next. The simulated sweep is only as
# good as its prices: a linear cost model misses effects that depend on which kernels run
# together, which is why the bench, on a GPU, serves the same sweep on the wall clock beside the
# simulated one. And a random-weight model can say that answers changed, not whether they got
# worse; only a model that has learned something can, with an interval around it.

# %% [markdown]
# ---
# **Previous:** [08 · A kernel bench that hacks cannot fool](08_kernel_bench_that_hacks_cannot_fool.ipynb)
#
# **Package code used here:** `minimax_lab/engine/engine.py`, `minimax_lab/engine/scheduler.py`, `minimax_lab/engine/clock.py`, `minimax_lab/engine/arrivals.py`, `minimax_lab/engine/load.py`, `minimax_lab/engine/paged_attention.py`, `minimax_lab/engine/model_m3.py`, `minimax_lab/engine/options.py`, `minimax_lab/engine/quality.py`, `minimax_lab/engine/traffic.py`, `minimax_lab/engine/workloads.py`, `minimax_lab/bench/suite_engine.py`, `minimax_lab/bench/suite_engine_sessions.py`, `minimax_lab/bench/suite_engine_timeline.py`, `minimax_lab/fp8.py`, `minimax_lab/viz/engine/`, `minimax_lab/exercises/ch09.py`
