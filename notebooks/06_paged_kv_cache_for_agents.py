# %% [markdown]
# # 06 · A paged KV cache for agents: pages, prefix sharing, eviction, tiers, kernels
#
# **What this chapter builds:** a paged KV cache (page pool, block tables, prefix sharing by page names, eviction, host and disk tiers) and a paged-decode Triton kernel that looks pages up in the block table, replayed on chat, agent and Mooncake traffic.
#
# **It assumes:** [02 · FlashAttention in Triton](02_flash_attention_in_triton.ipynb) (online softmax, Triton tiles) and [00 · Rooflines and honest benchmarks](00_roofline_and_honest_benchmarks.ipynb) (GB/s against the copy ceiling).
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/06_paged_kv_cache_for_agents.ipynb)
#
# A chat request is a few hundred tokens. A coding agent uploads a whole repository and then
# runs hundreds of tool calls, each one a request whose prompt is *everything so far*. Almost
# all of that prompt was seen one turn ago, so its keys and values (KV) are already computed,
# if we kept them. Keeping them turns the KV cache into a storage system: where does each
# block live, have we seen it before, what do we throw away when memory is full, can we fetch
# it from host memory or disk faster than we could recompute it?

# %%
# In Colab, install the workbook's package first (locally, `make lab` already did).
import subprocess, sys
if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "minimax-lab[notebooks] @ git+https://github.com/minimax-lab/minimax-lab"], check=True)

# %% tags=["parameters"]
preset = "auto"        # "cpu" (small workloads, interpreter) or "gpu" (larger)
agent_turns = None     # tool-call turns per agent task in the generated workload (None: 40 on the CPU, 100 on a GPU)

# %%
import math

import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

from minimax_lab import exercises, runtime   # runtime first: it picks the Triton interpreter on a CPU
import triton
import triton.language as tl
from minimax_lab.kvcache import BlockManager, EvictionPolicy, KVPages, PoolExhausted
from minimax_lab.paged_kv import paged_decode
from minimax_lab.viz import kvcache as vkv

P = runtime.resolve_preset(preset)
kdev = runtime.kernel_device()   # where Triton kernels take their inputs: the GPU, or the CPU (interpreter)
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
tiny = BlockManager(2, 4)
tiny.allocate("a", list(range(4)))                   # both pages in use, one by each of two sequences
tiny.allocate("b", list(range(10, 14)))
try:
    tiny.allocate("c", [1])
except PoolExhausted as e:
    print("full pool:", e)

# %% [markdown]
# A page shows one state: the system prompt's pages are pinned, but while sequences still read them
# they show as shared. When every user has left, the pinned pages stay, the full pages of the users
# stay *cached* (named, unused: served to the next request that starts the same way, or evicted
# first when the pool fills), and the partly filled last pages, which have no name, go back to the pool.

# %%
for seq in ("user1", "user2", "user3", "user3-branch"):
    m.free(seq)
m.check_invariants()
vkv.plot_page_map(m.page_states(), cols=32, title="after every user left"); plt.show()

# %% [markdown]
# ## 3. The page lookup inside paged decode
#
# Decode is one new query token per sequence attending over *all* of that sequence's cached keys
# and values. Without pages that is chapter 02's attention with one query row. With pages, each
# key must first be found: token `t` of sequence `b` sits in page `block_table[b, t // page_size]`
# at slot `t % page_size`. The kernel does that lookup itself, so the cache is read in place and
# never copied into a contiguous buffer. The inputs: a few sequences of ragged lengths (an empty
# one, one token, part of a page, several pages) in a pool whose page ids are shuffled, as they
# are after a server has run for a while.

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

# %% [markdown]
# First in PyTorch, one sequence at a time: the lookup, then a softmax.

# %%
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


x = paged_inputs([0, 1, 19, 45])
print("block table (page ids, -1 = none):\n", x["block_table"].cpu())
ref = paged_decode(**x, impl="reference")                      # the package's fp32 reference
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
# Checked against the package on random inputs: ragged lengths (always one empty and one
# single-token sequence), a batch of five, shuffled pages of 4, 8 and 16 tokens. Ours sums in fp32
# without `tl.dot`, so it must match the fp32 reference to rounding (`1e-5`). The package's kernel
# multiplies with `tl.dot`, which on a GPU rounds fp32 inputs to tf32 (10-bit mantissa): against
# the reference it gets `2e-2` there, `1e-5` in the interpreter.

