"""The published hack families, each with its gallery entries and the check that catches them.

:data:`FAMILIES` lists every family of benchmark hack found in the public write-ups (GPU MODE's
reference-kernels and pygpubench threads, KernelBench's adversarial tests, Wafer's field guide,
Makora's KernelHacks, robust-kbench, METR); :func:`markdown` renders it as the table in
``HACKS.md`` (``python -m minimax_lab.kernelbench.catalogue`` prints it). For each family:

* the trick, and the gallery entries (:data:`.hacks.GALLERY`) that play it -- every entry passes
  the naive harness and is failed by ours, by the check named here;
* the mode that catches it: ``in-process`` (the default), ``isolated`` (only
  ``evaluate(..., isolate=True)`` catches it: the hack edits the integrity check's own record), or,
  for the families that are not a candidate's trick, ``not a hack`` (correct code, nothing to fail)
  and ``problem check`` (a property every problem must have, tested on the problems themselves).

The integrity hacks of :data:`.hacks.INTEGRITY_HACKS` are not in this table yet.
"""
from __future__ import annotations

import dataclasses

from minimax_lab.kernelbench import hacks
from minimax_lab.kernelbench.hacks import (GPUMODE_102, GPUMODE_104, GPUMODE_159, GPUMODE_162, GPUMODE_NVFP4,
                                           KERNELBENCH_82, MAKORA, METR, PYGPUBENCH_7, PYGPUBENCH_23, PYGPUBENCH_49,
                                           ROBUST_KBENCH, WAFER_GUIDE, Source)

MODES = ("in-process", "isolated", "not a hack", "problem check")

METR_KERNELS = Source("METR 2025 kernels", "https://metr.org/blog/2025-02-14-measuring-automated-kernel-engineering",
                      "'Measuring Automated Kernel Engineering': KernelBench's starting implementations are naive "
                      "PyTorch rather than highly optimized kernels, so its speed-ups are easier to reach than against "
                      "what large deployments run")
RIGHT_BASELINE = Source("Geometric 2026", "https://geometricagi.github.io/2026/04/16/torch-compile-mode-analysis.html",
                        "'Are you using the right baseline for your kernel benchmarks?': eager PyTorch runs one "
                        "operation at a time and writes every intermediate to memory; a kernel's gain is measured "
                        "against what a user would run instead")
JAXBENCH_50 = Source("JAXBench #50", "https://github.com/AI-Hypercomputer/accelerator-agents/pull/50",
                     "KernelBench-derived problems whose zero-initialized weights made the reference output a "
                     "constant, so a no-op passed")


@dataclasses.dataclass(frozen=True)
class Family:
    """One family of hacks: what it does, where it was published, how the bench stops it."""

    name: str
    trick: str
    sources: tuple[Source, ...]
    gallery: tuple[str, ...]  # names in hacks.GALLERY (empty for "not a hack" / "problem check")
    mode: str  # one of MODES
    defence: str  # the check(s) and the mechanism behind them

    def checks(self) -> list[str]:
        """The checks that fail this family's gallery entries, in the mode that catches them."""
        out = []
        for name in self.gallery:
            h = hacks.GALLERY[name]
            check = h.expected_check(isolated=self.mode == "isolated")
            if check not in out:
                out.append(check)
        return out


