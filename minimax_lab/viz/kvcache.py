"""Pictures and small tables for the KV-cache chapter (notebook 05).

* ``simulate_fragmentation`` + ``plot_fragmentation`` -- the same stream of requests served by a
  contiguous allocator (each request reserves ``max_len`` slots up front, as pre-vLLM servers did)
  and by pages of ``page_size``: memory that holds tokens vs reserved-but-empty memory.
* ``plot_page_map`` -- one square per page of a ``BlockManager``, coloured by state.
* ``plot_hit_curves`` -- hit ratio against capacity, one line per eviction policy;
  ``compare_policies`` says in words where each of two policies wins, from the same curves.
* ``plot_engine_tokens`` -- per turn of an agent session, prompt tokens computed vs reused.
* ``decode_table`` / ``plot_decode_records`` -- the recorded paged-decode results, one row per case.
"""
from __future__ import annotations

import random
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

STATE_COLOURS = {"free": "#eeeeee", "used": "#4c78a8", "shared": "#f58518", "cached": "#54a24b", "pinned": "#b279a2"}
POLICY_STYLE = {"lru": ("#4c78a8", "o-"), "agent": ("#f58518", "o-"), "belady": ("#54a24b", "s--")}


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
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
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
    ax.legend(handles, [f"{n} {counts[n]}" for n in names], fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    ax.set_title(title, fontsize=9)
    return ax


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
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=4, frameon=False)
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
    from matplotlib.patches import Patch
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
    ax.set_xlabel("turn of the agent session")
    ax.set_ylabel("prompt tokens")
    ax.set_title(title)
    ax.set_ylim(0, 1.08 * max(r["computed"] + r["reused"] for rows in per_turn.values() for r in rows))
    handles = [Patch(color=colours["computed"], label="computed"), Patch(color=colours["reused"], label="reused from the cache")]
    handles += [Patch(facecolor="white", edgecolor="grey", hatch=hatches[j % 4], label=f"bar {j + 1}: {name}")
                for j, name in enumerate(names)]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
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


def plot_decode_records(records: Sequence[dict], *, ax=None, title: str = ""):
    """Bars of K/V GB/s per case and impl, the copy ceiling as a line; legend outside the axes."""
    ax = ax or plt.subplots(figsize=(9, 3.5))[1]
    cases = sorted({r["case"] for r in records}, key=lambda c: (_decode_case_label(c).split()[0], c))
    impls = [i for i in DECODE_IMPLS if any(r["impl"] == i for r in records)]
    w = 0.8 / max(1, len(impls))
    for j, impl in enumerate(impls):
        ys = [next((r.get("gbps", 0) for r in records if r["case"] == c and r["impl"] == impl), 0) for c in cases]
        ax.bar([i + (j - (len(impls) - 1) / 2) * w for i in range(len(cases))], ys, w, label=DECODE_IMPLS[impl])
    ceiling = decode_ceiling_gbps(records)
    if ceiling:
        ax.axhline(ceiling, color="black", ls="--", lw=1, label=f"copy ceiling {ceiling:,.0f} GB/s")
    ax.set_xticks(range(len(cases)), [_decode_case_label(c) for c in cases], fontsize=8)
    ax.set_xlabel("case (B sequences, L tokens of context each, page size in tokens)")
    ax.set_ylabel("K/V read (GB/s)")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return ax
