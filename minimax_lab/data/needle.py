"""Needle documents: many images and one question whose answer is in exactly one of them.

    <bos> <img>*16 <img>*16 ... <img>*16 what colour is the triangle ?

``n_images`` images, one of them (the *needle*, at a random place) holds the asked shape exactly
once; the other images (the *haystack*) never contain that shape, so answering is pure content
retrieval. The question is worded as in the tiny model's training data and the needle scene comes
from :func:`minimax_lab.data.examples.balanced_scene` (the answer colour is uniform). What is
measured on them lives in :mod:`minimax_lab.model.needle`.
"""
from __future__ import annotations

import numpy as np
import torch

from minimax_lab.data.examples import PATCHES_PER_IMAGE, balanced_scene, random_scene
from minimax_lab.data.shapes import render
from minimax_lab.data.tokenizer import TOKENIZER
from minimax_lab.validate import check_positive_int


def needle_document(n_images: int, *, seed: int = 0, needle: int | None = None) -> dict:
    """One needle document (see the module docstring). Returns a dict: ``tokens`` int64 ``[S]``,
    ``images`` float32 ``[n_images, 3, 32, 32]``, ``answer`` (word), ``answer_id``, ``answer_pos``
    (index of the final "?"), ``needle`` (image index), ``needle_span`` (start, end) of its
    patches, ``focus_pos`` (sequence index of the asked object's patch), ``image_starts``.
    ``S = 1 + 16 * n_images + 6`` for every seed, so documents of one size stack into a batch.
    Raises ValueError if ``n_images < 1`` or ``needle`` is outside ``[0, n_images)``."""
    check_positive_int(n_images, "n_images")
    rng = np.random.default_rng([seed, n_images, 11])
    needle = int(rng.integers(0, n_images)) if needle is None else needle
    if not 0 <= needle < n_images:
        raise ValueError(f"needle must be in [0, {n_images}), got {needle}")
    objects, question, answer, focus = balanced_scene("colour", rng)  # as in training: answer colour uniform
    shape = question[-2]
    tok = TOKENIZER
    ids, images, starts = [tok.bos_id], [], []
    for i in range(n_images):
        objs = objects
        while i != needle and any(o.shape == shape for o in objs):  # haystack: no asked shape
            objs = random_scene(rng)
        starts.append(len(ids))
        ids += [tok.img_id] * PATCHES_PER_IMAGE
        images.append(render(objs))  # no jitter, as the training examples
    ids += tok.encode(question)
    return {"tokens": torch.tensor(ids), "images": torch.stack(images), "answer": answer,
            "answer_id": tok.encode([answer])[0], "answer_pos": len(ids) - 1, "needle": needle,
            "needle_span": (starts[needle], starts[needle] + PATCHES_PER_IMAGE),
            "focus_pos": starts[needle] + focus[0], "image_starts": starts}


def needle_batch(n_images: int, n_docs: int, *, seed: int = 0) -> dict:
    """``n_docs`` documents of ``n_images`` images stacked: ``tokens [N, S]``, ``images
    [N, n_images, 3, 32, 32]`` and int64 tensors ``answer_id``, ``answer_pos``, ``focus_pos``,
    ``needle_start`` ``[N]`` (document ``i`` uses seed ``seed * 100003 + i``)."""
    check_positive_int(n_docs, "n_docs")
    docs = [needle_document(n_images, seed=seed * 100003 + i) for i in range(n_docs)]
    col = lambda key: torch.tensor([d[key] for d in docs])  # noqa: E731
    return {"tokens": torch.stack([d["tokens"] for d in docs]), "images": torch.stack([d["images"] for d in docs]),
            "answer_id": col("answer_id"), "answer_pos": col("answer_pos"), "focus_pos": col("focus_pos"),
            "needle_start": torch.tensor([d["needle_span"][0] for d in docs])}
