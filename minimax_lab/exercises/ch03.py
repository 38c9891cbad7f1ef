"""Exercises of chapter 03 (MiniMax Sparse Attention): the index branch's two steps, then the
sparse attention they feed, in PyTorch, for one sequence.

* 03.1 block scores from mean-pooled keys: one dot per (query, block) instead of one per key;
* 03.2 the top-k rule of MSA: the ``topk - 1`` best earlier blocks, ties to the lower id, the
  local block last, everything when few blocks are visible, ``-1`` padding;
* 03.3 sparse attention over the selected blocks: an exact softmax over their keys, causal
  inside the local block, nothing past the end of a ragged last block.

Each checker draws fresh random sizes (ragged ``S``) on every call and compares with the
package's own code: :func:`minimax_lab.attention.msa_select` and
:func:`minimax_lab.attention.msa_attention` (``impl="torch"``).
"""
from __future__ import annotations

import math
import random

import torch

from minimax_lab import bench
from minimax_lab.exercises import exercise, fresh_rng, tensor_problem


def _gen(rng: random.Random) -> torch.Generator:
    return torch.Generator().manual_seed(rng.randrange(2**31))


def _is_tensor(got, name: str, shape: tuple, problems: list[str]) -> bool:
    wrong = tensor_problem(got, name, shape)
    if wrong:
        problems.append(wrong)
    return wrong is None


# --------------------------------------------------------------------------- 03.1 block scores


def block_scores_mean(q_idx: torch.Tensor, k_idx: torch.Tensor, block_size: int) -> torch.Tensor:
    """Score every earlier key block for every query, from mean-pooled keys.

    ``q_idx [S, G, D]`` (one index query per token and group), ``k_idx [S, D]`` (one index key per
    token). Key block ``j`` holds the tokens ``j*block_size .. (j+1)*block_size - 1``; query ``t``'s
    own (local) block is ``t // block_size``. Return fp32 ``[S, G, n_blocks]``
    (``n_blocks = ceil(S / block_size)``) with

        score[t, g, j] = q_idx[t, g] . mean(k_idx[j*block_size : (j+1)*block_size]) / sqrt(D)

    for the blocks ``j < t // block_size`` (they are complete and fully visible), and ``-inf``
    for the local block and every later one (MSA always keeps the local block: it is not ranked)."""
    raise NotImplementedError  # your code here (pool the keys once, then one matmul)


