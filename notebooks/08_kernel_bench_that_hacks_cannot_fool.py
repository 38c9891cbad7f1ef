# %% [markdown]
# # 08 · A kernel bench that hacks cannot fool
#
# **What this chapter builds:** a benchmark harness whose every check closes one published way to score well without being right and fast, a gallery of hacks that fool a naive harness and are caught by ours, and the workbook's own kernels scored against the implementation a user would pick instead.
#
# **It assumes:** [00 · Rooflines and honest benchmarks](00_roofline_and_honest_benchmarks.ipynb) (synchronize, medians, ceilings); kernels of the earlier chapters appear among the problems.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/08_kernel_bench_that_hacks_cannot_fool.ipynb)
#
# Every chapter so far ended with "ours is N× faster". How much is such a sentence worth? Kernel
# benchmarks now steer engineers and the models that write kernels, and what gets optimized
# against gets gamed. In February 2025 Sakana AI withdrew the 10–100× speed-ups of its "AI CUDA
# Engineer" after readers found the kernels had exploited the evaluation code
# (https://sakana.ai/ai-cuda-engineer/); METR saw frontier models monkey-patch the evaluator and
# read the grader's answer off the call stack
# (https://metr.org/blog/2025-06-05-recent-reward-hacking/); GPU MODE, KernelBench, Wafer and
# Makora have published the hacks they caught. This chapter builds a bench you would be willing to
# optimize against.

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
import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

from minimax_lab import exercises, measure, runtime
from minimax_lab.kernelbench import catalogue, hacks, harness, integrity, naive, problems
from minimax_lab.kernelbench.problem_msa_select import MSA_SELECT_BLOCK, MSA_SELECT_TOPK
from minimax_lab.notebook import recorded
from minimax_lab.viz import kernelbench as viz_kb
from minimax_lab.viz.source import show_source

P = viz_kb.setup(preset)

# %% [markdown]
# ## 1. The idea: the candidate runs inside the judge
#
# A kernel benchmark calls the candidate, then judges what came back. Everything the candidate can
# reach while it runs -- the inputs, the caller's variables, the clock, the comparison, the
# functions the reference will use -- is something it can read or rewrite. So the harness is built
# around one rule: **nothing reachable during the call may tell the candidate the answer, the next
# input or its time, and nothing it changes may survive into the judging.** Here is one call, as the
# harness makes it:

# %%
viz_kb.harness_diagram()
plt.show()

# %% [markdown]
# ## 2. The smallest harness, and the smallest hack
#
# Here is a harness many kernels are judged by, written out honestly: one fixed input (seed 0,
# a public shape), the expected answer computed first and left in a local variable, one
# `torch.allclose`, and a wall clock with no synchronize that calls the candidate again and again on
# the same tensor.

# %%
show_source(naive.naive_evaluate)

# %% [markdown]
# The smallest hack that fools it remembers its answer per shape: right on the one call that is
# checked, and no work at all in the timing loop, so the naive wall clock reports a speed-up over
# the reference -- for doing nothing, on any machine.

# %%
def remember_the_answer(x, _memo={}):
    key = (tuple(x.shape), x.dtype)
    if key not in _memo:
        _memo[key] = torch.softmax(x.float(), dim=-1).to(x.dtype)
    return _memo[key]


fooled = naive.naive_evaluate(remember_the_answer, "softmax", preset=P)
print(fooled.summary())

# %% [markdown]
# The smallest check that catches it: call the candidate on fresh values every time -- new tensors,
# and the same tensor refilled in place, so a cache keyed by shape or by address goes stale -- and
# compute the expected answer only after the call returned.

# %%
def fresh_inputs_judge(candidate, calls: int = 4) -> bool:
    """True when the candidate is right on every call, each on values it has never seen."""
    p = problems.get_problem("softmax")
    x = p.make_inputs(p.validation_shapes(P)[0], seed=0, regime="normal")["x"]
    for i in range(calls):
        x.copy_(torch.randn(x.shape))  # same tensor, same address, new values
        out = candidate(x)
        if measure.relative_error(out, p.reference(x=x.float())) > measure.tolerance_for(x.dtype):
            return False
    return True


