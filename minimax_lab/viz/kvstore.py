"""Bookkeeping of chapter 07 (the KV cache as a distributed store): its setup, the pool drawn, a
pool value laid out, the router's prices with a verdict judged against the measured link's spread,
the fault drill, the recorded link rates and the break-even picture, and where the numbers come
from. The replay at scale is in :mod:`.kvstore_scale`, eviction in :mod:`.kvstore_eviction`.
Every sentence that compares numbers is rendered from them."""
from __future__ import annotations

import itertools
import json
import random
import statistics
import time
from dataclasses import replace
from importlib import metadata
from types import SimpleNamespace

import matplotlib.pyplot as plt

from minimax_lab import resources, runtime
from minimax_lab.engine.slice import PagedEngine
from minimax_lab.engine.store_faults import FAULTS
from minimax_lab.kvcache.cost import M3_LAYER, PrefillCost
from minimax_lab.kvcache.pool_value import MAGIC
from minimax_lab.kvcache.routing import choose_replica
from minimax_lab.model.config import tiny_model_shape
from minimax_lab.model.train import load_pretrained
from minimax_lab.notebook import words

#: what a section prints when the store cannot run here
SKIPPED = "skipped: Mooncake Store is not running here (section 3 says why)"

#: the record files chapter 07 reads (``recorded``)
RECORDS = ("kvstore_bandwidth", "kvstore_replay", "kvstore_policy_gap", "kvstore_faults")

#: a modelled H200 (bf16 dense peak, TFLOP/s) and one 200 Gbit/s RDMA NIC (GB/s): no GPU runs here
H200_TFLOPS, H200_MFU, RDMA_GBPS = 989.0, 0.5, 25.0


def recorded(name: str) -> dict | None:
    """A recorded results file (one of ``RECORDS``) shipped with the package, or None."""
    for d in reversed(resources.results_dirs()):
        p = d / f"{name}.json"
        if p.exists():
            return json.loads(p.read_text())
    return None


def tier_rates(bw: dict) -> tuple[float, float, float]:
    """(lowest, median, highest) GB/s of the remote tier's signed gets over the block sizes the
    record timed: the rate fetch-or-recompute is priced at, and its spread."""
    gets = [r["tier_keyed_get_mibps"] * 2**20 / 1e9 for r in bw["tier"]]
    return min(gets), statistics.median(gets), max(gets)


def measured_cost(bw: dict, cfg) -> PrefillCost:
    """The price of a prompt for the replicas' tiny model (config ``cfg``; its CPU cache is fp32) at
    the rates recorded on the CPU machine: its prefill's measured FLOP rate (a measured rate:
    ``mfu=1``) and the tier's median signed get rate."""
    shape = replace(tiny_model_shape(cfg), dtype_bytes=4)
    return PrefillCost(shape, link_gbps=tier_rates(bw)[1], tflops=bw["cpu_prefill_tflops"], mfu=1.0)


def setup(preset: str) -> SimpleNamespace:
    """Everything chapter 07 needs before its first section: the preset (``P``), the tiny model's
    config (``cfg``), ``reference(tokens, n)`` (one process, no pool: the tokens every replica must
    reproduce), ``prompt(n)`` (random token ids from a fixed seed), the recorded documents
    (``records``: a dict over ``RECORDS``, None where missing) and the price at the recorded rates
    (``cost``, None without a bandwidth record)."""
    t0 = time.perf_counter()
    P = runtime.resolve_preset(preset)
    model, cfg = load_pretrained()
    single = PagedEngine(model, num_pages=512, page_size=16)
    ids = itertools.count()
    rng = random.Random(2026)
    records = {name: recorded(name) for name in RECORDS}
    bw = records["kvstore_bandwidth"]
    return SimpleNamespace(
        P=P, cfg=cfg, t0=t0, records=records, cost=measured_cost(bw, cfg) if bw else None,
        reference=lambda tokens, n: single.generate(("ref", next(ids)), tokens, n),
        prompt=lambda n: [rng.randrange(4, cfg.vocab_size) for _ in range(n)])


def session_kv_words(shape, tokens: int) -> str:
    """How much KV one session of ``tokens`` tokens holds for ``shape`` (a ``cost.LayerShape``)."""
    per = shape.kv_bytes_per_token()
    return (f"{shape.name} keeps {per / 1024:.0f} KiB of KV per token: an agent session of {tokens:,} tokens holds "
            f"{per * tokens / 1e9:.0f} GB")


