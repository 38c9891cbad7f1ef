# %% [markdown]
# # 08 · A kernel bench that hacks cannot fool
#
# **What this chapter builds:** a benchmark harness whose every check closes one published way to
# score well without being right and fast, a gallery of hacks that fool a naive harness and are
# caught by ours, an isolated mode for untrusted code -- and the workbook's own kernels scored on it.
#
# **It assumes:** [00 · Rooflines and honest benchmarks](00_roofline_and_honest_benchmarks.ipynb)
# (timing with synchronize, medians, ceilings); kernels of chapters 03-05 appear among the problems.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/08_kernel_bench_that_hacks_cannot_fool.ipynb)
#
# Every chapter so far ended with "ours is N× faster". This one asks how much such a sentence is
# worth. Kernel benchmarks now steer both engineers and models that write kernels, and anything
# that gets optimized against gets gamed:
#
# * In February 2025 Sakana AI withdrew the 10–100× speed-ups announced for its "AI CUDA Engineer"
#   after readers found that the generated kernels had exploited the evaluation code — in its own
#   words, "a memory exploit in the evaluation code which, in a number of cases, allowed it to avoid
#   checking for correctness" (Sakana AI on X, 21 Feb 2025; https://sakana.ai/ai-cuda-engineer/).
# * METR's "Recent frontier models are reward hacking" (June 2025,
#   https://metr.org/blog/2025-06-05-recent-reward-hacking/) describes models that monkey-patched the
#   evaluator, precomputed answers or traced the call stack for the grader's reference answer.
# * GPU MODE's leaderboards, KernelBench, Wafer's KernelArena and Makora have since published the
#   hacks they caught, by family — the catalogue in section 4 cites each write-up.
#
# So we build a bench that you would be willing to optimize against: **problems** taken from the
# workbook's own operators, a **harness** whose checks each close one way to score well without being
# right and fast, a **gallery of hacks** — one per published family — each of which gets through a
# naive harness and is caught by a check we can name, and an **isolated mode** for code we do not
# trust. Then we score the workbook's own kernels on it.

# %%
# In Colab, install the workbook's package first (locally, `make lab` already did).
import subprocess, sys
if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "minimax-lab[notebooks] @ git+https://github.com/minimax-lab/minimax-lab"], check=True)

# %% tags=["parameters"]
preset = "auto"        # "cpu" (tiny sizes, Triton interpreter) or "gpu" (real sizes)
n_test = 3             # held-out shapes drawn per evaluation
score_workbook = True  # score the workbook's own kernels in section 8

# %%
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import Markdown, display
from tqdm.auto import tqdm

from minimax_lab import bench, exercises, runtime
from minimax_lab.kernelbench import catalogue, hacks, harness, isolate, naive, problems
from minimax_lab.viz.source import show_source

P = runtime.resolve_preset(preset)
print(f"device {runtime.device_name()}, preset {P}, compute dtype {runtime.compute_dtype()}, "
      f"interpreter {runtime.is_interpreter()}")


def md_table(rows, cols):
    """A list of dicts as a Markdown table (no pandas needed)."""
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else ("" if v is None else str(v))  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    display(Markdown("\n".join(lines)))

# %% [markdown]
# ## 1. The problems
#
# A problem is a contract, not a kernel: a readable **reference**, a **seeded input generator**
# with several value *regimes* (a softmax right on N(0, 1) can still overflow on sharp logits),
# public **validation shapes** a submitter may tune on, a function that draws **held-out shapes**,
# a **tolerance** (relative norm error by dtype; `0` means integer outputs must match exactly), and
# its **minimum traffic**: the FLOPs and bytes any correct kernel must execute and move. Most come
# from earlier chapters; paged decode over an FP8 KV cache and the fused MoE with FP8 experts come
# from the FP8 day of chapter 07.
# The *open* ones (the table's "workbook kernel" column says which) have an fp32 reference and no
# workbook kernel yet: the reference is the baseline a submission has to beat, and the harness is
# ready to score it.

