"""Mixture of Experts: routers, token alignment, SwiGLU experts (reference / torch / Triton; bf16
or FP8 weights via ``quantize_experts``), the ``MoEFFN`` layer and expert parallelism.
"""
from minimax_lab.moe.align import Alignment, align_tokens, capacity_for
from minimax_lab.moe.experts import IMPLS, check_expert_inputs, moe_experts, quantize_experts
from minimax_lab.moe.layer import MoEFFN
from minimax_lab.moe.router import (ROUTERS, expert_counts, load_balance_loss, route_sigmoid_bias,
                                    route_softmax, update_bias)

__all__ = ["Alignment", "align_tokens", "capacity_for", "IMPLS", "check_expert_inputs", "moe_experts",
           "quantize_experts", "MoEFFN", "ROUTERS", "expert_counts", "load_balance_loss", "route_sigmoid_bias", "route_softmax", "update_bias"]
