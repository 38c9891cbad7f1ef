# %% [markdown]
# # 05 · A paged KV cache for agents: pages, prefix sharing, eviction, tiers, kernels
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/05_paged_kv_cache_for_agents.ipynb)
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
agent_turns = 100      # tool-call turns per agent session in the generated workload

# %%
import time

import matplotlib.pyplot as plt
import torch
from tqdm.auto import tqdm

from minimax_lab import bench, runtime
from minimax_lab.kvcache import BlockManager, KVPages, PoolExhausted, find_trace, read_trace, replay_trace
from minimax_lab.kvcache.trace import HOW_TO_GET
from minimax_lab.kvcache.workloads import agent_workload, chat_workload
from minimax_lab.viz import kvcache as vkv
from minimax_lab.viz import live_vs_recorded

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
# hash `hash(parent's name, this page's tokens)`. Equal names mean equal prefixes, so a new request
# starting with the same tokens finds them by walking names — and every hit is verified against the
# tokens stored with the page, so a hash collision can never serve wrong KV.
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
vkv.plot_page_map(m.page_states(), cols=32, title="pool after 4 users sharing a system prompt, a fork, a free")
plt.show()
m.check_invariants()
try:
    BlockManager(2, 4).allocate("big", list(range(20)))
except PoolExhausted as e:
    print("full pool:", e)

# %% [markdown]
# ## 3. Chat vs agent workloads
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

fig, ax = plt.subplots(1, 2, figsize=(10, 3))
for a, wl in zip(ax, (chat, agent)):
    r = replay_trace(wl.requests, capacity_tokens=None)
    a.plot([r_.input_length for r_ in wl.requests], lw=0.8, label="input tokens")
    a.plot(r.per_request_hits, lw=0.8, label="served from cache")
    a.set_title(f"{wl.name}: hit ratio {r.hit_ratio:.2f} (unbounded cache)")
    a.set_xlabel("request"); a.legend(fontsize=7)
plt.show()

# %% [markdown]
# ## 4. Eviction: LRU, an agent-aware policy, and the optimum
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
#   the bound, not a policy (Belady 1966).
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

fig, ax = plt.subplots(1, 2, figsize=(11, 3.5))
for a, wl in zip(ax, (chat, agent)):
    distinct = wl.unique_blocks() * 512
    caps = [int(distinct * f) for f in (0.05, 0.1, 0.2, 0.35, 0.5)]
    vkv.plot_hit_curves(hit_curves(wl.requests, caps), ax=a, unbounded=wl.ideal_reuse(),
                        title=f"{wl.name} workload")
plt.show()

# %% [markdown]
# ### On Mooncake's trace
#
# Mooncake's FAST'25 synthetic trace: 3,993 requests built from public datasets. Replayed under this
# contract it gives (the replay tests hold these) unbounded 0.651, LRU at 50 M / 10 M / 3 M / 1 M
# tokens 0.651 / 0.577 / 0.315 / 0.142. The paper's Figure 9 point: a 3 M-token cache keeps under
# half of what an unbounded one would.

# %%
trace_path = find_trace()
if trace_path is None:
    print("Mooncake trace not found, skipping.", HOW_TO_GET)
else:
    reqs = read_trace(trace_path)
    t0 = time.perf_counter()
    r = replay_trace(reqs, capacity_tokens=3_000_000, policy="lru")
    print(f"{len(reqs)} requests; LRU at 3 M replayed in {time.perf_counter() - t0:.2f} s: hit ratio {r.hit_ratio:.3f}")
    caps = [1_000_000, 3_000_000, 10_000_000, 50_000_000]
    curves = hit_curves(reqs, caps)
    unb = replay_trace(reqs, capacity_tokens=None).hit_ratio
    vkv.plot_hit_curves(curves, unbounded=unb, title="Mooncake synthetic trace")
    plt.show()
    print(f"{'capacity':>10s} " + " ".join(f"{p:>8s}" for p in curves) + "   lru/belady  agent/belady")
    for i, cap in enumerate(caps):
        row = {p: curves[p][i][1] for p in curves}
        print(f"{cap / 1e6:8.0f} M " + " ".join(f"{row[p]:8.3f}" for p in curves)
              + f"   {row['lru'] / row['belady']:10.1%}  {row['agent'] / row['belady']:11.1%}")

# %% [markdown]
# The agent-aware policy beats LRU at every bounded capacity, yet both stay far from Belady:
# most of the optimum's gain comes from knowing *which* one-off blocks will never return, which an
# online policy can only guess. That gap is what admission control (do not cache a block a
# classifier says is one-off) and a larger, slower tier (next section) attack.
#
# ## 5. Many replicas: routing
#
# With several replicas, each has its own cache. Round-robin balances load perfectly but sends a
# session's next turn to a replica that has never seen it. Cache-aware routing sends a request to
# the replica holding its longest cached prefix — unless that replica already carries more than
# `load_bound` × the mean load.

