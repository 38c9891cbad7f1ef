"""``python -m minimax_lab.bench report``: every benchmark record on one page.

    python -m minimax_lab.bench report [--out DIR] [--html] [--device NAME ...] [--suite NAME ...]

The chapters draw one figure from the records; this page holds the rest. It reads every record
:func:`minimax_lab.measure.load_records` finds -- the ones shipped with the package (measured on an
H200) and the user's own -- keeps the newest of each (device, suite, case, implementation), and
writes ``report.md`` (and ``report.html`` with ``--html``) to ``--out`` (default: the folder
records are written to, ``$MINIMAX_LAB_RESULTS`` or ``./results``). For each device:

* its two measured ceilings (copy bandwidth, matrix-multiply rate);
* per suite, the full table: every case and implementation, the peers beside ours, time,
  TFLOP/s or GB/s, the percentage of the ceiling, each ratio to a peer timed in the same run, the
  suite's own measured fields, and the commit each row was measured at;
* per suite, its targets (a suite module's ``TARGETS``, see :func:`evaluate_targets`) met or not;
* per suite, the provenance: commits, dates, torch and triton versions;
* the records that pass 100% of their ceiling, and why a record can.

:func:`build_page` returns the page as blocks (:class:`Page`); :func:`to_markdown` and
:func:`to_html` render it; :func:`main` is the command line.
"""
from __future__ import annotations

import dataclasses
import html
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from minimax_lab import resources
from minimax_lab.bench.parsing import Parser
from minimax_lab.measure.records import load_records
from minimax_lab.bench.suites import SUITES

#: the device whose records are shipped; listed first
RECORDED_DEVICE = "NVIDIA H200"
#: fields every table has its own column (or a provenance column) for, or that only serve bookkeeping
_SHOWN = ("case", "impl", "ms", "tflops", "gbps", "pct_of_ceiling", "ceiling", "speedup_vs", "commit")
_BOOKKEEPING = {"suite", "when", "device", "interpreter", "torch", "triton", "shape", "dtype", "timing_method",
                "p20_ms", "p80_ms", "reps", "peers_ms", "bytes_counted", "flops_counted", "commit_note", "notes",
                "method", "note", "check", "config", "autotune_ms"}
#: why a record can pass 100% of its ceiling, by ceiling
_OVER_CEILING = {
    "gemm": "the FLOPs counted are those of the dense operator; a sparse kernel skips most of them, so the "
            "percentage says how much sooner than dense-at-peak it finished, not how busy the matrix units were",
    "copy": "the copy ceiling is a copy, half reads and half writes; a kernel that almost only reads (decode) can "
            "stream slightly faster than a read/write mix, and a timing mistake (no synchronize) divides the bytes "
            "by the launch time alone",
}


@dataclasses.dataclass
class Block:
    """One piece of the page: ``kind`` is ``"h1"``, ``"h2"``, ``"h3"``, ``"p"`` or ``"table"``
    (``text`` for headings and paragraphs; ``header`` and ``rows`` for a table)."""

    kind: str
    text: str = ""
    header: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()


@dataclasses.dataclass
class Page:
    """The report as blocks, in reading order."""

    title: str
    blocks: list[Block]


# --------------------------------------------------------------------------- formatting one value


def _num(v: Any, digits: int = 4) -> str:
    if v is None or v == "":
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 10 ** digits else f"{v:.{digits}g}"
    return str(v)


