# %% [markdown]
# # 07 · The KV cache as a distributed store
#
# **What this chapter builds:** a shared KV pool on Mooncake Store beside the paged cache: engine replicas in separate processes that fetch a prefix another replica computed, a router that prices "fetch here" against "go there", prefill handing a prompt to decode, faults that cost only recomputation, and the same rules replayed at 1–64 replicas.
#
# **It assumes:** [06 · A paged KV cache for agents](06_paged_kv_cache_for_agents.ipynb) (pages, chained page names, tiers, `break_even`).
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/07_kv_cache_as_a_distributed_store.ipynb)
#
# An agent session of 500k tokens is a few hundred GB of KV. No single GPU keeps every session's
# cache, and the replica that holds one is often busy. Chapter 06 sent the request *to* the cache;
# Mooncake (Qin et al., FAST'25, Kimi's serving system) also sends the cache *to* the request: every
# replica puts its blocks into a pool made of all machines' DRAM, and any replica fetches them.
# Page names are already global content addresses — a chained hash of every token up to the end of
# the page — so the pool needs no coordination about *what* a block is, only *where* it lives.

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
from minimax_lab.engine.slice import PagedEngine
from minimax_lab.kvcache import store as mc
from minimax_lab.kvcache.pool_sim import MODES, simulate_pool
from minimax_lab.engine.replicas import PoolRouter, prefill_decode, start_replicas
from minimax_lab.kvcache.routing import PrefillCost
from minimax_lab.engine.store_faults import fault_drill
from minimax_lab.kvcache.tiers import M3_LAYER, LayerShape, break_even, tiny_model_shape
from minimax_lab.kvcache.trace import find_trace, read_trace
from minimax_lab.model.train import load_pretrained
from minimax_lab.notebook import words
from minimax_lab.viz import kvstore as vks

P = runtime.resolve_preset(preset)

# %% [markdown]
# ## 1. The idea: a ladder whose last rung is shared
#
# Each replica keeps its tiers (chapter 06); below them all lies one pool. A replica that computes
# a page puts it under its name; any replica that misses on its own tiers asks the pool first and
# computes only what the pool does not have.

# %%
vks.draw_pool()
plt.show()

# %% [markdown]
# A block's key is its page name plus its *format* (model, dtype, block shape); its value carries
# the disk tier's header and checksum, so a damaged or foreign value is a miss, never served. Every
# call has a deadline: a pool that is down costs recomputation, nothing else.
#
# ## 2. Start a pool and two replicas
#
# `StoreServer` starts Mooncake's master, its metadata server and a *pool node* (a process that
# only lends memory) on 127.0.0.1. Each replica is a separate process with its own paged cache.

# %%
server, why = mc.start_store(pool_bytes=128 << 20)
print("Mooncake Store:", why or f"master at {server.master_address}")
replicas = start_replicas(server, 2, page_size=16, timeout_s=1.0, retry_s=0.3) if server else []
model, cfg = load_pretrained()
single = PagedEngine(model, num_pages=512, page_size=16)          # one process, no pool: the reference
ref_ids = iter(range(10**6))
reference = lambda tokens, n: single.generate(("ref", next(ref_ids)), tokens, n)  # noqa: E731
rng = random.Random(2026)
prompt = lambda n: [rng.randrange(4, cfg.vocab_size) for _ in range(n)]  # noqa: E731
print(f"{len(replicas)} replicas, logs in {server.log_dir if server else '-'}")

# %% [markdown]
# ## 3. Replica B reuses what replica A computed
#
# A computes a 131-token prompt and publishes its full pages. B gets a longer prompt that starts
# the same way: it fetches those pages and computes only the rest.

# %%
base = prompt(131)
longer = base + prompt(25)
if replicas:
    a = replicas[0].generate(base, 6)
    b = replicas[1].generate(longer, 6)
    print(f"A: computed {a['computed']}, fetched {a['fetched']}")
    print(f"B: computed {b['computed']}, fetched {b['fetched']}")
    print("tokens equal to one process:", a["tokens"] == reference(base, 6), b["tokens"] == reference(longer, 6))

# %% [markdown]
# ## 4. Fetch here, or go there?
#
# The router asks each replica what it holds and the pool what it holds, then prices each replica:
# its queue, plus fetching what the pool has beyond its own cache (if that beats recomputing it),
# plus computing the rest. The price is `break_even`'s model: KV bytes over the link against the
# FLOPs of the span. Three cases below: both idle, replica A busy, and A busy behind a link far
# slower than computing.

