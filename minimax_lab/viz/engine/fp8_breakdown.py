"""What FP8 storage saves and where it moves the logits: the memory of the experts and the KV cache
in the model's dtype and in FP8 (:func:`memory_lines`), and the rows of
:func:`minimax_lab.engine.quality.fp8_breakdown` as a table and in computed words.
"""
from __future__ import annotations

from minimax_lab.engine.config import GPU, kv_bytes_per_token, param_count
from minimax_lab.notebook import words


def memory_lines(cfg=GPU) -> list[str]:
    """What FP8 storage saves at ``cfg``'s size (default the GPU size, named in the first line):
    the experts' weights and the KV cache per token, in the model's dtype and in FP8 with their scales."""
    elt = 2 if cfg.dtype == "bfloat16" else 4
    experts = cfg.n_layers * cfg.n_experts * 3 * cfg.d_model * cfg.d_expert
    scales = cfg.n_layers * cfg.n_experts * (2 * cfg.d_expert + cfg.d_model) * 4
    kv, kv8 = kv_bytes_per_token(cfg), kv_bytes_per_token(cfg, "fp8_e4m3")
    size = f"{param_count(cfg) / 1e9:.1f} B" if param_count(cfg) >= 1e8 else f"{param_count(cfg):,}"
    return [f"at the size of the {'GPU' if cfg == GPU else 'given'} model ({size} parameters, {cfg.dtype}):",
            f"  experts: {experts * elt / 2**30:.2f} GiB in {cfg.dtype} -> {(experts + scales) / 2**30:.2f} GiB in FP8 "
            f"with scales", f"  KV cache per token: {kv:,} B in {cfg.dtype} -> {kv8:,} B in FP8 with scales; "
            f"a 128k-token context {131_072 * kv / 2**30:.2f} -> {131_072 * kv8 / 2**30:.2f} GiB"]


def _component(r: dict) -> str:
    return r["component"] + ("" if r["layer"] is None else f", layer {r['layer']}")


def format_breakdown(rows: list) -> str:
    """The rows of :func:`minimax_lab.engine.quality.fp8_breakdown` as a plain-text table."""
    lines = [f"{'in FP8':22s} {'pooled err':>10s} {'token p50':>9s} {'token max':>9s} {'top-1':>6s} "
             f"{'selections changed':>19s} {'closest margin':>14s} {'err, selections kept':>21s}"]
    for r in rows:
        margin = "-" if r["closest_margin"] is None else f"{r['closest_margin']:.2%}"
        kept = "-" if r.get("err_selections_kept") is None else f"{r['err_selections_kept']:.2%}"
        lines.append(f"{_component(r):22s} {r['logits_rel_err']:10.2%} {r['token_err_p50']:9.2%} {r['token_err_max']:9.2%} "
                     f"{r['top1_agreement']:6.0%} {r['selection_flips']:>8d} of {r['selections']:<8d} {margin:>14s} "
                     f"{kept:>21s}")
    return "\n".join(lines)


def breakdown_lines(rows: list) -> list[str]:
    """What the rows of :func:`minimax_lab.engine.quality.fp8_breakdown` show, every number and comparison word computed from
    them: how close the changed selections were, and for each component that changed any whether
    keeping the full-precision selections removes its error (the flips carry it) or not (the
    rounding itself does)."""
    flipped = [r for r in rows if r["selection_flips"] and r.get("err_selections_kept") is not None]
    if not flipped:
        return ["No FP8 component changed an MSA selection here: the error is the rounding's own."]
    lo = min(r["closest_margin"] for r in flipped if r["closest_margin"] is not None)
    hi = max(r["widest_margin"] for r in flipped if r["widest_margin"] is not None)
    span = f"{lo:.2%}" if f"{lo:.2%}" == f"{hi:.2%}" else f"{lo:.2%} to {hi:.2%}"
    out = [f"Every selection that changed had two blocks within {span} of each other in full precision."]
    for r in flipped:
        err, kept = r["logits_rel_err"], r["err_selections_kept"]
        if not err > 0:
            n = r["selection_flips"]
            out.append(f"{_component(r)}: {n} selection{'s' if n > 1 else ''} changed and the answers' logits did not "
                       "move: the change did not reach them.")
            continue
        moved = words.change(100 * err, max(100 * kept, 1e-6), unit="%", digits=3)
        verdict = ("the flipped selections, not the rounding, carry the error" if kept < 0.5 * err else
                   "the rounding itself carries most of the error, not the flips")
        out.append(f"{_component(r)}: with the full-precision selections kept, its pooled error {moved}: {verdict}.")
    return out
