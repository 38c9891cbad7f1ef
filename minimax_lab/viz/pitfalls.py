"""The timing mistakes of chapter 00, as a table, a picture and sentences computed from the numbers.

The numbers come from :func:`minimax_lab.bench.suite_pitfalls.demo` (measured now) or from the
H200 records of the ``pitfalls`` suite, both as the demo's dict (:func:`recorded_demo` turns the
records into one). A row is ``(label, ms, bytes_moved, honest)``: what
:func:`minimax_lab.viz.roofline.plot_timings` draws, with the p20-p80 spread of each median that has
one as an error bar. Every sentence that compares two of these numbers is built here from them
(:mod:`minimax_lab.notebook.words`), judged against their spread, so it cannot contradict the table
printed beside it: :func:`reading` says what each mistake did in this run.

:func:`setup` is the chapter's one setup call, :func:`provenance` its closing "where these numbers
come from" cell.
"""
from __future__ import annotations

import os
import platform
import time
from typing import Mapping, Sequence

import torch
import triton

from minimax_lab import runtime
from minimax_lab.measure.timing import Ceilings, Timing
from minimax_lab.notebook import recorded, words
from minimax_lab.viz import roofline
from minimax_lab.viz.live_vs_recorded import versions_label

#: the pitfalls suite's cases, in the order drawn, with a label and whether it is the harness's way
CASES = {"no_sync": ("1. no synchronize", False), "no_warmup": ("2. no warm-up (first call)", False),
         "single_run_min": ("4. single run (fastest of 30)", False),
         "single_run_max": ("4. single run (slowest of 30)", False), "honest": ("harness median", True),
         "cache_resident": ("3. cache-resident input (small)", False),
         "cache_rotating": ("harness, same small size rotated", True)}
_MiB = 2**20
_STARTED: list[float] = []  # when setup() ran: the provenance cell says how long the chapter took


def setup(preset: str = "auto") -> str:
    """Chapter 00's one setup call: the preset resolved (:func:`minimax_lab.runtime.resolve_preset`);
    on a CPU every timing of the chapter on one thread (with two, a call on a busy machine waits for
    the second core); one line saying where the chapter runs. Returns the preset."""
    p = runtime.resolve_preset(preset)
    torch.set_num_threads(runtime.pick(p, cpu=1, gpu=torch.get_num_threads()))
    where = "in its interpreter (numpy, one program after another)" if runtime.is_interpreter() else "compiled"
    n = torch.get_num_threads()
    print(f"{runtime.device_name()}, preset {p}; Triton {triton.__version__} {where}; torch {torch.__version__} "
          f"on {n} thread{'s' if n > 1 else ''}")
    _STARTED[:] = [time.perf_counter()]
    return p


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


def spread(d: Mapping, case: str) -> tuple[float, float] | None:
    """The p20-p80 range in ms of ``case``'s median (``honest``, ``copy``, ``cache_resident``,
    ``cache_rotating``) where the run kept one, else None."""
    lo, hi = d.get(f"{case}_p20_ms"), d.get(f"{case}_p80_ms")
    return (lo, hi) if lo and hi else None


def spreads_now(d: Mapping) -> list[tuple[float, float] | None]:
    """Per row of :func:`rows_now`: the p20-p80 range in ms of the medians (the harness's rows), None
    for the single readings (mistakes 1, 2 and 4 are one reading each)."""
    return [spread(d, case) for case in CASES]


def table(rows: Sequence[tuple], ceiling_gbps: float, spreads: Sequence | None = None) -> str:
    """The rows as text: time, the bandwidth it implies and its share of the copy ceiling; with
    ``spreads`` (per row a p20-p80 range in ms, or None) the range of the share too."""
    lines = [f"{'timing':34s} {'ms':>9s} {'GB/s':>9s} {'% of copy':>10s}" + ("   p20-p80" if spreads else "")]
    for i, row in enumerate(rows):
        line = f"{row[0]:34s} {row[1]:9.4f} {_gbps(row):9.1f} {roofline.pct_text(100 * _gbps(row) / ceiling_gbps):>10s}"
        if spreads and spreads[i]:
            lo, hi = (100 * row[2] / (ms * 1e-3) / 1e9 / ceiling_gbps for ms in (spreads[i][1], spreads[i][0]))
            line += f"   {roofline.pct_text(lo)}-{roofline.pct_text(hi)}"
        lines.append(line)
    return "\n".join(lines)


