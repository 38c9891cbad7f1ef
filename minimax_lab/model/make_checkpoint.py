"""Train the shipped CPU-preset checkpoint and (optionally) the step-zero experiment.

    OMP_NUM_THREADS=2 python -m minimax_lab.model.make_checkpoint              # tiny_cpu.pt + history
    python -m minimax_lab.model.make_checkpoint --experiment --jobs 3          # experiment_step_zero.json
    python -m minimax_lab.model.make_checkpoint --experiment --device cuda     # the same, trained on a GPU

The experiment trains both schedules for 600 steps (``--steps``) per seed (``--seeds``, default
0 1 2); on a CPU each seed takes about half an hour on one thread, and ``--jobs`` runs seeds side
by side, one thread each.

From a clone the files replace the shipped ones in ``minimax_lab/assets/``; from an installed
package they go to the working directory (``--out-dir`` chooses; load the checkpoint with
``load_pretrained(path)``).

The checkpoint stores plain tensors, the config dict and a ``meta`` dict (held-out accuracy,
best grounding ratio, training seconds, where it was trained), so tests and the notebook can
check it without retraining.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from minimax_lab import resources
from minimax_lab.data import make_examples
from minimax_lab.model.config import preset_config
from minimax_lab.model.experiments import grounding_ratios, step_zero_experiment
from minimax_lab.model.train import DEFAULT_CHECKPOINT, accuracy, preset_train_config, save_checkpoint, train

#: steps of each schedule in the shipped step-zero experiment
EXPERIMENT_STEPS = 600


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experiment", action="store_true", help="run the step-zero vs text-first experiment")
    p.add_argument("--steps", type=int, default=0, help="override the preset's steps")
    p.add_argument("--lr", type=float, default=0.0, help="override the preset's learning rate")
    p.add_argument("--out-dir", default=str(DEFAULT_CHECKPOINT.parent) if resources.checkout_root() else ".",
                   help="folder for the files (default: minimax_lab/assets/ in a clone, else the working directory)")
    p.add_argument("--n-test", type=int, default=1000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="experiment: one run per seed")
    p.add_argument("--device", default=None, help="experiment: where to train (default: the CPU)")
    p.add_argument("--jobs", type=int, default=1, help="experiment: seeds trained at once (CPU, one thread each)")
    a = p.parse_args(argv)
    if a.jobs < 1 or a.steps < 0 or a.n_test < 1:
        p.error("--jobs and --n-test must be at least 1 and --steps not negative")
    cfg = preset_config("cpu")
    tc = preset_train_config("cpu", **({"steps": a.steps} if a.steps else {}), **({"lr": a.lr} if a.lr else {}))
    where = f"{platform.node()} {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    out_dir = Path(a.out_dir)
    if a.experiment:
        exp = step_zero_experiment(cfg, a.steps or EXPERIMENT_STEPS, a.seeds, tc=tc, n_test=a.n_test,
                                   device=a.device, jobs=a.jobs)
        (out_dir / "experiment_step_zero.json").write_text(json.dumps(exp))
        for r in (exp, *exp["more_seeds"]):
            for s in ("mixed", "text_first"):
                print(f"seed {r['seed']} {s}: held-out {r[s]['test_acc']['all']:.3f}, "
                      f"best grounding ratio {r[s]['best_grounding']:.2f}")
        return
    t0 = time.perf_counter()
    model, hist = train(cfg, tc)
    seconds = time.perf_counter() - t0
    test = make_examples("test", a.n_test, 1)
    acc = accuracy(model, test)
    g = grounding_ratios(model, test)
    meta = {"test_acc": acc, "best_grounding": float(g.max()), "grounding": g.tolist(), "train_seconds": seconds,
            "trained_on": where, "torch": str(torch.__version__), "train_config": vars(tc)}
    save_checkpoint(out_dir / DEFAULT_CHECKPOINT.name, model, meta=meta)
    (out_dir / "tiny_cpu_history.json").write_text(json.dumps({"train_config": vars(tc), "history": hist,
                                                               "test_acc": acc}))
    print("held-out", acc, "best grounding", round(float(g.max()), 2), f"{seconds:.0f} s on {where}")


if __name__ == "__main__":
    main()