def store_status(server, why: str | None, replicas: list) -> str:
    """One line: the store and its replicas running, or why not and what the chapter does instead."""
    if server is None:
        return f"{why}\nSections 4-8 need the store: each says it is skipped (section 8 shows the recorded drill)."
    where = "in a network namespace of its own" if server.netns else "on 127.0.0.1"
    return (f"Mooncake Store running {where}: master at {server.master_address}, {len(replicas)} replicas "
            "(their logs are removed when they stop, kept if something fails)")


# --------------------------------------------------------------------------- the idea and the value


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
        label = ("put(key, value)", "get(key)", "is_exist(keys)")[i % 3]
        ax.annotate("", xy=(x + w / 2, 1.55), xytext=(x + w / 2, 2.6),
                    arrowprops=dict(arrowstyle="<->" if i else "->", lw=1.4))
        ax.text(x + w / 2 + 0.1, 2.1, label, fontsize=9)
    ax.add_patch(plt.Rectangle((0.4, 0.3), 6.2, 1.25, color="#9cf", alpha=0.5))
    ax.text(3.5, 1.15, "shared pool: memory lent by every machine", ha="center", weight="bold", fontsize=9.5)
    ax.text(3.5, 0.62, "key = format + chained page name\nvalue = header + payload + tag (keyed with the pool's secret)",
            ha="center", va="center", fontsize=8.5)
    ax.add_patch(plt.Rectangle((6.8, 0.3), 2.6, 1.25, color="#cfc", alpha=0.7))
    ax.text(8.1, 1.15, "master", ha="center", weight="bold")
    ax.text(8.1, 0.62, "which key lives where;\nleases; evicts (~LRU)", ha="center", va="center", fontsize=8.5)
    ax.text(4.9, -0.2, "clients ask the master where a key lives, then move its bytes from the machine that holds them",
            ha="center", fontsize=8.5, style="italic")
    ax.set_title("A block computed anywhere is found everywhere by its name")
    fig.tight_layout()
    return fig


def value_layout(value: bytes, tag: int) -> str:
    """The parts of a pool value (``kvcache.pool_value`` layout, a ``tag``-byte tag) with their
    sizes, the header's JSON fields shown."""
    hlen = int.from_bytes(value[8:12], "little")
    payload = len(value) - 12 - hlen - tag
    fields = ", ".join(f"{k}={v}" for k, v in json.loads(value[12:12 + hlen]).items())
    return (f"magic {value[:8]!r} (8 B, expected {MAGIC!r}) | header length (4 B) = {hlen} | header ({hlen} B of "
            f"JSON, padded with spaces so the payload starts at byte {12 + hlen}): {fields} | payload ({payload:,} B) | "
            f"tag ({tag} B)")


def served_lines(cases: dict, decode) -> list[str]:
    """One line per ``{what: value}``: whether ``decode(value)`` (a codec's check) serves it."""
    width = max(map(len, cases))
    return [f"{what:<{width}}  served: {'yes' if decode(v) is not None else 'no (a miss: recomputed)'}"
            for what, v in cases.items()]


# --------------------------------------------------------------------------- routing


def break_even_gbps(cost: PrefillCost, a: int, b: int) -> float:
    """The link rate (GB/s) at which fetching tokens ``[a, b)`` takes as long as recomputing them
    at ``cost``'s FLOP rate."""
    return (b - a) * cost.shape.kv_bytes_per_token() / cost.compute_s(a, b) / 1e9



def route_lines(cost: PrefillCost, plan: dict, queue_s: list[float], n_tokens: int, spread=(1.0, 1.0)) -> list[str]:
    """Why the router chose what it chose: each replica's wait, what it would fetch and compute and
    when it would be done (``cost.plan``); then the verdict judged at the link rates ``spread``
    (factors on ``cost.link_gbps``: the lowest and highest rate measured over the median). A choice
    that flips inside that spread is called a tie."""
    out = []
    for r, (loc, q) in enumerate(zip(plan["local"], queue_s)):
        sec, fetch, comp = cost.plan(n_tokens, loc, plan["pool"])
        mark = "  <- chosen" if r == plan["replica"] else ""
        out.append(f"  replica {r}: waits {q:.1f} s, holds {loc}, fetches {fetch}, computes {comp}: "
                   f"done at {q + sec:.4g} s{mark}")
    winners = {f: choose_replica(n_tokens, plan["local"], plan["pool"], queue_s,
                                 replace(cost, link_gbps=cost.link_gbps * f))[0] for f in spread}
    rates = " to ".join(f"{cost.link_gbps * f:.3g}" for f in spread)
    if len(set(winners.values())) == 1:
        out.append(f"  replica {plan['replica']} finishes first at every link rate from {rates} GB/s")
    else:
        out.append(f"  a tie within the spread of the link's rate ({rates} GB/s): "
                   + ", ".join(f"replica {w} wins at {cost.link_gbps * f:.3g} GB/s" for f, w in winners.items()))
    return out