FAMILIES: tuple[Family, ...] = (
    Family("caching by shape or object identity", "store an answer and return it when the same shape or the "
           "same tensor object comes back", (GPUMODE_102, GPUMODE_162), ("cache_last_output",
                                                                           "memo_on_input_identity"),
           "in-process", "every call gets new values (the same tensors refilled in place too); outputs may not "
           "alias earlier outputs"),
    Family("replaying results recorded in warm-up / a cache keyed by pointer", "record answers by input address "
           "when first seen and replay them when the address comes back", (PYGPUBENCH_7, GPUMODE_162, WAFER_GUIDE),
           ("replay_by_pointer",), "in-process", "every other timed call gets its inputs refilled in place with "
           "fresh values, and every timed output is judged"),
    Family("batching calls and skipping most", "compute several calls' inputs in one launch, then return the "
           "stored results without work", (GPUMODE_104, GPUMODE_NVFP4), ("batch_and_skip",), "in-process",
           "inputs are refilled right before their call, each call is timed and judged alone"),
    Family("detecting the warm-up or the checking phase", "behave while checked (count the calls, compare "
           "pointers), cheat while timed", (PYGPUBENCH_7, PYGPUBENCH_23, GPUMODE_NVFP4), ("lazy_after_checks",),
           "in-process", "the timing loop's outputs are judged like any other call's"),
    Family("keeping data resident in cache (L2)", "be fast only on inputs already seen or cached (pinning them "
           "in L2, a software cache)", (PYGPUBENCH_49,), ("warm_cache",), "in-process",
           "the cache is flushed before every timed call (GPU); repeated inputs must not be faster than fresh ones"),
    Family("work on another stream (stream injection)", "launch the work on a non-default stream the caller "
           "never waits for", (KERNELBENCH_82, WAFER_GUIDE), ("side_stream",), "in-process",
           "outputs are read on the caller's stream right after return and compared after a full synchronize "
           "(isolated: read so in the candidate's process, which waits for all its work before replying; the time "
           "runs until the harness holds the copy it judges, so work left running cannot shorten it)"),
    Family("work in a background thread (thread injection)", "hand the work to a thread and return an unfilled "
           "buffer", (WAFER_GUIDE,), ("thread_injection",), "in-process",
           "threads the candidate started must be done when it returns; the output read at return is judged"),
    Family("lazy outputs", "return an object that computes its values when the checker reads them",
           (GPUMODE_162, WAFER_GUIDE), ("lazy_output",), "in-process", "outputs must be plain torch.Tensor"),
    Family("patching the timer or its statistics", "leave the kernel honest, edit the clock or the statistic "
           "that reports it (and whatever checks for that)", (GPUMODE_162, WAFER_GUIDE), ("timer_patch",),
           "isolated", "in-process a replaced clock or statistic is found after the call and put back (harness "
           "integrity), unless the candidate also re-takes the integrity check's record, as the gallery entry does; "
           "isolated, the clock that scores is in the harness's process, so a patched clock cannot change the "
           "score; the attempt is flagged when the candidate's own clock reads outside the harness's interval around "
           "a call, or claims under half the harness's time (round trip subtracted) with most calls missing more than "
           "the round trip's resolution from its clock"),
    Family("a time driven toward zero (geometric-mean underflow)", "report a zero or negative time for one "
           "case, which sends a geometric mean to zero", (GPUMODE_162, GPUMODE_159), ("near_zero_time",),
           "in-process", "a time below what the minimum traffic needs at the device's measured ceilings is "
           "impossible; per-problem ratios, no geometric mean"),
    Family("finding the expected answer", "walk the caller's frames or the garbage collector for the expected "
           "output and copy it (or fill it with NaN)", (METR, PYGPUBENCH_7, PYGPUBENCH_23),
           ("read_expected", "gc_copy_expected"), "in-process", "the reference runs only after the candidate "
           "returned (NaN never passes); frame and gc access are audited"),
    Family("patching the judge", "replace the comparison so that anything passes", (METR,), ("patch_the_judge",),
           "in-process", "every function of torch, the standard library's clocks and statistics, the harness and "
           "the problems is compared after every call with the one recorded before the candidate ran, and put back"),
    Family("forging the judge's witness", "replace the comparison and the record of originals the integrity "
           "check uses", (METR, GPUMODE_162), ("forge_the_judge",), "isolated",
           "the judging happens in the harness's process, out of reach"),
    Family("modifying or zeroing the inputs", "write into the inputs (zeroed inputs make a reference run "
           "afterwards agree)", (KERNELBENCH_82,), ("in_place_on_input",), "in-process",
           "inputs are compared with a copy; the reference runs on that copy"),
    Family("stale buffers and reused memory", "return memory that already holds (part of) an answer: an earlier "
           "output, or the reference's freed buffer through torch.empty", (WAFER_GUIDE, KERNELBENCH_82),
           ("partial_write",), "in-process", "no output may alias an earlier one; freed memory is poisoned with "
           "NaN before each call"),
    Family("precision drops", "compute in a lower precision that passes on easy values", (WAFER_GUIDE,),
           ("precision_cut",), "in-process", "harder value regimes (sharp logits, tiny, large, outliers); "
           "outputs in the input's dtype"),
    Family("overfitting to the tested shapes, constant or identity outputs", "do the work only where it is "
           "checked; elsewhere return a constant, a copy of the input, garbage",
           (ROBUST_KBENCH, WAFER_GUIDE), ("special_case_validation",), "in-process",
           "held-out shapes drawn at evaluation time; every element compared at the problem's tolerance"),
    Family("calling the library or the baseline (benign shortcut)", "call torch (or the reference) instead of "
           "writing a kernel", (WAFER_GUIDE, MAKORA), (), "not a hack",
           "correct code passes; its ratio to the reference shows no gain"),
    Family("a ghost optimization branch", "the timed call takes a path that is not the kernel (here: msa_select's "
           "CPU timing shape took its select-all shortcut)", (MAKORA,), (), "problem check",
           "Problem.shortcut: the harness refuses to time at a shape that takes a shortcut, and every problem's "
           "timing shape is one that reaches the kernel"),
    Family("a weak baseline", "report the speed-up against a slow baseline -- the fp32 reference, eager "
           "unfused PyTorch -- instead of the implementation a user would pick", (METR_KERNELS, RIGHT_BASELINE), (),
           "problem check", "every problem names its strong peer (torch.softmax in the input's dtype, F.rms_norm, "
           "a serving engine's RoPE, SDPA on a contiguous cache, torch._scaled_grouped_mm); the harness times it "
           "beside every candidate, after checking the peer's answer against the reference, and reports that ratio "
           "first"),
    Family("degenerate problems", "a problem whose answer does not depend on its inputs, so a constant passes",
           (ROBUST_KBENCH, JAXBENCH_50), (), "problem check",
           "every problem's reference changes with its inputs, so a constant answer fails it"),
)


