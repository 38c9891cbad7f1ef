"""Chapter 07's eviction section: each policy's hit ratio beside its share of the LRU -> Belady gap,
drawn and told, on the recorded traces (``kvstore_policy_gap``), with the cache each needs for LRU's
hit ratio (the measure LPC reports).

A replay is deterministic: on one trace it has no spread. The two generated conversation traces are
two draws of one generator, so on them a difference between policies counts only where its mean
over the draws is larger than the draws' disagreement; otherwise it is called a tie."""
from __future__ import annotations

import statistics

import matplotlib.pyplot as plt

TRACE_LABELS = {"synthetic": "Mooncake's synthetic trace", "agent": "agent workload (24 sessions x 40 tool calls)",
                "conversations_a": "generated conversations A (trains the predictor)",
                "conversations_b": "generated conversations B (held out)"}
#: two draws of the same generator: their disagreement is the spread a difference is judged against
DRAWS = ("conversations_a", "conversations_b")
#: not online policies: they know the future (all of it, or whether each conversation returns)
OFFLINE = ("belady", "knows_whether")


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
    fig.suptitle("Which blocks leave first: hit ratios, and the share of the LRU-Belady gap each closes (recorded)")
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