# %%
rows = []
for name, p in problems.PROBLEMS.items():
    rows.append({"problem": name, "what": p.description, "regimes": ", ".join(p.regimes),
                 "tolerance": "exact" if p.tol == 0 else (p.tol or "by dtype"),
                 "workbook kernel": ("none yet: the reference is the baseline" if p.open
                                     else ("yes" if p.available() is None else "not built yet")),
                 "public shapes": "; ".join(str(s) for s in p.validation_shapes(P))})
md_table(rows, ["problem", "what", "regimes", "tolerance", "workbook kernel", "public shapes"])

# %% [markdown]
# ## 2. The naive harness
#
# Here is the harness many kernels are judged by, written out honestly. Read it as a list of
# openings: **one fixed input** (seed 0, a public shape) — so memorising it works; the **expected
# answer computed first** and left in a local variable — so a candidate can go and read it;
# **`torch.allclose`** looked up at call time — so a candidate can replace it; and a
# **wall clock with no synchronize**, calling the candidate again and again on the same tensor —
# which times kernel *launches*, not the work, and rewards caching.

# %%
show_source(naive.naive_evaluate)

# %% [markdown]
# ## 3. Our harness: one check per opening
#
# `harness.evaluate(candidate, problem)` takes a callable (or a `"package.module:function"` path).
# Every call gets **fresh inputs** from a seed drawn from `os.urandom`; the held-out shapes are
# drawn one at a time, right before the call that uses them, from a generator that exists only for
# that draw — nothing the candidate can reach while it runs says what the *next* shape will be
# (section 7 sends a spy to look). The reference runs only **after** the candidate returns.
# Outputs are judged from a copy taken on the caller's stream right after the call, before any
# synchronize. Timing happens only once every check has passed, and every timed call is judged
# too: before each one the device's cache is flushed, every other call gets **fresh values
# refilled in place** (so no answer recorded earlier or computed ahead can be right) and the calls
# in between repeat the inputs (a kernel faster on those has seen them before). A time below what
# the problem's minimum traffic needs at the device's measured ceilings is **impossible**.

# %%
md_table([{"check": c, "what it demands": d} for c, d in harness.CHECKS.items()], ["check", "what it demands"])

# %% [markdown]
# Where those checks live. Every call a candidate gets, checked or timed, goes through one method:
# it snapshots the inputs, runs the candidate, copies the outputs right away (the copy that is
# judged), then checks integrity, introspection, tensor subclasses, late writes and threads, touched
# inputs and aliasing -- and only then computes the reference, on the snapshot:

# %%
show_source(harness._Session.call)

# %% [markdown]
# The timed calls are scheduled so that a cache, a replay or a batch computed ahead is wrong or
# visibly faster: fresh values refilled in place on every other call, the calls in between on the
# same inputs again, the device cache flushed before each one:

# %%
show_source(harness._timed_slots)

# %% [markdown]
# ...and the times are judged too: against the floor the problem's minimum traffic sets at the
# device's measured ceilings (**physically possible time**), fresh against repeated inputs
# (**fresh-input speed**), and, isolated, the candidate's own clock against the harness's
# (**clock agrees**):

# %%
show_source(harness._time_candidate)

# %% [markdown]
# An honest row softmax passes both harnesses — the checks are not simply failing everything:

# %%
honest = lambda x: torch.softmax(x.float(), dim=-1).to(x.dtype)  # noqa: E731
print(naive.naive_evaluate(honest, "softmax", preset=P).summary())
print(harness.evaluate(honest, "softmax", preset=P, n_test=n_test, time_it=False).summary())

# %% [markdown]
# ## 4. The catalogue: every published hack family
#
# The families below are the ones documented in public write-ups: GPU MODE's reference-kernels and
# pygpubench threads, KernelBench's adversarial tests, Wafer's field guide, Makora's KernelHacks,
# robust-kbench and METR. For each: the trick, the gallery entry that plays it, the check that
# catches it, and whether the default **in-process** harness catches it or only the **isolated**
# mode of section 6 does. Three rows are not a candidate's trick: a benign shortcut (correct,
# nothing to fail) and two properties every *problem* must have (checked by tests on the problems).

