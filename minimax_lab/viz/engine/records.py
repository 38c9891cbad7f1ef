"""Reading the engine's bench records: which record is a day's (``{case: {day: record}}``), the
values the day tables and figures show (:data:`METRICS`, each with its repeats where it was
repeated), whether two records' times can be compared (:func:`comparable`: both rehearsed, or
both made where nothing compiles -- Triton's interpreter, or PyTorch alone), and each change
written ``after / before``. A decode record of a day without continuous batching that decoded
more than one sequence (:func:`breaks_batch_rule`) was made before forks counted against
``max_batch``: it is left out, and the tables say so.
"""
from __future__ import annotations

from typing import Sequence

from minimax_lab.bench.suite_engine_days import MixedRehearsal, day_ratio
from minimax_lab.engine.options import DAY_LABELS


COMMAND = "python -m minimax_lab.bench engine --preset gpu --deadline-s 270"


def no_record(cases: str = "") -> str:
    """What a sentence says where no GPU record exists."""
    return f"no GPU record yet (`{COMMAND}{' --cases ' + cases if cases else ''}` on a GPU makes it)"


def fmt_value(v: float, unit: str) -> str:
    """``v`` compactly: ms of a second or more as seconds, large rates with thousands separators."""
    if unit == "ms" and v >= 1000:
        return f"{v / 1e3:.3g} s"
    if v >= 1000:
        return f"{v:,.0f} {unit}"
    return f"{v:.3g} {unit}"


def engine_records(records: Sequence[dict]) -> list[dict]:
    return [r for r in records if r.get("suite") == "engine" and isinstance(r.get("day"), int)]


def _plain(r: dict) -> bool:
    """A day record (impl ``d<day>_<switch>``), not a sweep or a variant."""
    return r.get("impl") == f"d{r['day']}_{r.get('switch')}"


def by_case(records: Sequence[dict]) -> dict:
    """``{case: {day: record}}`` of the day records."""
    out: dict = {}
    for r in engine_records(records):
        if _plain(r):
            out.setdefault(r["case"], {})[r["day"]] = r
    return out


def by_device(records: Sequence[dict]) -> dict:
    """``{device: [its engine records]}``, the device with the most day records first."""
    out: dict = {}
    for r in engine_records(records):
        out.setdefault(r.get("device") or "?", []).append(r)
    return dict(sorted(out.items(), key=lambda kv: -len(kv[1])))


def versions(r: dict) -> str:
    """``"torch 2.11, Triton 3.6"``: the versions a record was made with."""
    t, tr = str(r.get("torch", "?")).split("+")[0], str(r.get("triton", "?"))
    return f"torch {'.'.join(t.split('.')[:2])}, Triton {'.'.join(tr.split('.')[:2])}"


def _label(day: int) -> str:
    return DAY_LABELS[day] if 0 <= day < len(DAY_LABELS) else f"day {day}"


def _short(day: int) -> str:
    """``"day 14"`` for the FP8 day: the number a reader sees, not its place in the list."""
    return _label(day).split(":")[0]


