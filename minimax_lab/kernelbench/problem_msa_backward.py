"""The kernel bench's ``msa_backward`` problem: the gradients of MSA's sparse attention.

What a candidate computes: ``(dq, dk, dv)`` of causal block-sparse GQA attention for given
selections, from ``q [B, S, Hq, D]``, ``k, v [B, S, G, D]``, the output's gradient
``grad_out`` (q's shape), ``block_ids int32 [B, S, G, topk]`` and ``block_size``: query head
``h`` of group ``g = h // (Hq / G)`` at position ``t`` attends, with an exact softmax at scale
``1/sqrt(D)``, to the keys ``j <= t`` of the blocks ``block_ids[b, t, g]`` (``-1`` = unused;
the selection contract of :mod:`minimax_lab.attention.msa`: the token's own block last, earlier
blocks before it, no block twice). Nothing of the forward is given: a kernel recomputes what it
needs (the workbook's runs the Triton forward for ``o`` and the log-sum-exp, then its backward
kernels). Outputs in the inputs' dtype (bf16 on a GPU, fp32 on the CPU), within that dtype's
tolerance of the reference: autograd in fp32 through the dense-mask forward
(:func:`minimax_lab.attention.msa_backward_reference.msa_attention_backward_reference`).

The strong peer is dense causal attention's forward and backward through SDPA: it computes a
related, larger function (every causal pair), so it is timed, not judged. :data:`FIELDS` holds the
problem's fields but its peer; :data:`MSA_BACKWARD` is the problem.
"""
from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from minimax_lab import runtime
from minimax_lab.attention.msa_backward_reference import msa_attention_backward_reference
from minimax_lab.attention.msa_backward_triton import msa_attention_backward_triton
from minimax_lab.attention.msa_triton_prefill import msa_attention_triton
from minimax_lab.kernelbench.problem import Peer, Problem, _gen

NAME = "msa_backward"
REGIMES = ("normal", "sharp")


def random_selection(B: int, S: int, G: int, topk: int, block_size: int, g: torch.Generator) -> torch.Tensor:
    """A valid MSA selection ``int32 [B, S, G, topk]``: per (token, group) up to ``topk - 1``
    distinct random earlier blocks (ascending), then the token's own block; ``-1`` padding."""
    sel = torch.full((B, S, G, topk), -1, dtype=torch.int32)
    own = torch.arange(S) // block_size
    keys = torch.rand(B, S, G, max(1, int(own[-1]) if S else 1), generator=g)  # a random order of earlier blocks
    for t in range(S):
        n_earlier = min(int(own[t]), topk - 1)
        if n_earlier:
            picks = keys[:, t, :, : int(own[t])].argsort(-1)[..., :n_earlier].sort(-1).values
            sel[:, t, :, :n_earlier] = picks.to(torch.int32)
        sel[:, t, :, n_earlier] = int(own[t])
    return sel


def make_inputs(shape, seed: int, regime: str) -> dict:
    """Fresh seeded inputs of ``shape`` (keys ``batch, seq, heads, kv_heads, head_dim, block_size,
    topk``). ``regime``: ``"normal"`` (N(0, 1)) or ``"sharp"`` (queries x 4: peaked softmax rows,
    where a backward that drops the max or the log-sum-exp is wrong by far)."""
    if regime not in REGIMES:
        raise ValueError(f"unknown input regime {regime!r}; expected one of {REGIMES}")
    B, S, Hq, G, D = shape["batch"], shape["seq"], shape["heads"], shape["kv_heads"], shape["head_dim"]
    bs, topk = shape["block_size"], shape["topk"]
    g = _gen(seed)
    dev, dtype = runtime.kernel_device(), runtime.compute_dtype()
    draw = lambda *s: torch.randn(*s, generator=g).to(dev, dtype)  # noqa: E731
    q = draw(B, S, Hq, D) * (4.0 if regime == "sharp" else 1.0)
    return {"q": q, "k": draw(B, S, G, D), "v": draw(B, S, G, D), "grad_out": draw(B, S, Hq, D),
            "block_ids": random_selection(B, S, G, topk, bs, g).to(dev), "block_size": bs}


def reference(q, k, v, grad_out, block_ids, block_size):
    """``(dq, dk, dv)`` by autograd through the dense-mask forward (fp32 for fp32 inputs)."""
    return msa_attention_backward_reference(q, k, v, block_ids, grad_out, block_size=block_size)


def msa_backward_workbook(q, k, v, grad_out, block_ids, block_size):
    """The workbook's kernels: the Triton forward for ``o`` and the log-sum-exp over the given
    selection, then the Triton backward (dQ query-outer, dK/dV KV-outer without atomics)."""
    o, lse = msa_attention_triton(q, k, v, None, None, block_size=block_size, topk=block_ids.shape[-1],
                                  return_lse=True, selected=block_ids)
    return msa_attention_backward_triton(q, k, v, o, lse, grad_out, block_ids, block_size=block_size)


