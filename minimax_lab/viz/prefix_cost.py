"""What prefix caching costs and buys per turn of an agent's task (chapter 06, sections 7 and 8).

Prefix caching skips computing a prompt's cached tokens, and in exchange the block manager names
every full page of the prompt (a chained hash) and looks the names up: host work that grows with
the prompt, which the uncached engine never does. This module measures both sides:

* :func:`run_turns` -- the engine slice on an agent's task, turn by turn: prompt tokens computed and
  reused, the time to first token (TTFT) and, inside it, the time the block manager's ``allocate``
  took (naming and looking up the pages); ``repeats`` interleaved runs per variant give a spread.
* :func:`bookkeeping_ms` -- the block manager alone, replaying the page calls the engine makes on a
  session of the recorded engine run's sizes, with and without prefix caching: host time per turn.
* :func:`ttft_slope` -- how fast a recorded TTFT grows with the prompt (ms per 1,000 prompt tokens,
  a least-squares slope with two standard errors).
* :func:`plot_turn_times` / :func:`turn_words` -- the measured TTFT per turn split into bookkeeping
  and the rest, and the sentence that judges the difference against its noise.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np

from minimax_lab.engine.slice import PagedEngine, agent_session_chunks
from minimax_lab.kvcache import BlockManager
from minimax_lab.viz import noise

VARIANTS = {"with prefix caching": True, "without": False}


def _agent_turns(engine: PagedEngine, base: list[int], tool_outputs: list[list[int]], new_tokens: int) -> list[dict]:
    """One run of the task on ``engine``: per turn, prompt = everything so far."""
    spent: list[float] = []
    allocate = engine.mgr.allocate

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return allocate(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t0)

    engine.mgr.allocate = timed
    history, rows = list(base), []
    try:
        for k, tool_out in enumerate(tool_outputs):
            computed, reused = engine.stats.prefill_tokens, engine.stats.cached_tokens
            out = engine.generate(("turn", k), history, new_tokens)
            rows.append(dict(computed=engine.stats.prefill_tokens - computed, reused=engine.stats.cached_tokens - reused,
                             ttft_ms=1e3 * engine.stats.ttft_s[-1], bookkeeping_ms=1e3 * spent[-1], out=out,
                             prompt=len(history)))
            history += out + tool_out
    finally:
        del engine.mgr.allocate
    return rows


def run_turns(model, base: list[int], tool_outputs: list[list[int]], *, new_tokens: int, num_pages: int,
              page_size: int = 16, repeats: int = 2) -> dict[str, list[dict]]:
    """Run the task ``repeats`` times with and without prefix caching, alternating which goes first;
    variant -> per turn ``computed``, ``reused``, ``prompt`` (tokens), ``out`` (the generated tokens),
    ``ttft_ms`` (the median over the repeats) and ``bookkeeping_ms`` (the fastest: a short host call
    that noise can only lengthen), each with every run's as ``*_runs``."""
    runs: dict[str, list[list[dict]]] = {name: [] for name in VARIANTS}
    for r in range(repeats):
        order = list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]
        for name in order:
            eng = PagedEngine(model, num_pages=num_pages, page_size=page_size, prefix_caching=VARIANTS[name])
            runs[name].append(_agent_turns(eng, base, tool_outputs, new_tokens))
    out = {}
    for name, rr in runs.items():
        rows = []
        for k, first in enumerate(rr[0]):
            row = dict(first)
            for key, pick in (("ttft_ms", statistics.median), ("bookkeeping_ms", min)):
                row[key + "_runs"] = [run[k][key] for run in rr]
                row[key] = pick(row[key + "_runs"])
            rows.append(row)
        out[name] = rows
    return out


def same_outputs(per_turn: Mapping[str, Sequence[dict]]) -> bool:
    """Whether every variant generated the same tokens on every turn."""
    outs = [[r["out"] for r in rows] for rows in per_turn.values()]
    return all(o == outs[0] for o in outs)


def recorded_session(shape: Mapping) -> tuple[list[int], list[list[int]], int]:
    """The agent's task of a recorded engine run (its ``shape``: turns, base_tokens, page_size), as
    :mod:`minimax_lab.bench.suite_kvcache_tiers` builds it: (base, tool outputs, new tokens per turn).
    The token ids differ from the run's (they are folded into another vocabulary); the lengths do not."""
    base, tools = agent_session_chunks(shape["turns"], vocab_size=4096, base_tokens=shape["base_tokens"],
                                       turn_tokens=(40, 70))
    new_tokens = (shape["final_length"] - len(base) - sum(map(len, tools))) // shape["turns"]
    return base, tools, new_tokens


def prompt_lengths(shape: Mapping) -> list[int]:
    """The prompt length of each turn of a recorded engine run."""
    base, tools, new_tokens = recorded_session(shape)
    return [len(base) + sum(new_tokens + len(t) for t in tools[:k]) for k in range(len(tools))]


