"""A small learned predictor of reuse: will this conversation have another turn?

After each turn a serving system knows the conversation's turn count, the size of its last request
and the length of its answer. ``turn_examples`` turns a trace into one example per turn (those
features, and whether the conversation came back later in the trace); ``fit`` trains a logistic
regression on them (numpy, Newton's method with an L2 penalty); the ``ContinuationModel`` it
returns is the ``continuation`` of ``eviction.ConversationPolicy`` -- trained on one trace, used
online on another. LPC (Yang et al., "Learned Prefix Caching for Efficient LLM Inference",
NeurIPS 2025) learns the same guess from the prompts' text; here only sizes and counts are used,
which every trace has.

``ContinuationOracle`` answers from the future (whether the conversation does come back): not a
policy to deploy, a bound on what knowing *whether* -- but not *when* -- buys.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from minimax_lab.kvcache.trace import _as_requests, conversation_ids

FEATURES = ("1", "log turns", "first turn", "log blocks", "log answer", "log blocks x first turn",
            "log answer x first turn")


def features(turns: int, blocks: int, output_tokens: int) -> np.ndarray:
    """The feature vector of a conversation after its ``turns``-th turn (``FEATURES``)."""
    first = 1.0 if turns <= 1 else 0.0
    lb, lo = math.log1p(max(blocks, 0)), math.log1p(max(output_tokens, 0))
    return np.array([1.0, math.log(max(turns, 1)), first, lb, lo, lb * first, lo * first])


def turn_examples(trace) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)``: one row of ``features`` per request, ``y`` 1 where its conversation has a later
    request in the trace (``trace.conversation_ids`` names the conversations)."""
    reqs = _as_requests(trace)
    convs = conversation_ids(reqs)
    turns: dict = {}
    rows, last_of = [], {}
    for i, (r, c) in enumerate(zip(reqs, convs)):
        turns[c] = turns.get(c, 0) + 1
        rows.append(features(turns[c], len(r.hash_ids), r.output_length))
        last_of[c] = i
    y = np.zeros(len(reqs))
    for i, c in enumerate(convs):
        y[i] = 1.0 if last_of[c] > i else 0.0
    return np.array(rows).reshape(len(reqs), len(FEATURES)), y


@dataclass
class ContinuationModel:
    """A logistic regression over ``features``; ``weights`` per ``FEATURES`` entry (on features
    scaled by ``scale``)."""

    weights: np.ndarray
    scale: np.ndarray

    def probability(self, turns: int, blocks: int, output_tokens: int) -> float:
        z = float(features(turns, blocks, output_tokens) / self.scale @ self.weights)
        return 1.0 / (1.0 + math.exp(-max(min(z, 30.0), -30.0)))

    def __call__(self, conversation, turns: int, blocks: int, output_tokens: int) -> float:
        """``eviction.ConversationPolicy``'s ``continuation`` hook."""
        return self.probability(turns, blocks, output_tokens)

    def predict(self, X: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-np.clip(X / self.scale @ self.weights, -30, 30)))


def fit(X: np.ndarray, y: np.ndarray, *, l2: float = 1e-2, iterations: int = 50) -> ContinuationModel:
    """Logistic regression by Newton's method (features scaled to unit range first; ``l2`` on all
    weights but the intercept). Raises ``ValueError`` for empty or mismatched inputs."""
    X, y = np.asarray(X, dtype=float), np.asarray(y, dtype=float)
    if X.ndim != 2 or len(X) == 0 or len(X) != len(y):
        raise ValueError(f"need X of shape [n, {len(FEATURES)}] and n labels, got {X.shape} and {y.shape}")
    scale = np.maximum(np.abs(X).max(axis=0), 1e-9)
    Z = X / scale
    w = np.zeros(Z.shape[1])
    reg = np.full(Z.shape[1], l2 * len(Z))
    reg[0] = 0.0
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(Z @ w, -30, 30)))
        grad = Z.T @ (p - y) + reg * w
        hess = (Z * (p * (1 - p))[:, None]).T @ Z + np.diag(reg) + 1e-9 * np.eye(len(w))
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return ContinuationModel(w, scale)


def log_loss(model: ContinuationModel, X: np.ndarray, y: np.ndarray) -> float:
    """Mean cross-entropy of the model's guesses on ``(X, y)`` (nats)."""
    p = np.clip(model.predict(X), 1e-9, 1 - 1e-9)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def auc(model: ContinuationModel, X: np.ndarray, y: np.ndarray) -> float:
    """Area under the ROC curve of the model's guesses (0.5 = no better than chance)."""
    s = model.predict(X)
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    ranks[order] = np.arange(1, len(s) + 1)
    pos = y == 1
    n_pos, n_neg = pos.sum(), (~pos).sum()
    if not n_pos or not n_neg:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


class ContinuationOracle:
    """``continuation`` from the future: 1 where the conversation has a later request in ``trace``,
    else 0 (module docstring: a bound, not a policy)."""

    def __init__(self, trace):
        reqs = _as_requests(trace)
        convs = conversation_ids(reqs)
        self.total: dict = {}
        for c in convs:
            self.total[c] = self.total.get(c, 0) + 1

    def __call__(self, conversation, turns: int, blocks: int, output_tokens: int) -> float:
        return 1.0 if turns < self.total.get(conversation, 0) else 0.0
