"""Benchmark records: one JSON object per case and implementation, appended to
``results/<gpu>.json`` and read back by the notebooks and the report.

* :func:`make_record` -- a record: time, rates, percentage of a measured ceiling, ratios to peers.
* :func:`append_records` / :func:`load_records` -- write (locked, atomic) and read records; the
  recorded ones shipped with the package and the user's own (:mod:`minimax_lab.resources`).
  Neither loses a record to a damaged file: :func:`read_records` says what is wrong with one
  (unreadable, not JSON -- a copy cut short --, not a list, entries that are not records).
* :func:`compare_records` -- did a change keep every case's ratio to its same-run peers?
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from minimax_lab import resources, runtime
from minimax_lab.measure.timing import Timing, ceilings

def git_commit() -> str | None:
    """The clone's HEAD commit (with ``-dirty`` if the tree has changes); for an installed
    package the commit pip recorded (``pip install git+...``); else None.

    ``MINIMAX_LAB_COMMIT`` overrides it (a GPU machine gets the tree without its ``.git``)."""
    if os.environ.get("MINIMAX_LAB_COMMIT"):
        return os.environ["MINIMAX_LAB_COMMIT"]
    root = resources.checkout_root()
    if root is None:
        return resources.installed_commit()
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (sha + ("-dirty" if dirty else "")) or None


def make_record(
    suite: str,
    case: str,
    impl: str,
    timing: Timing | float,
    *,
    shape: Mapping[str, Any] | None = None,
    dtype: torch.dtype | str | None = None,
    flops: float | None = None,
    bytes_moved: float | None = None,
    ceiling: str | None = None,
    peers: Mapping[str, float] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict:
    """One JSON-ready benchmark record.

    ``flops``/``bytes_moved`` give TFLOP/s and GB/s; ``ceiling`` (``"gemm"`` or ``"copy"``)
    picks which measured ceiling the percentage is of. ``peers`` maps a peer's name to its
    median ms *from the same run*; each gets ``speedup_vs[name] = peer_ms / ms``.
    """
    ms = timing.ms if isinstance(timing, Timing) else float(timing)
    if not ms > 0:
        raise ValueError(f"time must be positive, got {ms}")
    rec: dict[str, Any] = {
        "suite": suite, "case": case, "impl": impl, "ms": round(ms, 6),
        "shape": dict(shape or {}), "dtype": str(dtype).replace("torch.", "") if dtype is not None else None,
    }
    if isinstance(timing, Timing):
        rec.update(p20_ms=round(timing.p20_ms, 6), p80_ms=round(timing.p80_ms, 6), reps=timing.reps,
                   timing_method=timing.method)
    if flops is not None:
        rec["tflops"] = round(flops / (ms * 1e-3) / 1e12, 3)
    if bytes_moved is not None:
        rec["gbps"] = round(bytes_moved / (ms * 1e-3) / 1e9, 2)
    if ceiling is not None:
        c = ceilings()
        if ceiling == "gemm" and flops is not None:
            rec["pct_of_ceiling"] = round(100 * rec["tflops"] / c.gemm_tflops, 1)
        elif ceiling == "copy" and bytes_moved is not None:
            rec["pct_of_ceiling"] = round(100 * rec["gbps"] / c.copy_gbps, 1)
        else:
            raise ValueError(f"ceiling {ceiling!r} needs {'flops' if ceiling == 'gemm' else 'bytes_moved'}")
        rec["ceiling"] = ceiling
    if peers:
        rec["peers_ms"] = {k: round(v, 6) for k, v in peers.items() if v is not None}
        # four significant figures: a ratio far below 1 (the interpreter against a compiled peer) stays above 0
        rec["speedup_vs"] = {k: float(f"{v / ms:.4g}") for k, v in peers.items() if v is not None}
    if extra:
        rec.update(extra)
    return rec


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(path.suffix + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class RecordsWarning(UserWarning):
    """A results file could not be used as it is (damaged, kept aside, or not writable)."""


class RecordsNotSaved(OSError):
    """Neither the results file nor a fallback file could be written; ``records`` holds what was
    not saved (a command line prints them, so they survive in its output)."""

    def __init__(self, message: str, records: list[dict]):
        super().__init__(message)
        self.records = records


def is_record(entry) -> bool:
    """A benchmark record: a dict naming its ``suite``, ``case`` and ``impl`` (strings)."""
    return isinstance(entry, dict) and all(isinstance(entry.get(k), str) for k in ("suite", "case", "impl"))


def read_records(path: Path | str) -> tuple[list | None, str | None]:
    """``(entries, what is wrong)`` for a results file: ``(list, None)`` for a list of records;
    ``(list, "N of M entries are not records")`` for a list holding other things too (the list as
    it is); ``(None, why)`` for a file that is missing, unreadable, not JSON (a copy cut short,
    a hand edit) or not a list. Never raises."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return None, "no such file"
    except UnicodeDecodeError as e:
        return None, f"not JSON (not UTF-8 text: {e.reason} at byte {e.start})"
    except OSError as e:
        return None, f"unreadable ({type(e).__name__}: {e.strerror or e})"
    try:
        data = json.loads(text)
    except ValueError as e:
        return None, f"not JSON ({e})"
    if not isinstance(data, list):
        return None, f"not a list of records (a JSON {type(data).__name__})"
    bad = sum(not is_record(r) for r in data)
    return data, (f"{bad} of {len(data)} entries are not records" if bad else None)


