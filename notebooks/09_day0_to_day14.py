# %% [markdown]
# # 09 · Day 0 to day 14: serving the model, one switch at a time
#
# **What this chapter builds:** an engine that serves an M3-shaped model (early fusion, MSA and dense attention layers, a Mixture-of-Experts FFN) — scheduler, paged KV cache, sampling — first plainly correct (day 0), then one switch a day: Triton MSA, the fused MoE, paged kernels, CUDA graphs, prefix caching, continuous batching, and on day 14 FP8 where it pays. Each day is checked against day 0 and put under arriving load.
#
# **It assumes:** [04 · Sparse attention kernels](04_sparse_attention_kernels.ipynb) (MSA's prefill and paged decode), [05 · Mixture of Experts](05_mixture_of_experts.ipynb) (the fused expert kernels), [06 · A paged KV cache for agents](06_paged_kv_cache_for_agents.ipynb) (pages, block tables, prefix sharing) and [00 · The roofline, and benchmarks you can trust](00_roofline_and_honest_benchmarks.ipynb) (the roofline, and timing without fooling yourself).
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/09_day0_to_day14.ipynb)
#
# A user never sees a kernel. They see how long the first token takes (**TTFT**), how fast the
# rest arrive (**inter-token latency**), and whether the answer still comes when many others ask
# at once. An engine is where kernels turn into those numbers. So we start from an engine that is
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
from IPython.display import Markdown, display

from minimax_lab import exercises, runtime   # runtime first: it picks the Triton interpreter on a CPU
from minimax_lab.bench import suite_engine as engine_bench
from minimax_lab.bench.suite_engine_load import run_load
from minimax_lab.bench.suite_engine_sessions import chat_breakdown
from minimax_lab.bench.suite_engine_timeline import timeline_example
from minimax_lab.engine import DAY_LABELS, DAYS, Engine, SamplingParams, day_options
from minimax_lab.engine import quality
from minimax_lab.engine.clock import StepCost
from minimax_lab.engine.paged_attention import PagedKVCache
from minimax_lab.engine.workloads import two_requests
from minimax_lab.viz import engine as veng
from minimax_lab.viz.source import show_source

# %%
ch = veng.setup(preset)          # the preset, the model at its size, the GPU step prices, the GPU records
P, dev, cfg, model = ch.preset, ch.device, ch.cfg, ch.model
print(ch.summary())

# %% [markdown]
# ## 1. The idea: an engine is a loop, and requests arrive while it runs
#
# Every step the engine decides which sequences compute how many tokens, runs the model once over
# all of them, and samples one token for each sequence that reached the end of its prompt, while
# requests keep arriving. The picture is ten requests arriving faster than one-at-a-time serving
# could keep up with, on day 6: a **blue** bar is a step that computes part of a request's prompt
# (thin: on a GPU a short prompt costs little beside its answer), **green** a step that decodes one
# token for it, grey is waiting. Decodes of different requests share steps (continuous batching),
# a long prompt is cut into chunks beside them (chunked prefill), and when the page pool runs out
# the newest request is **preempted** (red cross): its pages are freed and it comes back later to
# recompute them. Time is *simulated*: the engine's
# scheduler makes every decision, and each step is charged what a step of its shape costs that day
# on a GPU (section 5), so the picture is exact and instant.

# %%
events = timeline_example(ch.prices)
veng.plot_timeline(events, title=f"{DAY_LABELS[events['day']]}, 16 KV pages, preemption by recompute")
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
# Day 0 keeps no cache between requests, so it computes those pages again.

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
# | 14 | `fp8` | K, V and MSA's index keys in FP8 (e4m3) with an fp32 scale per token (and head); the experts' weights in FP8 per output channel -- each only where it pays (section 8) | half the bytes per KV token and per expert weight, twice the tokens in the same memory |
#
# Days 1 to 6 change *how* the same numbers are computed, so each must reproduce day 0's logits up
# to rounding order; day 14 rounds every stored value to 3 mantissa bits, so it gets a quality
# budget instead (section 7). Without continuous batching the engine serves **one request at a
# time**, forks included.

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
# Each day serves the workload on a fresh engine, answers forced to day 0's tokens (so every day
# sees the same contexts and its logits can be compared with day 0's). The workload is
# **agent_long**: one coding agent on a long codebase. Its **first turn** prefills the whole
# context; then the day's batch decodes side by side (forks of the agent, as many as the day may run
# at once); then a **follow-up turn** appends a tool result, which with prefix caching computes
# only the new tokens.
#
# Triton compiles a kernel the first time it meets a new shape, so on a GPU every day is first
# **rehearsed**: served once untimed, then timed three times; the rehearsal's times are kept as the
# *first call* columns. On this CPU the Triton days run in Triton's interpreter, which compiles
# nothing and is far slower than PyTorch: the times below are the interpreter's, a check that day 0
# and day 14 serve (section 7 checks their answers), not their speed. What each day costs comes
# from a GPU: its step prices in section 5, its recorded runs in section 9.