def _days_text(days) -> str:
    """``"days 0-5"``, ``"days 0 and 14"``, ``"day 6"``: the days' own numbers, runs of three or more joined."""
    nums = sorted(int(_short(d).split()[1]) for d in days)
    runs: list = []
    for n in nums:
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    parts = [p for a, b in runs for p in ([f"{a}-{b}"] if b - a >= 2 else [str(x) for x in range(a, b + 1)])]
    if len(nums) == 1:
        return f"day {parts[0]}"
    return "days " + (", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0])


#: (key, title, unit, True when larger is better)
METRICS = (
    ("ttft_first", "TTFT, first agent turn", "ms", False),
    ("ttft_followup", "TTFT, follow-up agent turn", "ms", False),
    ("ttft", "TTFT, agent turns (mean)", "ms", False),
    ("itl", "inter-token latency, p50", "ms", False),
    ("itl_p99", "inter-token latency, p99", "ms", False),
    ("itl_mean", "inter-token latency, mean", "ms", False),
    ("decode_b32", "decode tokens/s, 32 sequences", "tokens/s", True),
    ("memory", "weights + KV pool", "GiB", False),
)
#: metrics that are times: a first call's compiling can be in them, so they need comparable records
TIMED = ("ttft_first", "ttft_followup", "ttft", "itl", "itl_p99", "itl_mean", "decode_b32")


def _decode_records(cases: dict) -> dict:
    for case in sorted(cases):
        if case == "agent_long.decode" or case.startswith("agent_long.decode_b"):
            return cases[case]
    return {}


def breaks_batch_rule(r: dict) -> bool:
    """A decode record of a day without continuous batching that decoded more than one sequence at
    once: made before forks counted against the day's batch limit (such a day now decodes one)."""
    opts = r.get("options") or {}
    return (r.get("decode_batch") or 1) > 1 and opts.get("continuous_batching") is False


def itl_case(records: Sequence[dict]) -> str | None:
    """The workload whose inter-token latency the day tables show: ``agent_long`` where recorded,
    else ``agent``, else ``chat``."""
    cases = by_case(records)
    return next((c.split(".")[0] for c in ("agent_long.itl", "agent.itl", "chat.itl") if cases.get(c)), None)


def _reps(r: dict, key: str) -> list:
    return [x[key] for x in r.get("repeats") or () if isinstance(x, dict) and x.get(key) is not None]


def day_values(records: Sequence[dict]) -> dict:
    """``{metric key: {day: (value, record, repeats)}}`` for :data:`METRICS` (``repeats``: the
    repeats' values, empty for a record made once), ``"batch": {day: B}`` of the agent's decode,
    and ``"old_batch": {day: B}`` for the decode records left out by :func:`breaks_batch_rule`."""
    cases = by_case(records)
    out: dict = {k: {} for k, *_ in METRICS}
    out["batch"], out["old_batch"] = {}, {}
    for key in ("ttft_first", "ttft_followup"):
        for day, r in cases.get(f"agent_long.{key}", {}).items():
            out[key][day] = (r["ms"], r, _reps(r, f"{key}_ms"))
    for day, r in cases.get("agent.ttft", {}).items():
        out["ttft"][day] = (r["ms"], r, [])
    for day, r in _decode_records(cases).items():
        if breaks_batch_rule(r):
            out["old_batch"][day] = r.get("decode_batch")
        else:
            out["batch"][day] = r.get("decode_batch")
    itl = itl_case(records)
    if itl:
        for day, r in cases[f"{itl}.itl"].items():
            p50 = r.get("itl_p50_ms") or r["ms"]
            out["itl"][day] = (p50, r, _reps(r, "itl_p50_ms"))
            if r.get("itl_p99_ms"):
                out["itl_p99"][day] = (r["itl_p99_ms"], r, _reps(r, "itl_p99_ms"))
            if r.get("itl_mean_ms"):
                out["itl_mean"][day] = (r["itl_mean_ms"], r, _reps(r, "itl_mean_ms"))
    for day, r in cases.get("step_cost", {}).items():
        if r.get("decode_tok_s") and r.get("decode_batch") == 32:
            out["decode_b32"][day] = (r["decode_tok_s"], r, list(r.get("decode_tok_s_repeats") or ()))
    if not out["decode_b32"]:
        for day, r in _decode_records(cases).items():
            if r.get("decode_batch") == 32 and r.get("decode_tok_s") and not breaks_batch_rule(r):
                out["decode_b32"][day] = (r["decode_tok_s"], r, _reps(r, "decode_tok_s"))
    for case in ("agent_long.ttft_followup", "agent.e2e", "chat.e2e"):
        mem = {day: (r["weights_gib"] + r["kv_cache_gib"], r, []) for day, r in cases.get(case, {}).items()
               if r.get("weights_gib") is not None and r.get("kv_cache_gib") is not None}
        if mem:
            out["memory"] = mem
            break
    return out


def compiles_nothing(r: dict) -> bool:
    """A record made where nothing is compiled: Triton's interpreter, or every operator in PyTorch
    without CUDA graphs (day 0) -- its first call is its steady state."""
    opts = r.get("options") or {}
    torch_only = (opts and all(opts.get(k) in ("torch", "reference", "loop") for k in ("msa_impl", "moe_impl", "paged_impl"))
                  and not opts.get("cuda_graphs"))
    return bool(r.get("interpreter") or torch_only)


def comparable(a: dict, b: dict) -> str | None:
    """None when two records' times can be compared, else why not: ``"mixed rehearsal"`` (one was
    rehearsed, the other not) or ``"not rehearsed"`` (neither was, on a GPU: both may include
    Triton compiling, each a different amount). A record that :func:`compiles_nothing` counts as
    rehearsed."""
    ra, rb = bool(a.get("rehearsed")) or compiles_nothing(a), bool(b.get("rehearsed")) or compiles_nothing(b)
    if a.get("interpreter") and b.get("interpreter"):
        return None
    try:
        day_ratio({**a, "ms": 1.0, "rehearsed": ra}, {**b, "ms": 1.0, "rehearsed": rb})
    except MixedRehearsal:
        return "mixed rehearsal"
    return None if ra else "not rehearsed"


def change(prev, cur, higher_better: bool, *, timed: bool = True) -> tuple:
    """``(gain, note)`` of ``cur`` over ``prev`` (each ``(value, record[, repeats])``): gain > 1 is
    better; None with a note when either is missing or, for a time (``timed``), the two records
    cannot be compared (:func:`comparable`)."""
    if prev is None or cur is None:
        return None, ""
    why = comparable(prev[1], cur[1]) if timed else None
    if why:
        return None, why
    a, b = prev[0], cur[0]
    return (b / a if higher_better else a / b), ""


def beyond_spread(prev, cur) -> bool | None:
    """Whether two values' repeats (the third item of each, two or more values) do not overlap --
    a change larger than their spread; None where either was not repeated."""
    ra, rb = (list(prev[2]) if len(prev) > 2 else []), (list(cur[2]) if len(cur) > 2 else [])
    if len(ra) < 2 or len(rb) < 2:
        return None
    return max(ra) < min(rb) or max(rb) < min(ra)
