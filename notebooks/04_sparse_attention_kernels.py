# %% [markdown]
# # 04 · Sparse attention kernels: MSA's index and attention in Triton
#
# **What this chapter builds:** MSA's two kernels in small Triton: the index kernel (block scores,
# then a streaming top-k over int64 keys) and the sparse attention, first query-outer, then KV-outer
# with its inverted index; each checked against the package on the same inputs. Then the backward of
# one block, so a model can be trained through the kernels.
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
# three times (`impl="reference" | "torch" | "triton"`). Here we build the Triton path in four small
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

import matplotlib.pyplot as plt
import torch

from minimax_lab import exercises, measure, runtime  # first: on a CPU it switches Triton to its interpreter

import triton  # noqa: E402 (after runtime, see above)
import triton.language as tl  # noqa: E402
from minimax_lab.attention import MSA_SHAPE, msa_attention, msa_decode_paged, msa_select, msa_triton_prefill
from minimax_lab.attention.msa_torch import block_scores_torch
from minimax_lab.attention.msa_triton_select import selection_from_keys
from minimax_lab.triton_blocks import dot_precision
from minimax_lab.viz import msa as vmsa
from minimax_lab.viz.excerpt import excerpt

# %%
P = runtime.resolve_preset(preset)
dev = runtime.kernel_device()
torch.set_num_threads(runtime.pick(P, cpu=1, gpu=torch.get_num_threads()))  # small matrices: a 2nd thread only waits
x = vmsa.kernel_inputs(P, seed=0)   # q, k, v, q_idx, k_idx: fixed seed, a ragged last block
kw = dict(block_size=x.Bk, topk=x.topk)
print(f"device {runtime.device_name()}, preset {P}, interpreter {runtime.is_interpreter()}")
print(x.describe())
ref_sel = msa_select(x.q_idx, x.k_idx, impl="torch", **kw)  # the package's selection: what every kernel is checked on
vmsa.inverted_index_figure(ref_sel[0, :, 0].cpu(), block_size=x.Bk, block=2,
                           title="one sequence, group 0: the selection read by rows and by columns")
plt.show()

# %% [markdown]
# ## 1. Block scores
#
# A block's score for a query row is the largest index dot product over the block's keys,
# `max_j q_idx[t, g] · k_idx[j] / √D_idx` (only keys `j ≤ t` count). The smallest kernel computes
# the whole score table. There is one program per (tile of `BLOCK_M` rows, key block `j`,
# sequence). A row is one (token, group) pair. The `G` groups of a token share its index key, so
# packing them into the tile's rows lets one loaded key block serve all of them.

# %%
@triton.jit
def block_scores_kernel(Qi, Ki, Out, S, n_blocks, scale,
                        G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BK: tl.constexpr,
                        PRECISION: tl.constexpr):
    """Out[b, t, g, j] = max over the keys i <= t of block j of q_idx[b, t, g] . k_idx[b, i] * scale."""
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
    tl.store(Out + (b * S * G + rows) * n_blocks + j, tl.max(s, axis=1), mask=row_ok)


def block_scores(q_idx, k_idx, block_size):
    """Block scores fp32 [B, S, G, n_blocks] of q_idx [B, S, G, D_idx], k_idx [B, S, D_idx] (D_idx a power of 2 >= 16)."""
    B, S, G, D = q_idx.shape
    nb = triton.cdiv(S, block_size)
    out = torch.empty(B, S, G, nb, device=q_idx.device, dtype=torch.float32)
    block_scores_kernel[(triton.cdiv(S * G, 16), nb, B)](
        q_idx.contiguous(), k_idx.contiguous(), out, S, nb, 1 / math.sqrt(D), G=G, D=D, BLOCK_M=16,
        BK=block_size, PRECISION=dot_precision(q_idx.dtype))  # fp32 inputs: full fp32 products, no TF32
    return out


scores = block_scores(x.q_idx, x.k_idx, x.Bk)
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
print(vmsa.key_table(scores=[0.75, -0.5, 0.75, -1.0, 2.0], block_ids=[3, 5, 7, 8, 9]))

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
ties = vmsa.kernel_inputs(P, seed=1)  # integer-valued index vectors: many exactly tied scores
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
    q = tl.load(Q + ((b * S + t) * G * HPG + h[:, None]) * D + d[None, :], mask=h_ok[:, None], other=0.0)
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
    tl.store(O + ((b * S + t) * G * HPG + h[:, None]) * D + d[None, :], out.to(O.dtype.element_ty), mask=h_ok[:, None])


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
for name, sh in (("here", dict(Hq=x.Hq, G=x.G)), ("MSA's shape", MSA_SHAPE)):
    hpg = sh["Hq"] // sh["G"]
    print(f"{name}: Hq/G = {hpg} query heads per group -> a {max(16, triton.next_power_of_2(hpg))}-row tile, "
          f"{hpg} of them useful, per selected block loaded")