print("remember_the_answer:", fresh_inputs_judge(remember_the_answer))
print("honest softmax:     ", fresh_inputs_judge(hacks.honest_softmax))

# %% [markdown]
# That is the first check of the real harness, `harness.evaluate`. It passes the honest softmax and
# names the checks that failed the hack:

# %%
for candidate in (hacks.honest_softmax, remember_the_answer):
    print(harness.evaluate(candidate, "softmax", preset=P, n_test=n_test, time_it=False).summary())

# %% [markdown]
# ## 3. One check per published hack
#
# The real harness grows that check into one per opening: held-out shapes drawn at evaluation
# time from `os.urandom` (nothing a candidate can reach predicts them), harder value regimes,
# outputs copied on the caller's stream right after the return, no tensor subclasses, no shared
# memory with the inputs or earlier outputs, audit hooks against frame walks, and -- only once
# everything passed -- timing in which every call is still judged. Each is a named check:

# %%
display(Markdown(viz_kb.markdown_table(viz_kb.checks_rows(), ["check", "what it demands"])))

# %% [markdown]
# Every call, checked or timed, goes through one method: it copies the inputs, runs the candidate,
# copies the outputs at once, puts back anything the call replaced, checks threads, subclasses,
# touched inputs and aliasing -- and only then computes the reference, on the copy:

# %%
show_source(harness._Session.call)

# %% [markdown]
# The **hack gallery** plays one trick per published family, each on the softmax problem. For each:
# the naive verdict, our verdict in this process and the check that catches it. Hacks that behave
# while checked, or only fake their time, are timed: they do their honest work with
# `hacks.slow_softmax`, a softmax followed by a fixed wait that stands for a compute-bound kernel,
# so that what they skip stands far above the noise of any clock here. A hack *fools* the naive
# harness when it passes. On a GPU the table also gives the speed-up the naive wall clock reported;
# on a shared CPU that number would time the machine's load, so the speed-ups come from the GPU
# records at the end of the chapter.

# %%
gallery = hacks.gallery_table(preset=P, n_test=n_test)
display(Markdown(viz_kb.gallery_markdown(gallery)))
assert all(c.fools_naive for c in gallery), "a hack no longer fools the naive harness"
assert all(c.caught for c in gallery if not c.hack.needs_isolation), "a hack slipped through"
print(viz_kb.gallery_summary(gallery))

# %% [markdown]
# Three up close. `special_case_validation` is perfect on the public shapes and wrong on held-out
# ones: the report keeps the two scores apart and flags *overfit*. `warm_cache` answers from a cache
# keyed by a few sampled input values, the software twin of pinning data in L2: the harness times
# fresh and repeated inputs alternately (cache flushed before each call on a GPU) and compares the
# fastest call of each kind and most pairs of calls, not medians, which a busy machine moves.
# `near_zero_time` turns the clock back: no kernel moves the problem's bytes in no time. Each in the
# words of the check that failed it:

# %%
print(viz_kb.up_close(gallery))

# %% [markdown]
# ## 4. The catalogue: every published hack family
#
# The families documented in public write-ups, each with its gallery entry, the check that
# catches it and the mode that does (**in-process**: the default; **isolated**: section 6). Four
# rows are not a candidate's trick: a benign shortcut (correct code, nothing to fail), and three
# properties every *problem* must have, among them the strong peer of section 8.

# %%
display(Markdown(catalogue.markdown()))

