"""Pictures, small tables and computed sentences for chapter 06 (a paged KV cache for agents).

* ``simulate_fragmentation`` + ``plot_fragmentation`` -- the same stream of requests served by a
  contiguous allocator (each request reserves ``max_len`` slots up front, as pre-vLLM servers did)
  and by pages of ``page_size``: memory that holds tokens vs reserved-but-empty memory.
* ``plot_page_map`` -- one square per page of a ``BlockManager``, coloured by state.
* ``plot_workloads`` -- per request of a workload, input tokens and tokens an unbounded cache serves.
* ``hit_curves`` + ``plot_hit_curves`` -- hit ratio against capacity, one line per eviction policy;
  ``compare_policies`` says in words where each of two policies wins, from the same curves.
* ``fetch_or_recompute`` -- per model, fetching a token's KV over the host link against recomputing
  it, at chosen contexts and where the two break even, from the H200's recorded link and matmul rate.
* ``plot_engine_tokens`` -- per turn of an agent's task, prompt tokens computed vs reused.
* ``decode_table`` / ``plot_decode_records`` -- the recorded paged-decode results, one row per case.
* ``on_a_gpu`` / ``on_a_gpu_words`` -- the chapter's figure from the H200 records (paged decode
  against its peers; the engine's time to first token with and without prefix caching) and the
  sentences that compare them, every comparison word computed (:mod:`minimax_lab.notebook.words`).
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

from minimax_lab import runtime
from minimax_lab.kvcache import replay_trace
from minimax_lab.kvcache.cost import LayerShape, break_even
from minimax_lab.notebook import recorded, words
from minimax_lab.viz import noise, paged_steps, prefix_cost

STATE_COLOURS = {"free": "#eeeeee", "used": "#4c78a8", "shared": "#f58518", "cached": "#54a24b", "pinned": "#b279a2"}
POLICY_STYLE = {"lru": ("#4c78a8", "o-"), "agent": ("#f58518", "o-"), "belady": ("#54a24b", "s--")}
ENGINE_CASES = {"engine_ttft_cached": "with prefix caching", "engine_ttft_nocache": "without"}


def tokens_label(n: float) -> str:
    """A token count in short form: 950, 46k, 1.5M, 10M."""
    n = float(n)
    if n >= 1e6:
        return f"{n / 1e6:.3g}M"
    if n >= 1e3:
        return f"{n / 1e3:.3g}k"
    return f"{n:.0f}"


def simulate_fragmentation(n_requests: int = 24, *, max_len: int = 2048, page_size: int = 16, seed: int = 0) -> dict:
    """Token lengths drawn like chat traffic (mostly short, a long tail); returns the slots each
    allocator reserves and how many of them hold tokens."""
    rng = random.Random(seed)
    lens = [min(max_len, int(rng.lognormvariate(5.5, 0.9)) + 1) for _ in range(n_requests)]
    contiguous = n_requests * max_len
    paged = sum(-(-n // page_size) * page_size for n in lens)
    return dict(lengths=lens, used=sum(lens), contiguous_reserved=contiguous, paged_reserved=paged,
                max_len=max_len, page_size=page_size)


def plot_fragmentation(sim: Mapping, ax=None):
    """Stacked bars: tokens held vs slots wasted, contiguous vs paged."""
    ax = ax or plt.subplots(figsize=(7, 2.6))[1]
    used = sim["used"]
    names = [f"contiguous\n(reserve {sim['max_len']})", f"paged\n(page {sim['page_size']})"]
    reserved = [sim["contiguous_reserved"], sim["paged_reserved"]]
    ax.barh(names, [used, used], color="#4c78a8", label="holds a token")
    ax.barh(names, [r - used for r in reserved], left=[used, used], color="#e45756", alpha=0.6,
            label="reserved, empty")
    for i, r in enumerate(reserved):
        ax.annotate(f"{100 * (r - used) / r:.0f}% wasted", (r, i), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.set_xlabel("KV slots reserved (tokens)")
    ax.set_title(f"{len(sim['lengths'])} requests, {used} tokens")
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    ax.set_xlim(0, max(reserved) * 1.25)
    return ax


def plot_page_map(states: Sequence[str], *, cols: int = 32, ax=None, title: str = "page pool"):
    """A grid of the pool's pages coloured by state (``BlockManager.page_states()``)."""
    names = list(STATE_COLOURS)
    idx = np.array([names.index(s) for s in states])
    rows = -(-len(idx) // cols)
    grid = np.full(rows * cols, -1)
    grid[:len(idx)] = idx
    cmap = ListedColormap(["white"] + [STATE_COLOURS[n] for n in names])
    ax = ax or plt.subplots(figsize=(min(10, cols / 3), max(1.2, rows / 3)))[1]
    ax.imshow(grid.reshape(rows, cols) + 1, cmap=cmap, vmin=0, vmax=len(names), aspect="equal")
    ax.set_xticks([]), ax.set_yticks([])
    counts = {n: int((idx == i).sum()) for i, n in enumerate(names)}
    handles = [plt.Rectangle((0, 0), 1, 1, color=STATE_COLOURS[n]) for n in names]
    ax.legend(handles, [f"{n} {counts[n]}" for n in names], fontsize=9, loc="upper left", bbox_to_anchor=(1, 1))
    ax.set_title(title, fontsize=9)
    return ax


def plot_workloads(workloads: Sequence, *, axes=None):
    """One panel per workload (``workloads.chat_workload`` / ``agent_workload`` results): each
    request's input tokens and the tokens an unbounded prefix cache serves it, in arrival order."""
    if axes is None:
        _, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 3.2), squeeze=False)
        axes = axes[0]
    for ax, wl in zip(axes, workloads):
        r = replay_trace(wl.requests, capacity_tokens=None)
        ax.plot([q.input_length / 1e3 for q in wl.requests], lw=0.8, label="input tokens")
        ax.plot([h / 1e3 for h in r.per_request_hits], lw=0.8, label="served from cache")
        ax.set(title=f"{wl.name}: hit ratio {r.hit_ratio:.2f} (unbounded cache)", xlabel="request (arrival order)",
               ylabel="thousands of tokens")
    axes[-1].legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    axes[0].figure.tight_layout()
    return axes[0].figure