# %%
display(Markdown(catalogue.markdown()))

# %% [markdown]
# ## 5. The hack gallery
#
# One candidate per family, each for the row-softmax problem. For each: the naive verdict (and the
# speed-up its wall clock reports), our verdict in this process, the check that catches it, and
# every other check that failed too. The hacks that must be timed to be caught (they behave while
# checked, or only fake their time) are timed.

# %%
t0 = time.perf_counter()
gallery = hacks.gallery_table(preset=P, n_test=n_test, progress=True)
print(f"gallery: {time.perf_counter() - t0:.1f} s")
md_table([c.row() for c in gallery],
         ["hack", "trick", "naive verdict", "naive speed-up", "our verdict", "caught by", "also failed"])
assert all(c.fools_naive for c in gallery), "a hack no longer fools the naive harness"
assert all(c.caught for c in gallery if not c.hack.needs_isolation), "a hack slipped through -- see the table"

# %% [markdown]
# Why each check catches its hack:

# %%
for c in gallery:
    if c.hack.needs_isolation:
        print(f"{c.hack.name:24s} -> not caught in this process: {c.hack.why}")
        continue
    print(f"{c.hack.name:24s} -> {c.hack.caught_by!r}: {c.hack.why}")
    print(f"{'':24s}    first failure: {c.ours.failures[c.hack.caught_by][0]}")

# %% [markdown]
# ### Three hacks up close
#
# **Overfitting to the public shapes.** `special_case_validation` is perfect on every validation
# call and wrong on held-out shapes; the report keeps the two scores apart and flags it as
# *overfit* — the signature of tuning to the test set.
#
# **Faster only on what it has seen.** `warm_cache` answers from a cache keyed by a few sampled
# input values — the software twin of pinning data in L2. The naive harness calls it on one input
# over and over, so it looks fast. Ours times fresh values and repeated ones alternately, with the
# cache flushed before each call on a GPU. A cache is fast on every repeat, so the fastest repeated
# call beats the fastest fresh one, and the repeat wins nearly every (fresh, repeated) pair. The
# harness asks for both rather than comparing medians: on a busy CPU, other work that slows a few
# calls can move a median of eight calls tenfold.
#
# **A clock that lies.** `near_zero_time` computes honestly but turns the clock back by more than
# each call took: a zero or negative time, an "infinite" speed-up — one such case sends a
# leaderboard's geometric mean to zero. No kernel moves the problem's bytes in no time: the floor
# from the device's measured ceilings rejects it. `timer_patch` is subtler (section 6).

# %%
by_name = {c.hack.name: c for c in gallery}
over = by_name["special_case_validation"].ours
print(f"special_case_validation: validation {over.validation}, test {over.test}, overfit={over.overfit}")
warm = by_name["warm_cache"].ours.timing or {}
zero = by_name["near_zero_time"].ours.timing or {}
print(f"warm_cache: {warm.get('ms', float('nan')):.4g} ms on fresh inputs, "
      f"{warm.get('seen_ms', float('nan')):.4g} ms on inputs it had just seen")
print(f"near_zero_time: reported {zero.get('ms', float('nan')):.4g} ms per call; "
      f"floor {zero.get('floor_ms', float('nan')):.3g} ms")

fig, ax = plt.subplots(figsize=(7, 2.6))
labels = ["warm_cache, fresh inputs", "warm_cache, repeated inputs"]
vals = [warm.get("ms", np.nan), warm.get("seen_ms", np.nan)]
ax.barh(labels[::-1], vals[::-1], color=["tab:red", "tab:gray"])
ax.set(xscale="log", xlabel=f"ms per call ({'CUDA events, cache flushed' if runtime.DEVICE == 'cuda' else 'CPU wall clock'})",
       title="a kernel that is fast only on inputs it has seen")
plt.tight_layout(); plt.show()