# %% [markdown]
# ## 5. Harness integrity: what the judge computes with
#
# A candidate that replaces `torch.allclose` attacks the judge. Three subtler ones leave the judge
# alone and replace what it *uses*: `torch.exp`, with which the softmax reference is computed (the
# reference then comes out uniform, like the candidate's answer); `torch.randn`, with which the
# inputs are drawn (every input at a shape then holds the same values, and a cache answers them);
# `statistics.median`, through which the timer's statistic goes (a tenth of the fastest call).
#
# So the harness records every function, class and module bound in the namespaces printed below,
# and torch's global settings. Right before every call it
# takes that state as the one to keep; right after the call returns it compares, names what
# changed and puts it back, before the reference runs or anything is judged. Importing a
# candidate's module is checked the same way.

# %%
print(f"watched: {viz_kb.integrity_scope()}")
print(f"names compared after every call: {len(integrity.trusted()):,}")
integrity_hacks = [hacks.compare(name, preset=P, n_test=1) for name in hacks.INTEGRITY_HACKS]
display(Markdown(viz_kb.markdown_table([c.row() for c in integrity_hacks],
                                       ["hack", "trick", "naive verdict", "our verdict", "caught by"])))
for c in integrity_hacks:
    print(f"{c.hack.name}: {c.ours.failures['harness integrity'][0]}")

# %% [markdown]
# **What the in-process mode stops, and what it cannot.** It stops every check above, including a
# replacement of anything in those namespaces and settings: found after the call, that call fails
# and the next one runs on the originals. It cannot stop a candidate that edits the integrity
# check's own record of the originals (`integrity.trusted()`), the mutable state the harness keeps
# (caches, the contents of its lists, dicts and tensors), kernels registered with the dispatcher
# below `torch.library` (through `torch._C`), or memory written through `ctypes`: it shares the
# process. The gallery's
# `forge_the_judge` and `timer_patch` do the first, which is why they passed above.

# %% [markdown]
# ## 6. Untrusted code runs in its own process
#
# `evaluate(candidate, problem, isolate=True)` runs the candidate in a **separate spawned process**
# (on a GPU, its own CUDA context) that receives inputs and returns outputs through shared memory.
# This process keeps the clock, the reference, the held-out draws and the judging: whatever the
# candidate patches reaches none of them. The time runs from sending a call until this process
# holds its own copy of the outputs -- the copy that is judged -- less a round trip measured before
# the candidate was loaded. That round trip jitters, so two isolated times closer than its jitter
# (the mode's *resolution*) are not told apart. The candidate's own clock is compared with this
# one (**clock agrees**). The candidate must be importable there: a `"package.module:function"`
# path or a picklable callable from an importable module, not a lambda typed into a notebook.

# %%
try:
    harness.evaluate(lambda x: torch.softmax(x, -1), "softmax", preset=P, isolate=True)
except TypeError as e:
    print("TypeError:", str(e)[:110], "...")

# %% [markdown]
# The two hacks that edit the harness's record, in this process and in their own; then the clock
# hack's time by the isolated harness's clock, beside the same honest work (`hacks.clock_hack_work`,
# the softmax and the fixed wait the clock hack does) timed in this process:

# %%
edits = [n for n, h in hacks.GALLERY.items() if h.needs_isolation]
isolated = hacks.gallery_table(preset=P, n_test=n_test, names=edits, isolated=True)
honest = harness.evaluate(hacks.clock_hack_work, "softmax", preset=P, n_test=1, compare_best=False,
                          compare_peer=False)
display(Markdown(viz_kb.markdown_table(viz_kb.isolated_rows(isolated, gallery), ["hack", "in-process verdict",
                                                                              "isolated verdict", "caught by (isolated)"])))
assert all(c.caught for c in isolated), "an isolation-only hack slipped through isolated mode"
print(viz_kb.isolation_lines(isolated, honest))

# %% [markdown]
# ## 7. Can a candidate see the held-out shapes?
#
# A spy -- an honest softmax that on every call walks every caller frame and the harness's and
# problems' module globals for shape-like dicts -- sees the shape of its own call (it has the input
# anyway) and nothing about later ones. It is reported for looking, too:

