# %% [markdown]
# # 07 · The KV cache as a distributed store
#
# **What this chapter builds:** a shared KV pool on Mooncake Store beside the paged cache: engine replicas in separate processes that fetch a prefix another replica computed, a router that prices "fetch here" against "go there", prefill handing a prompt to decode, faults that cost only recomputation, and the same rules replayed at 1–64 replicas.
#
# **It assumes:** [06 · A paged KV cache for agents](06_paged_kv_cache_for_agents.ipynb) (pages, chained page names, tiers, `break_even`).
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/07_kv_cache_as_a_distributed_store.ipynb)
#
# An agent session of 500k tokens holds well over 100 GB of KV (section 1 computes it). No single
# GPU keeps every session's cache, and the replica that holds one is often busy. Cache-aware routing
# sends the request *to* the cache (section 4); Mooncake (Qin et al., FAST'25, Kimi's serving
# system) also sends the cache *to* the request: every replica puts its blocks into a pool made of
# all machines' DRAM, and any replica fetches them. Page names are already global content addresses
# — a chained hash of every token up to the end of the page — so the pool needs no coordination
# about *what* a block is, only about *where* it lives.

# %%
# In Colab, install the workbook with its store extra and the two system libraries Mooncake needs.
import subprocess, sys
if "google.colab" in sys.modules:
    subprocess.run("apt-get update -qq && apt-get install -y -qq libibverbs1 libnuma1", shell=True, check=False)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "minimax-lab[notebooks,store] @ git+https://github.com/minimax-lab/minimax-lab"], check=True)

# %% tags=["parameters"]
preset = "auto"        # "cpu" or "gpu": the store runs on the CPU either way

# %%
import random

import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

from minimax_lab import exercises, runtime
from minimax_lab.engine.replicas import PoolRouter, prefill_decode, start_replicas
from minimax_lab.engine.slice import PagedEngine
from minimax_lab.engine.store_faults import fault_drill
from minimax_lab.kvcache import store as mc
from minimax_lab.kvcache.pool_sim import MODES, mooncake_comparison, simulate_pool
from minimax_lab.kvcache.routing import PrefillCost
from minimax_lab.kvcache.cost import MINIMAX_M2, LayerShape
from minimax_lab.model.config import tiny_model_shape
from minimax_lab.kvcache.trace import find_trace, read_trace, replay_trace
from minimax_lab.model.train import load_pretrained
from minimax_lab.viz import kvstore as vks

P = runtime.resolve_preset(preset)

# %% [markdown]
# ## 1. The idea: a ladder whose last rung is shared
#
# Each replica keeps its tiers (chapter 06); below them all lies one pool. A replica that computes
# a page puts it under its name; any replica that misses on its own tiers asks the pool first and
# computes only what the pool does not have. The pool has two parts: the **master** keeps the map
# from each key to the machine whose memory holds its bytes (and evicts, by an approximate LRU, when
# the pool is full);
# the memory itself is lent by the machines. A client asks the master where a key lives, then moves
# the bytes straight from that machine.

# %%
print(vks.session_kv_words(MINIMAX_M2, 500_000))
vks.draw_pool()
plt.show()

# %% [markdown]
# A block's key is its page name plus its *format* (model, dtype, block shape); its value carries a
# header naming the block and a **tag** over header and payload, so a damaged or foreign value is a
# miss, never served. A checksum alone would catch accidents only: anyone who can write to the pool
# can compute it, and a value forged with a recomputed checksum would be served as a wrong tensor.
# So the pool has a secret (32 random bytes drawn when it starts, readable only by its owner) and
# the tag is keyed BLAKE3 with it: a writer without the secret cannot make a replica serve anything.
# (Without a secret the tier falls back to an xxh3 checksum, and then a writer with pool access *can*
# serve any tensor.) Every call has a deadline: a pool that is down costs recomputation, nothing else.
#
# ## 2. Start a pool and two replicas
#
# `mc.start_store` starts a `StoreServer` — Mooncake's master, its metadata server (how clients find
# one another) and a *pool node* (a process that only lends memory) on 127.0.0.1 — or says why it
# cannot. Each replica is a separate process with its own paged cache. None of these processes
# outlives this notebook's kernel: they stop at exit, and die with it if it is killed.