def hit_curves(requests, capacities: Sequence[int], policies: Sequence[str] = ("lru", "agent")) -> dict:
    """Replay ``requests`` at each capacity (tokens) under each policy: policy -> [(capacity, hit
    ratio), ...], the input :func:`plot_hit_curves` and :func:`compare_policies` take."""
    return {p: [(cap, replay_trace(requests, capacity_tokens=cap, policy=p).hit_ratio) for cap in capacities]
            for p in policies}


def plot_hit_curves(curves: Mapping[str, Sequence[tuple[float, float]]], *, ax=None, title: str = "",
                    xlabel: str = "cache capacity (tokens, log scale)", unbounded: float | None = None,
                    logx: bool = True, legend: bool = True):
    """``curves``: policy -> [(capacity, hit ratio), ...]. Optional dotted line at the unbounded ratio.

    The x ticks sit at the measured capacities (labelled 46k, 1M, ...), no others, so labels never
    collide; the legend goes below the axes, where it hides no data."""
    ax = ax or plt.subplots(figsize=(6, 3.5))[1]
    caps = sorted({x for pts in curves.values() for x, _ in pts})
    for name, pts in curves.items():
        xs, ys = zip(*pts)
        colour, style = POLICY_STYLE.get(name, (None, "o-"))
        ax.plot(xs, ys, style, ms=4, color=colour, label=name)
    if unbounded is not None:
        ax.axhline(unbounded, color="grey", ls=":", lw=1, label=f"unbounded cache {unbounded:.3f}")
    if logx:
        ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(caps))
    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda x, _: tokens_label(x)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("hit ratio (share of input tokens)")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if legend:
        ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=4, frameon=False)
    return ax


def compare_policies(curves: Mapping[str, Sequence[tuple[float, float]]], a: str = "agent", b: str = "lru", *,
                     tie: float = 0.0005) -> str:
    """Where ``a`` beats ``b``, where ``b`` beats ``a`` and where they tie (within ``tie``), in words,
    from the curves themselves (so the sentence never disagrees with the plot)."""
    hb = dict(curves[b])
    groups: dict[str, list[str]] = {f"{a} ahead": [], f"{b} ahead": [], "tied": []}
    for cap, ya in curves[a]:
        yb = hb[cap]
        key = "tied" if abs(ya - yb) <= tie else (f"{a} ahead" if ya > yb else f"{b} ahead")
        groups[key].append(f"{tokens_label(cap)} ({a} {ya:.3f}, {b} {yb:.3f})")
    parts = [f"{k} at {', '.join(v)}" for k, v in groups.items() if v]
    return "; ".join(parts)