def markdown() -> str:
    """The catalogue as a Markdown table (the one in ``HACKS.md``), sources listed below it."""
    rows = ["| family | the trick | gallery entry | caught by | mode | published in |",
            "|---|---|---|---|---|---|"]
    cited: list[Source] = []
    for f in FAMILIES:
        refs = []
        for s in f.sources:
            if s not in cited:
                cited.append(s)
            refs.append(f"[{cited.index(s) + 1}]")
        checks = ", ".join(f"`{c}`" for c in f.checks())
        gallery = ", ".join(f"`{g}`" for g in f.gallery) or "-"
        caught = f"{checks}: {f.defence}" if checks else f.defence
        rows.append(f"| {f.name} | {f.trick} | {gallery} | {caught} | {f.mode} | {' '.join(refs)} |")
    refs = [f"{i}. {s.label}: {s.what}. <{s.url}>" for i, s in enumerate(cited, 1)]
    return "\n".join(rows) + "\n\n" + "\n".join(refs) + "\n"


HEADER = """# The hacks a kernel bench must catch

Every family of benchmark hack found in the public write-ups, the gallery entry that plays it
(`minimax_lab.kernelbench.hacks`), and the check of `minimax_lab.kernelbench.harness` that
catches it. *in-process*: the default `evaluate(...)` catches it; *isolated*: only
`evaluate(..., isolate=True)` does, because the hack edits the integrity check's own record of
the originals. Isolated mode
catches the in-process families too (`Hack.caught_isolated` names the check where it differs). What
its time guarantees: it is taken in the harness's process, from sending a call until that process
holds its own copy of the outputs -- the copy it judges -- less a calibrated round trip, so no
patched clock and no work left on another stream or thread can lower it; the checks flag the
attempt. Generated by `python -m minimax_lab.kernelbench.catalogue` from
`minimax_lab/kernelbench/catalogue.py`.

"""


if __name__ == "__main__":  # pragma: no cover
    print(HEADER + markdown(), end="")
