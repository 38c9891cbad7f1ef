"""The kernel bench's problems by name: :data:`PROBLEMS` and :func:`get_problem`, with the types a
problem is made of (:class:`~.problem.Problem` and its :class:`~.problem.Peer`, defined in
:mod:`.problem`, which says what each field means).

Each problem lives in the module of its family:

* :mod:`.problem_ops` -- ``softmax``, ``rmsnorm_residual``, ``rope`` (the operators of :mod:`.ops`);
* :mod:`.problem_msa_select` -- ``msa_select``, MSA's top-k block selection;
* :mod:`.problem_paged_decode` -- ``paged_decode``, and ``fp8_paged_decode`` over an FP8 KV cache;
* :mod:`.problem_moe` -- ``moe_align``, MoE token alignment, and ``fp8_fused_moe``, the fused
  experts with FP8 weights;
* :mod:`.problem_msa_backward` -- ``msa_backward``, the gradients of MSA's sparse attention.
"""
from __future__ import annotations

from minimax_lab.kernelbench.problem import Peer, Problem
from minimax_lab.kernelbench.problem_moe import FP8_MOE, MOE_ALIGN
from minimax_lab.kernelbench.problem_msa_backward import MSA_BACKWARD
from minimax_lab.kernelbench.problem_msa_select import MSA_SELECT
from minimax_lab.kernelbench.problem_ops import RMSNORM, ROPE, SOFTMAX
from minimax_lab.kernelbench.problem_paged_decode import FP8_PAGED_DECODE, PAGED_DECODE

__all__ = ["PROBLEMS", "get_problem", "Peer", "Problem", "SOFTMAX", "RMSNORM", "ROPE", "MSA_SELECT", "PAGED_DECODE",
           "MOE_ALIGN", "MSA_BACKWARD", "FP8_MOE", "FP8_PAGED_DECODE"]

PROBLEMS: dict[str, Problem] = {p.name: p for p in (SOFTMAX, RMSNORM, ROPE, MSA_SELECT, PAGED_DECODE, MOE_ALIGN,
                                                    MSA_BACKWARD, FP8_MOE, FP8_PAGED_DECODE)}


def get_problem(name: str | Problem) -> Problem:
    """A problem by name (or the problem itself); ``ValueError`` listing the names otherwise."""
    if isinstance(name, Problem):
        return name
    if name not in PROBLEMS:
        raise ValueError(f"unknown problem {name!r}; choose from {sorted(PROBLEMS)}")
    return PROBLEMS[name]