def plot_engine_tokens(per_turn: Mapping[str, Sequence[Mapping]], *, ax=None, title: str = ""):
    """Per turn: the prompt tokens computed (prefill) and reused from the cache, one bar per variant
    (left to right in ``per_turn``'s order, each variant its own hatch). ``per_turn``: variant ->
    [{"computed": int, "reused": int}, ...]."""
    ax = ax or plt.subplots(figsize=(7, 3))[1]
    names = list(per_turn)
    w = 0.8 / len(names)
    hatches = ["", "//", "..", "xx"]
    colours = {"computed": "#e45756", "reused": "#54a24b"}
    for j, name in enumerate(names):
        rows = per_turn[name]
        x = np.arange(len(rows)) + (j - (len(names) - 1) / 2) * w
        comp = [r["computed"] for r in rows]
        ax.bar(x, comp, w, color=colours["computed"], hatch=hatches[j % 4], edgecolor="white")
        ax.bar(x, [r["reused"] for r in rows], w, bottom=comp, color=colours["reused"], hatch=hatches[j % 4],
               edgecolor="white")
    n = max(len(r) for r in per_turn.values())
    ax.set_xticks(range(n), [str(i) for i in range(n)])
    ax.set_xlabel("turn of the agent's task")
    ax.set_ylabel("prompt tokens")
    ax.set_title(title)
    ax.set_ylim(0, 1.08 * max(r["computed"] + r["reused"] for rows in per_turn.values() for r in rows))
    handles = [Patch(color=colours["computed"], label="computed"), Patch(color=colours["reused"], label="reused from the cache")]
    handles += [Patch(facecolor="white", edgecolor="grey", hatch=hatches[j % 4], label=f"bar {j + 1}: {name}")
                for j, name in enumerate(names)]
    ax.legend(handles=handles, fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return ax


DECODE_IMPLS = {"triton": "ours (Triton)", "gather_sdpa": "gather + SDPA", "sdpa_contiguous": "SDPA, contiguous cache"}


def _decode_case_label(case: str) -> str:
    """'decode_B64_L8192_Hq32_Hkv8_D128_p16' -> 'B=64 L=8k page 16'."""
    parts = dict((p[0], p[1:]) for p in case.split("_")[1:] if p[:1] in "BLp" and p[1:].isdigit())
    L = int(parts.get("L", 0))
    return f"B={parts.get('B')} L={L // 1024}k page {parts.get('p')}"


def decode_ceiling_gbps(records: Sequence[dict]) -> float | None:
    """The copy ceiling the records were scored against: gbps / pct_of_ceiling, their median."""
    vals = sorted(r["gbps"] * 100 / r["pct_of_ceiling"] for r in records
                  if r.get("gbps") and r.get("pct_of_ceiling"))
    return vals[len(vals) // 2] if vals else None


def decode_table(records: Sequence[dict]) -> str:
    """One row per case: our kernel's time, GB/s and % of the copy ceiling, and the two peers' times."""
    cases = sorted({r["case"] for r in records}, key=lambda c: (_decode_case_label(c).split()[0], c))
    get = lambda c, i: next((r for r in records if r["case"] == c and r["impl"] == i), None)  # noqa: E731
    head = f"{'case':22s} {'ours ms':>8s} {'GB/s':>6s} {'% copy':>7s} {'gather+SDPA ms':>15s} {'SDPA contiguous ms':>19s}"
    lines = [head, "-" * len(head)]
    for c in cases:
        ours, g, s = get(c, "triton"), get(c, "gather_sdpa"), get(c, "sdpa_contiguous")
        cell = lambda r, k, f: format(r[k], f) if r and r.get(k) is not None else "-"  # noqa: E731
        lines.append(f"{_decode_case_label(c):22s} {cell(ours, 'ms', '8.3f')} {cell(ours, 'gbps', '6.0f')} "
                     f"{cell(ours, 'pct_of_ceiling', '7.1f')} {cell(g, 'ms', '15.3f')} {cell(s, 'ms', '19.3f')}")
    return "\n".join(lines)


def _gbps_spread(r: Mapping) -> tuple[float, float]:
    """How far below and above a record's GB/s its p20-p80 timings reach (0, 0 without a spread)."""
    if not r.get("gbps") or not r.get("p20_ms") or not r.get("p80_ms"):
        return (0.0, 0.0)
    return (r["gbps"] - r["gbps"] * r["ms"] / r["p80_ms"], r["gbps"] * r["ms"] / r["p20_ms"] - r["gbps"])


def plot_decode_records(records: Sequence[dict], *, ax=None, title: str = ""):
    """Bars of K/V GB/s per case and impl with their p20-p80 spread as whiskers, the copy ceiling as
    a line; legend outside the axes."""
    ax = ax or plt.subplots(figsize=(9, 3.5))[1]
    cases = sorted({r["case"] for r in records}, key=lambda c: (_decode_case_label(c).split()[0], c))
    impls = [i for i in DECODE_IMPLS if any(r["impl"] == i for r in records)]
    w = 0.8 / max(1, len(impls))
    for j, impl in enumerate(impls):
        recs = [next((r for r in records if r["case"] == c and r["impl"] == impl), {}) for c in cases]
        ys = [r.get("gbps", 0) for r in recs]
        err = np.array([_gbps_spread(r) for r in recs]).T
        ax.bar([i + (j - (len(impls) - 1) / 2) * w for i in range(len(cases))], ys, w, yerr=err, capsize=2,
               label=DECODE_IMPLS[impl])
    ceiling = decode_ceiling_gbps(records)
    if ceiling:
        ax.axhline(ceiling, color="black", ls="--", lw=1, label=f"copy ceiling of the same run, {ceiling:,.0f} GB/s")
    ax.set_xticks(range(len(cases)), [_decode_case_label(c) for c in cases], fontsize=8)
    ax.set_xlabel("case (B sequences, L tokens of context each, page size in tokens)")
    ax.set_ylabel("K/V read (GB/s)")
    ax.set_title(title)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return ax


def break_even_context(shape: LayerShape, *, link_gbps: float, gpu_tflops: float, mfu: float = 0.5) -> float:
    """The context (tokens before a token) from which fetching the token's KV beats recomputing it:
    recomputing costs FLOPs linear in the context, fetching a fixed number of bytes. 0 where fetching
    wins at any context."""
    at = lambda c: break_even(shape, link_gbps=link_gbps, gpu_tflops=gpu_tflops, context=c, mfu=mfu)["ratio"]  # noqa: E731
    r0, slope = at(0), at(1024) - at(0)
    return 0.0 if r0 >= 1 else (1 - r0) * 1024 / slope


def fetch_or_recompute(models: Sequence[tuple[LayerShape, Sequence[int], int | None]], *, mfu: float = 0.5,
                       device: str = recorded.H200) -> str:
    """One line per model (``(shape, contexts, longest context it holds or None)``): at each context,
    how fetching a token's KV over the host link compares with recomputing it, and from which context
    on fetching wins; then where the two rates come from. The rates are ``device``'s records: its
    host-to-GPU copy and its bf16 matmul rate (recomputing at ``mfu`` of it); where one is missing
    the line says what stands in."""
    link_rec = recorded.one("kvcache", "h2d_pinned", "torch.copy_", device=device)
    gemm_rec = recorded.one("ceilings", "gemm_bfloat16", "torch.matmul", device=device)
    link = link_rec["gbps"] if link_rec else 55.0
    gemm = gemm_rec["tflops"] if gemm_rec else 700.0
    lines = []
    for shape, contexts, longest in models:
        rows = [break_even(shape, link_gbps=link, gpu_tflops=gemm, context=c, mfu=mfu) for c in contexts]
        parts = [f"at {r['context']:,} tokens of context fetching is "
                 f"{words.speed(r['t_fetch_s'] * 1e3, r['t_recompute_s'] * 1e3)} recomputing" for r in rows]
        even = break_even_context(shape, link_gbps=link, gpu_tflops=gemm, mfu=mfu)
        if even == 0:
            wins = "fetching wins at every context"
        else:
            wins = f"fetching wins from about {even:,.0f} tokens of context on"
            if longest is not None:
                wins += (f", beyond the {longest:,} tokens this model can hold: for it recomputing always wins"
                         if even > longest else f", within the {longest:,} tokens this model can hold")
        lines.append(f"{shape.name}: a token's KV is {rows[0]['kv_bytes_per_token']:,.0f} bytes; " + "; ".join(parts)
                     + f"; {wins}")
    src = (f"the host-to-GPU copy recorded on the {device}, {link:.1f} GB/s" if link_rec else
           f"an assumed {link:.0f} GB/s host link (no {device} record)")
    src2 = (f"{mfu:.0%} of the bf16 matmul rate recorded on the {device}, {gemm:,.0f} TFLOP/s" if gemm_rec else
            f"{mfu:.0%} of an assumed {gemm:,.0f} TFLOP/s (no {device} record)")
    return "\n".join(lines) + f"\n(link: {src}; recompute at {src2}; nothing here is measured on this machine)"


def _speed_range(pairs: Sequence[tuple[float, float]]) -> str:
    """``(ms, other_ms)`` pairs in words: '3.25-3.36x faster than', '1.01-1.03x slower than',
    'about as fast as', or a mixed range; every word computed from the ratios."""
    ratios = sorted(other / ms for ms, other in pairs)
    if all(abs(r - 1) <= 0.03 for r in ratios):
        return "about as fast as"
    lo, hi = ratios[0], ratios[-1]
    if lo > 1:
        return f"{lo:.2f}x faster than" if hi - lo < 0.005 else f"{lo:.2f}-{hi:.2f}x faster than"
    if hi < 1:
        return f"{1 / hi:.2f}x slower than" if hi - lo < 0.005 else f"{1 / hi:.2f}-{1 / lo:.2f}x slower than"
    return f"between {1 / lo:.2f}x slower and {hi:.2f}x faster than"


def _versus_cases(ours: Mapping[str, dict], peer: Mapping[str, dict]) -> str:
    """Ours against a peer over the cases both recorded: the range of ratios (:func:`_speed_range`)
    over the cases where the two timings' p20-p80 spreads are apart, and how many are level."""
    cases = [c for c in ours if c in peer]
    level = [c for c in cases if noise.has_spread(ours[c], peer[c]) and noise.spreads_overlap(ours[c], peer[c])]
    apart = [(ours[c]["ms"], peer[c]["ms"]) for c in cases if c not in level]
    if not apart:
        return "level with"
    text = _speed_range(apart)
    if level:
        text += f" (level in {len(level)} of the {len(cases)} cases, where the timings' p20-p80 spreads overlap)"
    return text


def versions(records: Sequence[dict]) -> str:
    """The devices and versions ``records`` were taken with: 'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0'
    (several joined by ' and ' where they differ)."""
    seen = []
    for r in records:
        v = f"{r.get('device', '?')}, torch {r.get('torch', '?')}, Triton {r.get('triton', '?')}"
        if v not in seen:
            seen.append(v)
    return " and ".join(seen) or "no records"


def on_a_gpu(decode_records: Sequence[dict], engine_records: Sequence[dict], *, measured_decode: Sequence[dict] = (),
             measured_turns: Mapping[str, Sequence[float]] | None = None, device_now: str | None = None,
             steps: Sequence[dict] = ()):
    """The chapter's figure from the H200 records: paged decode's K/V bandwidth per case, ours
    against gathering the pages for SDPA and SDPA on a contiguous cache (p20-p80 whiskers), and the
    engine's time to first token per turn with and without prefix caching. ``steps`` (the kernels
    the chapter grows, :mod:`minimax_lab.viz.paged_steps`) add a first panel, labelled with their
    own device and versions. ``measured_decode`` (records of the same cases on this machine) are
    drawn as stars, ``measured_turns`` (variant -> ms per turn) as solid lines, both labelled with
    ``device_now``."""
    from minimax_lab.viz import paged_steps   # deferred: it loads the bench suite

    n = 3 if steps else 2
    fig, axes = plt.subplots(1, n, figsize=(7 * n, 4.2), gridspec_kw=dict(width_ratios=(1.2, 1.5, 1)[3 - n:]))
    if steps:
        paged_steps.plot_steps(steps, ax=axes[0], title="the kernels of section 3\n" + paged_steps.label(steps))
    ax_dec, ax_eng = axes[-2], axes[-1]
    decode = [r for r in decode_records if r["impl"] in DECODE_IMPLS]
    if decode:
        plot_decode_records(decode, ax=ax_dec, title="paged decode, bf16, GQA 32/8, D=128")
        cases = sorted({r["case"] for r in decode}, key=lambda c: (_decode_case_label(c).split()[0], c))
        for r in measured_decode:
            if r["impl"] == "triton" and r["case"] in cases:
                ax_dec.plot(cases.index(r["case"]), r["gbps"], "*", color="k", ms=12,
                            label=f"ours on {device_now or 'this GPU'}, now")
        ax_dec.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    else:
        ax_dec.text(0.5, 0.5, "no paged-decode records", ha="center", transform=ax_dec.transAxes)
    by_case = {r["case"]: r for r in engine_records}
    for case, label in ENGINE_CASES.items():
        if case in by_case:
            ax_eng.plot(by_case[case]["ttft_ms_per_turn"], "s:", label=f"{label}, recorded")
    for name, ms in (measured_turns or {}).items():
        ax_eng.plot(ms, "o-", label=f"{name}, {device_now or 'this GPU'} now")
    shape = next((r["shape"] for r in engine_records), {})
    top = max((max(line.get_ydata()) for line in ax_eng.lines), default=1.0)
    ax_eng.set(xlabel="turn of the agent's task", ylabel="time to first token (ms)", ylim=(0, 1.15 * top),
               title=f"the engine, {shape.get('n_layers', '?')} layers, d={shape.get('d_model', '?')}")
    if ax_eng.lines:
        ax_eng.legend(fontsize=9, loc="lower right")
    fig.suptitle("recorded on " + versions(list(decode_records) + list(engine_records))
                 + (f" (stars and solid lines: {device_now}, now)" if measured_decode or measured_turns else ""),
                 fontsize=11)
    fig.tight_layout()
    return fig


def _engine_sentence(cached: Mapping, plain: Mapping, bookkeeping: Mapping[str, Sequence[float]] | None) -> str:
    """The engine records in one sentence: tokens computed, the TTFT gap turn by turn, and, given
    :func:`minimax_lab.viz.prefix_cost.bookkeeping_ms` of the recorded session, where the gap comes from."""
    diffs = [c - p for c, p in zip(cached["ttft_ms_per_turn"], plain["ttft_ms_per_turn"])]
    mean, two_se = noise.mean_diff(diffs) if len(diffs) > 1 else (cached["ms"] - plain["ms"], float("inf"))
    faster, slower = mean < -two_se, mean > two_se
    moved = (words.change(plain["ms"], cached["ms"], unit="ms", same_within=0.0) if faster or slower
             else f"did not measurably move ({plain['ms']:.3g} ms -> {cached['ms']:.3g} ms)")
    text = (f"In the engine over {cached['shape']['turns']} turns, prefix caching computes "
            f"{cached['prefill_tokens']:,} prompt tokens instead of {plain['prefill_tokens']:,} "
            f"({words.more_or_less(cached['prefill_tokens'], plain['prefill_tokens'], smaller='fewer')} "
            f"without), {'and' if faster else 'yet'} the mean time to first token {moved}"
            + (f", by {mean:+.2f} ms ± {two_se:.2f} turn by turn (two standard errors over {len(diffs)} turns)"
               if len(diffs) > 1 else ""))
    if faster:
        return text + "."
    shape = cached["shape"]
    try:
        slope, slope_2se = prefix_cost.ttft_slope(plain["ttft_ms_per_turn"], prefix_cost.prompt_lengths(shape))
    except (KeyError, ValueError):
        return text + ": in a model this small a turn's time is not spent on its prompt's tokens."
    flat = abs(slope) <= slope_2se
    text += (f": without the cache a turn's time changes by {slope:+.2f} ms ± {slope_2se:.2f} per 1,000 more prompt "
             f"tokens ({'not measurably: the tokens caching skips buy no measurable time there' if flat else 'measurably'})")
    if bookkeeping:
        book = [c - p for c, p in zip(bookkeeping["with prefix caching"], bookkeeping["without"])]
        bmean, b2se = noise.mean_diff(book)
        text += (f", while naming and looking up the prompt's pages, host work the uncached engine never does, "
                 f"costs {bmean:+.2f} ms ± {b2se:.2f} per turn at the same sizes on this machine's CPU"
                 + (f" ({bmean / mean:.0%} of the recorded gap; " if slower else " (")
                 + "the recording's host was not timed)")
    return text + "."


def on_a_gpu_words(decode_records: Sequence[dict], engine_records: Sequence[dict], *,
                   bookkeeping: Mapping[str, Sequence[float]] | None = None, steps: Sequence[dict] | None = None) -> str:
    """At most three sentences on the records, every comparison computed: the kernels the chapter
    grows (``steps``, when given: :func:`minimax_lab.viz.paged_steps.steps_words`), paged decode
    against its two peers over the recorded cases, and the engine's mean time to first token with
    and without prefix caching beside the prompt tokens each computes -- where caching is not
    faster, why, from the no-cache TTFT's growth with the prompt and, given ``bookkeeping``
    (:func:`minimax_lab.viz.prefix_cost.bookkeeping_ms`), the host time its page names cost. Says
    so when nothing was recorded."""
    ours = {r["case"]: r for r in decode_records if r["impl"] == "triton"}
    peer = lambda impl: {r["case"]: r for r in decode_records if r["impl"] == impl}  # noqa: E731
    out = []
    if steps is not None:
        out.append(paged_steps.steps_words(steps))
    gather, contiguous = peer("gather_sdpa"), peer("sdpa_contiguous")
    if ours and gather and contiguous:
        pct = sorted(r["pct_of_ceiling"] for r in ours.values() if r.get("pct_of_ceiling"))

        ceiling, other = decode_ceiling_gbps(list(ours.values())), recorded.one("ceilings", "copy", "torch.copy_")
        where = ""
        if ceiling:
            where = f" measured in the same run ({ceiling:,.0f} GB/s"
            where += (f"; the separate ceilings run the other chapters use measured {other['gbps']:,.0f} GB/s)"
                      if other else ")")
        out.append(f"Over the {len(ours)} recorded decode cases, ours is {_versus_cases(ours, gather)} gathering the "
                   f"pages for SDPA and {_versus_cases(ours, contiguous)} SDPA on a cache that was never paged"
                   + (f", at {pct[0]:.0f}-{pct[-1]:.0f}% of the copy bandwidth{where}." if pct else "."))
    eng = {r["case"]: r for r in engine_records}
    cached, plain = eng.get("engine_ttft_cached"), eng.get("engine_ttft_nocache")
    if cached and plain:
        out.append(_engine_sentence(cached, plain, bookkeeping))
    if not out or (steps is not None and len(out) == 1):
        out.append("No H200 records of the `kvcache` suite: `python -m minimax_lab.bench kvcache` on a GPU writes them.")
    return " ".join(out)


def on_a_gpu_section(preset: str, *, steps: Mapping, turns_now: Mapping[str, Sequence[float]] | None = None,
                     record_steps: bool = False):
    """Section 8 of chapter 06 in one call: the figure and the sentences. On a GPU (``preset ==
    "gpu"``) the kernels the chapter grew (``steps``: name -> function) are checked and timed here
    with the package's kernel and the peers (:func:`minimax_lab.viz.paged_steps.time_steps`; kept
    as records with ``record_steps``), and ``turns_now`` (the engine's TTFT per turn measured in the
    chapter) is drawn beside the records; on a CPU the steps' newest records are drawn, if any. The
    host time of the recorded engine session's page bookkeeping is measured here either way.
    Returns ``(figure, markdown text)``."""
    kv_recs = recorded.all_of("kvcache")
    decode_recs = [r for r in kv_recs if r["case"].startswith("decode")]
    engine_recs = [r for r in kv_recs if r["case"].startswith("engine_ttft")]
    gpu = preset == "gpu"
    step_recs = paged_steps.time_steps(steps, record=record_steps) if gpu else paged_steps.recorded_steps()
    measured = [{**r, "impl": "triton"} for r in step_recs if gpu and r["impl"] == "package"]
    plain = next((r for r in engine_recs if r["case"] == "engine_ttft_nocache"), None)
    book = prefix_cost.bookkeeping_ms(plain["shape"]) if plain and "final_length" in plain["shape"] else None
    fig = on_a_gpu(decode_recs, engine_recs, measured_decode=measured, measured_turns=turns_now if gpu else None,
                   device_now=runtime.device_name(), steps=step_recs)
    return fig, on_a_gpu_words(decode_recs, engine_recs, bookkeeping=book, steps=step_recs)


def _record_line(name: str, recs: Sequence[dict]) -> str:
    if not recs:
        return f"* {name}: no records."
    when = sorted(r.get("when", "?")[:10] for r in recs)
    methods = sorted({r.get("timing_method") or r.get("timing") or "wall clock per turn" for r in recs})
    reps = sorted({r["reps"] for r in recs if r.get("reps")})
    return (f"* {name}: {len(recs)} records, {versions(recs)}, taken {when[0]}"
            + (f" to {when[-1]}" if when[-1] != when[0] else "") + f"; timed by {', '.join(methods)}"
            + (f", {'/'.join(map(str, reps))} repeats each (p20 and p80 kept)" if reps else "") + ".")


def provenance(*, preset: str, seconds: float, trace_path=None) -> str:
    """Where chapter 06's numbers come from, as a collapsed markdown block: what this run measured
    and how, which records the figures draw (device, versions, dates, timing method) and the
    commands that take them again."""
    info = runtime.describe()
    kv = recorded.all_of("kvcache")
    rows = [
        f"* This run: preset `{preset}` on {info['device']}, torch {info['torch']}, Triton {info['triton']}"
        + (" (its interpreter: kernels checked, never timed)" if info["interpreter"] else "")
        + f", {seconds:.0f} s. Every input is drawn from a fixed seed.",
        "* Section 2: our block manager and `BlockManager` run the same operations; `same_books` compares "
        "their sequences, block tables, reference counts, page states and copies on write after each.",
        "* Section 3: each kernel against `paged_decode(impl=\"reference\")` (fp32) on fresh ragged inputs with "
        "shuffled block tables: `1e-5` in the interpreter, `2e-2` on a GPU (tf32 dots).",
        "* Sections 4-5: generated chat and agent workloads (seed 0) and Mooncake's FAST'25 synthetic trace"
        + (f" (`{Path(trace_path).name}`)" if trace_path else " (not found on this machine)")
        + ", replayed block by block (512-token blocks named by chained hashes).",
        "* Section 6: the fetch-or-recompute rates are the H200's recorded host-to-GPU copy and bf16 matmul.",
        "* Section 7: the engine, measured here: each variant run twice, alternating which goes first; per turn "
        "the median of the runs, whiskers the fastest and slowest; the bookkeeping is the time spent inside "
        "`BlockManager.allocate`, the fastest of the runs.",
        "* Section 8, the host bookkeeping of the recorded engine session: `BlockManager.allocate` on prompts "
        "of the recorded session's lengths (rebuilt from its turns and base length), fastest of 9 alternating "
        "runs per turn, measured on this machine's CPU.",
        _record_line("Section 8, paged decode against its peers (`kvcache` suite)",
                     [r for r in kv if r["case"].startswith("decode") and r["impl"] in DECODE_IMPLS]),
        _record_line("Section 8, the engine (`kvcache` suite, `engine` cases: after one warm-up, the cached "
                     "variant ran first, then the uncached one)", [r for r in kv if r["case"] in ENGINE_CASES]),
        _record_line("Section 8, the kernels of section 3 (`kvcache_steps`)", paged_steps.recorded_steps()),
        "* To take them again on a GPU: `python -m minimax_lab.bench kvcache --cases decode engine`; for the "
        "kernels of section 3, run this notebook at preset `gpu` with `record_steps=True` "
        "(`python -m minimax_lab.notebook.runner notebooks/06_paged_kv_cache_for_agents.ipynb -p preset gpu "
        "-p record_steps True`), which appends them to `$MINIMAX_LAB_RESULTS` (default `./results`).",
    ]
    return ("<details><summary><b>Where these numbers come from</b> (click to open)</summary>\n\n"
            + "\n".join(rows) + "\n\n</details>")