def _cell(v: Any) -> str:
    """A table cell: numbers formatted, dicts and lists as ``k=v`` pairs, newlines flattened."""
    if isinstance(v, Mapping):
        return ", ".join(f"{k}={_num(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return ", ".join(_num(x) for x in v)
    return _num(v).replace("\n", " ")


def _peers(r: Mapping) -> str:
    ratios = r.get("speedup_vs") or {}
    return ", ".join(f"{name} {x:.2f}x" for name, x in ratios.items() if isinstance(x, (int, float)))


def _pct(r: Mapping) -> str:
    pct = r.get("pct_of_ceiling")
    return f"{pct:.0f}% of {r.get('ceiling', '?')}" if isinstance(pct, (int, float)) else ""


def _short_commit(r: Mapping) -> str:
    c = str(r.get("commit") or "")
    return c[:12] + ("-dirty" if c.endswith("-dirty") and len(c) > 18 else "")


# --------------------------------------------------------------------------- the parts of the page


def _extra_fields(records: Sequence[Mapping]) -> list[str]:
    """The suite's own scalar fields worth a column: present in at least half of its records."""
    counts: dict[str, int] = {}
    for r in records:
        for k, v in r.items():
            if k in _SHOWN or k in _BOOKKEEPING or isinstance(v, (dict, list)) or v is None:
                continue
            counts[k] = counts.get(k, 0) + 1
    return [k for k, n in counts.items() if 2 * n >= len(records)]


def suite_table(records: Sequence[Mapping]) -> Block:
    """One suite's records as a table: the standard columns a record has, then the suite's own."""
    has = lambda key: any(r.get(key) not in (None, "", {}) for r in records)  # noqa: E731
    columns = [("case", lambda r: r.get("case", "")), ("impl", lambda r: r.get("impl", "")),
               ("ms", lambda r: _num(r.get("ms")))]
    if has("tflops"):
        columns.append(("TFLOP/s", lambda r: _num(r.get("tflops"))))
    if has("gbps"):
        columns.append(("GB/s", lambda r: _num(r.get("gbps"))))
    if has("pct_of_ceiling"):
        columns.append(("% of ceiling", _pct))
    if has("speedup_vs"):
        columns.append(("vs peers (peer ms / ms)", _peers))
    columns += [(k, (lambda k: lambda r: _cell(r.get(k)))(k)) for k in _extra_fields(records)]
    if has("shape"):
        columns.append(("shape", lambda r: _cell(r.get("shape"))))
    columns.append(("commit", _short_commit))
    if has("notes") or has("commit_note"):
        columns.append(("notes", lambda r: _cell(r.get("notes") or r.get("commit_note") or "")))
    rows = tuple(tuple(fmt(r) for _, fmt in columns) for r in records)
    return Block("table", header=tuple(name for name, _ in columns), rows=rows)


def provenance_table(records: Sequence[Mapping]) -> Block:
    """Which commits, dates and versions a suite's records come from: one row per commit."""
    by_commit: dict[str, list[Mapping]] = {}
    for r in records:
        by_commit.setdefault(str(r.get("commit") or "unknown"), []).append(r)
    rows = []
    for commit, recs in sorted(by_commit.items(), key=lambda kv: min(str(r.get("when", "")) for r in kv[1])):
        when = sorted(str(r.get("when", ""))[:10] for r in recs)
        versions = sorted({f"torch {r.get('torch', '?')}, triton {r.get('triton', '?')}" for r in recs})
        interp = "yes" if any(r.get("interpreter") for r in recs) else "no"
        rows.append((commit, str(len(recs)), when[0] if when[0] == when[-1] else f"{when[0]} .. {when[-1]}",
                     "; ".join(versions), interp))
    return Block("table", header=("commit", "records", "measured", "versions", "Triton interpreter"), rows=tuple(rows))


def evaluate_targets(records: Sequence[Mapping], targets: Sequence[Mapping]) -> Block:
    """A suite's targets against its records, one row each: what, the value, the bound, met or not.

    A target is a dict: ``what`` (the sentence), ``case`` and ``impl`` (the record), ``metric`` (a
    field of the record, e.g. ``"pct_of_ceiling"`` or ``"speedup_vs.sdpa_flash"`` for a nested
    one) and ``at_least`` or ``at_most``. A target without its record reads "not recorded".
    Raises ValueError for a target that names neither bound."""
    rows = []
    for t in targets:
        if ("at_least" in t) == ("at_most" in t):
            raise ValueError(f"target {t.get('what', t)!r} needs exactly one of at_least / at_most")
        rec = next((r for r in records if r.get("case") == t.get("case") and r.get("impl") == t.get("impl")), None)
        value: Any = rec
        for part in str(t.get("metric", "")).split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        bound = f">= {_num(t['at_least'])}" if "at_least" in t else f"<= {_num(t['at_most'])}"
        if not isinstance(value, (int, float)):
            verdict = "not recorded"
        else:
            met = value >= t["at_least"] if "at_least" in t else value <= t["at_most"]
            verdict = "met" if met else "not met"
        rows.append((str(t.get("what", "")), f"{t.get('case')} [{t.get('impl')}]", str(t.get("metric")),
                     _num(value) if isinstance(value, (int, float)) else "", bound, verdict))
    return Block("table", header=("target", "record", "metric", "value", "bound", "verdict"), rows=tuple(rows))


def _by_case(records: Sequence[Mapping]) -> list[Mapping]:
    """The records with each case's rows together, cases in the order they first appear."""
    first = {}
    for i, r in enumerate(records):
        first.setdefault(r.get("case"), i)
    return sorted(records, key=lambda r: first[r.get("case")])


def _ceilings_paragraph(records: Sequence[Mapping]) -> str:
    copy = next((r.get("gbps") for r in records if r.get("suite") == "ceilings" and r.get("case") == "copy"), None)
    gemm = [(r["case"], r.get("tflops")) for r in records if r.get("suite") == "ceilings" and r["case"].startswith("gemm")]
    if copy is None and not gemm:
        return ("No ceilings recorded for this device: `python -m minimax_lab.bench ceilings` measures them, and "
                "the percentages below need them.")
    parts = ([f"copy {copy:,.0f} GB/s (bytes read + written)"] if copy else []) + \
        [f"{case.replace('gemm_', '')} matrix multiply {t:,.0f} TFLOP/s" for case, t in gemm if t]
    return "Measured ceilings: " + "; ".join(parts) + "."


def _over_ceiling(records: Sequence[Mapping]) -> list[Block]:
    over = [r for r in records if isinstance(r.get("pct_of_ceiling"), (int, float)) and r["pct_of_ceiling"] > 100]
    if not over:
        return []
    blocks = [Block("h3", "Records past 100% of their ceiling")]
    for ceiling in sorted({str(r.get("ceiling")) for r in over}):
        if ceiling in _OVER_CEILING:
            blocks.append(Block("p", f"Past the {ceiling} ceiling: {_OVER_CEILING[ceiling]}."))
    rows = tuple((r["suite"], r["case"], r["impl"], _pct(r)) for r in sorted(over, key=lambda r: -r["pct_of_ceiling"]))
    blocks.append(Block("table", header=("suite", "case", "impl", "% of ceiling"), rows=rows))
    return blocks


def build_page(records: Sequence[Mapping], *, targets: Mapping[str, Sequence[Mapping]] | None = None,
               title: str = "Benchmark records") -> Page:
    """The page for ``records`` (newest per key already chosen, e.g. by :func:`load_records`): per
    device (the recorded H200 first), its ceilings, then per suite its table, targets (from
    ``targets``: suite -> list of target dicts; default: each suite module's ``TARGETS``) and
    provenance, then the records past their ceiling."""
    if targets is None:
        targets = {name: getattr(module, "TARGETS", ()) for name, module in SUITES.items()}
    blocks = [Block("p", "Every benchmark record, newest per device, suite, case and implementation. Times are "
                         "medians in milliseconds. \"vs peers\" is each peer's time over the row's, measured in the "
                         "same run: above 1 the row is faster than that peer. Percentages are of the device's own "
                         "measured ceiling: TFLOP/s of the matrix-multiply rate, GB/s of the copy bandwidth.")]
    devices = sorted({str(r.get("device")) for r in records}, key=lambda d: (d != RECORDED_DEVICE, d))
    if not devices:
        blocks.append(Block("p", "No records found. `python -m minimax_lab.bench all` on a GPU writes them."))
    for device in devices:
        recs = [r for r in records if str(r.get("device")) == device]
        interp = " (Triton interpreter on a CPU: these times are not a GPU's)" if any(r.get("interpreter") for r in recs) else ""
        blocks += [Block("h2", f"{device}{interp}"), Block("p", _ceilings_paragraph(recs))]
        suites = list(dict.fromkeys(str(r.get("suite")) for r in recs))
        for suite in sorted(suites, key=lambda s: (list(SUITES).index(s) if s in SUITES else 99, s)):
            srecs = _by_case([r for r in recs if r.get("suite") == suite])
            blocks += [Block("h3", f"Suite `{suite}`: {len(srecs)} records"), suite_table(srecs)]
            if targets.get(suite):
                blocks += [Block("p", "Targets:"), evaluate_targets(srecs, targets[suite])]
            blocks += [Block("p", "Provenance:"), provenance_table(srecs)]
        blocks += _over_ceiling(recs)
    return Page(title, blocks)


# --------------------------------------------------------------------------- rendering


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(page: Page) -> str:
    """The page as Markdown (GitHub tables)."""
    out = [f"# {page.title}", ""]
    for b in page.blocks:
        if b.kind in ("h1", "h2", "h3"):
            out += ["#" * int(b.kind[1]) + " " + b.text, ""]
        elif b.kind == "p":
            out += [b.text, ""]
        elif b.kind == "table":
            out.append("| " + " | ".join(_md_escape(h) for h in b.header) + " |")
            out.append("|" + "---|" * len(b.header))
            out += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in b.rows]
            out.append("")
        else:
            raise ValueError(f"unknown block kind {b.kind!r}")
    return "\n".join(out)