def _stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")


def _write_json(path: Path, data) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename: never half a file."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _save_elsewhere(new: list[dict], path: Path, why: str) -> Path:
    """Write ``new`` to a fresh file (beside ``path``, else in the temporary folder) and warn
    where; raises :class:`RecordsNotSaved` when nothing can be written."""
    for folder in (path.parent, Path(tempfile.gettempdir())):
        other = folder / f"{path.stem}.unsaved-{_stamp()}.json"
        try:
            _write_json(other, new)
        except OSError:
            continue
        warnings.warn(f"{path}: {why}; the {len(new)} new records are in {other}", RecordsWarning, stacklevel=3)
        return other
    raise RecordsNotSaved(f"{path}: {why}, and no other file could be written: {len(new)} records not saved", new)


def append_records(records: Sequence[dict], path: Path | str | None = None) -> Path:
    """Append records (stamped with commit, versions and time) to ``path``, by default
    ``<results>/<gpu>.json`` with ``<results>`` = ``$MINIMAX_LAB_RESULTS`` or ``./results``
    (:func:`minimax_lab.resources.user_results_dir`; never inside an installed package).
    Returns the file the records are in.

    The file is a JSON list; writes go through a temporary file and a rename under a lock, so
    concurrent writers and interrupted runs never leave a half-written file. The records given are
    never dropped, and bytes that could not be read are never overwritten:

    * a file that is unreadable, not JSON or not a list is kept aside as
      ``<name>.damaged-<time>`` (a :class:`RecordsWarning` says where), and a new file holds the
      new records;
    * a list holding entries that are not records keeps them, with the new records appended;
    * where the file cannot be written (a full disk, no permission, a file that cannot be moved
      aside), the new records go to ``<stem>.unsaved-<time>.json`` beside it or in the temporary
      folder (a warning says where); where nothing can be written, :class:`RecordsNotSaved`
      carries them.
    """
    path = Path(path) if path is not None else resources.user_results_dir() / f"{runtime.device_slug()}.json"
    stamp = {"commit": git_commit(), "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
             **{k: v for k, v in runtime.describe().items() if k in ("device", "torch", "triton", "interpreter")}}
    new = [{**stamp, **r} if "commit" not in r else dict(r) for r in records]
    try:
        with _locked(path):
            old, problem = read_records(path) if path.exists() or path.is_symlink() else ([], None)
            if old is None:
                aside = path.with_name(f"{path.name}.damaged-{_stamp()}")
                try:
                    os.replace(path, aside)
                except OSError as e:
                    return _save_elsewhere(new, path, f"{problem}, and it could not be moved aside ({e.strerror or e})")
                warnings.warn(f"{path} was {problem}: kept it as {aside}; {path} now holds the {len(new)} new records",
                              RecordsWarning, stacklevel=2)
                old = []
            _write_json(path, old + new)
    except OSError as e:
        return _save_elsewhere(new, path, f"could not be written ({type(e).__name__}: {e.strerror or e})")
    return path


