"""What a serving system learns, online, about how conversations come back.

Every statistic here is updated only from turns that have already arrived -- nothing reads the
future. ``TurnStats`` keeps three distributions:

* **continuation** -- of the conversations that reached ``k`` turns, the share that reached
  ``k + 1``, per class: ``k`` bucketed (1, 2, 3, 4-7, 8+) and the last request's size and answer
  length in powers of two (a short first question with a short answer comes back more often in
  some traces; the table learns whatever holds in the one it sees), each class smoothed toward
  its ``k`` bucket and that toward a prior;
* **think time** -- the gap between a conversation's turns, in log2-spaced bins of seconds, from
  which ``survival(a)`` (the share of gaps longer than ``a``) follows;
* **tail loss** -- how many blocks at the end of a conversation's previous request its next turn
  did not reuse (the last, partial block always; a few more where the context was rewritten).

Together they give ``return_probability(k, age)`` -- that a conversation idle for ``age`` seconds
after its ``k``-th turn comes back (Bayes over the think-time survival) -- the quantities of the
Wang et al. observation that per request category, reuse probability decays predictably with time
("KVCache Cache in the Wild", 2025, arXiv:2506.02634).
"""
from __future__ import annotations

import math

SIZE_BUCKETS = 8              # log2 of the request's blocks: 1, 2-3, 4-7, ... 128+
OUT_BUCKETS = 8               # log2 of the answer's tokens / 16
#: turn-count buckets: 1, 2, 3, 4-7, 8+
K_BUCKETS = 5
GAP_BINS = 24                 # log2 bins of seconds: [0, 0.25), [0.25, 0.5), ... up to ~2^21 s
_GAP_BASE = 0.25
LOSS_BINS = 64


def k_bucket(k: int) -> int:
    return 0 if k <= 1 else 1 if k == 2 else 2 if k == 3 else 3 if k < 8 else 4


def request_class(k: int, blocks: int, output_tokens: int) -> int:
    """The continuation class of a conversation after its ``k``-th turn: turn bucket, size bucket,
    answer-length bucket."""
    sb = min(SIZE_BUCKETS - 1, max(0, blocks).bit_length() - 1) if blocks > 0 else 0
    ob = min(OUT_BUCKETS - 1, (max(0, output_tokens) // 16).bit_length())
    return (k_bucket(k) * SIZE_BUCKETS + sb) * OUT_BUCKETS + ob


def gap_bin(seconds: float) -> int:
    if seconds < _GAP_BASE:
        return 0
    return min(GAP_BINS - 1, 1 + int(math.log2(seconds / _GAP_BASE)))


class TurnStats:
    """Online estimates of how conversations return (module docstring). ``prior_q`` is the
    continuation share assumed before any data, ``prior_gap_s`` the think time, ``prior_weight``
    how many observations the priors are worth."""

    def __init__(self, prior_q: float = 0.5, prior_gap_s: float = 60.0, prior_weight: float = 4.0,
                 refresh: int = 32):
        self.reached = [0.0] * (K_BUCKETS + 1)
        self.went_on = [0.0] * (K_BUCKETS + 1)
        n_classes = K_BUCKETS * SIZE_BUCKETS * OUT_BUCKETS
        self.class_reached = [0.0] * n_classes
        self.class_went_on = [0.0] * n_classes
        self.gap_count = [0.0] * GAP_BINS
        self.loss_count = [0.0] * LOSS_BINS
        self.prior_q, self.prior_weight = float(prior_q), float(prior_weight)
        b = gap_bin(prior_gap_s)
        self.gap_count[b] += prior_weight
        self.loss_count[1] += prior_weight
        self.refresh, self._pending = int(refresh), 0
        self._rebuild()

    # ---- what arrives ------------------------------------------------------------------------
    def new_turn(self, k: int, prev_class: int | None = None) -> None:
        """A conversation reached its ``k``-th turn (1 for a new conversation); ``prev_class`` is
        the class (``request_class``) it was in after its previous turn."""
        self.reached[k_bucket(k)] += 1
        if k > 1:
            self.went_on[k_bucket(k - 1)] += 1
            if prev_class is not None:
                self.class_went_on[prev_class] += 1

    def ended_turn(self, cls: int) -> None:
        """A turn ended, leaving its conversation in class ``cls`` (``request_class``)."""
        self.class_reached[cls] += 1

    def returned(self, gap_s: float, lost_blocks: int) -> None:
        """A conversation came back after ``gap_s`` seconds, reusing all but ``lost_blocks`` of the
        blocks at the end of its previous request."""
        b = gap_bin(max(0.0, gap_s))
        self.gap_count[b] += 1
        self.loss_count[min(LOSS_BINS - 1, max(0, lost_blocks))] += 1
        self._pending += 1
        if self._pending >= self.refresh:
            self._rebuild()

    def _rebuild(self) -> None:
        """Tail sums of the histograms, so each lookup is O(1)."""
        self._pending = 0
        n_above = [0.0] * (GAP_BINS + 1)
        for i in range(GAP_BINS - 1, -1, -1):
            n_above[i] = n_above[i + 1] + self.gap_count[i]
        self._n_above, self._n_total = n_above, n_above[0]
        total, acc = sum(self.loss_count), 0.0
        self._loss_cdf = []
        for c in self.loss_count:
            acc += c
            self._loss_cdf.append(acc / total)

    # ---- what follows ------------------------------------------------------------------------
    def continuation(self, k: int) -> float:
        """P(a conversation with ``k`` turns so far has another), smoothed toward ``prior_q``."""
        b = k_bucket(k)
        return (self.went_on[b] + self.prior_weight * self.prior_q) / (self.reached[b] + self.prior_weight)

    def class_continuation(self, cls: int) -> float:
        """P(another turn) for a conversation in class ``cls``, smoothed toward its ``k`` bucket."""
        kb = cls // (SIZE_BUCKETS * OUT_BUCKETS)
        q_k = (self.went_on[kb] + self.prior_weight * self.prior_q) / (self.reached[kb] + self.prior_weight)
        return (self.class_went_on[cls] + self.prior_weight * q_k) / (self.class_reached[cls] + self.prior_weight)

    def survival(self, age_s: float) -> float:
        """P(think time > ``age_s``), counting the bin of ``age_s`` as half passed."""
        b = gap_bin(age_s)
        return (self._n_above[b + 1] + 0.5 * self.gap_count[b]) / self._n_total

    def return_probability(self, k: int, age_s: float) -> float:
        """P(a conversation idle ``age_s`` after its ``k``-th turn comes back): ``q S / (q S + 1 - q)``."""
        q = self.continuation(k)
        qs = q * self.survival(age_s)
        return qs / (qs + 1.0 - q) if qs > 0 else 0.0

    def kept(self, from_end: int) -> float:
        """P(the block ``from_end`` blocks before the end of the last request is reused by the next
        turn), ``from_end`` 0 for the last block."""
        return self._loss_cdf[min(LOSS_BINS - 1, max(0, from_end))]
