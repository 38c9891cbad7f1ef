"""Attention pictures for notebook 01: whole-sequence heatmaps with the image and text regions
marked, an answer token's attention drawn on the image (on its background, so the objects keep
their colours), and the grounding ratio per question (``grounding_per_question``, from
:mod:`minimax_lab.model.experiments`), its table with two standard errors and the image share, and
the sentences that compare heads against that noise.

All functions take matplotlib axes (or make a figure) and return the figure; inputs are the
``capture["attn"]`` tensors of :class:`minimax_lab.model.TinyMultimodalModel` (``[B,Hq,S,S]``).
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.cm import ScalarMappable
from matplotlib.colors import LinearSegmentedColormap, Normalize

from minimax_lab.data.examples import PATCHES_PER_IMAGE, collate
from minimax_lab.data.tokenizer import TOKENIZER
from minimax_lab.model.experiments import grounding_per_question  # noqa: F401 -- the chapter's entry point
from minimax_lab.viz import noise
from minimax_lab.viz.widgets import explore


def sequence_heatmap(attn: torch.Tensor, *, image_span=(1, 17), labels=None, ax=None, title: str = ""):
    """Heatmap of one head's ``[S, S]`` probabilities; the image span is shaded on both axes.
    ``labels``: optional token strings for the ticks (image patches shown as one label)."""
    a = attn.detach().float().cpu().numpy()
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"attn must be [S, S], got {a.shape}")
    fig = ax.figure if ax is not None else plt.figure(figsize=(5, 4.5))
    ax = ax or fig.add_subplot()
    im = ax.imshow(a, cmap="magma", vmin=0, vmax=max(1e-6, float(a.max())))
    s0, s1 = image_span
    for f in (ax.axvspan, ax.axhspan):
        f(s0 - 0.5, s1 - 0.5, color="cyan", alpha=0.12)
    ax.axvline(s1 - 0.5, color="cyan", lw=0.8)
    ax.axhline(s1 - 0.5, color="cyan", lw=0.8)
    ax.text(s0 + (s1 - s0) / 2, -1, "image", ha="center", va="bottom", color="tab:cyan", fontsize=8)
    ax.text((s1 + a.shape[0]) / 2, -1, "text", ha="center", va="bottom", color="tab:gray", fontsize=8)
    if labels is not None:
        ticks = [i for i in range(len(labels)) if not (s0 <= i < s1)]
        ax.set_yticks(ticks, [labels[i] for i in ticks], fontsize=6)
        ax.set_xticks([])
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    ax.set_title(title, fontsize=9, pad=14)
    fig.colorbar(im, ax=ax, fraction=0.046)
    return fig


#: the attention scale of :func:`image_overlay`: gray levels, which no object colour can be confused with
OVERLAY_CMAP = "gray"
_OVERLAY_TOP = 0.85   # the largest weight is drawn light gray, not white, so yellow objects stay visible


def _overlay_cmap():
    base = plt.get_cmap(OVERLAY_CMAP)
    return LinearSegmentedColormap.from_list("overlay_gray", base(np.linspace(0, _OVERLAY_TOP, 64)))


def overlay_colorbar(fig, ax, vmax: float, label: str = "attention weight on the patch"):
    """A colourbar for :func:`image_overlay` drawings with the same ``vmax``, beside ``ax`` (one
    axes or a list of them)."""
    sm = ScalarMappable(norm=Normalize(0, vmax), cmap=_overlay_cmap())
    return fig.colorbar(sm, ax=ax, fraction=0.046, pad=0.02, label=label)


def image_overlay(image: torch.Tensor, patch_weights: torch.Tensor, *, focus=None, ax=None, title: str = "",
                  vmax: float | None = None, colorbar: bool = True):
    """Draw ``image [3,H,W]`` with the attention on each patch (``patch_weights [P]``, P = grid^2,
    row-major) painted on the *background* pixels of the patch, as a gray level from black (0) to
    light gray (``vmax``, default the largest weight). The objects keep their own colours, so the
    colour a question asks about is never tinted; ``focus`` cells (the object asked about) get a
    dashed magenta outline. ``colorbar``: add the gray scale's colourbar (pass False, and one
    :func:`overlay_colorbar` with a common ``vmax``, for a grid of drawings)."""
    img = image.detach().float().cpu().permute(1, 2, 0).numpy()
    w = patch_weights.detach().float().cpu().numpy()
    g = int(round(len(w) ** 0.5))
    if g * g != len(w):
        raise ValueError(f"patch_weights must have a square number of entries, got {len(w)}")
    H = img.shape[0]
    if H % g:
        raise ValueError(f"an image of {H} pixels does not split into {g} x {g} patches")
    vmax = float(w.max()) if vmax is None else float(vmax)
    vmax = max(vmax, 1e-6)
    p = H // g
    per_pixel = np.kron(w.reshape(g, g), np.ones((p, p)))
    shade = _overlay_cmap()(np.clip(per_pixel / vmax, 0, 1))[..., :3]
    is_object = img.max(-1) > 0.3          # the background is dark gray (0.05), objects are bright colours
    shown = np.where(is_object[..., None], img, shade)
    fig = ax.figure if ax is not None else plt.figure(figsize=(3.6, 3.2))
    ax = ax or fig.add_subplot()
    ax.imshow(shown, interpolation="nearest")
    for c in focus or []:
        r, cc = divmod(int(c), g)
        ax.add_patch(plt.Rectangle((cc * p - 0.5, r * p - 0.5), p, p, fill=False, ec="magenta", lw=1.6, ls="--"))
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=8)
    if colorbar:
        overlay_colorbar(fig, ax, vmax)
    return fig


def mean_and_two_se(per_question: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The mean over questions (dim 0) and two standard errors of that mean."""
    x = per_question.double()
    n = x.shape[0]
    two_se = 2 * x.std(0) / math.sqrt(n) if n > 1 else torch.full_like(x[0], float("nan"))
    return x.mean(0).numpy(), two_se.numpy()


