"""The timing mistakes of chapter 00, as a table, a picture and sentences computed from the numbers.

The numbers come from :func:`minimax_lab.bench.suite_pitfalls.demo` (measured now) or from the
H200 records of the ``pitfalls`` suite. A row is ``(label, ms, bytes_moved, honest)``: what
:func:`minimax_lab.viz.roofline.plot_timings` draws. Every sentence that compares two of these
numbers is built here from them (:mod:`minimax_lab.notebook.words`), so it cannot contradict the
table printed beside it.
"""
from __future__ import annotations

import os
from typing import Mapping, Sequence

from minimax_lab import runtime
from minimax_lab.measure.timing import Timing
from minimax_lab.notebook import recorded, words
from minimax_lab.viz import roofline

#: the pitfalls suite's cases, in the order drawn, with a label and whether it is the harness's way
CASES = {"no_sync": ("1. no synchronize", False), "no_warmup": ("2. no warm-up (first call)", False),
         "single_run_min": ("4. single run (fastest of 30)", False),
         "single_run_max": ("4. single run (slowest of 30)", False), "honest": ("harness median", True),
         "cache_resident": ("3. cache-resident input (small)", False),
         "cache_rotating": ("harness, same small size rotated", True)}
_MiB = 2**20


def rows_now(d: dict) -> list[tuple[str, float, float, bool]]:
    """The rows of a :func:`~minimax_lab.bench.suite_pitfalls.demo` result, in :data:`CASES` order."""
    single = sorted(d["single_runs_ms"])
    ms = {"no_sync": d["no_sync_ms"], "no_warmup": d["first_call_ms"], "single_run_min": single[0],
          "single_run_max": single[-1], "honest": d["honest_ms"], "cache_resident": d["cache_resident_ms"],
          "cache_rotating": d["cache_rotating_ms"]}
    return [(label, ms[case], d["cache_bytes"] if case.startswith("cache_") else d["bytes"], honest)
            for case, (label, honest) in CASES.items()]


def _gbps(row) -> float:
    return row[2] / (row[1] * 1e-3) / 1e9


def table(rows: Sequence[tuple], ceiling_gbps: float) -> str:
    """The rows as text: time, the bandwidth it implies and its share of the copy ceiling."""
    lines = [f"{'timing':34s} {'ms':>9s} {'GB/s':>9s} {'% of copy':>10s}"]
    for row in rows:
        lines.append(f"{row[0]:34s} {row[1]:9.4f} {_gbps(row):9.1f} {roofline.pct_text(100 * _gbps(row) / ceiling_gbps):>10s}")
    return "\n".join(lines)


def cache_sentence(d: dict) -> str:
    """Whether the large input overflows the cache it must overflow, in words computed from the sizes."""
    big, cache = d["input_bytes"], d["device_cache_bytes"]
    size = f"The large input ({big / _MiB:,.0f} MiB) is {words.more_or_less(big, cache, bigger='larger', smaller='smaller', same='about as large as')} the {d['device_cache']} ({cache / _MiB:,.0f} MiB)"
    if big >= 2 * cache:
        return size + ": no call finds it in the cache, so its honest number is memory's."
    if big > cache:
        return size + ": most of it comes from memory, but not all; its honest number flatters memory a little."
    return (size + ": this machine's cache holds it (its memory cannot spare a larger one for this demo), so "
            "even the harness's number on it is partly the cache's.")


def past_ceiling_sentence(rows: Sequence[tuple], ceiling_gbps: float) -> str:
    """Which rows claim more than the copy ceiling here, and which of them are the harness's own."""
    over = [r for r in rows if _gbps(r) > 1.03 * ceiling_gbps]
    if not over:
        return "No row claims more than the copy ceiling here."
    names = ", ".join(f"{r[0]} ({100 * _gbps(r) / ceiling_gbps:.0f}%)" for r in over)
    own = [r for r in over if r[3]]
    tail = (" Among them is the harness's own way: the copy line is itself one median on a machine whose "
            "load moves it, not a law." if own else "")
    return f"Past the copy line here: {names}.{tail}"


def load_sentence(threads: int | None) -> str:
    """The CPU's load average, where timing on a shared CPU makes it matter; empty on a GPU."""
    if not threads or not hasattr(os, "getloadavg"):
        return ""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    busy = load > 0.7 * cores
    return (f"CPU load average {load:.1f} on {cores} cores"
            + (": other processes share the cores, so a long call is often paused for them." if busy else "."))


def two_copies_sentence(d: dict, earlier_copy_gbps: float) -> str:
    """The demo's copy line beside the copy ceiling measured earlier in the same process (the roofline's
    memory roof): the same kind of copy timed twice, so the gap between them is the machine's noise."""
    now, honest = d["copy_gbps"], 2 * d["n"] * 4 / (d["honest_ms"] * 1e-3) / 1e9
    moved = words.more_or_less(now, earlier_copy_gbps, bigger="higher", smaller="lower", same="about as high as")
    text = (f"The copy line here ({now:,.1f} GB/s) and the copy ceiling measured first ({earlier_copy_gbps:,.1f} GB/s, "
            f"the roofline's memory roof) time the same kind of copy twice: the line is {moved} "
            f"the roof, and the harness median of a·x+b is {roofline.pct_text(100 * honest / earlier_copy_gbps)} of "
            f"the roof.")
    if not moved.startswith("about"):
        text += (" That gap is not a property of either copy: it is how far one bandwidth measurement moves on this "
                 "machine from one minute to the next (on a shared CPU, other processes use the same memory).")
    return text


