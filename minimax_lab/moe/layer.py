"""``MoEFFN``: a router plus routed SwiGLU experts (plus an optional shared expert) as an ``nn.Module``.

Contract (shared with the tiny model, ``ffn="moe"``)::

    MoEFFN(d_model, d_ff, n_experts, top_k, *, router="softmax" | "sigmoid_bias",
           shared_expert=False, impl="torch")      # [..., d_model] -> [..., d_model]

After each forward the module holds ``.last_ids`` ``[T, top_k]`` (int64), ``.last_weights``
``[T, top_k]`` (float32) -- ``T`` = all leading dims flattened -- and ``.aux_loss``, the
Switch balance loss (:func:`~minimax_lab.moe.router.load_balance_loss`; 1.0 at perfect
balance, scale it yourself, e.g. ``loss + 0.01 * ffn.aux_loss``). With
``router="sigmoid_bias"`` the routing is DeepSeek-V3's auxiliary-loss-free scheme: in
training mode every forward also moves the correction bias ``.expert_bias`` by
:func:`~minimax_lab.moe.router.update_bias` at ``bias_update_rate`` (0 disables it), and
``.aux_loss`` is still computed (on normalised sigmoid scores) so it can be plotted.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from minimax_lab.moe.experts import IMPLS, moe_experts
from minimax_lab.moe.router import (ROUTERS, expert_counts, load_balance_loss, route_sigmoid_bias,
                                    route_softmax, update_bias)
from minimax_lab.validate import check_choice, check_positive_int, check_tensor


class MoEFFN(nn.Module):
    """Mixture-of-Experts feed-forward layer; see the module doc for the contract."""

    def __init__(self, d_model: int, d_ff: int, n_experts: int, top_k: int, *, router: str = "softmax",
                 shared_expert: bool = False, impl: str = "torch", bias_update_rate: float = 1e-3,
                 renormalize: bool = True):
        super().__init__()
        for name, v in (("d_model", d_model), ("d_ff", d_ff), ("n_experts", n_experts), ("top_k", top_k)):
            check_positive_int(v, name)
        if top_k > n_experts:
            raise ValueError(f"top_k must be <= n_experts={n_experts}, got {top_k}")
        check_choice(router, "router", ROUTERS)
        check_choice(impl, "impl", IMPLS)
        self.d_model, self.d_ff, self.n_experts, self.top_k = d_model, d_ff, n_experts, top_k
        self.router, self.impl, self.renormalize = router, impl, renormalize
        self.bias_update_rate = float(bias_update_rate)
        self.gate = nn.Linear(d_model, n_experts, bias=False)
        self.w_gate_up = nn.Parameter(torch.randn(n_experts, 2 * d_ff, d_model) / math.sqrt(d_model))
        self.w_down = nn.Parameter(torch.randn(n_experts, d_model, d_ff) / math.sqrt(d_ff))
        self.register_buffer("expert_bias", torch.zeros(n_experts), persistent=True)
        if shared_expert:
            self.shared_gate_up = nn.Linear(d_model, 2 * d_ff, bias=False)
            self.shared_down = nn.Linear(d_ff, d_model, bias=False)
        self.shared_expert = shared_expert
        self.last_ids: torch.Tensor | None = None
        self.last_weights: torch.Tensor | None = None
        self.aux_loss: torch.Tensor = torch.zeros(())

    def route(self, x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Router only: ``x2d`` ``[T, d_model]`` -> ``(weights [T,k], ids [T,k], probs [T,E])``."""
        logits = self.gate(x2d)
        if self.router == "softmax":
            weights, ids = route_softmax(logits, self.top_k, renormalize=self.renormalize)
            probs = torch.softmax(logits.float(), dim=-1)
        else:
            weights, ids = route_sigmoid_bias(logits, self.top_k, self.expert_bias, renormalize=self.renormalize)
            scores = torch.sigmoid(logits.float())
            probs = scores / scores.sum(dim=-1, keepdim=True)
        return weights, ids, probs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_tensor(x, "x")
        if x.ndim < 1 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape [..., d_model={self.d_model}], got {list(x.shape)}")
        lead = x.shape[:-1]
        x2d = x.reshape(-1, self.d_model)
        weights, ids, probs = self.route(x2d)
        out = moe_experts(x2d, self.w_gate_up.to(x.dtype), self.w_down.to(x.dtype), weights.to(x.dtype),
                          ids, impl=self.impl, check_ids=False)
        if self.shared_expert:
            h = self.shared_gate_up(x2d)
            out = out + self.shared_down(F.silu(h[:, :self.d_ff]) * h[:, self.d_ff:])
        self.last_ids, self.last_weights = ids.detach(), weights.detach()
        self.aux_loss = load_balance_loss(probs, ids)
        if self.training and self.router == "sigmoid_bias" and self.bias_update_rate > 0:
            update_bias(self.expert_bias, expert_counts(ids, self.n_experts), self.bias_update_rate)
        return out.reshape(*lead, self.d_model)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_ff={self.d_ff}, n_experts={self.n_experts}, top_k={self.top_k}, "
                f"router={self.router!r}, shared_expert={self.shared_expert}, impl={self.impl!r}")