# %%
tol_package = 1e-5 if runtime.is_interpreter() else 2e-2
g = torch.Generator().manual_seed(6)
for page_size in (4, 8, 16):
    lens = [0, 1] + torch.randint(2, 64, (3,), generator=g).tolist()
    x = paged_inputs(lens, page_size=page_size, seed=page_size)
    ref = paged_decode(**x, impl="reference")
    ours, package = small_paged_decode(**x), paged_decode(**x, impl="triton")
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(package, ref, atol=tol_package, rtol=tol_package)
    print(f"lengths {lens}, page {page_size:2d}: ours vs reference max |err| {float((ours - ref).abs().max()):.1e}, "
          f"vs the package's kernel {float((ours - package).abs().max()):.1e}")

# %% [markdown]
# ### What the package's kernel adds
#
# `minimax_lab.paged_kv.decode_triton` does the same lookup and adds what makes it fast on a GPU:
#
# 1. **GQA packing**: one program owns a (sequence, *kv* head) and all `Hq / Hkv` query heads that
#    read it, as the rows of a `tl.dot`: each K/V byte is loaded once per group, not once per head.
# 2. **Split-K (flash-decoding)**: with few sequences there are too few programs to fill the GPU, so
#    each sequence's context is cut into splits, each a program; a second kernel merges the partial
#    softmaxes by their log-sum-exp.
# 3. **Whole tiles without masks**: only the last, ragged tile of a split pays for masking, and page
#    ids are clamped, so even an unchecked block table never reads outside the pool (below).

# %%
from minimax_lab.paged_kv import decode_triton
from minimax_lab.viz.excerpt import excerpt

excerpt(decode_triton._decode_tile, "t = start + offs_n", 9)

# %% [markdown]
# ## 4. Chat vs agent workloads
#
# `workloads.chat_workload` generates many short conversations (a short shared system prompt, a few
# turns each); `workloads.agent_workload` generates coding-agent tasks: a system prompt with tool
# descriptions, then a **real codebase** (the sources of standard-library packages, read offline),
# then tool calls whose outputs are file reads, search results and test logs. Both emit
# Mooncake-format requests (512-token blocks named by chained hashes), so the same replay measures
# them and the published trace: a request's hit is the longest prefix of its blocks already cached.

# %%
from minimax_lab.kvcache.workloads import agent_workload, chat_workload

chat = chat_workload(200, seed=0)
agent = agent_workload(4, agent_turns or runtime.pick(P, cpu=40, gpu=100), packages=("json", "email", "http", "logging"), seed=0)
for wl in (chat, agent):
    print(f"{wl.name:5s}: {len(wl.requests):4d} requests, {wl.input_tokens / 1e6:7.2f} M input tokens, "
          f"{wl.unique_blocks() * 512 / 1e6:6.2f} M tokens of distinct blocks, "
          f"reusable with an unbounded cache: {wl.ideal_reuse():.1%}")
vkv.plot_workloads([chat, agent]); plt.show()

# %% [markdown]
# ## 5. Eviction, and Mooncake's trace
#
# With a bounded cache something must go. Two online policies behind one interface
# (`kvcache.eviction`):
#
# * **LRU**, as vLLM's prefix cache does it;
# * **agent**: count each block's accesses with *dynamic aging* (`priority = L + accesses`, `L` =
#   the last victim's priority; LFU-DA, Arlitt et al. 2000), so a burst of one-off blocks (a fresh
#   document, a long tool output) cannot flush the blocks everyone reuses (system prompts, the
#   codebase); ties go to the *deepest* block, so a chain is trimmed from its tail instead of cut at
#   its root, since a hit must be a prefix.
#
# How far both are from the best possible (Belady's, which knows the future) is chapter 07's subject.

