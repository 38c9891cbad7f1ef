# %% [markdown]
# # 07 · The KV cache as a distributed store
#
# **What this chapter builds:** a KV pool shared by engine replicas on Mooncake Store: replicas in separate processes that fetch a prefix another one computed, the rule that decides between fetching and recomputing, a router that weighs "go there" against "fetch here", prefill handing a prompt to decode, faults that cost only recomputation, and the same rules replayed over many replicas.
#
# **It assumes:** [06 · A paged KV cache for agents](06_paged_kv_cache_for_agents.ipynb) (pages, chained page names, tiers, `break_even`).
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/07_kv_cache_as_a_distributed_store.ipynb)
#
# **Why a pool.** An agent session of 500k tokens holds over 100 GB of KV (section 1 computes it):
# more than a GPU keeps beside the weights, and the session's next turn may land on a replica that
# never saw it. There are two answers. *Go there*: a cache-aware router (SGLang's router does this)
# sends the request to the replica that holds its prefix — unless that replica is busy. *Fetch
# here*: Mooncake (Qin et al., FAST'25, the serving system of Kimi) puts every replica's blocks into
# a pool made of all machines' memory, and any replica fetches them (LMCache does the same for
# vLLM). This chapter builds the second and weighs it against the first.

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
import os
from dataclasses import replace

import blake3
import matplotlib.pyplot as plt
import torch
import xxhash
from IPython.display import Markdown, display

from minimax_lab import exercises
from minimax_lab.engine.replicas import PoolRouter, page_names, prefill_decode, start_replicas
from minimax_lab.engine.store_faults import fault_drill
from minimax_lab.kvcache import store as mc
from minimax_lab.kvcache.cost import MINIMAX_M2, LayerShape, PrefillCost
from minimax_lab.kvcache.eviction import EvictionPolicy
from minimax_lab.kvcache.pool_sim import MODES, mooncake_comparison, simulate_pool
from minimax_lab.kvcache.pool_value import ValueCodec
from minimax_lab.kvcache.remote import block_format
from minimax_lab.kvcache.trace import find_trace, read_trace
from minimax_lab.kvcache.workloads import conversation_workload
from minimax_lab.viz import kvstore as vks, kvstore_eviction as vev, kvstore_scale as vsc

lab = vks.setup(preset)   # the preset, the tiny model's one-process reference, a seeded prompt drawer, the records

# %% [markdown]
# ## 1. The idea: a ladder whose last rung is shared
#
# Each replica keeps its tiers (chapter 06: GPU pages, host memory, local disk); below them all
# lies one pool. A replica that computes a page *puts* it under its name; a replica that misses on
# its own tiers asks the pool which of the prompt's pages it holds (*is_exist*), *gets* those, and
# computes only the rest. The pool has two parts: the **master** keeps the map from each key to the
# machine whose memory holds its bytes, and evicts (an approximate LRU) when the pool is full; the
# memory is lent by the machines. A client asks the master where a key lives, then moves the bytes
# straight from that machine: over RDMA between machines, over TCP here.

# %%
print(vks.session_kv_words(MINIMAX_M2, 500_000))
vks.draw_pool()
plt.show()

# %% [markdown]
# ## 2. A block in the pool: name, key, value
#
# **The name** of a page hashes its tokens *and the name of the page before it*, so it stands for
# the whole prefix up to the page's end. Two replicas that saw the same prefix compute the same
# names without asking anyone; change the first token and every name after it changes. A page that
# is not full yet has no name: its tokens will still change.

# %%
tokens = lab.prompt(40)
names = page_names(tokens, 16)                        # two full pages; the last 8 tokens are not named yet
same_start = page_names(tokens[:32] + lab.prompt(5), 16)
first_changed = page_names([tokens[0] + 1] + tokens[1:], 16)
print(", ".join(f"page {i + 1}'s name: {n.hex()}" for i, n in enumerate(names)))
print("same 32 first tokens, another tail -> same names:", same_start == names)
print("first token changed -> page 2's name changes too:", first_changed[1] != names[1])

# %% [markdown]
# **The key** adds the block's *format* — a short digest of the model, dtype, block shape and who
# signs — so a replica running other weights or another layout never finds a block it cannot use.
#
# **The value** must be checked before it is served: its bytes may be torn by a crash, flipped by a
# bug, or written by anyone who can reach the pool. A checksum catches the first two, not the third:
# a writer can recompute it. So the pool has a secret (32 random bytes drawn when it starts,
# readable only by its owner), and each value ends with a **tag**: BLAKE3 in keyed mode over
# everything before it, a message authentication code only a holder of the secret can compute.
# Values are packed straight into a buffer registered with the client, which moves a whole batch
# of them without copying (Mooncake's `batch_put_from` / `batch_get_into`).

