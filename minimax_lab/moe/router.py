"""Routers: which ``k`` of ``E`` experts each token goes to, and with what weight.

Two routers, one output contract -- ``(weights [T, k] float32, ids [T, k] int64)``, each row's
ids in order of decreasing routing score (equal scores: whichever order ``torch.topk`` returns,
which it does not promise; the tests compare ids where scores are distinct). Any float dtype
and strides of ``logits``; ``T = 0`` gives empty outputs:

* :func:`route_softmax` -- softmax over the ``E`` logits, keep the top ``k``, optionally
  renormalise the kept probabilities to sum to 1 (Mixtral, arXiv 2401.04088; Qwen3-MoE).
* :func:`route_sigmoid_bias` -- sigmoid scores per expert; a per-expert *correction bias* is
  added to the scores **only to choose** the experts, the weights come from the unbiased
  scores, renormalised over the chosen ``k`` (DeepSeek-V3's auxiliary-loss-free balancing,
  arXiv 2412.19437 Sec. 2.1.2; MiniMax-M2 routes the same way). :func:`update_bias` is the
  rule that moves the bias after each step: ``b_i += rate * sign(mean_load - load_i)``, so
  overloaded experts get pushed down and idle ones pulled up, without a gradient.

:func:`load_balance_loss` is the Switch-Transformer auxiliary loss
(arXiv 2101.03961 eq. 4-6): ``E * sum_i f_i * P_i`` with ``f_i`` the fraction of routed slots
that went to expert ``i`` and ``P_i`` its mean router probability. It is 1.0 at perfect balance
and grows to ``E`` when every token picks the same expert.
"""
from __future__ import annotations

import torch

from minimax_lab.validate import FLOAT_DTYPES, check_positive_int, check_tensor

ROUTERS = ("softmax", "sigmoid_bias")


def _check_logits(logits: torch.Tensor, top_k: int) -> tuple[int, int]:
    check_tensor(logits, "logits", ndim=2, dtypes=FLOAT_DTYPES)
    T, E = logits.shape
    check_positive_int(top_k, "top_k")
    if top_k > E:
        raise ValueError(f"top_k must be <= the number of experts E={E}, got top_k={top_k}")
    return T, E


def route_softmax(logits: torch.Tensor, top_k: int, *, renormalize: bool = True
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k routing.

    ``logits`` ``[T, E]`` float -> ``(weights [T, k] float32, ids [T, k] int64)``. With
    ``renormalize`` the kept probabilities are divided by their sum (Mixtral/Qwen3); without,
    they are the raw softmax probabilities (Switch/GShard). Raises ``ValueError`` if
    ``top_k > E`` or ``logits`` is not 2-D float.
    """
    _check_logits(logits, top_k)
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def route_sigmoid_bias(logits: torch.Tensor, top_k: int, bias: torch.Tensor | None = None, *,
                       renormalize: bool = True, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid routing with an aux-loss-free correction bias (DeepSeek-V3 / MiniMax-M2 style).

    ``scores = sigmoid(logits)``; the experts are the top ``k`` of ``scores + bias`` (``bias``
    ``[E]``, default zeros), the weights are the *unbiased* scores of those experts,
    renormalised to sum to 1 when ``renormalize``, then multiplied by ``scale``.
    Returns ``(weights [T, k] float32, ids [T, k] int64)``.
    """
    T, E = _check_logits(logits, top_k)
    scores = torch.sigmoid(logits.float())
    if bias is None:
        choice = scores
    else:
        check_tensor(bias, "bias", shape=(E,), dtypes=FLOAT_DTYPES)
        choice = scores + bias.float().to(scores.device)
    _, ids = torch.topk(choice, top_k, dim=-1)
    weights = scores.gather(-1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-20)
    return weights * scale, ids


def expert_counts(ids: torch.Tensor, n_experts: int) -> torch.Tensor:
    """How many routed slots each expert got: ``ids`` ``[T, k]`` -> int64 ``[E]``.

    Written with ``scatter_add_`` rather than ``bincount`` so it never synchronises with the GPU.
    """
    check_tensor(ids, "ids", ndim=2)
    flat = ids.reshape(-1).long()
    return torch.zeros(n_experts, dtype=torch.long, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))


@torch.no_grad()
def update_bias(bias: torch.Tensor, counts: torch.Tensor, rate: float = 1e-3) -> torch.Tensor:
    """DeepSeek-V3's bias update, in place: ``bias += rate * sign(mean(counts) - counts)``.

    ``bias`` ``[E]`` float, ``counts`` ``[E]`` (tokens each expert received this step).
    Returns ``bias``.
    """
    check_tensor(bias, "bias", ndim=1, dtypes=FLOAT_DTYPES)
    check_tensor(counts, "counts", shape=(bias.shape[0],))
    load = counts.float().to(bias.device)
    bias.add_(rate * torch.sign(load.mean() - load).to(bias.dtype))
    return bias


def load_balance_loss(probs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Switch-Transformer balance loss ``E * sum_i f_i * P_i`` (a scalar, differentiable in ``probs``).

    ``probs`` ``[T, E]``: the router's per-expert probabilities (softmax output, or normalised
    sigmoid scores); ``ids`` ``[T, k]``: the chosen experts. 1.0 at perfect balance.
    """
    check_tensor(probs, "probs", ndim=2, dtypes=FLOAT_DTYPES)
    T, E = probs.shape
    check_tensor(ids, "ids", ndim=2, shape=(T, None))
    if T == 0:
        return probs.sum() * 0.0
    frac = expert_counts(ids, E).float() / ids.numel()
    return E * (frac * probs.float().mean(dim=0)).sum()