# %%
live = engine_bench.run(P, cases=["agent_long"], days=runtime.pick(P, cpu=[0, 7], gpu=[0, 4, 6, 7]),
                        repeats=runtime.pick(P, cpu=1, gpu=3), verbose=False)
print(f"measured now on {runtime.device_name()}:")
print(veng.day_table(live))

# %% [markdown]
# ## 5. Under load: arrivals, tail latency and goodput
#
# A served model's question is not "how fast is one request" but "how many requests per second can
# arrive before the users wait too long". The arrivals follow **Mooncake's trace**: real request
# lengths, answers and shared prefixes, its timestamps squeezed to the rate we sweep. For each rate
# we read p50 and p99 **TTFT**, p50 and p99 **inter-token latency** (ITL: every gap between two
# tokens of one answer), and **goodput**: requests per second that met a service-level objective
# (**SLO**) on TTFT and on time per output token.
#
# The clock is *simulated*, and this is the line between what is measured here and what is not.
# The engine's scheduler and page pool decide every step, live: which requests run, how a prompt is
# chunked, which pages hit the prefix cache, when the pool runs out. Each step is then charged
# *that day's* **price** (`engine.clock.StepCost`: a fixed cost, plus a cost per decoding sequence,
# per prompt token, per context token a decode row reads and per query-key pair a prompt chunk
# computes), so a kernel switch shows as a cheaper step. The prices are the one thing not measured
# on this machine; the figure's title says where they come from: measured on a GPU for every day,
# or, until a GPU has recorded them, a **model** built from the H200's recorded day-by-day times (a
# decode step reads its bytes at the bandwidth that day's recorded decodes reached, a prompt
# computes at the rate its recorded long first turn reached; the two scheduling days keep their
# kernels' price). Every rate is served three times, each repeat a slice of the trace of its own:
# the points are medians, the bars the range of the three.

# %%
show_source(StepCost.ms)
print(veng.price_table(ch.prices))

# %%
sweep = run_load(None, list(range(len(DAYS))), case="load", prices=ch.prices, verbose=False)
veng.plot_sweep(sweep)
plt.show()
print("\n".join(veng.sweep_lines(sweep) + [veng.fp8_choice_line(sweep)]))

# %% [markdown]
# Read each curve from left to right: the rate rises, and once requests arrive faster than the
# engine finishes them they queue, TTFT climbs, and goodput stops following the dotted line where
# every request meets the SLO. The ledger puts each day beside the day before: the most requests per
# second that met the SLO at any rate, and the latencies at a light load, where a request rarely
# waits for another. A change is called only where the two days' three repeats do not overlap.

# %%
ledger = veng.sweep_ledger(sweep)
print(veng.format_ledger(ledger))
print("\n".join(veng.ledger_sentences(ledger)))

# %% [markdown]
# The kernel days (1 to 4) change only the price of a step: their ITL moves with it, up as well as
# down, and a cheaper step clears the queue sooner. Every step pays its day's fixed cost, prompt
# steps too, so day 4's cheaper launches shorten TTFT here, though on a GPU only decode steps
# replay a graph; a modelled prompt price fitted to an unrehearsed first turn may include
# compiling. Prefix caching can only reuse what requests
# share: the last column is the share of prompt tokens the cache served (an agent's follow-up turn,
# which repeats its whole context, is where it pays); where it served nothing, day 5's curve hides
# under day 4's. Continuous batching changes no price; it buys
# room, several requests sharing each step (the peak goodput column), and its cost shows in the p99
# ITL at the highest rates, where a prompt chunk in a step makes every decode in it wait. The FP8
# day stores in FP8 only what makes these steps cheaper (the line under the figure; section 8 has
# the rule): where nothing does, it serves as day 6 does, and its curve lies on day 6's.

# %% [markdown]
# ## 6. When the pool runs out: reserve, or preempt
#
# Up to here admission **reserves** every page a request's `max_tokens` could need, so a running
# sequence never finds the pool full, and a full pool simply stops admitting. vLLM and SGLang
# instead admit on the prompt's pages alone and, when the decodes of a step need pages that are not
# there, **preempt** the newest request: by *recompute* (free its pages; later prefill its prompt and
# everything it generated again; with prefix caching its full pages often still hit) or by *swap*
# (copy its pages to host memory and back, priced by the host link's bandwidth). A preempted
# request resumes with the tokens it would have produced anyway. Decode-heavy Poisson arrivals into
# a pool far smaller than the load needs, on day 6 with each policy, and on day 14 with recompute:

# %%
pre = run_load(None, [6, 7], case="preemption", prices=ch.prices, verbose=False, policies={7: ("recompute",)})
veng.plot_preemption(pre)
plt.show()
print("\n".join(veng.sweep_lines(pre, case="preemption") + veng.goodput_sentences(pre, case="preemption", by="policy")
                + [veng.fp8_choice_line(pre)]))

# %% [markdown]
# Reserving up front wastes the pages of answers not yet written: fewer requests run, so each
# step's weight read serves fewer tokens. Preemption runs more of them and pays when it guesses
# wrong: recomputed prompt tokens, or bytes over the host link. Here the pool fills, so the FP8 day's
# rule switches an FP8 KV cache on whatever its steps cost: the same bytes hold about twice the
# tokens, and the goodput lines above say what that buys against day 6.

