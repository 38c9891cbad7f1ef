"""Exercises of chapter 05 (Mixture of Experts): the steps of a MoE layer's forward, each checked
against the package's own code on fresh random routing with ragged expert loads.

* 05.1 top-k routing: softmax over the experts, keep the ``k`` best, renormalise their weights;
* 05.2 one expert's SwiGLU FFN on the rows routed to it;
* 05.3 the combine: weighted sum of each token's ``k`` expert outputs, read from the aligned
  (expert-sorted, padded) rows while skipping the padding;
* 05.4 the alignment: sort the (token, slot) pairs by expert and pad each expert's group to a
  multiple of ``block_m`` rows, the layout the fused kernel reads;
* 05.5 the alignment as a Triton kernel without a sort (one program, a one-hot matrix and a running
  sum), laid out exactly like :func:`minimax_lab.moe.align_tokens`; the learner's kernel must do the
  work (a kernel that sorts, the chapter's way, is refused), and one case gives every expert several
  blocks.

Each checker draws new sizes and values on every call (so no fixed answer passes) and compares
with :func:`minimax_lab.moe.route_softmax`, ``swiglu_expert`` of
:mod:`minimax_lab.moe.experts_reference` and :func:`minimax_lab.moe.align_tokens`, which an answer
may not call (nor the package's Triton alignments).
"""
from __future__ import annotations

import inspect
import io
import random
import re
import textwrap
import tokenize

import torch

from minimax_lab import measure
from minimax_lab.exercises import exercise, fresh_rng, on_kernel_device
from minimax_lab.moe import align_tokens, route_softmax
from minimax_lab.moe.align import align_decode, align_prefill, align_tokens_triton, align_tokens_unchecked
from minimax_lab.moe.experts_reference import swiglu_expert

#: the package's alignments, in PyTorch and in Triton (05.4 and 05.5 ask for one of your own)
PACKAGE_ALIGNMENTS = (align_tokens, align_tokens_unchecked, align_tokens_triton, align_decode, align_prefill)


def _routing(rng: random.Random, T: int, E: int, k: int, skew: float) -> torch.Tensor:
    """Router ids ``[T, k]``: k distinct experts per token, from random logits; ``skew`` > 0 makes
    the low-numbered experts popular (ragged loads, some experts empty)."""
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    logits = torch.randn(T, E, generator=g) - skew * torch.arange(E, dtype=torch.float32)
    return torch.topk(logits, k, dim=-1).indices


# --------------------------------------------------------------------------- 05.1 top-k routing


