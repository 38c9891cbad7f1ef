"""The engine's clock: real time, or simulated time that prices each step.

An engine stamps every event -- a request's arrival, its first token, each later token -- with
its clock. :class:`WallClock` is ``time.perf_counter`` (a GPU run: every step ends by reading the
sampled tokens back, so the step's work is done when it is stamped). :class:`SimulatedClock`
instead advances by a *price* per step, :class:`StepCost`, fitted to step times measured
on a device: the same run gives the same times on any machine, at the speed of the scheduler
alone (discrete-event simulation of a serving system, as Vidur does: Agrawal et al. 2024,
arXiv:2405.05465).

A step's price depends on its :class:`StepShape` -- how many sequences decode, how many prompt
tokens it computes, how many query-key pairs a dense attention over its context touches (the
part that grows with context), and the bytes it swaps to or from the host::

    ms = fixed_ms + decode_ms * decodes + prefill_token_ms * prefill_tokens
         + attend_ms_per_mpair * (attended - prefill_pairs) / 1e6
         + prefill_attend_ms_per_mpair * prefill_pairs / 1e6 + swap_bytes / host_gbps / 1e6

A decode row *reads* its context's keys and values (memory-bound), a prompt chunk *computes* its
query-key pairs (compute-bound): on a GPU a million of the first cost far more than a million of
the second, so the two are priced apart where the measured steps hold both kinds.

:meth:`StepCost.fit` finds the coefficients (non-negative least squares) from measured
``(shape, ms)`` pairs, e.g. the ``step_times`` an engine records.
"""
from __future__ import annotations

import math
import numbers
import time
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class StepShape:
    """What a step computed: ``decodes`` sequences decoding one token each, ``prefill_tokens``
    prompt tokens, ``attended`` query-key pairs of dense attention over the context (a decode row
    counts its context length, a chunk ``start .. end`` counts ``sum(i + 1 for i in range(start, end))``)
    and ``swap_bytes`` copied between the device and the host; ``prefill_pairs`` is the part of
    ``attended`` that prompt chunks computed (the rest: decode rows' contexts)."""

    decodes: int = 0
    prefill_tokens: int = 0
    attended: int = 0
    swap_bytes: int = 0
    prefill_pairs: int = 0

    @property
    def tokens(self) -> int:
        return self.decodes + self.prefill_tokens


