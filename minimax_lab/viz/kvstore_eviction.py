"""Chapter 07's eviction section: each policy's hit ratio beside its share of the LRU -> Belady gap,
drawn and told, on the recorded traces (``kvstore_policy_gap``), with the cache each needs for LRU's
hit ratio (the measure LPC reports); a table of what each policy keeps and knows; and a policy
written in the chapter replayed beside the package's on small generated traces.

A replay is deterministic: on one trace it has no spread. The two generated conversation traces are
two draws of one generator, so on them a difference between policies counts only where its mean
over the draws is larger than the draws' disagreement; otherwise it is called a tie."""
from __future__ import annotations

import statistics

import matplotlib.pyplot as plt

from minimax_lab.kvcache.eviction import S3FIFOPolicy
from minimax_lab.kvcache.trace import replay_trace
from minimax_lab.viz.kvstore import record_origin

TRACE_LABELS = {"synthetic": "Mooncake's synthetic trace", "agent": "agent workload (24 sessions x 40 tool calls)",
                "conversations_a": "generated conversations A (trains the predictor)",
                "conversations_b": "generated conversations B (held out)"}
#: two draws of the same generator: their disagreement is the spread a difference is judged against
DRAWS = ("conversations_a", "conversations_b")
#: not online policies: they know the future (all of it, or whether each conversation returns)
OFFLINE = ("belady", "knows_whether")


#: one row per policy of the record: what it keeps, what it knows when it evicts, whether it is online
#: (uses only the past) -- each the summary of its class's docstring in ``kvcache.eviction`` (or of how
#: the record builds it: ``learned`` and ``knows_whether`` are ``conversation`` with another guess)
POLICY_ROWS = {
    "lru": ("the blocks used most recently", "the order of block accesses", "yes"),
    "lfu": ("the blocks used most often (no aging)", "each block's access count", "yes"),
    "s3fifo": (f"new blocks pass a small queue ({S3FIFOPolicy().frac:.0%} of the cache); only those reused there stay",
               "access order, a small reuse count, a list of recent victims", "yes"),
    "arc": ("a balance of blocks seen once and seen again, tuned by which kind it regrets evicting",
            "recency, whether a block was seen again, recent victims", "yes"),
    "agent": ("chapter 06's policy: the blocks used most often lately; chains trimmed from the tail",
              "access counts with aging, access order", "yes"),
    "chain": ("the blocks of recent requests, a bonus per reuse; chains cut from the tail, a request's new "
              "last block first", "request order, a block's position in its request, reuse counts", "yes"),
    "reuse": ("the blocks whose predicted next use (last use + last reuse gap) is nearest",
              "each block's reuse gaps, counted in requests", "yes"),
    "adaptive": ("what `chain` or `reuse` would keep: whichever hit more lately in a shadow cache",
                 "what both know, and two shadow caches", "yes"),
    "conversation": ("the blocks whose conversation is likely to come back soon, cut from the "
                     "conversation's tail; prefixes many conversations share",
                     "conversation ids, turns so far, idle time, a block's position, request and answer "
                     "sizes; return rates learned from the turns seen so far", "yes"),
    "learned": ("as `conversation`, with a logistic regression guessing whether a conversation continues",
                "as `conversation`, and the guess", "yes (the guess trained beforehand on trace A)"),
    "knows_whether": ("as `conversation`, told whether each conversation comes back",
                      "as `conversation`, and whether (not when) each conversation returns", "no: a bound"),
    "belady": ("the blocks used soonest", "the whole future trace", "no: the optimum"),
}


def policy_table(doc: dict) -> str:
    """Markdown: every policy of the record (``POLICY_ROWS``), in the record's order."""
    out = ["| policy | what it keeps | what it knows when it evicts | online |", "| --- | --- | --- | --- |"]
    out += [f"| `{p}` | " + " | ".join(POLICY_ROWS[p]) + " |" for p in doc["policies"] if p in POLICY_ROWS]
    return "\n".join(out)


