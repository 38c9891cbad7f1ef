"""Chapter 01's training pictures: the shipped checkpoint's history, and the step-zero experiment
(both modalities from the first step against text first, images later), with the sentences that
compare its numbers computed from them (:mod:`minimax_lab.notebook.words`) and judged against two
standard errors of the held-out questions (:mod:`minimax_lab.viz.noise`).

``history`` dicts are those :func:`minimax_lab.model.train` returns (``loss`` per step,
``val_step`` and ``val_acc``); the experiment dict is what
:func:`minimax_lab.model.experiments.step_zero_vs_text_first` returns (and the shipped
``experiment_step_zero.json`` holds).
"""
from __future__ import annotations

import collections
import inspect
import math

import matplotlib.pyplot as plt
import numpy as np

from minimax_lab.data.examples import QTYPES, make_examples
from minimax_lab.data.shapes import COLOURS
from minimax_lab.model.experiments import step_zero_vs_text_first
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


def plot_history(hist: dict):
    """Training loss (each step, and its trailing mean) and validation accuracy."""
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.2))
    loss = np.array(hist["loss"])
    ax[0].plot(loss, color="tab:blue", alpha=0.25, lw=0.7, label="each step")
    ax[0].plot(trailing_mean(loss), color="tab:blue", label="mean of the last 25 steps")
    ax[0].set(xlabel="step", ylabel="training loss (weighted, nats)", yscale="log", title="loss")
    ax[0].legend(fontsize=8, loc="upper right")
    ax[1].plot(hist["val_step"], hist["val_acc"], "o-")
    ax[1].set(xlabel="step", ylabel="validation accuracy (fraction)", ylim=(0, 1.02), title="answer accuracy")
    fig.tight_layout()
    return fig


def plot_schedules(exp: dict):
    """Both schedules' loss curves and validation accuracy on image questions; a dotted line where
    text first adds the images."""
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.3))
    for name, (label, colour) in SCHEDULES.items():
        h = exp[name]["history"]
        ax[0].plot(h["loss"], color=colour, alpha=0.2, lw=0.6)
        ax[0].plot(trailing_mean(h["loss"]), color=colour, label=f"{label} (mean of the last 25 steps; faint: each step)")
        ax[1].plot(h["val_step"], h["val_acc"], "o-", color=colour, label=label)
    ax[0].axvline(_switch_step(exp), color="gray", ls=":", label="images added (text first)")
    ax[0].set(xlabel="step", ylabel="training loss (nats)", yscale="log")
    ax[1].set(xlabel="step", ylabel="validation accuracy, image questions", ylim=(0, 1.02))
    ax[0].legend(fontsize=7, loc="upper right")
    ax[1].legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def _switch_step(exp: dict) -> int:
    return int(exp["steps"] * exp.get("text_first_frac", 0.5))


def chance(qtypes=QTYPES) -> float:
    """The accuracy of guessing on a test set with the question types in equal shares."""
    return float(np.mean([CHANCE[q] for q in qtypes]))


def test_questions(exp: dict) -> collections.Counter:
    """How many held-out questions of each type the experiment scored: its test set is
    ``make_examples("test", n_test, seed + 1)``, ``n_test`` as stored or the experiment's default."""
    n = exp.get("n_test") or inspect.signature(step_zero_vs_text_first).parameters["n_test"].default
    return collections.Counter(e.qtype for e in make_examples("test", n, exp.get("seed", 0) + 1))


def _versus_guessing(acc: float, q: str, n: int) -> str:
    noise_q = 2 * math.sqrt(CHANCE[q] * (1 - CHANCE[q]) / n)
    return ("above guessing" if acc - CHANCE[q] > noise_q else "below guessing" if CHANCE[q] - acc > noise_q
            else "no better than guessing")


def schedule_lines(exp: dict, *, rerun: bool = False) -> str:
    """Each schedule's held-out accuracy (per type, each against guessing) and best grounding, then
    what separates them, every comparison computed from the numbers printed and judged against two
    standard errors of the held-out questions."""
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
                     f"best grounding ratio {r['best_grounding']:.1f}")
    a, b = exp["mixed"]["test_acc"]["all"], exp["text_first"]["test_acc"]["all"]
    gap = noise.gap_words(b, a, noise.two_se_shares(a, b, n), above="text first ahead", below="mixed ahead",
                          level="no measurable difference", fmt=lambda x: f"{100 * x:.1f} points")
    sharper, duller = sorted(SCHEDULES, key=lambda k: -exp[k]["best_grounding"])
    ratio = words.more_or_less(exp[sharper]["best_grounding"], exp[duller]["best_grounding"], bigger="higher",
                               smaller="lower", same="about as high as")
    lines.append(f"accuracy, text first {b:.1%} against mixed {a:.1%}: {gap}; grounding: the sharper head "
                 f"is in the {SCHEDULES[sharper][0]} model ({ratio} the {SCHEDULES[duller][0]} model's)")
    loss = trailing_mean(exp["text_first"]["history"]["loss"])
    s = _switch_step(exp)
    if 0 < s < len(loss):
        after = float(loss[s:s + 50].max())
        lines.append(f"text first, where the images arrive (step {s}): its mean loss "
                     f"{words.change(float(loss[s - 1]), after, unit='nats')} within 50 steps")
    return "\n".join(lines)
