"""Pictures, tables and computed sentences of chapter 07 (the KV cache as a distributed store): the
shared pool drawn, the store's status, the router's prices, the fault drill, the replay at 1-64
replicas and its comparison with Mooncake's published numbers, the eviction-gap table and the
recorded loopback bandwidth. Every sentence that compares numbers is rendered from them."""
from __future__ import annotations

import json

import matplotlib.pyplot as plt

from minimax_lab import resources
from minimax_lab.notebook import words

MODE_LABELS = {"isolated_rr": "own caches, round-robin", "isolated_aware": "own caches, cache-aware",
               "pool_rr": "shared pool, round-robin", "pool_priced": "shared pool, priced routing"}
_MODE_STYLE = {"isolated_rr": dict(ls="-", marker="o", ms=6), "isolated_aware": dict(ls="--", marker="s", ms=6),
               "pool_rr": dict(ls="-", marker="D", ms=9, mfc="none", lw=2.5),
               "pool_priced": dict(ls=":", marker="^", ms=6, lw=1.8)}

#: a replica busy more than this share of the trace's time makes TTFT mostly queueing
BUSY = 0.9

#: what a section prints when the store cannot run here
SKIPPED = "skipped: Mooncake Store is not running here (section 2 says why)"

#: one line per fault of ``engine.store_faults.FAULTS``: its name, what the drill does, and why the
#: tokens are fetched or recomputed
FAULT_WORDS = {
    "master_killed": ("master killed mid-run", "A publishes; the master is killed; B asks for a longer prompt",
                      "every pool call fails: B recomputes all"),
    "master_restarted_empty": ("master restarted empty", "A publishes; a new, empty master starts; B asks",
                               "the new master knows no block: B recomputes all"),
    "master_unreachable": ("master unreachable", "A publishes; the master is paused (SIGSTOP); B asks",
                           "calls time out: B recomputes all"),
    "corrupted_value": ("a value corrupted in the pool", "A publishes; one byte of a middle page is flipped; B asks",
                        "pages before the damage are fetched; the damaged one fails its checksum, so it and "
                        "the rest are recomputed"),
    "replica_died_mid_put": ("a replica dies mid-put", "a third replica dies after putting half its pages; B asks",
                             "the half that landed is fetched, the rest recomputed"),
    "concurrent_same_block": ("two replicas put the same pages", "A and B compute the same prompt at once; "
                              "caches cleared; A asks for a longer one", "the pool keeps one copy: all of it fetched"),
}


def recorded(name: str) -> dict | None:
    """A recorded results file (``kvstore_bandwidth``, ``kvstore_replay``, ``kvstore_policy_gap``,
    ``kvstore_faults``) shipped with the package, or None."""
    for d in reversed(resources.results_dirs()):
        p = d / f"{name}.json"
        if p.exists():
            return json.loads(p.read_text())
    return None


def session_kv_words(shape, tokens: int) -> str:
    """How much KV one session of ``tokens`` tokens holds for ``shape`` (a ``cost.LayerShape``)."""
    per = shape.kv_bytes_per_token()
    return (f"{shape.name} keeps {per / 1024:.0f} KiB of KV per token: an agent session of {tokens:,} tokens holds "
            f"{per * tokens / 1e9:.0f} GB")


def store_status(server, why: str | None, replicas: list) -> str:
    """One line: the store and its replicas running, or why not and what the chapter does instead."""
    if server is None:
        return f"{why}\nSections 3-6 need the store: each says it is skipped (section 6 shows the recorded drill)."
    where = "in a network namespace of its own" if server.netns else "on 127.0.0.1"
    return (f"Mooncake Store running {where}: master at {server.master_address}, {len(replicas)} replicas "
            "(their logs are removed when they stop, kept if something fails)")


def route_lines(cost, plan: dict, queue_s: list[float], n_tokens: int) -> list[str]:
    """Why the router chose what it chose: each replica's wait, what it would fetch and compute,
    and when it would be done (``routing.PrefillCost`` prices)."""
    out = []
    for r, (loc, q) in enumerate(zip(plan["local"], queue_s)):
        sec, fetch, comp = cost.plan(n_tokens, loc, plan["pool"])
        mark = "  <- chosen" if r == plan["replica"] else ""
        out.append(f"  replica {r}: waits {q:.1f} s, holds {loc}, fetches {fetch}, computes {comp}: "
                   f"prefill {sec * 1e3:.3g} ms, done at {q + sec:.4g} s{mark}")
    return out


