# %% [markdown]
# # 04 · Sparse attention kernels: MSA's index and attention in Triton
#
# **What this chapter builds:** MSA's kernels in small Triton: the index kernel (block scores, then
# a streaming top-k over int64 keys), the sparse attention query-outer (decode is its one-query
# case) and KV-outer with its inverted index; each checked against the package on the same inputs. Then the backward,
# grown the same way: the formulas in PyTorch, the dQ walk, the dK/dV walk over the inverted index
# and the index branch's gradient, each checked against autograd; and a model trained through the
# kernels.
#
# **It assumes:** [03 · MiniMax Sparse Attention](03_minimax_sparse_attention.ipynb) (what MSA
# selects and why) and [02 · FlashAttention in Triton](02_flash_attention_in_triton.ipynb) (tiles,
# `tl.dot`, the online softmax, log-sum-exp).
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/04_sparse_attention_kernels.ipynb)
#
# The contract from chapter 03: for each query `t` and KV group `g`, `msa_select` returns `topk`
# block ids of `Bk` keys (the `topk − 1` best earlier blocks by index score, then the local block;
# `-1` in unused slots), and `msa_attention` computes an exact softmax of each of the group's query
# heads over the keys of those blocks, causal inside the local block. The package implements both
# three times (`impl="reference" | "torch" | "triton"`). Here we build the Triton path in small
# kernels and check each against `impl="torch"` on the same inputs. On a CPU, Triton runs in its
# interpreter, so the sizes are tiny: the checks are about correctness, not speed.
#
# The whole chapter turns on one picture. For one sequence and one group, the selection is a table:
# a row per query, a column per key block, a mark where the query selected the block. An attention
# kernel can walk that table **by rows** (one program per query: *query-outer*) or **by columns**
# (one program per KV block, serving every query that picked it: *KV-outer*). The setup cell draws
# it for this chapter's inputs.

# %%
# In Colab, install the workbook's package first (locally, `make lab` already did).
import subprocess, sys
if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "minimax-lab[notebooks] @ git+https://github.com/minimax-lab/minimax-lab"], check=True)

# %% tags=["parameters"]
preset = "auto"          # "cpu" (tiny sizes, Triton interpreter) or "gpu"

# %%
import math
import time

import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

from minimax_lab import exercises, measure, runtime  # first: on a CPU it switches Triton to its interpreter

import triton  # noqa: E402 (after runtime, see above)
import triton.language as tl  # noqa: E402
from minimax_lab.attention import msa_attention, msa_decode_paged, msa_select
from minimax_lab.attention.msa_backward_index import index_distill_loss
from minimax_lab.attention.msa_torch import block_scores_torch
from minimax_lab.attention.msa_triton_select import selection_from_keys
from minimax_lab.triton_blocks import dot_precision
from minimax_lab.viz import msa_kernels as vmk, msa_records
from minimax_lab.viz.flash import show_edit

# %%
t_start = time.perf_counter()
P, dev, x = vmk.setup(preset)   # q, k, v, q_idx, k_idx: fixed seed, a ragged last block
kw = dict(block_size=x.Bk, topk=x.topk)
ref_sel = msa_select(x.q_idx, x.k_idx, impl="torch", **kw)  # the package's selection: what every kernel is checked on
vmk.inverted_index_figure(ref_sel[0, :, 0].cpu(), block_size=x.Bk, block=2,
                          title="one sequence, group 0: the selection read by rows and by columns")
plt.show()

# %% [markdown]
# ## 1. Block scores
#
# A block's score for a query row is the largest index dot product over the block's keys,
# `max_j q_idx[t, g] · k_idx[j] / √D_idx` (only keys `j ≤ t` count). The smallest kernel computes
# the whole score table. There is one program per (tile of `BLOCK_M` rows, key block `j`,
# sequence). A row is one (token, group) pair. The `G` groups of a token share its index key, so
# packing them into the tile's rows lets one loaded key block serve all of them. It also writes
# which key won each block (`tl.argmax`): the selection does not need it, the backward does (section 6).

# %%
@triton.jit
def block_scores_kernel(Qi, Ki, Out, Won, S, n_blocks, scale,
                        G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BK: tl.constexpr,
                        PRECISION: tl.constexpr):
    """Out[b, t, g, j] = max over the keys i <= t of block j of q_idx[b, t, g] . k_idx[b, i] * scale; Won: that i."""
    pid_m, j, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)     # row = token * G + group
    row_ok = rows < S * G
    tok = rows // G
    d = tl.arange(0, D)
    q = tl.load(Qi + (b * S * G + rows[:, None]) * D + d[None, :], mask=row_ok[:, None], other=0.0)
    keys = j * BK + tl.arange(0, BK)                   # the tokens of key block j
    kt = tl.load(Ki + (b * S + keys[:, None]) * D + d[None, :], mask=keys[:, None] < S, other=0.0)
    s = tl.dot(q, tl.trans(kt), input_precision=PRECISION) * scale  # [BLOCK_M, BK] token scores
    s = tl.where(keys[None, :] <= tok[:, None], s, float("-inf"))     # causal; keys past S are past every token
    out = (b * S * G + rows) * n_blocks + j
    tl.store(Out + out, tl.max(s, axis=1), mask=row_ok)
    tl.store(Won + out, j * BK + tl.argmax(s, axis=1, tie_break_left=True), mask=row_ok)  # the winning key


def block_scores(q_idx, k_idx, block_size):
    """(fp32 scores, int32 winning keys) [B, S, G, n_blocks] of q_idx [B, S, G, D_idx], k_idx [B, S, D_idx]; D_idx 2^k >= 16."""
    B, S, G, D = q_idx.shape
    nb = triton.cdiv(S, block_size)
    out = torch.empty(B, S, G, nb, device=q_idx.device, dtype=torch.float32)
    won = torch.empty(B, S, G, nb, device=q_idx.device, dtype=torch.int32)
    block_scores_kernel[(triton.cdiv(S * G, 16), nb, B)](
        q_idx.contiguous(), k_idx.contiguous(), out, won, S, nb, 1 / math.sqrt(D), G=G, D=D, BLOCK_M=16,
        BK=block_size, PRECISION=dot_precision(q_idx.dtype))  # fp32 inputs: full fp32 products, no TF32
    return out, won


scores, won = block_scores(x.q_idx, x.k_idx, x.Bk)
torch.testing.assert_close(scores, block_scores_torch(x.q_idx, x.k_idx, x.Bk), rtol=1e-5, atol=1e-4)
print(f"block scores {list(scores.shape)}: equal to block_scores_torch within rtol 1e-5, atol 1e-4")

