"""The recorded GPU numbers chapter 04 draws: MSA's prefill and backward against dense attention,
the index branch against the sparse part, and the KV-outer schedule's memory floor.

Every figure names the device and the versions its records were taken with, draws each timing's
p20-p80 spread as an error bar, and every comparison word beside it is computed from the records
(:func:`minimax_lab.viz.noise.speed_words`: "level with" where the spreads overlap). Where no record
exists the functions say so, and name the command that writes one.

* :func:`gpu_figure` -- the chapter's figure: the prefill, and the backward where it is recorded;
* :func:`prefill_figure`, :func:`gpu_summary` -- the prefill, end to end, against dense attention
  and the sparse peers;
* :func:`backward_figure`, :func:`backward_summary` -- the forward + backward (training's attention
  step), at the lengths where a GPU recorded it, and which lengths have no record;
* :func:`index_growth` -- the index branch's time against the sparse part's as the context grows;
* :func:`kv_outer_floor` -- the KV-outer sparse part's bytes and the time they take at copy speed;
* :func:`provenance_rows` -- the records' devices, versions, dates and timing, for the chapter's
  last cell.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import matplotlib.pyplot as plt

from minimax_lab import measure
from minimax_lab.attention import MSA_SHAPE
from minimax_lab.bench.suite_msa import LENGTHS
from minimax_lab.notebook import recorded
from minimax_lab.viz import noise

#: the prefill implementations the chapter draws: record impl -> label
PREFILL_IMPLS = {"triton_kv": "MSA, KV-outer (the package's kernels)", "triton_query": "MSA, query-outer",
                 "sglang_triton": "SGLang's Triton MSA", "flex_msa_mask": "FlexAttention, same sparse output",
                 "sdpa_cudnn": "dense causal attention (cuDNN)"}
#: the backward implementations: record impl -> label
BACKWARD_IMPLS = {"triton_fwd_bwd": "MSA forward + backward (Triton)", "triton_bwd": "MSA backward alone (Triton)",
                  "sdpa_cudnn": "dense forward + backward (cuDNN)", "sdpa_flash": "dense forward + backward (FlashAttention-2)"}
#: the command that records the backward cases on a GPU
BACKWARD_COMMAND = "python -m minimax_lab.bench msa --cases backward"


def recorded_on(recs: Iterable[Mapping]) -> str:
    """``'NVIDIA H200 (torch 2.11.0+cu130, Triton 3.6.0)'``: where a set of records was measured."""
    seen = sorted({(r.get("device"), r.get("torch"), r.get("triton")) for r in recs})
    return "; ".join(f"{d} (torch {t}, Triton {tr})" for d, t, tr in seen) or "no records"


def _k(S: int) -> str:
    return f"{S // 1024}k"


def _draw(ax, rows: Mapping[str, list[dict]], labels: Mapping[str, str], ours: str):
    """One line per impl: ``ms`` against ``S``, p20-p80 as error bars."""
    for impl, recs in rows.items():
        recs = sorted(recs, key=lambda r: r["shape"]["S"])
        S = [r["shape"]["S"] for r in recs]
        ms = [r["ms"] for r in recs]
        err = [[r["ms"] - r.get("p20_ms", r["ms"]) for r in recs], [r.get("p80_ms", r["ms"]) - r["ms"] for r in recs]]
        ax.errorbar(S, ms, yerr=err, fmt="o-" if impl.startswith("triton") else "s--", capsize=3,
                    lw=2.5 if impl == ours else 1.2, label=labels[impl])
    ticks = sorted({r["shape"]["S"] for recs in rows.values() for r in recs})
    ax.set(xscale="log", yscale="log", xlabel="sequence length S (tokens)")
    ax.set_xticks(ticks, [_k(s) for s in ticks])
    ax.minorticks_off()
    ax.legend(fontsize=10, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _shape_words() -> str:
    sh = MSA_SHAPE
    return f"bf16, Hq={sh['Hq']}, G={sh['G']}, D={sh['D']}, Bk={sh['Bk']}, topk={sh['topk']}"


def prefill_records() -> dict[str, list[dict]]:
    """The recorded prefill per layer, end to end, up to 128k tokens: impl -> records."""
    rows = {impl: [r for r in recorded.all_of("msa", impl=impl)
                   if r["case"].startswith("prefill_s") and r["shape"]["S"] <= 131072] for impl in PREFILL_IMPLS}
    return {impl: recs for impl, recs in rows.items() if recs}


def _figure(rows: Mapping[str, list[dict]], labels: Mapping[str, str], ours: str, what: str, ylabel: str, ax=None):
    """Records against ``S`` on ``ax`` (or a new figure), titled with ``what``, where and with which
    versions they were recorded, and MSA's shape; None when ``rows`` is empty."""
    if not rows:
        return None
    fig = ax.figure if ax is not None else plt.figure(figsize=(9, 4.6))
    ax = ax or fig.add_subplot()
    _draw(ax, rows, labels, ours)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{what}, recorded on {recorded_on(r for recs in rows.values() for r in recs)}\n"
                 f"({_shape_words()}; error bars p20-p80)", fontsize=10)
    fig.tight_layout()
    return fig