# %%
server, why = mc.start_store(pool_bytes=128 << 20)
replicas = start_replicas(server, 2, page_size=16, timeout_s=1.0, retry_s=0.3) if server else []
print(vks.store_status(server, why, replicas))
model, cfg = load_pretrained()
single = PagedEngine(model, num_pages=512, page_size=16)          # one process, no pool: the reference
ref_ids = iter(range(10**6))
reference = lambda tokens, n: single.generate(("ref", next(ref_ids)), tokens, n)  # noqa: E731
rng = random.Random(2026)
prompt = lambda n: [rng.randrange(4, cfg.vocab_size) for _ in range(n)]  # noqa: E731

# %% [markdown]
# ## 3. Replica B reuses what replica A computed
#
# A computes a 131-token prompt — 8 full pages of 16 and a last page of 3 — and publishes its full
# pages. B gets a longer prompt that starts the same way: it fetches those 8 pages and computes the
# rest, A's 3 tokens of the unfinished page included.

# %%
base = prompt(131)
longer = base + prompt(25)
if replicas:
    a = replicas[0].generate(base, 6)
    b = replicas[1].generate(longer, 6)
    print(f"A: computed {a['computed']}, fetched {a['fetched']}")
    print(f"B: fetched {b['fetched']} (A's full pages), computed {b['computed']} = {len(base) - b['fetched']} tokens "
          f"of A's unfinished page + {len(longer) - len(base)} new")
    print("tokens equal to one process:", a["tokens"] == reference(base, 6), b["tokens"] == reference(longer, 6))
else:
    print(vks.SKIPPED)

# %% [markdown]
# ## 4. Fetch here, or go there?
#
# The router asks each replica what it holds and the pool what it holds, then prices each replica:
# its queue, plus fetching what the pool has beyond its own cache (if that beats recomputing it),
# plus computing the rest. `PrefillCost` is the price — the model behind `break_even`: KV bytes over
# the link against the FLOPs of the exact span. Here A computes a 120-token prompt (its 7 full pages
# are cached and pooled; the last 8 tokens are not), and the router places the same prompt plus one
# token. The device is the tiny model at 0.01 TFLOP/s, a CPU's rate, so seconds are visible. Three
# cases: both idle; A busy for 5 s; A busy and B's link to the pool so slow (1e-9 GB/s) that nothing
# is worth fetching.

# %%
fresh = prompt(120)
if replicas:
    replicas[0].generate(fresh, 2)                 # only replica A (and the pool) holds this one
    for link, busy in ((100.0, [0.0, 0.0]), (100.0, [5.0, 0.0]), (1e-9, [5.0, 0.0])):
        cost = PrefillCost(tiny_model_shape(cfg), link_gbps=link, tflops=0.01)
        r, plan = PoolRouter(replicas, cost, queue_s=list(busy)).route(fresh + [7])
        print(f"link {link:g} GB/s, queues {busy}:")
        print("\n".join(vks.route_lines(cost, plan, busy, len(fresh) + 1)))
else:
    print(vks.SKIPPED)

# %% [markdown]
# ## 5. Prefill hands the prompt to decode
#
# Disaggregation: one replica only prefills, another only decodes. The prefill replica publishes
# every page, the last, partial one too. Chapter 06 gives a partly filled page no name, because it
# will still grow and a name must describe exactly the tokens in it. A hand-over is a snapshot: the
# prefill replica names the partial page by the chained hash of the tokens it holds *now* and never
# changes the pool's copy; the decode replica asks for exactly this prompt, copies the page into its
# own cache and appends to its copy. A longer prompt names that page by more tokens, so it is never
# served the snapshot.

