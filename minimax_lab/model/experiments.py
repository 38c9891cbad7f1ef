"""The two measured experiments of notebook 01.

*Grounding ratio*: at the answer position (the final "?"), the attention mass a head puts on the
patches of the object(s) the question is about, divided by what uniform attention over the
image would put there (``n_focus / n_patches``). 1 = no preference; the 16-patch image caps it
at ``16 / n_focus``. Averaged over examples that have at least one focus patch.

*From step zero vs text first*: the same config and step budget trained with the ``"mixed"``
schedule (both modalities from step zero) and the ``"text_first"`` schedule (text-only scene
descriptions for the first half, then both); compared on loss curves, held-out image-QA
accuracy and grounding.
"""
from __future__ import annotations

import torch

from minimax_lab.data.examples import PATCHES_PER_IMAGE, collate, make_examples
from minimax_lab.model.config import ModelConfig
from minimax_lab.model.train import TrainConfig, accuracy, train


@torch.no_grad()
def grounding_ratios(model, examples, batch_size: int = 128) -> torch.Tensor:
    """``[n_layers, n_heads]`` mean grounding ratio over ``examples`` (image examples only).
    Raises ValueError if no example has an image and a non-empty focus."""
    total, count = None, 0
    dev = next(model.parameters()).device
    for i in range(0, len(examples), batch_size):
        chunk = [e for e in examples[i:i + batch_size] if e.image is not None and e.focus]
        if not chunk:
            continue
        b = collate(chunk).to(dev)
        _, cap = model(b.tokens, b.images, capture=True)
        B = len(chunk)
        rows = torch.stack([a[torch.arange(B, device=dev), :, b.answer_pos] for a in cap["attn"]], 1)  # [B,L,H,S]
        img = rows[..., 1:1 + PATCHES_PER_IMAGE]  # patches follow <bos>
        f = b.focus.float()[:, None, None, :]
        ratio = (img * f).sum(-1) / (f.sum(-1) / PATCHES_PER_IMAGE)  # [B, L, H]
        total = ratio.sum(0) if total is None else total + ratio.sum(0)
        count += B
    if not count:
        raise ValueError("grounding needs image examples with at least one focus patch")
    return (total / count).cpu()


def step_zero_vs_text_first(cfg: ModelConfig, steps: int = 1500, *, seed: int = 0, tc: TrainConfig | None = None,
                            n_test: int = 500, progress: bool = True) -> dict:
    """Train the ``"mixed"`` and ``"text_first"`` schedules with the same config and step budget
    (other settings from ``tc``); returns per schedule ``history``, ``test_acc`` (held-out image
    questions, per type) and ``grounding`` (``[L, H]`` list) plus ``best_grounding``."""
    base = dict(vars(tc)) if tc is not None else {}
    base.update(steps=steps, seed=seed, eval_every=max(1, steps // 10))
    test = make_examples("test", n_test, seed + 1)
    out = {"steps": steps, "seed": seed, "model_config": cfg.to_dict()}
    for schedule in ("mixed", "text_first"):
        run = TrainConfig(**{**base, "schedule": schedule})
        out["train_config"] = {k: v for k, v in vars(run).items() if k != "schedule"}
        out["text_first_frac"] = run.text_first_frac
        model, hist = train(cfg, run, progress=progress)
        g = grounding_ratios(model, test)
        out[schedule] = {"history": hist, "test_acc": accuracy(model, test), "grounding": g.tolist(),
                         "best_grounding": float(g.max())}
    out["n_test"] = n_test
    return out