# %% [markdown]
# Those are `S × n_blocks` scores per group written to memory, only to be ranked and thrown away.
# At 128k tokens with `Bk = 128` that is 1,024 floats per row. The package's index kernel never writes them: it
# ranks each block as soon as its score exists and keeps only the best `topk − 1` per row, in
# registers. For that, ranking must be cheap and exact, ties included.
#
# ## 2. The ranking key, worked through on numbers
#
# MSA ranks by score, and breaks ties by the lower block id. Both fit in **one int64**. The upper
# bits hold the score's fp32 bit pattern, made orderable. Positive floats already compare like their
# bits read as integers. Negative floats compare backwards, so their bits except the sign are
# flipped. The lower 20 bits hold `2²⁰ − 1 − id`: for equal scores the lower id gives the larger
# key. Then "best" is simply "largest integer", and every key is distinct. Here is the key for five
# blocks, two of them tied:

# %%
print(vmk.key_table(scores=[0.75, -0.5, 0.75, -1.0, 2.0], block_ids=[3, 5, 7, 8, 9]))

# %% [markdown]
# Read the `as int32` column: `-1.0` reads as a *larger* integer than `-0.5`, the wrong way round,
# and the `orderable` column puts it right. Blocks 3 and 7 tie at 0.75, and block 3's key is larger.
#
# ## 3. A streaming top-k
#
# Now the index kernel proper, still small. A program takes `BLOCK_M` rows and walks the key
# blocks `0, 1, …`; for each block it computes the rows' scores, turns them into keys, and
# **inserts** each key into the row's top list if it beats the smallest key there. (It ranks the raw
# dot products: the scale `1/√D_idx` is positive and does not change the order.) The list is a
# `[BLOCK_M, topk − 1]` int64 register tile. Empty slots hold the smallest int64, so any real key
# beats them. Padding slots (the tile is a power of two wide) hold the largest, so they are never
# replaced. Only blocks before a row's local block are ranked. The local block is always selected,
# and it is appended, with the rule for short prefixes, when the keys are decoded in
# `selection_from_keys` (torch: a sort of `topk − 1` values per row).

# %%
@triton.jit
def select_kernel(Qi, Ki, Out, S, G: tl.constexpr, D: tl.constexpr, BK: tl.constexpr,
                  K_SEL: tl.constexpr, K_P: tl.constexpr, BLOCK_M: tl.constexpr, PRECISION: tl.constexpr):
    """Out[b, t, g, :K_SEL] = the int64 keys of the K_SEL best blocks before t's own block (unsorted)."""
    pid_m, b = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)      # row = token * G + group
    row_ok = rows < S * G
    local = (rows // G) // BK                           # the row's own block: always kept, never ranked
    d = tl.arange(0, D)
    q = tl.load(Qi + (b * S * G + rows[:, None]) * D + d[None, :], mask=row_ok[:, None], other=0.0)
    slot = tl.arange(0, K_P)
    top = tl.where(slot[None, :] < K_SEL, tl.full([BLOCK_M, K_P], -9223372036854775808, tl.int64),
                   tl.full([BLOCK_M, K_P], 9223372036854775807, tl.int64))  # empty: lowest; padding: highest
    last_local = tl.minimum(pid_m * BLOCK_M + BLOCK_M - 1, S * G - 1) // G // BK
    for blk in range(0, last_local):                    # every block that some row of the tile ranks
        keys = blk * BK + tl.arange(0, BK)              # blk < a local block: a full block, all visible
        k = tl.load(Ki + (b * S + keys[:, None]) * D + d[None, :])
        score = tl.max(tl.dot(q, tl.trans(k), input_precision=PRECISION), axis=1) + 0.0  # -0.0 -> +0.0
        bits = score.to(tl.int32, bitcast=True)
        bits = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)                  # negative floats: flip to order
        key = bits.to(tl.int64) * (1 << 20) + ((1 << 20) - 1 - blk)         # score above, reversed id below
        key = tl.where(blk < local, key, -9223372036854775808)              # rank earlier blocks only
        low, at = tl.min(top, axis=1, return_indices=True)                  # each row's weakest kept key
        top = tl.where((slot[None, :] == at[:, None]) & (key > low)[:, None], key[:, None], top)
    tl.store(Out + (b * S * G + rows[:, None]) * K_SEL + slot[None, :], top,
             mask=row_ok[:, None] & (slot[None, :] < K_SEL))


def streaming_select(q_idx, k_idx, block_size, topk):
    """Selected block ids int32 [B, S, G, topk], msa_select's contract, with no score table in memory."""
    B, S, G, D = q_idx.shape
    keys = torch.empty(B, S, G, topk - 1, dtype=torch.int64, device=q_idx.device)
    select_kernel[(triton.cdiv(S * G, 16), B)](q_idx.contiguous(), k_idx.contiguous(), keys, S, G=G, D=D,
                                               BK=block_size, K_SEL=topk - 1, K_P=max(2, triton.next_power_of_2(topk - 1)),
                                               BLOCK_M=16, PRECISION=dot_precision(q_idx.dtype))
    return selection_from_keys(keys, block_size, topk)

# %%
selected = streaming_select(x.q_idx, x.k_idx, x.Bk, x.topk)
same = (selected == ref_sel).all(-1).float().mean().item()
print(f"rows selecting exactly what msa_select(impl='torch') selects: {same:.4f}")
# fp32 on the CPU: exact. On a GPU the dots sum in another order, so two blocks whose scores differ
# in the last bit may swap
assert same >= runtime.pick(P, cpu=1.0, gpu=0.999), same
ties = vmk.kernel_inputs(P, seed=1)  # integer-valued index vectors: many exactly tied scores
qi_t, ki_t = ties.q_idx.sign().round(), ties.k_idx.sign().round()
assert torch.equal(streaming_select(qi_t, ki_t, x.Bk, x.topk), msa_select(qi_t, ki_t, impl="torch", **kw))
print("with tied scores (index vectors of -1, 0, 1): the same selection, ties to the lower block id")

# %% [markdown]
# The package's `_select_kernel` (in `minimax_lab/attention/msa_triton_select.py`) is this loop
# plus four things. It takes strides, so no copies are made. It reads `q_idx` and `k_idx` in FP8,
# with each key's power-of-two scale multiplied into its column of scores after the dot (exact).
# It starts the last row tiles first, because they walk the most blocks. And it reads its tile
# sizes from a per-GPU launch config.
#
# ## 4. Query-outer sparse attention
#
# One program per (sequence, token, group). The group's `Hq/G` query heads share its K and V, so
# they are the rows of the tile, padded up to 16 (the smallest `tl.dot`). The program walks the
# `topk` selected blocks with chapter 02's online softmax. An unused slot (`-1`) and keys past the
# token (inside the local block, or past the ragged end) are masked.