def describe_now(d: dict, earlier_copy_gbps: float | None = None) -> str:
    """The table of a demo result and the sentences that read it; with ``earlier_copy_gbps`` (the
    copy ceiling measured before, :func:`minimax_lab.bench.ceilings`) also how the two copies compare."""
    rows = rows_now(d)
    head = (f"input: large {d['bytes'] / _MiB:,.0f} MiB moved per call, small {d['cache_bytes'] / _MiB:,.0f} MiB; "
            + (f"torch on {d['threads']} thread" if d["threads"] else "Triton kernel on the GPU")
            + f"; harness: {d['honest_method']}")
    parts = [head, table(rows, d["copy_gbps"]), cache_sentence(d), past_ceiling_sentence(rows, d["copy_gbps"]),
             two_copies_sentence(d, earlier_copy_gbps) if earlier_copy_gbps else "", load_sentence(d["threads"])]
    return "\n".join(p for p in parts if p)


def copy_lines(timings: Mapping[str, Timing], bytes_per_call: int, set_bytes: int, ceiling_gbps: float) -> str:
    """Chapter 00's copy timings (name -> :class:`~minimax_lab.measure.timing.Timing`), each as ms, GB/s
    with its p20-p80 range and its share of the copy ceiling measured first; then what the harness
    rotated (``set_bytes`` per input set) against the cache it sized the rotation on and this
    machine's cache, and, under the interpreter, whose time a Triton row is."""
    lines = [f"{'':20s} {'ms':>10s} {'GB/s':>9s} {'p20-p80 GB/s':>15s} {'of the ceiling':>15s}"]
    gbps = lambda ms: bytes_per_call / (ms * 1e-3) / 1e9  # noqa: E731
    for name, t in timings.items():
        spread = f"{gbps(t.p80_ms):.2f}-{gbps(t.p20_ms):.2f}"
        lines.append(f"{name:20s} {t.ms:10.3f} {gbps(t.ms):9.2f} {spread:>15s} "
                     f"{roofline.pct_text(100 * gbps(t.ms) / ceiling_gbps):>15s}")
    t = next(iter(timings.values()))
    cache, cache_name = runtime.cache_bytes()
    covered = t.input_sets * set_bytes
    lines.append(f"Each call moves {bytes_per_call / _MiB:,.0f} MiB; the harness rotated {t.input_sets} input sets of "
                 f"{set_bytes / _MiB:,.0f} MiB, {covered / _MiB:,.0f} MiB in all: "
                 f"{words.more_or_less(covered, cache, bigger='larger', smaller='smaller', same='about as large as')} "
                 f"the {cache_name} ({cache / _MiB:,.0f} MiB).")
    if runtime.is_interpreter():
        lines.append("The Triton row runs in the interpreter (numpy per program): its time is the interpreter's, "
                     "not a kernel's.")
    return "\n".join(lines)


def plot_now(d: dict):
    """The demo's rows as bars against the copy of the same large input, timed the same way."""
    return roofline.plot_timings(rows_now(d), d["copy_gbps"], title=f"a·x+b measured now on {d['device']}: "
                                 "what each timing claims", ceiling_label="copy of the large input, same harness")


# --------------------------------------------------------------------------- the recorded H200 run


def recorded_rows(device: str = recorded.H200) -> list[tuple[str, float, float, bool]] | None:
    """The pitfalls suite's records on ``device`` as rows, or None if any case is missing."""
    recs = {r["case"]: r for r in recorded.all_of("pitfalls", device=device)}
    if not all(case in recs for case in CASES):
        return None
    return [(label, recs[case]["ms"], recs[case]["gbps"] * 1e6 * recs[case]["ms"], honest)
            for case, (label, honest) in CASES.items()]


def recorded_copy_gbps(device: str = recorded.H200) -> float | None:
    """The copy ceiling recorded on ``device``, or None."""
    r = recorded.one("ceilings", "copy", "torch.copy_", device=device)
    return r.get("gbps") if r else None


def recorded_summary(device: str = recorded.H200) -> str:
    """Three sentences on what the mistakes claimed on ``device``, each comparison computed."""
    rows, copy = recorded_rows(device), recorded_copy_gbps(device)
    if rows is None or copy is None:
        return f"No `pitfalls` records for the {device} yet: `python -m minimax_lab.bench ceilings pitfalls` on it."
    by = {case: row for case, row in zip(CASES, rows)}
    honest, no_sync, first = by["honest"], by["no_sync"], by["no_warmup"]
    resident, rotating = by["cache_resident"], by["cache_rotating"]
    pct = lambda row: 100 * _gbps(row) / copy  # noqa: E731
    return (f"On the {device} the harness's median moves {pct(honest):.0f}% of the copy ceiling, while forgetting "
            f"to synchronize claims {pct(no_sync):.0f}%: it timed the launch, not the work. The first call took "
            f"{first[1] / honest[1]:,.0f}x the median (the Triton compiler). At the small size the cache-resident "
            f"input was {words.speed(resident[1], rotating[1])} the same size rotated through memory.")


def plot_recorded(device: str = recorded.H200):
    """The recorded rows as bars against the recorded copy ceiling; None when nothing is recorded."""
    rows, copy = recorded_rows(device), recorded_copy_gbps(device)
    if rows is None or copy is None:
        return None
    return roofline.plot_timings(rows, copy, title=f"a·x+b, recorded on the {device}: what each timing claims",
                                 ceiling_label=f"copy ceiling recorded on the {device}")