def check_seconds(value, name: str, *, minimum: float | None = None) -> float:
    """``value`` as a float number of seconds: a real number (not bool) that is finite and, when
    ``minimum`` is given, at least ``minimum``. Raises ``TypeError`` for another type and
    ``ValueError`` for NaN, an infinity or a smaller value (a clock never reaches them)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be a finite number of seconds >= {minimum:g}, got {value}")
    return value


def chunk_pairs(start: int, end: int) -> int:
    """Query-key pairs of causal attention for query positions ``start .. end`` (each sees itself and all before)."""
    return (end * (end + 1) - start * (start + 1)) // 2


@dataclass(frozen=True)
class StepCost:
    """A step's price in ms as a linear function of its :class:`StepShape` (module docstring);
    ``host_gbps`` prices swaps (``None``: swapping is free). ``source`` says what was measured.
    ``prefill_attend_ms_per_mpair`` prices the prompt chunks' pairs (``None``: as decode rows'
    context, ``attend_ms_per_mpair``)."""

    fixed_ms: float
    decode_ms: float
    prefill_token_ms: float
    attend_ms_per_mpair: float
    host_gbps: float | None = None
    source: str = ""
    prefill_attend_ms_per_mpair: float | None = None

    def __post_init__(self):
        for name in ("fixed_ms", "decode_ms", "prefill_token_ms", "attend_ms_per_mpair",
                     "prefill_attend_ms_per_mpair"):
            v = getattr(self, name)
            if v is None and name == "prefill_attend_ms_per_mpair":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.host_gbps is not None and not (isinstance(self.host_gbps, (int, float)) and self.host_gbps > 0):
            raise ValueError(f"host_gbps must be a positive number or None, got {self.host_gbps!r}")

    def ms(self, shape: StepShape) -> float:
        swap = shape.swap_bytes / (self.host_gbps * 1e6) if self.host_gbps and shape.swap_bytes else 0.0
        chunk = self.attend_ms_per_mpair if self.prefill_attend_ms_per_mpair is None else self.prefill_attend_ms_per_mpair
        return (self.fixed_ms + self.decode_ms * shape.decodes + self.prefill_token_ms * shape.prefill_tokens
                + self.attend_ms_per_mpair * (shape.attended - shape.prefill_pairs) / 1e6
                + chunk * shape.prefill_pairs / 1e6 + swap)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StepCost":
        """The inverse of :meth:`to_dict`; raises ``ValueError`` for missing or bad fields."""
        try:
            return cls(**{k: d[k] for k in ("fixed_ms", "decode_ms", "prefill_token_ms", "attend_ms_per_mpair")},
                       host_gbps=d.get("host_gbps"), source=d.get("source", ""),
                       prefill_attend_ms_per_mpair=d.get("prefill_attend_ms_per_mpair"))
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a step cost: {d!r:.200} ({e})") from None

    @classmethod
    def fit(cls, samples, *, host_gbps: float | None = None, source: str = "") -> "StepCost":
        """Non-negative least squares over ``samples`` (pairs ``(StepShape, ms)``); a coefficient
        whose feature never varies in the samples is 0, but the prompt chunks' pairs, which without
        samples of their own are priced as decode rows' context (``None``). Raises ``ValueError``
        for no samples."""
        samples = [(s, float(ms)) for s, ms in samples if ms > 0]
        if not samples:
            raise ValueError("StepCost.fit needs at least one (StepShape, ms) sample with ms > 0")
        X = np.array([[1.0, s.decodes, s.prefill_tokens, (s.attended - s.prefill_pairs) / 1e6, s.prefill_pairs / 1e6]
                      for s, _ in samples])
        y = np.array([ms for _, ms in samples])
        if not X[:, 4].any():                     # no chunk pairs measured apart: one price for all pairs
            return cls(*_nnls(X[:, :4], y), host_gbps=host_gbps, source=source)
        *coef, chunk = _nnls(X, y)
        return cls(*coef, host_gbps=host_gbps, source=source, prefill_attend_ms_per_mpair=chunk)


def _nnls(X: np.ndarray, y: np.ndarray) -> list:
    """Least squares with every coefficient >= 0: fit, drop the most negative column, refit."""
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    Xs = X / scale
    active = [j for j in range(X.shape[1]) if np.any(X[:, j] != 0)]
    coef = np.zeros(X.shape[1])
    while active:
        sol = np.linalg.lstsq(Xs[:, active], y, rcond=None)[0]
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return [float(c) for c in coef / scale]


class WallClock:
    """Real time (``time.perf_counter`` seconds); :meth:`wait_until` sleeps (``ValueError`` for a
    time that is not finite)."""

    simulated = False

    def now(self) -> float:
        return time.perf_counter()

    def step_done(self, start: float, shape: StepShape) -> float:
        """The time a step begun at ``start`` ended (its work is done when this is called)."""
        return time.perf_counter()

    def wait_until(self, t: float) -> None:
        delay = check_seconds(t, "t") - time.perf_counter()
        if delay > 0:
            time.sleep(delay)


class SimulatedClock:
    """Simulated seconds from ``start``: each step advances the clock by its price
    (``cost.ms(shape)``); :meth:`wait_until` jumps ahead. Times must be finite (``ValueError``:
    a clock told to wait for NaN would never get there)."""

    simulated = True

    def __init__(self, cost: StepCost, start: float = 0.0):
        if not isinstance(cost, StepCost):
            raise TypeError(f"cost must be a StepCost, got {type(cost).__name__}")
        self.cost = cost
        self.t = check_seconds(start, "start")

    def now(self) -> float:
        return self.t

    def step_done(self, start: float, shape: StepShape) -> float:
        self.t = max(self.t, start) + self.cost.ms(shape) / 1e3
        return self.t

    def wait_until(self, t: float) -> None:
        self.t = max(self.t, check_seconds(t, "t"))
