"""The ``msa`` bench suite's SGLang peer: correctness checks against ours and a float64 brute force,
then timings (see :mod:`minimax_lab.bench.peer_sglang_msa` for how SGLang's kernels are called).

* :func:`peer_status` -- whether the peer runs here, and why not (the suite records it either way).
* :func:`prefill_peer` / :func:`decode_peer` -- check first (selections equal to ours as sets on
  at least :data:`MIN_SETS_EQUAL` of the rows; outputs within the dtype's tolerance of ours and,
  on sampled rows, of a float64 brute force), then time SGLang end to end, index + top-k alone and
  attention alone (decode also under CUDA graphs). SGLang's autotuners are reset first, so each
  case runs the configs they pick at that shape. Raise ``AssertionError`` when a check fails.
"""
from __future__ import annotations

import math

import torch

from minimax_lab import measure
from minimax_lab.bench import peer_sglang_msa as sgl
from minimax_lab.attention.msa_reference import select_from_scores_reference

PEER = "sglang_triton"
MIN_SETS_EQUAL = 0.999
SAMPLED_ROWS = 48


def peer_status() -> dict:
    """``{"available": bool, "reason": str, "sglang": version or None}``."""
    ok, why = sgl.available()
    return {"available": ok, "reason": why, "sglang": sgl.peers.sglang_version() if ok else None}


def _fp64_rows(q, kv_rows, qi, kidx, pos, Bk, topk, scale):
    """One query row in float64: ``q [Hq, D]``, ``kv_rows = (k [L, G, D], v [L, G, D])`` of its
    sequence up to ``pos`` inclusive, ``qi [G, Di]``, ``kidx [L, Di]``. Returns (selection
    ``[G, topk]`` by our rule, output ``[Hq, D]``)."""
    k, v = kv_rows
    L = pos + 1
    G, Di = qi.shape
    Hq, D = q.shape
    tok = (qi.double() @ kidx[:L].double().T) / math.sqrt(Di)            # [G, L]
    nb = math.ceil(L / Bk)
    pad = torch.full((G, nb * Bk), float("-inf"), dtype=torch.float64, device=tok.device)
    pad[:, :L] = tok
    scores = pad.view(G, nb, Bk).amax(-1)
    sel = select_from_scores_reference(scores.cpu(), pos, Bk, topk)
    out = torch.empty(Hq, D, dtype=torch.float64, device=q.device)
    hpg = Hq // G
    for g in range(G):
        blocks = [b for b in sel[g].tolist() if b >= 0]
        idx = torch.cat([torch.arange(b * Bk, min((b + 1) * Bk, L), device=q.device) for b in blocks])
        kk, vv = k[idx, g].double(), v[idx, g].double()
        logits = (q[g * hpg:(g + 1) * hpg].double() @ kk.T) * scale
        out[g * hpg:(g + 1) * hpg] = torch.softmax(logits, -1) @ vv
    return sel, out


def _rows_err(outs: list, refs: list, keep: list) -> float:
    kept = [(o, r) for o, r, k in zip(outs, refs, keep) if k]
    if not kept:
        return math.inf
    return measure.relative_error(torch.stack([o for o, _ in kept]), torch.stack([r for _, r in kept]))


def _brute_check(rows, ours_sel, sgl_sel, ours_o, sgl_o, brute) -> dict:
    """Selection agreement with the brute force (as sets) and output error on the rows whose
    selection matches it, for ours and SGLang."""
    out = {"sampled_rows": len(rows)}
    for name, sel, o in (("ours", ours_sel, ours_o), (PEER, sgl_sel, sgl_o)):
        same = [bool(sgl.selection_sets_equal(sel[r][None], brute_sel[None].to(sel.device))[0].all())
                for r, (brute_sel, _) in zip(rows, brute)]
        out[f"{name}_selection_equal_fp64"] = round(sum(same) / len(same), 6)
        out[f"{name}_rel_err_fp64"] = _rows_err([o[r].double() for r in rows], [b[1] for b in brute], same)
    return out


def _verdict(check: dict, tol: float) -> dict:
    bad = [k for k, v in check.items() if (k.endswith("selection_equal_fp64") or k == "selection_sets_equal")
           and v < MIN_SETS_EQUAL]
    bad += [k for k, v in check.items() if "rel_err" in k and not v <= tol]
    if bad:
        raise AssertionError(f"SGLang MSA peer check failed on {bad}: {check}")
    return check


# --------------------------------------------------------------------------- prefill


def check_prefill(ins: dict, *, block_size: int, topk: int, sel_ours, o_ours, seed: int = 0) -> dict:
    """SGLang vs ours on the same inputs (all rows), and both vs float64 on sampled rows."""
    B, S, Hq, D = ins["q"].shape
    plan = sgl.prefill_plan(B, S, ins["q"].device, block_size)
    sel_s = sgl.select(ins["q_idx"], ins["k_idx"], block_size=block_size, topk=topk, plan=plan)
    o_s = sgl.prefill(**ins, block_size=block_size, topk=topk, plan=plan)
    check = {"selection_sets_equal": round(float(sgl.selection_sets_equal(sel_s, sel_ours).float().mean()), 6),
             "rel_err_ours_vs_" + PEER: measure.relative_error(o_s, o_ours)}
    g = torch.Generator().manual_seed(seed)
    ts = torch.randint(0, S, (SAMPLED_ROWS,), generator=g).tolist()
    bs = torch.randint(0, B, (SAMPLED_ROWS,), generator=g).tolist()
    rows, brute = list(zip(bs, ts)), []
    for b, t in rows:
        brute.append(_fp64_rows(ins["q"][b, t], (ins["k"][b], ins["v"][b]), ins["q_idx"][b, t], ins["k_idx"][b],
                                t, block_size, topk, 1.0 / math.sqrt(D)))
    check.update(_brute_check(rows, sel_ours, sel_s, o_ours, o_s, brute))
    return _verdict(check, measure.tolerance_for(ins["q"].dtype))


