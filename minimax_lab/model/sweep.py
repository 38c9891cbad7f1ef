"""A small parallel sweep of training configs for the tiny model (one process per config).

It searches for a config that meets chapter 01's bar (held-out accuracy >= 95 %, a head with
grounding ratio >= 3) at a size the CPU trains in minutes, the way the shipped checkpoint's config
was chosen. Each run is a ``(ModelConfig overrides, TrainConfig overrides)`` pair; results
(per-type held-out accuracy, best grounding, wall seconds) are written as JSON::

    python -m minimax_lab.model.sweep --out sweep.json --device cuda --procs 12
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time

import torch

from minimax_lab.data import make_examples
from minimax_lab.model.config import ModelConfig
from minimax_lab.model.experiments import grounding_ratios
from minimax_lab.model.train import TrainConfig, accuracy, train

GRID = [
    ({"d_model": 128, "n_layers": 3}, {}),
    ({"d_model": 128, "n_layers": 4}, {}),
    ({"d_model": 128, "n_layers": 4}, {"lr": 2e-3}),
    ({"d_model": 128, "n_layers": 4}, {"lr": 5e-3}),
    ({"d_model": 128, "n_layers": 4}, {"answer_weight": 1.0}),
    ({"d_model": 128, "n_layers": 4}, {"batch_size": 32, "steps": 2000}),
    ({"d_model": 192, "n_layers": 4}, {"lr": 2e-3}),
    ({"d_model": 96, "n_layers": 4}, {}),
    ({"d_model": 128, "n_layers": 4, "n_heads": 8, "n_kv_heads": 4, "head_dim": 16}, {}),
    ({"d_model": 128, "n_layers": 6}, {}),
    ({"d_model": 128, "n_layers": 4}, {"steps": 2000}),
    ({"d_model": 64, "n_layers": 4}, {}),
]


def _model_overrides(m: dict) -> dict:
    d = m["d_model"]
    out = {"n_heads": 4, "n_kv_heads": 2, "head_dim": d // 4, "d_ff": 2 * d}
    return {**out, **m}


def run_one(args) -> dict:
    """Train one config and measure it (runs in a worker process)."""
    model_over, train_over, device, n_test = args
    torch.set_num_threads(1)
    cfg = ModelConfig(**_model_overrides(model_over))
    tc = TrainConfig(**{"steps": 1000, "eval_every": 250, **train_over})
    t0 = time.perf_counter()
    model, hist = train(cfg, tc, progress=False, device=device)
    test = make_examples("test", n_test, 1)
    acc = accuracy(model, test)
    g = grounding_ratios(model, test[:256])
    return {"model": model_over, "train": train_over, "test_acc": acc, "best_grounding": float(g.max()),
            "val_acc": hist["val_acc"], "final_loss": sum(hist["loss"][-50:]) / 50,
            "seconds": time.perf_counter() - t0}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--n-test", type=int, default=1000)
    p.add_argument("--only", type=str, default="", help="comma-separated indices into GRID")
    p.add_argument("--steps", type=int, default=0, help="override every run's step count (smoke tests)")
    a = p.parse_args(argv)
    grid = [GRID[int(i)] for i in a.only.split(",")] if a.only else GRID
    jobs = [(m, {**t, "steps": a.steps, "eval_every": a.steps} if a.steps else t, a.device, a.n_test) for m, t in grid]
    results = []
    with mp.get_context("spawn").Pool(min(a.procs, len(jobs))) as pool:
        for r in pool.imap_unordered(run_one, jobs):
            results.append(r)
            print(json.dumps({k: r[k] for k in ("model", "train", "test_acc", "best_grounding", "seconds")}),
                  flush=True)
            with open(a.out, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
