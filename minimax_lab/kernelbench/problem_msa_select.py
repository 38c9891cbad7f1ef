"""The kernel bench's ``msa_select`` problem: MSA's top-k block selection from the index tensors,
the exact block ids, against the MSA chapter's vectorized PyTorch selection.
"""
from __future__ import annotations

import torch

from minimax_lab import runtime
from minimax_lab.attention.msa import msa_select
from minimax_lab.kernelbench.problem import Peer, Problem, _nbytes, _randn


MSA_SELECT_BLOCK, MSA_SELECT_TOPK = 16, 4


def _msa_inputs(shape, seed, regime):
    B, S, G, Di = shape["batch"], shape["seq"], shape["groups"], shape["d_idx"]
    # fp32 index scores: near-ties between blocks are then vanishingly rare, so exact ids are fair
    return {"q_idx": _randn((B, S, G, Di), seed, regime, torch.float32),
            "k_idx": _randn((B, S, Di), seed + 1, regime, torch.float32)}


def _msa_select_reference(q_idx, k_idx):
    """The MSA chapter's readable reference on the CPU; on a GPU its vectorized ``torch`` impl
    (tested equal to the reference by the MSA tests): the readable one sorts every row in Python,
    which takes minutes at GPU sizes."""
    impl = "reference" if q_idx.device.type == "cpu" else "torch"
    return msa_select(q_idx, k_idx, block_size=MSA_SELECT_BLOCK, topk=MSA_SELECT_TOPK, impl=impl)


def msa_select_workbook(q_idx, k_idx):
    """The MSA chapter's Triton selection kernel at this problem's block size and top-k."""
    return msa_select(q_idx, k_idx, block_size=MSA_SELECT_BLOCK, topk=MSA_SELECT_TOPK, impl="triton")


def msa_select_torch_peer(q_idx, k_idx):
    """The MSA chapter's vectorized PyTorch selection (chunked scores, ``torch.topk`` on int64 keys)."""
    return msa_select(q_idx, k_idx, block_size=MSA_SELECT_BLOCK, topk=MSA_SELECT_TOPK, impl="torch")


def _msa_select_traffic(q_idx, k_idx):
    """Every query scores every causally visible key (S^2 / 2 dot products of length D_idx per
    group), reads both index tensors and writes ``topk`` int32 ids per (query, group)."""
    B, S, G, Di = q_idx.shape
    return float(B * G * S * S * Di), _nbytes(q_idx, k_idx) + 4.0 * B * S * G * MSA_SELECT_TOPK


def _msa_select_shortcut(shape):
    if shape["seq"] <= MSA_SELECT_TOPK * MSA_SELECT_BLOCK:
        return (f"seq {shape['seq']} <= topk * block_size = {MSA_SELECT_TOPK * MSA_SELECT_BLOCK}: every query "
                "keeps all its visible blocks, so the selection returns without ranking anything")
    return None


MSA_SELECT = Problem(
    name="msa_select",
    description="MSA top-k block selection (the MSA chapter's contract), block_size 16, topk 4; int32 ids exact",
    reference=lambda q_idx, k_idx: _msa_select_reference(q_idx, k_idx),
    make_inputs=_msa_inputs,
    validation_shapes=lambda p: runtime.pick(p, cpu=[{"batch": 1, "seq": 80, "groups": 2, "d_idx": 16}],
                                              gpu=[{"batch": 2, "seq": 4096, "groups": 4, "d_idx": 128}]),
    draw_test_shape=lambda rng, p: runtime.pick(
        p, cpu={"batch": rng.randint(1, 2), "seq": rng.randint(1, 100), "groups": rng.randint(1, 3), "d_idx": 16},
        gpu={"batch": rng.randint(1, 4), "seq": rng.randint(1, 8192), "groups": rng.randint(1, 8), "d_idx": 128}),
    # seq must exceed topk * block_size (64), or the timed call never reaches the kernel
    timing_shape=lambda p: runtime.pick(p, cpu={"batch": 1, "seq": 96, "groups": 2, "d_idx": 16},
                                        gpu={"batch": 2, "seq": 4096, "groups": 4, "d_idx": 128}),
    tol=0.0,
    best=lambda: msa_select_workbook,
    strong_peer=lambda: Peer("msa_select(impl='torch'), vectorized PyTorch", msa_select_torch_peer,
                             note="the exact selection in a few vectorized PyTorch ops; SGLang's Triton indexer "
                                  "(where fetched) takes bf16 scores and breaks ties in another order, so it answers "
                                  "a different contract"),
    traffic=_msa_select_traffic,
    shortcut=_msa_select_shortcut,
)