# %% [markdown]
# **Decode is query-outer with one query.** At decode time the newest token of each sequence attends
# over its selected blocks in a *paged* KV cache. There a block is a page, and pages live anywhere
# in memory (chapter 06). Causality makes the decode output at the last position equal to the
# prefill output at that position. So our kernel's rows must match `msa_decode_paged` on a cache
# whose pages are shuffled. The second sequence is shorter, so its last page is partly filled.

# %%
table = torch.randperm(x.B * x.n_blocks, generator=torch.Generator().manual_seed(2)).view(x.B, x.n_blocks)
table = table.to(runtime.kernel_device(), torch.int32)
kc, vc, kic = (vmsa.paged_cache(t, table, x.Bk) for t in (x.k, x.v, x.k_idx))
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
        q = tl.load(Q + ((b * S + t[:, None]) * G * HPG + g * HPG + hh[:, None]) * D + d[None, :],
                    mask=ok[:, None], other=0.0)
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
#   two tiles ahead, and no load waits on the one before it. These are the loop's first lines:

# %%
excerpt(msa_triton_prefill._kv_outer_kernel, "for j in range(0, n_tok, BT):", 7)

# %% [markdown]
# ## 6. Training through MSA: the backward of one block
#
# M3 was trained with MSA from the start, so its sparse attention needs a backward pass. Everything
# so far served the forward; this section builds the backward the way the forward was built: one
# block in PyTorch cells first, then the two Triton kernels, then the tiny model trained through
# them.
#
# **What the forward keeps.** For each query row (token, head) the forward already computes the
# log-sum-exp `lse` of the row's scores over *all* of its selected keys, and the selection itself.
# With `lse`, the softmax weight of any visible (query, key) pair is `p = exp(scale · q·k − lse)`:
# no running max, no other block needed. So the backward splits into independent pieces, one per
# (query tile, selected block):
#
# ```
# dv   += pᵀ · do                      dp    = do · vᵀ
# delta = rowsum(do ∘ o)                ds    = p ∘ (dp − delta)
# dq   += scale · ds · k               dk   += scale · dsᵀ · q
# ```
#
# `delta` is one number per row (it is `Σⱼ pⱼ dpⱼ`, computed once from the output). If the loss also
# uses `lse` (the distillation below does not, other losses may), its gradient enters as
# `delta − dlse`.

# %%
# One query tile at positions 10..15 and the block holding keys 0..15 (its local block: causal)
g = torch.Generator().manual_seed(0)
M, N, D = 6, 16, 32
q, k, v = (torch.randn(n, D, generator=g, dtype=torch.float64, requires_grad=True) for n in (M, N, N))
do = torch.randn(M, D, generator=g, dtype=torch.float64)
q_pos, k_pos, scale = torch.arange(10, 10 + M), torch.arange(N), D ** -0.5
visible = k_pos[None, :] <= q_pos[:, None]
s = ((q @ k.T) * scale).masked_fill(~visible, float("-inf"))
o, lse = torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)     # the forward, keeping lse

with torch.no_grad():                                          # the backward, by hand
    p = torch.exp((q @ k.T) * scale - lse[:, None]).masked_fill(~visible, 0.0)
    delta = (do * o).sum(-1)
    ds = p * (do @ v.T - delta[:, None])
    mine = (scale * ds @ k, scale * ds.T @ q, p.T @ do)
autograd = torch.autograd.grad(o, (q, k, v), do)
for name, a, b in zip(("dq", "dk", "dv"), mine, autograd):
    print(f"{name}: largest difference from autograd {(a - b).abs().max().item():.1e}")

# %% [markdown]
# **Blocks are independent given `lse`.** Split the same keys into two blocks of 8: each block's
# contribution uses the row's *global* `lse` and `delta`, so the per-block pieces simply add up. This
# is what lets the backward walk the selection in any order.

# %%
def block_share(q, k, v, do, lse, delta, visible, scale):
    p = torch.exp((q @ k.T) * scale - lse[:, None]).masked_fill(~visible, 0.0)
    ds = p * (do @ v.T - delta[:, None])
    return scale * ds @ k, scale * ds.T @ q, p.T @ do