# %%
seen = []


def spy(x):
    def shapes(d):
        return [v for v in d.values() if isinstance(v, dict) and v and all(type(i) is int for i in v.values())]
    found, f = shapes(vars(harness)) + shapes(vars(problems)), sys._getframe(1)
    while f is not None:
        found, f = found + shapes(f.f_locals), f.f_back
    seen.append((tuple(x.shape), found))
    return torch.softmax(x, -1)


rep = harness.evaluate(spy, "softmax", preset=P, n_test=n_test, time_it=False)
for h in rep.held_out_shapes:
    use = next(k for k, (shape, _) in enumerate(seen) if shape == (h["rows"], h["cols"]))
    print(f"held-out {h}: used at call {use}; seen earlier: {any(h in found for _, found in seen[:use])}")
print("caught by:", rep.caught_by)

# %% [markdown]
# ## 8. The workbook's kernels against the strongest peer
#
# A bench that hacks cannot fool must not flatter with its choice of baseline either: a speed-up
# over a slow fp32 reference says little (the catalogue's family "a weak baseline"). So every
# problem names its **strong peer**, the implementation a user would run instead, and the harness
# times it beside every candidate and reports that ratio first:

# %%
display(Markdown(viz_kb.markdown_table(
    [{"problem": n, "strong peer": p.strong_peer().name, "what it is": p.strong_peer().note}
     for n, p in problems.PROBLEMS.items()], ["problem", "strong peer", "what it is"])))

# %% [markdown]
# One more trap before timing anything, the *ghost optimization branch*: `msa_select` keeps `topk`
# blocks per query, so at `seq <= topk * block_size` it returns without launching its kernel. A
# timing shape that small times a shortcut; each problem names such shapes and the harness refuses
# them:

# %%
msa = problems.get_problem("msa_select")
edge = dict(msa.timing_shape(P), seq=MSA_SELECT_TOPK * MSA_SELECT_BLOCK)
try:
    harness.refuse_shortcut(msa, edge)
except ValueError as e:
    print("refused:", e)
print(f"the timing shape {msa.timing_shape(P)} reaches the kernel: {msa.shortcut(msa.timing_shape(P)) is None}")

# %% [markdown]
# Now the workbook's kernels go through the same harness: validation and held-out shapes, every
# regime, then -- on a GPU -- timing against the strong peer and the fp32 reference, each time with
# its p20-p80 spread. On a CPU the Triton kernels run in the **interpreter**, orders of magnitude
# slower than compiled code, so the harness checks them here and times nothing: the ratios are the
# GPU records' business, at the end of the chapter.

# %%
held_out = runtime.pick(P, cpu=1, gpu=n_test)  # each held-out draw runs the interpreter on a CPU
scored = [harness.evaluate(problems.get_problem(name).best(), name, preset=P, n_test=held_out, compare_best=False,
                           name=f"workbook:{name}", time_it=viz_kb.timings_are_speeds())
          for name in (viz_kb.WORKBOOK_PROBLEMS if score_workbook else ())]
display(Markdown(viz_kb.scores_markdown(scored)))

# %% [markdown]
# A kernel of your own goes through the same call: a callable, or a
# `"your_package.your_module:your_function"` path (with `isolate=True` if you would rather not
# trust it). Here a RoPE whose every output is 5% too large, the kind of slip a wrong constant
# makes:

# %%
rope = problems.get_problem("rope")
submission = lambda x, positions: rope.reference(x=x, positions=positions) * 1.05  # noqa: E731
print(harness.evaluate(submission, rope, preset=P, n_test=1, time_it=False).summary())

# %% [markdown]
# ## On a GPU
#
# The kernel bench run on an H200: the newest record of each hack and each kernel (not run now),
# labelled with the versions it was recorded with. The sentences under the figure say what the
# records hold and which comparisons they do not have yet.

