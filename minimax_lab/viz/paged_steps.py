"""The paged-decode kernels chapter 06 grows in cells, timed on a GPU: the toy (one program per query
head, no ``tl.dot``), ``tl.dot`` over a K tile, GQA packing and split-K, beside the package's
kernel and two peers, in one run on one device.

* :func:`time_steps` -- on a GPU: checks each step against the fp32 reference on the case's inputs,
  then times every step, the package's Triton kernel, gathering the pages for SDPA and SDPA on a
  contiguous cache (:mod:`minimax_lab.bench.suite_kvcache`'s inputs and peers, CUDA events per
  call, p20-p80 spreads). Returns records stamped with the device and the versions; ``record=True``
  appends them to the user's results (:func:`minimax_lab.measure.append_records`), where
  :func:`recorded_steps` finds them on the next run. Under the Triton interpreter the times would
  be the interpreter's, so the chapter calls it on a GPU only.
* :func:`recorded_steps` -- the newest run of the steps on any device, or ``[]``.
* :func:`step_counts` -- what each step changes, counted (programs, K/V bytes, rows of a dot).
* :func:`plot_steps` / :func:`steps_words` -- one bar per kernel with its p20-p80 spread, and one
  sentence judging each step against the one before (level where the spreads overlap).
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import matplotlib.pyplot as plt
import torch

from minimax_lab import measure, runtime
from minimax_lab.paged_kv import paged_decode
from minimax_lab.viz import noise

SUITE = "kvcache_steps"
#: the recorded decode case where split-K matters: 8 sequences x 8 kv heads = 64 programs without it
STEPS_CASE = dict(B=8, L=32768, Hq=32, Hkv=8, D=128, page=16)
#: what the package's kernel and the peers are called beside the steps
OTHERS = {"package": "the package's kernel", "gather_sdpa": "gather + SDPA", "sdpa_contiguous": "SDPA, contiguous cache"}


def _stamp() -> dict:
    info = runtime.describe()
    return {k: info[k] for k in ("device", "torch", "triton", "interpreter")}


def time_steps(steps: Mapping[str, Callable], *, case: Mapping = STEPS_CASE, reps: int = 20, record: bool = False,
               atol: float = 2e-2) -> list[dict]:
    """Check, then time, each of ``steps`` (name -> ``fn(q, k_cache, v_cache, block_table, seq_lens)``,
    in the chapter's order) at ``case`` on the kernel device in the compute dtype, with the
    package's kernel and the two peers; records of suite ``kvcache_steps`` (``impl`` = the step's
    name, ``step`` = its position). Raises ``AssertionError`` when a step's output differs from the
    reference by more than ``atol`` (absolute and relative)."""
    from minimax_lab.bench import suite_kvcache as kv_bench   # deferred: only a GPU run times anything

    dev, dtype = runtime.kernel_device(), runtime.compute_dtype()
    paged = lambda seed: kv_bench.make_decode_inputs(case, dev, dtype, seed)  # noqa: E731
    x = paged(0)
    ref = paged_decode(**x, impl="reference").float()
    fns = {**steps, "package": lambda **kw: paged_decode(**kw, impl="triton", check_values=False),
           "gather_sdpa": kv_bench.gather_sdpa}
    for name, fn in fns.items():
        torch.testing.assert_close(fn(**x).float(), ref, atol=atol, rtol=atol, msg=lambda m, name=name: f"{name}: {m}")
    del x, ref
    times = {name: measure.time_fn(fn, paged, reps=reps) for name, fn in fns.items()}
    times["sdpa_contiguous"] = measure.time_fn(kv_bench.sdpa_contiguous,
                                               lambda seed: kv_bench.make_contiguous_inputs(case, dev, dtype, seed),
                                               reps=reps)
    kv_bytes = 2.0 * case["B"] * case["L"] * case["Hkv"] * case["D"] * torch.empty(0, dtype=dtype).element_size()
    order = list(steps) + list(OTHERS)
    stamp = _stamp()
    records = [{**stamp, **measure.make_record(SUITE, kv_bench.decode_case_name(case), name, times[name],
                                                shape=dict(case), dtype=dtype, bytes_moved=kv_bytes,
                                                extra=dict(step=order.index(name), is_step=name in steps))}
               for name in order]
    if record:
        measure.append_records(records)
    return records


def step_counts(case: Mapping = STEPS_CASE, *, sms: int = runtime.RECORDED_GPU.sm_count, dtype_bytes: int = 2, rows: int = 16) -> str:
    """What each step of the chapter changes at ``case``, counted rather than timed: programs
    launched (and how many per SM of a GPU with ``sms``), the K/V bytes they load, and
    how many of a ``tl.dot``'s ``rows`` rows hold a query head. Split-K cuts each context into the
    chapter's default number of pieces, enough for two programs per SM."""
    B, L, Hq, Hkv, D = (case[k] for k in ("B", "L", "Hq", "Hkv", "D"))
    G = Hq // Hkv
    splits = -(-2 * sms // (B * Hkv))
    per_head = 2 * L * D * dtype_bytes            # one head's K and V of one sequence
    table = [("toy", B * Hq, B * Hq * per_head, "no tl.dot"),
             ("tl.dot", B * Hq, B * Hq * per_head, f"1 of {rows}"),
             ("GQA packing", B * Hkv, B * Hkv * per_head, f"{G} of {max(rows, G)}"),
             (f"split-K ({splits} pieces)", B * Hkv * splits, B * Hkv * per_head, f"{G} of {max(rows, G)}")]
    head = f"{'step':22s} {'programs':>9s} {'per SM':>7s} {'K/V loaded':>10s} {'query rows of a dot':>20s}"
    lines = [f"counted at B={B} sequences of {L:,} tokens, {Hq} query / {Hkv} kv heads, D={D}, "
             f"{8 * dtype_bytes}-bit cache, on a GPU of {sms} SMs (not timed):", head]
    lines += [f"{n:22s} {p:9,d} {p / sms:7.2f} {b / 2**30:6.2f} GiB {r:>20s}" for n, p, b, r in table]
    lines.append("(loaded: what the programs ask for; the L2 cache may serve a group's repeated loads)")
    return "\n".join(lines)


def recorded_steps() -> list[dict]:
    """The newest recorded run of the steps (one device: the newest record's), ordered by step."""
    recs = measure.load_records(None, suite=SUITE)
    if not recs:
        return []
    newest = max(recs, key=lambda r: r.get("when", ""))
    same = [r for r in recs if r.get("device") == newest.get("device") and r.get("case") == newest.get("case")]
    return sorted(same, key=lambda r: r.get("step", 0))


def label(records: Sequence[dict]) -> str:
    """'NVIDIA H100 80GB HBM3, torch 2.11.0, Triton 3.6.0, bf16, B=8 sequences of 32,768 tokens'."""
    r = records[0]
    s = r.get("shape", {})
    return (f"{r.get('device', '?')}, torch {r.get('torch', '?')}, Triton {r.get('triton', '?')}, {r.get('dtype')}, "
            f"B={s.get('B')} sequences of {s.get('L', 0):,} tokens, {s.get('Hq')}/{s.get('Hkv')} heads, page {s.get('page')}")


def plot_steps(records: Sequence[dict], *, ax=None, title: str = ""):
    """Horizontal bars of each kernel's median time, p20-p80 as error bars; steps in one colour,
    the package's kernel and the peers in others."""
    ax = ax or plt.subplots(figsize=(7, 3))[1]
    names = [r["impl"] for r in records]
    ms = [r["ms"] for r in records]
    err = [[r["ms"] - r.get("p20_ms", r["ms"]) for r in records], [r.get("p80_ms", r["ms"]) - r["ms"] for r in records]]
    colours = ["#4c78a8" if r.get("is_step") else "#f58518" if r["impl"] == "package" else "#9d9d9d" for r in records]
    y = range(len(records))
    ax.barh(list(y), ms, xerr=err, color=colours, capsize=3)
    ax.set_yticks(list(y), [OTHERS.get(n, n) for n in names], fontsize=9)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ms per call (log scale; bars: median, whiskers: p20-p80)")
    ax.set_title(title or "the steps of section 3", fontsize=10)
    for i, r in enumerate(records):          # the label right of the whisker, where it hides nothing
        ax.annotate(f"{r['ms']:.3g} ms", (r.get("p80_ms", r["ms"]), i), xytext=(6, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.set_xlim(right=ax.get_xlim()[1] * 3)
    return ax


def steps_words(records: Sequence[dict]) -> str:
    """One sentence: each step against the one before it, the last step against the package's kernel
    and SDPA on a contiguous cache, every comparison judged by the p20-p80 spreads; where nothing
    was timed, says how to time it."""
    steps = [r for r in records if r.get("is_step")]
    if len(steps) < 2:
        return ("The kernels of section 3 have no GPU timing here yet: at preset `gpu` this notebook times "
                "them beside the package's kernel (and `record_steps=True` keeps the records).")
    parts = [f"{b['impl']} is {noise.speed_words(b, a)} {a['impl']}" for a, b in zip(steps, steps[1:])]
    by = {r["impl"]: r for r in records}
    last = steps[-1]
    tail = [f"{noise.speed_words(last, by[o])} {OTHERS[o]}" for o in ("package", "sdpa_contiguous") if o in by]
    return (f"On the {records[0].get('device')} ({label(records).split(', ', 1)[1]}): " + "; ".join(parts)
            + (f"; and {last['impl']} is " + " and ".join(tail) if tail else "") + ".")