# %%
fresh = prompt(120)
if replicas:
    replicas[0].generate(fresh, 2)                 # only replica A (and the pool) holds this one
    for link, busy in ((100.0, [0.0, 0.0]), (100.0, [5.0, 0.0]), (1e-9, [5.0, 0.0])):
        router = PoolRouter(replicas, PrefillCost(tiny_model_shape(cfg), link_gbps=link, tflops=0.01), queue_s=list(busy))
        r, plan = router.route(fresh + [7])
        print(f"link {link:g} GB/s, queues {busy}: replica {r}, fetch {plan['fetch']}, compute {plan['compute']}")

# %% [markdown]
# ## 5. Prefill hands the prompt to decode
#
# Disaggregation: one replica only prefills, another only decodes. The prefill replica publishes
# every page — the last, partial one too, named by the same chained hash of its tokens — and the
# decode replica adopts them without computing a single prompt token.

# %%
if replicas:
    p = prompt(75)
    out = prefill_decode(replicas[0], replicas[1], p, 8)
    print("prefill computed", out["prefill"]["computed"], "| decode computed", out["decode"]["computed"],
          "fetched", out["decode"]["fetched"])
    print("equal to one process doing both:", out["tokens"] == reference(p, 8))

# %% [markdown]
# ## 6. Kill the master
#
# The master goes away mid-run. Replica B asks for a prompt whose prefix A had published: the pool's
# calls fail, B recomputes, and its tokens do not change. Then every fault of the drill, counted.

# %%
if server:
    base2 = prompt(96)
    replicas[0].generate(base2, 4)
    server.kill_master()
    b = replicas[1].generate(base2 + [9, 9], 4)
    print(f"master down: fetched {b['fetched']}, recomputed {b['computed']}, equal:", b["tokens"] == reference(base2 + [9, 9], 4))
    server.restart_master()
    rows = fault_drill(server, replicas, reference, trials=1, seed=7)
    display(Markdown(vks.fault_table(rows)))

# %% [markdown]
# ## 7. At scale, by simulation
#
# The same rules over Mooncake's synthetic trace (3,993 requests, ~15k tokens each), LLaMA3-70B on
# 8×A800-like nodes, 3M tokens of cache per replica, the pool = all replicas' caches together: the
# setting of Mooncake's evaluation. A replica prefills one request at a time; TTFT = wait + fetch +
# compute.

# %%
trace = read_trace(find_trace())[:1200]
counts = runtime.pick(P, cpu=(2, 8, 32), gpu=(1, 2, 4, 8, 16, 32, 64))
sim = [simulate_pool(trace, replicas=n, mode=m, local_capacity_tokens=3_000_000, pool_capacity_tokens=n * 3_000_000).as_dict()
       for n in counts for m in MODES]
vks.plot_replay(sim, f"Mooncake's synthetic trace, first {len(trace)} requests (simulated)")
plt.show()

# %% [markdown]
# Mooncake reports, on 10 prefill nodes with 3M tokens each, a shared pool raising the hit rate
# 2.36× over local caches with cache-aware scheduling on this synthetic workload, and cutting
# prefill GPU time by 48% (FAST'25, Fig. 10). The recorded full replay (all 3,993 requests) at 10
# replicas:

# %%
rec = vks.recorded("kvstore_replay")
if rec:
    at10 = {r["mode"]: r for r in rec["rows"] if r["replicas"] == 10}
    pool, aware, rr = (at10[m]["hit_ratio"] for m in ("pool_priced", "isolated_aware", "isolated_rr"))
    print(f"shared pool {pool:.1%} of tokens not recomputed; own caches with cache-aware routing {aware:.1%} "
          f"({pool / aware:.2f}x); round-robin {rr:.1%} ({pool / rr:.2f}x)")
    print(vks.between_words(2.36, pool / aware, pool / rr, "Mooncake's 2.36x"))

# %% [markdown]
# Our cache-aware router sends a session back to the replica that served it whenever the queue
# allows, which already keeps most prefixes on this trace; Mooncake's local baseline also balances
# load across its prefill nodes.
#
# ## 8. Which blocks leave first
#
# The share of the LRU → Belady gap each policy closes, recorded on the full trace and on the
# generated agent workload. A hit needs the *whole* prefix: when a prompt is longer than the cache,
# LRU — touching a request's root first — evicts the root first and loses every hit below it.
# Three policies of `kvcache.eviction` count time in requests and cut chains from the tail:
# `chain` (recency plus a bonus per reuse), `reuse` (Belady with a guessed future: next use = last
# use + last reuse gap) and `adaptive` (the two side by side; whichever one's shadow cache hits more
# lately picks each victim).