# %%
kb_records = recorded.all_of("kernelbench")
if kb_records:
    viz_kb.recorded_scores(kb_records)
    plt.show()
print(viz_kb.caption(kb_records) if kb_records else "No GPU records of the kernel bench yet.")

# %% [markdown]
# ## Exercises
#
# Three exercises, each checked in seconds on the CPU; the solutions are in
# `minimax_lab.exercises.solutions.ch08` -- try first.
#
# **08.1 A check for stale answers.** The cheapest hack is a cache. Write the check that catches it
# by calling the candidate on fresh inputs -- without accusing an honest candidate whose rounding
# differs a little from `torch.softmax`. The checker hands you honest and caching candidates alike and
# accepts a verdict only when it agrees with the answers your calls got.

# %%
def returns_stale_answers(candidate, rows: int, cols: int) -> bool:
    """``candidate(x)`` claims to return ``torch.softmax(x, dim=-1)`` for a float32 ``x`` of shape
    ``(rows, cols)``. Return True if it ever returns a wrong answer (relative error above 1e-4,
    see ``measure.relative_error``), False if it is right every time.

    A cheat may key its cache by the shape, by the tensor's address (``x.data_ptr()``), or switch
    the cache on only after a few honest calls. So call it at least four times, judging each answer
    right after its call: on new tensors, and on the same tensor refilled in place with new values
    (``x.copy_(torch.randn(rows, cols))``)."""
    raise NotImplementedError  # your code here

# %%
exercises.check("08.1", returns_stale_answers)

# %% [markdown]
# **08.2 An honest timer.** The checker hands your timer candidates whose work is a sleep of 12 to
# 25 ms, drawn anew each check, each hiding it a different way: as side work after the return, in a
# lazy output, behind a cache, or behind one slow first call. Your timer must call each one and report
# what its calls really took, as the candidate itself saw it.

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
# times faster than the reference, and that our harness fails. The checker runs both and, when
# you succeed, prints which checks caught it. Replacing a function the judging uses is caught in
# this process (section 5); only a trick that edits the integrity check's own record needs the
# isolated mode -- the checker says so.

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
# ## What limits us
#
# In this process the harness stops every trick in the gallery and the catalogue except those
# that rewrite its own record of the originals, its mutable state, the C++ dispatcher or raw memory;
# untrusted code belongs in `isolate=True`, whose own limit is the round trip between processes:
# times closer than a few of its spreads are not judged, and on a shared GPU that spread grows
# several-fold, so time on a GPU of your own. A kernel launched on another stream that finishes
# before the harness's copy on the caller's stream is right and not flagged, though events on the
# caller's stream miss its time. The NaN poison of freed memory is best effort: a kernel that leaves
# part of a fresh `torch.empty` unwritten fails unless it gets memory the poison never touched. And
# a strong peer is only as strong as what is installed: vendor kernels shipped inside serving
# engines (FlashInfer's RoPE, SGLang's fused MoE for FP8 weights) are not among them here.

# %% [markdown]
# ---
# **Previous:** [07 · The KV cache as a distributed store](07_kv_cache_as_a_distributed_store.ipynb) · **Next:** [09 · Day 0 to day 14: serving the model](09_day0_to_day14.ipynb)
#
# **Package code used here:** `minimax_lab/kernelbench/problem.py`, `minimax_lab/kernelbench/problems.py`, `minimax_lab/kernelbench/problem_msa_select.py`, `minimax_lab/kernelbench/harness.py`, `minimax_lab/kernelbench/integrity.py`, `minimax_lab/kernelbench/isolate.py`, `minimax_lab/kernelbench/naive.py`, `minimax_lab/kernelbench/hacks.py`, `minimax_lab/kernelbench/catalogue.py`, `minimax_lab/kernelbench/ops_triton.py`, `minimax_lab/viz/kernelbench.py`, `minimax_lab/exercises/ch08.py`

# %%
display(Markdown(viz_kb.provenance(P, kb_records)))
