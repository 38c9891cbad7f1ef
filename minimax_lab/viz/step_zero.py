"""Chapter 01's training pictures: the shipped checkpoint's history beside its held-out accuracy,
and the step-zero experiment (both modalities from the first step against text first, images
later) over several seeds, with the sentences that compare its numbers computed from them
(:mod:`minimax_lab.notebook.words`) and judged against their noise (:mod:`minimax_lab.viz.noise`):
two binomial standard errors of the held-out questions for one run; for several seeds, two
standard errors over the seeds of the paired (same seed) difference.

``history`` dicts are those :func:`minimax_lab.model.train` returns (``loss`` per step,
``val_step`` and ``val_acc``). A *run* is what
:func:`minimax_lab.model.experiments.step_zero_vs_text_first` returns for one seed; the experiment
dict is the first seed's run with the other seeds' runs under ``"more_seeds"`` (what the shipped
``experiment_step_zero.json`` holds and :func:`run_experiment` returns).
"""
from __future__ import annotations

import collections
import inspect
import json
import math
import statistics

import matplotlib.pyplot as plt
import numpy as np

from minimax_lab import resources
from minimax_lab.data.examples import QTYPES, make_examples
from minimax_lab.data.shapes import COLOURS
from minimax_lab.model.experiments import GROUNDING_MEASURE, step_zero_experiment, step_zero_vs_text_first
from minimax_lab.notebook import words
from minimax_lab.viz import noise

#: the accuracy of guessing uniformly among a question type's answers (colours; counts 0-3; yes/no)
CHANCE = {"colour": 1 / len(COLOURS), "count": 1 / 4, "left": 1 / 2}
SCHEDULES = {"mixed": ("mixed", "tab:blue"), "text_first": ("text first", "tab:orange")}


def trailing_mean(x, k: int = 25) -> np.ndarray:
    """At each step, the mean of the last ``k`` values (fewer at the start): a smoothed point never
    sees a later step, so a spike shows at the step where it happened, not before it."""
    c = np.cumsum(np.insert(np.asarray(x, dtype=float), 0, 0.0))
    i = np.arange(1, len(x) + 1)
    lo = np.maximum(0, i - k)
    return (c[i] - c[lo]) / (i - lo)


def two_se_share(p: float, n: int) -> float:
    """Two binomial standard errors of a share ``p`` measured on ``n`` questions (a share of 0 or 1
    gets the variance of one question in ``n``, so it does not claim to be noiseless)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive number of questions, got {n!r}")
    return 2 * math.sqrt(max(p * (1 - p), 1 / n) / n)


def plot_history(hist: dict, *, n_val: int, test_acc: float | None = None, n_test: int | None = None):
    """Training loss (each step, and its trailing mean) and validation accuracy on ``n_val``
    questions with two binomial standard errors; ``test_acc`` (on ``n_test`` held-out test
    questions) drawn at the last step, so the number printed beside the figure is in it."""
    fig, ax = plt.subplots(1, 2, figsize=(10.5, 3.4))
    loss = np.array(hist["loss"])
    ax[0].plot(loss, color="tab:blue", alpha=0.25, lw=0.7, label="each step")
    ax[0].plot(trailing_mean(loss), color="tab:blue", label="mean of the last 25 steps")
    ax[0].set(xlabel="step", ylabel="training loss (weighted, nats)", yscale="log", title="loss")
    ax[0].legend(fontsize=8, loc="upper right")
    acc = np.array(hist["val_acc"], dtype=float)
    ax[1].errorbar(hist["val_step"], acc, yerr=[two_se_share(a, n_val) for a in acc], fmt="o-", ms=4, capsize=2,
                   color="tab:blue", label=f"validation, {n_val} questions")
    if test_acc is not None:
        last = hist["val_step"][-1]
        ax[1].errorbar([last + max(1, last // 40)], [test_acc], yerr=[two_se_share(test_acc, n_test)], fmt="D",
                       color="tab:red", ms=6, capsize=3, label=f"held-out test, {n_test} questions ({test_acc:.1%})")
    ax[1].set(xlabel="step", ylabel="answer accuracy (fraction)", ylim=(0, 1.02),
              title="answer accuracy (bars: two standard errors)")
    ax[1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def accuracy_lines(acc: dict, examples) -> str:
    """Held-out accuracy overall and per question type, each with two standard errors of its
    questions and judged against guessing (:func:`minimax_lab.viz.noise.versus_chance`)."""
    per = collections.Counter(e.qtype for e in examples)
    n = sum(per.values())
    guess = sum(per[q] * CHANCE[q] for q in QTYPES) / n
    rows = [f"held-out accuracy on {n} test questions: {acc['all']:.1%} ± {two_se_share(acc['all'], n):.1%} "
            f"(two standard errors), {noise.versus_chance(acc['all'], guess, n)}"]
    rows += [f"  {q:>6}: {acc[q]:.1%} ± {two_se_share(acc[q], per[q]):.1%} of {per[q]}, "
             f"{noise.versus_chance(acc[q], CHANCE[q], per[q])}" for q in QTYPES if per[q]]
    return "\n".join(rows)


def chance(qtypes=QTYPES) -> float:
    """The accuracy of guessing on a test set with the question types in equal shares."""
    return float(np.mean([CHANCE[q] for q in qtypes]))


# --------------------------------------------------------------------------- the step-zero experiment

def shipped_history() -> dict:
    """The shipped checkpoint's training history (``tiny_cpu_history.json``), as :func:`train` returns it."""
    return json.loads(resources.asset("tiny_cpu_history.json").read_text())["history"]