with torch.no_grad():
    halves = [block_share(q, k[i:i + 8], v[i:i + 8], do, lse, delta, visible[:, i:i + 8], scale) for i in (0, 8)]
dq_sum = halves[0][0] + halves[1][0]                                # a row's dq: summed over its blocks
dk_cat = torch.cat([halves[0][1], halves[1][1]])                    # a key's dk: from its own block only
print(f"dq from two blocks vs one: {(dq_sum - mine[0]).abs().max().item():.1e}; "
      f"dk: {(dk_cat - mine[1]).abs().max().item():.1e}")

# %% [markdown]
# **Two walks, no atomics.** `dq` of a row sums over the blocks *the row* selected: the
# query-outer order — one program per (token, group), the group's heads packed into the tile,
# walking its `topk` blocks, as the forward's query-outer kernel does. `dk` and `dv` of a key sum
# over the rows *that selected its block*: the KV-outer order. The forward's inverted index already
# lists, for every KV block, the (token, slot) entries that chose it; a backward program takes one
# block and **all** of its entries, so it adds in registers and writes its block's `dk`, `dv` once —
# no two programs ever touch the same key, so no atomic adds and the result is deterministic.
# Blocks chosen by many tokens make long programs: they are launched first.

# %%
from minimax_lab.attention.msa_backward_triton import block_work_list