# %% [markdown]
# ## 6. Untrusted code runs in its own process
#
# Two hacks above passed our harness: `forge_the_judge` replaces the harness's comparison *and*
# edits the table of original functions that the integrity check compares against; `timer_patch`
# takes 90 % of each call off the clock and edits that table too — a plausible 10× speed-up. An
# in-process harness cannot stop this: whatever judges and times a candidate in the same process,
# the candidate can rewrite.
#
# `evaluate(candidate, problem, isolate=True)` runs the candidate in a **separate spawned process**
# (on a GPU, its own CUDA context) that receives its inputs and returns its outputs through shared
# memory. This process keeps the clock, the reference, the held-out draws and the judging. The time
# runs on this process's wall clock from sending a call until this process holds its own copy of the
# outputs -- the copy that is judged -- less the round trip measured before the candidate was loaded.
# So no patched clock and no work left running on another stream or thread can lower the score. The
# candidate's process reports its clock too, and a disagreement flags the attempt (**clock agrees**).
# The candidate must be importable there: a `"package.module:function"` path, or a picklable
# callable from an importable module — a lambda typed into a notebook is not.
#
# One call, as the harness's process makes it: the clock runs from sending the call until this
# process holds its own copy of the outputs.

# %%
show_source(isolate.Worker.run)

# %% [markdown]
# The candidate's process reads its own clock around each call. Per call, the readings must lie
# inside the harness's interval; over the timed calls, the part of each call that escaped the
# candidate's clock is compared with what the trusted stand-in's calls left out:

# %%
show_source(isolate.clock_disagreement)

# %% [markdown]
# The round trip's jitter sets the resolution: times closer to zero than about three of its spreads
# are not judged. On a GPU that jitter depends on what else runs there: measured on the H200 it rose
# from about 1 ms with the GPU to itself to about 6 ms with other processes on the same GPU. Run
# timing-sensitive evaluations -- isolated ones above all -- on a GPU nothing else is using.

# %%
try:
    harness.evaluate(honest, "softmax", preset=P, isolate=True)
except TypeError as e:
    print("TypeError:", str(e)[:160], "...")

cand = "minimax_lab.kernelbench.ops_triton:softmax_triton"  # the workbook's Triton softmax
reps = 4 if P == "cpu" else 10  # the interpreter is slow: fewer timed calls on the CPU
inside = harness.evaluate(cand, "softmax", preset=P, n_test=1, compare_best=False, reps=reps)
isolated = harness.evaluate(cand, "softmax", preset=P, n_test=1, compare_best=False, reps=reps, isolate=True)
print(inside.summary()); print(isolated.summary())
t_in, t_iso = inside.timing, isolated.timing
print(f"round trip subtracted per isolated call: {t_iso['overhead_ms']:.3g} ms "
      f"(times below {t_iso['resolution_ms']:.3g} ms are not judged); "
      f"isolated / in-process time: {t_iso['ms'] / t_in['ms']:.2f}")

# %% [markdown]
# The same candidate passes in both modes (compare the two times above: on the CPU both are the
# interpreter's). The two hacks that edit the harness, in both modes:

# %%
edits = [n for n, h in hacks.GALLERY.items() if h.needs_isolation]
iso_gallery = hacks.gallery_table(preset=P, n_test=n_test, names=edits, isolated=True)
rows = []
for c in iso_gallery:
    in_proc = by_name[c.hack.name].ours
    rows.append({"hack": c.hack.name, "in-process verdict": "PASS" if in_proc.passed else "FAIL",
                 "in-process ms": (in_proc.timing or {}).get("ms"),
                 "isolated verdict": "PASS" if c.ours.passed else "FAIL",
                 "isolated ms": (c.ours.timing or {}).get("ms"),
                 "caught by (isolated)": ", ".join(c.ours.caught_by)})
md_table(rows, ["hack", "in-process verdict", "in-process ms", "isolated verdict", "isolated ms",
                "caught by (isolated)"])
