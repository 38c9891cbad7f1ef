"""The GPU numbers of chapter 05: the ``moe`` bench suite's H200 records with their spread widened
over repeated runs, this machine's own timing at preset ``gpu``, and the chapter's provenance.

A record is the newest run of one (case, implementation); the suite was run several times, and
runs that repeat the same versions, dtype, shape, launch config and timing method measure the
same thing, so their p20-p80 ranges together are the honest spread of that number (a single
run's range leaves out what changes between runs: clocks, the machine's other load).
"""
from __future__ import annotations

import platform
from typing import Mapping, Sequence

from minimax_lab import measure, runtime
from minimax_lab.bench import suite_moe
from minimax_lab.bench import tune
from minimax_lab.notebook.recorded import H200
from minimax_lab.viz.flash_steps import recorded_with

#: the record fields two runs must share to count as repeats of one measurement
SAME_RUN = ("triton", "torch", "dtype", "config", "shape", "timing_method")


def gpu_records(device: str = H200) -> list[dict]:
    """The newest record of every (case, impl) of the ``moe`` suite on ``device``, its ``p20_ms``
    lowered to the lowest and ``p80_ms`` raised to the highest of every run that repeats it
    (:data:`SAME_RUN`), and ``n_runs`` how many runs those are. Empty when nothing was recorded."""
    every: dict[tuple, list[dict]] = {}
    for r in measure.load_records(device, suite="moe", latest=False):
        every.setdefault((r.get("case"), r.get("impl")), []).append(r)
    out = []
    for runs in every.values():
        newest = runs[-1]
        same = [r for r in runs if all(r.get(k) == newest.get(k) for k in SAME_RUN)
                and "p20_ms" in r and "p80_ms" in r]
        if same and "p20_ms" in newest:
            newest = {**newest, "p20_ms": min(r["p20_ms"] for r in same), "p80_ms": max(r["p80_ms"] for r in same),
                      "n_runs": len(same)}
        out.append(newest)
    return out


def measure_here(preset: str) -> list[dict]:
    """At preset ``gpu``: ours and the peers timed on this GPU at the first recorded shape, at one
    decode and one prefill size (records of the ``moe`` suite, not written to disk); at preset
    ``cpu`` nothing (the interpreter's times say nothing about a GPU)."""
    if runtime.resolve_preset(preset) != "gpu":
        return []

    return suite_moe.run_shape(suite_moe.GPU_SHAPES[0], [64, 4096], reps=20, with_loop=False)


def provenance(*, preset: str, seconds: float, records: Sequence[Mapping], measured: Sequence[Mapping] = ()) -> str:
    """Markdown for the chapter's last, collapsed cell: this run, the records drawn and how they were
    timed, how comparisons are judged, the tuner's stored run, and what the checks use."""
    info = runtime.describe()
    rows = [f"- this run: preset `{preset}`, {info['device']}, Python {info['python']}, torch {info['torch']}, "
            f"Triton {info['triton']}{' (interpreter)' if info['interpreter'] else ''}, {platform.system()}; "
            f"{seconds:.0f} s from the setup cell to here"]
    if records:
        dates = sorted({str(r.get("when", ""))[:10] for r in records if r.get("when")})
        reps = sorted({r.get("reps") for r in records if r.get("reps")})
        methods = sorted({r.get("timing_method") for r in records if r.get("timing_method")})
        rows.append(f"- section 5: {len(records)} records of the `moe` bench suite (`python -m minimax_lab.bench moe`) "
                    f"on {recorded_with(records)}, newest runs from {' to '.join(sorted({dates[0], dates[-1]}))}; each the median of "
                    f"{' or '.join(map(str, reps))} calls ({'; '.join(methods)}), bf16, softmax top-k routing of "
                    "random logits; decode priced against the measured copy bandwidth (the used experts' weights "
                    "read once), prefill against the measured bf16 GEMM rate")
        rows.append("- comparison words and error bars: the p20-p80 range of each timing, widened over every "
                    f"recorded run that repeats its versions, shape, launch config and timing method (up to "
                    f"{max(r.get('n_runs', 1) for r in records)} runs); a difference is one only where two "
                    "such ranges do not overlap")
    if measured:
        rows.append(f"- stars: ours timed now on {info['device']} with the same suite, "
                    f"{measured[0].get('reps')} calls per size")
    tuned = tune.recorded_run("moe_experts", "prefill")
    if tuned:
        rows.append(f"- section 3.5: the tuner's stored run, `{tuned.get('source')}` (its measurements file stores "
                    "device and date, not versions)")
    rows.append("- the checks: integer outputs compared element for element; float outputs against the fp32 "
                "reference by relative norm error within `measure.tolerance_for(dtype)`; inputs drawn from fixed "
                "seeds; the training runs of section 2 from seed 0")
    return ("<details><summary><b>Where these numbers come from</b> (click to open)</summary>\n\n"
            + "\n".join(rows) + "\n\n</details>")