# %%
secret = os.urandom(32)                                   # the pool's secret
block = torch.randn(2, lab.cfg.n_layers, 16, lab.cfg.n_kv_heads, lab.cfg.head_dim)   # (K|V, layer, token, head, dim)
codec = ValueCodec("tiny", block.dtype, block.shape, secret)
print("key:  ", f"mmlkv-{block_format('tiny', block.dtype, block.shape, secret)}-{names[0].hex()}")
value = codec.encode(names[0], block)
print("value:", vks.value_layout(value, codec.tag_bytes))

# %% [markdown]
# A replica serves a value only if `codec.decode(value, name)` accepts it: the right length, the
# whole header (this name, model, dtype and shape) and the tag are exactly what it would write.
# Four values that must not be served, and what happens in a pool without a secret:

# %%
evil = value[:-32 - 4] + bytes(4)                         # a writer zeroes the payload's last 4 bytes
flipped = bytearray(value)
flipped[len(value) // 2] ^= 1
cases = {"the value as written": value,
         "one payload byte flipped": bytes(flipped),
         "another page's value, put under this key": codec.encode(names[1], block),
         "payload changed, tag recomputed without the key": evil + blake3.blake3(evil).digest(),
         "payload changed, tag keyed with a guessed secret": evil + blake3.blake3(evil, key=os.urandom(32)).digest()}
print("\n".join(vks.served_lines(cases, lambda v: codec.decode(v, names[0]))))
plain = ValueCodec("tiny", block.dtype, block.shape)       # no secret: the tag is an xxh3 checksum
evil = plain.encode(names[0], block)[:-16 - 4] + bytes(4)
print(vks.served_lines({"no secret: payload changed, checksum recomputed": evil + xxhash.xxh3_128_digest(evil)},
                       lambda v: plain.decode(v, names[0]))[0])

# %% [markdown]
# ## 3. Start a pool and two replicas
#
# `mc.start_store` starts a `StoreServer` — Mooncake's master, its metadata server (how clients find
# one another) and a *pool node* (a process that only lends memory) on 127.0.0.1 — or says why it
# cannot. Each replica is a process of its own running the tiny model on its own paged cache, with
# the pool as its last tier. None of these processes outlives this notebook's kernel.

# %%
server, why = mc.start_store(pool_bytes=128 << 20)
replicas = start_replicas(server, 2, page_size=16, timeout_s=1.0, retry_s=0.3) if server else []
print(vks.store_status(server, why, replicas))

# %% [markdown]
# ## 4. Replica B reuses what replica A computed
#
# A computes a 131-token prompt — 8 full pages of 16 and a last page of 3 — and publishes its full
# pages. B gets a longer prompt that starts the same way: it computes the same names, finds 8 in the
# pool, fetches them and computes the rest, A's 3 tokens of the unfinished page included. Both
# answers are compared token for token with one process that has no pool.

# %%
base = lab.prompt(131)
longer = base + lab.prompt(25)
if replicas:
    a = replicas[0].generate(base, 6)
    b = replicas[1].generate(longer, 6)
    print(f"A: computed {a['computed']}, fetched {a['fetched']}")
    print(f"B: fetched {b['fetched']} (A's full pages), computed {b['computed']} = {len(base) - b['fetched']} tokens "
          f"of A's unfinished page + {len(longer) - len(base)} new")
    print("tokens equal to one process:", a["tokens"] == lab.reference(base, 6), b["tokens"] == lab.reference(longer, 6))
else:
    print(vks.SKIPPED)

# %% [markdown]
# ## 5. Fetch or recompute
#
# A prefix in the pool is not free: its KV must cross the link. Recomputing it is not free either:
# a token at position `p` pays its projections and FFN plus attention over the `p` tokens before it.
# The bytes per token are fixed; the FLOPs per token grow with the position. So for the span the
# pool could serve, beyond what this replica caches, the rule compares two times:

# %%
def fetch_pays(shape: LayerShape, a: int, b: int, link_gbps: float, flop_s: float) -> bool:
    """Tokens [a, b) are in the pool, not cached here: is moving their KV faster than recomputing them?"""
    move_s = (b - a) * shape.kv_bytes_per_token() / (link_gbps * 1e9)
    compute_s = shape.prefill_flops(a, b) / flop_s
    return move_s < compute_s


cost = lab.cost                      # the replicas' tiny model at the rates recorded on the CPU machine (below)
slow = vks.break_even_gbps(cost, 0, 112) / 4       # a quarter of the link rate at which fetching 112 tokens pays
for a, b, link in ((0, 112, cost.link_gbps), (0, 112, slow), (0, 16384, slow)):
    mine = fetch_pays(cost.shape, a, b, link, cost.tflops * 1e12 * cost.mfu)
    package = replace(cost, link_gbps=link).plan(b + 9, a, b)[1] > 0     # PrefillCost.plan: (s, fetched, computed)
    print(f"tokens {a}-{b}, link {link:.3g} GB/s: fetch_pays {mine}, PrefillCost.plan fetches {package}")

# %% [markdown]
# The last two lines show the growth: over the same slow link, the short prefix is recomputed and
# the long one fetched. Which side wins depends on two rates. The
# link's, recorded on the 2-core CPU machine over TCP loopback: the raw Mooncake client and the
# remote tier (which packs, signs and checks every block) moving the same batches, interleaved
# repeat by repeat, in MiB/s (the last two columns: how many times longer the tier takes than the
# faster raw path):

# %%
display(Markdown(vks.tier_table(lab.records["kvstore_bandwidth"])))
print("\n".join(vks.tier_words(lab.records["kvstore_bandwidth"])))

# %% [markdown]
# The record keeps the median of each cell and no spread, so on this busy machine read only the
# range. Signing is the price of a pool that cannot be made to serve a forged tensor. Now both
# rates side by side, per token: the tiny model recomputing on the CPU machine, and one layer shaped like
# this workbook's M3-like model (64 query and 4 KV heads of 128, sparse attention over 2,048
# selected tokens, chapter 03) on a modelled H200.

# %%
vks.plot_break_even(lab.records["kvstore_bandwidth"], lab.cfg)
plt.show()
print("\n".join(vks.rate_words(lab.records["kvstore_bandwidth"], lab.cfg)))

# %% [markdown]
# A slow processor makes fetching pay even over a slow link; a fast one needs a fast link. Dense attention's
# recompute cost grows with the position, so long prompts favour fetching; sparse attention's grows
# only through its index branch, so for an MSA model a long prompt helps the fetch much less.
#
# ## 6. Go there, or fetch here?
#
# With a pool, the replica holding a prefix is no longer the only one that can use it. The router
# asks each replica what it caches and the pool what it holds, then prices each replica: its queue,
# plus section 5's plan (fetch the pool's part beyond its own cache if that pays, compute the rest),
# and picks the earliest finish. Three cases for a 121-token prompt whose first 7 pages only
# replica A (and the pool) holds: both idle; A busy for 5 s; A busy and the link as slow as
# section 5's.

# %%
fresh = lab.prompt(120)
lo, mid, hi = vks.tier_rates(lab.records["kvstore_bandwidth"])
if replicas:
    replicas[0].generate(fresh, 2)                   # only replica A (and the pool) holds this prefix
    for link, busy in ((mid, [0.0, 0.0]), (mid, [5.0, 0.0]), (slow, [5.0, 0.0])):
        c = replace(cost, link_gbps=link)
        r, plan = PoolRouter(replicas, c, queue_s=list(busy)).route(fresh + [7])
        by_hand = min(range(2), key=lambda i: busy[i] + c.plan(len(fresh) + 1, plan["local"][i], plan["pool"])[0])
        print(f"link {link:.3g} GB/s, queues {busy}: the router picks replica {r}, the rule by hand {by_hand}")
        print("\n".join(vks.route_lines(c, plan, busy, len(fresh) + 1, spread=(lo / mid, hi / mid))))
else:
    print(vks.SKIPPED)

# %% [markdown]
# Idle, the holder wins: it skips the fetch. Busy, fetching beats waiting. Over a slow link, B
# recomputes: a pool is worth only what its link carries. Each verdict is checked at the lowest and
# highest rate the tier measured (the same spread around the slow link), so a choice that flips
# inside that spread is called a tie.
#
# ## 7. Prefill hands the prompt to decode
#
# Disaggregation: one replica only prefills, another only decodes, so long prompts do not stall
# the decode batch. The prefill replica publishes every page, the last, partial one too. Chapter 06
# gives a partial page no name, because it will still grow and a name must describe exactly its
# tokens. A hand-over is a snapshot: the prefill replica names the partial page by the tokens it
# holds *now* and never changes the pool's copy; the decode replica copies the page into its own
# cache and appends to its copy. A longer prompt names that page by more tokens, so it is never
# served the snapshot.

# %%
if replicas:
    p = lab.prompt(75)
    out = prefill_decode(replicas[0], replicas[1], p, 8)
    print("prefill computed", out["prefill"]["computed"], "| decode computed", out["decode"]["computed"],
          "fetched", out["decode"]["fetched"])
    print("equal to one process doing both:", out["tokens"] == lab.reference(p, 8))
else:
    print(vks.SKIPPED)

# %% [markdown]
# ## 8. Faults cost only recomputation
#
# The pool is a cache, never the only copy: whatever it cannot serve is recomputed from the tokens
# every request carries. So the tier turns every failure into a miss. Each call has a deadline; a
# call that fails opens a *circuit*, and for a moment the tier stops asking instead of waiting
# again. A value that fails its tag is removed and recomputed. Below, the master is killed while
# replica A's pages are in the pool; then the drill's other faults once each, and the whole drill
# of three trials each, as recorded (its heading says what the record keeps).

# %%
if server:
    base2 = lab.prompt(96)
    replicas[0].generate(base2, 4)
    server.kill_master()
    b = replicas[1].generate(base2 + [9, 9], 4)
    print(f"master down: fetched {b['fetched']}, recomputed {b['computed']}, equal to one process:",
          b["tokens"] == lab.reference(base2 + [9, 9], 4))
    server.restart_master()
    faults, label = vks.live_faults(lab.P)
    rows = fault_drill(server, replicas, lab.reference, trials=1, seed=7, faults=faults)
    display(Markdown(vks.fault_table(rows, label)))
    print(vks.fault_words(rows))
else:
    print(vks.SKIPPED)
drill = lab.records["kvstore_faults"]
if drill:
    display(Markdown(vks.fault_table(drill["rows"], f"the whole drill, {drill['trials']} trials each ({vks.record_origin(drill)})")))
    print(vks.fault_words(drill["rows"]))

# %% [markdown]
# ## 9. At scale, by simulation
#
# The same rules over Mooncake's synthetic trace (3,993 requests, ~15k tokens each), LLaMA3-70B on
# 8×A800-like nodes, the setting of Mooncake's evaluation. **Every mode has the same memory**: each
# replica caches 3M tokens. With the pool a replica may also fetch from the others' caches — the
# pool *is* their memory together, nothing extra — and keeps what it fetched. A replica prefills one
# request at a time; TTFT = wait + fetch + compute, priced by section 5's model (no GPU runs here).
# The figure draws the recorded sweep from 1 to 64 replicas; the cell re-simulates the point at 10
# replicas to show that the record is what this code computes.

# %%
trace = read_trace(find_trace())
replay = lab.records["kvstore_replay"]               # every count from 1 to 64, recorded by the same code
live = [simulate_pool(trace, replicas=10, mode=m, capacity_tokens=3_000_000).as_dict() for m in MODES]
print(vsc.live_vs_recorded(live, replay))
print(vks.record_origin(replay, "a simulation, deterministic: no spread"))
vsc.plot_replay(replay["rows"], f"Mooncake's synthetic trace, all {len(trace):,} requests (simulated)",
                replay["ceiling_hit_ratio"])
plt.show()
print("\n".join(vsc.replay_notes(replay["rows"])))

# %% [markdown]
# **Against Mooncake's numbers, like for like.** Mooncake's local baseline is cache-aware too: its
# "global scheduler is programmed to direct requests to nodes with higher prefix match ratios"
# (FAST'25, Sec. 5.3.2). So the pair to compare is *own caches, cache-aware* against *shared pool,
# priced routing*, at 10 replicas of 3M tokens each — the published numbers are Fig. 9 and Fig. 10:

# %%
print("\n".join(vsc.mooncake_words(mooncake_comparison(replay))))

# %% [markdown]
# The gap between the gains is in the baselines: with the pool, both land near the trace's
# ceiling. Why Mooncake's cache-aware local caches keep less than one 3M cache does (Fig. 9) the
# paper does not say; a guess is that its scheduler also spreads load over the prefill nodes, which
# splits sessions. The router here weighs each replica's queue against the prefill it would save,
# and on this trace that sends most sessions back to the replica that served them. How much a
# shared pool adds depends mostly on how sticky the routing without it can afford to be.
#
# **At the rates this machine measured.** The same replay, recorded, priced with section 5's
# recorded rates instead of a modelled cluster, so the tier's own speed decides per request whether
# a prefix in the pool is fetched or recomputed. The CPU prefills far slower than eight A800s, so
# the trace's arrival times are stretched (by the factor printed):

# %%
display(Markdown(vsc.measured_replay_table(replay)))
print("\n".join(vsc.measured_replay_words(replay)))

# %% [markdown]
# ## 10. Which blocks leave first
#
# A pool is memory too: when it is full, blocks must leave. Mooncake's master evicts by an
# approximate LRU, and each replica's own cache chooses what it drops. The recorded figure below replays one cache
# of 1M, 3M and 10M tokens on four traces: Mooncake's synthetic trace, chapter 06's
# agent workload, and two generated chat traces (A and B) whose turn counts, think times and message lengths
# follow published statistics (LMSYS-Chat-1M: 2.0 turns and 69.5-token prompts on average; Wang et
# al. 2025: most reuses within 10 minutes). The yardsticks are LRU and Belady, who evicts the block
# used farthest in the future, knowing the whole trace: a policy's *share of the gap* is how much of
# the distance between them it covers. A hit needs the whole prefix: when a prompt is longer than the
# cache, LRU, touching a request's first block first, evicts it first and loses every hit below it.
# What each policy compared here keeps, and what it knows when it evicts:

# %%
gaps = lab.records["kvstore_policy_gap"]
display(Markdown(vev.policy_table(gaps)))

# %% [markdown]
# **`conversation`**, this chapter's policy, was chosen in advance for every trace. A block is worth
# the chance that its conversation comes back and reads it again. That chance falls the longer the
# conversation has been idle, as the think times seen so far tell. A conversation's next turn adds
# to its last request, so that request's last, partial block is named anew and almost never read
# again. And since a hit needs the whole prefix, a conversation is cut from its tail, never its root.
# The policy below keeps only these three ideas; the package also learns which kinds of
# conversation return and protects prefixes many conversations share.

# %%
class IdleFirst(EvictionPolicy):
    name = "idle first"

    def __init__(self):     # conversation -> its last arrival, -> {block: depth}; block -> conversation; last blocks
        self.seen, self.owned, self.owner, self.tails = {}, {}, {}, {}

    def begin_request(self, conversation=None, now=None):    # trace replay calls it as a request arrives
        self.conv, self.depth, self.seen[conversation] = conversation, 0, now

    def insert(self, key, t, parent=None):                   # a block of this request: cached, or hit
        self.remove(key)
        self.owner[key], self.depth = self.conv, self.depth + 1
        self.owned.setdefault(self.conv, {})[key] = self.depth
    touch = insert

    def end_request(self, keys, output_tokens=0):            # the next turn names this block anew
        if keys and keys[-1] in self.owner:
            self.tails[keys[-1]] = None

    def remove(self, key):
        self.tails.pop(key, None)
        self.owned.get(self.owner.pop(key, None), {}).pop(key, None)    # out of its conversation's blocks

    def evict(self):
        if self.tails:
            key = next(iter(self.tails))
        else:     # the conversation idle longest: not the one being served while others own blocks
            idle = min((c for c, b in self.owned.items() if b and c != self.conv), key=self.seen.get, default=self.conv)
            key = max(self.owned[idle], key=self.owned[idle].get)
        self.remove(key)
        return key

# %% [markdown]
# Replayed beside the package's policy on two small draws of the generated conversations (the
# generator of traces A and B, with fewer conversations), judged against the draws' disagreement:

# %%
draws = [conversation_workload(600, seed=s).requests for s in (3, 4)]
print("\n".join(vev.sketch_lines(draws, IdleFirst, capacities=(250_000, 500_000))))

# %% [markdown]
# The last part of each line says how much of `conversation`'s gain the three ideas alone already
# carry on small traces. The recorded replays of every policy on the four traces, at three sizes:

# %%
vev.plot_eviction(gaps)
plt.show()
print("\n".join(vev.eviction_words(gaps)))
display(Markdown(vev.all_tables(gaps)))

# %% [markdown]
# Where Belady's lead is wide, what it knows is *when* a conversation returns; no online signal here
# predicts that well. LPC (Yang et al., NeurIPS'25, the strongest published policy for conversation
# caches) reports how much smaller a cache reaches LRU's hit ratio: 18–47% on its traces. The same
# measure here, from replays at 40%, 60% and 80% of each size (rows in the table above):

# %%
print(vev.savings_words(gaps))

# %% [markdown]
# ## Exercises
#
# Four exercises: two about the price, two about the store itself. Solutions are in
# `minimax_lab.exercises.solutions.ch07`; try first. Each checker draws fresh cases, says what it
# expected and why, and turns away an answer that calls the package's own function: under any name,
# as a method, in another thread or in another process.
#
# **07.1 — fetch or recompute.** The rule every replica applies to a prompt (section 5). The checker
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
# pool can serve (section 6's probe). The checker's pool answers like Mooncake's client and counts your
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
# **07.3 — serve only what you can verify.** Section 2's `codec.decode`, written by you: section 8's
# corrupted value was refused by this check. The checker hands you a good value and thirteen bad
# ones (flipped bytes, a lost tail, another page, model or dtype, forged tags, lying headers, an
# older layout): serve the first, none of the others.

# %%
def read_block(value: bytes, name: bytes, model: str, dtype: torch.dtype, shape: tuple,
               secret: bytes) -> torch.Tensor | None:
    """The tensor in ``value`` (bytes a replica got from the pool for page ``name``), or None when
    it must not be served. Never raise: a damaged or forged value is a miss, recomputed.

    The value (section 2's layout) is ``MAGIC`` (8 bytes, ``b"MMLKVp01"``) | the header's length
    (4 bytes, little-endian unsigned) | the header (JSON: ``model``, ``hash`` = ``name.hex()``,
    ``dtype`` such as ``"float32"``, ``shape`` a list, ``nbytes`` the payload's length; padded with
    spaces) | the payload (the tensor's raw bytes) | the tag (32 bytes:
    ``blake3.blake3(everything before the tag, key=secret).digest()``). Serve it only if every part
    checks: the magic, the tag, a header naming this ``name``, ``model``, ``dtype`` and ``shape``,
    and a payload of exactly the bytes such a tensor has."""
    raise NotImplementedError  # your code here


exercises.check("07.3", read_block)

# %% [markdown]
# **07.4 — fetch here or go there.** The router of section 6. The checker compares with the package's
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
# prices fetches and prefill with a model. The tier's rates come from one busy 2-core machine whose
# record keeps medians, not spreads. The pool keeps one copy of a block (Mooncake replicates hot
# ones) and evicts by its approximate LRU. Signing every value costs CPU time a checksum does not.
# Eviction that knows conversations gains most where the cache holds most of what comes back; where
# knowing *whether* a conversation returns closes little of Belady's lead (Mooncake's trace at 1M),
# what Belady knows is *when*, and no online signal here predicts that well.
#
# ## Links
#
# **Previous:** [06 · A paged KV cache for agents](06_paged_kv_cache_for_agents.ipynb) · **Next:** [08 · A kernel bench that hacks cannot fool](08_kernel_bench_that_hacks_cannot_fool.ipynb)
#
# **Read more:** Mooncake (Qin et al., FAST'25, arXiv 2407.00079) and its Store's Python API
# (`batch_put_from`, `batch_get_into`); LMCache (a KV cache layer that shares prefixes across vLLM
# instances); SGLang's cache-aware router; DistServe (Zhong et al., OSDI'24) on splitting prefill
# from decode; BLAKE3 (O'Connor et al., 2020) for keyed hashing; LPC (Yang et al., NeurIPS'25) on
# eviction for conversation caches; Belady (1966) for the optimal offline policy.
#
# **Package code used here:** `minimax_lab.kvcache.store`, `minimax_lab.kvcache.pool_value`, `minimax_lab.kvcache.remote`, `minimax_lab.engine.replicas`, `minimax_lab.kvcache.cost`, `minimax_lab.kvcache.routing`, `minimax_lab.engine.store_faults`, `minimax_lab.kvcache.pool_sim`, `minimax_lab.kvcache.policy_gap`, `minimax_lab.kvcache.eviction`, `minimax_lab.viz.kvstore`, `minimax_lab.viz.kvstore_scale`, `minimax_lab.viz.kvstore_eviction`

# %%
for r in replicas:
    r.stop()
if server:
    server.stop()
display(Markdown(vks.provenance(lab, server)))
