"""The engine under load: serve arriving requests, measure tail latency and goodput, sweep the rate.

:func:`serve_arrivals` plays a list of :class:`~minimax_lab.engine.arrivals.Arrival` against an
engine on its clock: a request is submitted once the clock has passed its arrival time (stamped
with that time, so its TTFT includes the wait for the step that was running), the engine steps
while it has work, and an idle engine waits for the next arrival (a simulated clock jumps there).

:func:`load_metrics` turns a run into what a serving engineer reads:

* ``throughput_tok_s`` -- generated tokens per second, from the first arrival to the last token;
* ``ttft_p50_ms``, ``ttft_p99_ms`` -- time to first token, median and 99th percentile;
* ``itl_p50_ms``, ``itl_p99_ms`` -- inter-token latency: every gap between consecutive tokens of
  a request, all requests pooled;
* ``goodput_rps`` -- requests per second that met the :class:`SLO` (first token within
  ``ttft_s``, and time per output token after it, ``(last - first) / (n - 1)``, within
  ``tpot_s``); ``slo_attainment`` -- their share (DistServe, Zhong et al. 2024, arXiv:2401.09670,
  calls a system's goodput the highest rate at which ``attain`` of the requests meet the SLO:
  :func:`max_goodput_rate`);
* ``preemptions`` and the bytes swapped.

:func:`sweep` runs one arrival process at several rates. Percentiles interpolate linearly between
order statistics (numpy's default).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from minimax_lab.engine.arrivals import Arrival
from minimax_lab.engine.sampling import SamplingParams
from minimax_lab.engine.sequence import Sequence


@dataclass(frozen=True)
class SLO:
    """A request meets it when its TTFT <= ``ttft_s`` and its time per output token <= ``tpot_s``;
    ``attain`` is the share of requests a rate must satisfy to count as sustained."""

    ttft_s: float
    tpot_s: float
    attain: float = 0.9

    def __post_init__(self):
        for name in ("ttft_s", "tpot_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {v!r}")
        if not 0 < self.attain <= 1:
            raise ValueError(f"attain must lie in (0, 1], got {self.attain!r}")

    def met(self, seq: Sequence) -> bool:
        ttft = seq.first_token - seq.arrival
        n = len(seq.token_times)
        tpot = (seq.token_times[-1] - seq.first_token) / (n - 1) if n > 1 else 0.0
        return ttft <= self.ttft_s and tpot <= self.tpot_s

    def describe(self) -> str:
        return f"TTFT <= {self.ttft_s * 1e3:.4g} ms and time per output token <= {self.tpot_s * 1e3:.4g} ms"


@dataclass
class LoadResult:
    """A served load: the finished sequences (in arrival order), the run's start and end on the
    engine's clock, and the engine's preemption and swap counters."""

    sequences: list = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0
    steps: int = 0
    preemptions: int = 0
    swap_bytes: int = 0


def serve_arrivals(engine, arrivals: list, *, seed: int = 0, on_step=None, tag="load") -> LoadResult:
    """Serve ``arrivals`` (sorted by time) on ``engine`` until every request has finished (module
    docstring). Greedy answers of each arrival's ``max_tokens``; request ids ``(tag, i)`` (a second
    run on the same engine needs another ``tag``).
    ``on_step(engine)``, if given, is called after every step (``engine.last_plan`` and
    ``engine.step_times[-1]`` describe it)."""
    if not all(isinstance(a, Arrival) for a in arrivals):
        raise TypeError("arrivals must be a list of Arrival")
    times = [a.time_s for a in arrivals]
    if times != sorted(times):
        raise ValueError("arrivals must be sorted by time")
    clock = engine.clock
    start = clock.now()
    steps0, preempt0 = engine.steps, engine.scheduler.preemptions
    swap0 = engine.swap.bytes_out + engine.swap.bytes_in
    ids, i = [], 0
    while i < len(arrivals) or engine.has_work():
        now = clock.now()
        while i < len(arrivals) and start + arrivals[i].time_s <= now:
            a = arrivals[i]
            ids.append(engine.add_request(list(a.prompt), sampling=SamplingParams(max_tokens=a.max_tokens, seed=seed),
                                          request_id=(tag, i), arrival=start + a.time_s))
            i += 1
        if engine.has_work():
            engine.step()
            if on_step is not None and engine.last_plan is not None:
                on_step(engine)
        elif i < len(arrivals):
            clock.wait_until(start + arrivals[i].time_s)
    seqs = [engine.sequences[r] for r in ids]
    end = max((s.finished for s in seqs), default=start)
    return LoadResult(seqs, start, end, engine.steps - steps0, engine.scheduler.preemptions - preempt0,
                      engine.swap.bytes_out + engine.swap.bytes_in - swap0)


def percentile(xs, q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``xs``, interpolating linearly; None for no values."""
    xs = sorted(xs)
    if not xs:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"q must lie in [0, 100], got {q!r}")
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _ms(x):
    return None if x is None else x * 1e3


def load_metrics(result: LoadResult, slo: SLO) -> dict:
    """The run's numbers (module docstring); times in ms, rates per second."""
    seqs = result.sequences
    duration = result.end - min((s.arrival for s in seqs), default=result.start)
    ttft = [s.first_token - s.arrival for s in seqs]
    gaps = [b - a for s in seqs for a, b in zip(s.token_times, s.token_times[1:])]
    met = sum(slo.met(s) for s in seqs)
    tokens = sum(len(s.output) for s in seqs)
    return {"requests": len(seqs), "duration_s": duration, "output_tokens": tokens,
            "throughput_tok_s": tokens / duration if duration > 0 else None,
            "ttft_p50_ms": _ms(percentile(ttft, 50)), "ttft_p99_ms": _ms(percentile(ttft, 99)),
            "itl_p50_ms": _ms(percentile(gaps, 50)), "itl_p99_ms": _ms(percentile(gaps, 99)),
            "slo_attainment": met / len(seqs) if seqs else None,
            "goodput_rps": met / duration if duration > 0 else None,
            "preemptions": result.preemptions, "swap_bytes": result.swap_bytes, "steps": result.steps}


def sweep(serve_at, rates, slo: SLO) -> list[dict]:
    """``serve_at(rate) -> LoadResult`` at each of ``rates``; one :func:`load_metrics` row each,
    with its ``rate``."""
    return [{"rate": float(r), **load_metrics(serve_at(r), slo)} for r in rates]


def max_goodput_rate(rows: list, attain: float = 0.9) -> float | None:
    """The highest swept ``rate`` whose ``slo_attainment`` reaches ``attain`` (None if none does)."""
    ok = [r["rate"] for r in rows if r.get("slo_attainment") is not None and r["slo_attainment"] >= attain]
    return max(ok) if ok else None