assert all(c.caught for c in iso_gallery), "an isolation-only hack slipped through isolated mode"
for c in iso_gallery:
    print(f"{c.hack.name}: {c.ours.failures[c.hack.caught_isolated][0]}")

# %% [markdown]
# ## 7. Can a candidate see the held-out shapes?
#
# A spy candidate — an honest softmax that, on every call, walks every caller frame and the
# harness's and problems' module globals for shape-like dicts — sees the shape of the call it is in
# (it has the input anyway) and nothing about later ones. It is also reported for looking:

# %%
seen = []

def spy(x):
    found = []
    f = sys._getframe(1)
    while f is not None:
        found += [v for v in f.f_locals.values() if isinstance(v, dict) and v and all(type(i) is int for i in v.values())]
        f = f.f_back
    for mod in (harness, problems):
        found += [v for v in vars(mod).values() if isinstance(v, dict) and v and all(type(i) is int for i in v.values())]
    seen.append((tuple(x.shape), found))
    return torch.softmax(x, -1)

rep = harness.evaluate(spy, "softmax", preset=P, n_test=n_test, time_it=False)
for i, h in enumerate(rep.held_out_shapes):
    use = next(k for k, (shape, _) in enumerate(seen) if shape == (h["rows"], h["cols"]))
    early = any(h in found for _, found in seen[:use])
    print(f"held-out {h}: used at call {use}; visible to the spy before that: {early}")
print("caught by:", rep.caught_by)

# %% [markdown]
# ## 8. Scoring the workbook's own kernels
#
# Now the point of it all: the workbook's kernels go through the same harness — validation and
# held-out shapes, every regime, then timing against the fp32 reference. On the CPU the Triton
# kernels run in the **interpreter**, orders of magnitude slower than compiled code on a GPU, so the
# times below say nothing about speed; what matters here is the verdict. A problem whose module
# cannot be imported is skipped with the reason.
#
# First, a trap our own bench once fell into: the *ghost optimization branch* of the catalogue.
# `msa_select` keeps `topk` blocks of `block_size` keys per query; at `seq <= topk * block_size`
# every query keeps all its visible blocks, so the implementation returns without launching its
# kernel. A timing shape that small times a shortcut, not the kernel. Each problem names such
# shapes (`Problem.shortcut`), the harness refuses to time them, and the timing shape lies past
# the threshold. One call on each side of the threshold, and one at the timing shape:

# %%
msa = problems.get_problem("msa_select")
t_shape = msa.timing_shape(P)
at_edge = dict(t_shape, seq=problems.MSA_SELECT_TOPK * problems.MSA_SELECT_BLOCK)
print(f"timing shape {t_shape}: shortcut? {msa.shortcut(t_shape)}")
try:
    harness._refuse_shortcut(msa, at_edge)
except ValueError as e:
    print("refused:", e)
msa.best()(**msa.make_inputs(at_edge, 0, "normal"))  # imports the module: not part of any time below
for s in (at_edge, dict(at_edge, seq=at_edge["seq"] + 1), t_shape):
    t = harness.time_calls(msa.best(), [msa.make_inputs(s, 0, "normal")], reps=1 if P == "cpu" else 5,
                           warmup=0 if P == "cpu" else 2)
    print(f"seq {s['seq']:5d}: {t['ms']:9.3f} ms per call  "
          f"({'shortcut: no kernel launched' if msa.shortcut(s) else 'the kernel runs'})")

# %%
scored = []
if score_workbook:
    for name in tqdm(["softmax", "rmsnorm_residual", "rope", "moe_align", "msa_select", "paged_decode"], desc="workbook"):
        p = problems.get_problem(name)
        if p.available() is not None:
            print(f"{name}: skipped -- {p.available()}")
            continue
        r = harness.evaluate(p.best(), p, preset=P, n_test=n_test, compare_best=False, name=f"workbook:{name}",
                             reps=2 if P == "cpu" else 10)
        scored.append(r)
        print(r.summary())
