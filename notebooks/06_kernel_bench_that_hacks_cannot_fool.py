# %% [markdown]
# # 06 · A kernel bench that hacks cannot fool
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minimax-lab/minimax-lab/blob/main/notebooks/06_kernel_bench_that_hacks_cannot_fool.ipynb)
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
#   https://metr.org/blog/2025-06-05-recent-reward-hacking/) lists models that, asked for a faster
#   kernel, patched the timer, searched the grader's call stack for the reference answer, or cached
#   results.
#
# So we build a bench that you would be willing to optimize against: **problems** taken from the
# workbook's own operators, a **harness** whose checks each close one way to score well without being
# right and fast, and a **gallery of hacks**, each of which gets through a naive harness and is
# caught by a check we can name. Then we score the workbook's own kernels on it.

# %%
# In Colab, install the workbook's package first (locally, `make lab` already did).
import subprocess, sys
if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "minimax-lab[notebooks] @ git+https://github.com/minimax-lab/minimax-lab"], check=True)

# %% tags=["parameters"]
preset = "auto"        # "cpu" (tiny sizes, Triton interpreter) or "gpu" (real sizes)
n_test = 3             # held-out shapes drawn per evaluation
score_workbook = True  # score the workbook's own kernels in section 5

# %%
import inspect
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import Markdown, display
from tqdm.auto import tqdm

import minimax_lab
from minimax_lab import bench, runtime
from minimax_lab.kernelbench import hacks, harness, naive, problems

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
# and a **tolerance** (relative norm error by dtype; `0` means integer outputs must match exactly).
# Most come from earlier chapters; the two *open* ones have a reference and nothing fast yet —
# the harness is ready to score whatever anyone submits for them.