# %%
@triton.jit
def query_outer_kernel(Q, K, V, Sel, O, S, scale,
                       G: tl.constexpr, HPG: tl.constexpr, D: tl.constexpr, BK: tl.constexpr, TOPK: tl.constexpr,
                       M: tl.constexpr):
    pid = tl.program_id(0)                             # one program per (batch, token, group)
    g = pid % G
    t = (pid // G) % S
    b = pid // (G * S)
    h = g * HPG + tl.arange(0, M)                      # the group's query heads (rows >= HPG: padding)
    h_ok = tl.arange(0, M) < HPG
    d = tl.arange(0, D)
    rows = ((b * S + t) * G * HPG + h[:, None]) * D + d[None, :]
    q = tl.load(Q + rows, mask=h_ok[:, None], other=0.0)
    m_i = tl.full([M], float("-inf"), tl.float32)      # online softmax: running max, sum, output
    l_i = tl.zeros([M], tl.float32)
    acc = tl.zeros([M, D], tl.float32)
    for slot in range(TOPK):
        blk = tl.load(Sel + pid * TOPK + slot)         # a selected block id; -1 = unused slot
        keys = tl.maximum(blk, 0) * BK + tl.arange(0, BK)
        ok = tl.where(blk >= 0, keys <= t, False)      # causal inside the local block
        kv = ((b * S + keys[:, None]) * G + g) * D + d[None, :]
        k = tl.load(K + kv, mask=ok[:, None], other=0.0)
        v = tl.load(V + kv, mask=ok[:, None], other=0.0)
        s = tl.where(ok[None, :], tl.dot(q, tl.trans(k)) * scale, float("-inf"))  # [M, BK]
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing visible yet: no -inf - -inf
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # a row with no key: 0
    tl.store(O + rows, out.to(O.dtype.element_ty), mask=h_ok[:, None])


def sparse_query_outer(q, k, v, selected, block_size):
    """o [B, S, Hq, D] of q [B, S, Hq, D], k, v [B, S, G, D] over selected [B, S, G, topk]."""
    B, S, Hq, D = q.shape
    G, topk = k.shape[2], selected.shape[-1]
    o = torch.empty_like(q)
    query_outer_kernel[(B * S * G,)](q.contiguous(), k.contiguous(), v.contiguous(), selected.contiguous(), o,
                                     S, 1 / math.sqrt(D), G=G, HPG=Hq // G, D=D, BK=block_size, TOPK=topk,
                                     M=max(16, triton.next_power_of_2(Hq // G)))
    return o

# %%
tol = runtime.pick(P, cpu=dict(rtol=1e-4, atol=1e-5), gpu=dict(rtol=2e-2, atol=2e-2))
ref_o = msa_attention(x.q.float(), x.k.float(), x.v.float(), x.q_idx, x.k_idx, impl="torch", selected=ref_sel,
                      **kw).to(x.dtype)
o_query = sparse_query_outer(x.q, x.k, x.v, ref_sel, x.Bk)
torch.testing.assert_close(o_query, ref_o, **tol)
print(f"query-outer vs msa_attention(impl='torch'), same selection: rel err {measure.relative_error(o_query, ref_o):.1e}")
print(vmk.tile_rows(x))  # how many of a program's tile rows are real query heads, here and at MSA's shape

# %% [markdown]
# **Decode is query-outer with one query.** At decode time the newest token of each sequence attends
# over its selected blocks in a *paged* KV cache. There a block is a page, and pages live anywhere
# in memory (chapter 06). Causality makes the decode output at the last position equal to the
# prefill output at that position. So our kernel's rows must match `msa_decode_paged` on a cache
# whose pages are shuffled. The second sequence is shorter, so its last page is partly filled.

# %%
table = torch.randperm(x.B * x.n_blocks, generator=torch.Generator().manual_seed(2)).view(x.B, -1).to(dev, torch.int32)
kc, vc, kic = (vmk.paged_cache(t, table, x.Bk) for t in (x.k, x.v, x.k_idx))
lens = torch.tensor([x.S, x.S - x.Bk - 3], dtype=torch.int32, device=table.device)
last = lambda t: torch.stack([t[b, int(lens[b]) - 1] for b in range(x.B)])  # noqa: E731 (each sequence's newest token)
o_dec, sel_dec = msa_decode_paged(last(x.q), kc, vc, table, lens, last(x.q_idx), kic, topk=x.topk, impl="triton",
                                  return_selected=True)
torch.testing.assert_close(o_dec, last(o_query), **tol)
print(f"msa_decode_paged(impl='triton'), pages shuffled, lengths {lens.tolist()}, vs our query-outer rows: "
      f"rel err {measure.relative_error(o_dec, last(o_query)):.1e}; same blocks selected: "
      f"{torch.equal(sel_dec[:, 0], last(ref_sel))}")

# %% [markdown]
# ## 5. KV-outer, and its inverted index
#
# Query-outer has a weak spot. Every (token, group) program loads its own `topk · Bk` keys and
# values to serve one small tile of rows. A block that many tokens picked (the first blocks, a
# popular image) is loaded again by each of them. The MSA paper turns the loop around: **one
# program per KV block**, for *the queries that selected it*. The block's K and V are loaded once
# and serve `BT` tokens × `Hq/G` heads per `tl.dot`. That needs two extra pieces:
#
# * an **inverted index**: the selection entries sorted by (sequence, group, block), with a start
#   and a count per block. It is the selection table read by columns instead of rows;
# * a **merge**: each program writes a *partial* output per (token, slot, head), normalized over its
#   own block, with its log-sum-exp. The `topk` partials of a row are then combined with weights
#   `exp(lse_p − lse)`, the online softmax's algebra done once at the end.

# %%
def inverted_index(selected, n_blocks):
    """Entries of selected [B, S, G, topk] (flat indices) sorted by (batch, group, block); start and
    count of each (batch, group, block)'s run. Unused slots (-1) go to a bin past the end."""
    B, S, G, topk = selected.shape
    b = torch.arange(B, device=selected.device).view(B, 1, 1, 1)
    g = torch.arange(G, device=selected.device).view(1, 1, G, 1)
    key = ((b * G + g) * n_blocks + selected.long()).reshape(-1)
    key = torch.where(selected.reshape(-1) >= 0, key, B * G * n_blocks)
    entries = torch.argsort(key, stable=True).to(torch.int32)
    counts = torch.bincount(key, minlength=B * G * n_blocks + 1)[:-1]
    return entries, (torch.cumsum(counts, 0) - counts).to(torch.int32), counts.to(torch.int32)


entries, starts, counts = inverted_index(ref_sel, x.n_blocks)
run = entries[starts[2]: starts[2] + counts[2]].long()  # block 2's list (sequence 0, group 0): flat indices
print(f"block 2's list holds {counts[2].item()} (token, slot) entries; its first tokens: "
      f"{(run // (x.G * x.topk) % x.S)[:8].tolist()}; the lists of sequence 0, group 0 hold "
      f"{counts[: x.n_blocks].min().item()} to {counts[: x.n_blocks].max().item()} entries")

# %% [markdown]
# Block 2's list is the red column of the picture at the top: the tokens that picked it, top to
# bottom. The bars there are the work of each KV-outer program, and they are uneven: an early
# block is visible to more queries, so more of them pick it. The kernel below takes the first `BT`
# entries of its block's list, then the next `BT`, until the list is done.

# %%
@triton.jit
def kv_outer_kernel(Q, K, V, Entries, Starts, Counts, Po, Plse, S, n_blocks, scale,
                    G: tl.constexpr, HPG: tl.constexpr, D: tl.constexpr, BK: tl.constexpr, TOPK: tl.constexpr,
                    HPG_P: tl.constexpr, BT: tl.constexpr):
    pid = tl.program_id(0)                             # one program per (batch, group, KV block)
    blk = pid % n_blocks
    g = (pid // n_blocks) % G
    b = pid // (n_blocks * G)
    d = tl.arange(0, D)
    keys = blk * BK + tl.arange(0, BK)
    kv = ((b * S + keys[:, None]) * G + g) * D + d[None, :]
    k = tl.load(K + kv, mask=keys[:, None] < S, other=0.0)  # the block's K and V: loaded once ...
    v = tl.load(V + kv, mask=keys[:, None] < S, other=0.0)
    start, count = tl.load(Starts + pid), tl.load(Counts + pid)
    r = tl.arange(0, BT * HPG_P)                       # ... for every query that selected it, BT tokens at a time
    tok_i, hh = r // HPG_P, r % HPG_P                  # row = (token among the BT) * HPG_P + head of the group
    for j in range(0, count, BT):
        ok = (j + tok_i < count) & (hh < HPG)
        e = tl.load(Entries + start + j + tok_i, mask=ok, other=0)  # entry = ((b * S + t) * G + g) * TOPK + slot
        t = (e // (TOPK * G)) % S
        rows = ((b * S + t[:, None]) * G * HPG + g * HPG + hh[:, None]) * D + d[None, :]
        q = tl.load(Q + rows, mask=ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where((keys[None, :] <= t[:, None]) & (keys[None, :] < S), s, float("-inf"))
        m = tl.where(ok, tl.max(s, 1), 0.0)            # rows past the list: harmless values, never stored
        p = tl.exp(s - m[:, None])
        l = tl.where(ok, tl.sum(p, 1), 1.0)
        o = tl.dot(p.to(v.dtype), v) / l[:, None]      # softmax over this block alone: a partial result ...
        row = e * HPG + hh
        tl.store(Po + row[:, None] * D + d[None, :], o, mask=ok[:, None])
        tl.store(Plse + row, m + tl.log(l), mask=ok)   # ... and its log-sum-exp, for the merge


def sparse_kv_outer(q, k, v, selected, block_size):
    B, S, Hq, D = q.shape
    G, topk = k.shape[2], selected.shape[-1]
    hpg, nb = Hq // G, triton.cdiv(S, block_size)
    entries, starts, counts = inverted_index(selected, nb)
    po = torch.zeros(B, S, G, topk, hpg, D, device=q.device)                 # partial outputs (fp32)
    plse = torch.full((B, S, G, topk, hpg), float("-inf"), device=q.device)  # their lse; -inf = empty slot
    hpg_p = triton.next_power_of_2(hpg)
    kv_outer_kernel[(B * G * nb,)](q.contiguous(), k.contiguous(), v.contiguous(), entries, starts, counts, po, plse,
                                   S, nb, 1 / math.sqrt(D), G=G, HPG=hpg, D=D, BK=block_size, TOPK=topk,
                                   HPG_P=hpg_p, BT=max(1, 16 // hpg_p))
    # the merge: o = sum over slots of exp(lse_p - lse) * o_p (a row with no block: 0)
    lse = torch.logsumexp(plse, dim=3, keepdim=True)
    w = torch.exp(plse - lse.nan_to_num(neginf=0.0)).nan_to_num(0.0)
    return (w[..., None] * po).sum(3).reshape(B, S, Hq, D).to(q.dtype)

# %%
o_kv = sparse_kv_outer(x.q, x.k, x.v, ref_sel, x.Bk)
torch.testing.assert_close(o_kv, ref_o, **tol)
print(f"KV-outer vs msa_attention(impl='torch'): rel err {measure.relative_error(o_kv, ref_o):.1e}")
sel_empty = ref_sel.clone()
sel_empty[0, -1] = -1                                  # the last query sees no block at all: output 0
torch.testing.assert_close(sparse_kv_outer(x.q, x.k, x.v, sel_empty, x.Bk),
                           msa_attention(x.q, x.k, x.v, x.q_idx, x.k_idx, impl="torch", selected=sel_empty, **kw), **tol)
print("a row with no selected block: 0 in both")

# %% [markdown]
# The package's KV-outer kernel, `_kv_outer_kernel` in `minimax_lab/attention/msa_triton_prefill.py`,
# has this inner loop. Around it, it does four more things:
#
# * It cuts each block's list into runs of at most `TOKENS_PER_PROG` entries, one program per run,
#   so a popular block does not leave one program working long after the others (exercise 04.2).
# * It orders the runs so that programs running together read query rows from one L2-sized stretch
#   of the sequence.
# * It keeps the partials in bf16 within a memory budget, and merges them in a Triton kernel
#   (exercise 04.3).
# * Each query row is found through an entry of the inverted index, a load that depends on another
#   load. So the loop loads the next tile's query rows while it computes this one, and the entries
#   two tiles ahead: no load waits on the one before it.
#
# ## 6. Training through MSA: the backward
#
# A model that attends sparsely is trained through its sparse attention too (MSA's paper adapts
# the main weights to sparsity, chapter 03), so every kernel above needs a backward. The selection
# is an integer top-k: it passes no gradient and stays fixed. Two things need gradients: `q`, `k`,
# `v` through the sparse attention, and `q_idx`, `k_idx` through the index branch's distillation
# loss (chapter 03, section 4). We build them as we built the forward: the formulas in PyTorch,
# then one Triton kernel per walk over the selection, each checked against autograd.
#
# **What the forward keeps.** For each query row (token, head) the forward can store `lse`, the
# log-sum-exp of the row's scores over *all* of its selected keys (`return_lse=True`). With it,
# the softmax weight of any visible (query, key) pair is `p = exp(scale · q·k − lse)`: no running
# max, no other block needed. Differentiating `o = p · v` through the softmax gives, with `do` the
# output's gradient:
#
# ```
# dv   += pᵀ · do                      dp  = do · vᵀ
# delta = rowsum(do ∘ o)                ds  = p ∘ (dp − delta)
# dq   += scale · ds · k               dk += scale · dsᵀ · q
# ```
#
# `delta` is one number per row: since `o = Σⱼ pⱼ vⱼ`, it equals `Σⱼ pⱼ dpⱼ`, the term the softmax
# subtracts because its weights sum to one. (A loss that also used `lse` would enter as
# `delta − dlse`.) The inputs: a batch of two sequences whose last block is ragged, two query
# heads per KV head, and a row that selected nothing; the truth is float64 autograd through the
# package's reference forward.

# %%
g = torch.Generator().manual_seed(1)
B, S, G, hpg, Dh, Bk, topk = 2, 45, 2, 2, 16, 16, 2        # 3 blocks, the last holds 13 keys
q, do = (torch.randn(B, S, G * hpg, Dh, generator=g, dtype=torch.float64).to(dev) for _ in range(2))
k, v = (torch.randn(B, S, G, Dh, generator=g, dtype=torch.float64).to(dev) for _ in range(2))
qi, ki = torch.randn(B, S, G, 16, generator=g).to(dev), torch.randn(B, S, 16, generator=g).to(dev)
sel = msa_select(qi, ki, block_size=Bk, topk=topk)
sel[0, 20] = -1                                            # a row that attends to nothing
q, k, v = (t.requires_grad_() for t in (q, k, v))
o, lse = msa_attention(q, k, v, qi, ki, impl="reference", selected=sel, block_size=Bk, topk=topk, return_lse=True)
truth = torch.autograd.grad(o, (q, k, v), do)              # float64 autograd through the dense-mask forward
q, k, v, o = (t.detach() for t in (q, k, v, o))

# %%
def sparse_backward(q, k, v, o, lse, do, selected, block_size):
    """(dq, dk, dv) of sparse attention over selected, from the forward's o and lse [B, Hq, S], with dense masks."""
    B, S, Hq, D = q.shape
    G = k.shape[2]
    key_block = torch.arange(S, device=q.device) // block_size
    chosen = (selected.transpose(1, 2)[..., None] == key_block).any(-2)             # [B, G, S(query), S(key)]
    visible = (chosen & torch.ones(S, S, dtype=torch.bool, device=q.device).tril()).repeat_interleave(Hq // G, 1)
    kh, vh = (t.repeat_interleave(Hq // G, 2) for t in (k, v))                       # each query head's K and V
    s = torch.einsum("bthd,bjhd->bhtj", q, kh) / math.sqrt(D)
    p = torch.exp(s - lse[..., None]).masked_fill(~visible, 0.0)                    # the softmax, from lse
    delta = torch.einsum("bthd,bthd->bht", do, o)                                   # rowsum(do * o)
    ds = p * (torch.einsum("bthd,bjhd->bhtj", do, vh) - delta[..., None])           # p * (dp - delta)
    dq = torch.einsum("bhtj,bjhd->bthd", ds, kh) / math.sqrt(D)
    dk = torch.einsum("bhtj,bthd->bjhd", ds, q) / math.sqrt(D)
    dv = torch.einsum("bhtj,bthd->bjhd", p, do)
    return dq, dk.unflatten(2, (G, Hq // G)).sum(3), dv.unflatten(2, (G, Hq // G)).sum(3)  # a KV head: its heads' sum


for name, a, b in zip(("dq", "dk", "dv"), sparse_backward(q, k, v, o, lse, do, sel, Bk), truth):
    print(f"{name}: largest difference from autograd {(a - b).abs().max().item():.1e}")
    assert (a - b).abs().max() < 1e-12, name                 # float64 both: equal up to rounding

# %% [markdown]
# **Two walks, no atomics.** A row's `dq` sums over the blocks *the row* selected: the query-outer
# order of section 4, one program per (token, group). A key's `dk` and `dv` sum over the rows *that
# selected its block*: the KV-outer order of section 5. Each term needs only its row's `lse` and
# `delta`, so the blocks can be visited in any order, and in each walk one program owns everything
# it writes: no two programs add into the same place, so no atomic adds, and every run gives the
# same bits.
#
# The dQ kernel is section 4's kernel with the online softmax replaced by `p` from `lse`
# (`delta` comes from one line of PyTorch, in the launcher below the next kernel):

# %%
@triton.jit
def dq_kernel(Q, K, V, dO, LSE, Delta, Sel, dQ, S, scale,
              G: tl.constexpr, HPG: tl.constexpr, D: tl.constexpr, BK: tl.constexpr, TOPK: tl.constexpr,
              M: tl.constexpr):
    pid = tl.program_id(0)                             # one program per (batch, token, group)
    g = pid % G
    t = (pid // G) % S
    b = pid // (G * S)
    h = g * HPG + tl.arange(0, M)                      # the group's query heads (rows >= HPG: padding)
    h_ok = tl.arange(0, M) < HPG
    d = tl.arange(0, D)
    rows = ((b * S + t) * G * HPG + h[:, None]) * D + d[None, :]
    q = tl.load(Q + rows, mask=h_ok[:, None], other=0.0)
    do = tl.load(dO + rows, mask=h_ok[:, None], other=0.0)
    lse = tl.load(LSE + (b * G * HPG + h) * S + t, mask=h_ok, other=0.0)    # the forward's: no running max
    delta = tl.load(Delta + (b * G * HPG + h) * S + t, mask=h_ok, other=0.0)
    dq = tl.zeros([M, D], tl.float32)
    for slot in range(TOPK):
        blk = tl.load(Sel + pid * TOPK + slot)         # a selected block id; -1 = unused slot
        keys = tl.maximum(blk, 0) * BK + tl.arange(0, BK)
        ok = tl.where(blk >= 0, keys <= t, False)      # causal inside the local block
        kv = ((b * S + keys[:, None]) * G + g) * D + d[None, :]
        k = tl.load(K + kv, mask=ok[:, None], other=0.0)
        v = tl.load(V + kv, mask=ok[:, None], other=0.0)
        p = tl.where(ok[None, :], tl.exp(tl.dot(q, tl.trans(k)) * scale - lse[:, None]), 0.0)  # [M, BK]
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        dq += tl.dot(ds, k)                            # a row's dq: a sum over the blocks it selected
    tl.store(dQ + rows, dq * scale, mask=h_ok[:, None])

# %%
display(show_edit(query_outer_kernel, dq_kernel))

# %% [markdown]
# The dK/dV kernel is section 5's kernel turned into a sum. It takes its block's **whole** list, as
# section 5's kernel does. (The package's forward cuts long lists into runs, exercise 04.2; the
# backward cannot, or two programs would add into the same keys.) It accumulates `dk` and `dv` in
# registers over every query that selected the block, and writes them once at the end. The
# launcher runs both walks; the check compares all three gradients with float64 autograd.

# %%
@triton.jit
def dkdv_kernel(Q, K, V, dO, LSE, Delta, Entries, Starts, Counts, dK, dV, S, n_blocks, scale,
                G: tl.constexpr, HPG: tl.constexpr, D: tl.constexpr, BK: tl.constexpr, TOPK: tl.constexpr,
                HPG_P: tl.constexpr, BT: tl.constexpr):
    pid = tl.program_id(0)                             # one program per (batch, group, KV block)
    blk = pid % n_blocks
    g = (pid // n_blocks) % G
    b = pid // (n_blocks * G)
    d = tl.arange(0, D)
    keys = blk * BK + tl.arange(0, BK)
    kv = ((b * S + keys[:, None]) * G + g) * D + d[None, :]
    k = tl.load(K + kv, mask=keys[:, None] < S, other=0.0)  # the block's K and V: loaded once ...
    v = tl.load(V + kv, mask=keys[:, None] < S, other=0.0)
    dk = tl.zeros([BK, D], tl.float32)                 # ... its gradients: summed in registers ...
    dv = tl.zeros([BK, D], tl.float32)
    start, count = tl.load(Starts + pid), tl.load(Counts + pid)
    r = tl.arange(0, BT * HPG_P)                       # ... over every query that selected it, BT tokens at a time
    tok_i, hh = r // HPG_P, r % HPG_P                  # row = (token among the BT) * HPG_P + head of the group
    for j in range(0, count, BT):
        ok = (j + tok_i < count) & (hh < HPG)
        e = tl.load(Entries + start + j + tok_i, mask=ok, other=0)  # entry = ((b * S + t) * G + g) * TOPK + slot
        t = (e // (TOPK * G)) % S
        rows = ((b * S + t[:, None]) * G * HPG + g * HPG + hh[:, None]) * D + d[None, :]
        q = tl.load(Q + rows, mask=ok[:, None], other=0.0)
        do = tl.load(dO + rows, mask=ok[:, None], other=0.0)
        stat = (b * G * HPG + g * HPG + hh) * S + t    # lse and delta are [B, Hq, S]
        lse = tl.load(LSE + stat, mask=ok, other=0.0)
        delta = tl.load(Delta + stat, mask=ok, other=0.0)
        visible = ok[:, None] & (keys[None, :] <= t[:, None])  # causal inside the local block
        p = tl.where(visible, tl.exp(tl.dot(q, tl.trans(k)) * scale - lse[:, None]), 0.0)
        dv += tl.dot(tl.trans(p), do)
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        dk += tl.dot(tl.trans(ds), q)
    tl.store(dK + kv, dk * scale, mask=keys[:, None] < S)  # ... and written once: no other program has these keys
    tl.store(dV + kv, dv, mask=keys[:, None] < S)


def sparse_backward_triton(q, k, v, o, lse, do, selected, block_size):
    """(dq, dk, dv) of sparse attention over selected, from the forward's o and lse [B, Hq, S]: the two walks."""
    B, S, Hq, D = q.shape
    G, topk = k.shape[2], selected.shape[-1]
    hpg, hpg_p, nb = Hq // G, triton.next_power_of_2(Hq // G), triton.cdiv(S, block_size)
    q, k, v, do, lse = (t.contiguous() for t in (q, k, v, do, lse))
    delta = torch.einsum("bthd,bthd->bht", do, o).contiguous()  # rowsum(do * o): one number per row
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dq_kernel[(B * S * G,)](q, k, v, do, lse, delta, selected.contiguous(), dq, S, 1 / math.sqrt(D), G=G, HPG=hpg,
                            D=D, BK=block_size, TOPK=topk, M=max(16, hpg_p))
    entries, starts, counts = inverted_index(selected, nb)     # one program per (batch, group, block): its whole list
    dkdv_kernel[(B * G * nb,)](q, k, v, do, lse, delta, entries, starts, counts, dk, dv, S, nb, 1 / math.sqrt(D),
                               G=G, HPG=hpg, D=D, BK=block_size, TOPK=topk, HPG_P=hpg_p, BT=max(1, 16 // hpg_p))
    return dq, dk, dv

# %%
display(show_edit(kv_outer_kernel, dkdv_kernel))
fp32 = [t.float() for t in (q, k, v, o, lse, do)]          # the kernels in fp32, against the float64 truth
for name, a, b in zip(("dq", "dk", "dv"), sparse_backward_triton(*fp32, sel, Bk), truth):
    print(f"{name}: relative error vs float64 autograd {measure.relative_error(a, b):.1e}")
    assert measure.relative_error(a, b) < runtime.pick(P, cpu=1e-5, gpu=1e-2), name  # fp32; TF32 dots on a GPU

# %% [markdown]
# The package's kernels (`_dq_kernel` and `_dkdv_kernel`) are these two walks, plus strides,
# `exp2`, a `delta` the dQ kernel computes and stores for the second kernel, a split of a block's
# keys where its `dk`, `dv` accumulators do not fit in registers, and the busiest blocks launched
# first. `msa_attention(..., impl="triton")` is differentiable through them.
#
# **The index branch's gradient.** Chapter 03's loss is `KL(P ‖ Q)`, with `Q` the softmax of the
# block scores `L`, averaged over the rows that see two blocks or more. Its gradient with respect
# to a row's scores is `dL = (Σ P) · Q − P` (`Σ P`, the row's teacher mass, is 1), divided by the
# number of rows. A block's score is a
# max, so its `dL` reaches only the key that won it, which section 1's kernel recorded:
#
# ```
# dq_idx[t, g]  += dL[t, g, j] · k_idx[won] / √D_idx       a gather: the row reads its winners' keys
# dk_idx[won]   += dL[t, g, j] · q_idx[t, g] / √D_idx      a scatter: many rows add into one key
# ```
#
# The scatter is turned around like the dK/dV walk. One program per key block walks the rows that
# can see it, and writes the scatter as a product: a one-hot `[rows × keys]` tile (`dL` where the
# row's winner is that key) times the rows' `q_idx`.

# %%
@triton.jit
def dk_idx_kernel(Qi, W, Won, dKi, S, n_blocks, G: tl.constexpr, D: tl.constexpr, BK: tl.constexpr,
                  BLOCK_M: tl.constexpr):
    j, b = tl.program_id(0), tl.program_id(1)          # one program per (key block, sequence): it owns these keys
    keys = j * BK + tl.arange(0, BK)
    d = tl.arange(0, D)
    acc = tl.zeros([BK, D], tl.float32)
    for r0 in range(j * BK * G, S * G, BLOCK_M):       # the (token, group) rows that see block j
        rows = r0 + tl.arange(0, BLOCK_M)
        ok = rows < S * G
        won = tl.load(Won + (b * S * G + rows) * n_blocks + j, mask=ok, other=-1)  # the key that won block j
        w = tl.load(W + (b * S * G + rows) * n_blocks + j, mask=ok, other=0.0)     # the row's gradient for it
        onehot = tl.where(won[:, None] == keys[None, :], w[:, None], 0.0)         # [BLOCK_M, BK]
        q = tl.load(Qi + (b * S * G + rows[:, None]) * D + d[None, :], mask=ok[:, None], other=0.0)
        acc += tl.dot(tl.trans(onehot), q)
    tl.store(dKi + (b * S + keys[:, None]) * D + d[None, :], acc, mask=keys[:, None] < S)

# %% [markdown]
# The truth: chapter 03's loss (the package's reference, which chapter 03 checked its own against),
# differentiated by autograd in float64, with a teacher that puts random mass on each row's
# visible blocks. Then the gradient by hand: section 1's kernel for the scores and their winners,
# `dL` in PyTorch, the gather in PyTorch and the scatter in the kernel above.

# %%
q_idx = torch.randn(B, S, G, 16, generator=g, dtype=torch.float64).to(dev).requires_grad_()
k_idx = torch.randn(B, S, 16, generator=g, dtype=torch.float64).to(dev).requires_grad_()
teacher = vmk.random_teacher(B, S, G, Bk, generator=g).to(dev)    # random mass on each row's visible blocks
loss = index_distill_loss(q_idx, k_idx, teacher, block_size=Bk, impl="reference")
truth_idx = torch.autograd.grad(loss, (q_idx, k_idx))

# %%
qi, ki, teacher = q_idx.detach().float(), k_idx.detach().float(), teacher.float()
L, won = block_scores(qi, ki, Bk)                                  # section 1: each block's score and its winner
L = L.masked_fill(torch.isinf(L), -1e9)                            # a block the row cannot see (chapter 03's rule)
counted = (torch.arange(S, device=dev) >= Bk).view(1, S, 1, 1)     # the rows the loss averages
dL = (teacher.sum(-1, keepdim=True) * L.softmax(-1) - teacher) * counted / (counted.sum() * B * G)
w = (dL / math.sqrt(qi.shape[-1])).contiguous()                    # per (row, block): the winner's share
dq_idx = (w[..., None] * ki[torch.arange(B, device=dev).view(B, 1, 1, 1), won.long()]).sum(-2)  # the gather
dk_idx = torch.empty_like(ki)
dk_idx_kernel[(L.shape[-1], B)](qi, w, won, dk_idx, S, L.shape[-1], G=G, D=qi.shape[-1], BK=Bk, BLOCK_M=16)  # scatter
for name, a, b in zip(("dq_idx", "dk_idx"), (dq_idx, dk_idx), truth_idx):
    print(f"{name}: relative error vs float64 autograd {measure.relative_error(a, b):.1e}")
    assert measure.relative_error(a, b) < runtime.pick(P, cpu=1e-5, gpu=1e-2), name  # fp32; TF32 dots on a GPU

# %% [markdown]
# The package's index kernels (`minimax_lab/attention/msa_backward_index_triton.py`) are these three
# steps: section 1's kernel keeping the winners, the gather, and this scatter.
#
# **Trained end to end.** The tiny model of chapter 01 with MSA (top-1 of 16-token blocks: a token
# past the first block sees only its own) and the index loss, trained from the same weights and
# data through the PyTorch implementation and through the package's Triton kernels, with dense
# attention beside them; each model then answers held-out questions. On the CPU the interpreter
# runs every kernel program in Python, so this is a few steps of a one-layer model, and what it can
# show is that the two MSA runs agree step by step; the GPU preset trains a few hundred steps.

# %%
msa = dict(attention="msa", use_indexer=True, msa_block_size=16, msa_topk=1)   # what MSA changes in the model
trained = vmk.train_runs(P, msa=msa, index_loss_weight=0.5, steps=runtime.pick(P, cpu=2, gpu=300), device=dev)
vmk.training_figure(trained)
plt.show()
print(vmk.training_words(trained))

# %% [markdown]
# The first line is the point of this cell: the kernels compute PyTorch's gradients, so training
# through them follows the same path. The lines after it say whether the steps bought anything
# measurable, each gap judged against two standard errors over the held-out questions.
#
# ## On a GPU
#
# The `msa` bench suite (`python -m minimax_lab.bench msa`) times the package's kernels at MSA's
# production shape, `MSA_SHAPE`: the attention layer of MiniMax M3, the MiniMax model the MSA paper
# describes (heads, head size, block size and `topk` are in the figure's title), and the shape of
# the model chapter 09 serves. It times them against dense attention and the sparse peers; the
# figure and the lines under it read its records.

# %%
msa_records.gpu_figure()
plt.show()
print(msa_records.gpu_summary())
print(msa_records.backward_summary())

# %% [markdown]
# ## Exercises
#
# Each is checked on fresh random inputs (`exercises.check` says what is right or wrong; it never
# stops the notebook). Solutions are in `minimax_lab/exercises/solutions/ch04.py`; try first. The
# keys go from 04.3 to 04.9 with nothing between: they are the checkers' fixed names, so an answer
# saved under a key keeps its checker.
#
# **04.1 Sparse attention over the selected blocks, in PyTorch.** The whole main branch for one
# sequence: an exact softmax over the keys of the selected blocks, causal inside the local block,
# with `-1` slots, rows with no block at all, and a ragged last block. The checker compares with
# `msa_attention(impl="torch")`, which your answer may not call. Then compare your version with section 4's kernel: the same rule,
# in tiles.

# %%
def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, selected: torch.Tensor,
                     block_size: int) -> torch.Tensor:
    """Attention over the selected blocks only, for one sequence. ``q [S, Hq, D]``,
    ``k, v [S, G, D]`` (query head ``h`` belongs to group ``h // (Hq // G)``), ``selected int32
    [S, G, topk]`` (block ids, ``-1`` = unused slot). Query ``t``, head ``h`` attends with an exact
    softmax (scale ``1/sqrt(D)``) over the keys ``j`` that lie in one of its group's selected
    blocks and satisfy ``j <= t`` (causal inside the local block; keys past ``S - 1`` do not
    exist). A row that sees no key outputs 0. Return ``[S, Hq, D]`` in q's dtype."""
    raise NotImplementedError  # your code here (gather the blocks, or build a mask: both are fine)


exercises.check("04.1", sparse_attention)

# %% [markdown]
# **04.2 Balanced runs.** The bars of the picture at the top (each block's list: the work of one
# section 5 program) are uneven: one program per block leaves the popular blocks' programs running
# long after the rest. Cut each block's list into runs of at most `max_run` entries, one program per
# run, as the package's kernel does. The checker compares every run on fresh lists, empty ones and
# exact multiples of `max_run` among them.

# %%
def split_runs(counts: torch.Tensor, max_run: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Balance KV-outer's work. ``counts`` int ``[n_lists]``: the length of each KV block's list of
    entries; the lists lie one after another in one entries array, in order. Cut every list into
    runs of at most ``max_run`` entries (the last run of a list may be shorter), one program each.
    Return three int32 tensors of equal length, one element per run, ordered by list and then by
    position: ``list_id`` (the run's list), ``start`` (its first entry's index in the entries
    array) and ``length`` (``1 .. max_run``). An empty list gets no run."""
    raise NotImplementedError  # your code here (no Python loop over the lists needed)


exercises.check("04.2", split_runs)

# %% [markdown]
# **04.3 The merge, in Triton.** Section 5 merges the partial outputs in torch. Write that merge as
# a Triton kernel. Complete `merge_kernel` below (one program per `BLOCK_R` rows) and launch it
# from `merge_partials`. The checker draws slot counts that are not powers of two, rows with no
# partial at all, and log-sum-exps large enough that `exp(lse)` overflows fp32, and verifies that your
# kernel did the merge.

# %%
@triton.jit
def merge_kernel(Po, Plse, Out, R, TOPK: tl.constexpr, TOPK_P: tl.constexpr, D: tl.constexpr,
                 BLOCK_R: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    slots = tl.arange(0, TOPK_P)                       # TOPK_P: TOPK rounded up to a power of two
    d = tl.arange(0, D)
    # your code here: load the rows' lse [BLOCK_R, TOPK_P] (-inf where masked), take each row's max
    # (a row of -inf: use 0), weights exp(lse - max) normalized to sum 1, then add up
    # weight * Po[row, slot, :] slot by slot, and store [BLOCK_R, D] rows of Out


def merge_partials(po: torch.Tensor, plse: torch.Tensor) -> torch.Tensor:
    """KV-outer's merge, computed by a Triton kernel. ``po`` fp32 ``[R, topk, D]``: each row's
    partial outputs, each normalized over one block; ``plse`` fp32 ``[R, topk]``: their
    log-sum-exps (natural log; ``-inf``: the slot holds nothing). Return fp32 ``[R, D]``

        out[r] = sum over slots s of exp(plse[r, s] - lse[r]) * po[r, s],  lse[r] = logsumexp_s plse[r, s]

    and 0 for a row whose slots all hold nothing. ``R`` and ``topk`` can be any size; ``D`` is a
    power of two."""
    raise NotImplementedError  # your code here: launch a kernel like the one above, one program per tile of rows


exercises.check("04.3", merge_partials)

# %% [markdown]
# **04.9 The backward of one block, in Triton.** Write the step both walks of section 6 repeat: one program, a tile of query rows and one key block, the
# forward's `lse` and `delta` given, masks for the causal part and for the padding up to the tile
# sizes. The checker draws fresh ragged sizes and positions and an `lse` that also counts keys of other
# blocks (so `p` must be recomputed from it), verifies that your kernel computed the gradients, and
# says which one is off.

# %%
def block_backward(q, k, v, do, lse, delta, q_pos, k_pos, scale):
    """One key block's share of the attention backward, computed by a ``@triton.jit`` kernel that
    you write above this function and launch here (one program is enough).

    ``q``, ``do`` ``[M, D]``: query rows and the output's gradient; ``k``, ``v`` ``[N, D]``: the
    block's keys and values; ``lse``, ``delta`` ``[M]`` fp32: each row's log-sum-exp from the
    forward and ``sum(do * o)``; ``q_pos [M]``, ``k_pos [N]`` int32 positions (row ``i`` sees key
    ``j`` when ``k_pos[j] <= q_pos[i]``); ``scale`` the softmax scale. All on
    ``runtime.kernel_device()``, fp32, ``M, N <= 64``, ``D <= 64`` (pad to powers of two >= 16
    inside the kernel and mask the padding).

    Return ``(dq [M, D], dk [N, D], dv [N, D])``::

        p  = exp(scale * q @ k.T - lse[:, None])    on visible pairs, 0 elsewhere
        dv = p.T @ do
        ds = p * (do @ v.T - delta[:, None])
        dq = scale * ds @ k
        dk = scale * ds.T @ q
    """
    raise NotImplementedError  # your code here: the kernel above, its launch here


exercises.check("04.9", block_backward)

# %% [markdown]
# ## What limits us
#
# The index kernel scores every earlier block for every query: `O(S²·D_idx)` dot products, against
# `O(S·topk·Bk·D)` for the attention. The first paragraph below reads both from the records.
# KV-outer reuses each K/V tile for every query that picked it, but it pays in bytes. It gathers
# each entry's query rows, writes a partial output of the same size, and the merge reads it back.
# The second paragraph counts those bytes at 128k: whatever the tensor cores do, moving them at
# copy speed is a floor under the sparse part. Going below it takes fewer partials: for example, a
# program that keeps the softmax of a tile of neighbouring tokens in registers across the blocks
# they share. The backward pays the same gather twice over (`q`, `do`, `lse` and `delta` per
# entry), and its KV-outer programs are as uneven as the lists, since a list cannot be cut.

# %%
print(msa_records.index_growth(), msa_records.kv_outer_floor(), sep="\n\n")

# %% [markdown]
# ---
# **Previous:** [03 · MiniMax Sparse Attention](03_minimax_sparse_attention.ipynb) · **Next:** [05 · Mixture of Experts](05_mixture_of_experts.ipynb)
#
# **Read more:** the MSA paper (arXiv 2606.13392), whose KV-outer schedule section 5 builds;
# FlashAttention-2 (arXiv 2307.08691), whose backward recomputes `p` from the log-sum-exp as section
# 6 does; Triton's [fused-attention tutorial](https://triton-lang.org/main/getting-started/tutorials/06-fused-attention.html),
# forward and backward; Native Sparse Attention (Yuan et al. 2025, arXiv 2502.11089), another
# top-k block attention with Triton kernels for both passes.
#
# **Package code used here:** `minimax_lab/attention/msa.py`, `minimax_lab/attention/msa_torch.py`, `minimax_lab/attention/msa_triton_select.py`, `minimax_lab/attention/msa_triton_prefill.py`, `minimax_lab/attention/msa_triton_decode.py`, `minimax_lab/attention/msa_backward.py`, `minimax_lab/attention/msa_backward_triton.py`, `minimax_lab/attention/msa_backward_autograd.py`, `minimax_lab/attention/msa_backward_index.py`, `minimax_lab/attention/msa_backward_index_triton.py`, `minimax_lab/triton_blocks.py`, `minimax_lab/viz/msa_kernels.py`, `minimax_lab/viz/msa_records.py`, `minimax_lab/exercises/ch04.py`

# %%
display(Markdown(vmk.provenance(preset=P, seconds=time.perf_counter() - t_start, x=x, backward=(q, k, sel),
                                trained=trained)))
