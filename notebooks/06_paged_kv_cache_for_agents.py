# %% [markdown]
# # 06 · A paged KV cache for agents: pages, prefix sharing, eviction, tiers, kernels
#
# **What this chapter builds:** a block manager (pages, block tables, prefix sharing by page names, copy-on-write) and a paged-decode Triton kernel (`tl.dot`, GQA packing, split-K), both grown in cells and checked against the package's; then eviction and host and disk tiers, replayed on chat, agent and Mooncake traffic.
#
# **It assumes:** [02 · FlashAttention in Triton](02_flash_attention_in_triton.ipynb) (online softmax, Triton tiles), [04 · Sparse attention kernels](04_sparse_attention_kernels.ipynb) (merging partial softmaxes by their log-sum-exp) and [00 · Rooflines and honest benchmarks](00_roofline_and_honest_benchmarks.ipynb) (GB/s against the copy ceiling).
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
agent_turns = None     # tool-call turns per agent task in the generated workload (None: 30 on the CPU, 100 on a GPU)
record_steps = False   # on a GPU: keep the timings of section 3's kernels as benchmark records

# %%
import math
import time
from collections import deque

import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

from minimax_lab import exercises, runtime   # runtime first: it picks the Triton interpreter on a CPU
import triton
import triton.language as tl
from minimax_lab.kvcache import BlockManager, EvictionPolicy, KVPages, PoolExhausted
from minimax_lab.kvcache.blocks import page_hash
from minimax_lab.paged_kv import paged_decode
from minimax_lab.viz import kvcache as vkv, paged_steps, prefix_cost
from minimax_lab.viz.block_books import page_states, replay

t_start = time.perf_counter()
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
# ## 2. Pages, block tables and prefix sharing, built in cells
#
# A **block manager** keeps the books of the page pool; it never touches a K/V value except to copy
# a page. We build one in three steps, each checked against the package's `BlockManager`: `replay`
# runs the same operations on both and after each compares their books (sequences, block tables
# page for page, reference counts, page states, copies on write), raising at the first difference.
#
# **Step 1, pages and block tables.** A **free list** holds the pages that hold nothing. A sequence
# gets pages on demand, and its **block table** lists them in order: token `t` sits in page
# `table[t // page_size]` at slot `t % page_size`. A **reference count** per page says how many
# block-table entries point at it; freeing a sequence gives its pages back.