# %%
fig, ax = plt.subplots(1, 2, figsize=(11, 3.6))
for a, wl in zip(ax, (chat, agent)):
    caps = [int(wl.unique_blocks() * 512 * f) for f in (0.05, 0.1, 0.2, 0.35, 0.5)]
    curves = vkv.hit_curves(wl.requests, caps)
    vkv.plot_hit_curves(curves, ax=a, unbounded=wl.ideal_reuse(), title=f"{wl.name} (capacities: 5-50% of its distinct blocks)")
    print(f"{wl.name}: {vkv.compare_policies(curves, 'agent', 'lru')}")
plt.tight_layout(); plt.show()

# %% [markdown]
# Which policy is ahead depends on the workload and the capacity: read the lines above. Counting
# accesses protects the reused blocks when the cache is small next to them; when the cache nearly
# holds them all, recency can be the better guess. Mooncake's FAST'25 synthetic trace (Qin et al.:
# 3,993 requests built from public datasets) is replayed under the same rule; the paper's point is
# that a 3 M-token cache keeps well under what an unbounded one would (the last line checks it).

# %%
from minimax_lab.kvcache import find_trace, read_trace, replay_trace
from minimax_lab.kvcache.trace import HOW_TO_GET

trace_path = find_trace()
if trace_path is None:
    print("Mooncake trace not found, skipping.", HOW_TO_GET)
else:
    reqs = read_trace(trace_path)
    curves = vkv.hit_curves(reqs, [1_000_000, 3_000_000, 10_000_000])
    unbounded = replay_trace(reqs, capacity_tokens=None).hit_ratio
    vkv.plot_hit_curves(curves, unbounded=unbounded, title=f"Mooncake synthetic trace, {len(reqs):,} requests"); plt.show()
    print(f"agent vs LRU: {vkv.compare_policies(curves, 'agent', 'lru')}")
    print(f"LRU at 3 M tokens keeps {dict(curves['lru'])[3_000_000] / unbounded:.0%} of the unbounded cache's hits ({unbounded:.3f}).")

# %% [markdown]
# ## 6. Below the GPU: host memory and disk
#
# `kvcache.tiers.TieredStore` keeps blocks evicted from the GPU in pinned host memory and, beyond
# that, in files written atomically (temporary file, fsync, rename) with a header naming the
# block's hash and a checksum, verified on every read: a corrupt, truncated or foreign file is a
# miss, never served. Below, four blocks go down with room for two in host memory, one file gets a
# flipped bit, and every block is fetched back: the damaged one must come back as a miss.

# %%
import tempfile

from minimax_lab.kvcache.blocks import page_hash
from minimax_lab.kvcache.tiers import TieredStore

with tempfile.TemporaryDirectory() as d:
    store = TieredStore(host_blocks=2, disk_dir=d, model="demo", pin_memory=False)
    blocks = {page_hash(None, [i]): torch.randn(2, 4, 16, 2, 8) for i in range(4)}
    for name, kv in blocks.items():
        store.spill(name, kv)
    bad = store.path_for(next(iter(blocks)))
    data = bytearray(bad.read_bytes()); data[-40] ^= 1; bad.write_bytes(bytes(data))   # flip one bit
    got = [store.fetch(name) for name in blocks]
    print("fetched:", ["miss" if g is None else "intact" if torch.equal(g, kv) else "WRONG" for g, kv in zip(got, blocks.values())])
    print(store.stats)
    store.close()

# %% [markdown]
# Fetch or recompute? A token's KV costs `2 · layers · Hkv · D · 2` bytes to move and about
# `2 · params_active + 4 · layers · Hq · D · context` FLOPs to recompute (MiniMax-M2's config from
# `huggingface.co/MiniMaxAI/MiniMax-M2`: 62 layers, 8 KV heads of 128, 8 of 256 experts active).
# The bytes are fixed, the FLOPs grow with the context before the token, so for any model fetching
# wins past some context. The rates are the H200's records (the last line says which), whatever
# machine runs this.

# %%
from minimax_lab.kvcache.cost import MINIMAX_M2
from minimax_lab.model.config import tiny_model_shape
from minimax_lab.model import preset_config

