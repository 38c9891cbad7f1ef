"""Chapter 07 at scale: the replay of Mooncake's synthetic trace over 1-64 replicas drawn, the
sentences it needs, the like-for-like comparison with Mooncake's published numbers, and the replay
at the rates recorded on the CPU machine. Every sentence that compares numbers is rendered from them."""
from __future__ import annotations

import matplotlib.pyplot as plt

from minimax_lab.notebook import words

MODE_LABELS = {"isolated_rr": "own caches, round-robin", "isolated_aware": "own caches, cache-aware",
               "pool_rr": "shared pool, round-robin", "pool_priced": "shared pool, priced routing"}
_MODE_STYLE = {"isolated_rr": dict(ls="-", marker="o", ms=6), "isolated_aware": dict(ls="--", marker="s", ms=6),
               "pool_rr": dict(ls="-", marker="D", ms=9, mfc="none", lw=2.5),
               "pool_priced": dict(ls=":", marker="^", ms=6, lw=1.8)}

#: a replica busy more than this share of the trace's time makes TTFT mostly queueing
BUSY = 0.9


def plot_replay(rows: list[dict], title: str, ceiling: float | None = None):
    """Hit ratio and mean TTFT (the model's) against the replica count, one line per mode; lines
    that coincide are drawn so that each stays visible (marker sizes and dash styles differ)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(11.5, 4.6))
    counts = sorted({r["replicas"] for r in rows})
    for mode, label in MODE_LABELS.items():
        rs = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["replicas"])
        if not rs:
            continue
        xs = [r["replicas"] for r in rs]
        a.plot(xs, [r["hit_ratio"] for r in rs], label=label, **_MODE_STYLE[mode])
        b.plot(xs, [r["ttft_mean_s"] for r in rs], label=label, **_MODE_STYLE[mode])
    if ceiling is not None:
        a.axhline(ceiling, color="gray", lw=1, ls="-.", label=f"ceiling: one unbounded cache ({ceiling:.1%})")
    over = [r["replicas"] for r in rows if r["mode"] == "isolated_aware" and r.get("load", 0) > BUSY]
    if over:
        b.axvspan(min(counts) * 0.9, max(over) * 1.1, color="#fdd", alpha=0.6, lw=0,
                  label=f"replicas busy over {BUSY:.0%} of the time: TTFT is queueing")
    a.set_ylabel("tokens not recomputed")
    a.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:.0%}"))
    b.set_ylabel("mean TTFT, modelled (s)")
    b.set_yscale("log")
    for ax in (a, b):
        ax.set_xscale("log")
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.minorticks_off()
        ax.set_xlabel("replicas (3M tokens of cache each, in every mode)")
        ax.grid(alpha=0.3)
    handles, labels = a.get_legend_handles_labels()
    extra = [(h, l) for h, l in zip(*b.get_legend_handles_labels()) if l not in labels]
    fig.legend(handles + [h for h, _ in extra], labels + [l for _, l in extra], loc="lower center", ncol=3,
               fontsize=9, frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    return fig


def replay_notes(rows: list[dict]) -> list[str]:
    """Sentences the replay's plot needs: the lines that lie on top of each other, and why TTFT is
    so high where the replicas cannot keep up."""
    notes = []
    by = {(r["mode"], r["replicas"]): r for r in rows}
    counts = sorted({r["replicas"] for r in rows})
    modes = [m for m in MODE_LABELS if any(r["mode"] == m for r in rows)]
    for i, m1 in enumerate(modes):
        for m2 in modes[i + 1:]:
            same = [n for n in counts if abs(by[(m1, n)]["hit_ratio"] - by[(m2, n)]["hit_ratio"]) < 0.005]
            if len(same) == len(counts):
                notes.append(f"'{MODE_LABELS[m1]}' and '{MODE_LABELS[m2]}' keep the same share of tokens "
                             "(within half a point) at every count: their hit-ratio lines lie on top of each other")
            elif len(same) > 1:
                notes.append(f"'{MODE_LABELS[m1]}' and '{MODE_LABELS[m2]}' keep the same share of tokens "
                             f"(within half a point) at {', '.join(map(str, same))} replicas")
    for n in counts:
        r = by.get(("isolated_aware", n))
        if r is None or r.get("load", 0) <= BUSY:
            continue
        who = "the one replica is" if n == 1 else f"each of {n} replicas is"
        if r["load"] > 1:
            how = f"asked for {r['load']:.1f} s of prefill per second of trace: its queue grows all along"
        else:
            how = f"busy {r['load']:.0%} of the time: bursts of requests queue up"
        prefill = r["compute_s_mean"] + r.get("fetch_s_mean", 0.0)
        notes.append(f"{who} {how}; with cache-aware routing the mean TTFT is {r['ttft_mean_s']:,.0f} s against "
                     f"{prefill:.2f} s of prefill: mostly waiting")
    return notes


def mooncake_words(c: dict) -> list[str]:
    """The like-for-like comparison of ``pool_sim.mooncake_comparison`` as sentences."""
    p = c["paper"]
    sim_ceiling_share = c["sim_pool_hit"] / c["sim_max_hit"]
    paper_ceiling_share = p["global_hit"] / p["max_hit"]
    return [
        f"simulated, {c['replicas']} replicas of {c['capacity_tokens'] / 1e6:.0f}M tokens: own caches with cache-aware "
        f"routing keep {c['sim_local_hit']:.1%}, the shared pool {c['sim_pool_hit']:.1%} ({c['sim_hit_gain']:.2f}x); "
        f"{1 - c['sim_recomputed_ratio']:.0%} fewer tokens recomputed, prefill compute time "
        f"{c['sim_prefill_time_ratio']:.2f}x",
        f"Mooncake, {p['replicas']} prefill nodes of {p['capacity_tokens'] / 1e6:.0f}M tokens (FAST'25 Fig. 10): "
        f"~{p['local_hit']:.0%} -> ~{p['global_hit']:.0%} ({p['hit_gain']:.2f}x), prefill GPU time "
        f"{p['prefill_time_ratio']:.2f}x ({1 - p['prefill_time_ratio']:.0%} less)",
        f"the cache-aware baseline here keeps {words.more_or_less(c['sim_local_hit'], p['local_hit'])} Mooncake's; "
        f"with the pool, both come near the trace's ceiling ({sim_ceiling_share:.0%} of "
        f"{c['sim_max_hit']:.1%} here, {paper_ceiling_share:.0%} of ~{p['max_hit']:.0%} there)",
        f"one cache of {c['capacity_tokens'] / 1e6:.0f}M tokens: {c['sim_one_cache_hit']:.1%} here, "
        f"{c['sim_one_cache_share_of_max']:.0%} of the ceiling; Mooncake's Fig. 9: {p['one_cache_share_of_max']:.0%} "
        f"of ~{p['max_hit']:.2f} = ~{p['one_cache_share_of_max'] * p['max_hit']:.0%}, "
        f"{words.more_or_less(p['one_cache_share_of_max'] * p['max_hit'], p['local_hit'])} its 10 cache-aware "
        f"local caches keep (~{p['local_hit']:.0%})",
    ]


def live_vs_recorded(live: list[dict], doc: dict) -> str:
    """Whether the rows simulated in this run (``simulate_pool(...).as_dict()``) recompute exactly
    the tokens the record says for the same replica count and mode."""
    rec = {(r["replicas"], r["mode"]): r for r in doc["rows"]}
    same = [r for r in live if rec.get((r["replicas"], r["mode"]), {}).get("recomputed_tokens") == r["recomputed_tokens"]]
    counts = sorted({r["replicas"] for r in live})
    where = f"{', '.join(map(str, counts))} replica{'s' if counts != [1] else ''}"
    if len(same) == len(live):
        return (f"{where}, simulated in this run: every mode recomputes exactly the tokens the record says "
                f"({len(same)} of {len(live)}); the figure draws the record's every count")
    differ = ", ".join(MODE_LABELS[r["mode"]] for r in live if r not in same)
    return f"{where}, simulated in this run: {differ} differ from the record: the figure may be stale"


def measured_replay_table(doc: dict) -> str:
    """Markdown of the replay at the rates measured on the CPU machine (``kvstore_replay``'s
    ``measured``): a row per replica count, a column per mode, each cell the share of tokens not
    recomputed, the share fetched from the pool and the mean TTFT (the model's)."""
    rows = doc["measured"]["rows"]
    modes = [m for m in MODE_LABELS if any(r["mode"] == m for r in rows)]
    by = {(r["replicas"], r["mode"]): r for r in rows}
    out = ["each cell: tokens kept / fetched from the pool / mean TTFT (modelled)", "",
           "| replicas | " + " | ".join(MODE_LABELS[m] for m in modes) + " |", "| --- " * (len(modes) + 1) + "|"]
    for n in sorted({r["replicas"] for r in rows}):
        cells = [f"{by[(n, m)]['hit_ratio']:.1%} / {by[(n, m)]['fetched_tokens'] / by[(n, m)]['input_tokens']:.1%} / "
                 f"{by[(n, m)]['ttft_mean_s']:,.1f} s" for m in modes]
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def measured_replay_words(doc: dict) -> list[str]:
    """The replay at measured rates in sentences: at the most replicas, priced routing against
    round-robin over the same pool (kept, fetched, TTFT), and where replicas cannot keep up."""
    m = doc["measured"]
    rows = m["rows"]
    n = max(r["replicas"] for r in rows)
    by = {r["mode"]: r for r in rows if r["replicas"] == n}
    rr, priced, aware = by["pool_rr"], by["pool_priced"], by["isolated_aware"]
    fetched = lambda r: r["fetched_tokens"] / r["input_tokens"]  # noqa: E731
    out = [f"{m['model']}: {m['kv_bytes_per_token'] / 1024:.1f} KiB of KV per token, recomputed at "
           f"{m['tflops'] * 1e3:.1f} GFLOP/s, fetched at {m['link_gbps']:.2f} GB/s; the trace's arrival times "
           f"stretched {m['time_stretch']:.0f}x so that {n} replicas without a cache would be busy half of the time",
           f"at {n} replicas, the same pool: round-robin keeps {rr['hit_ratio']:.1%} of tokens and fetches "
           f"{fetched(rr):.1%}; priced routing keeps {priced['hit_ratio']:.1%} and fetches only {fetched(priced):.1%}: it "
           f"mostly goes where the prefix is, and its mean TTFT is "
           f"{words.more_or_less(priced['ttft_mean_s'], rr['ttft_mean_s'], bigger='longer', smaller='shorter')} "
           f"round-robin's ({priced['ttft_mean_s']:,.0f} s against {rr['ttft_mean_s']:,.0f} s); own caches with "
           f"cache-aware routing keep {aware['hit_ratio']:.1%} (TTFT {aware['ttft_mean_s']:,.0f} s)"]
    over = sorted(r["replicas"] for r in rows if r["mode"] == "isolated_aware" and r["load"] > 1)
    if over:
        out.append(f"at {', '.join(map(str, over))} replica(s) more prefill is asked than the replicas can do even "
                   "with their caches: queues grow all along, and TTFT is mostly waiting")
    return out