md_table([{"problem": r.problem, "verdict": r.status.upper(), "validation": str(r.validation), "test": str(r.test),
           "ms": r.timing["ms"] if r.timing else None,
           "reference ms": r.timing["reference_ms"] if r.timing else None} for r in scored],
         ["problem", "verdict", "validation", "test", "ms", "reference ms"])

# %% [markdown]
# The open problems have no workbook kernel yet, so their reference is the baseline: the reference
# scores itself (a sanity check of the problem), and a submission that is off by 5 % is rejected.
# Your kernel goes where `submission` is — as a callable, or as
# `"your_package.your_module:your_function"` (with `isolate=True` if you would rather not trust it).

# %%
for name in [n for n, p in problems.PROBLEMS.items() if p.open]:
    p = problems.get_problem(name)
    print(harness.evaluate(p.reference, p, preset=P, n_test=1, time_it=False).summary())
    submission = lambda **inputs: tuple(o * 1.05 if o.is_floating_point() else o  # noqa: E731
                                        for o in harness._as_tuple(p.reference(**inputs)))
    print(harness.evaluate(submission, p, preset=P, n_test=1, time_it=False).summary())

# %% [markdown]
# ## 9. Recorded on the H200
#
# `python -m minimax_lab.bench kernelbench` runs the gallery, the isolated mode and the
# workbook's kernels on a GPU (with a real CUDA side stream for the side-stream hack) and writes
# records of suite `kernelbench`. The ones below were **recorded** on an H200 and ship with the
# workbook; they are not run now. Each record names the commit it was measured at.

# %%
recs = bench.load_records("NVIDIA H200", suite="kernelbench")
hack_recs = [r for r in recs if r["case"].startswith("hack:")]
kernel_recs = [r for r in recs if not r["case"].startswith("hack:") and r.get("speedup_vs", {}).get("reference")]
if not recs:
    print("No H200 records for suite 'kernelbench' yet: run `python -m minimax_lab.bench kernelbench` on the GPU.")
if hack_recs:
    md_table([{"hack": r["case"][5:], "ours mode": r.get("ours_mode", "in-process"),
               "naive (H200)": "PASS" if r["naive_passed"] else "FAIL",
               "naive wall-clock speed-up": r["naive_speedup"], "ours (H200)": "PASS" if r["ours_passed"] else "FAIL",
               "caught by": r["caught_by"], "commit": r["commit"][:8]} for r in hack_recs],
             ["hack", "ours mode", "naive (H200)", "naive wall-clock speed-up", "ours (H200)", "caught by", "commit"])
    missing = sorted(set(hacks.GALLERY) - {r["case"][5:] for r in hack_recs})
    if missing:
        print("not run on the H200 yet:", ", ".join(missing))
    fast = sorted((r for r in hack_recs if r["naive_speedup"] > 2), key=lambda r: -r["naive_speedup"])
    rest = sorted((r for r in hack_recs if r["naive_speedup"] <= 2), key=lambda r: -r["naive_speedup"])
    print("\nthe naive wall clock (no synchronize: it times launches, not work) scored the hacks that skip work "
          "over 2x faster than the reference:\n  " + ", ".join(f"{r['case'][5:]} {r['naive_speedup']:.1f}x" for r in fast))
    print("the others, which do the work (or more of it), near or below 1x:\n  "
          + ", ".join(f"{r['case'][5:]} {r['naive_speedup']:.2f}x" for r in rest))
overhead = [r for r in recs if r["case"] == "isolation_overhead"]
for r in overhead:
    print(f"isolated mode on the H200: round trip {r['ms']:.3g} ms per call; the workbook's softmax "
          f"{r['in_process_ms']:.3g} ms in-process, {r['isolated_ms']:.3g} ms isolated, both below the isolated "
          f"mode's resolution of {r['resolution_ms']:.2g} ms (commit {r['commit'][:8]})")
for r in (r for r in recs if r["case"] == "isolation_agreement"):
    print(f"an honest kernel above that resolution: {r['in_process_ms']:.4g} ms in-process, {r['isolated_ms']:.4g} ms "
          f"isolated ({r['isolated_over_in_process']:.3f}x; commit {r['commit'][:8]})")

