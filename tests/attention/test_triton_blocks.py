"""The shared Triton building blocks (``minimax_lab.triton_blocks``) on their own: a tiny kernel
walks ragged rows of keys tile by tile with ``online_softmax_step`` / ``finish_rows`` and must match
softmax attention computed in float64 (rows fully masked included: output 0, lse -inf); another
merges split partials with ``merge_weights`` and must match the unsplit result; the top-k key
(``topk_key``) equals its torch twin bit for bit. Inputs on the kernel device: the interpreter on a
CPU, compiled kernels on a GPU (fp32 dots in TF32 there)."""
from __future__ import annotations

import math

import pytest
import torch

from tests.support.devices import DEVICE, generator, randn, tol  # first: decides the runtime before Triton loads

import triton
import triton.language as tl

from minimax_lab.measure import relative_error
from minimax_lab.triton_blocks import (ID_BITS, KEY_MAX, KEY_MIN, LOG2E, finish_rows, merge_weights, natural_lse,
                                       needs_fp32_dot, online_softmax_step, topk_block, topk_block_torch, topk_key,
                                       topk_key_torch, upcast_if)


@triton.jit
def _walk_kernel(Q, K, V, LENS, O, LSE, qk_scale, N_KEYS, M: tl.constexpr, D: tl.constexpr,
                 BLOCK_N: tl.constexpr, CAST: tl.constexpr):
    """Rows r < M see keys [0, LENS[r]) of one shared K/V; tiles of BLOCK_N keys."""
    rows = tl.arange(0, M)
    d = tl.arange(0, D)
    n = tl.arange(0, BLOCK_N)
    lens = tl.load(LENS + rows)
    q = upcast_if(tl.load(Q + rows[:, None] * D + d[None, :]), CAST)
    m_i = tl.full([M], float("-inf"), tl.float32)
    l_i = tl.zeros([M], tl.float32)
    acc = tl.zeros([M, D], tl.float32)
    for start in range(0, N_KEYS, BLOCK_N):
        cols = start + n
        k = upcast_if(tl.load(K + cols[:, None] * D + d[None, :], mask=cols[:, None] < N_KEYS, other=0.0), CAST)
        v = upcast_if(tl.load(V + cols[:, None] * D + d[None, :], mask=cols[:, None] < N_KEYS, other=0.0), CAST)
        qk = tl.dot(q, tl.trans(k))
        qk = tl.where(cols[None, :] < lens[:, None], qk, float("-inf"))
        acc, m_i, l_i = online_softmax_step(acc, m_i, l_i, qk, qk_scale, v)
    out, lse = finish_rows(acc, m_i, l_i)
    tl.store(O + rows[:, None] * D + d[None, :], out)
    tl.store(LSE + rows, natural_lse(lse))


@triton.jit
def _merge_kernel(PO, PLSE, O, P: tl.constexpr, M: tl.constexpr, D: tl.constexpr):
    """Row r merges partials PO [P, M, D] (each normalized) by their base-2 lse PLSE [P, M]."""
    p = tl.arange(0, P)
    rows = tl.arange(0, M)
    d = tl.arange(0, D)
    lse = tl.load(PLSE + p[:, None] * M + rows[None, :])  # [P, M]
    m, total = merge_weights(lse)
    w = tl.math.exp2(lse - m[None, :])
    acc = tl.zeros([M, D], tl.float32)
    for i in tl.static_range(P):
        w_i = tl.sum(tl.where(p[:, None] == i, w, 0.0), 0)
        o_i = tl.load(PO + (i * M + rows[:, None]) * D + d[None, :])
        acc += w_i[:, None] * o_i
    tl.store(O + rows[:, None] * D + d[None, :], acc / tl.where(total == 0.0, 1.0, total)[:, None])


def _attention64(q, k, v, lens, scale):
    """float64 softmax attention of row r over keys [0, lens[r]); 0 and -inf for an empty row."""
    q, k, v = (t.double().cpu() for t in (q, k, v))
    s = q @ k.T * scale
    seen = torch.arange(k.shape[0])[None, :] < lens.cpu()[:, None]
    s = s.masked_fill(~seen, float("-inf"))
    lse = torch.logsumexp(s, 1)
    p = torch.where(seen, torch.exp(s - torch.where(lse.isinf(), 0.0, lse)[:, None]), 0.0)
    return p @ v, lse