# %%
if replicas:
    p = prompt(75)
    out = prefill_decode(replicas[0], replicas[1], p, 8)
    print("prefill computed", out["prefill"]["computed"], "| decode computed", out["decode"]["computed"],
          "fetched", out["decode"]["fetched"])
    print("equal to one process doing both:", out["tokens"] == reference(p, 8))
else:
    print(vks.SKIPPED)

# %% [markdown]
# ## 6. Kill the master
#
# The master goes away mid-run. Replica B asks for a prompt whose prefix A had published: the pool's
# calls fail, B recomputes, and its tokens do not change. Then every fault of the drill, each once
# here; below it, the recorded drill of three trials each. "Equal to one process" compares B's
# tokens with the reference engine's.

# %%
if server:
    base2 = prompt(96)
    replicas[0].generate(base2, 4)
    server.kill_master()
    b = replicas[1].generate(base2 + [9, 9], 4)
    print(f"master down: fetched {b['fetched']}, recomputed {b['computed']}, equal:", b["tokens"] == reference(base2 + [9, 9], 4))
    server.restart_master()
    rows = fault_drill(server, replicas, reference, trials=1, seed=7)
    display(Markdown(vks.fault_table(rows, "this run, one trial each")))
else:
    print(vks.SKIPPED)
drill = vks.recorded("kvstore_faults")
if drill:
    display(Markdown(vks.fault_table(drill["rows"], f"recorded on the CPU machine, {drill['trials']} trials each")))

# %% [markdown]
# ## 7. At scale, by simulation
#
# The same rules over Mooncake's synthetic trace (3,993 requests, ~15k tokens each), LLaMA3-70B on
# 8×A800-like nodes, the setting of Mooncake's evaluation. **Every mode has the same memory**: each
# replica caches 3M tokens. With the pool a replica may also fetch from the others' caches — the
# pool *is* their memory together, nothing extra — and keeps what it fetched. A replica prefills one
# request at a time; TTFT = wait + fetch + compute, priced by the model (no GPU runs here).

# %%
trace = read_trace(find_trace())
counts = runtime.pick(P, cpu=(1, 2, 4, 10, 32), gpu=(1, 2, 4, 8, 10, 16, 32, 64))
sim = [simulate_pool(trace, replicas=n, mode=m, capacity_tokens=3_000_000).as_dict() for n in counts for m in MODES]
ceiling = replay_trace(trace, capacity_tokens=None).hit_ratio
vks.plot_replay(sim, f"Mooncake's synthetic trace, all {len(trace):,} requests (simulated)", ceiling)
plt.show()
print("\n".join(vks.replay_notes(sim)))

# %% [markdown]
# **Against Mooncake's numbers, like for like.** Mooncake's local baseline is cache-aware too: its
# "global scheduler is programmed to direct requests to nodes with higher prefix match ratios"
# (FAST'25, Sec. 5.3.2). So the pair to compare is *own caches, cache-aware* against *shared pool,
# priced routing*, at 10 replicas of 3M tokens each — the published numbers are Fig. 9 and Fig. 10:

# %%
doc = dict(rows=sim, capacity_tokens=3_000_000, ceiling_hit_ratio=ceiling)
print("\n".join(vks.mooncake_words(mooncake_comparison(doc))))