def bookkeeping_ms(shape: Mapping, *, repeats: int = 5) -> dict[str, list[float]]:
    """Host time per turn of ``BlockManager.allocate`` on the recorded session's prompts (then the
    turn's appended tokens and its free, untimed, as the engine does them), with and without prefix
    caching: variant -> ms per turn, the fastest of ``repeats`` interleaved runs (noise only adds)."""
    base, tools, new_tokens = recorded_session(shape)
    ps = shape["page_size"]
    best: dict[str, list[float]] = {name: [math.inf] * len(tools) for name in VARIANTS}
    for r in range(repeats):
        for name in (list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]):
            mgr = BlockManager(2 * (shape["final_length"] // ps + 2), ps, prefix_caching=VARIANTS[name])
            history = list(base)
            for k, tool_out in enumerate(tools):
                t0 = time.perf_counter()
                mgr.allocate(k, history)
                best[name][k] = min(best[name][k], 1e3 * (time.perf_counter() - t0))
                out = [4 + (k + i) % 7 for i in range(new_tokens)]
                for t in out[1:]:
                    mgr.append(k, t)
                mgr.free(k)
                history += out + tool_out
    return best


def ttft_slope(ttft_ms: Sequence[float], prompts: Sequence[int]) -> tuple[float, float]:
    """Least-squares slope of TTFT against prompt length, in ms per 1,000 prompt tokens, and two
    standard errors of it (needs three turns or more)."""
    if len(ttft_ms) != len(prompts) or len(prompts) < 3:
        raise ValueError(f"need three or more turns with a prompt length each, got {len(ttft_ms)} and {len(prompts)}")
    x = np.asarray(prompts, float) / 1e3
    y = np.asarray(ttft_ms, float)
    sxx = float(((x - x.mean()) ** 2).sum())
    if sxx == 0:
        raise ValueError("every turn has the same prompt length: no slope")
    slope = float(((x - x.mean()) * (y - y.mean())).sum()) / sxx
    resid = y - y.mean() - slope * (x - x.mean())
    se = math.sqrt(float((resid ** 2).sum()) / (len(x) - 2) / sxx)
    return slope, 2 * se


def plot_turn_times(per_turn: Mapping[str, Sequence[dict]], *, ax=None, title: str = ""):
    """Per turn and variant: the median TTFT as a bar, its bookkeeping part (the fastest run's)
    darker at the bottom, the fastest and slowest run as a whisker (the title says so after ``title``)."""
    ax = ax or plt.subplots(figsize=(7, 3))[1]
    names = list(per_turn)
    w = 0.8 / len(names)
    colours = ["#4c78a8", "#e45756", "#54a24b"]
    for j, name in enumerate(names):
        rows = per_turn[name]
        x = np.arange(len(rows)) + (j - (len(names) - 1) / 2) * w
        ttft = np.array([r["ttft_ms"] for r in rows])
        lo = ttft - [min(r.get("ttft_ms_runs", [r["ttft_ms"]])) for r in rows]
        hi = np.array([max(r.get("ttft_ms_runs", [r["ttft_ms"]])) for r in rows]) - ttft
        book = [r["bookkeeping_ms"] for r in rows]
        ax.bar(x, ttft, w, yerr=[lo, hi], capsize=2, color=colours[j % 3], alpha=0.45, label=f"{name}: time to first token")
        work = "naming, looking up and allocating pages" if VARIANTS.get(name, True) else "allocating pages"
        ax.bar(x, book, w, color=colours[j % 3], label=f"{name}: of it, {work}")
    ax.set_xticks(range(max(len(r) for r in per_turn.values())))
    ax.set_xlabel("turn of the agent's task")
    ax.set_ylabel("ms")
    runs = len(next(iter(per_turn.values()))[0].get("ttft_ms_runs", [0]))
    thickest = max(r["bookkeeping_ms"] for rows in per_turn.values() for r in rows)
    thin = thickest < 0.02 * ax.get_ylim()[1]
    ax.set_title(f"{title}\n(bars: median of {runs} runs; whiskers: the fastest and the slowest"
                 + ("; the bookkeeping is too thin to see here, the sentence below gives it" if thin else "") + ")",
                 fontsize=10)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return ax


def turn_words(per_turn: Mapping[str, Sequence[dict]], where: str) -> str:
    """How prefix caching moved the time to first token and the bookkeeping, turn by turn, each
    judged against two standard errors over the turns (the first turn, which computes its whole
    prompt either way, included)."""
    a, b = per_turn["with prefix caching"], per_turn["without"]
    diffs = [x["ttft_ms"] - y["ttft_ms"] for x, y in zip(a, b)]
    mean, two_se = noise.mean_diff(diffs)
    verdict = ("shortens" if mean < -two_se else "lengthens" if mean > two_se else "does not measurably change")
    book = [x["bookkeeping_ms"] - y["bookkeeping_ms"] for x, y in zip(a, b)]
    bmean, btwo = noise.mean_diff(book)
    bverdict = ("adds" if bmean > btwo else "saves" if bmean < -btwo else "does not measurably change")
    runs = len(a[0].get("ttft_ms_runs", [0]))
    return (f"Measured {where}: prefix caching {verdict} the time to first token ({mean:+.2f} ms ± {two_se:.2f} per "
            f"turn, with the cache minus without), and naming and looking up the pages {bverdict} the host work "
            f"inside it ({bmean:+.3f} ms ± {btwo:.3f} per turn); two standard errors over {len(diffs)} turns, "
            f"each turn's time the median of {runs} runs, its bookkeeping the fastest.")