def _noise_share(d: Mapping) -> float:
    """How far apart two single timings of the same call landed in this run (the single runs'
    max / min - 1): the noise a comparison without spreads is judged against (at least 3%)."""
    runs = d.get("single_runs_ms") or []
    return max(0.03, max(runs) / min(runs) - 1) if len(runs) > 1 and min(runs) > 0 else 0.03


def _versus(a_ms: float, b_ms: float, a_spread, b_spread, noise: float) -> str:
    """``words.speed`` of ``a`` against ``b``: 'level with' where their p20-p80 ranges overlap (or,
    without ranges, within ``noise``), else the ratio."""
    if a_spread and b_spread:
        if a_spread[0] <= b_spread[1] and b_spread[0] <= a_spread[1]:
            return "level with"
        return words.speed(a_ms, b_ms, same_within=0.0)
    same = words.speed(a_ms, b_ms, same_within=noise)
    return "level with" if same == "about as fast as" else same


def _times(r: float) -> str:
    return f"{r:,.0f}x" if r >= 10 else f"{r:.2g}x"


def _on_gpu(d: Mapping) -> bool:
    return bool(d.get("gpu", d.get("impl") == "triton"))


def reading(d: Mapping) -> str:
    """What each mistake did in this run (a :func:`~minimax_lab.bench.suite_pitfalls.demo` result, or
    :func:`recorded_demo`), one numbered line each, every comparison computed from the numbers and
    judged against their p20-p80 spreads -- or, where the run kept none, against how far its single
    runs landed apart (said so)."""
    gpu, noise = _on_gpu(d), _noise_share(d)
    h, hs = d["honest_ms"], spread(d, "honest")
    pct = lambda ms, nbytes: 100 * nbytes / (ms * 1e-3) / 1e9 / d["copy_gbps"]  # noqa: E731
    lines = []

    ns = d["no_sync_ms"]
    if not gpu:
        where = ("inside" if not hs or hs[0] <= ns <= hs[1] else "below" if ns < hs[0] else "above")
        line = (f"Mistake 1, no synchronize: {ns:.3g} ms, {where} the harness's p20-p80 range"
                + (f" ({hs[0]:.3g}-{hs[1]:.3g} ms)" if hs else "") + ": on a CPU torch works in the calling thread, so "
                "a call returns only when its work is done; an unsynchronized reading is still one reading, which "
                "lands wherever the machine's load puts it (mistake 4)")
    elif ns < (hs[0] if hs else h / (1 + noise)):
        line = (f"Mistake 1, no synchronize: the host clock stopped at {ns:.3g} ms, {words.speed(ns, h, same_within=0.0)} "
                f"the harness's median ({h:.3g} ms): the call returned before its work was done")
        claim = pct(ns, d["bytes"])
        if claim > 100:
            line += f", and {roofline.pct_text(claim)} of the copy ceiling is more than memory can deliver"
    else:
        line = (f"Mistake 1, no synchronize: {ns:.3g} ms, not below the harness's {h:.3g} ms this time: the host happened "
                "to wait for the work, and an unsynchronized clock reads whatever the host waited for")
    lines.append(line + ".")

    first = d["first_call_ms"]
    why = ("compiling the Triton kernel for a block size this process had not used" if gpu
           else "the first touch of a freshly allocated output buffer")
    lines.append(f"Mistake 2, no warm-up: the first call took {first:.3g} ms, {_times(first / h)} the harness's median"
                 + (f": it paid for {why}." if first > 2 * h else "."))

    runs = sorted(d["single_runs_ms"])
    lo, hi, n = runs[0], runs[-1], d.get("single_runs_n", len(runs))
    line = f"Mistake 4, a single run: {n} separate single runs took {lo:.3g} to {hi:.3g} ms ({hi / lo:.2f}x apart)"
    if lo <= h <= hi:
        line += f"; a single one could have reported any of them, the harness reports the median of many ({h:.3g} ms)"
    elif lo > h:
        line += (f", all slower than the harness's median ({h:.3g} ms): a host clock around one call and a synchronize "
                 "also counts the launch and the wait"
                 + (", which the harness leaves out by queuing its calls and timing each with CUDA events" if gpu
                    else ""))
    else:
        line += f", all faster than the harness's median ({h:.3g} ms)"
    lines.append(line + ".")

    res, rot = d["cache_resident_ms"], d["cache_rotating_ms"]
    rs, ts = spread(d, "cache_resident"), spread(d, "cache_rotating")
    how = _versus(res, rot, rs, ts, noise)
    line = (f"Mistake 3, a cache-resident input: the same {d['cache_bytes'] / _MiB:,.0f} MiB every call ran {how} the same "
            "size rotated through fresh buffers")
    line += (": the cache served it, not memory" if "faster" in how else
             ": at this size the cache did not flatter it" if how == "level with" else "")
    if not (rs and ts):
        line += f" (no spread recorded: judged against the {noise:.0%} between the fastest and slowest single run)"
    if "faster" in how and pct(res, d["cache_bytes"]) < 100:
        line += "; both stay below the line the large copy draws, so this mistake shows only against its own twin"
    lines.append(line + ".")
    return "\n".join(sorted(lines))  # in the mistakes' order


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
    line_spread = spread(d, "copy")
    if line_spread and d["bytes"] / (line_spread[1] * 1e-3) / 1e9 <= earlier_copy_gbps <= d["bytes"] / (line_spread[0] * 1e-3) / 1e9:
        moved = "about as high as"  # the roof lies inside the line's own p20-p80 range
    else:
        moved = words.more_or_less(now, earlier_copy_gbps, bigger="higher", smaller="lower", same="about as high as",
                                   same_within=0.0 if line_spread else 0.03)
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
    copy ceiling measured before, :func:`minimax_lab.measure.ceilings`) also how the two copies compare."""
    rows = rows_now(d)
    head = (f"input: large {d['bytes'] / _MiB:,.0f} MiB moved per call, small {d['cache_bytes'] / _MiB:,.0f} MiB; "
            + (f"torch on {d['threads']} thread" if d["threads"] else "Triton kernel on the GPU")
            + f"; harness: {d['honest_method']}")
    parts = [head, table(rows, d["copy_gbps"], spreads_now(d)), cache_sentence(d), reading(d),
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
    for name, t in timings.items():
        if gbps(t.ms) > 1.03 * ceiling_gbps:  # a copy past the copy ceiling: say which of the two is noise
            inside = gbps(t.p80_ms) <= ceiling_gbps <= gbps(t.p20_ms)
            lines.append(f"{name} claims more than the copy ceiling measured first: " + (
                "the ceiling lies inside its p20-p80 range, so the two are one speed measured twice on a machine "
                "whose load moves it." if inside else
                "more than its own spread; the ceiling is one median taken a minute earlier, and on a shared "
                "machine the next minute's copy may run faster (section 4 comes back to this)."))
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


def _copy_band(d: Mapping) -> tuple[float, float] | None:
    s = spread(d, "copy")
    return (d["bytes"] / (s[1] * 1e-3) / 1e9, d["bytes"] / (s[0] * 1e-3) / 1e9) if s else None


def plot_now(d: dict):
    """The demo's rows as bars against the copy of the same large input, timed the same way; the
    medians with their p20-p80 spread as error bars, the copy's as a grey band."""
    return roofline.plot_timings(rows_now(d), d["copy_gbps"], title=f"a·x+b measured now on {d['device']}: "
                                 "what each timing claims", ceiling_label="copy of the large input, same harness",
                                 spreads=spreads_now(d), ceiling_spread_gbps=_copy_band(d))