def draw_pool(replicas: int = 3):
    """The picture of chapter 07: replicas with their own tiers above one shared pool: a master
    that knows where each block lives, memory lent by the machines."""
    fig, ax = plt.subplots(figsize=(10, 4.6))
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.4, 5.2)
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
    ax.add_patch(plt.Rectangle((0.4, 0.3), 6.2, 1.25, color="#9cf", alpha=0.5))
    ax.text(3.5, 1.15, "shared pool: memory lent by every machine", ha="center", weight="bold", fontsize=9.5)
    ax.text(3.5, 0.62, "key = format + chained page name\nvalue = header + payload + checksum",
            ha="center", va="center", fontsize=8.5)
    ax.add_patch(plt.Rectangle((6.8, 0.3), 2.6, 1.25, color="#cfc", alpha=0.7))
    ax.text(8.1, 1.15, "master", ha="center", weight="bold")
    ax.text(8.1, 0.62, "which key lives where;\nleases; evicts (~LRU)", ha="center", va="center", fontsize=8.5)
    ax.text(4.9, -0.2, "clients ask the master where a key lives, then move its bytes from the machine that holds them",
            ha="center", fontsize=8.5, style="italic")
    ax.set_title("A block computed anywhere is found everywhere by its name")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- faults


def fault_table(rows, label: str) -> str:
    """Markdown table of fault-drill rows (``store_faults.FaultRow`` objects or their recorded dicts),
    one line per fault saying what was done and where its tokens came from; ``label`` heads it."""
    out = [f"**{label}**", "",
           "| fault | what the drill does | tried | equal to one process | wrong | crashed | fetched | recomputed | why |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        r = r if isinstance(r, dict) else vars(r)
        name, done, why = FAULT_WORDS.get(r["fault"], (r["fault"], "", ""))
        out.append(f"| {name} | {done} | {r['trials']} | {r['equal']} | {r['wrong']} | {r['crashed']} | "
                   f"{r['fetched']} | {r['recomputed']} | {why} |")
    return "\n".join(out)


# --------------------------------------------------------------------------- the replay


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
               fontsize=8, frameon=False)
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


# --------------------------------------------------------------------------- eviction