def route_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k routing (Mixtral, Qwen3-MoE).

    ``logits [T, E]`` (one row of router scores per token). Take the softmax over the ``E``
    experts, keep the ``k`` largest probabilities of each row, and divide them by their sum so
    each token's ``k`` weights add up to 1. Return ``(weights [T, k] float32, ids [T, k] int64)``,
    each row in order of decreasing probability."""
    raise NotImplementedError  # your code here (three lines)


@exercise("05.1", "top-k routing", "Pick each token's k experts from the router's logits and "
          "renormalise their softmax weights to sum to 1.", route_topk, answers=(route_softmax,))
def _check_route_topk(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    cases = [(1, 4, 1), (5, 8, 2)] + [(rng.randint(1, 40), E, rng.randint(1, min(E, 8)))
                                       for E in rng.sample([3, 6, 16, 33, 64], 3)]
    for T, E, k in cases:
        g = torch.Generator().manual_seed(rng.randrange(2**31))
        logits = torch.randn(T, E, generator=g) * rng.choice([0.5, 2.0, 5.0])
        got = fn(logits.clone(), k)
        want_w, want_i = route_softmax(logits, k)
        where = f"route_topk(logits [{T}, {E}], k={k})"
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
            return [f"{where} should return a pair of tensors (weights, ids), got {type(got).__name__}"]
        w, i = got
        if tuple(w.shape) != (T, k) or tuple(i.shape) != (T, k):
            problems.append(f"{where}: expected weights and ids of shape ({T}, {k}), "
                            f"got {tuple(w.shape)} and {tuple(i.shape)}")
        elif i.dtype != torch.int64 or w.dtype != torch.float32:
            problems.append(f"{where}: expected float32 weights and int64 ids, got {w.dtype} and {i.dtype}")
        elif not torch.equal(i, want_i):
            bad = int((i != want_i).any(dim=1).sum())
            problems.append(f"{where}: the ids of {bad} of {T} tokens differ, e.g. token 0: expected "
                            f"{want_i[0].tolist()}, got {i[0].tolist()} (the k largest, largest first)")
        else:
            err = measure.relative_error(w, want_w)
            if not err <= 1e-5:
                sums = w.sum(dim=1)
                problems.append(f"{where}: the weights are off (rel. err {err:.1e}); each row should sum to 1, "
                                f"yours sum to {sums.min().item():.4f}..{sums.max().item():.4f}")
        if len(problems) >= 3:
            break
    return problems


# --------------------------------------------------------------------------- 05.2 the expert FFN


def expert_swiglu(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """One expert's SwiGLU feed-forward on the ``n`` rows routed to it.

    ``x [n, d]``; ``w_gate_up [2f, d]``: rows ``0..f-1`` are the gate projection, rows
    ``f..2f-1`` the up projection (``nn.Linear``'s ``[out, in]`` layout); ``w_down [d, f]``.
    Return ``[n, d]``: ``down(silu(gate(x)) * up(x))``, where ``gate(x) = x @ W_gate^T`` and so on."""
    raise NotImplementedError  # your code here


@exercise("05.2", "the expert FFN", "Run one expert's SwiGLU FFN (gate and up projections, "
          "silu(gate) * up, down projection) on the rows routed to it.", expert_swiglu, answers=(swiglu_expert,))
def _check_expert_swiglu(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    shapes = [(1, 8, 4), (rng.randint(2, 30), rng.randint(3, 40), rng.randint(2, 24)),
              (rng.randint(2, 30), rng.randint(3, 40), rng.randint(2, 24)), (0, 16, 8)]
    for n, d, f in shapes:
        def make(seed, n=n, d=d, f=f):
            g = torch.Generator().manual_seed(seed)
            return {"x": torch.randn(n, d, generator=g),
                    "w_gate_up": torch.randn(2 * f, d, generator=g) / d ** 0.5,
                    "w_down": torch.randn(d, f, generator=g) / f ** 0.5}
        res = measure.check(lambda x, w_gate_up, w_down: fn(x, w_gate_up, w_down), swiglu_expert, make,
                            trials=2, seed=rng.randrange(2**30), tol=1e-4)
        if not res.passed:
            problems.append(f"expert_swiglu on x [{n}, {d}] with f={f}: {res.failures[0]} (expected "
                            "down(silu(gate(x)) * up(x)); gate = the first f rows of w_gate_up, up = the last f)")
        if len(problems) >= 2:
            break
    return problems


# --------------------------------------------------------------------------- 05.3 the combine


def combine_slots(y: torch.Tensor, sorted_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The combine step: each token's output is the weighted sum of its ``k`` expert outputs.

    ``weights [T, k]``: token ``t``'s routing weights; its ``k`` routed copies are the flat
    *slots* ``t*k + 0 .. t*k + k-1``. ``y [R, d]``: the experts' outputs in the aligned layout,
    row ``r`` holding the output for slot ``sorted_ids[r]`` (``sorted_ids [R]`` int). Rows whose
    ``sorted_ids`` is ``T*k`` are padding: their ``y`` is garbage (NaN here) and must not reach
    the result. Return ``[T, d]`` with ``out[t] = sum_j weights[t, j] * y[row of slot t*k + j]``."""
    raise NotImplementedError  # your code here


def _combine_reference(y, sorted_ids, weights):
    T, k = weights.shape
    real = sorted_ids < T * k
    slots = sorted_ids[real].long()
    per_slot = torch.zeros(T * k, y.shape[1], dtype=y.dtype)
    per_slot[slots] = y[real]
    return (per_slot.view(T, k, -1) * weights[..., None].to(y.dtype)).sum(dim=1)


@exercise("05.3", "the combine", "Add up each token's k weighted expert outputs from the expert-"
          "sorted, padded rows, skipping the padding.", combine_slots, answers=(_combine_reference,))
def _check_combine_slots(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    for T, E, k, bm, skew in [(1, 4, 2, 4, 0.0), (rng.randint(5, 40), 8, 2, 4, 0.6),
                              (rng.randint(5, 40), 16, 4, 8, 0.0), (rng.randint(5, 40), 6, 1, 16, 1.0)]:
        def make(seed, T=T, E=E, k=k, bm=bm, skew=skew):
            r = random.Random(seed)
            ids = _routing(r, T, E, k, skew)
            al = align_tokens(ids, E, bm)
            rows = int(al.num_rows)
            sid = al.sorted_ids[:rows]
            g = torch.Generator().manual_seed(seed)
            y = torch.randn(rows, rng.choice([3, 8, 20]), generator=g)
            y[sid >= T * k] = float("nan")       # padding rows hold garbage
            w = torch.rand(T, k, generator=g)
            return {"y": y, "sorted_ids": sid, "weights": w / w.sum(dim=1, keepdim=True)}
        res = measure.check(lambda y, sorted_ids, weights: fn(y, sorted_ids, weights), _combine_reference, make,
                            trials=2, seed=rng.randrange(2**30), tol=1e-5)
        if not res.passed:
            hint = ("NaN or inf in the result: a padding row (slot id T*k) got in" if res.max_error == float("inf")
                    else "each row's token is slot // k and its weight weights.reshape(-1)[slot]")
            problems.append(f"combine_slots with T={T}, k={k}, blocks of {bm} rows: {res.failures[0]} ({hint})")
        if len(problems) >= 2:
            break
    return problems


# --------------------------------------------------------------------------- 05.4 the alignment


def align_slots(ids: torch.Tensor, n_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The layout the fused MoE kernel reads: routed slots grouped by expert, padded to blocks.

    ``ids [T, k]``: the experts of each token; flat slot ``s = t*k + j`` is token ``t``'s
    ``j``-th choice, ``ids.reshape(-1)[s]``. Lay the slots out expert by expert (expert 0 first;
    inside an expert, slots in increasing order), then pad each expert's group with the sentinel
    ``T*k`` up to a multiple of ``block_m`` rows (an expert with no slot gets no rows).
    Return ``(sorted_ids, block_expert)``: ``sorted_ids`` int32 ``[R]`` (``R`` = all padded rows)
    and ``block_expert`` int32 ``[R // block_m]``, the expert that owns each block of ``block_m`` rows."""
    raise NotImplementedError  # your code here


@exercise("05.4", "the alignment", "Sort the routed slots by expert and pad each expert's group to "
          "whole blocks of block_m rows, as the fused kernel wants them.", align_slots, answers=PACKAGE_ALIGNMENTS)
def _check_align_slots(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    cases = [(1, 4, 1, 4, 0.0), (4, 4, 2, 2, 0.0), (rng.randint(5, 60), 8, 2, 4, 0.8),
             (rng.randint(5, 60), 16, 4, 8, 0.0), (rng.randint(5, 60), 6, 3, 16, 2.0),
             (rng.randint(5, 60), 5, 1, 3, 0.3)]
    for T, E, k, bm, skew in cases:
        ids = _routing(rng, T, E, k, skew)
        al = align_tokens(ids, E, bm)
        rows = int(al.num_rows)
        want = (al.sorted_ids[:rows], al.block_expert[:rows // bm])
        got = fn(ids.clone(), E, bm)
        where = f"align_slots(ids [{T}, {k}], n_experts={E}, block_m={bm}) (slots per expert {al.counts.tolist()})"
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
            return [f"{where} should return a pair of tensors (sorted_ids, block_expert), got {type(got).__name__}"]
        for name, g_, w_ in zip(("sorted_ids", "block_expert"), got, want):
            if tuple(g_.shape) != tuple(w_.shape):
                problems.append(f"{where}: {name} should have shape {tuple(w_.shape)}, got {tuple(g_.shape)}")
            elif g_.is_floating_point() or not torch.equal(g_.long(), w_.long()):
                problems.append(f"{where}: {name} should be {w_.tolist()}, got {g_.tolist()}")
        if len(problems) >= 2:
            break
    return problems


# --------------------------------------------------------------------------- 05.5 the alignment in Triton


def align_in_triton(ids: torch.Tensor, n_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The alignment as one Triton program without a sort: complete the chapter's ``block_owner_kernel``.

    ``ids [T, k]`` (on the kernel device; small: ``T*k <= 96``, ``n_experts <= 40``). Return
    ``(sorted_ids, block_expert, num_rows)`` laid out exactly like ``align_tokens(ids, n_experts,
    block_m)``: ``sorted_ids`` int32 ``[capacity_for(T*k, n_experts, block_m)]`` with each
    expert's slots in slot order, every other row holding the sentinel ``T*k``;
    ``block_expert`` int32 ``[capacity // block_m]`` (-1 past the used blocks); ``num_rows``
    int32 ``[1]``. A slot's row is its expert's padded start plus its rank among that expert's
    slots, and a running sum (``tl.cumsum``) down each column of the one-hot matrix counts them.
    A kernel that calls ``tl.sort`` (or any sort) is refused."""
    raise NotImplementedError  # your code here


def _slot_words(s: int, n_slots: int, top_k: int, flat_ids: torch.Tensor) -> str:
    """What a value of ``sorted_ids`` means, in the learner's terms."""
    if s == n_slots:
        return f"padding (the sentinel {n_slots})"
    if not 0 <= s < n_slots:
        return f"{s}, which is no slot (slots run 0..{n_slots - 1}; padding is {n_slots})"
    return f"slot {s} (token {s // top_k}'s choice {s % top_k}, expert {int(flat_ids[s])})"


def _alignment_problems(got, want, ids: torch.Tensor, n_experts: int, block_m: int) -> list[str]:
    """How ``got`` differs from the Alignment ``want``, row by row in the learner's terms."""
    T, k = ids.shape
    n = T * k
    where = f"ids [{T}, {k}], n_experts={n_experts}, block_m={block_m} (slots per expert {want.counts.tolist()})"
    if not (isinstance(got, (tuple, list)) and len(got) == 3 and all(isinstance(t, torch.Tensor) for t in got)):
        return [f"{where}: expected three tensors (sorted_ids, block_expert, num_rows), got {type(got).__name__}"]
    sorted_ids, block_expert, num_rows = (t.detach().cpu() for t in got)
    expected = {"sorted_ids": want.sorted_ids, "block_expert": want.block_expert, "num_rows": want.num_rows}
    for name, g in zip(expected, (sorted_ids, block_expert, num_rows)):
        w = expected[name].cpu()
        if tuple(g.shape) != tuple(w.shape) or g.is_floating_point():
            return [f"{where}: {name} should be an int tensor of shape {tuple(w.shape)} (capacity "
                    f"{want.capacity} rows), got {str(g.dtype).replace('torch.', '')} of shape {tuple(g.shape)}"]
    problems = []
    flat = ids.reshape(-1).cpu()
    bad_rows = (sorted_ids.long() != want.sorted_ids.cpu().long()).nonzero().flatten().tolist()
    if bad_rows:
        r = bad_rows[0]
        e = int(want.block_expert[r // block_m])
        owner = f"expert {e}'s" if e >= 0 else "an unused"
        problems.append(f"{where}: row {r} (in {owner} block {r // block_m}) should hold "
                        f"{_slot_words(int(want.sorted_ids[r]), n, k, flat)}, yours holds "
                        f"{_slot_words(int(sorted_ids[r]), n, k, flat)}; {len(bad_rows)} of {want.capacity} rows differ")
    bad_blocks = (block_expert.long() != want.block_expert.cpu().long()).nonzero().flatten().tolist()
    if bad_blocks:
        b = bad_blocks[0]
        problems.append(f"{where}: block {b} (rows {b * block_m}..{(b + 1) * block_m - 1}) belongs to "
                        f"{'expert ' + str(int(want.block_expert[b])) if want.block_expert[b] >= 0 else 'nobody (-1)'}, "
                        f"yours says {int(block_expert[b])}")
    if int(num_rows[0]) != int(want.num_rows[0]):
        problems.append(f"{where}: num_rows should be {int(want.num_rows[0])} (each expert's slots rounded up to "
                        f"a multiple of {block_m}), yours is {int(num_rows[0])}")
    return problems


#: a name in a kernel's code that sorts (comments and strings aside)
SORTS = re.compile(r"\b(sort|argsort|topk)\b")


def _no_sort(kernel) -> str | None:
    """Why 05.5 refuses ``kernel``: it sorts (the chapter's way; the exercise asks for the running
    sum), or its source cannot be read. None for a kernel that does not sort."""
    fn = getattr(kernel, "fn", kernel)
    try:
        src = getattr(kernel, "src", None) or inspect.getsource(fn)
    except (OSError, TypeError):
        return f"the source of your kernel {getattr(fn, '__name__', kernel)!r} cannot be read: define it in a cell"
    code = " ".join(tok.string for tok in tokenize.generate_tokens(io.StringIO(textwrap.dedent(src)).readline)
                    if tok.type not in (tokenize.COMMENT, tokenize.STRING))
    if SORTS.search(code):
        return (f"your kernel {getattr(fn, '__name__', '')!r} sorts: section 3.1 places the slots with tl.sort; this "
                f"exercise asks for the other way, each slot's rank from a running sum (tl.cumsum) down its expert's "
                f"column of the one-hot matrix")
    return None


@exercise("05.5", "the alignment in Triton, without a sort", "Complete the chapter's one-program alignment kernel "
          "without sorting: put every routed slot in its padded row (a one-hot matrix and a running sum).",
          align_in_triton, writes_triton=True, answers=PACKAGE_ALIGNMENTS, kernel_rule=_no_sort)
def _check_align_in_triton(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    cases = [(1, 4, 1, 4, 0.0), (rng.randint(3, 12), 8, 2, 4, 1.5),
             (rng.randint(32, 48), 4, 2, rng.choice([3, 4]), 0.3),   # 64-96 slots in 4 experts: several blocks each
             (rng.randint(10, 40), rng.choice([5, 6, 7]), 2, rng.choice([2, 3, 4]), 0.6),
             (rng.randint(5, 24), rng.choice([16, 33, 40]), 4, 8, 0.0), (rng.randint(4, 12), 6, 1, 16, 3.0)]
    for T, E, k, bm, skew in cases:
        ids = _routing(rng, T, E, k, skew)
        want = align_tokens(ids, E, bm)
        got = fn(on_kernel_device(ids.clone()), E, bm)
        problems += _alignment_problems(got, want, ids, E, bm)
        if len(problems) >= 3:
            break
    return problems