# --------------------------------------------------------------------------- the recorded H200 run


def _pitfall_records(device: str) -> dict[str, dict] | None:
    recs = {r["case"]: r for r in recorded.all_of("pitfalls", device=device)}
    return recs if all(case in recs for case in CASES) else None


def recorded_rows(device: str = recorded.H200) -> list[tuple[str, float, float, bool]] | None:
    """The pitfalls suite's records on ``device`` as rows, or None if any case is missing."""
    recs = _pitfall_records(device)
    if recs is None:
        return None
    return [(label, recs[case]["ms"], recs[case]["gbps"] * 1e6 * recs[case]["ms"], honest)
            for case, (label, honest) in CASES.items()]


def recorded_copy_gbps(device: str = recorded.H200) -> float | None:
    """The copy ceiling recorded on ``device``, or None."""
    r = recorded.one("ceilings", "copy", "torch.copy_", device=device)
    return r.get("gbps") if r else None


def recorded_demo(device: str = recorded.H200) -> dict | None:
    """The records on ``device`` as a :func:`~minimax_lab.bench.suite_pitfalls.demo` result (the copy
    ceiling recorded there as the copy line; the spreads the records kept, and the single runs' min
    and max of the suite's thirty), or None where a case or the ceiling is missing."""
    recs, copy = _pitfall_records(device), recorded_copy_gbps(device)
    if recs is None or copy is None:
        return None
    big, small = recs["honest"], recs["cache_rotating"]
    nbytes = lambda r: r["gbps"] * 1e6 * r["ms"]  # noqa: E731
    runs = recs["single_run_min"].get("single_runs_ms") or [recs["single_run_min"]["ms"], recs["single_run_max"]["ms"]]
    d = {"device": device, "gpu": True, "impl": big.get("impl"), "bytes": nbytes(big), "cache_bytes": nbytes(small),
         "copy_gbps": copy, "no_sync_ms": recs["no_sync"]["ms"], "first_call_ms": recs["no_warmup"]["ms"],
         "single_runs_ms": runs, "single_runs_n": len(runs) if len(runs) > 2 else 30,
         "honest_ms": big["ms"], "cache_resident_ms": recs["cache_resident"]["ms"], "cache_rotating_ms": small["ms"],
         "versions": versions_label(list(recs.values())), "records": list(recs.values())}
    for case in ("honest", "cache_resident", "cache_rotating"):
        d[f"{case}_p20_ms"], d[f"{case}_p80_ms"] = recs[case].get("p20_ms"), recs[case].get("p80_ms")
    return d