# %%
class PagedBooks:
    def __init__(self, num_pages, page_size):
        self.page_size, self.free_pages = page_size, deque(range(num_pages))   # pages that hold nothing
        self.refcount = [0] * num_pages             # block-table entries pointing at each page
        self.tables, self.tokens = {}, {}           # per sequence: its pages in order, its tokens
        self.name, self.cached, self.names = [None] * num_pages, {}, {}   # names: step 2
        self.cow_copies = 0                         # copies on write: step 3

    def _new_page(self):
        if not self.free_pages:
            raise PoolExhausted("no free page (this manager does not evict)")
        self.refcount[self.free_pages[0]] = 1
        return self.free_pages.popleft()

    def allocate(self, seq, tokens):
        self.tokens[seq], self.names[seq] = list(tokens), []
        self.tables[seq] = [self._new_page() for _ in range(-(-len(tokens) // self.page_size))]
        return 0                                    # tokens found cached: none yet

    def free(self, seq):
        for page in reversed(self.tables.pop(seq)):    # last page first
            self.refcount[page] -= 1
            if self.refcount[page] == 0 and self.name[page] is None:
                self.free_pages.append(page)           # back to the pool (step 2: a named page stays cached)
        del self.tokens[seq], self.names[seq]

# %%
system = list(range(100, 124))                       # a 24-token system prompt: 6 pages of 4 tokens
users = [("allocate", f"user{i}", system + [i] * (3 + 5 * i)) for i in range(4)]
replay(PagedBooks(64, 4), BlockManager(64, 4, prefix_caching=False), users + [("free", "user0")])

# %% [markdown]
# Each line is one operation, what it returned after `->` (for `allocate`, the prompt tokens found
# cached; for `append`, the slot the token's K/V go to), and the books both managers agree on.
# Four users, each holding its own copy of the same system prompt. **Step 2, prefix sharing by
# names.** Each *full* page gets a **name**, the chained content hash `page_hash(name of the page
# before, this page's tokens)`, so a name stands for the whole prefix up to its page. A dictionary
# from name to page is the **prefix cache**. A new request computes its own pages' names one by
# one and looks each up until one is missing (a hit must be a prefix), takes the pages it found,
# one more reference each, and computes K/V only for the rest. A freed page that has a name stays
# **cached** for the next request that starts the same way.

# %%
class SharingBooks(PagedBooks):
    def allocate(self, seq, tokens):
        ps, names = self.page_size, []
        for i in range((len(tokens) - 1) // ps):    # NEW: full pages only (the last token is always computed)
            name = page_hash(names[-1] if names else None, tokens[i * ps:(i + 1) * ps])
            if name not in self.cached:
                break
            names.append(name)
        hits = [self.cached[n] for n in names]
        for page in hits:
            self.refcount[page] += 1                # NEW: shared, not copied
        self.tokens[seq], self.names[seq] = list(tokens), names
        self.tables[seq] = hits + [self._new_page() for _ in range(len(hits), -(-len(tokens) // ps))]
        for i in range(len(hits), len(tokens) // ps):
            self._seal(seq, i)                      # NEW: name the new full pages
        return len(hits) * ps                       # tokens whose K/V are cached: compute only the rest

    def _seal(self, seq, i):                        # page i of seq just filled up: name it
        parent = self.names[seq][i - 1] if i else None
        name = page_hash(parent, self.tokens[seq][i * self.page_size:(i + 1) * self.page_size])
        self.names[seq].append(name)
        if name not in self.cached:                 # the first page with this prefix: later requests find it
            self.cached[name] = self.tables[seq][i]
            self.name[self.tables[seq][i]] = name

# %%
replay(SharingBooks(64, 4), BlockManager(64, 4), users + [("free", "user0")])

# %% [markdown]
# Every user after the first finds the system prompt's pages cached and points at
# them. **Step 3, decoding and copy-on-write.** `append` adds one token, starting a new page when
# the last one is full, and names a page the moment it fills up. `fork` makes a second sequence
# share every page of the first (parallel sampling, an agent's branches), including a partly filled
# last page; the first of the two to append to that page must copy it to a fresh page first
# (**copy-on-write**), so neither sees the other's token.

# %%
class SmallBlockManager(SharingBooks):
    def append(self, seq, token):
        table, n = self.tables[seq], len(self.tokens[seq])
        if n % self.page_size == 0:                 # the last page is full: start a new one
            table.append(self._new_page())
        elif self.refcount[table[-1]] > 1:          # shared and partly filled: copy it first
            self.refcount[table[-1]] -= 1           # (an engine copies the page's K/V here)
            table[-1] = self._new_page()
            self.cow_copies += 1
        self.tokens[seq].append(token)
        if len(self.tokens[seq]) % self.page_size == 0:
            self._seal(seq, len(table) - 1)
        return table[-1] * self.page_size + n % self.page_size   # the slot the token's K/V go to

    def fork(self, parent, child):                  # the child shares every page of the parent
        for books in (self.tables, self.tokens, self.names):
            books[child] = list(books[parent])
        for page in self.tables[child]:
            self.refcount[page] += 1

# %%
ours, theirs = SmallBlockManager(64, 4), BlockManager(64, 4, kv=KVPages.allocate(1, 64, 4, 1, 1))
replay(ours, theirs, users + [("fork", "user3", "branch"), ("append", "branch", 7), ("append", "user3", 8),
                              ("free", "user0")])
vkv.plot_page_map(page_states(ours), cols=32, title="our pool after 4 users sharing a system prompt, a fork, a free")
plt.show()

# %% [markdown]
# When every user has left, the full pages stay cached and a returning user finds them. The
# package's manager adds what a server needs: it **verifies** every hit against the tokens stored
# with the page (a hash collision costs a miss, never wrong K/V), **pins** pages (a system prompt;
# `same_books` counts a pinned page as cached) and, when the free list is empty, **evicts** a cached
# page chosen by a policy (section 5), raising `PoolExhausted` only when every page is in use.

# %%
theirs.pin(system)
replay(ours, theirs, [("free", s) for s in list(ours.tables)])
vkv.plot_page_map(theirs.page_states(), cols=32, title="the package's pool after every user left, the system prompt pinned")
plt.show()
replay(ours, theirs, [("allocate", "user2-again", system + [2] * 13 + [9])])   # user 2's tokens and one more

# %% [markdown]
# ## 3. Paged decode, grown in four steps
#
# Decode is one new query token per sequence attending over *all* of that sequence's cached keys
# and values. Without pages that is chapter 02's attention with one query row. With pages, each
# key must first be found: token `t` of sequence `b` sits in page `block_table[b, t // page_size]`
# at slot `t % page_size`. The kernel does that lookup itself, so the cache is read in place and
# never copied. We write it in PyTorch, then as a Triton kernel in four steps, each an edit of the
# one before (new lines marked `NEW`): one program per query head; the scores as a `tl.dot`; GQA
# packing; split-K. The inputs: sequences of ragged lengths in a pool whose page ids are shuffled,
# as they are after a server has run for a while.

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
assert torch.allclose(paged_decode_loop(**x), ref, atol=1e-5, rtol=1e-5)  # fp32 both: rounding only
print("PyTorch loop == package reference (fp32, atol = rtol = 1e-5)")

# %% [markdown]
# ### Step 1: one program per (sequence, query head)
#
# One program owns one (sequence, query head). It walks the sequence in
# tiles of `BLOCK_N` tokens; for each tile it looks up the page of every token, loads those K and V
# rows straight out of the pool, and folds them into an online softmax (chapter 02): a running
# maximum `m`, a running sum `l` and a running weighted sum `acc`, rescaled whenever `m` grows.

# %%
BLOCK_N = runtime.pick(P, cpu=16, gpu=64)   # tokens per tile


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


def pointer_args(q, k_cache, v_cache, block_table, seq_lens, o):
    """What every kernel of this section takes first: the tensors, the softmax scale, the strides."""
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(3) == q.stride(2) == o.stride(-1) == 1
    assert q.shape[-1] == triton.next_power_of_2(q.shape[-1]), "tl.arange needs a power-of-two head dim"
    return (q, k_cache, v_cache, block_table, seq_lens, o, 1.0 / math.sqrt(q.shape[-1]),
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            block_table.stride(0), o.stride(-3), o.stride(-2))


def small_paged_decode(q, k_cache, v_cache, block_table, seq_lens, block_n=BLOCK_N):
    B, Hq, D = q.shape
    o = torch.empty_like(q)
    small_paged_decode_kernel[(B, Hq)](*pointer_args(q, k_cache, v_cache, block_table, seq_lens, o),
                                       GROUP=Hq // k_cache.shape[2], PAGE=k_cache.shape[1], D=D, BLOCK_N=block_n)
    return o

# %% [markdown]
# Every step is checked the same way, each time on fresh inputs: four sequences of ragged lengths
# (one empty, one of a single token, two random), a shuffled pool with pages of 4, 8 or 16 tokens,
# 4 query heads reading 2 kv heads, against the package's fp32 reference. The toy sums in fp32, so
# it must match to rounding; the later steps multiply with `tl.dot`, which on a GPU rounds fp32
# inputs to tf32 (a 10-bit mantissa), so there the bar is `2e-2`.

# %%
tol = 1e-5 if runtime.is_interpreter() else 2e-2


def check(decode, seed, **kw):
    g = torch.Generator().manual_seed(seed)
    lens = [0, 1] + torch.randint(2, 64, (2,), generator=g).tolist()
    page_size = (4, 8, 16)[seed % 3]
    x = paged_inputs(lens, Hq=4, Hkv=2, page_size=page_size, seed=seed)
    out, ref = decode(**x, **kw), paged_decode(**x, impl="reference")
    err = float((out - ref).abs().max())
    assert torch.allclose(out, ref, atol=tol, rtol=tol), f"{decode.__name__}: max |err| {err:.1e}"
    print(f"{decode.__name__}: lengths {lens}, pages of {page_size}, max |err| vs the reference {err:.1e}")


check(small_paged_decode, seed=1)

# %% [markdown]
# ### Step 2: the scores as a `tl.dot`
#
# The toy multiplies `k * q` element by element and sums. A GPU's tensor cores multiply whole
# matrices (an H100: about 990 dense bf16 TFLOP/s against 67 fp32 TFLOP/s without them, by
# NVIDIA's datasheet), and Triton reaches them through `tl.dot(a, b)`: `a` is `[M, K]`, `b` is
# `[K, N]`, the result `[M, N]` in fp32, and on a GPU each of `M`, `N`, `K` must be at least 16.
# Our query is one row, so the edit pads it to `ROWS = 16` rows: row 0 is the query, the others
# load zeros and are never stored. The online softmax keeps one value per row: `m` and `l` are
# `[ROWS]`, `acc` is `[ROWS, D]`, and `p @ v` is a second `tl.dot`. `ROWS` is a `tl.constexpr`,
# fixed when Triton compiles the kernel, as every tile shape must be. The tile's work moves into a
# `@triton.jit` function (inlined where it is called), which steps 3 and 4 reuse unchanged.
# Fifteen of the sixteen rows are wasted: the next step fills them.

# %%
@triton.jit
def attend_tile(q, m, l, acc, K, V, bt_row, kv_off, start, hi, scale, stride_kp, stride_ks,
                PAGE: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    t = start + tl.arange(0, BLOCK_N)             # tokens [start, start + BLOCK_N); those >= hi masked
    ok = t < hi
    page = tl.load(bt_row + t // PAGE, mask=ok, other=0)          # the page lookup, as in step 1
    row = page.to(tl.int64) * stride_kp + (t % PAGE) * stride_ks + kv_off
    offs_d = tl.arange(0, D)
    k = tl.load(K + row[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0)
    v = tl.load(V + row[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k)) * scale            # NEW: [ROWS, D] @ [D, BLOCK_N] -> [ROWS, BLOCK_N]
    s = tl.where(ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))           # NEW: a running max, sum and output per row
    p = tl.exp(s - m_new[:, None])
    alpha = tl.exp(m - m_new)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)       # NEW: [ROWS, BLOCK_N] @ [BLOCK_N, D]
    return m_new, l * alpha + tl.sum(p, 1), acc


@triton.jit
def dot_paged_decode_kernel(Q, K, V, BT, LENS, O, scale,
                            stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_bt, stride_ob, stride_oh,
                            GROUP: tl.constexpr, PAGE: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                            ROWS: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    L = tl.load(LENS + b)
    r = tl.arange(0, ROWS)                        # NEW: ROWS rows, row 0 the query, the rest zeros
    offs = r[:, None] * 0 + tl.arange(0, D)[None, :]
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs, mask=r[:, None] == 0, other=0.0)
    m = tl.full([ROWS], float("-inf"), tl.float32)
    l = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    for start in range(0, L, BLOCK_N):
        m, l, acc = attend_tile(q, m, l, acc, K, V, BT + b * stride_bt, (h // GROUP) * stride_kh, start, L, scale,
                                stride_kp, stride_ks, PAGE, D, BLOCK_N)
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(O + b * stride_ob + h * stride_oh + offs, out.to(O.dtype.element_ty), mask=r[:, None] == 0)


def dot_paged_decode(q, k_cache, v_cache, block_table, seq_lens, block_n=BLOCK_N):
    B, Hq, D = q.shape
    o = torch.empty_like(q)
    dot_paged_decode_kernel[(B, Hq)](*pointer_args(q, k_cache, v_cache, block_table, seq_lens, o),
                                     GROUP=Hq // k_cache.shape[2], PAGE=k_cache.shape[1], D=D, BLOCK_N=block_n,
                                     ROWS=16)
    return o


check(dot_paged_decode, seed=2)

# %% [markdown]
# ### Step 3: GQA packing
#
# With grouped-query attention (GQA) `Hq / Hkv` query heads read the same kv head (MiniMax-M2: 48
# query heads, 8 kv heads). So far each query head has its own program, and each of those programs
# loads the same K and V tiles again: `Hq / Hkv` times the bytes. Decode is bound by those bytes:
# each K/V element serves one multiply-add per query head, far below the FLOPs per byte a GPU needs
# to be compute-bound (chapter 00). The edit: one program per (sequence, **kv** head), and the
# padded rows of step 2 become the group's query heads, `h = kv_head * GROUP + r` (rows past the
# group still load zeros). Each K/V byte is then loaded once per group and feeds `GROUP` rows of
# the dot.

# %%
@triton.jit
def gqa_paged_decode_kernel(Q, K, V, BT, LENS, O, scale,
                            stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_bt, stride_ob, stride_oh,
                            GROUP: tl.constexpr, PAGE: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                            ROWS: tl.constexpr):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)                    # NEW: a program per kv head ...
    L = tl.load(LENS + b)
    r = tl.arange(0, ROWS)
    h = kv_head * GROUP + r                       # NEW: ... whose rows are the query heads of its group
    real = r[:, None] < GROUP
    offs_d = tl.arange(0, D)[None, :]
    q = tl.load(Q + b * stride_qb + h[:, None] * stride_qh + offs_d, mask=real, other=0.0)
    m = tl.full([ROWS], float("-inf"), tl.float32)
    l = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    for start in range(0, L, BLOCK_N):
        m, l, acc = attend_tile(q, m, l, acc, K, V, BT + b * stride_bt, kv_head * stride_kh, start, L, scale,
                                stride_kp, stride_ks, PAGE, D, BLOCK_N)
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(O + b * stride_ob + h[:, None] * stride_oh + offs_d, out.to(O.dtype.element_ty), mask=real)


def gqa_paged_decode(q, k_cache, v_cache, block_table, seq_lens, block_n=BLOCK_N):
    B, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    o = torch.empty_like(q)
    gqa_paged_decode_kernel[(B, Hkv)](*pointer_args(q, k_cache, v_cache, block_table, seq_lens, o),
                                      GROUP=Hq // Hkv, PAGE=k_cache.shape[1], D=D, BLOCK_N=block_n,
                                      ROWS=max(16, triton.next_power_of_2(Hq // Hkv)))
    return o


check(gqa_paged_decode, seed=3)

# %% [markdown]
# ### Step 4: split-K
#
# After packing there are `B · Hkv` programs: 8 sequences with 8 kv heads make 64, on a GPU with 132
# streaming multiprocessors (an H100), and each of them walks its whole context alone. Split-K
# (flash-decoding, Dao et al. 2023) cuts each context into `num_splits` pieces, one program each (a
# third grid axis). A program's softmax then covers only its piece, so it writes a *partial* output,
# normalized over its piece, and the piece's log-sum-exp `lse = m + log(l)`. Chapter 04 §5 merges
# partials by the same rule: with `lse = logsumexp` over the pieces, `o = Σ exp(lse_p − lse) · o_p`;
# a piece with no token has `lse_p = −inf` and weight 0.

# %%
@triton.jit
def split_paged_decode_kernel(Q, K, V, BT, LENS, O, scale,
                              stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_bt, stride_ob, stride_oh,
                              LSE, stride_os, stride_ls, stride_lb, split_len,
                              GROUP: tl.constexpr, PAGE: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                              ROWS: tl.constexpr):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)                      # NEW: which piece of the context
    lo = split * split_len
    hi = tl.minimum(tl.load(LENS + b), lo + split_len)   # NEW: this program's tokens are [lo, hi)
    r = tl.arange(0, ROWS)
    h = kv_head * GROUP + r
    real = r[:, None] < GROUP
    offs_d = tl.arange(0, D)[None, :]
    q = tl.load(Q + b * stride_qb + h[:, None] * stride_qh + offs_d, mask=real, other=0.0)
    m = tl.full([ROWS], float("-inf"), tl.float32)
    l = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        m, l, acc = attend_tile(q, m, l, acc, K, V, BT + b * stride_bt, kv_head * stride_kh, start, hi, scale,
                                stride_kp, stride_ks, PAGE, D, BLOCK_N)
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(O + split * stride_os + b * stride_ob + h[:, None] * stride_oh + offs_d, out, mask=real)
    lse = m + tl.log(tl.where(l > 0, l, 1.0))     # NEW: the piece's log-sum-exp; -inf where it has no token
    tl.store(LSE + split * stride_ls + b * stride_lb + h, lse, mask=r < GROUP)


def merge_splits(po, plse):
    """Chapter 04's merge: po [splits, B, Hq, D], outputs normalized per piece; plse [splits, B, Hq]."""
    lse = torch.logsumexp(plse, dim=0)
    w = torch.exp(plse - lse.nan_to_num(neginf=0.0))   # a row with no token anywhere: every weight 0
    return (w[..., None] * po).sum(0)


def split_paged_decode(q, k_cache, v_cache, block_table, seq_lens, num_splits=None, block_n=BLOCK_N):
    B, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    num_splits = num_splits or triton.cdiv(2 * runtime.capabilities().sm_count, B * Hkv)   # two programs per SM
    split_len = block_n * triton.cdiv(int(seq_lens.max()), num_splits * block_n)
    po = torch.zeros(num_splits, B, Hq, D, device=q.device)
    plse = torch.full((num_splits, B, Hq), float("-inf"), device=q.device)
    split_paged_decode_kernel[(B, Hkv, num_splits)](
        *pointer_args(q, k_cache, v_cache, block_table, seq_lens, po), plse, po.stride(0), plse.stride(0),
        plse.stride(1), split_len, GROUP=Hq // Hkv, PAGE=k_cache.shape[1], D=D, BLOCK_N=block_n,
        ROWS=max(16, triton.next_power_of_2(Hq // Hkv)))
    return merge_splits(po, plse).to(q.dtype)


check(split_paged_decode, seed=4, num_splits=3)

# %% [markdown]
# What each step changes, counted at the size section 8 times them (the interpreter cannot time a
# GPU): the toy and step 2 load each group's K/V once per query head, packing loads it once per
# group but leaves fewer programs than SMs, and split-K brings the programs back.

# %%
print(paged_steps.step_counts())

# %% [markdown]
# The package's kernel (`paged_kv.decode_triton`) is step 4 plus what production needs: only the
# last tile of a piece is masked, page ids are clamped (an unchecked table never reads outside the
# pool), the pieces are counted from the batch and the SM count, the merge is a Triton kernel,
# launch configurations are tuned per GPU, and FP8 caches have a path of their own.

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

chat = chat_workload(120, seed=0)
agent = agent_workload(4, agent_turns or runtime.pick(P, cpu=30, gpu=100), packages=("json", "email", "http", "logging"), seed=0)
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
# holds them all, recency can be the better guess. Mooncake's FAST'25 synthetic trace (Qin et al.,
# requests built from public datasets) is replayed under the same rule; the paper's point is that a
# 3 M-token cache keeps well under what an unbounded one would (the last line checks it).

# %%
from minimax_lab.kvcache import find_trace, read_trace, replay_trace
from minimax_lab.kvcache.trace import HOW_TO_GET

trace_path = find_trace()
if trace_path is None:
    print("Mooncake trace not found, skipping.", HOW_TO_GET)
else:
    reqs = read_trace(trace_path)
    curves = vkv.hit_curves(reqs, [1_000_000, 3_000_000])
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
# With several replicas each holding its own cache, the next question is where to send a request,
# or whether to send the cache to the request instead: a shared store, the subject of chapter 07.

# %% [markdown]
# ## 7. Prefix caching in an engine
#
# `engine.slice.PagedEngine` runs the tiny model of chapter 01 on the paged cache with this
# chapter's kernels: `write_kv` stores each new token's K/V in its page, `paged_prefill` and
# `paged_decode` attend through the block table. On an agent's task each turn's prompt is the
# previous one plus the model's output and a tool result; a cached prefix is skipped. Outputs must
# be identical with and without the cache; what changes is the work (tokens computed) and the time
# to first token (TTFT), which also holds the block manager's own work: naming the prompt's pages
# and looking them up, which only the caching engine does. `prefix_cost.run_turns` runs the task
# with and without the cache, twice each in alternating order, and times that bookkeeping.

# %%
from minimax_lab.engine.slice import agent_session_chunks
from minimax_lab.model import TinyMultimodalModel, preset_config

cfg = preset_config(P)
torch.manual_seed(0)
model = TinyMultimodalModel(cfg).to(runtime.device()).eval()
base, tool_outputs = agent_session_chunks(runtime.pick(P, cpu=5, gpu=12), vocab_size=cfg.vocab_size,
                                          base_tokens=runtime.pick(P, cpu=256, gpu=1024), turn_tokens=(40, 70))
engine = dict(new_tokens=runtime.pick(P, cpu=2, gpu=8), num_pages=cfg.max_seq_len // 8)
if P == "gpu":   # warm-up (kernels, allocator), so turn 0 is not timed cold
    prefix_cost.run_turns(model, base, tool_outputs[:2], repeats=1, **engine)
per_turn = prefix_cost.run_turns(model, base, tool_outputs, repeats=2, **engine)
print("identical outputs with and without prefix caching:", prefix_cost.same_outputs(per_turn))
fig, ax = plt.subplots(2, 1, figsize=(10, 6.4))
vkv.plot_engine_tokens(per_turn, ax=ax[0], title=f"prompt tokens per turn ({cfg.n_layers} layers, d={cfg.d_model})")
prefix_cost.plot_turn_times(per_turn, ax=ax[1], title=f"time to first token, measured on {runtime.device_name()}")
plt.tight_layout(); plt.show()
display(Markdown(prefix_cost.turn_words(per_turn, where=f"on {runtime.device_name()}")))

# %% [markdown]
# With prefix caching only turn 0 computes its whole prompt; every later turn computes just what
# was added since the previous one (plus the partly filled last page, which has no name yet), so the
# work per turn stays flat while without the cache it grows with the context.
#
# ## 8. On a GPU
#
# From benchmark records, left to right: the four kernels of section 3 beside the package's kernel
# and two peers (when a GPU run has timed them); paged decode at five sizes against gathering the
# pages into a contiguous copy for SDPA and SDPA on a cache that was never paged (decode only
# reads, so it can pass the copy ceiling); the engine above at a larger size. Whiskers: p20 to p80.
# On a GPU this cell also times section 3's kernels, and draws the engine as section 7 timed it.

# %%
steps = {"toy": small_paged_decode, "tl.dot": dot_paged_decode, "GQA packing": gqa_paged_decode,
         "split-K": split_paged_decode}
turns_now = {name: [r["ttft_ms"] for r in rows] for name, rows in per_turn.items()}
fig, words = vkv.on_a_gpu_section(P, steps=steps, turns_now=turns_now, record_steps=record_steps)
plt.show()
display(Markdown(words))

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
# Pages end fragmentation for one extra load per token; content-hash names make prefix sharing a
# dictionary lookup; on agent traffic almost every prompt token is reusable, so what matters is
# *keeping* it. The limits: an online eviction policy only guesses which
# one-off blocks will never return, and both policies here stay far from what an unbounded cache
# keeps when the cache is small; a block below the GPU is worth fetching only where the link beats
# recomputing it, which depends on the model and on the context before the block (section 6 says
# where for two models); a single replica's cache serves only the requests routed to it; and the
# prompt tokens prefix caching skips turn into time only where computing them is a large part of a
# turn's time, while naming the pages costs host time on every turn (sections 7 and 8 measure both
# for the tiny model). Our decode kernel still masks every tile and trusts its block table, and one
# program per (sequence, kv head, piece) is only as good as the number of pieces chosen for the
# GPU. On the CPU the kernels run in Triton's interpreter: checked there, never timed.
#
# ---
# **Previous:** [05 · Mixture of Experts](05_mixture_of_experts.ipynb) · **Next:** [07 · The KV cache as a distributed store](07_kv_cache_as_a_distributed_store.ipynb)
#
# **Read more:** vLLM's PagedAttention (Kwon et al. 2023, arXiv 2309.06180); Flash-Decoding (Dao,
# Haziza, Massa and Sizov, PyTorch blog, October 2023), the split-K of section 3; SGLang's
# RadixAttention (Zheng et al. 2023, arXiv 2312.07104), prefix sharing in a radix tree; Mooncake
# (Qin et al., FAST'25, arXiv 2407.00079), a KV cache built as a storage system; nano-vllm
# (github.com/GeeeekExplorer/nano-vllm), a small engine with a block manager like section 2's.
#
# **Package code used here:** `minimax_lab/kvcache/blocks.py`, `minimax_lab/paged_kv/layout.py`, `minimax_lab/paged_kv/decode.py`, `minimax_lab/paged_kv/decode_triton.py`, `minimax_lab/kvcache/workloads.py`, `minimax_lab/kvcache/eviction.py`, `minimax_lab/kvcache/trace.py`, `minimax_lab/kvcache/tiers.py`, `minimax_lab/engine/slice.py`, `minimax_lab/viz/kvcache.py`, `minimax_lab/viz/block_books.py`, `minimax_lab/viz/prefix_cost.py`, `minimax_lab/viz/paged_steps.py`

# %%
display(Markdown(vkv.provenance(preset=P, seconds=time.perf_counter() - t_start, trace_path=trace_path)))