def sketch_lines(draws: list, mine, capacities, chosen: str = "conversation") -> list[str]:
    """``mine`` (an ``EvictionPolicy`` class) replayed beside LRU, ``chosen`` and Belady on each trace
    of ``draws`` (two draws of one generator) at each capacity: the hit ratios, each one's share of
    the LRU -> Belady gap, and ``mine`` against ``chosen`` judged by ``_verdict`` (against the draws'
    disagreement)."""
    def share(h: dict, p: str) -> str:
        gap = h["belady"] - h["lru"]
        return _share((h[p] - h["lru"]) / gap if gap > 1e-3 else None)

    out = []
    said = {1: f"{mine.name} keeps more", -1: f"{chosen} keeps more", 0: "a tie within the draws' disagreement"}
    for cap in capacities:
        hits = [{p: replay_trace(reqs, capacity_tokens=cap, policy=mine() if p == "mine" else p).hit_ratio
                 for p in ("lru", "mine", chosen, "belady")} for reqs in draws]
        told = lambda p: " and ".join(f"{h[p]:.1%}" for h in hits)  # noqa: E731
        shares = lambda p: " and ".join(share(h, p) for h in hits)  # noqa: E731
        diffs = [(h["mine"] - h[chosen]) * 100 for h in hits]
        out.append(f"{cap / 1e3:g}k tokens: LRU {told('lru')}, {mine.name} {told('mine')} ({shares('mine')} of the "
                   f"gap), {chosen} {told(chosen)} ({shares(chosen)}), Belady {told('belady')}; {mine.name} minus "
                   f"{chosen}: {' and '.join(f'{d:+.1f}' for d in diffs)} points ({said[_verdict(diffs)]})")
    return out


def _online(doc: dict, chosen: str) -> list[str]:
    return [p for p in doc["policies"] if p not in (*OFFLINE, "lru", "learned", chosen)]


def _mc(cap: int) -> str:
    return f"{cap / 1e6:g}M"


def _share(v) -> str:
    return "no gap" if v is None else f"{v:.0%}"