def shipped_experiment() -> dict:
    """The shipped step-zero experiment (``experiment_step_zero.json``)."""
    return json.loads(resources.asset("experiment_step_zero.json").read_text())


def grounding_measure(*rs: dict) -> str:
    """What the runs' ``best_grounding`` numbers are: ``"grounding ratio"`` (within the image) for runs
    recorded with ``grounding_measure = "within_image"``, else ``"object-attention ratio"`` (attention on
    the object over ``n_focus / 16`` of the whole row: the image share times the grounding ratio; see
    :mod:`minimax_lab.model.experiments`). ValueError if the runs mix the two."""
    names = {"grounding ratio" if r.get("grounding_measure") == GROUNDING_MEASURE else "object-attention ratio"
             for r in rs}
    if len(names) != 1:
        raise ValueError(f"the runs must share one grounding measure, got {sorted(names)}")
    return names.pop()


def runs(exp: dict) -> list[dict]:
    """The experiment's runs, one per seed, the first seed first."""
    return [{k: v for k, v in exp.items() if k != "more_seeds"}, *exp.get("more_seeds", [])]


#: the step-zero experiment dict, one run per seed (:func:`~minimax_lab.model.experiments.step_zero_experiment`)
run_experiment = step_zero_experiment


def test_questions(run: dict) -> collections.Counter:
    """How many held-out questions of each type a run scored: its test set is
    ``make_examples("test", n_test, seed + 1)``, ``n_test`` as stored or the experiment's default."""
    n = run.get("n_test") or inspect.signature(step_zero_vs_text_first).parameters["n_test"].default
    return collections.Counter(e.qtype for e in make_examples("test", n, run.get("seed", 0) + 1))


def _switch_step(run: dict) -> int:
    return int(run["steps"] * run.get("text_first_frac", 0.5))


def _test_mean_and_error(rs: list[dict], schedule: str) -> tuple[float, float]:
    """A schedule's held-out accuracy, the mean over seeds with two standard errors over the seeds;
    for one seed, its accuracy with two binomial standard errors of its questions."""
    accs = [r[schedule]["test_acc"]["all"] for r in rs]
    if len(accs) > 1:
        return statistics.fmean(accs), 2 * statistics.stdev(accs) / math.sqrt(len(accs))
    return accs[0], two_se_share(accs[0], sum(test_questions(rs[0]).values()))