def gap_table(rows: list[dict], name: str, policies=None) -> str:
    """Markdown table of ``policy_gap.gap_table`` rows: each policy's hit ratio and, in brackets,
    its share of the LRU->Belady gap ("-" where there is no gap to close)."""
    pols = list(policies or rows[0]["gap_closed"])
    out = [f"| {name}: capacity (tokens) | " + " | ".join(pols) + " |", "| --- " * (len(pols) + 1) + "|"]
    for r in rows:
        cells = [f"{r['hit'][p]:.1%} ({_share(r['gap_closed'][p])})" for p in pols]
        out.append(f"| {r['capacity_tokens']:,} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _share(v) -> str:
    return "-" if v is None else f"{v:.0%}"


def gap_summary(rows: list[dict], label: str,
                online=("lfu", "s3fifo", "arc", "agent", "chain", "reuse", "adaptive", "conversation", "learned"),
                watch: str = "adaptive") -> str:
    """Per capacity, the online policy closing most of the gap; how often ``watch`` is that policy;
    and the worst share any online policy reaches (negative: worse than LRU)."""
    parts, best_count, worst = [], 0, None
    for r in rows:
        closed = {p: v for p, v in r["gap_closed"].items() if p in online and v is not None}
        if not closed:
            continue
        best = max(closed, key=closed.get)
        best_count += closed[watch] >= closed[best] - 1e-9 if watch in closed else 0
        low = min(closed, key=closed.get)
        if worst is None or closed[low] < worst[1]:
            worst = (low, closed[low], r["capacity_tokens"])
        parts.append(f"{r['capacity_tokens']:,} tokens: {best} {closed[best]:.0%}")
    text = f"{label}, best online policy per capacity -- " + "; ".join(parts)
    text += f". {watch} is the best at {best_count} of {len(parts)} capacities"
    if worst is not None and worst[1] < 0:
        text += f"; the worst, {worst[0]} at {worst[2]:,} tokens, closes {worst[1]:.0%}: worse than LRU"
    return text + "."


# --------------------------------------------------------------------------- bandwidth


def _size_label(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def plot_bandwidth(doc: dict, title: str = "Mooncake Store over TCP loopback, 2-core CPU machine (recorded)"):
    """Left: batched put/get bandwidth against value size (each call moves ~16 MiB, so it holds
    fewer values as they grow: the count is under each size). Right: one put / one get's latency."""
    rows = doc["rows"]
    xs = [r["block_bytes"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.9))
    for op in ("put", "get"):
        a.plot(xs, [r[f"{op}_gbps"] for r in rows], "o-", label=f"{op}_batch")
        b.plot(xs, [r[f"{op}_ms"] for r in rows], "o-", label=f"one {op}")
    a.set_title("batched: one call moves ~16 MiB (values per call under each size)", fontsize=9)
    b.set_title("one value per call", fontsize=9)
    for ax, y in ((a, "GB/s"), (b, "latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel("value size")
        ax.set_ylabel(y)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    a.set_xticks(xs, [f"{_size_label(x)}\nx{r['batch']}" for x, r in zip(xs, rows)], fontsize=8)
    b.set_xticks(xs, [_size_label(x) for x in xs], fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def bandwidth_words(doc: dict, context: int = 32768) -> list[str]:
    """What the recorded rates mean for fetch-or-recompute, from the record's ``break_even`` rows,
    priced at the remote tier's measured get rate (the engine's own path, not the raw client's):
    the tiny model recomputed on this CPU, the M3-shaped layer on a modelled H200."""
    gets = [r["get_gbps"] for r in doc["rows"] if r["block_bytes"] >= 64 << 10]
    be = {(b["model"].split(" ")[0], b["context"]): b for b in doc["break_even"]}
    tiny, m3 = be[("tiny", 1024)], be[("M3-shaped", context)]
    link = m3["link_gbps"]
    return [
        f"loopback here: the raw client's batched gets of 64 KiB-16 MiB values moved {min(gets):.2f}-{max(gets):.2f} GB/s; "
        f"the remote tier's signed gets of 64 KiB-4 MiB blocks, median {link:.2f} GB/s: the rate used below",
        f"tiny model recomputed on this CPU (measured {doc['cpu_prefill_tflops'] * 1e3:.0f} GFLOP/s), 1k tokens: "
        f"fetching wins above {tiny['break_even_gbps']:.3f} GB/s, so at {link:.2f} GB/s it is "
        f"{words.speed(tiny['t_fetch_s'], tiny['t_recompute_s'])} recomputing",
        f"M3-shaped layer on a modelled H200 (50% of 989 TFLOP/s, not measured), {context // 1024}k tokens: "
        f"fetching wins above {m3['break_even_gbps']:.1f} GB/s; at {link:.2f} GB/s it is "
        f"{words.speed(m3['t_fetch_s'], m3['t_recompute_s'])} recomputing; one 200 Gbit/s RDMA NIC moves 25 GB/s, "
        f"{words.more_or_less(25.0, m3['break_even_gbps'])} the break-even",
    ]


# --------------------------------------------------------------------------- conversations


TRACE_LABELS = {"synthetic": "Mooncake's synthetic trace", "agent": "agent workload (24 sessions x 40 tool calls)",
                "conversations_a": "generated conversations A (trains the predictor)",
                "conversations_b": "generated conversations B (held out)"}


def policy_words(doc: dict, chosen: str = "conversation") -> list[str]:
    """Per trace of a recorded policy-gap document: the chosen policy's hit ratio and gap share at
    each capacity beside LRU's and Belady's, where it loses (below LRU, or below the best other
    online policy), what knowing *whether* conversations continue would add, and what the learned
    predictor adds."""
    out = []
    online = [p for p in doc["policies"] if p not in ("lru", "belady", "knows_whether", "learned", chosen)]
    for name, d in doc["traces"].items():
        label = TRACE_LABELS.get(name, name)
        parts, losses = [], []
        for r in d["rows"]:
            h, g = r["hit"], r["gap_closed"]
            share = "no gap to close" if g[chosen] is None else f"{g[chosen]:.0%} of the gap"
            parts.append(f"{r['capacity_tokens'] / 1e6:g}M: {h[chosen]:.1%} (LRU {h['lru']:.1%}, Belady "
                         f"{h['belady']:.1%}; {share})")
            best = max(online, key=lambda p: h[p])
            if h[chosen] < h["lru"] - 5e-4:
                losses.append(f"below LRU at {r['capacity_tokens'] / 1e6:g}M")
            elif h[best] > h[chosen] + 5e-4:
                losses.append(f"{best} keeps more at {r['capacity_tokens'] / 1e6:g}M ({h[best]:.1%})")
        text = f"{label} -- {chosen}: " + "; ".join(parts)
        out.append(text + (". Where it loses: " + ", ".join(losses) + "." if losses else "."))
        bound = [f"{r['capacity_tokens'] / 1e6:g}M {r['gap_closed']['knows_whether']:.0%}" for r in d["rows"]
                 if r["gap_closed"].get("knows_whether") is not None]
        if bound:
            out.append(f"  told from the future whether each conversation comes back (not when), the same policy "
                       f"closes {', '.join(bound)} of the gap")
        learned = [f"{r['capacity_tokens'] / 1e6:g}M {(r['hit']['learned'] - r['hit'][chosen]) * 100:+.1f} points"
                   for r in d["rows"]]
        out.append(f"  the learned continuation guess (AUC {d['learned']['auc']:.2f} on this trace) changes the hit "
                   f"ratio by {', '.join(learned)}")
    return out


def savings_table(doc: dict, chosen: str = "conversation") -> str:
    """Markdown: per trace and capacity, LRU's hit ratio and the cache ``chosen`` needs to reach it
    (the measure LPC reports: 18-47% less cache than LRU on its traces); "-" where the whole trace
    fits in the cache (no gap between LRU and Belady)."""
    out = [f"| trace | capacity | LRU hit | {chosen} needs | less cache than LRU |", "| --- | --- | --- | --- | --- |"]
    for name, d in doc["traces"].items():
        closed = {r["capacity_tokens"]: r["gap_closed"]["lru"] for r in d.get("rows", [])}
        for s in d["savings"]:
            if closed.get(s["capacity_tokens"], 0.0) is None:
                out.append(f"| {TRACE_LABELS.get(name, name)} | {s['capacity_tokens'] / 1e6:g}M | {s['lru_hit']:.1%} | "
                           "- | - (the whole trace fits: nothing to save) |")
                continue
            need = "more than the capacity" if s["needed_tokens"] is None else f"{s['needed_tokens'] / 1e6:.2f}M"
            saved = "-" if s["saved"] is None else f"{s['saved']:.0%}"
            out.append(f"| {TRACE_LABELS.get(name, name)} | {s['capacity_tokens'] / 1e6:g}M | {s['lru_hit']:.1%} | "
                       f"{need} | {saved} |")
    return "\n".join(out)


# --------------------------------------------------------------------------- the tier's speed


def tier_table(doc: dict) -> str:
    """Markdown: MiB/s of the raw client (bytes, zero-copy) and the remote tier (signed, checksum
    only) per block size and direction, and the tier's time over the faster raw path."""
    out = ["| block | op | raw client, bytes | raw client, zero-copy | tier, signed | tier, checksum | "
           "signed / raw | checksum / raw |", "| --- " * 8 + "|"]
    for r in doc["tier"]:
        for op in ("put", "get"):
            out.append(f"| {_size_label(r['block_bytes'])} x{r['batch']} | {op} | {r[f'raw_bytes_{op}_mibps']:.0f} | "
                       f"{r[f'raw_zero_copy_{op}_mibps']:.0f} | {r[f'tier_keyed_{op}_mibps']:.0f} | "
                       f"{r[f'tier_checksum_{op}_mibps']:.0f} | {r[f'tier_keyed_{op}_vs_raw']:.2f}x | "
                       f"{r[f'tier_checksum_{op}_vs_raw']:.2f}x |")
    return "\n".join(out)


def tier_words(doc: dict, bound: float = 1.25) -> list[str]:
    """What the tier table says: the tier's worst time against the raw client, signed and checksum
    only, whether that is within ``bound``, and what packing and checking a value cost alone."""
    out = []
    for path, label in (("tier_keyed", "signed with the pool's secret"), ("tier_checksum", "checksummed only")):
        worst = max(((r[f"{path}_{op}_vs_raw"], op, r["block_bytes"]) for r in doc["tier"] for op in ("put", "get")))
        within = sum(r[f"{path}_{op}_vs_raw"] <= bound for r in doc["tier"] for op in ("put", "get"))
        out.append(f"the tier, {label}: {within} of {2 * len(doc['tier'])} cells within {bound:.2f}x of the faster raw "
                   f"path; the slowest is {op_word(worst[1])} of {_size_label(worst[2])} blocks at {worst[0]:.2f}x")
    codec = doc["tier"][-1]
    out.append(f"in memory, {_size_label(codec['block_bytes'])} blocks: packing a value runs at "
               f"{codec['pack_keyed_mibps']:,.0f} MiB/s signed ({codec['pack_checksum_mibps']:,.0f} checksummed), "
               f"checking one and copying its tensor out at {codec['check_keyed_mibps']:,.0f} MiB/s "
               f"({codec['check_checksum_mibps']:,.0f})")
    return out


def op_word(op: str) -> str:
    return {"put": "puts", "get": "gets"}[op]


# --------------------------------------------------------------------------- the replay at measured rates


def measured_replay_table(doc: dict) -> str:
    """Markdown of the replay at the rates measured on this machine (``kvstore_replay``'s
    ``measured``): a row per replica count, a column per mode, each cell the share of tokens not
    recomputed, the share fetched from the pool and the mean TTFT (the model's)."""
    rows = doc["measured"]["rows"]
    modes = [m for m in MODE_LABELS if any(r["mode"] == m for r in rows)]
    by = {(r["replicas"], r["mode"]): r for r in rows}
    out = ["| replicas | " + " | ".join(MODE_LABELS[m] for m in modes) + " |", "| --- " * (len(modes) + 1) + "|"]
    for n in sorted({r["replicas"] for r in rows}):
        cells = []
        for m in modes:
            r = by[(n, m)]
            cells.append(f"{r['hit_ratio']:.1%} kept, {r['fetched_tokens'] / r['input_tokens']:.1%} fetched, "
                         f"TTFT {r['ttft_mean_s']:,.1f} s")
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(out)