# %% [markdown]
# The gap between the gains is in the baselines: with the pool, both land near the trace's
# ceiling. Why Mooncake's cache-aware local caches keep less than one 3M cache does on the whole
# trace (Fig. 9) the paper does not say; a guess is that its scheduler also spreads load over the
# prefill nodes, which splits sessions. The router here weighs each replica's queue against the
# prefill it would save, and on this trace that sends most sessions back to the replica that served
# them: it keeps most prefixes without any pool. How much a shared pool adds depends mostly on how
# sticky the routing without it can afford to be.
#
# **At the rates this machine measured.** The same replay once more, pricing with numbers measured
# here instead of a modelled cluster: the tiny model recomputing at the prefill rate measured on this
# CPU, and fetching at the rate the remote tier's signed gets reached (section "Measured" below), so
# the tier's own speed decides, request by request, whether a prefix in the pool is fetched or
# recomputed. Every mode still has the same memory: own caches against the same caches shared. A
# CPU prefills thousands of times slower than eight A800s, so the trace is slowed down to match.

# %%
replay = vks.recorded("kvstore_replay")
if replay and "measured" in replay:
    m = replay["measured"]
    print(f"{m['model']}: {m['kv_bytes_per_token'] / 1024:.0f} KiB of KV per token, recomputed at "
          f"{m['tflops'] * 1e3:.1f} GFLOP/s, fetched at {m['link_gbps']:.2f} GB/s; the trace's arrival times "
          f"stretched {m['time_stretch']:.0f}x, so that {max(r['replicas'] for r in m['rows'])} replicas without "
          "a cache would be busy half of the time")
    display(Markdown(vks.measured_replay_table(replay)))

# %% [markdown]
# ## 8. Which blocks leave first
#
# A pool is memory too: when it is full, blocks must leave. Mooncake's master evicts by an
# approximate LRU (a share of the least recently used blocks once the pool is 90% full), and each
# replica's own cache chooses what it drops as well. The tables below (recorded) replay one cache
# of 1M, 3M and 10M tokens on four traces: Mooncake's synthetic trace, chapter 06's generated agent
# workload (24 coding-agent sessions of 40 tool calls), and two generated chat traces with
# conversation ids, turn counts, think times and message lengths drawn from published statistics
# (LMSYS-Chat-1M: 2.0 turns and 69.5-token prompts on average; Wang et al. 2025: most reuses within
# 10 minutes). Each cell is a policy's hit ratio and, in brackets, its share of the gap between LRU
# and Belady (who evicts the block used farthest in the future, knowing the whole trace): LRU is 0%
# and Belady 100% by definition; a negative share is worse than LRU. A hit needs the *whole*
# prefix: when a prompt is longer than the cache, LRU — touching a request's root first — evicts
# the root first and loses every hit below it.
#
# The policies: **LFU** evicts the least-used block; **S3-FIFO** lets new blocks through a small
# queue and promotes only those used again; **ARC** balances a recency list against a frequency list
# and moves the boundary by what it misses; **agent** is chapter 06's policy. Three policies of
# `kvcache.eviction` count time in requests and cut chains from the tail: `chain` (recency plus a
# bonus per reuse), `reuse` (Belady with a guessed future: next use = last use + last reuse gap)
# and `adaptive` (the two side by side; whichever one's shadow cache hits more lately picks each
# victim).
#
# **`conversation`** is chosen in advance for every trace and uses only what a server knows when it
# evicts: which conversation a request belongs to, how many turns it has had, how long it has been
# idle, each block's position in its request, the request's size and its answer's length. From the
# turns seen so far it learns the share of conversations like this one that came back, how that
# share falls as the conversation stays idle, and how many blocks at a request's end the next turn
# rewrites; a block is worth the chance that it is read again, and the least valuable block of a
# sample of conversations leaves first. `learned` is the same policy with a small logistic
# regression guessing continuation, trained on trace A and used unchanged on the others.
# `knows_whether` is not a policy: it is `conversation` told from the future *whether* each
# conversation comes back (but not when) — how far predicting continuation alone could go.

# %%
gaps = vks.recorded("kvstore_policy_gap")
if gaps:
    for name, d in gaps["traces"].items():
        display(Markdown(vks.gap_table(d["rows"], vks.TRACE_LABELS.get(name, name),
                                       ["lru", "lfu", "arc", "chain", "adaptive", "conversation", "learned",
                                        "knows_whether", "belady"])))
    print("\n".join(vks.policy_words(gaps)))