# %%
from minimax_lab.kvcache.routing import routing_sweep

cap = int(agent.unique_blocks() * 512 * 0.5)
res = routing_sweep(agent.requests, replica_counts=(1, 2, 4, 8), capacity_tokens=cap, load_bound=1.25)
fig, ax = plt.subplots(1, 2, figsize=(10, 3))
for router in ("round_robin", "cache_aware"):
    rs = [x for x in res if x.router == router]
    ax[0].plot([x.replicas for x in rs], [x.hit_ratio for x in rs], "o-", label=router)
    ax[1].plot([x.replicas for x in rs], [x.imbalance for x in rs], "o-", label=router)
ax[0].set(xlabel="replicas", ylabel="hit ratio", title="agent workload, each replica 50% of distinct blocks")
ax[1].set(xlabel="replicas", ylabel="max load / mean load", title="load balance")
for a in ax:
    a.legend(fontsize=7); a.grid(alpha=0.3)
plt.show()

# %% [markdown]
# ## 6. The tier ladder: GPU → pinned host → disk, and when fetching beats recomputing
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

from minimax_lab.kvcache.blocks import page_hash
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
print(f"host->device link: {link:.1f} GB/s ({'recorded on the H200' if 'h2d_pinned' in recorded else 'a typical H200 figure'})")
for case in ("h2d_pinned", "d2h_pinned", "h2d_pageable", "d2h_pageable"):
    if case in recorded:
        print(f"  {case:13s} {recorded[case]['gbps']:7.1f} GB/s")
rows = []
for shape in (tiny_model_shape(preset="cpu"), MINIMAX_M2):
    for ctx in (1_024, 32_768, 131_072):
        rows.append(break_even(shape, link_gbps=link, gpu_tflops=700, context=ctx, mfu=0.5))
print(f"{'model':28s} {'context':>8s} {'KV B/token':>11s} {'GFLOP/token':>12s} {'fetch us':>9s} "
      f"{'recompute us':>13s} {'break-even GB/s':>16s}")
for r in rows:
    print(f"{r['model']:28s} {r['context']:8d} {r['kv_bytes_per_token']:11,.0f} {r['prefill_flops_per_token'] / 1e9:12.3f} "
          f"{r['t_fetch_s'] * 1e6:9.3f} {r['t_recompute_s'] * 1e6:13.3f} {r['break_even_gbps']:16.1f}")

# %% [markdown]
# For a MiniMax-M2-sized model (config from `huggingface.co/MiniMaxAI/MiniMax-M2`: 62 layers,
# 8 KV heads of 128, 256 experts of which 8 active) a token's KV is ~248 KB but recomputing it
# costs ~20 GFLOP (about 2 × its ~10 B active parameters) plus attention over the context: fetching over a 55 GB/s link wins by a wide margin,
# and the longer the context the wider. The tiny model is the opposite case in absolute terms
# (tiny FLOPs per token), which is why KV offload is a large-model technique.

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
# ## 7. The decode kernel, step by step, against the peers
#
# Decode reads every cached K/V byte once per generated token, so its speed is memory bandwidth.
# The kernel (`minimax_lab.kvcache.decode`, the kernels chapter) reads pages straight through the
# block table, packs the query heads of a GQA group together so each byte is read once per group,
# and splits long contexts across programs (flash-decoding) with a second pass merging them. Here it
# runs on the kernel device (in the Triton interpreter on the CPU) at a tiny size, checked against
# the fp32 reference; then the H200 records against the peers timed in the same run — gathering
# the pages and calling SDPA, and SDPA on a contiguous (unpaged) cache — and, on a GPU, the same
# case measured on this machine beside them.

# %%
try:
    from minimax_lab.kvcache import paged_decode
except Exception as e:  # the kernels chapter may not be installed
    paged_decode = None
    print("paged_decode not available:", e)