# %% [markdown]
# ## 7. Did each day keep day 0's answers?
#
# Every day answered with day 0's tokens, so its logits are compared on the same contexts: the
# *pooled* relative error over all answer tokens, the *median* token's, and top-1 agreement.

# %%
print(veng.format_quality(live))

# %% [markdown]
# A pooled error over a handful of tokens can be one token's. The breakdown scores a chat workload
# again with one FP8 component at a time: one layer's K and V, one MSA layer's index keys, one
# layer's experts. MSA's block selection is discrete: where two blocks' index scores are nearly tied
# a small perturbation flips it, and that token attends to a different block altogether. The columns
# count the changed selections, the smallest *margin* among them (how far apart the two blocks'
# scores were in full precision), and the pooled error again with the full-precision selections
# kept: where that is much smaller, the flips carry the error, not the rounding.

# %%
breakdown = chat_breakdown(model, engine_bench.sizes_for(P))
print(veng.format_breakdown(breakdown))
print("\n".join(veng.breakdown_lines(breakdown)))

# %% [markdown]
# A model with random weights cannot tell whether such errors *matter*. The tiny model of chapter
# 01 has learned to answer questions about images, so there FP8 is scored by held-out accuracy, with
# a 95% interval from a paired bootstrap (the same examples scored both ways): where the interval
# contains zero, no change can be claimed.

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
# Bytes saved are not time saved: the kernels must turn every stored value back into bf16, and
# that work can cost more than the bytes it spares. So the FP8 day switches a store on only where
# it pays at the shapes the day serves: for each candidate (nothing, the KV cache, the experts, both)
# it prices the workload's own steps -- each prompt prefilled as the day prefills it, each answer
# token a share of a decode step at the day's batch -- and keeps the cheapest; an FP8 KV cache is
# kept whatever its steps cost when the pool would fill without it. Per decode step the prices say
# where the KV bytes start to matter:

# %%
print("\n".join(veng.fp8_threshold_lines(ch.prices) or ["(no step prices for day 6 and the FP8 day)"]))

# %% [markdown]
# ## 9. On a GPU
#
# Every GPU run the workbook holds records of, one row each with its device and versions: each day
# against the day before (a bar's ratio to the one above; a time that was not rehearsed is left
# out, not drawn), and where the device's ceilings were recorded, each day's decode step on chapter
# 00's roofline. The lines under the figure say what each switch bought there and what the records
# lack; the last is the FP8 verdict.

# %%
if veng.plot_gpu_story(ch.records):
    plt.show()
for device, recs in veng.gpu_devices(ch.records).items():
    print(f"{device}:", *veng.day_ledger(recs), sep="\n  ")
print("\n".join(veng.gpu_story_lines(ch.records) + [veng.fp8_verdict(ch.records)]))

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

# %% [markdown]
# ## What limits us
#
# FP8 halves the bytes a step reads and gives them back if the kernels spend the saving on
# conversions. The simulated sweeps are only as good as their prices: a linear price misses
# effects that depend on which kernels run together, a modelled price is a model of other runs,
# and the trace's short slices say little about prefix caching. And a random-weight model can
# say that answers changed, not whether they got worse; only a model that has learned something
# can, with an interval around it.

# %% [markdown]
# ---
# **Previous:** [08 · A kernel bench that hacks cannot fool](08_kernel_bench_that_hacks_cannot_fool.ipynb)
#
# **Read more:** PagedAttention and vLLM (Kwon et al. 2023, arXiv 2309.06180); continuous batching in
# Orca (Yu et al., OSDI 2022); chunked prefill in Sarathi-Serve (Agrawal et al. 2024, arXiv
# 2403.02310); goodput under an SLO in DistServe (Zhong et al. 2024, arXiv 2401.09670); simulating a
# serving system from step prices in Vidur (Agrawal et al. 2024, arXiv 2405.05465); the trace and a
# KV cache as a store in Mooncake (Qin et al. 2024, arXiv 2407.00079).
#
# **Package code used here:** `minimax_lab/engine/engine.py`, `minimax_lab/engine/scheduler.py`, `minimax_lab/engine/clock.py`, `minimax_lab/engine/arrivals.py`, `minimax_lab/engine/load.py`, `minimax_lab/engine/paged_attention.py`, `minimax_lab/engine/model_m3.py`, `minimax_lab/engine/options.py`, `minimax_lab/engine/quality.py`, `minimax_lab/engine/traffic.py`, `minimax_lab/engine/workloads.py`, `minimax_lab/bench/suite_engine.py`, `minimax_lab/bench/suite_engine_prices.py`, `minimax_lab/bench/suite_engine_load.py`, `minimax_lab/bench/suite_engine_agent_long.py`, `minimax_lab/bench/suite_engine_sessions.py`, `minimax_lab/bench/suite_engine_timeline.py`, `minimax_lab/fp8.py`, `minimax_lab/viz/engine/`, `minimax_lab/exercises/ch09.py`

# %%
display(Markdown(veng.provenance(ch, seconds=time.perf_counter() - ch.t0)))