def recorded_summary(device: str = recorded.H200) -> str:
    """What the mistakes claimed on ``device``: one sentence on the harness's share of the copy
    ceiling with the versions recorded, then :func:`reading`'s line per mistake."""
    d = recorded_demo(device)
    if d is None:
        return f"No `pitfalls` records for the {device} yet."
    honest = 100 * d["bytes"] / (d["honest_ms"] * 1e-3) / 1e9 / d["copy_gbps"]
    return (f"Recorded on the {device} ({d['versions']}): the harness's median of a·x+b moves "
            f"{roofline.pct_text(honest)} of the copy ceiling recorded there.\n" + reading(d))


def plot_recorded(device: str = recorded.H200):
    """The recorded rows as bars against the recorded copy ceiling (error bars where the records kept
    a spread); None when nothing is recorded."""
    d = recorded_demo(device)
    if d is None:
        return None
    return roofline.plot_timings(rows_now(d), d["copy_gbps"], spreads=spreads_now(d),
                                 title=f"a·x+b, recorded on the {device}: what each timing claims\n({d['versions']})",
                                 ceiling_label=f"copy ceiling recorded on the {device}")


def provenance(preset: str, here: Ceilings, d: Mapping | None = None) -> str:
    """Markdown for chapter 00's last, collapsed cell: this run, how its numbers were timed, the H200
    records drawn and how to make your own."""
    info = runtime.describe()
    seconds = time.perf_counter() - _STARTED[0] if _STARTED else float("nan")
    rows = [f"- this run: preset `{preset}`, {info['device']}, Python {info['python']}, torch {info['torch']}, "
            f"Triton {info['triton']}{' (interpreter)' if info['interpreter'] else ''}, {platform.system()}; "
            f"{seconds:.0f} s from the setup cell to here",
            f"- the ceilings measured here: {roofline.how_measured(here)}; each a median of its calls"]
    if d is not None:
        rows.append(f"- the mistakes measured here: `suite_pitfalls.demo`, the harness's rows by `measure.time_fn` "
                    f"({d['honest_method']}), medians with their p20-p80 spread (error bars); the single runs are "
                    f"{len(d['single_runs_ms'])} separate host-clock readings")
    rec = recorded_demo()
    if rec is not None:
        dates = sorted({str(r.get("when", ""))[:10] for r in rec["records"] if r.get("when")})
        rows.append(f"- the H200 numbers: the `ceilings` and `pitfalls` bench suites on the {recorded.H200} "
                    f"({rec['versions']}), recorded {', '.join(dates) or 'on an unrecorded date'}"
                    + ("" if spread(rec, "honest") else "; those records keep medians without their spread"))
    rows.append("- your own GPU: `python -m minimax_lab.bench ceilings pitfalls` records the same numbers there "
                "(`python -m minimax_lab.bench all` every suite); `python -m minimax_lab.bench report` writes every "
                "record, shipped and your own, to one page")
    rows.append("- comparison words: two medians are called different only when their p20-p80 ranges do not overlap; "
                "where a record keeps no range, only when they differ by more than its single runs did")
    return ("<details><summary><b>Where these numbers come from</b> (click to open)</summary>\n\n"
            + "\n".join(rows) + "\n\n</details>")