@pytest.mark.parametrize("n_keys,block_n", [(50, 16), (16, 16), (7, 16), (130, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_online_softmax_walk_matches_float64_attention(n_keys, block_n, dtype):
    g = generator()
    M, D = 16, 32
    q, k, v = (randn(*shape, gen=g, dtype=dtype) for shape in ((M, D), (n_keys, D), (n_keys, D)))
    lens = torch.randint(1, n_keys + 1, (M,), generator=g)
    lens[0], lens[1] = 0, n_keys  # an empty row, a row that sees everything
    lens = lens.to(torch.int32).to(DEVICE)
    scale = 1 / math.sqrt(D)
    o = torch.empty(M, D, dtype=torch.float32, device=DEVICE)
    lse = torch.empty(M, dtype=torch.float32, device=DEVICE)
    _walk_kernel[(1,)](q, k, v, lens, o, lse, scale * LOG2E, n_keys, M=M, D=D, BLOCK_N=block_n,
                       CAST=needs_fp32_dot(dtype))
    o_ref, lse_ref = _attention64(q, k, v, lens, scale)
    assert relative_error(o.cpu(), o_ref) < tol(dtype)
    assert torch.equal(o[0].cpu(), torch.zeros(D)), "a row that saw no key must give 0"
    assert lse[0].item() == float("-inf")
    assert torch.allclose(lse[1:].double().cpu(), lse_ref[1:], atol=5e-3, rtol=5e-3)


def test_merge_of_split_partials_equals_the_unsplit_result():
    """Split the keys in P pieces, normalize each piece alone (with its base-2 lse), merge: the
    same output as attention over all keys. An empty piece (lse -inf) weighs nothing; a row whose
    pieces are all empty merges to 0."""
    g = generator()
    P, M, D, n = 4, 16, 32, 64
    q, k, v = (randn(*shape, gen=g, dtype=torch.float32).double().cpu() for shape in ((M, D), (n, D), (n, D)))
    s = q @ k.T
    pieces = torch.arange(n) // (n // P)
    parts, lses = [], []
    for i in range(P):
        si = s.masked_fill(pieces[None, :] != i, float("-inf"))
        si[3] = float("-inf")                     # row 3: every piece empty
        if i == 2:
            si[5] = float("-inf")                 # row 5: piece 2 empty
        lse = torch.logsumexp(si, 1)
        w = torch.where(lse.isinf()[:, None], 0.0, torch.exp(si - torch.where(lse.isinf(), 0.0, lse)[:, None]))
        parts.append(w @ v)
        lses.append(lse * LOG2E)
    po = torch.stack(parts).float().to(DEVICE)
    plse = torch.stack(lses).float().to(DEVICE)
    o = torch.empty(M, D, dtype=torch.float32, device=DEVICE)
    _merge_kernel[(1,)](po, plse, o, P=P, M=M, D=D)
    full = s.clone()
    full[3] = float("-inf")
    full[5] = full[5].masked_fill(pieces == 2, float("-inf"))
    lse_all = torch.logsumexp(full, 1)
    ref = torch.where(lse_all.isinf()[:, None], 0.0,
                      torch.exp(full - torch.where(lse_all.isinf(), 0.0, lse_all)[:, None])) @ v
    assert relative_error(o.cpu(), ref) < 1e-5
    assert torch.equal(o[3].cpu(), torch.zeros(D))


@triton.jit
def _key_kernel(S, IDS, KEYS, BLOCKS, N: tl.constexpr):
    i = tl.arange(0, N)
    key = topk_key(tl.load(S + i), tl.load(IDS + i))
    tl.store(KEYS + i, key)
    tl.store(BLOCKS + i, topk_block(key))


def test_topk_key_equals_its_torch_twin_bit_for_bit():
    """Ties, -inf, +inf, -0.0 and +0.0, negatives, subnormals and the extreme block ids: the Triton
    key and the torch key are the same int64; the order is "higher score, then lower id" (-0.0
    ranks as +0.0); every block id comes back out of its key."""
    g = generator()
    tiny = torch.finfo(torch.float32).tiny
    special = [0.0, -0.0, 0.0, float("-inf"), float("inf"), -1.5, -1.5, 1.5, 1.5, tiny / 4, -tiny / 4, 3e38, -3e38,
               1.0, 1.0, -0.0]
    scores = torch.cat([torch.tensor(special), randn(48, gen=g, dtype=torch.float32).cpu()]).float()
    ids = torch.cat([torch.tensor([0, 5, 1, 2, 3, 7, 4, 9, 8, 10, 11, 12, 13, (1 << ID_BITS) - 1, 0, 6]),
                     torch.randint(0, 1 << ID_BITS, (48,), generator=g)]).to(torch.int32)
    keys = torch.empty(64, dtype=torch.int64, device=DEVICE)
    blocks = torch.empty(64, dtype=torch.int64, device=DEVICE)
    _key_kernel[(1,)](scores.to(DEVICE), ids.to(DEVICE), keys, blocks, N=64)
    want = topk_key_torch(scores, ids)
    assert torch.equal(keys.cpu(), want)
    assert torch.equal(blocks.cpu(), ids.long()) and torch.equal(topk_block_torch(want), ids.long())
    assert want[0] == topk_key_torch(torch.tensor([-0.0]), torch.tensor([0]))[0]   # -0.0 ranks as +0.0
    assert want[2] > want[1] and want[8] > want[7] and want[6] > want[5]    # ties: the lower id wins
    assert want[3] < want[12] < want[5] < want[0] < want[9] < want[7] < want[11] < want[4]  # -inf < ... < +inf
    assert KEY_MIN < int(want.min()) and int(want.max()) < KEY_MAX
    order = sorted(range(64), key=lambda j: (-scores[j].item() if scores[j] != 0 else 0.0, ids[j].item()))
    assert torch.equal(want.argsort(descending=True), torch.tensor(order))
