# %% [markdown]
# # 06 · A paged KV cache for agents: pages, prefix sharing, eviction, tiers, kernels
#
# **What this chapter builds:** a paged KV cache (page pool, block tables, prefix sharing by page names, eviction, a disk tier) and a paged-decode Triton kernel whose inner loop looks pages up in the block table, measured on chat and agent workloads, Mooncake's trace and an H200.
#
# **It assumes:** [02 · FlashAttention in Triton](02_flash_attention_in_triton.ipynb) (online softmax, Triton tiles) and [00 · Rooflines and honest benchmarks](00_roofline_and_honest_benchmarks.ipynb) (GB/s against the copy ceiling).
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/06_paged_kv_cache_for_agents.ipynb)
#
# A chat request is a few hundred tokens. A coding agent uploads a whole repository and then
# runs hundreds of tool calls, each one a request whose prompt is *everything so far*. Almost
# all of that prompt was seen one turn ago, so its keys and values (KV) are already computed —
# if we kept them. Keeping them turns the KV cache into a storage system: where does each
# block live, have we seen it before, what do we throw away when memory is full, can we fetch
# it from host memory or disk faster than we could recompute it?
#
# This chapter builds that small and readable (`minimax_lab.kvcache`) and measures it: on
# generated chat and agent workloads, on Mooncake's published trace (Qin et al., FAST'25), and
# on an H200.

# %%
# In Colab, install the workbook's package first (locally, `make lab` already did).
import subprocess, sys
if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "minimax-lab[notebooks] @ git+https://github.com/minimax-lab/minimax-lab"], check=True)

# %% tags=["parameters"]
preset = "auto"        # "cpu" (small workloads, interpreter) or "gpu" (larger)
agent_turns = None     # tool-call turns per agent session in the generated workload (None: 40 on the CPU, 100 on a GPU)

# %%
import math
import time

import matplotlib.pyplot as plt
import torch
from tqdm.auto import tqdm

from minimax_lab import bench, exercises, runtime   # runtime first: it picks the Triton interpreter on a CPU
import triton
import triton.language as tl
from minimax_lab.kvcache import BlockManager, EvictionPolicy, KVPages, PoolExhausted, find_trace, read_trace, replay_trace
from minimax_lab.kvcache.blocks import page_hash
from minimax_lab.kvcache.trace import HOW_TO_GET
from minimax_lab.kvcache.workloads import agent_workload, chat_workload
from minimax_lab.viz.source import show_source
from minimax_lab.viz import kvcache as vkv
from minimax_lab.viz import live_vs_recorded

P = runtime.resolve_preset(preset)
kdev = runtime.kernel_device()   # where Triton kernels take their inputs: the GPU, or the CPU (interpreter)
agent_turns = agent_turns or runtime.pick(P, cpu=40, gpu=100)
print(f"device {runtime.device_name()}, preset {P}, interpreter {runtime.is_interpreter()}")

# %% [markdown]
# ## 1. Why pages: fragmentation
#
# A server that gives each request one contiguous KV buffer must reserve the *maximum* length up
# front — it cannot know how long the answer will be. Most requests are short, so most of the
# reservation is empty. vLLM's PagedAttention (Kwon et al. 2023, arXiv 2309.06180) instead hands
# out fixed-size **pages** on demand, like virtual memory: the only waste is the unfilled tail of
# each request's last page.

# %%
sim = vkv.simulate_fragmentation(24, max_len=2048, page_size=16)
vkv.plot_fragmentation(sim)
plt.show()
print(f"contiguous wastes {1 - sim['used'] / sim['contiguous_reserved']:.0%}, "
      f"paged wastes {1 - sim['used'] / sim['paged_reserved']:.1%} of what it reserves")

# %% [markdown]
# ## 2. Pages, block tables and prefix sharing
#
# `KVPages` holds one pool per layer, `[num_pages, page_size, Hkv, D]` — the layout every kernel of
# this chapter reads. `BlockManager` keeps the books: each sequence's **block table** (its pages in
# order), a **reference count** per page, and for every *full* page a **name**: the chained content
# hash `page_hash(parent's name, this page's tokens)`. Equal names mean equal prefixes, so a new
# request starting with the same tokens finds them by walking names — and every hit is verified
# against the tokens stored with the page, so a hash collision can never serve wrong KV.
#
# `fork` shares all pages (for parallel sampling or an agent's branches); the first write to a
# shared, partly filled page copies it first (**copy-on-write**). When the pool is full the
# manager evicts a cached page nobody uses; if there is none it raises `PoolExhausted` — it never
# overwrites a live page.

# %%
m = BlockManager(64, 4, kv=KVPages.allocate(1, 64, 4, 1, 1), policy="lru")
system = list(range(100, 124))                       # a 24-token system prompt = 6 pages
for i in range(4):
    cached = m.allocate(f"user{i}", system + [i] * (3 + 5 * i))
    print(f"user{i}: {cached} of {len(m.seqs[f'user{i}'].tokens)} tokens served from cache")
