"""Requests that arrive over time: a Poisson process, or Mooncake's trace scaled to the model.

An :class:`Arrival` is a request and the second it arrives (from the start of the run). Every
arrival is a distinct sequence: its own prompt, though prompts may share a prefix (a system
prompt; in the trace, the blocks Mooncake's requests share).

* :func:`poisson_arrivals` -- ``n`` requests whose gaps are exponential with mean ``1 / rate``
  (a Poisson process: arrivals independent of each other, as from many users), prompts of
  standard-library sources at random offsets after an optional shared prefix.
* :func:`mooncake_arrivals` -- ``n`` consecutive requests of Mooncake's trace
  (:func:`minimax_lab.kvcache.trace.find_trace`): its timestamps, stretched or squeezed so the
  requests come at ``rate`` on average; its lengths scaled so that one of the trace's 512-token
  blocks becomes ``block_tokens`` tokens of the model (default: one KV page); each block id one
  fixed run of token ids, so two requests share cached pages exactly where the trace says they
  share blocks.

Both are deterministic in ``seed``.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from minimax_lab.engine.clock import check_seconds
from minimax_lab.engine.config import M3Config
from minimax_lab.engine.workloads import fold, source_tokens
from minimax_lab.kvcache.blocks import token_ids
from minimax_lab.kvcache.trace import HOW_TO_GET, find_trace, read_trace
from minimax_lab.validate import check_positive_int

#: tokens per block of a Mooncake trace
TRACE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class Arrival:
    """A request arriving ``time_s`` seconds after the run starts: its prompt ids and answer length.

    ``time_s`` is a finite number >= 0, ``prompt`` at least one non-negative integer id (kept as a
    tuple), ``max_tokens`` a positive int; anything else raises ``TypeError``/``ValueError``."""

    time_s: float
    prompt: tuple
    max_tokens: int

    def __post_init__(self):
        object.__setattr__(self, "time_s", check_seconds(self.time_s, "time_s", minimum=0.0))
        prompt = self.prompt
        if not (isinstance(prompt, tuple) and all(type(t) is int for t in prompt)):   # fast path: a tuple of ints
            prompt = tuple(token_ids(prompt, "prompt"))
        if not prompt:
            raise ValueError("prompt must hold at least one token id")
        if min(prompt) < 0:
            raise ValueError(f"prompt ids must be >= 0, got {min(prompt)}")
        object.__setattr__(self, "prompt", prompt)
        check_positive_int(self.max_tokens, "max_tokens")


def _check_rate(rate) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0 or rate == float("inf"):
        raise ValueError(f"rate must be a positive finite number of requests per second, got {rate!r}")
    return float(rate)


def _check_range(value, name: str) -> tuple:
    if not (isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int) and v >= 1 for v in value)
            and value[0] <= value[1]):
        raise ValueError(f"{name} must be a (low, high) pair of ints with 1 <= low <= high, got {value!r}")
    return value


def poisson_times(n: int, rate: float, *, seed: int = 0) -> list[float]:
    """``n`` arrival times (seconds) of a Poisson process at ``rate`` per second, the first at its
    first gap (not at 0)."""
    check_positive_int(n, "n")
    rate = _check_rate(rate)
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def poisson_arrivals(cfg: M3Config, n: int, rate: float, *, prompt_tokens=(32, 96), max_tokens=(4, 16),
                     shared_prefix: int = 0, seed: int = 0) -> list[Arrival]:
    """``n`` requests at Poisson ``rate`` (module docstring): prompts of ``prompt_tokens`` tokens
    (a ``(low, high)`` range, drawn uniformly, the first ``shared_prefix`` the same for all),
    answers of ``max_tokens`` tokens (a range). Raises ``ValueError`` for bad sizes."""
    lo, hi = _check_range(prompt_tokens, "prompt_tokens")
    _check_range(max_tokens, "max_tokens")
    if not isinstance(shared_prefix, int) or not 0 <= shared_prefix < lo:
        raise ValueError(f"shared_prefix must be an int in [0, {lo}) (shorter than every prompt), got {shared_prefix!r}")
    times = poisson_times(n, rate, seed=seed)
    rng = random.Random(seed + 1)
    prefix = fold(source_tokens(shared_prefix), cfg) if shared_prefix else []
    out = []
    for t in times:
        length = rng.randint(lo, hi)
        body = fold(source_tokens(length - shared_prefix, skip=rng.randrange(0, 20_000)), cfg)
        out.append(Arrival(t, tuple(prefix + body), rng.randint(*max_tokens)))
    return out


def _block(cfg: M3Config, key: tuple, n_tokens: int) -> list[int]:
    """``n_tokens`` text ids drawn from ``key`` (non-negative ints): the same key, the same ids."""
    rng = np.random.default_rng(list(key))
    return rng.integers(0, cfg.vocab_size - 1, n_tokens).tolist()


def mooncake_arrivals(cfg: M3Config, n: int, *, rate: float | None = None, block_tokens: int | None = None,
                      max_tokens: int = 64, start: int = 0, seed: int = 0, trace=None) -> list[Arrival]:
    """``n`` requests of Mooncake's trace from request ``start`` on (module docstring). ``rate``
    (requests per second; ``None``: the trace's own timing) scales the timestamps; answers are the
    trace's output lengths capped at ``max_tokens``; prompts are cut to fit ``cfg.max_seq_len``
    with the answer. ``trace``: a list of :class:`minimax_lab.kvcache.trace.Request` (default:
    the shipped trace). Where the slice spans no time (one request, or equal timestamps), the
    requests come ``1 / rate`` apart. Raises ``ValueError`` for bad sizes, a ``rate`` that is not a
    positive finite number, or a trace with fewer requests,
    ``FileNotFoundError`` when no trace is found."""
    check_positive_int(n, "n")
    check_positive_int(max_tokens, "max_tokens")
    rate = None if rate is None else _check_rate(rate)      # whatever the slice: one request spans no time
    block_tokens = check_positive_int(block_tokens or cfg.block_size, "block_tokens")
    if trace is None:
        path = find_trace()
        if path is None:
            raise FileNotFoundError(f"Mooncake's trace was not found. {HOW_TO_GET}")
        trace = read_trace(path)
    if isinstance(start, bool) or not isinstance(start, int) or start < 0 or start + n > len(trace):
        raise ValueError(f"start + n must lie within the trace's {len(trace)} requests, got start={start!r}, n={n}")
    reqs = trace[start:start + n]
    t0 = reqs[0].timestamp
    times = [(r.timestamp - t0) / 1e3 for r in reqs]
    if rate is not None:
        span = times[-1]
        own = (n - 1) / span if span > 0 else float("inf")
        stretch = own / rate if own != float("inf") else 0.0
        times = [t * stretch for t in times] if stretch else [i / rate for i in range(n)]
    factor = block_tokens / TRACE_BLOCK_TOKENS
    out = []
    for i, (r, t) in enumerate(zip(reqs, times)):
        answer = max(1, min(r.output_length, max_tokens))
        length = max(1, min(round(r.input_length * factor), cfg.max_seq_len - answer))
        prompt = [tok for h in r.hash_ids for tok in _block(cfg, (seed, 0, h), block_tokens)][:length]
        if len(prompt) < length:   # the trace names fewer blocks than its length: this request's own tokens
            prompt += _block(cfg, (seed, 1, start + i), length - len(prompt))
        out.append(Arrival(t, tuple(prompt), answer))
    return out