tiny_cfg = preset_config("cpu")       # the tiny model of chapter 01, which holds at most max_seq_len tokens
print(vkv.fetch_or_recompute([(tiny_model_shape(tiny_cfg), (1_024, tiny_cfg.max_seq_len), tiny_cfg.max_seq_len),
                              (MINIMAX_M2, (1_024, 131_072), None)]))

# %% [markdown]
# The lines above say, per model, from which context on fetching a block over the host link beats
# recomputing it, and whether that context lies within what the model can hold. With several
# replicas each holding its own cache, the next question is where to send a request, or whether to
# send the cache to the request instead: a shared store between replicas, the subject of chapter 07.

# %% [markdown]
# ## 7. Prefix caching in an engine
#
# `engine.slice.PagedEngine` runs the tiny model of chapter 01 on the paged cache with this
# chapter's kernels: `write_kv` stores each new token's K/V in its page, `paged_prefill` and
# `paged_decode` attend through the block table. A prompt's cached prefix is skipped, so only new
# tokens are computed. On an agent's task each turn's prompt is the previous one plus the model's
# output and a tool result. Outputs must be identical with and without the cache; only the work
# changes. Work here is *tokens computed*, a count that means the same on any machine.

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
print("identical outputs with and without prefix caching:",
      [r["out"] for r in per_turn["with prefix caching"]] == [r["out"] for r in per_turn["without"]])
vkv.plot_engine_tokens(per_turn, title=f"prompt tokens per turn ({cfg.n_layers} layers, d={cfg.d_model}), measured here"); plt.show()

# %% [markdown]
# With prefix caching only turn 0 computes its whole prompt; every later turn computes just what
# was added since the previous one (plus the partly filled last page, which has no name yet), so the
# work per turn stays flat while without the cache it grows with the context.
#
# ## 8. On a GPU
#
# The `kvcache` bench suite (`python -m minimax_lab.bench kvcache`; full tables: `python -m minimax_lab.bench report`)
# times paged decode (bf16, 32 query and 8 KV heads of 128) against gathering the pages into a
# contiguous copy for SDPA and against SDPA on a cache that was never paged, and runs the engine above
# at a larger size; decode only *reads*, so it can pass the copy ceiling, and on a GPU stars and solid
# lines mark this machine, measured now.

# %%
from minimax_lab.bench import suite_kvcache as kv_bench
from minimax_lab.notebook import recorded

kv_recs = recorded.all_of("kvcache")
decode_recs = [r for r in kv_recs if r["case"].startswith("decode")]
engine_recs = [r for r in kv_recs if r["case"].startswith("engine_ttft")]
measured = []
if P == "gpu":   # the B=8, 32k-context case, checked against the fp32 reference first
    errs = kv_bench.check_decode(kdev, runtime.compute_dtype(), True)
    case = next(c for c in kv_bench.GPU_DECODE if c["B"] == 8 and c["L"] == 32768)
    measured = kv_bench.run_decode(case, kdev, runtime.compute_dtype(), True, errs, reps=20)
turns_now = {name: [r["ttft_ms"] for r in rows] for name, rows in per_turn.items()} if P == "gpu" else None
vkv.on_a_gpu(decode_recs, engine_recs, measured_decode=measured, measured_turns=turns_now, device_now=runtime.device_name()); plt.show()
display(Markdown(vkv.on_a_gpu_words(decode_recs, engine_recs)))

# %% [markdown]
# ## 9. Exercises
#
# Each checker draws fresh cases (shuffled page ids, ragged lengths, odd page sizes) and says what
# it expected. Solutions: `minimax_lab/exercises/solutions/ch06.py` (try first).
#
# **06.1, the page lookup.** Every paged kernel starts here: token `t` of a sequence lives in page
# `block_table[t // page_size]` at offset `t % page_size`. Write it for a batch of positions. The
# checker looks up fresh positions through shuffled block tables and checks each lands on its token.