if paged_decode is not None:
    g = torch.Generator().manual_seed(0)
    B, Hq, Hkv, D, ps, n_pages = 3, 4, 2, 16, 16, 12
    lens = torch.tensor([1, 17, 40], dtype=torch.int32)               # 1 token, mid-page, ragged
    perm = torch.randperm(n_pages, generator=g).to(torch.int32)        # non-contiguous pages
    bt = torch.full((B, 4), -1, dtype=torch.int32)
    used = 0
    for b in range(B):
        k_ = -(-int(lens[b]) // ps)
        bt[b, :k_] = perm[used:used + k_]; used += k_
    kc = torch.randn(n_pages, ps, Hkv, D, generator=g); vc = torch.randn(n_pages, ps, Hkv, D, generator=g)
    q = torch.randn(B, Hq, D, generator=g)
    q, kc, vc, bt, lens = (t.to(kdev) for t in (q, kc, vc, bt, lens))  # drawn on the CPU, then moved
    ref = paged_decode(q, kc, vc, bt, lens, impl="reference")
    for impl in ("torch", "triton"):
        t0 = time.perf_counter()
        out = paged_decode(q, kc, vc, bt, lens, impl=impl)
        print(f"{impl:7s} max |err| vs reference {float((out - ref).abs().max()):.2e}  ({time.perf_counter() - t0:.2f} s)")
    print("block table:\n", bt)

# %%
recs = [r for r in bench.load_records(suite="kvcache") if r["case"].startswith("decode")]
if not recs:
    print("no recorded H200 decode results yet: run `python -m minimax_lab.bench kvcache` on a GPU")
else:
    print(bench.format_table(sorted(recs, key=lambda r: (r["case"], r["impl"]))))
    cases = sorted({r["case"] for r in recs})
    impls = [i for i in ("triton", "sdpa_contiguous", "gather_sdpa") if any(r["impl"] == i for r in recs)]
    fig, ax = plt.subplots(figsize=(9, 3.5))
    w = 0.8 / len(impls)
    for j, impl in enumerate(impls):
        ys = [next((r.get("gbps", 0) for r in recs if r["case"] == c and r["impl"] == impl), 0) for c in cases]
        ax.bar([i + j * w for i in range(len(cases))], ys, w, label=impl)
    ax.axhline(4245, color="grey", ls=":", label="H200 copy ceiling 4,245 GB/s")
    ax.set_xticks([i + w for i in range(len(cases))], [c.replace("decode_", "").replace("_Hq32_Hkv8_D128", "")
                                                        for c in cases], rotation=20, fontsize=7)
    ax.set_ylabel("KV GB/s"); ax.legend(fontsize=7)
    ax.set_title(f"paged decode on the H200 (recorded, {live_vs_recorded.commits_label(recs)})")
    plt.show()

# %%
from minimax_lab.kvcache import bench_suite as kv_bench

measured = []   # the suite's B=8, 32k-context decode case, measured on this machine
if P == "gpu":
    dtype_now = runtime.compute_dtype()
    errs = kv_bench.check_decode(kdev, dtype_now, True)                 # Triton vs the fp32 reference first
    case = next(c for c in kv_bench.GPU_DECODE if c["B"] == 8 and c["L"] == 32768)
    measured = kv_bench.run_decode(case, kdev, dtype_now, True, errs, reps=20)
    torch.cuda.empty_cache()
if measured and any(r["case"] == m["case"] for r in recs for m in measured):
    print(live_vs_recorded.format_rows(measured, recs, "gbps", device_now=runtime.device_name()))
    live_vs_recorded.plot(measured, recs, "gbps", device_now=runtime.device_name(),
                          title=f"{measured[0]['case']}: measured now vs recorded")
    plt.tight_layout(); plt.show()
else:
    print(f"Measured now: nothing at the recorded sizes (preset {P!r}; a GPU runs them). "
          "The check above ran the kernel here at a tiny size.")

# %% [markdown]
# ## 8. The engine slice: prefix caching on a multi-turn agent session
#
# `kvcache.engine.PagedEngine` runs the tiny model (`minimax_lab.model`, through its step API) on the
# paged cache: a prompt's cached prefix is skipped, only new tokens are computed, and decode appends
# one token at a time. On an agent session each turn's prompt is the previous one plus the model's
# output and a tool result — so with prefix caching each turn computes only those new tokens.
# Outputs must be identical with and without the cache; only the work changes.

# %%
from minimax_lab.kvcache.measure import engine_records

_, res = engine_records(preset, n_turns=6 if P == "cpu" else 12)
fig, ax = plt.subplots(figsize=(6, 3))
for name, r in res.items():
    ax.plot([1e3 * t for t in r["ttft_s"]], "o-", label=f"{name}: {r['prefill_tokens']} tokens computed")
ax.set(xlabel="turn", ylabel="TTFT (ms, this machine)", title=f"engine slice on {runtime.device_name()}")
ax.legend(fontsize=7); plt.show()
rec_eng = [r for r in bench.load_records(suite="kvcache") if r["case"].startswith("engine_ttft")]
for r in rec_eng:
    print(f"H200 recorded: {r['case']:32s} mean TTFT {r['ms']:7.2f} ms, prefill {r['prefill_tokens']} tokens, "
          f"cached {r['cached_tokens']}")
if not rec_eng:
    print("no H200 engine records yet (python -m minimax_lab.kvcache.measure --out FILE on a GPU)")

# %% [markdown]
# CPU timings on a shared machine are noisy; the *token counts* are exact. On the CPU the first turn
# costs the same either way; every later turn with prefix caching computes only the tokens added
# since the previous turn, so TTFT stays flat while without it TTFT grows with the context.
#
# **What to take away.** Pages end fragmentation; content-hash names make prefix sharing a dictionary
# lookup; on agent traffic almost every prompt token is reusable, so what matters is *keeping* it —
# eviction (and a policy that protects reused blocks beats LRU), tiers (for a large model, fetching a
# block over PCIe is far cheaper than recomputing it), and routing (send a session back to where its
# cache is).
