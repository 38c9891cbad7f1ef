"""Training loop (tqdm progress, validation eval), accuracy on held-out splits, and checkpoints
stored as plain tensors + a config dict (loaded with ``torch.load(weights_only=True)``, never
pickled objects).

Schedules (``TrainConfig.schedule``):

* ``"image"``: every step an image+question batch.
* ``"mixed"``: both modalities from step zero -- even steps image batches, odd steps text-only
  batches (the scene described in words).
* ``"text_first"``: text-only batches for the first ``text_first_frac`` of the steps, then
  ``"mixed"``. Same step budget as ``"mixed"``.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from minimax_lab import resources, runtime
from minimax_lab.data.examples import QTYPES, batches, collate, make_examples
from minimax_lab.model.config import ModelConfig
from minimax_lab.model.model import TinyMultimodalModel
from minimax_lab.runtime import pick
from minimax_lab.validate import check_choice

SCHEDULES = ("image", "mixed", "text_first")
#: The shipped CPU-preset checkpoint, ``minimax_lab/assets/tiny_cpu.pt`` (its training history and
#: the step-zero experiment lie beside it).
DEFAULT_CHECKPOINT = resources.checkpoint_path()


@dataclass
class TrainConfig:
    """Optimisation settings. AdamW; learning rate warms up linearly for ``warmup`` steps, then
    follows a cosine down to ``min_lr_frac * lr``. ``answer_weight`` multiplies the loss of the
    answer token relative to the other text tokens (1 = plain next-token loss). ``index_loss_weight``
    (models with ``attention="msa"`` only) adds the index branch's distillation loss
    (``model.index_loss``, see :mod:`minimax_lab.model.model`) with that weight, so the indexer
    learns while the main branch trains through MSA; 0 leaves it untrained."""

    steps: int = 1500
    batch_size: int = 64
    lr: float = 1e-3
    min_lr_frac: float = 0.05
    weight_decay: float = 0.05
    warmup: int = 100
    answer_weight: float = 5.0
    eval_every: int = 100
    eval_examples: int = 256
    seed: int = 0
    schedule: str = "image"
    text_first_frac: float = 0.5
    aux_loss_weight: float = 0.01
    index_loss_weight: float = 0.0


def preset_train_config(preset: str = "auto", **overrides) -> TrainConfig:
    """The training settings that go with :func:`~minimax_lab.model.preset_config` (the CPU preset
    trained the shipped checkpoint); keyword overrides win."""
    base = pick(preset, cpu=dict(steps=2000, batch_size=64, lr=1e-3),
                gpu=dict(steps=3000, batch_size=128, lr=1e-3))
    return TrainConfig(**{**base, **overrides})


def lm_loss(model: TinyMultimodalModel, batch, answer_weight: float = 1.0, *, index_loss: bool = False) -> torch.Tensor:
    """Weighted mean next-token cross-entropy over text targets (never on image placeholders or
    pad); the answer token's loss counts ``answer_weight`` times. ``index_loss``: the forward also
    leaves the index branch's loss in ``model.index_loss``."""
    logits = model(batch.tokens, batch.images, index_loss=index_loss)
    ce = F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(), reduction="none").view(batch.targets.shape)
    w = batch.loss_mask.float()
    if answer_weight != 1.0:
        w[torch.arange(w.shape[0], device=w.device), batch.answer_pos] *= answer_weight
    return (ce * w).sum() / w.sum()


def lr_factor(tc: TrainConfig, step: int) -> float:
    """Multiplier of ``tc.lr`` at ``step``: linear warm-up, then cosine to ``tc.min_lr_frac``."""
    if step < tc.warmup:
        return (step + 1) / tc.warmup
    t = min(1.0, (step - tc.warmup) / max(1, tc.steps - tc.warmup))
    return tc.min_lr_frac + (1 - tc.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t))


def _model_device(model) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def accuracy(model: TinyMultimodalModel, examples, batch_size: int = 256) -> dict:
    """Answer accuracy (argmax at the answer position) overall (``"all"``) and per question type."""
    was = model.training
    model.eval()
    dev = _model_device(model)
    hits = {q: [0, 0] for q in QTYPES}
    for i in range(0, len(examples), batch_size):
        b = collate(examples[i:i + batch_size]).to(dev)
        logits = model(b.tokens, b.images)
        pred = logits[torch.arange(len(b.qtypes), device=dev), b.answer_pos].argmax(-1)
        for qt, ok in zip(b.qtypes, (pred == b.answer_id).tolist()):
            hits[qt][0] += ok
            hits[qt][1] += 1
    model.train(was)
    out = {q: h / n for q, (h, n) in hits.items() if n}
    out["all"] = sum(h for h, _ in hits.values()) / max(1, sum(n for _, n in hits.values()))
    return out