def attended_pairs(block_ids: torch.Tensor, block_size: int, S: int) -> int:
    """(query token, key) pairs one query head of each group attends over, summed over groups and
    batch: per selected block, its keys ``j <= t`` that exist."""
    t = torch.arange(S, device=block_ids.device)[None, :, None, None]
    start = block_ids.long() * block_size
    per_block = (torch.minimum(t + 1, torch.full_like(t, S)) - start).clamp(0, block_size)
    return int(torch.where(block_ids >= 0, per_block, 0).sum())


def traffic(q, k, v, grad_out, block_ids, block_size):
    """At least ``10 * D`` flops per attended (query head, key) pair -- ``S = QK^T`` (the softmax
    is not given), ``dP = dO V^T``, ``dV += P^T dO``, ``dQ += dS K``, ``dK += dS^T Q`` -- and q,
    k, v, grad_out, the ids read once, dq, dk, dv written once."""
    B, S, Hq, D = q.shape
    G = k.shape[2]
    pairs = attended_pairs(block_ids, block_size, S) * (Hq // G)
    nbytes = sum(t.numel() * t.element_size() for t in (q, k, v, grad_out, block_ids))
    return 10.0 * D * pairs, float(nbytes + sum(t.numel() * t.element_size() for t in (q, k, v)))


def validation_shapes(preset: str) -> list[dict]:
    return runtime.pick(preset, cpu=[{"batch": 1, "seq": 40, "heads": 4, "kv_heads": 2, "head_dim": 16,
                                      "block_size": 16, "topk": 2}],
                        gpu=[{"batch": 1, "seq": 4096, "heads": 16, "kv_heads": 4, "head_dim": 128,
                              "block_size": 128, "topk": 8}])


def draw_test_shape(rng: random.Random, preset: str) -> dict:
    kv, per = rng.randint(1, 3), rng.choice([1, 2, 4])
    return runtime.pick(
        preset,
        cpu={"batch": rng.randint(1, 2), "seq": rng.randint(1, 50), "heads": kv * per, "kv_heads": kv,
             "head_dim": 16, "block_size": 16, "topk": rng.randint(1, 3)},
        gpu={"batch": rng.randint(1, 2), "seq": rng.randint(1, 4096), "heads": kv * per * 4, "kv_heads": kv,
             "head_dim": 128, "block_size": 128, "topk": rng.choice([4, 8, 16])})


def timing_shape(preset: str) -> dict:
    return runtime.pick(preset, cpu={"batch": 1, "seq": 32, "heads": 4, "kv_heads": 2, "head_dim": 16,
                                     "block_size": 16, "topk": 2},
                        gpu={"batch": 1, "seq": 4096, "heads": 64, "kv_heads": 4, "head_dim": 128,
                             "block_size": 128, "topk": 16})  # the reference's [S, Hq, S] fp32 scores: ~4 GiB each


#: the fields of :data:`MSA_BACKWARD` but its strong peer
FIELDS = dict(
    name=NAME,
    description="backward of MSA's block-sparse GQA attention: (dq, dk, dv) for given block selections "
                "(causal inside a block, the token's own block last, -1 unused), scale 1/sqrt(D)",
    reference=reference,
    make_inputs=make_inputs,
    validation_shapes=validation_shapes,
    draw_test_shape=draw_test_shape,
    timing_shape=timing_shape,
    regimes=REGIMES,
    best=lambda: msa_backward_workbook,
    traffic=traffic,
)


def _dense_backward_layout(inputs: dict) -> dict:
    q, k, v = (inputs[n].detach().transpose(1, 2).requires_grad_(True) for n in ("q", "k", "v"))
    return {"q": q, "k": k, "v": v, "grad_out": inputs["grad_out"].transpose(1, 2)}


def dense_attention_backward_peer(q, k, v, grad_out):
    """Dense causal attention's forward and backward through ``F.scaled_dot_product_attention``
    (``[B, H, S, D]`` leaves): the gradients of *all* causal pairs, the work a sparse backward skips."""
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
    return tuple(g.transpose(1, 2) for g in torch.autograd.grad(out, (q, k, v), grad_out))


MSA_BACKWARD = Problem(
    **FIELDS,
    strong_peer=lambda: Peer("dense causal SDPA, forward + backward", dense_attention_backward_peer,
                             prepare=_dense_backward_layout, same_contract=False,
                             note="F.scaled_dot_product_attention(is_causal=True, enable_gqa) and autograd: every "
                                  "causal pair, not only the selected blocks -- what a sparse backward has to beat"),
)