def grounding_table(per_question, image_share=None, *, ax=None, title: str | None = None):
    """Heatmap of the mean grounding ratio per layer and head, each cell with its two standard errors
    over the questions. ``per_question``: ``[N, layers, heads]`` (:func:`grounding_per_question`), or
    a ``[layers, heads]`` table of means (written without errors). ``image_share``: the matching
    per-question image shares (or their ``[layers, heads]`` means); when given, each cell's last line
    is the head's mean share of attention on the image."""
    per_question = torch.as_tensor(np.asarray(per_question, dtype=float))
    if per_question.dim() == 2:
        r, err, n = per_question.numpy(), None, None
    else:
        (r, err), n = mean_and_two_se(per_question), per_question.shape[0]
    share = None
    if image_share is not None:
        share = torch.as_tensor(np.asarray(image_share, dtype=float))
        share = (share.mean(0) if share.dim() == 3 else share).numpy()
        if share.shape != r.shape:
            raise ValueError(f"image_share must match the ratios' [layers, heads] {r.shape}, got {share.shape}")
    fig = ax.figure if ax is not None else plt.figure(figsize=(1.4 + 1.1 * r.shape[1], 0.9 + 0.85 * r.shape[0]))
    ax = ax or fig.add_subplot()
    im = ax.imshow(r, cmap="viridis", vmin=0)
    for (i, j), v in np.ndenumerate(r):
        text = f"{v:.1f}" if err is None else f"{v:.1f}\n±{err[i, j]:.1f}"
        if share is not None:
            text += f"\nimage {share[i, j]:.2f}"
        ax.text(j, i, text, ha="center", va="center", fontsize=7.5, color="white" if v < r.max() * 0.6 else "black")
    ax.set_xticks(range(r.shape[1]), [f"head {j}" for j in range(r.shape[1])])
    ax.set_yticks(range(r.shape[0]), [f"layer {i}" for i in range(r.shape[0])])
    if title is None:
        title = ("grounding ratio per layer/head" + ("" if n is None else f"\n(mean ± two standard errors, {n} questions)")
                 + ("" if share is None else "\nlast line: share of the answer's attention on the image"))
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046)
    return fig


def best_heads(per_question: torch.Tensor, k: int = 2) -> list[tuple[int, int]]:
    """The ``k`` (layer, head) pairs with the highest mean grounding ratio, best first."""
    mean = per_question.mean(0)
    return [divmod(int(f), mean.shape[1]) for f in torch.topk(mean.flatten(), k).indices]


def grounding_lines(per_question: torch.Tensor, image_share: torch.Tensor | None = None) -> str:
    """The best head's mean grounding ratio with two standard errors, against 1 (no preference for
    the asked-about object within the image), and against the runner-up head by their paired
    difference on the same questions (:func:`minimax_lab.viz.noise.mean_diff_words`). With
    ``image_share`` (``[N, layers, heads]``), each head's mean share of attention on the image too."""
    n = per_question.shape[0]
    (l1, h1), (l2, h2) = best_heads(per_question, 2)
    mean, two_se = mean_and_two_se(per_question)
    share = (lambda li, hi: "") if image_share is None else (
        lambda li, hi: f"; {float(image_share[:, li, hi].mean()):.2f} of its attention is on the image")
    best, err = float(mean[l1, h1]), float(two_se[l1, h1])
    versus_one = ("above 1: within the image it prefers the asked-about object" if best - err > 1 else
                  "not measurably above 1" if best + err >= 1 else
                  "below 1: within the image it avoids the asked-about object")
    diff = (per_question[:, l1, h1] - per_question[:, l2, h2]).tolist()
    return (f"best head: layer {l1} head {h1}, grounding ratio {best:.1f} ± {err:.1f} (two standard errors over "
            f"{n} questions), {versus_one}{share(l1, h1)}\n"
            f"against the runner-up, layer {l2} head {h2} ({float(mean[l2, h2]):.1f}{share(l2, h2)}): a paired "
            f"difference of {noise.mean_diff_words(diff, what='question', digits=1)}")


def token_labels(tokens) -> list:
    """Readable tick labels for one sequence: words, with image patches shown as ``p0..p15``."""
    out, k = [], 0
    for t in tokens.tolist():
        if t == TOKENIZER.img_id:
            out.append(f"p{k}")
            k += 1
        else:
            out.append(TOKENIZER.vocab[t])
    return out


