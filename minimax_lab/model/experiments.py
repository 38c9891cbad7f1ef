"""The two measured experiments of notebook 01.

*Grounding ratio*: at the answer position (the final "?"), the share of a head's attention *on the
image* that lands on the patches of the object(s) the question is about, divided by the object's
share of the image's patches (``n_focus / n_patches``). 1 = no preference within the image; the
16-patch image caps it at ``16 / n_focus``. It says nothing of how much the head reads the image at
all: that is the *image share*, the answer position's attention on the 16 patches, kept beside it.
Averaged over examples that have at least one focus patch. Runs recorded with
``"grounding_measure": "within_image"`` hold this ratio; older records (no such key) hold the
attention on the object over ``n_focus / n_patches`` of the *whole* row, which is the image share
times this ratio.

*From step zero vs text first*: the same config and step budget trained with the ``"mixed"``
schedule (both modalities from step zero) and the ``"text_first"`` schedule (text-only scene
descriptions for the first half, then both); compared on loss curves, held-out image-QA
accuracy and grounding.
"""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import platform

import torch

from minimax_lab.data.examples import PATCHES_PER_IMAGE, collate, make_examples
from minimax_lab.model.config import ModelConfig
from minimax_lab.model.train import TrainConfig, accuracy, train


#: the key a run's record carries when its grounding numbers are the within-image ratio above
GROUNDING_MEASURE = "within_image"


@torch.no_grad()
def grounding_per_question(model, examples, batch_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grounding, image_share)``, each ``[N, n_layers, n_heads]`` fp32 on the CPU, for the ``N``
    examples that have an image and a non-empty focus, in their order: the answer position's
    grounding ratio (within the image) and the share of its attention on the image's patches.
    Raises ValueError if no example qualifies."""
    dev = next(model.parameters()).device
    kept = [e for e in examples if e.image is not None and e.focus]
    if not kept:
        raise ValueError("grounding needs image examples with at least one focus patch")
    ratios, shares = [], []
    for i in range(0, len(kept), batch_size):
        b = collate(kept[i:i + batch_size]).to(dev)
        _, cap = model(b.tokens, b.images, capture=True)
        rows = torch.arange(len(b.tokens), device=dev)
        answer_rows = torch.stack([a[rows, :, b.answer_pos] for a in cap["attn"]], 1)   # [B, L, H, S]
        on_image = answer_rows[..., 1:1 + PATCHES_PER_IMAGE]                            # patches follow <bos>
        image_share = on_image.sum(-1)
        focus = b.focus.float()[:, None, None, :]
        object_share = (on_image * focus).sum(-1) / image_share
        ratios.append((object_share / (focus.sum(-1) / PATCHES_PER_IMAGE)).cpu())
        shares.append(image_share.cpu())
    return torch.cat(ratios), torch.cat(shares)


def grounding_ratios(model, examples, batch_size: int = 128) -> torch.Tensor:
    """``[n_layers, n_heads]`` mean grounding ratio over ``examples`` (image examples with a focus
    only; :func:`grounding_per_question`). Raises ValueError if none qualifies."""
    return grounding_per_question(model, examples, batch_size)[0].mean(0)


def step_zero_vs_text_first(cfg: ModelConfig, steps: int = 1500, *, seed: int = 0, tc: TrainConfig | None = None,
                            n_test: int = 500, progress: bool = True, device=None) -> dict:
    """Train the ``"mixed"`` and ``"text_first"`` schedules with the same config and step budget
    (other settings from ``tc``) on ``device`` (as :func:`train`), then score each on the CPU; returns
    per schedule ``history``, ``test_acc`` (held-out image questions, per type) and ``grounding``
    (``[L, H]`` list) plus ``best_grounding``, and ``grounding_measure``."""
    base = dict(vars(tc)) if tc is not None else {}
    base.update(steps=steps, seed=seed, eval_every=max(1, steps // 10))
    test = make_examples("test", n_test, seed + 1)
    out = {"steps": steps, "seed": seed, "model_config": cfg.to_dict()}
    for schedule in ("mixed", "text_first"):
        run = TrainConfig(**{**base, "schedule": schedule})
        out["train_config"] = {k: v for k, v in vars(run).items() if k != "schedule"}
        out["text_first_frac"] = run.text_first_frac
        model, hist = train(cfg, run, progress=progress, device=device)
        model = model.cpu()
        g = grounding_ratios(model, test)
        out[schedule] = {"history": hist, "test_acc": accuracy(model, test), "grounding": g.tolist(),
                         "best_grounding": float(g.max())}
    out["grounding_measure"] = GROUNDING_MEASURE
    out["n_test"] = n_test
    return out


def _one_seed(cfg: ModelConfig, steps: int, seed: int, tc: TrainConfig | None, n_test: int, progress: bool,
              device, threads: int | None) -> dict:
    if threads:
        torch.set_num_threads(threads)
    r = step_zero_vs_text_first(cfg, steps, seed=seed, tc=tc, n_test=n_test, progress=progress, device=device)
    on_gpu = device is not None and torch.device(device).type == "cuda"
    r["trained_on"] = (torch.cuda.get_device_name(torch.device(device)) if on_gpu else
                       f"{platform.node()} {platform.processor() or platform.machine()}, "
                       f"{torch.get_num_threads()} threads")
    r["versions"] = {"torch": torch.__version__, "python": platform.python_version()}
    return r


def step_zero_experiment(cfg: ModelConfig, steps: int, seeds, *, tc: TrainConfig | None = None, n_test: int = 1000,
                         progress: bool = False, device=None, jobs: int = 1) -> dict:
    """:func:`step_zero_vs_text_first` once per seed (the weights, the data stream and the test
    questions follow the seed; ``tc``'s other settings are kept), training on ``device`` (default:
    the CPU); ``jobs`` > 1 runs that many seeds at once in separate processes of one thread each
    (the same numbers as one after the other with one thread). Returns the first seed's run with
    the others under ``"more_seeds"``, each with where it was trained and the versions. ValueError
    without a seed or with ``jobs`` < 1."""
    seeds = list(seeds)
    if not seeds:
        raise ValueError("the step-zero experiment needs at least one seed")
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    if jobs == 1:
        out = [_one_seed(cfg, steps, s, tc, n_test, progress, device, None) for s in seeds]
    else:
        ctx = multiprocessing.get_context("spawn")   # a fresh interpreter per seed: no inherited torch state
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
            out = list(pool.map(_one_seed, *zip(*[(cfg, steps, s, tc, n_test, False, device, 1) for s in seeds])))
    return {**out[0], "more_seeds": out[1:]}