m.fork("user3", "user3-branch")
m.append("user3-branch", 7)                          # copy-on-write of the shared last page
m.free("user0")
m.pin(system)                                        # keep the system prompt however full we get
print("copy-on-write copies:", m.stats["cow_copies"])
print("block table of user2 (page ids, -1 = none):", m.block_table(["user2"]).tolist()[0])
vkv.plot_page_map(m.page_states(), cols=32, title="pool after 4 users sharing a system prompt, a fork, a free")
plt.show()
m.check_invariants()
try:
    BlockManager(2, 4).allocate("big", list(range(20)))
except PoolExhausted as e:
    print("full pool:", e)

# %% [markdown]
# ### Exercises: find a token, find a cached prefix
#
# Four exercises in this chapter, from a one-liner to an open problem (06.3 in section 3, 06.4 in
# section 5). Solutions are in `minimax_lab/exercises/solutions/ch06.py`; try first. Each checker
# draws fresh cases (shuffled page ids, ragged lengths, odd page sizes) and says what it expected.
#
# **06.1 — the page lookup.** Every paged kernel starts here: token `t` of a sequence lives in page
# `block_table[t // page_size]` at offset `t % page_size`. Write it for a batch of positions.

# %%
def page_and_offset(block_table: torch.Tensor, positions: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's block table (int32 [max_pages], its pages in order) and token positions
    (int64 [n]): return (page_ids, offsets), both int64 [n], such that the K/V of token
    positions[i] sits in slot offsets[i] of page page_ids[i] of the pool."""
    raise NotImplementedError  # your code here


exercises.check("06.1", page_and_offset)

# %% [markdown]
# **06.2 — prefix sharing by page names.** A new request arrives; which of its pages are already
# cached? Name its full pages the way `BlockManager` does (each name chains its parent's) and walk
# them in order. A hit must be a *prefix*: page 5's K/V were computed after pages 0–4, so they are
# useless if page 4 is missing — even when page 5's name is still in the cache.

# %%
def cached_prefix_pages(tokens: list[int], page_size: int, cached: dict) -> list[int]:
    """`cached` maps the name of every cached full page to the id of the page holding it. A page's
    name is page_hash(name of the page before it (None for the first page), its page_size tokens).
    Return the page ids of the longest run of full pages at the start of `tokens` whose names are
    in `cached`, in order (a partial last page never counts)."""
    raise NotImplementedError  # your code here


exercises.check("06.2", cached_prefix_pages)

# %% [markdown]
# ## 3. The page lookup inside paged decode
#
# Decode is one new query token per sequence attending over *all* of that sequence's cached keys
# and values. Without pages that is chapter 02's attention with one query row. With pages, each
# key must first be found: token `t` of sequence `b` sits in page `block_table[b, t // page_size]`
# at slot `t % page_size`. The kernel does that lookup itself, so the cache is read in place and
# never copied into a contiguous buffer.
#
# First in PyTorch, one sequence at a time, the lookup then a softmax. The inputs: a few sequences
# of ragged lengths (an empty one, one token, part of a page, several pages), stored in a pool
# whose page ids are shuffled, as they are after a server has run for a while.

# %%
def paged_inputs(lens, *, Hq=4, Hkv=2, D=16, page_size=8, spare_pages=3, seed=0):
    """q [B, Hq, D] and a pool holding sequences of `lens` tokens in shuffled pages (fp32, on the kernel device)."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // page_size) for n in lens]                   # pages per sequence
    n_pages = sum(need) + spare_pages
    perm = torch.randperm(n_pages, generator=g).to(torch.int32)  # page ids in no particular order
    block_table = torch.full((len(lens), max(need) + 1), -1, dtype=torch.int32)
    used = 0
    for b, k in enumerate(need):
        block_table[b, :k] = perm[used:used + k]
        used += k
    x = dict(q=torch.randn(len(lens), Hq, D, generator=g),
             k_cache=torch.randn(n_pages, page_size, Hkv, D, generator=g),
             v_cache=torch.randn(n_pages, page_size, Hkv, D, generator=g),
             block_table=block_table, seq_lens=torch.tensor(lens, dtype=torch.int32))
    return {name: t.to(kdev) for name, t in x.items()}          # drawn on the CPU, then moved


def paged_decode_loop(q, k_cache, v_cache, block_table, seq_lens):
    B, Hq, D = q.shape
    page_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros_like(q)
    for b in range(B):
        t = torch.arange(int(seq_lens[b]), device=q.device)    # this sequence's token positions
        page = block_table[b, t // page_size].long()           # the page lookup
        k = k_cache[page, t % page_size]                       # [L, Hkv, D], gathered from its pages
        v = v_cache[page, t % page_size]
        k, v = (x.repeat_interleave(Hq // Hkv, dim=1) for x in (k, v))  # GQA: Hq / Hkv query heads share a kv head
        scores = torch.einsum("hd,lhd->hl", q[b], k) / math.sqrt(D)
        out[b] = torch.einsum("hl,lhd->hd", scores.softmax(-1), v)
    return out


from minimax_lab.kvcache import paged_decode    # the package's kernel and its fp32 reference

x = paged_inputs([0, 1, 19, 45])
print("block table (page ids, -1 = none):\n", x["block_table"].cpu())
ref = paged_decode(**x, impl="reference")
torch.testing.assert_close(paged_decode_loop(**x), ref, atol=1e-5, rtol=1e-5)  # fp32 both: rounding only
print("PyTorch loop == package reference (fp32, atol = rtol = 1e-5)")

# %% [markdown]
# Now the same in Triton. One program owns one (sequence, query head). It walks the sequence in
# tiles of `BLOCK_N` tokens; for each tile it looks up the page of every token, loads those K and V
# rows straight out of the pool, and folds them into an online softmax (chapter 02): a running
# maximum `m`, a running sum `l` and a running weighted sum `acc`, rescaled whenever `m` grows.

# %%
@triton.jit
def small_paged_decode_kernel(Q, K, V, BT, LENS, O, scale,
                              stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_bt, stride_ob, stride_oh,
                              GROUP: tl.constexpr, PAGE: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0)                       # the sequence
    h = tl.program_id(1)                       # the query head
    kv_head = h // GROUP                       # GQA: GROUP query heads read one kv head
    L = tl.load(LENS + b)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_d).to(tl.float32)
    m = tl.full([], float("-inf"), tl.float32)  # running max of the scores
    l = tl.full([], 0.0, tl.float32)            # running sum of exp(score - m)
    acc = tl.zeros([D], tl.float32)             # running sum of exp(score - m) * v
    for start in range(0, L, BLOCK_N):
        t = start + offs_n                     # token positions of this tile
        ok = t < L
        page = tl.load(BT + b * stride_bt + t // PAGE, mask=ok, other=0)   # the page lookup
        row = page.to(tl.int64) * stride_kp + (t % PAGE) * stride_ks + kv_head * stride_kh
        k = tl.load(K + row[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        v = tl.load(V + row[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        s = tl.where(ok, tl.sum(k * q[None, :], 1) * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 0))    # finite: every tile holds at least one token
        p = tl.exp(s - m_new)
        alpha = tl.exp(m - m_new)              # rescales what was summed under the old max
        l = l * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)        # an empty sequence gives zeros
    tl.store(O + b * stride_ob + h * stride_oh + offs_d, out.to(O.dtype.element_ty))


def small_paged_decode(q, k_cache, v_cache, block_table, seq_lens, block_n=16):
    B, Hq, D = q.shape
    _, page_size, Hkv, _ = k_cache.shape
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(3) == 1 and D == triton.next_power_of_2(D)
    o = torch.empty_like(q)
    small_paged_decode_kernel[(B, Hq)](
        q, k_cache, v_cache, block_table, seq_lens, o, 1.0 / math.sqrt(D),
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=Hq // Hkv, PAGE=page_size, D=D, BLOCK_N=block_n)
    return o

# %% [markdown]
# Checked against the package on fresh random inputs: ragged lengths (always one empty and one
# single-token sequence), a batch of five, shuffled pages. Ours sums in fp32 without `tl.dot`, so
# it must match the fp32 reference to rounding (`1e-5`). The package's kernel multiplies with
# `tl.dot`, which on a GPU rounds fp32 inputs to tf32 (10-bit mantissa): against the reference it
# gets `2e-2` there, `1e-5` in the interpreter.

# %%
tol_package = 1e-5 if runtime.is_interpreter() else 2e-2
g = torch.Generator().manual_seed(int(time.time()))
for trial in range(3):
    lens = [0, 1] + torch.randint(2, 64, (3,), generator=g).tolist()
    x = paged_inputs(lens, page_size=[4, 8, 16][trial], seed=int(torch.randint(0, 2**31, (1,), generator=g)))
    ref = paged_decode(**x, impl="reference")
    t0 = time.perf_counter()
    ours = small_paged_decode(**x)
    t_ours = time.perf_counter() - t0
    package = paged_decode(**x, impl="triton")
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(package, ref, atol=tol_package, rtol=tol_package)
    torch.testing.assert_close(ours, package, atol=tol_package, rtol=tol_package)
    print(f"lengths {lens}, page {x['k_cache'].shape[1]:2d}: ours vs reference max |err| "
          f"{float((ours - ref).abs().max()):.1e}, vs the package's kernel {float((ours - package).abs().max()):.1e}"
          f"  ({t_ours:.2f} s{' in the interpreter' if runtime.is_interpreter() else ''})")

# %% [markdown]
# ### Exercise 06.3 — a sliding-window paged-decode kernel
#
# Some models (and some long-context serving modes) let a token attend only to the last `window`
# tokens. With pages, that is the same lookup over a shorter range: start from
# `small_paged_decode_kernel` and change where its token loop begins. The checker runs your
# function on the kernel device (fp32, ragged lengths, shuffled pages, windows of 1, 6 and more
# than any length) with `bench.check` against an fp64 reference, relative tolerance `5e-3`.

# %%
def sliding_window_paged_decode(q, k_cache, v_cache, block_table, seq_lens, window: int):
    """Paged decode with the inputs of paged_decode (on the kernel device), where each sequence's
    query attends only to its last `window` cached tokens, positions [max(0, L - window), L).
    Write it as a Triton kernel: start from small_paged_decode_kernel. Returns o [B, Hq, D] in
    q's dtype, zeros for an empty sequence."""
    raise NotImplementedError  # your code here


exercises.check("06.3", sliding_window_paged_decode)

# %% [markdown]
# ### The production kernel
#
# `minimax_lab.kvcache.decode_triton` does the same lookup (`page = tl.load(bt_row + t // PAGE)` in
# `_decode_tile`) and adds what makes it fast on an H200:
#
# * **GQA packing** — one program owns a (sequence, *kv* head) and all `Hq / Hkv` query heads that
#   read it, as the rows of a `tl.dot`: each K/V byte is loaded once per group, not once per head.
# * **Split-K (flash-decoding)** — with few sequences there are too few programs to fill 132 SMs,
#   so each sequence's context is cut into splits, each a program; a second kernel merges the
#   partial softmaxes by their log-sum-exp.
# * **Whole tiles without masks** — only the last, ragged tile of a split pays for masking; page
#   ids and lengths are clamped, so even an unchecked block table never reads outside the pool.

# %%
from minimax_lab.kvcache import decode_triton as kv_decode

show_source(kv_decode._decode_tile)

# %%
show_source(kv_decode._paged_decode_kernel)

# %% [markdown]
# ### On the H200, against the peers
#
# The recorded results: our kernel, gathering the pages into a contiguous copy and calling SDPA
# (what one writes first), and SDPA on a cache that was contiguous to begin with (no pages: the
# speed paging must match). Bytes counted are the K/V attention must read, the same for all three.
# Decode only *reads*, so it can beat the copy ceiling (a copy reads *and* writes, turning the
# memory bus around): above 100% of it is not an error.

# %%
decode_recs = [r for r in bench.load_records(suite="kvcache") if r["case"].startswith("decode")]
recs = [r for r in decode_recs if r["impl"] in vkv.DECODE_IMPLS]   # (each also has a CUDA-graph twin in the records)
if not recs:
    print("no recorded H200 decode results yet: run `python -m minimax_lab.bench kvcache` on a GPU")
else:
    print(vkv.decode_table(recs))
    fig, ax = plt.subplots(figsize=(9, 3.5))
    vkv.plot_decode_records(recs, ax=ax, title=f"paged decode on the H200, bf16, GQA 32/8, D=128 "
                                               f"(recorded, {live_vs_recorded.commits_label(recs)})")
    plt.show()
    ours = [r for r in recs if r["impl"] == "triton"]
    ratio = [r.get("speedup_vs", {}).get("gather_sdpa") for r in ours]
    vs_contig = [r.get("speedup_vs", {}).get("sdpa_contiguous") for r in ours]
    if ours and None not in ratio + vs_contig:
        print(f"ours is {min(ratio):.2f}-{max(ratio):.2f}x faster than gather + SDPA and runs at "
              f"{min(vs_contig):.2f}-{max(vs_contig):.2f}x the speed of SDPA on a contiguous cache")

# %%
from minimax_lab.bench import suite_kvcache as kv_bench

measured = []   # the suite's B=8, 32k-context decode case, measured on this machine
if P == "gpu":
    dtype_now = runtime.compute_dtype()
    errs = kv_bench.check_decode(kdev, dtype_now, True)                 # Triton vs the fp32 reference first
    case = next(c for c in kv_bench.GPU_DECODE if c["B"] == 8 and c["L"] == 32768)
    measured = kv_bench.run_decode(case, kdev, dtype_now, True, errs, reps=20)
    torch.cuda.empty_cache()
if measured and any(r["case"] == m["case"] for r in decode_recs for m in measured):
    print(live_vs_recorded.format_rows(measured, decode_recs, "gbps", device_now=runtime.device_name()))
    live_vs_recorded.plot(measured, decode_recs, "gbps", device_now=runtime.device_name(),
                          title=f"{measured[0]['case']}: measured now vs recorded")
    plt.tight_layout(); plt.show()
else:
    print(f"Measured now: nothing at the recorded sizes (preset {P!r}; a GPU runs them). "
          "The checks above ran both kernels here at a tiny size.")

# %% [markdown]
# ## 4. Chat vs agent workloads
#
# `workloads.chat_workload` generates many short conversations (a short shared system prompt,
# a few turns each); `workloads.agent_workload` generates coding-agent sessions: a system prompt
# with tool descriptions, then a **real codebase** (the sources of a standard-library package, read
# offline), then tool calls whose outputs are file reads, search results and test logs. Both emit
# Mooncake-format requests (512-token blocks named by chained hashes), so the same replay code
# measures them and the published trace.

# %%
t0 = time.perf_counter()
chat = chat_workload(200, seed=0)
agent = agent_workload(4, agent_turns, packages=("json", "email", "http", "logging"), seed=0)
print(f"generated in {time.perf_counter() - t0:.1f} s")
for wl in (chat, agent):
    print(f"{wl.name:5s}: {len(wl.requests):4d} requests, {wl.input_tokens / 1e6:7.2f} M input tokens, "
          f"{wl.unique_blocks() * 512 / 1e6:6.2f} M tokens of distinct blocks, "
          f"reusable with an unbounded cache: {wl.ideal_reuse():.1%}")

fig, ax = plt.subplots(1, 2, figsize=(11, 3.2))
for a, wl in zip(ax, (chat, agent)):
    r = replay_trace(wl.requests, capacity_tokens=None)
    a.plot([r_.input_length / 1e3 for r_ in wl.requests], lw=0.8, label="input tokens")
    a.plot([h / 1e3 for h in r.per_request_hits], lw=0.8, label="served from cache")
    a.set(title=f"{wl.name}: hit ratio {r.hit_ratio:.2f} (unbounded cache)", xlabel="request (arrival order)",
          ylabel="thousands of tokens")
ax[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
plt.tight_layout(); plt.show()

# %% [markdown]
# ## 5. Eviction: LRU, an agent-aware policy, and the optimum
#
# With a bounded cache something must go. Three policies behind one interface
# (`kvcache.eviction`):
#
# * **LRU** as vLLM's prefix cache does it;
# * **agent** — this workbook's design: count each block's accesses with *dynamic aging*
#   (`priority = L + accesses`, `L` = the last victim's priority; LFU-DA, Arlitt et al. 2000), so a
#   burst of one-off blocks (a fresh document, a long tool output) cannot flush the blocks everyone
#   reuses (system prompts, the codebase); ties go to the *deepest* block, so a chain is trimmed
#   from its tail instead of cut at its root — a hit must be a prefix;
# * **Belady** — evict the block whose next use is farthest away. It needs the future, so it is
#   the reference, not a policy (Belady 1966).
#
# The replay contract: a request's hit is the longest prefix of its blocks already
# cached × 512 tokens, capped at its length; then all its blocks are touched in order.

# %%
def hit_curves(requests, capacities, policies=("lru", "agent", "belady")):
    curves = {p: [] for p in policies}
    for cap in tqdm(capacities, desc="capacities", leave=False):
        for p in policies:
            curves[p].append((cap, replay_trace(requests, capacity_tokens=cap, policy=p).hit_ratio))
    return curves

fig, ax = plt.subplots(1, 2, figsize=(11, 3.6))
workload_curves = {}
for a, wl in zip(ax, (chat, agent)):
    distinct = wl.unique_blocks() * 512
    caps = [int(distinct * f) for f in (0.05, 0.1, 0.2, 0.35, 0.5)]
    workload_curves[wl.name] = hit_curves(wl.requests, caps)
    vkv.plot_hit_curves(workload_curves[wl.name], ax=a, unbounded=wl.ideal_reuse(),
                        title=f"{wl.name} workload (capacities: 5-50% of its distinct blocks)")
plt.tight_layout(); plt.show()
for name, curves in workload_curves.items():
    print(f"{name}: {vkv.compare_policies(curves, 'agent', 'lru')}")

# %% [markdown]
# Which policy is ahead depends on the workload and the capacity: read the lines above. Counting
# accesses protects the reused blocks when the cache is small next to them; when the cache is
# nearly large enough to hold them, recency can be the better guess, and LRU catches up or passes.
#
# ### On Mooncake's trace
#
# Mooncake's FAST'25 synthetic trace: 3,993 requests built from public datasets, replayed under the
# same contract (the package's replay tests pin these hit ratios). The paper's Figure 9 point is
# that a 3 M-token cache keeps well under what an unbounded one would; the last line checks it.

# %%
trace_path = find_trace()
if trace_path is None:
    print("Mooncake trace not found, skipping.", HOW_TO_GET)
else:
    reqs = read_trace(trace_path)
    t0 = time.perf_counter()
    r = replay_trace(reqs, capacity_tokens=3_000_000, policy="lru")
    print(f"{len(reqs)} requests; LRU at 3 M tokens replayed in {time.perf_counter() - t0:.2f} s")
    caps = [1_000_000, 3_000_000, 10_000_000]
    curves = hit_curves(reqs, caps)
    unb = replay_trace(reqs, capacity_tokens=None).hit_ratio
    fig, ax = plt.subplots(figsize=(6, 3.6))
    vkv.plot_hit_curves(curves, ax=ax, unbounded=unb, title="Mooncake synthetic trace")
    plt.tight_layout(); plt.show()
    print(f"{'capacity':>10s} " + " ".join(f"{p:>8s}" for p in curves) + "   lru/belady  agent/belady")
    for i, cap in enumerate(caps):
        row = {p: curves[p][i][1] for p in curves}
        print(f"{cap / 1e6:8.0f} M " + " ".join(f"{row[p]:8.3f}" for p in curves)
              + f"   {row['lru'] / row['belady']:10.1%}  {row['agent'] / row['belady']:11.1%}")
    print(f"unbounded: {unb:.3f}. Agent vs LRU: {vkv.compare_policies(curves, 'agent', 'lru')}.")
    lru3 = dict(curves["lru"])[3_000_000]
    print(f"LRU at 3 M tokens keeps {lru3 / unb:.0%} of the unbounded cache's hits.")

# %% [markdown]
# Both online policies stay far from Belady at small capacities: most of the optimum's gain comes
# from knowing *which* one-off blocks will never return, which an online policy can only guess.
# That gap is what admission control (do not cache a block a classifier says is one-off) and a
# larger, slower tier (section 7) attack.
#
# ### Exercise 06.4 — an eviction policy
#
# Write your own policy behind the same interface. The checker first runs it inside a
# `BlockManager` (pages reused, freed, pinned: `evict` must only ever return a block that is
# evictable right now), then replays Mooncake's trace and two small generated workloads with
# `replay_trace` and prints your hit ratio beside FIFO, LRU and Belady at each capacity.
#
# **The bar: on each trace, your mean hit ratio is at least FIFO's.** FIFO evicts the block cached
# longest ago and ignores every hit — it is what a cache does that learns nothing from its traffic,
# so a policy that uses what it sees should not do worse. LRU clears it; beating LRU, or closing
# part of the gap to Belady, is the real game.

# %%
class MyPolicy(EvictionPolicy):
    """Your eviction policy. The cache calls insert(key, t) when a block becomes evictable,
    touch(key, t) when an evictable block is hit, remove(key) when a block stops being evictable,
    and evict() when it is full: evict forgets one block the policy holds and returns its key.
    t counts block accesses (a request touches its blocks in order, first block first)."""

    name = "mine"

    def __init__(self):
        pass  # your state here

    def insert(self, key, t, parent=None):
        raise NotImplementedError  # your code here

    def touch(self, key, t):
        raise NotImplementedError  # your code here

    def remove(self, key):
        raise NotImplementedError  # your code here

    def evict(self):
        raise NotImplementedError  # your code here


exercises.check("06.4", MyPolicy)

# %% [markdown]
# ## 6. Many replicas: routing
#
# With several replicas, each has its own cache. Round-robin balances load perfectly but sends a
# session's next turn to a replica that has never seen it. Cache-aware routing sends a request to
# the replica holding its longest cached prefix — unless that replica already carries more than
# `load_bound` × the mean load.

# %%
from minimax_lab.kvcache.routing import routing_sweep

cap = int(agent.unique_blocks() * 512 * 0.5)
res = routing_sweep(agent.requests, replica_counts=(1, 2, 4, 8), capacity_tokens=cap, load_bound=1.25)
fig, ax = plt.subplots(1, 2, figsize=(11, 3.2))
for router in ("round_robin", "cache_aware"):
    rs = [x for x in res if x.router == router]
    ax[0].plot([x.replicas for x in rs], [x.hit_ratio for x in rs], "o-", label=router)
    ax[1].plot([x.replicas for x in rs], [x.imbalance for x in rs], "o-", label=router)
ax[0].set(xlabel="replicas", ylabel="hit ratio (share of input tokens)", ylim=(0, 1),
          title="agent workload, cache per replica:\n50% of the distinct blocks")
ax[1].set(xlabel="replicas", ylabel="max / mean input tokens per replica", title="load balance (1 = even)")
for a in ax:
    a.set_xticks([1, 2, 4, 8]); a.grid(alpha=0.3)
ax[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
plt.tight_layout(); plt.show()

# %% [markdown]
# ## 7. The tier ladder: GPU → pinned host → disk, and when fetching beats recomputing
#
# `kvcache.tiers.TieredStore` keeps blocks evicted from the GPU in pinned host memory and, beyond
# that, in files — written atomically (temporary file, fsync, rename) with a header naming the
# block's hash and a checksum, verified on every read: a corrupt, truncated or foreign file is a
# miss, never served. Fetches from disk can run ahead on a background thread (`prefetch`).
#
# Fetch or recompute? A token's KV costs `2 · layers · Hkv · D · 2` bytes to move and about
# `2 · params_active + 4 · layers · Hq · D · context` FLOPs to recompute.

# %%
import tempfile

from minimax_lab.kvcache.tiers import MINIMAX_M2, TieredStore, break_even, tiny_model_shape

with tempfile.TemporaryDirectory() as d:
    store = TieredStore(host_blocks=2, disk_dir=d, model="demo", pin_memory=False)
    blocks = {page_hash(None, [i]): torch.randn(2, 4, 16, 2, 8) for i in range(4)}
    for n, t in blocks.items():
        store.spill(n, t)
    names = list(blocks)
    bad = store.path_for(names[0])
    data = bytearray(bad.read_bytes()); data[-40] ^= 1; bad.write_bytes(bytes(data))   # flip one bit
    store.prefetch(names)
    got = [store.fetch(n) for n in names]
    print("served:", [g is not None and torch.equal(g, blocks[n]) for g, n in zip(got, names)], store.stats)
    store.close()

recorded = {r["case"]: r for r in bench.load_records(suite="kvcache")}
link = recorded.get("h2d_pinned", {}).get("gbps", 55.0)   # without a record: the H200's pinned copy, ~55 GB/s each way
gemm = {r["case"]: r for r in bench.load_records(suite="ceilings")}.get("gemm_bfloat16", {}).get("tflops", 700.0)
print(f"host->device link: {link:.1f} GB/s, bf16 matmul: {gemm:.0f} TFLOP/s "
      f"({'recorded on the H200' if 'h2d_pinned' in recorded else 'typical H200 figures'})")
for case in ("h2d_pinned", "d2h_pinned", "h2d_pageable", "d2h_pageable"):
    if case in recorded:
        print(f"  {case:13s} {recorded[case]['gbps']:7.1f} GB/s")
rows = []
for shape in (tiny_model_shape(preset="cpu"), MINIMAX_M2):
    for ctx in (1_024, 32_768, 131_072):
        rows.append(break_even(shape, link_gbps=link, gpu_tflops=gemm, context=ctx, mfu=0.5))
print(f"\n{'model':28s} {'context':>8s} {'KV B/token':>11s} {'GFLOP/token':>12s} {'fetch us':>9s} "
      f"{'recompute us':>13s} {'break-even GB/s':>16s}")
for r in rows:
    print(f"{r['model']:28s} {r['context']:8d} {r['kv_bytes_per_token']:11,.0f} {r['prefill_flops_per_token'] / 1e9:12.3f} "
          f"{r['t_fetch_s'] * 1e6:9.3f} {r['t_recompute_s'] * 1e6:13.3f} {r['break_even_gbps']:16.1f}")
m2 = [r for r in rows if r["model"] == MINIMAX_M2.name]
print(f"\n{MINIMAX_M2.name}: a token's KV is {m2[0]['kv_bytes_per_token'] / 1e3:.0f} kB; recomputing it "
      f"(at 50% of {gemm:.0f} TFLOP/s) takes {m2[0]['ratio']:.0f}x to {m2[-1]['ratio']:.0f}x as long as fetching "
      f"it over {link:.0f} GB/s, from {m2[0]['context']:,} to {m2[-1]['context']:,} tokens of context")

# %% [markdown]
# For a MiniMax-M2-sized model (config from `huggingface.co/MiniMaxAI/MiniMax-M2`: 62 layers,
# 8 KV heads of 128, 256 experts of which 8 active) a token's KV is large, but recomputing it
# costs about twice its active parameters in FLOPs plus attention over the context: fetching
# wins by the factor printed above, and the longer the context the wider. The tiny model has so few
# FLOPs per token that at short context recomputing beats fetching (compare its first row's two
# times), which is why KV offload is a large-model technique.

# %% [markdown]
# ### What the cache promises when things go wrong
#
# The KV cache is a cache: under a fault it may lose a block (and the caller recomputes it), but it never serves a wrong one and never corrupts its own books. Each promise is checked by a test of the workbook's test suite (the `tests/` folder of its source repository):
#
# | Fault | What happens | Test |
# | --- | --- | --- |
# | Disk full, permission denied, a write torn halfway | the block is dropped (`stats.write_errors`), its temporary file removed, an earlier file kept; `spill` does not raise and the page pool stays consistent | `test_kvcache_faults.py::test_disk_full_during_allocate_keeps_pool_consistent`, `::test_a_failed_write_drops_the_block_cleanly`, `::test_a_failed_write_leaves_the_earlier_file` |
# | The eviction hook itself fails | the page stays cached; every sequence and reference count is as before the call | `test_kvcache_faults.py::test_failing_evict_hook_rolls_back` |
# | Tier directory removed | made again on the next write | `test_kvcache_faults.py::test_a_removed_directory_is_made_again` |
# | Several threads or processes writing one directory | unique temporary names + atomic rename: no write fails, no file is torn | `test_kvcache_faults.py::test_same_name_from_two_threads_never_collides`, `::test_concurrent_writer_processes_lose_nothing`; `test_kvcache_tiers.py::test_threads_share_a_store` |
# | Corrupt, truncated, foreign file, or a header that lies (valid checksum) | a miss, counted and dropped, never an exception | `test_kvcache_tiers.py::test_damaged_file_is_a_miss`, `test_kvcache_faults.py::test_lying_header_is_a_miss`, `::test_reading_any_damage_gives_the_block_or_a_miss` |
# | A file that cannot be read (I/O error) | a miss; the file is kept for the next try | `test_kvcache_faults.py::test_an_unreadable_file_is_a_miss_and_is_kept` |
# | Two models (or dtypes, page sizes) sharing a directory | file names and headers carry model, dtype and block shape: each sees only its own blocks | `test_kvcache_faults.py::test_directory_shared_by_two_models` |
# | Two prefixes whose page names collide | a hit is verified against the whole token prefix, so it is only a miss | `test_kvcache_faults.py::test_hash_collision_never_serves_a_page_computed_for_another_prefix` |
# | All of these at once, at random | thousands of steps with another process writing the same directory; after every step the pool's invariants hold and every hit has exactly the bytes stored | `test_kvcache_faults.py::test_tiers_under_faults_state_machine` |

# %% [markdown]
# ## 8. The engine slice: prefix caching on a multi-turn agent session
#
# `engine.slice.PagedEngine` runs the tiny model (`minimax_lab.model`, through its step API) on the
# paged cache with this chapter's kernels (`write_kv` stores each new token's K/V in its page,
# `paged_prefill` and `paged_decode` attend through the block table): a prompt's cached prefix is
# skipped, only new tokens are computed, and decode appends one token at a time. On an agent
# session each turn's prompt is the previous one plus the model's
# output and a tool result — so with prefix caching each turn computes only those new tokens.
# Outputs must be identical with and without the cache; only the work changes.
#
# What prefix caching saves is *tokens computed*, a count that means the same on any machine; the
# time that saves depends on the model and the machine. So the plot counts tokens; wall time is
# shown from the H200 records, and measured here only on a GPU.

# %%
from minimax_lab.engine.slice import PagedEngine, agent_session_chunks, run_agent_session
from minimax_lab.model import TinyMultimodalModel, preset_config

cfg = preset_config(P)
torch.manual_seed(0)
model = TinyMultimodalModel(cfg).to(runtime.device()).eval()
n_turns, new_tokens = runtime.pick(P, cpu=5, gpu=12), runtime.pick(P, cpu=4, gpu=8)
base, tool_outputs = agent_session_chunks(n_turns, vocab_size=cfg.vocab_size,
                                          base_tokens=runtime.pick(P, cpu=256, gpu=1024), turn_tokens=(40, 70))
if P == "gpu":   # warm-up (kernels, allocator) on a throwaway engine, so turn 0 is not timed cold
    run_agent_session(PagedEngine(model, num_pages=cfg.max_seq_len // 8), base, tool_outputs[:2], new_tokens=2)

per_turn = {}
for name, caching in (("with prefix caching", True), ("without", False)):
    eng = PagedEngine(model, num_pages=cfg.max_seq_len // 8, page_size=16, prefix_caching=caching)
    history, rows = list(base), []
    for k, tool_out in enumerate(tool_outputs):
        computed, reused = eng.stats.prefill_tokens, eng.stats.cached_tokens
        out = eng.generate(("turn", k), history, new_tokens)     # prompt = everything so far
        rows.append(dict(computed=eng.stats.prefill_tokens - computed, reused=eng.stats.cached_tokens - reused,
                         ttft_ms=1e3 * eng.stats.ttft_s[-1], out=out))
        history += out + tool_out
    per_turn[name] = rows
same = [r["out"] for r in per_turn["with prefix caching"]] == [r["out"] for r in per_turn["without"]]
print(f"identical outputs with and without prefix caching: {same}")
for name, rows in per_turn.items():
    print(f"{name:20s}: {sum(r['computed'] for r in rows):6d} prompt tokens computed, "
          f"{sum(r['reused'] for r in rows):6d} reused, over {len(rows)} turns")

rec_eng = {r["case"]: r for r in bench.load_records(suite="kvcache") if r["case"].startswith("engine_ttft")}
fig, ax = plt.subplots(1, 2, figsize=(12, 3.2), gridspec_kw=dict(width_ratios=[1.4, 1]))
vkv.plot_engine_tokens(per_turn, ax=ax[0], title=f"tokens per turn ({cfg.n_layers} layers, d={cfg.d_model})")
if P == "gpu":
    for name, rows in per_turn.items():
        ax[1].plot([r["ttft_ms"] for r in rows], "o-", label=f"{name}, measured now")
for case, label in (("engine_ttft_cached", "with prefix caching"), ("engine_ttft_nocache", "without")):
    if case in rec_eng:
        ax[1].plot(rec_eng[case]["ttft_ms_per_turn"], "s:", label=f"{label}, H200 recorded")
ax[1].set(xlabel="turn of the agent session", ylabel="time to first token (ms)", ylim=(0, None),
          title="wall time" + (f" on {runtime.device_name()} and" if P == "gpu" else "") + " on the H200 (recorded)")
if ax[1].lines:
    ax[1].legend(fontsize=7, loc="lower right")
plt.tight_layout(); plt.show()
for case, r in rec_eng.items():
    print(f"H200 recorded: {case:32s} mean TTFT {r['ms']:6.2f} ms, {r['prefill_tokens']:6d} tokens computed, "
          f"{r['cached_tokens']:6d} reused ({r['shape']['turns']} turns, d={r['shape']['d_model']})")
if not rec_eng:
    print("no H200 engine records yet (python -m minimax_lab.bench kvcache --cases engine on a GPU)")

# %% [markdown]
# With prefix caching only turn 0 computes its whole prompt; every later turn computes just what
# was added since the previous one (plus the partly filled last page, which has no name yet), so
# the work per turn stays flat while without the cache it grows with the context. The H200 records show the other half of the lesson: for a model this
# tiny, a turn's time is mostly kernel launches, not FLOPs, so its time to first token hardly moves
# (compare the two recorded means above) — the tokens saved turn into time saved only when each
# token costs real compute, as it does for a large model (section 7's table: GFLOP per token).
#
# **What to take away.** Pages end fragmentation, and the block table costs a kernel one extra
# load per token; content-hash names make prefix sharing a dictionary lookup; on agent traffic
# almost every prompt token is reusable, so what matters is *keeping* it — eviction (which online
# policy wins depends on the capacity: see section 5's comparison, and all stay far from Belady
# when the cache is small), tiers (for a large model, fetching a block over PCIe is far cheaper
# than recomputing it), and routing (send a session back to where its cache is).

# %% [markdown]
# ---
# **Previous:** [05 · Mixture of Experts](05_mixture_of_experts.ipynb) · **Next:** [08 · A kernel bench that hacks cannot fool](08_kernel_bench_that_hacks_cannot_fool.ipynb)
#
# **Package code used here:** `minimax_lab/kvcache/blocks.py`, `minimax_lab/kvcache/decode.py`, `minimax_lab/kvcache/decode_triton.py`, `minimax_lab/kvcache/paged.py`, `minimax_lab/kvcache/trace.py`, `minimax_lab/kvcache/eviction.py`, `minimax_lab/kvcache/workloads.py`, `minimax_lab/kvcache/routing.py`, `minimax_lab/kvcache/tiers.py`, `minimax_lab/engine/slice.py`, `minimax_lab/viz/kvcache.py`
