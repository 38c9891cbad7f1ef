"""Each day's logits against day 0's on forced answers: pooled and per-token error, top-1 agreement.
"""
from __future__ import annotations

from typing import Sequence

from minimax_lab.viz.engine.records import _label, _plain, engine_records


def quality_rows(records: Sequence[dict]) -> list[dict]:
    """Each day's logits against day 0's on forced answers: ``{case, day, label, logits_rel_err,
    token_err_p50, top1_agreement, compared_tokens}`` from the records that carry them (one per
    case and day: ``.e2e`` and ``agent_long.ttft_followup``), by case then day."""
    rows = []
    for r in engine_records(records):
        if not (r["case"].endswith(".e2e") or r["case"] == "agent_long.ttft_followup") or not _plain(r):
            continue
        if r.get("logits_rel_err") is None:
            continue
        rows.append({"case": r["case"].split(".")[0], "day": r["day"], "label": r.get("label") or _label(r["day"]),
                     "logits_rel_err": r["logits_rel_err"], "token_err_p50": r.get("token_err_p50"),
                     "top1_agreement": r.get("top1_agreement"), "compared_tokens": r.get("compared_tokens")})
    return sorted(rows, key=lambda x: (x["case"], x["day"]))


def format_quality(records: Sequence[dict]) -> str:
    """:func:`quality_rows` as a plain-text table."""
    rows = quality_rows(records)
    if not rows:
        return "(no quality figures in these records)"
    lines = [f"{'case':11s} {'day':36s} {'pooled err':>10s} {'median token err':>16s} {'top-1 = day 0':>13s} "
             f"{'tokens':>6s}"]
    for r in rows:
        top1 = "-" if r["top1_agreement"] is None else f"{r['top1_agreement']:.1%}"
        p50 = "-" if r["token_err_p50"] is None else f"{r['token_err_p50']:.2%}"
        lines.append(f"{r['case']:11s} {r['label'][:36]:36s} {r['logits_rel_err']:10.2%} {p50:>16s} {top1:>13s} "
                     f"{r['compared_tokens'] or 0:>6d}")
    return "\n".join(lines)
