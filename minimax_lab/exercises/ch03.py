"""Exercises of chapter 03 (MiniMax Sparse Attention, the idea): the index branch's two steps in
PyTorch, then the teacher's block mass as a Triton kernel, for one sequence.

* 03.1 block scores from mean-pooled keys: one dot per (query, block) instead of one per key;
* 03.2 the top-k rule of MSA: the ``topk - 1`` best earlier blocks, ties to the lower id, the
  local block last, everything when few blocks are visible, ``-1`` padding;
* 03.3 the teacher's block mass in Triton: the attention probability each query puts on each key
  block, a tile at a time, from q, k and each row's log-sum-exp (no ``S x S`` matrix).

Each checker draws fresh random sizes (ragged ``S``) on every call and compares with the
package's own code (:func:`minimax_lab.attention.msa_select`) or a float64 reference, which an
answer may not call. In 03.3 the learner's kernel must do the work, on inputs on the kernel device.
"""
from __future__ import annotations

import math
import random

import torch

from minimax_lab.attention import msa_select
from minimax_lab.attention.msa_reference import block_scores_reference
from minimax_lab.exercises import exercise, fresh_rng, on_kernel_device, tensor_problem


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
          "Score each earlier key block for each query by the dot with the block's mean key.", block_scores_mean,
          answers=(_mean_scores,))
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
          "block last, all blocks when at most topk are visible: msa_select's rule.", select_blocks,
          answers=(msa_select,))
def _check_select_blocks(fn) -> list[str]:
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


# --------------------------------------------------------------------------- 03.3 the teacher, in Triton


def block_mass(q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, block_size: int) -> torch.Tensor:
    """The teacher's block mass for one head, computed by a Triton kernel a tile at a time.

    ``q, k`` fp32 ``[S, D]`` (``D`` a power of two >= 16; either may be a non-contiguous view),
    ``lse`` fp32 ``[S]``: row ``t``'s log-sum-exp of its causal scores ``q[t] . k[j] / sqrt(D)``
    over ``j <= t`` (chapter 02's kernel returns it). Return fp32 ``[S, n_blocks]``
    (``n_blocks = ceil(S / block_size)``) with

        mass[t, b] = sum over keys j of block b with j <= t of exp(q[t] . k[j] / sqrt(D) - lse[t])

    so each row sums to 1, and blocks after ``t``'s own block get 0."""
    raise NotImplementedError  # your code here: launch the kernel above, one program per (row tile, key block)


def _block_sums(scores, lse, block_size):
    """sum over each key block of exp(scores - lse) (float64 [S, nb]); scores [S, S], -inf where masked."""
    S = scores.shape[0]
    p = torch.exp(scores - lse[:, None])
    nb = math.ceil(S / block_size)
    return torch.nn.functional.pad(p, (0, nb * block_size - S)).view(S, nb, block_size).sum(-1)


def _causal_scores(q, k, scale):
    S = q.shape[0]
    s = (q.double() @ k.double().T) * scale
    return s.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))


def _mass_reference(q, k, block_size):
    """(mass [S, nb], lse [S]) in float64 from the full causal probabilities."""
    s = _causal_scores(q, k, 1 / math.sqrt(q.shape[1]))
    lse = torch.logsumexp(s, -1)
    return _block_sums(s, lse, block_size), lse


def _mass_diagnosis(got, want, q, k, lse, S, Bk) -> str:
    """What is wrong with ``got`` (float64 [S, nb]), in the learner's terms."""
    local = torch.arange(S) // Bk
    later = torch.arange(got.shape[1])[None, :] > local[:, None]
    if (got[later].abs() > 1e-6).any():
        t, b = [int(x) for x in (later & (got.abs() > 1e-6)).nonzero()[0]]
        return (f"mass[{t}, {b}] = {got[t, b]:.3g}, but block {b} lies after query {t}'s own block {t // Bk}: "
                f"keys past t are not visible (mask j <= t), so it should be 0")
    if torch.allclose(got, _block_sums(_causal_scores(q, k, 1.0), lse, Bk), atol=1e-4):
        return "your scores miss the 1/sqrt(D) scale: q . k must be divided by sqrt(D) before exp(score - lse)"
    sums = got.sum(1)
    t = int((sums - 1).abs().argmax())
    if abs(sums[t] - 1) > 1e-3:
        return (f"row {t} sums to {sums[t]:.4f}, not 1: each row's probabilities exp(score - lse[t]) over its "
                f"visible keys must add up to 1")
    t, b = [int(x) for x in ((got - want).abs() == (got - want).abs().max()).nonzero()[0]]
    return f"mass[{t}, {b}] = {got[t, b]:.6f}, expected {want[t, b]:.6f}"


@exercise("03.3", "the teacher's block mass, in Triton",
          "Write a Triton kernel that sums each query's attention probabilities over each key block, a tile "
          "at a time, from q, k and the row log-sum-exps.", block_mass, writes_triton=True,
          answers=(_mass_reference, _block_sums, _causal_scores))
def _check_block_mass(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    cases = [(rng.randint(17, 130), rng.choice([16, 32]), rng.choice([16, 32]), False) for _ in range(2)]
    cases += [(rng.choice([33, 50, 70]), 16, 16, True), (16, 16, 32, False), (1, 16, 16, False)]
    for S, Bk, D, strided in cases:
        g = _gen(rng)
        if strided:  # views into wider tensors: row stride 2 * D
            q, k = torch.randn(S, 2 * D, generator=g)[:, :D], torch.randn(S, 2 * D, generator=g)[:, D:]
        else:
            q, k = torch.randn(S, D, generator=g), torch.randn(S, D, generator=g)
        want, lse = _mass_reference(q, k, Bk)
        got = fn(on_kernel_device(q), on_kernel_device(k), on_kernel_device(lse.float()), Bk)
        name = f"block_mass(S={S}, D={D}, block_size={Bk}{', strided views' if strided else ''})"
        if not _is_tensor(got, name, want.shape, problems):
            break
        got = got.detach().double().cpu()
        if not torch.isfinite(got).all():
            problems.append(f"{name}: the result holds NaN or inf (masked scores must become -inf before exp, "
                            f"and padding loads need other=0)")
        elif not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
            problems.append(f"{name}: {_mass_diagnosis(got, want, q, k, lse, S, Bk)}")
        if problems:
            break
    return problems