def load_records(device: str | None = "NVIDIA H200", suite: str | None = None, *, latest: bool = True) -> list[dict]:
    """Records for ``device`` (None: all devices) and ``suite`` (None: all): the recorded ones
    shipped with the package (a clone's ``results/``), then the user's own (``$MINIMAX_LAB_RESULTS``
    or ``./results``, if present; see :func:`minimax_lab.resources.results_dirs`).

    With ``latest`` only the newest record of each (suite, case, impl) is kept -- the user's own
    when both have one. A damaged file (unreadable, not JSON, not a list) is skipped with one
    :class:`RecordsWarning` naming it; entries of a list that are not records are skipped, with one
    warning naming the file; every other file still loads. (With ``device=None``, a JSON file that
    is an object, not a list, is another kind of results file and is passed over silently.)
    """
    recs = []
    for folder in resources.results_dirs():
        files = [folder / f"{runtime.device_slug(device)}.json"] if device else sorted(folder.glob("*.json"))
        for f in files:
            if not (f.exists() or f.is_symlink()):
                continue
            stored, problem = read_records(f)
            if problem is not None and not (device is None and problem.startswith("not a list")):
                # (looking through every file, a JSON object is another kind of file: a gpu-check record)
                what = "skipped it" if stored is None else "skipped those entries"
                warnings.warn(f"{f} is {problem}: {what}", RecordsWarning, stacklevel=2)
            recs += [r for r in stored or () if is_record(r) and (suite is None or r.get("suite") == suite)]
    if latest:
        newest: dict[tuple, dict] = {}
        for r in recs:
            newest[(r.get("device"), r.get("suite"), r.get("case"), r.get("impl"))] = r
        recs = list(newest.values())
    return recs


def format_table(records: Sequence[dict]) -> str:
    """A plain-text table of records, one row each."""
    cols = ["suite", "case", "impl", "ms", "tflops", "gbps", "pct_of_ceiling", "speedup_vs"]
    rows = []
    for r in records:
        row = []
        for c in cols:
            v = r.get(c, "")
            if isinstance(v, dict):
                v = " ".join(f"{k}:{x:.2f}x" for k, x in v.items())
            elif isinstance(v, float):
                v = f"{v:.4g}"
            row.append(str(v))
        rows.append(row)
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    line = lambda cells: "  ".join(s.ljust(w) for s, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(r) for r in rows])


def compare_records(before: Sequence[dict], after: Sequence[dict], *, tolerance: float = 0.03) -> dict:
    """Each case's ratio to its peers (``speedup_vs``, measured in the same run) before and after a
    change: ``{"rows": [{suite, case, impl, peer, before, after, change}], "regressions": [rows whose
    ratio fell by more than ``tolerance``], "missing": ["suite/case/impl" recorded before, not after]}``.
    Ratios, not times, so two runs on one GPU compare even when its clocks differ; the newest record
    of each (suite, case, impl) in each list counts. ``change`` = after / before - 1."""
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")

    def newest(records):
        out = {}
        for r in records:
            out[(r.get("suite"), r.get("case"), r.get("impl"))] = r
        return out

    b, a = newest(before), newest(after)
    rows, missing = [], []
    for key in sorted(b, key=str):
        if key not in a:
            missing.append("/".join(map(str, key)))
            continue
        pb, pa = b[key].get("speedup_vs") or {}, a[key].get("speedup_vs") or {}
        for peer in sorted(set(pb) & set(pa)):
            if pb[peer] and pa[peer]:
                rows.append(dict(zip(("suite", "case", "impl"), key), peer=peer, before=pb[peer], after=pa[peer],
                                 change=pa[peer] / pb[peer] - 1))
    return {"rows": rows, "regressions": [r for r in rows if r["change"] < -tolerance], "missing": missing}


def format_comparison(result: dict, tolerance: float = 0.03) -> str:
    """:func:`compare_records`' result as a markdown table (regressions marked), then what is missing."""
    lines = ["| suite | case | impl | vs | before | after | change |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        flag = " **worse**" if r["change"] < -tolerance else ""
        lines.append(f"| {r['suite']} | {r['case']} | {r['impl']} | {r['peer']} | {r['before']:.3f}x | "
                     f"{r['after']:.3f}x | {100 * r['change']:+.1f}%{flag} |")
    lines.append(f"\n{len(result['rows'])} ratios compared; {len(result['regressions'])} fell by more than "
                 f"{100 * tolerance:.0f}%")
    if result["missing"]:
        lines.append(f"recorded before, not after: {', '.join(result['missing'])}")
    return "\n".join(lines)