def _inline_html(text: str) -> str:
    """Escaped text with `code` spans."""
    parts = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def to_html(page: Page) -> str:
    """The page as one self-contained HTML file."""
    out = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>", f"<title>{html.escape(page.title)}</title>",
           "<style>body{font-family:sans-serif;margin:2em;max-width:110em}table{border-collapse:collapse;"
           "margin:0.5em 0 1.5em;font-size:0.85em}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}"
           "th{background:#f3f3f3}tr:nth-child(even){background:#fafafa}</style>", "</head><body>",
           f"<h1>{html.escape(page.title)}</h1>"]
    for b in page.blocks:
        if b.kind in ("h1", "h2", "h3"):
            out.append(f"<{b.kind}>{_inline_html(b.text)}</{b.kind}>")
        elif b.kind == "p":
            out.append(f"<p>{_inline_html(b.text)}</p>")
        elif b.kind == "table":
            out.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in b.header) + "</tr>")
            out += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in b.rows]
            out.append("</table>")
        else:
            raise ValueError(f"unknown block kind {b.kind!r}")
    out.append("</body></html>")
    return "\n".join(out)


# --------------------------------------------------------------------------- command line


def write_report(out_dir: Path, *, html_too: bool = False, devices: Sequence[str] | None = None,
                 suites: Sequence[str] | None = None) -> list[Path]:
    """Build the page from every record found (filtered by ``devices`` and ``suites``) and write
    ``report.md`` (and ``report.html``) into ``out_dir``; returns the files written."""
    records = [r for r in load_records(None)
               if (not devices or r.get("device") in devices) and (not suites or r.get("suite") in suites)]
    page = build_page(records)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "report.md"]
    written[0].write_text(to_markdown(page) + "\n")
    if html_too:
        written.append(out_dir / "report.html")
        written[1].write_text(to_html(page) + "\n")
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m minimax_lab.bench report [--out DIR] [--html] [--device NAME ...] [--suite NAME ...]``.
    Returns 0 when the page was written, 2 for a bad command line or a folder it cannot write."""
    p = Parser(prog="python -m minimax_lab.bench report",
                                description="every benchmark record (shipped and your own) on one page")
    p.add_argument("--out", default=None,
                   help="folder for report.md (default: <results>, $MINIMAX_LAB_RESULTS or ./results)")
    p.add_argument("--html", action="store_true", help="also write report.html")
    p.add_argument("--device", nargs="+", default=None, metavar="NAME", help="only these devices, e.g. 'NVIDIA H200'")
    p.add_argument("--suite", nargs="+", default=None, metavar="NAME", help="only these suites")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    found = {str(r.get("suite")) for r in load_records(None)}
    unknown = [s for s in args.suite or () if s not in found and s not in SUITES]
    if unknown:
        p.error(f"unknown suite(s) {unknown}; records exist for {', '.join(sorted(found)) or 'none'}")
    out_dir = Path(args.out) if args.out else resources.user_results_dir()
    try:
        written = write_report(out_dir, html_too=args.html, devices=args.device, suites=args.suite)
    except OSError as e:
        print(f"report: cannot write to {out_dir}: {e.strerror or e}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