# %%
gaps = vks.recorded("kvstore_policy_gap")
if gaps:
    for name, label in (("synthetic", "Mooncake's synthetic trace"), ("agent", "agent workload")):
        display(Markdown(vks.gap_table(gaps[name], label)))
        print(vks.gap_summary(gaps[name], label))

# %% [markdown]
# ## On a GPU
#
# Fetching pays when its bytes travel faster than their FLOPs compute. Below, put and get over TCP
# loopback (the CPU machine, recorded) and the break-even link speed for the M3-shaped layer on an H200.

# %%
bw = vks.recorded("kvstore_bandwidth")
if bw:
    vks.plot_bandwidth(bw)
    plt.show()
    link = max(r["get_gbps"] for r in bw["rows"])
    m3 = break_even(M3_LAYER, link_gbps=link, gpu_tflops=989, context=32768)
    print(f"M3-shaped layer at 32k: fetching at {link:.2f} GB/s is {words.speed(m3['t_fetch_s'], m3['t_recompute_s'])} "
          f"recomputing on an H200; break-even at {m3['break_even_gbps']:.1f} GB/s")

# %% [markdown]
# ## Exercises
#
# Three exercises about the store itself. Solutions are in `minimax_lab/exercises/solutions/ch07.py`;
# try first. Each checker draws fresh cases and says what it expected.
#
# **07.1 — fetch or recompute.** The rule every replica applies to a prompt (section 4).

# %%
def fetch_or_recompute(n_tokens: int, local: int, pool: int, shape: LayerShape, link_gbps: float,
                       tflops: float, mfu: float = 0.5) -> tuple[float, int, int]:
    """A prompt of ``n_tokens``; ``local`` tokens are cached on this replica, ``pool`` tokens (a
    prefix too) in the shared pool. Return (seconds, tokens fetched, tokens computed).

    Fetching ``k`` tokens moves ``k * shape.kv_bytes_per_token()`` bytes at ``link_gbps`` GB/s;
    computing tokens ``[a, b)`` costs ``shape.prefill_flops(a, b)`` FLOPs at ``tflops * mfu``
    TFLOP/s. Fetch the pool's tokens beyond ``local`` only if that is faster than computing them."""
    raise NotImplementedError  # your code here


exercises.check("07.1", fetch_or_recompute)

# %% [markdown]
# **07.2 — the pool key.** A page name is a content address of the *tokens*; the pool must also tell
# apart the same tokens through another model, dtype or page layout.

# %%
def block_key(name: bytes, model: str, dtype: torch.dtype, block_shape: tuple) -> str:
    """The key under which a block lives in the shared pool: a string that is equal for equal
    (name, model, dtype, block_shape) and differs when any of them differs. ``name`` is the page's
    chained content hash (16 bytes)."""
    raise NotImplementedError  # your code here


exercises.check("07.2", block_key)

# %% [markdown]
# **07.3 — fetch here or go there.** The router of section 4, with your price or the package's.

# %%
def pick_replica(n_tokens: int, local: list[int], pool: int, queue_s: list[float], cost: PrefillCost) -> int:
    """The index of the replica where a prompt of ``n_tokens`` is done soonest: its queue
    ``queue_s[r]`` plus ``cost.plan(n_tokens, local[r], pool)[0]`` seconds (``local[r]``: tokens
    replica r caches; ``pool``: tokens in the shared pool). Ties go to the lower index."""
    raise NotImplementedError  # your code here


exercises.check("07.3", pick_replica)

# %% [markdown]
# ## What limits us
#
# Everything here runs over TCP on one machine, so the link is the loopback stack, not RDMA between
# machines; the simulation prices fetches and prefill with a model, not a GPU. The pool keeps one
# copy of a block (Mooncake replicates hot ones) and evicts by its own LRU. On Mooncake's traces every
# online eviction policy stays far from Belady: which once-seen block comes back soon is what it
# cannot know.
#
# ## Links
#
# **Previous:** [06 · A paged KV cache for agents](06_paged_kv_cache_for_agents.ipynb) · **Next:** [08 · A kernel bench that hacks cannot fool](08_kernel_bench_that_hacks_cannot_fool.ipynb)
#
# **Package code used here:** `minimax_lab/kvcache/store.py`, `minimax_lab/kvcache/remote.py`, `minimax_lab/engine/replicas.py`, `minimax_lab/kvcache/routing.py`, `minimax_lab/engine/store_faults.py`, `minimax_lab/kvcache/pool_sim.py`, `minimax_lab/kvcache/policy_gap.py`, `minimax_lab/kvcache/eviction.py`, `minimax_lab/engine/slice.py`, `minimax_lab/viz/kvstore.py`

# %%
for r in replicas:
    r.stop()
if server:
    server.stop()