def prefill_figure(ax=None):
    """Recorded MSA prefill time per layer against the sequence length, beside dense attention and
    the sparse peers (p20-p80 error bars); None when nothing is recorded."""
    return _figure(prefill_records(), PREFILL_IMPLS, "triton_kv", "MSA prefill", "prefill time per layer (ms)", ax)


def gpu_figure():
    """The chapter's GPU figure: :func:`prefill_figure`, and :func:`backward_figure` below it where
    a GPU recorded MSA's backward; None when nothing is recorded."""
    panels = [f for f, recs in ((prefill_figure, prefill_records()), (backward_figure, backward_records())) if recs]
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 4.6 * len(panels)), squeeze=False)
    for draw, ax in zip(panels, axes[:, 0]):
        draw(ax)
    fig.tight_layout()
    return fig


def gpu_summary(S: int = 131072) -> str:
    """At most three sentences on the recorded prefill (at ``S``, and the schedules at 64k),
    comparison words computed from the records and their spreads."""
    one = lambda case, impl: recorded.one("msa", case, impl)  # noqa: E731
    ours, cudnn, sglang = (one(f"prefill_s{S}", i) for i in ("triton_kv", "sdpa_cudnn", "sglang_triton"))
    if not (ours and cudnn and sglang):
        return "No prefill records yet: `python -m minimax_lab.bench msa --cases prefill` on a GPU makes them."
    out = [f"At S = {_k(S)} on the {recorded_on([ours])}, the KV-outer prefill takes {ours['ms']:.1f} ms per layer: "
           f"{noise.speed_words(ours, cudnn)} dense cuDNN ({cudnn['ms']:.1f} ms) and "
           f"{noise.speed_words(ours, sglang)} SGLang's Triton MSA ({sglang['ms']:.1f} ms)."]
    kv, query, flex = (one("prefill_s65536", i) for i in ("triton_kv", "triton_query", "flex_msa_mask"))
    if kv and query and flex:
        out.append(f"At 64k the KV-outer schedule ({kv['ms']:.1f} ms) is {noise.speed_words(kv, query)} query-outer "
                   f"({query['ms']:.1f} ms) and {noise.speed_words(kv, flex)} FlexAttention given the selection as a "
                   f"block mask ({flex['ms']:.0f} ms).")
    return "\n".join(out)


def backward_records() -> dict[str, list[dict]]:
    """The recorded ``backward_s{S}`` cases of the ``msa`` suite at MSA's shape, on any GPU (the
    CPU preset's tiny check is not a timing): impl -> records."""
    recs = [r for r in measure.load_records(None, suite="msa")
            if str(r.get("case", "")).startswith("backward_s") and not r.get("interpreter")
            and r.get("shape", {}).get("Hq") == MSA_SHAPE["Hq"]]
    rows = {impl: [r for r in recs if r.get("impl") == impl] for impl in BACKWARD_IMPLS}
    return {impl: rs for impl, rs in rows.items() if rs}


def backward_figure(ax=None):
    """Recorded forward + backward time per layer against the sequence length, ours against dense
    attention's (p20-p80 error bars); None when no GPU recorded it."""
    return _figure(backward_records(), BACKWARD_IMPLS, "triton_fwd_bwd", "training's attention step",
                   "time per layer (ms)", ax)


def backward_summary(lengths: Iterable[int] = LENGTHS) -> str:
    """Per length: ours (forward + backward) against the faster dense peer recorded beside it, in
    words computed from the records; and plainly the lengths no GPU recorded."""
    rows = backward_records()
    ours = {r["shape"]["S"]: r for r in rows.get("triton_fwd_bwd", [])}
    lines, missing = [], []
    for S in lengths:
        r = ours.get(S)
        if r is None:
            missing.append(_k(S))
            continue
        dense = [d for impl in ("sdpa_cudnn", "sdpa_flash") for d in rows.get(impl, [])
                 if d["shape"]["S"] == S and d["device"] == r["device"]]
        best = min(dense, key=lambda d: d["ms"]) if dense else None
        vs = (f", {noise.speed_words(r, best)} dense {BACKWARD_IMPLS[best['impl']].split('(')[1][:-1]} "
              f"({best['ms']:.1f} ms)") if best else ", no dense peer recorded beside it"
        lines.append(f"S = {_k(S)} on the {recorded_on([r])}: MSA forward + backward {r['ms']:.1f} ms{vs}.")
    if missing:
        lines.append(f"No GPU record of MSA's backward at {', '.join(missing)} tokens: `{BACKWARD_COMMAND}` on a GPU "
                     "writes them, and this cell then draws them.")
    return "\n".join(lines)