@torch.no_grad()
def evaluate(model: TinyMultimodalModel, examples, batch_size: int = 256) -> float:
    """Mean (unweighted) text loss over ``examples``."""
    was = model.training
    model.eval()
    dev = _model_device(model)
    losses = [lm_loss(model, collate(examples[i:i + batch_size]).to(dev)).item()
              for i in range(0, len(examples), batch_size)]
    model.train(was)
    return sum(losses) / len(losses)


def _modality(tc: TrainConfig, step: int) -> bool:
    """True -> image batch at this step."""
    if tc.schedule == "image":
        return True
    if tc.schedule == "text_first" and step < int(tc.text_first_frac * tc.steps):
        return False
    return step % 2 == 0


def train(cfg: ModelConfig, tc: TrainConfig = TrainConfig(), *, progress: bool = True, model=None, device=None):
    """Train from ``tc.seed`` (model init and data); returns ``(model, history)``.

    history: ``step``, ``loss`` (per step, the weighted training loss), ``lr``, ``val_step`` /
    ``val_loss`` / ``val_acc`` (image QA on the validation split every ``eval_every`` steps),
    ``seconds``. ``device``: where to train (default: the CPU, or the device the Triton kernels
    run on when ``cfg.attn_impl`` is ``"triton"`` -- a GPU when there is one). Deterministic for a given seed on
    one machine and thread count: the data stream is a pure function of the seed, the weights are
    initialised after ``torch.manual_seed(seed)``, and deterministic algorithms are switched on
    for the duration of the call.
    """
    check_choice(tc.schedule, "schedule", SCHEDULES)
    if tc.index_loss_weight and cfg.attention != "msa":
        raise ValueError(f"index_loss_weight={tc.index_loss_weight} trains MSA's index branch: it needs "
                         f"attention='msa', got {cfg.attention!r}")
    if device is None:
        device = runtime.kernel_device() if cfg.attn_impl == "triton" else torch.device("cpu")
    device = torch.device(device)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        torch.manual_seed(tc.seed)
        model = (model or TinyMultimodalModel(cfg)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay, betas=(0.9, 0.98))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(tc, s))
        img_stream = batches("train", tc.batch_size, tc.seed, with_image=True)
        txt_stream = batches("train", tc.batch_size, tc.seed, with_image=False)
        val = make_examples("val", tc.eval_examples, tc.seed)
        hist = {"step": [], "loss": [], "lr": [], "val_step": [], "val_loss": [], "val_acc": []}
        t0 = time.perf_counter()
        it = tqdm(range(tc.steps), desc=f"train ({tc.schedule})", disable=not progress)
        model.train()
        for step in it:
            batch = (next(img_stream) if _modality(tc, step) else next(txt_stream)).to(device)
            index = tc.index_loss_weight > 0
            loss = (lm_loss(model, batch, tc.answer_weight, index_loss=index) + tc.aux_loss_weight * model.aux_loss
                    + tc.index_loss_weight * model.index_loss)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            hist["lr"].append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
            hist["step"].append(step)
            hist["loss"].append(loss.item())
            if (step + 1) % tc.eval_every == 0 or step + 1 == tc.steps:
                hist["val_step"].append(step + 1)
                hist["val_loss"].append(evaluate(model, val))
                hist["val_acc"].append(accuracy(model, val)["all"])
                if hasattr(it, "set_postfix"):
                    it.set_postfix(loss=f"{loss.item():.3f}", val_acc=f"{hist['val_acc'][-1]:.3f}")
        hist["seconds"] = time.perf_counter() - t0
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
    model.eval()
    return model, hist


def save_checkpoint(path, model: TinyMultimodalModel, *, meta: dict | None = None) -> None:
    """Write ``{"config": dict, "state_dict": tensors, "meta": dict}`` (plain types only)."""
    sd = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    torch.save({"config": model.cfg.to_dict(), "state_dict": sd, "meta": meta or {}}, str(path))


def load_checkpoint(path, **overrides):
    """Load a checkpoint with ``weights_only=True``; ``overrides`` change config fields that do not
    change the weights (e.g. ``attn_impl="reference"``). Returns ``(model, cfg, meta)``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    blob = torch.load(str(path), map_location="cpu", weights_only=True)
    cfg = ModelConfig.from_dict({**blob["config"], **overrides})
    model = TinyMultimodalModel(cfg)
    missing, unexpected = model.load_state_dict(blob["state_dict"], strict=False)
    bad = [k for k in missing if ".idx_" not in k]  # only the optional indexer may be absent
    if unexpected or bad:
        raise ValueError(f"checkpoint {path} does not match the config: missing {bad}, unexpected {unexpected}")
    model.eval()
    return model, cfg, blob.get("meta", {})


def load_pretrained(path=None, **overrides):
    """The shipped CPU-preset checkpoint (:data:`DEFAULT_CHECKPOINT`) -> ``(model, cfg)`` in eval mode.
    ``overrides`` as in :func:`load_checkpoint`; with ``use_indexer=True`` the index projections
    (not in the checkpoint) start from random init."""
    model, cfg, _ = load_checkpoint(path or DEFAULT_CHECKPOINT, **overrides)
    return model, cfg