# --------------------------------------------------------------------------- faults

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
                        "pages before the damage are fetched; the damaged one fails its tag, so it and "
                        "the rest are recomputed"),
    "replica_died_mid_put": ("a replica dies mid-put", "a third replica dies after putting half its pages; B asks",
                             "the half that landed is fetched, the rest recomputed"),
    "concurrent_same_block": ("two replicas put the same pages", "A and B compute the same prompt at once; "
                              "caches cleared; A asks for a longer one", "the pool keeps one copy: all of it fetched"),
}


def live_faults(preset: str) -> tuple[tuple[str, ...], str]:
    """The faults the chapter's drill runs live after its own killed master, and a label for their
    table: every other fault on a GPU machine; at preset ``cpu`` not the replica that dies mid-put,
    which needs a fresh process (seconds of start-up on a CPU) and is shown recorded only."""
    skip = {"master_killed"} | ({"replica_died_mid_put"} if preset == "cpu" else set())
    label = "this run, one trial each of the other faults" + (
        " (a replica dying mid-put needs a fresh process, seconds on a CPU: see the recorded table below)" if preset == "cpu" else "")
    return tuple(f for f in FAULTS if f not in skip), label


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


def fault_words(rows) -> str:
    """What the drill's rows add up to: answers equal to one process's, wrong, crashed, and the share
    of prompt tokens recomputed -- the whole cost of a fault."""
    rows = [r if isinstance(r, dict) else vars(r) for r in rows]
    tried, equal = sum(r["trials"] for r in rows), sum(r["equal"] for r in rows)
    wrong, crashed = sum(r["wrong"] for r in rows), sum(r["crashed"] for r in rows)
    share = {FAULT_WORDS.get(r["fault"], (r["fault"],))[0]: r["recomputed"] / max(1, r["fetched"] + r["recomputed"])
             for r in rows}
    return (f"{equal} of {tried} answers equal to one process's, {wrong} wrong, {crashed} crashed; what each fault "
            "cost is the share of prompt tokens recomputed: " + ", ".join(f"{k} {v:.0%}" for k, v in share.items()))


# --------------------------------------------------------------------------- the link and the break-even