# %% [markdown]
# The measure LPC (Yang et al., NeurIPS'25, the strongest published policy for conversation caches)
# reports is how much smaller a cache reaches LRU's hit ratio; they find 18–47% less on their traces.
# The same measure for `conversation`, from replays at 40%, 60% and 80% of each capacity:

# %%
if gaps:
    display(Markdown(vks.savings_table(gaps)))

# %% [markdown]
# ## Measured: the store's bandwidth
#
# Fetching pays when its bytes travel faster than their FLOPs compute. Below, put and get over TCP
# loopback on the 2-core CPU machine (recorded). The *M3-shaped layer* is one layer of the M3-like
# model this workbook builds: GQA with 64 query and 4 KV heads of 128, and MSA attending 2,048
# selected tokens — so a token's recompute stops growing with the context while its KV is small.

# %%
bw = vks.recorded("kvstore_bandwidth")
if bw:
    vks.plot_bandwidth(bw)
    plt.show()

# %% [markdown]
# The engine does not call the client directly: its remote tier packs each block with its header
# and tag into a buffer registered with the client once, and moves a whole batch with the client's
# zero-copy calls (`batch_put_from` / `batch_get_into`). Below, recorded in one run and interleaved
# repeat by repeat, the raw client (bytes in and out, and zero-copy from a registered buffer) and
# the tier (signed with the pool's secret, and checksum only), in MiB/s, with the tier's time over
# the faster raw path. Fetch-or-recompute is priced at the tier's rate, what the engine really gets.

# %%
if bw and "tier" in bw:
    display(Markdown(vks.tier_table(bw)))
    print("\n".join(vks.tier_words(bw) + vks.bandwidth_words(bw)))

# %% [markdown]
# ## Exercises
#
# Four exercises: two about the price, two about the store itself. Solutions are in
# `minimax_lab.exercises.solutions.ch07`; try first. Each checker draws fresh cases, says what it
# expected and why, and turns away an answer that calls the package's own function: under any name,
# as a method, in another thread or in another process.
#
# **07.1 — fetch or recompute.** The rule every replica applies to a prompt (section 4). The checker
# compares seconds and tokens with `PrefillCost.plan` on fresh prompts, links and chips.

# %%
def fetch_or_recompute(n_tokens: int, local: int, pool: int, shape: LayerShape, link_gbps: float,
                       tflops: float, mfu: float = 0.5) -> tuple[float, int, int]:
    """Serve a prompt of ``n_tokens``: its first ``local`` tokens are cached on this replica and
    cost nothing; its first ``pool`` tokens are in the shared pool. Return
    ``(seconds, tokens fetched, tokens computed)`` with seconds = fetch time + compute time.

    Fetching ``k`` tokens moves ``k * shape.kv_bytes_per_token()`` bytes at ``link_gbps`` GB/s
    (1e9 bytes/s); computing tokens ``[a, b)`` costs ``shape.prefill_flops(a, b)`` FLOPs at
    ``tflops * mfu`` TFLOP/s (1e12 FLOP/s). Fetch the pool's tokens beyond ``local`` (all of them)
    only if moving them is faster than computing them; compute every token after that."""
    raise NotImplementedError  # your code here


exercises.check("07.1", fetch_or_recompute)

# %% [markdown]
# **07.2 — the longest prefix in the pool.** Before fetching, a replica asks how much of a prompt the
# pool can serve (section 4's probe). The checker's pool answers like Mooncake's client and counts your
# calls: one `batch_is_exist` per prompt.

