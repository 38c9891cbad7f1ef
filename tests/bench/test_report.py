"""The bench report: every record on one page, with peers, ratios, % of ceiling, targets and provenance."""
from __future__ import annotations

import json
import re

import pytest

from minimax_lab.bench import report


def rec(case, impl, ms, *, device="NVIDIA H200", suite="attention", commit="0cab47e7e431", **extra):
    return {"device": device, "suite": suite, "case": case, "impl": impl, "ms": ms, "commit": commit,
            "when": "2026-12-04T10:00:00+00:00", "torch": "2.11.0+cu130", "triton": "3.6.0", "interpreter": False,
            "shape": {"S": 16384}, **extra}


RECORDS = [
    rec("copy", "torch.copy_", 1.0, suite="ceilings", gbps=4270.4, commit="580080af7a8819796b2bb4ee65562e3addb5c35f"),
    rec("s16k", "triton", 8.0, tflops=545.4, pct_of_ceiling=68.3, ceiling="gemm",
        speedup_vs={"sdpa_flash": 1.581, "flex_compiled": 1.284}),
    rec("s64k", "triton", 31.7, tflops=554.6, pct_of_ceiling=69.4, ceiling="gemm"),
    rec("s16k", "sdpa_flash", 12.7, tflops=345.0, pct_of_ceiling=43.2, ceiling="gemm", commit="fcf000c"),
    rec("prefill", "triton_kv", 11.7, suite="msa", tflops=1498.0, pct_of_ceiling=186.0, ceiling="gemm",
        regime="prefill", notes="a | pipe"),
    rec("s16k", "triton", 900.0, device="CPU x86_64", interpreter=True, tflops=0.001),
]


def tables(page):
    return [b for b in page.blocks if b.kind == "table"]


def test_page_holds_every_record_with_peers_ratios_ceiling_and_commit():
    page = report.build_page(RECORDS, targets={})
    heads = [b.text for b in page.blocks if b.kind == "h2"]
    assert heads == ["NVIDIA H200", "CPU x86_64 (Triton interpreter on a CPU: these times are not a GPU's)"]
    attention = next(t for t in tables(page) if "vs peers (peer ms / ms)" in t.header)
    rows = [dict(zip(attention.header, r)) for r in attention.rows]
    assert [(r["case"], r["impl"]) for r in rows] == [("s16k", "triton"), ("s16k", "sdpa_flash"), ("s64k", "triton")]
    assert rows[0]["vs peers (peer ms / ms)"] == "sdpa_flash 1.58x, flex_compiled 1.28x"
    assert rows[0]["% of ceiling"] == "68% of gemm" and rows[0]["TFLOP/s"] == "545.4"
    assert rows[0]["commit"] == "0cab47e7e431" and rows[1]["commit"] == "fcf000c"
    msa = next(t for t in tables(page) if "regime" in t.header)          # a suite's own field gets a column
    assert dict(zip(msa.header, msa.rows[0]))["notes"] == "a | pipe"
    paragraphs = " ".join(b.text for b in page.blocks if b.kind == "p")
    assert "copy 4,270 GB/s" in paragraphs
    provenance = [t for t in tables(page) if t.header[0] == "commit"]
    assert {r[0] for t in provenance for r in t.rows} >= {"0cab47e7e431", "fcf000c",
                                                           "580080af7a8819796b2bb4ee65562e3addb5c35f"}


def test_records_past_their_ceiling_are_listed_with_the_reason():
    page = report.build_page(RECORDS, targets={})
    i = next(i for i, b in enumerate(page.blocks) if b.text == "Records past 100% of their ceiling")
    assert "dense operator" in page.blocks[i + 1].text
    assert page.blocks[i + 2].rows == (("msa", "prefill", "triton_kv", "186% of gemm"),)
    quiet = report.build_page([r for r in RECORDS if r["suite"] != "msa"], targets={})
    assert not any(b.text == "Records past 100% of their ceiling" for b in quiet.blocks)


def test_targets_read_met_not_met_or_not_recorded():
    targets = {"attention": [
        {"what": "half the matrix units", "case": "s16k", "impl": "triton", "metric": "pct_of_ceiling", "at_least": 50},
        {"what": "past FA2 by 2x", "case": "s16k", "impl": "triton", "metric": "speedup_vs.sdpa_flash", "at_least": 2},
        {"what": "under 5 ms", "case": "s16k", "impl": "triton", "metric": "ms", "at_most": 5},
        {"what": "a case never run", "case": "s1m", "impl": "triton", "metric": "ms", "at_most": 5}]}
    page = report.build_page(RECORDS, targets=targets)
    t = next(t for t in tables(page) if t.header[0] == "target")
    assert [r[-1] for r in t.rows] == ["met", "not met", "not met", "not recorded"]
    assert t.rows[1][3] == "1.581" and t.rows[1][4] == ">= 2"
    with pytest.raises(ValueError, match="exactly one of at_least"):
        report.evaluate_targets(RECORDS, [{"what": "no bound", "case": "s16k", "impl": "triton", "metric": "ms"}])


def test_markdown_and_html_render_every_row():
    page = report.build_page(RECORDS, targets={})
    md = report.to_markdown(page)
    assert md.startswith("# Benchmark records") and "## NVIDIA H200" in md and "### Suite `attention`" in md
    cells = lambda line: len(re.split(r"(?<!\\)\|", line)) - 2  # noqa: E731 - columns of a Markdown table row
    table_lines = [ln for ln in md.splitlines() if ln.startswith("|")]
    assert len(table_lines) == sum(len(t.rows) + 2 for t in tables(page))
    i = 0
    for t in tables(page):                               # the tables in order: header, rule, one line per row
        assert table_lines[i] == "| " + " | ".join(t.header) + " |"
        assert all(cells(ln) == len(t.header) for ln in table_lines[i:i + len(t.rows) + 2]), t.header
        i += len(t.rows) + 2
    assert "a \\| pipe" in md
    page.blocks.append(report.Block("p", "<script>"))
    out = report.to_html(page)
    assert out.count("<table>") == len(tables(page)) and "&lt;script&gt;" in out and "<code>attention</code>" in out


def test_command_line_writes_the_shipped_records_and_the_users_own(tmp_path, monkeypatch, capsys):
    users = tmp_path / "mine"
    users.mkdir()
    (users / "CPU_x86_64.json").write_text(json.dumps([RECORDS[-1]]))
    monkeypatch.setenv("MINIMAX_LAB_RESULTS", str(users))
    out = tmp_path / "page"
    assert report.main(["--out", str(out), "--html"]) == 0
    md = (out / "report.md").read_text()
    assert "## NVIDIA H200" in md and "### Suite `pitfalls`" in md         # shipped
    assert "## CPU x86_64" in md and "900" in md                             # the user's own
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert "wrote" in capsys.readouterr().out
    assert report.main(["--out", str(out), "--suite", "attention", "--device", "NVIDIA H200"]) == 0
    only = (out / "report.md").read_text()
    assert "### Suite `attention`" in only and "### Suite `msa`" not in only and "CPU x86_64" not in only


def test_command_line_answers_mistakes_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        report.main(["--suite", "no_such_suite"])
    assert e.value.code == 2 and "unknown suite" in capsys.readouterr().err
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    assert report.main(["--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("report: cannot write to") and len(err.strip().splitlines()) == 1
