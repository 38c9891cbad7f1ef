"""Pictures and tables of chapter 07 (the KV cache as a distributed store): the recorded loopback
bandwidth, the replay at 1-64 replicas, the fault table and the eviction-gap table."""
from __future__ import annotations

import json

import matplotlib.pyplot as plt

from minimax_lab import resources

MODE_LABELS = {"isolated_rr": "own caches, round-robin", "isolated_aware": "own caches, cache-aware",
               "pool_rr": "shared pool, round-robin", "pool_priced": "shared pool, priced routing"}


def recorded(name: str) -> dict | None:
    """A recorded results file (``kvstore_bandwidth``, ``kvstore_replay``, ``kvstore_policy_gap``) or None."""
    for d in reversed(resources.results_dirs()):
        p = d / f"{name}.json"
        if p.exists():
            return json.loads(p.read_text())
    return None


def plot_bandwidth(doc: dict, title: str = "Mooncake Store over TCP loopback (CPU machine)"):
    rows = doc["rows"]
    kib = [r["block_bytes"] / 1024 for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.4))
    for op in ("put", "get"):
        a.plot(kib, [r[f"{op}_gbps"] for r in rows], "o-", label=f"batched {op}")
        b.plot(kib, [r[f"{op}_ms"] for r in rows], "o-", label=f"one {op}")
    for ax, y in ((a, "GB/s"), (b, "latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("value size (KiB)")
        ax.set_ylabel(y)
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_replay(rows: list[dict], title: str):
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
    for mode, label in MODE_LABELS.items():
        rs = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["replicas"])
        if not rs:
            continue
        xs = [r["replicas"] for r in rs]
        a.plot(xs, [r["hit_ratio"] for r in rs], "o-", label=label)
        b.plot(xs, [r["ttft_mean_s"] for r in rs], "o-", label=label)
    a.set_ylabel("tokens not recomputed")
    b.set_ylabel("mean TTFT, model (s)")
    b.set_yscale("log")
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("replicas")
        ax.grid(alpha=0.3)
    a.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def fault_table(rows) -> str:
    """Markdown table of ``store_faults.FaultRow`` rows."""
    out = ["| fault | tried | equal to one process | wrong | crashed | tokens fetched | tokens recomputed |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        out.append(f"| {r.fault} | {r.trials} | {r.equal} | {r.wrong} | {r.crashed} | {r.fetched} | {r.recomputed} |")
    return "\n".join(out)


def gap_table(rows: list[dict], name: str) -> str:
    """Markdown table of ``policy_gap.gap_table`` rows: the share of the LRU->Belady gap each policy closes."""
    pols = list(rows[0]["gap_closed"])
    out = [f"| {name}: capacity (tokens) | " + " | ".join(pols) + " |", "| --- " * (len(pols) + 1) + "|"]
    for r in rows:
        cells = ["-" if v is None else f"{v:.0%}" for v in r["gap_closed"].values()]
        out.append(f"| {r['capacity_tokens']:,} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def between_words(value: float, low: float, high: float, what: str) -> str:
    """A sentence placing ``value`` against the range ``[low, high]`` (computed, not written)."""
    lo, hi = min(low, high), max(low, high)
    where = "lies between" if lo <= value <= hi else ("is below" if value < lo else "is above")
    return f"{what} {where} the two ratios ({lo:.2f}x and {hi:.2f}x)"


def gap_summary(rows: list[dict], label: str, online=("lfu", "s3fifo", "arc", "agent", "chain", "reuse", "adaptive")) -> str:
    """Per capacity, the online policy closing most of the gap, and whether it reaches half of it."""
    parts = []
    for r in rows:
        closed = {p: v for p, v in r["gap_closed"].items() if p in online and v is not None}
        if not closed:
            continue
        best = max(closed, key=closed.get)
        parts.append(f"{r['capacity_tokens']:,} tokens: {best} {closed[best]:.0%}"
                     f" ({'at least' if closed[best] >= 0.5 else 'short of'} half)")
    return f"{label}, best online policy per capacity -- " + "; ".join(parts)


def draw_pool(replicas: int = 3):
    """The picture of chapter 07: replicas with their own tiers above one shared pool (Mooncake
    Store: a master that knows where each block lives, memory lent by the machines)."""
    fig, ax = plt.subplots(figsize=(10, 4.2))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 5.2)
    ax.axis("off")
    w = 2.6
    for i in range(replicas):
        x = 0.4 + i * 3.2
        ax.add_patch(plt.Rectangle((x, 2.6), w, 2.3, fill=False, lw=1.5))
        ax.text(x + w / 2, 4.6, f"replica {'ABC'[i] if i < 3 else i}", ha="center", weight="bold")
        for j, (tier, color) in enumerate((("GPU pages", "#f6c"), ("host memory", "#fc6"), ("local disk", "#ccc"))):
            ax.add_patch(plt.Rectangle((x + 0.2, 3.9 - 0.45 * j), w - 0.4, 0.38, color=color, alpha=0.6))
            ax.text(x + w / 2, 4.09 - 0.45 * j, tier, ha="center", va="center", fontsize=9)
        label = ("put(name, block)", "get(name)", "is_exist(names)")[i % 3]
        ax.annotate("", xy=(x + w / 2, 1.55), xytext=(x + w / 2, 2.6),
                    arrowprops=dict(arrowstyle="<->" if i else "->", lw=1.4))
        ax.text(x + w / 2 + 0.1, 2.1, label, fontsize=9)
    ax.add_patch(plt.Rectangle((0.4, 0.3), 9.0, 1.25, color="#9cf", alpha=0.5))
    ax.text(4.9, 1.15, "shared pool: Mooncake Store", ha="center", weight="bold")
    ax.text(4.9, 0.62, "key = format + chained page name    value = header + payload + checksum",
            ha="center", fontsize=9)
    ax.set_title("A block computed anywhere is found everywhere by its name")
    fig.tight_layout()
    return fig