# %%
def pool_prefix(client, keys: list[str]) -> int:
    """How many leading ``keys`` (the pool keys of a prompt's pages, in order) the pool holds.

    Ask with **one** call, ``client.batch_is_exist(keys)``: it returns one code per key, 1 present,
    0 absent, a negative number an error (the pool cannot vouch for that block: count it absent).
    A prefix stops at the first key that is not present. If the call raises (the pool is down),
    the pool serves nothing: return 0."""
    raise NotImplementedError  # your code here


exercises.check("07.2", pool_prefix)

# %% [markdown]
# **07.3 — serve only what you can verify.** Section 6's corrupted value was caught here. The checker
# hands you a good value and eleven damaged ones (flipped bytes, a lost tail, a forged header, another
# page, model or dtype): serve the first, none of the others.

# %%
def read_block(value: bytes, name: bytes, model: str, dtype: torch.dtype, shape: tuple) -> torch.Tensor | None:
    """The tensor in ``value`` (bytes a replica got from the pool for page ``name``), or None when
    it must not be served. Never raise: a damaged value is a miss, recomputed.

    The value is ``MAGIC`` (8 bytes, ``b"MMLKVv02"``) | the header's length (4 bytes, little-endian
    unsigned) | the header (JSON: ``model``, ``hash`` = ``name.hex()``, ``dtype`` such as
    ``"float32"``, ``shape`` a list, ``nbytes`` the payload's length) | the payload (the tensor's raw
    bytes) | a checksum (32 bytes: ``hashlib.blake2b(header + payload, digest_size=32)``). Serve it
    only if every part checks: the magic, the checksum, a header naming this ``name``, ``model``,
    ``dtype`` and ``shape``, and a payload of exactly the bytes such a tensor has."""
    raise NotImplementedError  # your code here


exercises.check("07.3", read_block)

# %% [markdown]
# **07.4 — fetch here or go there.** The router of section 4. The checker compares with the package's
# router on fresh fleets; price each replica with your 07.1, not with `cost.plan`.

# %%
def pick_replica(n_tokens: int, local: list[int], pool: int, queue_s: list[float], cost: PrefillCost) -> int:
    """The index of the replica that finishes a prompt of ``n_tokens`` first. Replica ``r`` first
    works through its queue (``queue_s[r]`` seconds), then serves the prompt with ``local[r]``
    tokens cached on it and ``pool`` tokens in the shared pool, by 07.1's rule on ``cost``'s shape,
    link, TFLOP/s and MFU (your ``fetch_or_recompute`` of 07.1). Ties go to the lower index."""
    raise NotImplementedError  # your code here


exercises.check("07.4", pick_replica)

# %% [markdown]
# ## What limits us
#
# Everything here runs over TCP on one machine, so the link is the loopback stack, not RDMA between
# machines, and no GPU is involved: the H200 and the A800 nodes are models, and the simulation
# prices fetches and prefill with a model. The pool keeps one copy of a block (Mooncake replicates
# hot ones) and evicts by its approximate LRU. Eviction that knows conversations closes most of the
# gap to Belady only where the cache holds most of what comes back (section 8); at small
# capacities what Belady knows is *when* a conversation returns, and no online signal here predicts
# that well: even knowing *whether* each conversation continues leaves much of the gap open.
#
# ## Links
#
# **Previous:** [06 · A paged KV cache for agents](06_paged_kv_cache_for_agents.ipynb) · **Next:** [08 · A kernel bench that hacks cannot fool](08_kernel_bench_that_hacks_cannot_fool.ipynb)
#
# **Package code used here:** `minimax_lab.kvcache.store`, `minimax_lab.kvcache.remote`, `minimax_lab.engine.replicas`, `minimax_lab.kvcache.routing`, `minimax_lab.engine.store_faults`, `minimax_lab.kvcache.pool_sim`, `minimax_lab.kvcache.policy_gap`, `minimax_lab.kvcache.eviction`, `minimax_lab.engine.slice`, `minimax_lab.viz.kvstore`

# %%
for r in replicas:
    r.stop()
if server:
    server.stop()