# %%
def page_and_offset(block_table: torch.Tensor, positions: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's block table (int32 [max_pages], its pages in order) and token positions
    (int64 [n]): return (page_ids, offsets), both int64 [n], such that the K/V of token
    positions[i] sits in slot offsets[i] of page page_ids[i] of the pool."""
    raise NotImplementedError  # your code here


exercises.check("06.1", page_and_offset)

# %% [markdown]
# **06.2, prefix sharing by page names.** A new request arrives; which of its pages are already
# cached? Name its full pages the way `BlockManager` does (each name chains its parent's) and walk
# them in order. A hit must be a *prefix*: page 5's K/V were computed after pages 0–4, so they are
# useless if page 4 is missing, even when page 5's name is still in the cache. The checker tries six
# kinds of request, one whose middle page was evicted among them.

# %%
def cached_prefix_pages(tokens: list[int], page_size: int, cached: dict) -> list[int]:
    """`cached` maps the name of every cached full page to the id of the page holding it. A page's
    name is page_hash(name of the page before it (None for the first page), its page_size tokens).
    Return the page ids of the longest run of full pages at the start of `tokens` whose names are
    in `cached`, in order (a partial last page never counts)."""
    raise NotImplementedError  # your code here


exercises.check("06.2", cached_prefix_pages)

# %% [markdown]
# **06.3, a sliding-window paged-decode kernel, in Triton.** Some models let a token attend only to
# the last `window` tokens. With pages, that is the same lookup over a shorter range: start from
# `small_paged_decode_kernel` and change where its token loop begins. The checker runs your function
# on the kernel device (fp32, ragged lengths, shuffled pages of 4 to 16 tokens, windows of 1, a few
# tokens and more than any length) against an fp64 reference, relative tolerance `5e-3`, and
# verifies that your kernel did the attention.

# %%
def sliding_window_paged_decode(q, k_cache, v_cache, block_table, seq_lens, window: int):
    """Paged decode with the inputs of paged_decode (on the kernel device), where each sequence's
    query attends only to its last `window` cached tokens, positions [max(0, L - window), L).
    Write it as a Triton kernel: start from small_paged_decode_kernel. Returns o [B, Hq, D] in
    q's dtype, zeros for an empty sequence."""
    raise NotImplementedError  # your code here


exercises.check("06.3", sliding_window_paged_decode)

# %% [markdown]
# **06.4, an eviction policy.** Write your own policy behind the interface of section 5. The checker
# first runs it inside a `BlockManager` (pages reused, freed, pinned: `evict` must only ever return a
# block that is evictable right now), then replays Mooncake's trace and two small generated
# workloads and prints your hit ratio beside FIFO, LRU and Belady at each capacity. **The bar: on
# each trace, your mean hit ratio is at least FIFO's.** FIFO evicts the block cached longest ago and
# ignores every hit; LRU clears the bar; beating LRU, or closing part of the gap to Belady, is the
# real game. The package's own policies may not do the work: inherit `EvictionPolicy`, not one of them.

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
# ## What limits us
#
# Pages end fragmentation, and the block table costs a kernel one extra load per token; content-hash
# names make prefix sharing a dictionary lookup; on agent traffic almost every prompt token is
# reusable, so what matters is *keeping* it. The limits: an online eviction policy only guesses which
# one-off blocks will never return, and both policies here stay far from what an unbounded cache
# keeps when the cache is small; a block below the GPU is worth fetching only where the link beats
# recomputing it, which depends on the model and on the context before the block (section 6 says
# where for two models); a single replica's cache serves only the requests routed to it; and the
# prompt tokens prefix caching skips turn into time only where computing them is a large part of a
# turn's time (section 8 shows that for the tiny model it is not). On the CPU the kernels run in
# Triton's interpreter: checked there, never timed.
#
# ---
# **Previous:** [05 · Mixture of Experts](05_mixture_of_experts.ipynb) · **Next:** [07 · The KV cache as a distributed store](07_kv_cache_as_a_distributed_store.ipynb)
#
# **Package code used here:** `minimax_lab/kvcache/blocks.py`, `minimax_lab/paged_kv/layout.py`, `minimax_lab/paged_kv/decode.py`, `minimax_lab/paged_kv/decode_triton.py`, `minimax_lab/kvcache/workloads.py`, `minimax_lab/kvcache/eviction.py`, `minimax_lab/kvcache/trace.py`, `minimax_lab/kvcache/tiers.py`, `minimax_lab/engine/slice.py`, `minimax_lab/viz/kvcache.py`