def _mean_scores(q_idx, k_idx, block_size):
    S, G, D = q_idx.shape
    nb = math.ceil(S / block_size)
    pad = nb * block_size - S
    kb = torch.nn.functional.pad(k_idx.double(), (0, 0, 0, pad)).view(nb, block_size, D).mean(1)
    s = torch.einsum("tgd,jd->tgj", q_idx.double(), kb) / math.sqrt(D)
    earlier = torch.arange(nb)[None, :] < (torch.arange(S) // block_size)[:, None]
    return s.masked_fill(~earlier[:, None, :], float("-inf"))


@exercise("03.1", "block scores from mean-pooled keys",
          "Score each earlier key block for each query by the dot with the block's mean key.", block_scores_mean)
def _check_block_scores_mean(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    cases = [(rng.randint(1, 300), rng.choice([16, 32]), rng.randint(1, 3), rng.choice([8, 16, 24]))
             for _ in range(4)] + [(16, 16, 1, 8), (37, 16, 2, 8)]  # one block only; a ragged last block
    for S, Bk, G, D in cases:
        g = _gen(rng)
        q_idx, k_idx = torch.randn(S, G, D, generator=g), torch.randn(S, D, generator=g)
        want = _mean_scores(q_idx, k_idx, Bk)
        got = fn(q_idx.clone(), k_idx.clone(), Bk)
        name = f"block_scores_mean(S={S}, G={G}, D={D}, block_size={Bk})"
        if not _is_tensor(got, name, want.shape, problems):
            break
        got = got.detach().double().cpu()
        hidden = torch.isinf(want)
        if not torch.equal(torch.isneginf(got), hidden):
            wrong = int((torch.isneginf(got) != hidden).sum())
            problems.append(f"{name}: {wrong} entries disagree on being -inf (only the local block and later "
                            f"ones are -inf; earlier blocks get a finite score)")
        elif not torch.allclose(got[~hidden], want[~hidden], rtol=1e-4, atol=1e-5):
            err = (got[~hidden] - want[~hidden]).abs().max().item()
            problems.append(f"{name}: finite scores differ from q . mean(k) / sqrt(D) by up to {err:.2e}")
        if len(problems) >= 3:
            break
    return problems


# --------------------------------------------------------------------------- 03.2 the selection rule


def select_blocks(scores: torch.Tensor, block_size: int, topk: int) -> torch.Tensor:
    """MSA's selection rule. ``scores [S, G, n_blocks]`` fp32: a score per (query t, group g,
    key block j); the entries for the local block ``t // block_size`` and later ones hold
    anything (ignore them). Return int32 ``[S, G, topk]``, per row:

    * ``n = t // block_size + 1`` blocks are visible. If ``n <= topk``: all of them, ascending ids
      ``0, 1, ..., n-1``, then ``-1`` in the unused slots.
    * Otherwise the ``topk - 1`` earlier blocks with the highest scores, in descending score order
      (equal scores: the lower block id first), then the local block last."""
    raise NotImplementedError  # your code here


@exercise("03.2", "the top-k rule", "Select the topk - 1 best earlier blocks (ties to the lower id) and the local "
          "block last, all blocks when at most topk are visible: msa_select's rule.", select_blocks)
def _check_select_blocks(fn) -> list[str]:
    from minimax_lab.attention import msa_select
    from minimax_lab.attention.msa_reference import block_scores_reference
    rng, problems = fresh_rng(), []
    # (S, Bk, G, D, topk, integer-valued inputs: many exactly tied scores)
    cases = [(rng.randint(40, 400), rng.choice([16, 32]), rng.randint(1, 3), 8, rng.choice([2, 3, 4, 6]), False)
             for _ in range(3)]
    cases += [(rng.randint(100, 300), 16, 2, 4, 4, True), (rng.randint(50, 200), 16, 1, 2, 3, True),
              (70, 16, 1, 8, 1, False), (45, 16, 2, 8, 8, False)]  # topk = 1: local only; topk > n_blocks: all
    for S, Bk, G, D, topk, ties in cases:
        g = _gen(rng)
        if ties:
            q_idx = torch.randint(-1, 2, (S, G, D), generator=g).float()
            k_idx = torch.randint(-1, 2, (S, D), generator=g).float()
        else:
            q_idx, k_idx = torch.randn(S, G, D, generator=g), torch.randn(S, D, generator=g)
        want = msa_select(q_idx[None], k_idx[None], block_size=Bk, topk=topk, impl="torch")[0]
        scores = block_scores_reference(q_idx[None], k_idx[None], Bk)[0]  # max-pooled, as MSA does
        local = (torch.arange(S) // Bk)[:, None, None]
        not_ranked = torch.arange(scores.shape[-1])[None, None, :] >= local
        scores = torch.where(not_ranked, torch.rand(scores.shape, generator=g) * 1e6, scores)  # junk to ignore
        got = fn(scores.clone(), Bk, topk)
        name = f"select_blocks(S={S}, G={G}, block_size={Bk}, topk={topk}{', tied scores' if ties else ''})"
        if not _is_tensor(got, name, want.shape, problems):
            break
        got = got.detach().cpu().long()
        bad = (got != want.long()).any(-1).nonzero()
        if len(bad):
            t, grp = bad[0].tolist()
            problems.append(f"{name}: {len(bad)} of {S * G} rows differ; e.g. query {t} (local block {t // Bk}), "
                            f"group {grp}: expected {want[t, grp].tolist()}, got {got[t, grp].tolist()}")
        if len(problems) >= 3:
            break
    return problems


# --------------------------------------------------------------------------- 03.3 sparse attention


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, selected: torch.Tensor,
                     block_size: int) -> torch.Tensor:
    """Attention over the selected blocks only, for one sequence. ``q [S, Hq, D]``,
    ``k, v [S, G, D]`` (query head ``h`` belongs to group ``h // (Hq // G)``), ``selected int32
    [S, G, topk]`` (block ids, ``-1`` = unused slot). Query ``t``, head ``h`` attends with an exact
    softmax (scale ``1/sqrt(D)``) over the keys ``j`` that lie in one of its group's selected
    blocks and satisfy ``j <= t`` (causal inside the local block; keys past ``S - 1`` do not
    exist). A row that sees no key outputs 0. Return ``[S, Hq, D]`` in q's dtype."""
    raise NotImplementedError  # your code here (gather the blocks, or build a mask: both are fine)


def _sparse_inputs(seed: int, rng_sizes: tuple) -> dict:
    from minimax_lab.attention import msa_select
    S, Bk, Hq, G, D, topk = rng_sizes
    g = torch.Generator().manual_seed(seed)
    sel = msa_select(torch.randn(1, S, G, 8, generator=g), torch.randn(1, S, 8, generator=g),
                     block_size=Bk, topk=topk, impl="torch")[0]
    drop = torch.rand(sel.shape, generator=g) < 0.2  # some unused slots, some rows with no block at all
    drop[: S // 4] = False
    drop[-1, 0, :] = True  # the last query of group 0 sees nothing
    sel = torch.where(drop, -1, sel).to(torch.int32)
    return {"q": torch.randn(S, Hq, D, generator=g), "k": torch.randn(S, G, D, generator=g),
            "v": torch.randn(S, G, D, generator=g), "selected": sel, "block_size": Bk}


def _sparse_reference(q, k, v, selected, block_size):
    from minimax_lab.attention import msa_attention
    S, G = k.shape[0], k.shape[1]
    zeros_q, zeros_k = q.new_zeros(1, S, G, 1), q.new_zeros(1, S, 1)  # the index branch is not used
    return msa_attention(q[None], k[None], v[None], zeros_q, zeros_k, block_size=block_size,
                         topk=selected.shape[-1], impl="torch", selected=selected[None])[0]


@exercise("03.3", "sparse attention over the selected blocks",
          "Attend over the keys of the selected blocks only, causal inside the local block.", sparse_attention)
def _check_sparse_attention(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    for _ in range(3):
        sizes = (rng.randint(20, 150), rng.choice([16, 32]), rng.choice([2, 4, 6]), 0, rng.choice([8, 16]),
                 rng.choice([2, 3, 4]))
        G = rng.choice([g for g in (1, 2) if sizes[2] % g == 0])
        sizes = sizes[:3] + (G,) + sizes[4:]
        res = bench.check(fn, _sparse_reference, lambda seed: _sparse_inputs(seed, sizes), trials=2,
                          seed=rng.randrange(2**30), tol=1e-5, name="sparse_attention")
        if not res.passed:
            S, Bk, Hq, G, D, topk = sizes
            problems.append(f"S={S}, block_size={Bk}, Hq={Hq}, G={G}, D={D}, topk={topk}: "
                            + "; ".join(res.failures[:2]) + " (compared with msa_attention(impl='torch'))")
            break
    return problems