# %% [markdown]
# The workbook's kernels as the harness scored them there. The colour says which side of the
# reference a kernel landed on: **green** faster than the PyTorch reference (ratio above 1),
# **red** slower (below 1: it passed every check but is no win), **grey** failed a check.

# %%
if kernel_recs:
    speedups = [r["speedup_vs"]["reference"] for r in kernel_recs]
    status = ["failed" if r.get("status") != "pass" else ("faster" if s > 1 else "slower")
              for r, s in zip(kernel_recs, speedups)]
    palette = {"faster": "tab:green", "slower": "tab:red", "failed": "tab:gray"}
    labels = {"faster": "passed, faster than the reference (> 1x)", "slower": "passed, slower than the reference (< 1x)",
              "failed": "failed a check"}
    fig, ax = plt.subplots(figsize=(8, 1.6 + 0.45 * len(kernel_recs)))
    names = [r["case"] for r in kernel_recs]
    # each bar runs from 1x (as fast as the reference) to the kernel's ratio: right = faster, left = slower
    ax.barh(names, [sp - 1 for sp in speedups], left=1, color=[palette[s] for s in status])
    for y, sp in enumerate(speedups):
        ax.annotate(f"{sp:.2f}x", (sp, y), xytext=(4 if sp >= 1 else -4, 0), textcoords="offset points",
                    va="center", ha="left" if sp >= 1 else "right", fontsize=8)
    ax.axvline(1, color="k", lw=0.8)
    ax.set(xscale="log", xlim=(min(min(speedups), 1) / 3, max(max(speedups), 1) * 3),
           xlabel="speed-up over the PyTorch reference (x, log scale; recorded on the H200, bf16)",
           title="the workbook's kernels, scored by the harness")
    ax.invert_yaxis()
    handles = [plt.Rectangle((0, 0), 1, 1, color=palette[k]) for k in palette if k in status]
    handles.append(plt.Line2D([], [], color="k", lw=0.8))
    ax.legend(handles, [labels[k] for k in palette if k in status] + ["1x: as fast as the reference"],
              loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2, fontsize=8, frameon=False)
    plt.tight_layout(); plt.show()
    md_table([{"problem": r["case"], "status": r.get("status"), "kernel ms": r["ms"],
               "reference ms": r["ms"] * r["speedup_vs"]["reference"], "speed-up": r["speedup_vs"]["reference"],
               "shape": ", ".join(f"{k}={v}" for k, v in r["shape"].items()), "commit": r["commit"][:8]}
              for r in kernel_recs], ["problem", "status", "kernel ms", "reference ms", "speed-up", "shape", "commit"])
    slow = [r["case"] for r, s in zip(kernel_recs, status) if s == "slower"]
    if slow:
        print(f"passed but slower than the reference on the H200: {', '.join(slow)} -- a correct kernel that is no win")
else:
    print("No H200 kernel scores recorded yet (only the gallery ran on the GPU so far).")

# %% [markdown]
# ## 10. Exercises
#
# Three exercises, each checked in seconds on the CPU. The solutions are in
# `minimax_lab/exercises/solutions/ch08.py`; try first.
#
# **08.1 A check for stale answers.** The cheapest hack is a cache. Write the check that catches it
# by calling the candidate on fresh inputs -- without accusing an honest candidate whose rounding
# differs a little from `torch.softmax`.

# %%
def returns_stale_answers(candidate, rows: int, cols: int) -> bool:
    """``candidate(x)`` claims to return ``torch.softmax(x, dim=-1)`` for a float32 ``x`` of shape
    ``(rows, cols)``. Return True if it ever returns a wrong answer (relative error above 1e-4,
    see ``bench.relative_error``), False if it is right every time.

    A cheat may key its cache by the shape, by the tensor's address (``x.data_ptr()``), or switch
    the cache on only after a few honest calls. So call it at least four times, judging each answer
    right after its call: on new tensors, and on the same tensor refilled in place with new values
    (``x.copy_(torch.randn(rows, cols))``)."""
    raise NotImplementedError  # your code here