def index_growth(lengths: Iterable[int] = LENGTHS) -> str:
    """The index branch's recorded time (scores + top-k) against the sparse attention's as ``S``
    doubles, and the length where, counted in FLOPs at MSA's shape, the two are equal."""
    sh = MSA_SHAPE
    # index: G queries of D_idx against every earlier key (G * D_idx * S^2 FLOPs, causal);
    # attention: Hq heads, 4 * D FLOPs per selected key, topk * Bk keys per query
    equal_at = 4 * sh["D"] * sh["Hq"] * sh["topk"] * sh["Bk"] // (sh["G"] * sh["Didx"])
    idx = [recorded.one("msa", f"index_s{S}", "triton_fused_topk") for S in lengths]
    sparse = [recorded.one("msa", f"sparse_attn_s{S}", "triton_kv") for S in lengths]
    flops = (f"Counted in FLOPs at MSA's shape the two are equal at S = {equal_at:,} ({_k(equal_at)}); "
             "past it the index branch is the larger term.")
    if not (all(idx) and all(sparse)):
        return "No records of the index branch and the sparse part timed apart yet. " + flops
    grow = lambda rs: " and ".join(f"{b['ms'] / a['ms']:.1f}x" for a, b in zip(rs, rs[1:]))  # noqa: E731
    times = lambda rs: ", ".join(f"{r['ms']:.1f}" for r in rs)  # noqa: E731
    sizes = ", ".join(_k(S) for S in lengths)
    return (f"Recorded on the {recorded_on(idx + sparse)}, at {sizes} tokens: the index branch (scores and top-k) "
            f"takes {times(idx)} ms, growing {grow(idx)} per doubling (as S²); the sparse attention takes "
            f"{times(sparse)} ms, growing {grow(sparse)} (as S). " + flops)


def kv_outer_floor(S: int = 131072) -> str:
    """The KV-outer sparse part's memory traffic at ``S`` (gathered query rows, partial outputs
    written, read back by the merge) and the time it needs at the recorded copy bandwidth, against
    the recorded time of the sparse part."""
    ours = recorded.one("msa", f"prefill_s{S}", "triton_kv")
    sparse = recorded.one("msa", f"sparse_attn_s{S}", "triton_kv")
    copy = recorded.one("ceilings", "copy", "torch.copy_")
    if not (ours and sparse and copy and ours.get("selected_pairs_per_head")):
        return "No records of the sparse part and the copy bandwidth yet."
    sh = ours["shape"]
    entries = ours["selected_pairs_per_head"] / sh["Bk"] * sh["G"]  # (token, group, selected block) entries
    stream = entries * (sh["Hq"] // sh["G"]) * sh["D"] * 2          # one stream of bf16 rows
    total = 3 * stream + S * sh["Hq"] * sh["D"] * 2                 # + the final output
    floor_ms = total / (copy["gbps"] * 1e9) * 1e3
    return (f"S = {_k(S)}: {entries / 1e6:.2f} M (token, group, block) entries move {total / 1e9:.0f} GB; at the "
            f"copy bandwidth recorded on the {recorded_on([copy])} ({copy['gbps'] / 1e3:.2f} TB/s) that takes "
            f"{floor_ms:.1f} ms, and the sparse part takes {sparse['ms']:.1f} ms: it moves its bytes at "
            f"{floor_ms / sparse['ms']:.0%} of copy speed, so a faster kernel of this schedule could win at most "
            f"{sparse['ms'] - floor_ms:.1f} ms")


def provenance_rows() -> list[str]:
    """Markdown lines: the records the chapter draws, where and how they were taken, and what is missing."""
    used = [r for recs in prefill_records().values() for r in recs]
    used += [r for r in (recorded.one("msa", f"{c}_s{S}", i) for S in LENGTHS
                         for c, i in (("index", "triton_fused_topk"), ("sparse_attn", "triton_kv"))) if r]
    rows = []
    if used:
        dates = sorted({str(r.get("when", ""))[:10] for r in used if r.get("when")})
        rows.append(f"- the prefill, index and sparse-part numbers: {len(used)} records of the `msa` bench suite "
                    f"(`python -m minimax_lab.bench msa`) on the {recorded_on(used)}, {dates[0]} to {dates[-1]}; "
                    f"each the median of {sorted({r.get('reps') for r in used})[-1]} calls timed by "
                    f"{'; '.join(sorted({r.get('timing_method', '?') for r in used}))}, error bars p20-p80")
    bwd = [r for rs in backward_records().values() for r in rs]
    rows.append(f"- MSA's backward at MSA's shape: {len(bwd)} records on {recorded_on(bwd)}" if bwd else
                f"- MSA's backward at MSA's shape: no GPU record yet (`{BACKWARD_COMMAND}` writes them)")
    return rows