def _size_label(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def tier_table(doc: dict) -> str:
    """Markdown: MiB/s of the raw client (bytes, zero-copy) and the remote tier (signed, checksum
    only) per block size and direction, and the tier's time over the faster raw path."""
    out = ["| block | op | raw client, bytes | raw client, zero-copy | tier, signed | tier, checksum | "
           "signed: time over raw | checksum: time over raw |", "| --- " * 8 + "|"]
    for r in doc["tier"]:
        for op in ("put", "get"):
            out.append(f"| {_size_label(r['block_bytes'])} x{r['batch']} | {op} | {r[f'raw_bytes_{op}_mibps']:.0f} | "
                       f"{r[f'raw_zero_copy_{op}_mibps']:.0f} | {r[f'tier_keyed_{op}_mibps']:.0f} | "
                       f"{r[f'tier_checksum_{op}_mibps']:.0f} | {r[f'tier_keyed_{op}_vs_raw']:.2f}x | "
                       f"{r[f'tier_checksum_{op}_vs_raw']:.2f}x |")
    return "\n".join(out)


def tier_words(doc: dict) -> list[str]:
    """What the tier table says: the range of the tier's time over the raw client's, signed and
    checksummed, and what signing costs in memory against a checksum."""
    out = [record_origin(doc, f"medians of {doc['tier'][0].get('repeats', '?')} repeats per cell, no spread kept")]
    for path, label in (("tier_keyed", "signed with the pool's secret"), ("tier_checksum", "checksummed only")):
        ratios = [r[f"{path}_{op}_vs_raw"] for r in doc["tier"] for op in ("put", "get")]
        out.append(f"the tier, {label}, takes {min(ratios):.2f}x to {max(ratios):.2f}x the faster raw path's time")
    big = doc["tier"][-1]
    out.append(f"in memory, {_size_label(big['block_bytes'])} blocks: signing runs at {big['pack_keyed_mibps']:,.0f} MiB/s "
               f"and checking at {big['check_keyed_mibps']:,.0f}, a checksum at {big['pack_checksum_mibps']:,.0f} and "
               f"{big['check_checksum_mibps']:,.0f}: keyed BLAKE3 costs "
               f"{big['pack_checksum_mibps'] / big['pack_keyed_mibps']:.0f}x the CPU time of xxh3 on this machine")
    return out


def _break_even_rows(bw: dict, cfg):
    """``(label, shape, FLOP/s it recomputes at, [(link label, GB/s, (lo, hi) or None)])`` of the
    break-even picture: the tiny model at the recorded CPU rate, the M3-shaped layer on a modelled
    H200; both fetching at the tier's measured rates, the H200 also over one modelled RDMA NIC."""
    lo, med, hi = tier_rates(bw)
    tiny = measured_cost(bw, cfg).shape
    tier = ("the tier over loopback (measured)", med, (lo, hi))
    return [(f"the tiny model on the 2-core CPU machine ({bw['cpu_prefill_tflops'] * 1e3:.1f} GFLOP/s, recorded)",
             tiny, bw["cpu_prefill_tflops"] * 1e12, [tier]),
            (f"an M3-shaped layer on an H200 ({H200_MFU:.0%} of {H200_TFLOPS:.0f} TFLOP/s, modelled)", M3_LAYER,
             H200_TFLOPS * 1e12 * H200_MFU, [tier, (f"one 200 Gbit/s RDMA NIC ({RDMA_GBPS:.0f} GB/s, modelled)",
                                                    RDMA_GBPS, None)])]


def plot_break_even(bw: dict, cfg, contexts=tuple(2 ** k for k in range(8, 18))):
    """Per token: the time to recompute it at its position against the time to fetch its KV, for the
    tiny model on the CPU and the M3-shaped layer on a modelled H200; the band is the spread of the
    tier's measured rates over block sizes. Where the recompute line lies above a fetch line,
    fetching wins."""
    rows = _break_even_rows(bw, cfg)
    fig, axes = plt.subplots(1, len(rows), figsize=(11.5, 4.2))
    for ax, (label, shape, flop_s, links) in zip(axes, rows):
        ys = [shape.prefill_flops_per_token(c) / flop_s * 1e6 for c in contexts]
        ax.plot(contexts, ys, "k-o", ms=4, label="recompute one token at this position")
        for (name, gbps, band), color in zip(links, ("C0", "C2")):
            y = shape.kv_bytes_per_token() / (gbps * 1e9) * 1e6
            ax.axhline(y, color=color, lw=1.8, label=f"fetch its KV: {name}")
            if band:
                ax.axhspan(shape.kv_bytes_per_token() / (band[1] * 1e9) * 1e6,
                           shape.kv_bytes_per_token() / (band[0] * 1e9) * 1e6, color=color, alpha=0.2,
                           label="spread of the tier's rate over block sizes")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("position of the token in the prompt")
        ax.set_ylabel("µs per token")
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
    found = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            found.setdefault(lab, h)
    fig.legend(list(found.values()), list(found), loc="lower center", ncol=2, fontsize=9, frameon=False)
    fig.suptitle("Fetch or recompute, per token: fetching wins where the black line lies above a fetch line\n"
                 f"(rates {record_origin(bw)})", fontsize=11)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    return fig


def rate_words(bw: dict, cfg, context: int = 32768) -> list[str]:
    """The recorded rates and what they decide: the break-even link rate of each picture's model
    at ``context`` tokens, and the verdict at the tier's median rate (within its spread)."""
    lo, med, hi = tier_rates(bw)
    out = [f"the tier's signed gets moved {lo:.2f}-{hi:.2f} GB/s over the block sizes timed (median {med:.2f} GB/s, "
           "the rate prices use)"]
    for label, shape, flop_s, links in _break_even_rows(bw, cfg):
        t_comp = shape.prefill_flops_per_token(context) / flop_s
        even = shape.kv_bytes_per_token() / t_comp / 1e9
        verdicts = {("fetch" if shape.kv_bytes_per_token() / (g * 1e9) < t_comp else "recompute") for g in (lo, hi)}
        verdict = (f"{verdicts.pop()} wins at every rate the tier measured" if len(verdicts) == 1
                   else "a tie within the tier's spread")
        out.append(f"{label.split(' (')[0]}, token {context:,}: fetching pays above {even:.3g} GB/s; {verdict}"
                   + (f"; one RDMA NIC moves {words.more_or_less(RDMA_GBPS, even)} that" if len(links) > 1 else ""))
    return out


# --------------------------------------------------------------------------- where the numbers come from


def _versions() -> str:
    info = runtime.describe()
    try:
        mooncake = metadata.version("mooncake-transfer-engine-non-cuda")
    except metadata.PackageNotFoundError:
        try:
            mooncake = metadata.version("mooncake-transfer-engine")
        except metadata.PackageNotFoundError:
            mooncake = "not installed"
    return f"{info['device']}, Python {info['python']}, torch {info['torch']}, Mooncake {mooncake}"


def record_origin(doc: dict | None, spread: str = "") -> str:
    """One line to show beside a recorded table or figure: the machine the record names (or that it
    names none), the package versions it keeps (or that it keeps none), then ``spread`` -- what the
    record keeps of its spread -- when given."""
    if doc is None:
        return "not recorded here"
    machine = doc.get("machine") or (f"a {doc['cores']}-core CPU machine" if "cores" in doc else None)
    versions = doc.get("versions")
    if isinstance(versions, dict):
        versions = ", ".join(f"{k} {v}" for k, v in versions.items())
    where = f"recorded on {machine}" if machine else "the record names no machine"
    where += f", {versions}" if versions else "; it keeps no package versions"
    return where + (f"; {spread}" if spread else "")


def _recorded_line(what: str, doc: dict | None, how: str) -> str:
    return f"* {what}: " + (f"{how}; {record_origin(doc)}." if doc is not None else "not recorded here.")


def provenance(lab, server) -> str:
    """Where chapter 07's numbers come from, as a collapsed markdown block (``lab`` from ``setup``;
    ``server`` the store started, or None)."""
    r, seconds = lab.records, time.perf_counter() - lab.t0
    rows = [
        f"* This run: preset `{lab.P}` on {_versions()}; {seconds:.0f} s. Prompts are drawn from a fixed seed "
        "(2026); the fault drill from seed 7.",
        "* Sections 2-8 ran live (section 2 without the store): a Mooncake master, its metadata server and a pool node "
        + ("on 127.0.0.1" if server else "(not started here)") + ", each replica a process of its own running the "
        "tiny model; every answer is compared token for token with one process without a pool.",
        _recorded_line("Sections 5-6, the link and the CPU's prefill rate (`kvstore_bandwidth`)", r["kvstore_bandwidth"],
                       "the raw client and the tier interleaved repeat by repeat, medians of "
                       f"{r['kvstore_bandwidth']['tier'][0]['repeats'] if r['kvstore_bandwidth'] else '-'} repeats "
                       "(the record keeps no spread); the CPU's prefill rate from one timed 256-token prompt; the "
                       "H200 and the RDMA NIC are models, never measured"),
        _recorded_line("Section 8, the drill of three trials (`kvstore_faults`)", r["kvstore_faults"],
                       "every fault injected into a live pool, answers compared with one process"),
        _recorded_line("Section 9, the replay (`kvstore_replay`)", r["kvstore_replay"],
                       "Mooncake's synthetic trace replayed block by block at 1-64 replicas, priced by the model of "
                       "section 5 for LLaMA3-70B on modelled 8xA800 nodes (the figure; 10 replicas re-simulated in "
                       "this run), and again at the rates of section 5's record (the table)"),
        _recorded_line("Section 10, eviction (`kvstore_policy_gap`)", r["kvstore_policy_gap"],
                       "each policy replayed once per trace and capacity (deterministic: no spread within a trace); "
                       "the two generated conversation traces are two draws of one generator"),
        "* Mooncake's published numbers: Qin et al., FAST'25, Fig. 9 and Fig. 10 (read off the figures).",
        "* To take the records again on a CPU machine: `python -m minimax_lab.bench.suite_kvstore`, "
        "`python -m minimax_lab.engine.store_faults --trials 3`, `python -m minimax_lab.bench.kvstore_sims pool` and "
        "`python -m minimax_lab.bench.kvstore_sims policy-gap` (each takes `--out FILE`).",
    ]
    return ("<details><summary><b>Where these numbers come from</b> (click to open)</summary>\n\n"
            + "\n".join(rows) + "\n\n</details>")