def plot_eviction(doc: dict, chosen: str = "conversation"):
    """One panel per trace: hit ratio against cache size, the band between LRU and Belady (the gap),
    ``chosen`` with its share of the gap written beside each point, the best other online policy at
    each size (named), and the ``knows_whether`` bound."""
    traces = list(doc["traces"].items())
    fig, axes = plt.subplots(1, len(traces), figsize=(13, 4.3))
    online = _online(doc, chosen)
    for ax, (name, d) in zip(axes, traces):
        rows = d["rows"]
        xs = range(len(rows))
        hit = lambda p: [r["hit"][p] * 100 for r in rows]  # noqa: E731
        ax.fill_between(xs, hit("lru"), hit("belady"), color="#ddd", label="the gap: LRU to Belady")
        ax.plot(xs, hit("lru"), "o-", color="gray", label="LRU")
        ax.plot(xs, hit("belady"), "s--", color="black", label="Belady (knows the future)")
        ax.plot(xs, hit("knows_whether"), "v:", color="C2", label="conversation, told whether each conversation returns")
        gap = [r["gap_closed"][chosen] is not None for r in rows]
        best = [max(online, key=lambda p: r["hit"][p]) for r in rows]
        bx = [x for x, g in zip(xs, gap) if g]
        ax.plot(bx, [rows[x]["hit"][best[x]] * 100 for x in bx], "x", color="C0", ms=9, mew=2,
                label="best other online policy (named)")
        ax.plot(xs, hit(chosen), "D-", color="C3", label=f"{chosen} (its share of the gap written beside it)")
        low, high = min(hit("lru")), max(hit("belady"))
        pad = (high - low) * 0.12 or 1.0
        ax.set_ylim(low - pad, high + pad)
        for x, r in zip(xs, rows):
            top = r["hit"][chosen] * 100 > high - 2 * pad          # near the top: write below the point
            where = dict(xytext=(6, -14), ha="left") if not gap[x] else dict(xytext=(-7, -14 if top else 7), ha="right")
            ax.annotate(_share(r["gap_closed"][chosen]), (x, r["hit"][chosen] * 100), textcoords="offset points",
                        fontsize=8.5, color="C3", weight="bold", **where)
            if gap[x]:
                ax.annotate(best[x], (x, r["hit"][best[x]] * 100), textcoords="offset points", xytext=(6, 4),
                            fontsize=8, color="C0")
        ax.set_xticks(list(xs), [_mc(r["capacity_tokens"]) for r in rows])
        ax.set_xlim(-0.4, len(rows) - 0.6)
        ax.set_xlabel("cache (tokens)")
        ax.set_title(TRACE_LABELS.get(name, name).replace(" (", "\n("), fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("hit ratio (%)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=9, frameon=False)
    fig.suptitle("Which blocks leave first: hit ratios, and the share of the LRU-Belady gap each closes\n"
                 f"({record_origin(doc)}; each replay is deterministic)", fontsize=11)
    fig.tight_layout(rect=(0, 0.13, 1, 1))
    return fig


def _diffs(doc: dict, traces, cap: int, p: str, q: str) -> list[float]:
    """Points of hit ratio ``p`` keeps over ``q`` at ``cap``, one per trace of ``traces``."""
    return [(r["hit"][p] - r["hit"][q]) * 100 for t in traces for r in doc["traces"][t]["rows"]
            if r["capacity_tokens"] == cap]


def _verdict(diffs: list[float]) -> int:
    """+1 / -1 / 0 (a tie) for the points one policy keeps over another: on one trace, exact (a tie
    below a tenth of a point, what the tables show); on two draws, counted only where their mean
    lies farther from zero than the draws lie apart (two standard errors, as well as two draws can
    estimate them)."""
    if len(diffs) == 1:
        return 0 if abs(diffs[0]) < 0.1 else 1 if diffs[0] > 0 else -1
    a, b = diffs
    mean = (a + b) / 2
    return 0 if abs(mean) <= abs(a - b) else 1 if mean > 0 else -1


def _groups(doc: dict) -> list[tuple[str, tuple]]:
    """``(label, traces)``: each trace alone, except the two draws of the conversation generator, together."""
    out = [(TRACE_LABELS.get(n, n) + " [one trace, replayed exactly]", (n,)) for n in doc["traces"] if n not in DRAWS]
    if all(t in doc["traces"] for t in DRAWS):
        out.append(("generated conversations [two draws, A and B]", DRAWS))
    return out


def eviction_words(doc: dict, chosen: str = "conversation") -> list[str]:
    """Per trace (the two conversation draws together) and size, the online policies that keep more
    than ``chosen``, or those level with it, or that it keeps the most, judged as ``_verdict`` says
    (points are the other policy's hit ratio minus ``chosen``'s); then what knowing whether
    conversations return would add, and what the learned continuation guess adds."""
    out, online = [], _online(doc, chosen)
    for label, traces in _groups(doc):
        parts = []
        for r in doc["traces"][traces[0]]["rows"]:
            cap = r["capacity_tokens"]
            if r["gap_closed"][chosen] is None:
                parts.append(f"{_mc(cap)}: no gap (LRU = Belady)")
                continue
            pts = lambda p: " and ".join(f"{x:+.1f}" for x in _diffs(doc, traces, cap, p, chosen))  # noqa: E731
            by = {p: _verdict(_diffs(doc, traces, cap, p, chosen)) for p in online}
            ranked = sorted(online, key=lambda p: -sum(_diffs(doc, traces, cap, p, chosen)))
            ahead = [p for p in ranked if by[p] == 1]
            level = [p for p in ranked if by[p] == 0]
            if ahead:
                text = ", ".join(f"{p} keeps more ({pts(p)} points)" for p in ahead[:3])
                text += f" and {len(ahead) - 3} more" if len(ahead) > 3 else ""
            elif level:
                text = f"no other policy keeps more beyond the spread (the nearest, {level[0]}: {pts(level[0])} points)"
            else:
                text = f"{chosen} keeps the most (the nearest, {ranked[0]}: {pts(ranked[0])} points)"
            parts.append(f"{_mc(cap)}: {text}")
        out.append(f"{label} -- " + "; ".join(parts))
    bound = [f"{TRACE_LABELS.get(n, n).split(' (')[0]} " + "/".join(
        _share(r["gap_closed"]["knows_whether"]) for r in d["rows"]) for n, d in doc["traces"].items()
        if any(r["gap_closed"]["knows_whether"] is not None for r in d["rows"])]
    sizes = "/".join(_mc(r["capacity_tokens"]) for r in next(iter(doc["traces"].values()))["rows"])
    out.append("told from the future whether each conversation returns (not when), the same policy closes "
               + ", ".join(bound) + f" of the gap ({sizes})")
    if all(t in doc["traces"] for t in DRAWS):
        rows = doc["traces"][DRAWS[0]]["rows"]
        verdicts = [(_mc(r["capacity_tokens"]), _diffs(doc, DRAWS, r["capacity_tokens"], "learned", chosen))
                    for r in rows]
        said = {1: "learned keeps more", -1: f"{chosen} keeps more", 0: "a tie"}
        out.append(f"the learned continuation guess (trained on A; AUC {doc['traces'][DRAWS[1]]['learned']['auc']:.2f} "
                   f"on B), learned minus {chosen}: "
                   + "; ".join(f"{c} {' and '.join(f'{x:+.1f}' for x in d)} points ({said[_verdict(d)]})"
                               for c, d in verdicts))
    return out


def savings_words(doc: dict, chosen: str = "conversation") -> str:
    """The cache ``chosen`` needs for LRU's hit ratio, as the range of savings over the traces and
    sizes that have a gap (LPC's measure)."""
    saved = [s["saved"] for d in doc["traces"].values() for s in d["savings"]
             for r in d["rows"] if r["capacity_tokens"] == s["capacity_tokens"]
             and r["gap_closed"]["lru"] is not None and s["saved"] is not None]
    never = sum(s["needed_tokens"] is None for d in doc["traces"].values() for s in d["savings"]
                for r in d["rows"] if r["capacity_tokens"] == s["capacity_tokens"] and r["gap_closed"]["lru"] is not None)
    text = (f"{chosen} reaches LRU's hit ratio with {min(saved):.0%} to {max(saved):.0%} less cache (median "
            f"{statistics.median(saved):.0%}) over the {len(saved)} trace-and-size pairs with a gap")
    return text + (f"; at {never} it never does" if never else "") + " (LPC's traces are others: not a head-to-head)"


def gap_table(rows: list[dict], name: str, policies) -> str:
    """Markdown table of ``policy_gap.gap_table`` rows: each policy's hit ratio and, in brackets,
    its share of the LRU->Belady gap ("-" where there is no gap to close)."""
    pols = list(policies)
    out = [f"| {name}: capacity (tokens) | " + " | ".join(pols) + " |", "| --- " * (len(pols) + 1) + "|"]
    for r in rows:
        cells = [f"{r['hit'][p]:.1%} ({'-' if r['gap_closed'][p] is None else format(r['gap_closed'][p], '.0%')})"
                 for p in pols]
        out.append(f"| {r['capacity_tokens']:,} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def savings_table(doc: dict, chosen: str = "conversation") -> str:
    """Markdown: per trace and capacity, LRU's hit ratio and the cache ``chosen`` needs to reach it;
    "-" where the whole trace fits in the cache (no gap between LRU and Belady)."""
    out = [f"| trace | capacity | LRU hit | {chosen} needs | less cache than LRU |", "| --- | --- | --- | --- | --- |"]
    for name, d in doc["traces"].items():
        closed = {r["capacity_tokens"]: r["gap_closed"]["lru"] for r in d.get("rows", [])}
        for s in d["savings"]:
            label = TRACE_LABELS.get(name, name)
            if closed.get(s["capacity_tokens"], 0.0) is None:
                out.append(f"| {label} | {_mc(s['capacity_tokens'])} | {s['lru_hit']:.1%} | - | - (the whole trace fits) |")
                continue
            need = "more than the capacity" if s["needed_tokens"] is None else f"{s['needed_tokens'] / 1e6:.2f}M"
            saved = "-" if s["saved"] is None else f"{s['saved']:.0%}"
            out.append(f"| {label} | {_mc(s['capacity_tokens'])} | {s['lru_hit']:.1%} | {need} | {saved} |")
    return "\n".join(out)


def all_tables(doc: dict, policies=("lru", "lfu", "s3fifo", "arc", "agent", "chain", "reuse", "adaptive",
                                    "conversation", "learned", "knows_whether", "belady")) -> str:
    """Every policy's hit ratio and gap share on every trace, and the savings table, in one
    collapsed markdown block."""
    parts = [gap_table(d["rows"], TRACE_LABELS.get(n, n), [p for p in policies if p in d["rows"][0]["hit"]])
             for n, d in doc["traces"].items()]
    return ("<details><summary><b>Every policy on every trace</b> (hit ratio, and in brackets its share of the "
            "gap; click to open)</summary>\n\n" + "\n\n".join(parts) + "\n\n" + savings_table(doc) + "\n\n</details>")