sel = msa_select(torch.randn(1, 70, 1, 16, device=dev), torch.randn(1, 70, 16, device=dev), block_size=16, topk=2)
entries, tile_gk, tile_start, tile_len = block_work_list(sel, n_blocks=5)
for gk, start, n in zip(tile_gk.tolist(), tile_start.tolist(), tile_len.tolist()):
    tokens = (entries[start:start + n].long() // 2).tolist()          # entry = token * topk + slot (B = G = 1)
    shown = tokens if n <= 10 else tokens[:5] + ["..."] + tokens[-5:]
    print(f"block {gk}: selected by {n:>2} tokens {shown}")

# %% [markdown]
# The package's two kernels are these two walks. The KV-outer one, with the step of the cells
# above in its loop (`p` from `lse`, then `dv`, `ds`, `dk`):

# %%
from minimax_lab.attention import msa_backward_triton

excerpt(msa_backward_triton._dkdv_kernel, "for j in range(0, n_tok, BT):", 22)

# %% [markdown]
# Checked against float64 autograd through the dense reference, on a ragged batch with GQA
# (two query heads per KV head), a row that selected nothing and a gradient through `lse` too —
# then used as any PyTorch op: `msa_attention(..., impl="triton")` is differentiable.

# %%
from minimax_lab.attention.msa_backward import msa_attention_backward, sparse_attention

g = torch.Generator().manual_seed(1)
B, S, G, hpg, Dh = 2, 45, 2, 2, 16
q, do = (torch.randn(B, S, G * hpg, Dh, generator=g).to(dev) for _ in range(2))
k, v = (torch.randn(B, S, G, Dh, generator=g).to(dev) for _ in range(2))
sel = msa_select(torch.randn(B, S, G, 16, generator=g).to(dev), torch.randn(B, S, 16, generator=g).to(dev),
                 block_size=16, topk=2)
sel[0, 20] = -1                                                       # a row that attends to nothing
o, lse = sparse_attention(q, k, v, sel, block_size=16)                # Triton forward, keeps lse
dlse = torch.randn(lse.shape, generator=g).to(dev).masked_fill(torch.isinf(lse), 0.0)
ours = msa_attention_backward(q, k, v, o, lse, do, sel, block_size=16, dlse=dlse, impl="triton")
truth = msa_attention_backward(q.double(), k.double(), v.double(), o.double(), lse.double(), do.double(), sel,
                               block_size=16, dlse=dlse.double(), impl="reference")
for name, a, b in zip(("dq", "dk", "dv"), ours, truth):
    print(f"{name}: relative error vs float64 autograd {measure.relative_error(a, b):.1e}")

# %% [markdown]
# **The index branch learns too.** The top-k passes no gradient, so the index branch is taught by
# the attention it serves: the KL from the main branch's block mass to the softmax of its block
# scores (the distillation of section 3). Its gradient reaches `q_idx` and `k_idx` through the max
# of each block — to the one token that won it — so the Triton version never holds the `S × S`
# scores: one kernel max-pools the score tiles and remembers the winners, two more send the
# gradient back along them (`minimax_lab.attention.msa_backward_index`).
#
# **Trained end to end.** The tiny model, with MSA (top-1 of 16-token blocks: a token beyond the
# first block sees only its own) and the index loss, trained on the same data through the PyTorch
# implementation and through the Triton kernels; dense attention beside them. On the CPU the Triton
# interpreter runs every kernel program in Python, so this is three steps of a one-layer model: all
# three stay near chance, and what the cell shows is that the two MSA runs agree step for step. The
# GPU preset trains all three for 1,500 steps.

# %%
from minimax_lab.model import TrainConfig, accuracy, preset_config, train
from minimax_lab.data import make_examples
from minimax_lab.notebook import words

steps = runtime.pick(P, cpu=3, gpu=1500)
tc = TrainConfig(steps=steps, batch_size=runtime.pick(P, cpu=2, gpu=64), warmup=min(100, steps // 3 + 1),
                 eval_every=steps, eval_examples=runtime.pick(P, cpu=2, gpu=256), index_loss_weight=0.5)
layers = dict(n_layers=1) if P == "cpu" else {}
msa = dict(attention="msa", use_indexer=True, msa_block_size=16, msa_topk=1, **layers)
runs = {"dense": preset_config(P, **layers), "msa_torch": preset_config(P, attn_impl="torch", **msa),
        "msa_triton": preset_config(P, attn_impl="triton", **msa)}
held_out = make_examples("test", 500, 1)
acc = {}
for name, cfg in runs.items():
    model, hist = train(cfg, tc if name != "dense" else TrainConfig(**{**tc.__dict__, "index_loss_weight": 0.0}),
                        progress=False, device=dev)
    model.cfg.attn_impl = "torch"                                     # score every model the same way
    acc[name] = accuracy(model, held_out)["all"]
    print(f"{name:>10}: final training loss {hist['loss'][-1]:.3f}, held-out accuracy {acc[name]:.3f}")
print(f"MSA through Triton scores {words.more_or_less(acc['msa_triton'], acc['msa_torch'])} through PyTorch, "
      f"{words.more_or_less(acc['msa_triton'], acc['dense'])} dense attention")

# %% [markdown]
# ## On a GPU
#
# The `msa` bench suite (`python -m minimax_lab.bench msa`) times the package's kernels at MSA's
# production shape against dense attention and the sparse peers; the figure and the lines under it
# read its records.

# %%
fig = vmsa.prefill_figure()
plt.show()
print(vmsa.gpu_summary())

# %% [markdown]
# ## Exercises
#
# Each is checked on fresh random inputs (`exercises.check` says what is right or wrong; it never
# stops the notebook). Solutions are in `minimax_lab/exercises/solutions/ch04.py`; try first.
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
# **04.9 The backward of one block, in Triton.** Write the kernel of the first cells: one program, a tile of query rows and one key block, the
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
# `O(S·topk·Bk·D)` for the attention. So at long context the index branch, not the attention,
# becomes the larger term, and with FP8 dots its other work (the max-pool, the key, the insertion)
# competes with the tensor cores on the same warps. KV-outer reuses each K/V tile for every query
# that picked it, but it pays in bytes. It gathers each entry's query rows, writes a partial output
# of the same size, and the merge reads it back. The line below counts those bytes at 128k from the
# records. Whatever the tensor cores do, moving them at copy speed is a floor under the sparse part.
# Going below it takes fewer partials: for example, a program that keeps the softmax of a tile of
# neighbouring tokens in registers across the blocks they share.

# %%
print(vmsa.kv_outer_floor())

# %% [markdown]
# ---
# **Previous:** [03 · MiniMax Sparse Attention](03_minimax_sparse_attention.ipynb) · **Next:** [05 · Mixture of Experts](05_mixture_of_experts.ipynb)
#
# **Package code used here:** `minimax_lab/attention/msa.py`, `minimax_lab/attention/msa_torch.py`, `minimax_lab/attention/msa_triton_select.py`, `minimax_lab/attention/msa_triton_prefill.py`, `minimax_lab/attention/msa_triton_decode.py`, `minimax_lab/attention/msa_backward.py`, `minimax_lab/attention/msa_backward_triton.py`, `minimax_lab/attention/msa_backward_autograd.py`, `minimax_lab/attention/msa_backward_index.py`, `minimax_lab/triton_blocks.py`, `minimax_lab/viz/msa.py`, `minimax_lab/exercises/ch04.py`