# %%
rows = []
for name, p in problems.PROBLEMS.items():
    rows.append({"problem": name, "what": p.description, "regimes": ", ".join(p.regimes),
                 "tolerance": "exact" if p.tol == 0 else (p.tol or "by dtype"),
                 "workbook kernel": "open problem" if p.open else ("yes" if p.available() is None else "not built yet"),
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
print(inspect.getsource(naive.naive_evaluate))

# %% [markdown]
# ## 3. Our harness: one check per opening
#
# `harness.evaluate(candidate, problem)` takes a callable (or a `"package.module:function"` path).
# Every call gets **fresh inputs** from a seed drawn from `os.urandom`; the held-out shapes are
# drawn one at a time, right before the call that uses them, from a generator that exists only for
# that draw — nothing the candidate can reach while it runs (frames, module globals, the harness's
# objects, any `random.Random` the garbage collector knows) says what the *next* shape will be;
# `tests/test_kernelbench_secrecy.py` checks exactly that with a spy candidate. The reference runs
# only **after** the candidate returns. Outputs are judged from a copy taken on the caller's stream
# right after the call, before any synchronize. Timing happens only once every check has passed.

# %%
md_table([{"check": c, "what it demands": d} for c, d in harness.CHECKS.items()], ["check", "what it demands"])

# %% [markdown]
# An honest row softmax passes both harnesses — the checks are not simply failing everything:

# %%
honest = lambda x: torch.softmax(x.float(), dim=-1).to(x.dtype)  # noqa: E731
print(naive.naive_evaluate(honest, "softmax", preset=P).summary())
print(harness.evaluate(honest, "softmax", preset=P, n_test=n_test, time_it=False).summary())

# %% [markdown]
# ## 4. The hack gallery
#
# Ten candidates for the row-softmax problem, each playing one trick. For each: the naive verdict
# (and the speed-up its wall clock reports), our verdict, the check the gallery expects to catch it,
# and every other check that failed too.

# %%
t0 = time.perf_counter()
gallery = hacks.gallery_table(preset=P, n_test=n_test, progress=True)
print(f"gallery: {time.perf_counter() - t0:.1f} s")
md_table([c.row() for c in gallery],
         ["hack", "trick", "naive verdict", "naive speed-up", "our verdict", "caught by", "also failed"])
assert all(c.fools_naive and c.caught for c in gallery), "a hack slipped through -- see the table"

# %% [markdown]
# Why each check catches its hack:

# %%
for c in gallery:
    print(f"{c.hack.name:24s} -> {c.hack.caught_by!r}: {c.hack.why}")
    print(f"{'':24s}    first failure: {c.ours.failures[c.hack.caught_by][0]}")

# %% [markdown]
# ### Two hacks up close
#
# **Overfitting to the public shapes.** `special_case_validation` is perfect on every validation
# call and wrong on held-out shapes; the report keeps the two scores apart and flags it as
# *overfit* — the signature of tuning to the test set.
#
# **Work the timer never waits for.** `side_stream` returns before its answer exists (on a GPU: a
# kernel on a side stream the caller's stream is never told to wait for; on the CPU a thread plays
# that stream). The naive harness synchronizes before comparing, so it sees the right answer, and
# times with a wall clock, so it never sees the work. Our timer closes its loop with a *device-wide*
# synchronize, so the hidden work is counted:

# %%
over = next(c for c in gallery if c.hack.name == "special_case_validation").ours
print(f"special_case_validation: validation {over.validation}, test {over.test}, overfit={over.overfit}")

side = hacks.GALLERY["side_stream"].build(P)
x_side = problems.SOFTMAX.make_inputs(problems.SOFTMAX.validation_shapes(P)[0], 0, "normal")
nv = naive.naive_evaluate(side, "softmax", preset=P, reps=3)
ours_t = harness.time_calls(side, [x_side], reps=3, warmup=1)
honest_t = harness.time_calls(honest, [x_side], reps=3, warmup=1)
fig, ax = plt.subplots(figsize=(7, 2.6))
labels = ["side_stream, naive wall clock", "side_stream, our timer", "honest softmax, our timer"]
vals = [nv.ms, ours_t["ms"], honest_t["ms"]]
ax.barh(labels[::-1], vals[::-1], color=["tab:gray", "tab:green", "tab:red"])
ax.set(xscale="log", xlabel=f"ms per call ({'CUDA events + device sync' if runtime.DEVICE == 'cuda' else 'CPU wall clock; the thread sleeps 50 ms'})",
       title="the naive timer stops before the hidden work ends")
plt.tight_layout(); plt.show()

# %% [markdown]
# ### Can a candidate see the held-out shapes?
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
# ## 5. Scoring the workbook's own kernels
#
# Now the point of it all: the workbook's kernels go through the same harness — validation and
# held-out shapes, every regime, then timing against the fp32 reference. On the CPU the Triton
# kernels run in the **interpreter**, so the times below say nothing about speed (the interpreter is
# ~1000× slower than the GPU); what matters here is the verdict. Problems whose chapter has not
# landed yet are skipped with the reason.

# %%
scored = []
if score_workbook:
    for name in tqdm(["softmax", "rmsnorm_residual", "rope", "moe_align", "msa_select", "paged_decode"], desc="workbook"):
        p = problems.get_problem(name)
        if p.available() is not None:
            print(f"{name}: skipped -- {p.available()}")
            continue
        r = harness.evaluate(p.best(), p, preset=P, n_test=n_test, compare_best=False, name=f"workbook:{name}",
                             reps=2 if P == "cpu" else None)
        scored.append(r)
        print(r.summary())
md_table([{"problem": r.problem, "verdict": r.status.upper(), "validation": str(r.validation), "test": str(r.test),
           "ms": r.timing["ms"] if r.timing else None,
           "reference ms": r.timing["reference_ms"] if r.timing else None} for r in scored],
         ["problem", "verdict", "validation", "test", "ms", "reference ms"])

# %% [markdown]
# The open problems: the reference scores itself (a sanity check of the problem), and a submission
# that is off by 5 % is rejected. Your kernel goes where `submission` is — as a callable, or as
# `"your_package.your_module:your_function"`.

# %%
for name in ["msa_backward", "fp8_fused_moe"]:
    p = problems.get_problem(name)
    print(harness.evaluate(p.reference, p, preset=P, n_test=1, time_it=False).summary())
    submission = lambda **inputs: tuple(o * 1.05 for o in harness._as_tuple(p.reference(**inputs)))  # noqa: E731
    print(harness.evaluate(submission, p, preset=P, n_test=1, time_it=False).summary())

# %% [markdown]
# ## 6. Recorded on the H200
#
# `python -m minimax_lab.kernelbench --out results.json` runs the gallery and the workbook's
# kernels on the GPU (with a real CUDA side stream for the side-stream hack) and writes records of
# suite `kernelbench`. These come from `results/NVIDIA_H200.json`; they were **recorded**, not run now.

# %%
recs = bench.load_records("NVIDIA H200", suite="kernelbench")
hack_recs = [r for r in recs if r["case"].startswith("hack:")]
kernel_recs = [r for r in recs if not r["case"].startswith("hack:")]
if not recs:
    print("No H200 records for suite 'kernelbench' yet: run `python -m minimax_lab.kernelbench --out FILE` on the GPU.")
if hack_recs:
    md_table([{"hack": r["case"][5:], "naive (H200)": "PASS" if r["naive_passed"] else "FAIL",
               "naive wall-clock speed-up": r["naive_speedup"], "ours (H200)": "PASS" if r["ours_passed"] else "FAIL",
               "caught by": r["caught_by"], "commit": r["commit"]} for r in hack_recs],
             ["hack", "naive (H200)", "naive wall-clock speed-up", "ours (H200)", "caught by", "commit"])
if kernel_recs:
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.5 * len(kernel_recs)))
    ax.barh([r["case"] for r in kernel_recs], [r["speedup_vs"]["reference"] for r in kernel_recs], color="tab:green")
    ax.axvline(1, color="k", lw=0.8)
    ax.set(xscale="log", xlabel="speed-up over the PyTorch reference (recorded, H200, bf16)",
           title="the workbook's kernels, scored by the harness")
    plt.tight_layout(); plt.show()
    print(bench.format_table(kernel_recs))
else:
    print("No H200 kernel scores recorded yet (only the gallery ran on the GPU so far).")

# %% [markdown]
# On the H200 the naive wall clock, which never synchronizes, mostly measures *launch* time, so its
# "speed-ups" are noise around 1× for honest and dishonest kernels alike; the hacks that skip work
# (`cache_last_output`, `memo_on_input_identity`, `patch_the_judge`) still look 6–30× faster there.
# Every hack recorded there was caught on the GPU too, the side stream (a real CUDA stream) by the
# same stream-order check. (`lazy_after_checks` joined the gallery after that run.)
#
# ## What this harness does not do
#
# * It runs the candidate **in the same process**. A determined candidate can patch anything in
#   the interpreter, including this harness; the integrity and introspection checks catch the
#   common moves, not all of them. A bench for untrusted code runs every candidate in a fresh
#   process (and, for GPU work, a fresh CUDA context), passing tensors in and results out.
# * Rotating input sets repeat once the loop has passed over them, so a memo that returns a
#   *copy* of an old answer (no aliasing) would still be timed as fast; it is caught here only
#   because it is also wrong on fresh or refilled inputs. Making every timed call see never-seen
#   inputs costs memory (one set per call).
# * The GPU "poison" is best effort: freed memory is filled with NaN before each call, so a kernel
#   that leaves part of a fresh `torch.empty` unwritten fails — unless it gets memory the poison
#   never touched.
#
# That is the bar any "N× faster" in this workbook has to clear.