def plot_schedules(exp: dict):
    """Both schedules over the experiment's seeds. Left: training loss, each seed's trailing mean
    (faint) and their mean; a dotted line where text first adds the images. Right: validation
    accuracy on image questions, each seed faint and their mean, and just after the last step the
    held-out test accuracy; error bars are two standard errors over the seeds (for one seed, two
    binomial standard errors of its questions)."""
    rs = runs(exp)
    seeds = f"{len(rs)} seeds" if len(rs) > 1 else "1 seed"
    fig, ax = plt.subplots(1, 2, figsize=(11.5, 3.7))
    last = rs[0]["mixed"]["history"]["val_step"][-1]
    for i, (name, (label, colour)) in enumerate(SCHEDULES.items()):
        losses = np.array([trailing_mean(r[name]["history"]["loss"]) for r in rs])
        for curve in losses:
            ax[0].plot(curve, color=colour, alpha=0.25, lw=0.7)
        ax[0].plot(losses.mean(0), color=colour, label=f"{label}, mean of {seeds}")
        steps = rs[0][name]["history"]["val_step"]
        vals = np.array([r[name]["history"]["val_acc"] for r in rs], dtype=float)
        for curve in vals:
            ax[1].plot(steps, curve, color=colour, alpha=0.25, lw=0.7)
        n_val = rs[0]["train_config"]["eval_examples"]
        err = (2 * vals.std(0, ddof=1) / math.sqrt(len(rs)) if len(rs) > 1
               else [two_se_share(a, n_val) for a in vals[0]])
        ax[1].errorbar(steps, vals.mean(0), yerr=err, fmt="o-", ms=3, capsize=2, color=colour,
                       label=f"{label}, validation ({n_val} questions a seed)")
        mean, err = _test_mean_and_error(rs, name)
        ax[1].errorbar([last + (i + 1) * max(1, last // 30)], [mean], yerr=[err], fmt="D", ms=6, capsize=3,
                       color=colour, markeredgecolor="black", label=f"{label}, held-out test: {mean:.1%} ± {err:.1%}")
    ax[0].axvline(_switch_step(rs[0]), color="gray", ls=":", label="images added (text first)")
    ax[0].set(xlabel="step", ylabel="training loss (nats), mean of 25 steps", yscale="log",
              title="training loss (faint: each seed)")
    ax[1].set(xlabel="step", ylabel="accuracy on image questions", ylim=(0, 1.02),
              title="accuracy (faint: each seed; bars: two standard errors)")
    ax[0].legend(fontsize=7, loc="upper right")
    ax[1].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def _loss_jump(run: dict):
    """Text first's trailing-mean loss the step before the images arrive and its peak over the
    next 50 steps, or None when the switch falls outside the run."""
    loss = trailing_mean(run["text_first"]["history"]["loss"])
    s = _switch_step(run)
    return (float(loss[s - 1]), float(loss[s:s + 50].max())) if 0 < s < len(loss) else None


def _versus_guessing(acc: float, q: str, n: int) -> str:
    noise_q = 2 * math.sqrt(CHANCE[q] * (1 - CHANCE[q]) / n)
    return ("above guessing" if acc - CHANCE[q] > noise_q else "below guessing" if CHANCE[q] - acc > noise_q
            else "no better than guessing")


def schedule_lines(exp: dict, *, rerun: bool = False) -> str:
    """Each schedule's held-out accuracy (per type, each against guessing) and best grounding, then
    what separates the schedules, every comparison computed from the numbers printed. One seed:
    judged against two standard errors of its held-out questions. Several: the means over the
    seeds, each gap the mean of the paired (same seed) differences against two standard errors over
    the seeds."""
    rs = runs(exp)
    if len(rs) == 1:
        return _one_run_lines(rs[0], rerun=rerun)
    measure = grounding_measure(*rs)
    n = rs[0].get("n_test") or inspect.signature(step_zero_vs_text_first).parameters["n_test"].default
    guess = chance()                      # the question types are drawn with equal chances
    lines = [f"{rs[0]['steps']} steps per schedule, seeds {[r['seed'] for r in rs]}"
             + ("" if rerun else " (the shipped runs)") + f", each seed scored on its own {n} held-out image "
             f"questions (the three types drawn with equal chances); guessing scores about {guess:.0%}"]
    for name, (label, _) in SCHEDULES.items():
        mean, err = _test_mean_and_error(rs, name)
        per_seed = ", ".join(f"{r[name]['test_acc']['all']:.1%}" for r in rs)
        by_type = ", ".join(f"{q} {statistics.fmean(r[name]['test_acc'][q] for r in rs):.0%}" for q in QTYPES)
        grounding = ", ".join(f"{r[name]['best_grounding']:.1f}" for r in rs)
        versus = ("above guessing" if mean - err > guess else "below guessing" if mean + err < guess
                  else "not measurably different from guessing")
        lines.append(f"{label:>10}: held-out accuracy {mean:.1%} ± {err:.1%} over the seeds ({per_seed}), {versus}; "
                     f"by type {by_type}; best {measure} {grounding}")
    spread = max(100 * (max(a) - min(a)) for a in
                 ([r[name]["test_acc"]["all"] for r in rs] for name in SCHEDULES))
    one_seed = 100 * two_se_share(0.5, n)           # the largest two standard errors on n questions
    lines.append(f"the seeds of one schedule lie up to {spread:.1f} points apart, against ± {one_seed:.1f} points "
                 f"from one seed's {n} questions alone: "
                 + ("the seed, not the questions, is the larger noise" if spread > 2 * one_seed
                    else "no more than the questions' own noise"))
    acc_gap = [100 * (r["text_first"]["test_acc"]["all"] - r["mixed"]["test_acc"]["all"]) for r in rs]
    g_gap = [r["text_first"]["best_grounding"] - r["mixed"]["best_grounding"] for r in rs]
    lines.append("text first minus mixed, seed by seed: accuracy "
                 + noise.mean_diff_words(acc_gap, unit="points", what="seed", digits=1))
    lines.append(f"text first minus mixed, seed by seed: best {measure} "
                 + noise.mean_diff_words(g_gap, what="seed", digits=1))
    jumps = [_loss_jump(r) for r in rs]
    if all(jumps):
        lines.append(f"text first, where the images arrive (step {_switch_step(rs[0])}): within 50 steps its mean "
                     "loss rises to " + ", ".join(f"{after / before:.2f}x" for before, after in jumps)
                     + " its value the step before (one number a seed)")
    return "\n".join(lines)


def _one_run_lines(exp: dict, *, rerun: bool = False) -> str:
    """One run's lines, judged against two standard errors of its held-out questions."""
    per = test_questions(exp)
    n = sum(per.values())
    guess = sum(per[q] * CHANCE[q] for q in QTYPES) / n           # a guesser's mean score on this mix of types
    guess_all = 2 * math.sqrt(sum(per[q] * CHANCE[q] * (1 - CHANCE[q]) for q in QTYPES)) / n
    guess_q = {q: 2 * math.sqrt(CHANCE[q] * (1 - CHANCE[q]) / per[q]) for q in QTYPES}
    lines = [f"{exp['steps']} steps per schedule" + ("" if rerun else " (the shipped run)")
             + f", {n} held-out image questions (" + ", ".join(f"{q} {per[q]}" for q in QTYPES) + ")",
             f"guessing scores {guess:.0%} (" + ", ".join(f"{q} {CHANCE[q]:.0%}" for q in QTYPES)
             + f"); two standard errors of a guesser on these questions: all {guess_all:.0%}, "
             + ", ".join(f"{q} {guess_q[q]:.0%}" for q in QTYPES)]
    for name, (label, _) in SCHEDULES.items():
        r = exp[name]
        per_type = ", ".join(f"{q} {r['test_acc'][q]:.0%} ({_versus_guessing(r['test_acc'][q], q, per[q])})"
                             for q in QTYPES)
        acc = r["test_acc"]["all"]
        overall = ("above guessing" if acc - guess > guess_all else "below guessing" if guess - acc > guess_all
                   else "no better than guessing")
        lines.append(f"{label:>10}: held-out image-QA accuracy {acc:.1%} ({overall}): {per_type}; "
                     f"best {grounding_measure(exp)} {r['best_grounding']:.1f}")
    a, b = exp["mixed"]["test_acc"]["all"], exp["text_first"]["test_acc"]["all"]
    gap = noise.gap_words(b, a, noise.two_se_shares(a, b, n), above="text first ahead", below="mixed ahead",
                          level="no measurable difference", fmt=lambda x: f"{100 * x:.1f} points")
    sharper, duller = sorted(SCHEDULES, key=lambda k: -exp[k]["best_grounding"])
    ratio = words.more_or_less(exp[sharper]["best_grounding"], exp[duller]["best_grounding"], bigger="higher",
                               smaller="lower", same="about as high as")
    lines.append(f"accuracy, text first {b:.1%} against mixed {a:.1%}: {gap}; {grounding_measure(exp)}: the sharper head "
                 f"is in the {SCHEDULES[sharper][0]} model ({ratio} the {SCHEDULES[duller][0]} model's)")
    jump = _loss_jump(exp)
    if jump:
        lines.append(f"text first, where the images arrive (step {_switch_step(exp)}): its mean loss "
                     f"{words.change(*jump, unit='nats')} within 50 steps")
    return "\n".join(lines)