def capture_attention(model, examples):
    """Run ``model`` on ``examples`` (collated) with capture on; returns ``(batch, attn)`` where
    ``attn`` is a list over layers of ``[B, Hq, S, S]`` fp32 CPU tensors."""
    dev = next(model.parameters()).device
    b = collate(list(examples))
    with torch.no_grad():
        _, cap = model(b.tokens.to(dev), None if b.images is None else b.images.to(dev), capture=True)
    return b, [a.cpu() for a in cap["attn"]]


def answer_view(batch, attn, *, layer: int, head: int, example: int, token: int | None = None, examples=None):
    """One figure: the whole-sequence heatmap of (layer, head) for one example, and the attention
    of query ``token`` (default: the answer position) drawn on the image, focus cells outlined."""
    L, H = len(attn), attn[0].shape[1]
    if not (0 <= layer < L and 0 <= head < H and 0 <= example < attn[0].shape[0]):
        raise ValueError(f"layer/head/example out of range: got ({layer}, {head}, {example}), have ({L}, {H}, "
                         f"{attn[0].shape[0]})")
    n = int((batch.tokens[example] != 0).sum())  # drop right padding
    a = attn[layer][example, head, :n, :n]
    pos = int(batch.answer_pos[example]) if token is None else int(token)
    labels = token_labels(batch.tokens[example, :n])
    fig, ax = plt.subplots(1, 2, figsize=(10, 4.4), gridspec_kw={"width_ratios": [1.5, 1]})
    sequence_heatmap(a, image_span=(1, 1 + PATCHES_PER_IMAGE), labels=labels, ax=ax[0],
                     title=f"layer {layer} head {head}: all queries")
    ax[0].axhline(pos, color="white", lw=0.6, ls="--")
    focus = batch.focus[example].nonzero().flatten().tolist()
    img = batch.images[example, 0]
    image_overlay(img, a[pos, 1:1 + PATCHES_PER_IMAGE], focus=focus, ax=ax[1],
                  title=f"query '{labels[pos]}' (pos {pos}) -> patches; "
                        f"mass on image {float(a[pos, 1:1 + PATCHES_PER_IMAGE].sum()):.2f}")
    q = " ".join(w for w in labels[1 + PATCHES_PER_IMAGE:pos + 1])
    fig.suptitle(f"{q}  ->  answer: {labels[pos + 1] if pos + 1 < n else '?'}", fontsize=10)
    fig.tight_layout()
    return fig


def explore_attention(batch, attn, *, defaults=None) -> None:
    """Pickers for layer, head, example and query token over :func:`answer_view`, shown through
    :func:`minimax_lab.viz.widgets.explore`: one picture (``defaults`` or the first values), with
    controls wherever widgets work. ``token = -1`` means the answer position."""
    S = batch.tokens.shape[1]

    def draw(layer, head, example, token):
        return answer_view(batch, attn, layer=layer, head=head, example=example,
                           token=None if token < 0 else min(token, int((batch.tokens[example] != 0).sum()) - 1))

    explore(draw, defaults=defaults, layer=range(len(attn)), head=range(attn[0].shape[1]),
            example=range(attn[0].shape[0]), token=range(-1, S))


def plot_top_heads(ratios: torch.Tensor, batch, attn, *, n_heads: int = 3, n_examples: int = 6):
    """The ``n_heads`` heads with the highest grounding ratio (rows, from ``ratios [layers, heads]``)
    on the first ``n_examples`` examples of ``batch`` (columns): each drawing is the answer
    position's attention on the patches, on one gray scale for the whole grid."""
    heads = [divmod(flat, ratios.shape[1]) for flat in torch.topk(ratios.flatten(), n_heads).indices.tolist()]
    weights = {(li, hi, col): attn[li][col, hi, int(batch.answer_pos[col]), 1:1 + PATCHES_PER_IMAGE]
               for li, hi in heads for col in range(n_examples)}
    vmax = max(float(w.max()) for w in weights.values())
    fig, axs = plt.subplots(n_heads, n_examples, figsize=(14, 2.3 * n_heads), layout="constrained", squeeze=False)
    for row, (li, hi) in enumerate(heads):
        for col in range(n_examples):
            n = int((batch.tokens[col] != TOKENIZER.pad_id).sum())
            words = token_labels(batch.tokens[col, :n])[1 + PATCHES_PER_IMAGE:int(batch.answer_pos[col]) + 1]
            image_overlay(batch.images[col, 0], weights[li, hi, col], focus=batch.focus[col].nonzero().flatten().tolist(),
                          ax=axs[row, col], title=(f"L{li}H{hi}: " if col == 0 else "") + " ".join(words), vmax=vmax,
                          colorbar=False)
    overlay_colorbar(fig, axs.ravel().tolist(), vmax, label="answer position's attention on the patch")
    fig.suptitle(f"the {n_heads} most grounded heads (rows) on {n_examples} held-out questions; dashed magenta: "
                 "the object asked about", fontsize=9)
    return fig