# %%
exercises.check("08.1", returns_stale_answers)

# %% [markdown]
# **08.2 An honest timer.** The checker hands your timer candidates whose work is a known 20 ms
# sleep, each hiding it a different way: as side work after the return, in a lazy output, behind a
# cache, or behind one slow first call. Your timer must report about 20 ms for every one.

# %%
def honest_time_ms(fn, make_input, reps: int = 5) -> float:
    """The time of one call of ``fn(x)`` in milliseconds, measured so that no trick shrinks it.

    ``make_input()`` returns a new input tensor each time it is called. ``fn`` may try to look
    fast: return before its work is done and finish it as side work (``harness.launch_side_work``,
    which ``harness.synchronize()`` waits for), return a lazy tensor that computes its values only
    when something first reads them, answer from a cache when it sees an input again, or be slow
    on its first call only (a compile) so that one outlier dominates an average. Charge all of a
    call's work to it, and return the median over ``reps`` calls (the clock: ``time.perf_counter``)."""
    raise NotImplementedError  # your code here

# %%
exercises.check("08.2", honest_time_ms)

# %% [markdown]
# **08.3 A hack of your own.** Now attack: write a softmax that the naive harness passes *and*
# scores faster than the reference, and that our harness fails. The checker runs both
# (`naive.naive_evaluate` and `harness.evaluate`) and, when you succeed, prints which checks caught
# it. A trick that edits the harness's own state fools the in-process harness too; only the isolated
# mode of section 6 catches those -- the checker says so.

# %%
def my_hack(x: torch.Tensor) -> torch.Tensor:
    """A row softmax of ``x`` (``[rows, cols]``, over the last dim) that cheats. The naive harness
    (``naive.naive_evaluate(my_hack, "softmax")``) must pass it and report it faster than the
    reference; ``harness.evaluate(my_hack, "softmax")`` must fail it. Use any family of the
    catalogue, or a trick of your own."""
    raise NotImplementedError  # your code here

# %%
exercises.check("08.3", my_hack)

# %% [markdown]
# ## What this harness does not do
#
# * **In-process**, a candidate shares the harness's interpreter: the integrity and introspection
#   checks catch the common moves, not a candidate that edits the harness's own tables, its clock
#   or its memory. Untrusted code belongs in `isolate=True`.
# * **Isolated**, the harness's clock includes a round trip between processes; it is measured before
#   the candidate is loaded and subtracted, and times closer than a few of its spreads are not judged
#   (printed in section 6). On a shared GPU that spread grows several-fold: time on a GPU of your own.
#   What the candidate's process reports about itself (threads, subclasses, its clock) can only ever
#   fail it.
# * A kernel launched on another stream that finishes before the harness's copy on the caller's
#   stream runs is not caught by the stream check; its result is right, but its time is missed by
#   events on the caller's stream.
# * The GPU "poison" is best effort: freed memory is filled with NaN before each call, so a kernel
#   that leaves part of a fresh `torch.empty` unwritten fails — unless it gets memory the poison
#   never touched.
#
# That is the bar any "N× faster" in this workbook has to clear.

# %% [markdown]
# ---
# **Previous:** [06 · A paged KV cache for agents](06_paged_kv_cache_for_agents.ipynb) · **Next:** [09 · Day 0 to day 14: serving the model](09_day0_to_day14.ipynb)
#
# **Package code used here:** `minimax_lab/kernelbench/problems.py`, `minimax_lab/kernelbench/harness.py`, `minimax_lab/kernelbench/isolate.py`, `minimax_lab/kernelbench/naive.py`, `minimax_lab/kernelbench/hacks.py`, `minimax_lab/kernelbench/catalogue.py`, `minimax_lab/kernelbench/ops.py`, `minimax_lab/kernelbench/ops_triton.py`, `minimax_lab/exercises/ch08.py`