def prefill_peer(ins0: dict, make_inputs, *, block_size: int, topk: int, sel_ours, o_ours, reps: int) -> dict:
    """Check, then time SGLang's prefill at ``ins0``'s shape: ``{"times": {impl: Timing}, "check": {...}}``
    with impls ``sglang_triton`` (end to end), ``sglang_triton_index`` and ``sglang_triton_attn``."""
    sgl.reset_autotune()
    check = check_prefill(ins0, block_size=block_size, topk=topk, sel_ours=sel_ours, o_ours=o_ours)
    B, S = ins0["q"].shape[:2]
    plan = sgl.prefill_plan(B, S, ins0["q"].device, block_size)
    kw = dict(block_size=block_size, topk=topk, plan=plan)
    raw = sgl.select(ins0["q_idx"], ins0["k_idx"], raw=True, **kw)
    times = {
        PEER: measure.time_fn(lambda **a: sgl.prefill(**a, **kw), make_inputs, reps=reps, warmup=2),
        PEER + "_index": measure.time_fn(lambda q_idx, k_idx: sgl.select(q_idx, k_idx, raw=True, **kw),
                                         lambda seed: {n: make_inputs(seed)[n] for n in ("q_idx", "k_idx")},
                                         reps=reps, warmup=2),
        PEER + "_attn": measure.time_fn(lambda q, k, v, **_: sgl.attention(q, k, v, raw, block_size=block_size, plan=plan),
                                        make_inputs, reps=reps, warmup=2),
    }
    return {"times": times, "check": check}


# --------------------------------------------------------------------------- decode


def check_decode(ins: dict, *, topk: int, sel_ours, o_ours, max_rows: int = 8) -> dict:
    """SGLang vs ours on one decode batch (all rows), both vs float64 on up to ``max_rows`` sequences."""
    ps = ins["k_cache"].shape[1]
    plan = sgl.decode_plan(ins["block_table"], ins["seq_lens"], ps)
    sel_s = sgl.decode_select(ins["q_idx"], ins["k_idx_cache"], plan, topk=topk)
    o_s = sgl.decode(ins["q"], ins["k_cache"], ins["v_cache"], ins["q_idx"], ins["k_idx_cache"], plan, topk=topk)
    check = {"selection_sets_equal": round(float(sgl.selection_sets_equal(sel_s, sel_ours).float().mean()), 6),
             "rel_err_ours_vs_" + PEER: measure.relative_error(o_s, o_ours)}
    B, T, Hq, D = ins["q"].shape
    rows, brute = [], []
    for b in range(min(B, max_rows)):
        L = int(ins["seq_lens"][b])
        pages = ins["block_table"][b, :math.ceil(L / ps)].long()
        k = ins["k_cache"][pages].flatten(0, 1)[:L]
        v = ins["v_cache"][pages].flatten(0, 1)[:L]
        kidx = ins["k_idx_cache"][pages].flatten(0, 1)[:L]
        rows.append((b, 0))
        brute.append(_fp64_rows(ins["q"][b, 0], (k, v), ins["q_idx"][b, 0], kidx, L - 1, ps, topk, 1.0 / math.sqrt(D)))
    check.update(_brute_check(rows, sel_ours, sel_s, o_ours, o_s, brute))
    return _verdict(check, measure.tolerance_for(ins["q"].dtype))


def decode_peer(ins: dict, *, topk: int, sel_ours, o_ours, reps: int) -> dict:
    """Check, then time SGLang's decode, eager and replayed from a CUDA graph: impls
    ``sglang_triton``, ``sglang_triton_index``, ``sglang_triton_attn`` (+ ``_cudagraph``)."""
    sgl.reset_autotune()
    check = check_decode(ins, topk=topk, sel_ours=sel_ours, o_ours=o_ours)
    plan = sgl.decode_plan(ins["block_table"], ins["seq_lens"], ins["k_cache"].shape[1])
    raw = sgl.decode_select(ins["q_idx"], ins["k_idx_cache"], plan, topk=topk, raw=True)
    fns = {
        PEER: lambda q, k_cache, v_cache, q_idx, k_idx_cache, **_: sgl.decode(q, k_cache, v_cache, q_idx, k_idx_cache,
                                                                               plan, topk=topk),
        PEER + "_index": lambda q_idx, k_idx_cache, **_: sgl.decode_select(q_idx, k_idx_cache, plan, topk=topk, raw=True),
        PEER + "_attn": lambda q, k_cache, v_cache, **_: sgl.decode_attention(q, k_cache, v_cache, raw, plan),
    }
    times, notes = {}, {}
    for graph in (False, True):
        for name, fn in fns.items():
            key = name + ("_cudagraph" if graph else "")
            try:
                times[key] = measure.time_fn(fn, inputs=ins, reps=reps, warmup=3, rotate=False, cuda_graph=graph)
            except Exception as e:  # noqa: BLE001 - a mode that fails is a note, not a lost run
                notes[key] = f"{type(e).__name__}: {e}"[:200]
    return {"times": times, "check": check, **({"notes": notes} if notes else {})}
