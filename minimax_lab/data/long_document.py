"""Long-context variant: many images interleaved with text, a question about one far back.

``long_document(n_images=32, needle=None, seed=0)`` builds
``<bos> image 0 <img>*16 . image 1 <img>*16 . ... in image N what colour is the triangle ? ANSWER <eos>``
The needle image ``N`` (default: one of the first quarter) holds the asked shape exactly once,
so answering needs attention to reach back ~``(n_images - N) * 19`` tokens. Unlike
:mod:`minimax_lab.data.needle` (what the MSA chapter measures), the question names the image by
number, a binding the tiny model never saw in training.
"""
from __future__ import annotations

import numpy as np
import torch

from minimax_lab.data.examples import PATCHES_PER_IMAGE, make_question, random_scene
from minimax_lab.data.shapes import render
from minimax_lab.data.tokenizer import TOKENIZER


def long_document(n_images: int = 32, *, needle: int | None = None, seed: int = 0) -> dict:
    """Returns a dict: ``tokens`` int64 ``[1, S]``, ``images`` float32 ``[1, n_images, 3, 32, 32]``,
    ``answer`` (word), ``answer_id``, ``answer_pos`` (index of the final "?"), ``needle`` (image
    index), ``needle_span`` (start, end) sequence indices of the needle's patches, ``image_starts``
    (list of first-patch indices). Raises ValueError if ``n_images`` is outside [1, 99] or
    ``needle`` outside ``[0, n_images)``."""
    if not 1 <= n_images <= 99:
        raise ValueError(f"n_images must be in [1, 99], got {n_images}")
    rng = np.random.default_rng([seed, 7])
    if needle is None:
        needle = int(rng.integers(0, max(1, n_images // 4)))
    if not 0 <= needle < n_images:
        raise ValueError(f"needle must be in [0, {n_images}), got {needle}")
    tok = TOKENIZER
    ids, images, starts = [tok.bos_id], [], []
    for i in range(n_images):
        objects = random_scene(rng)
        if i == needle:
            while (made := make_question(objects, "colour", rng)) is None:
                objects = random_scene(rng)
            question, answer, _ = made
        ids += tok.encode(["image", str(i)])
        starts.append(len(ids))
        ids += [tok.img_id] * PATCHES_PER_IMAGE + tok.encode(["."])
        images.append(render(objects, rng=rng))
    ids += tok.encode(["in", "image", str(needle)] + question)
    answer_pos = len(ids) - 1
    ids += tok.encode([answer]) + [tok.eos_id]
    return {"tokens": torch.tensor([ids]), "images": torch.stack(images)[None], "answer": answer,
            "answer_id": tok.encode([answer])[0], "answer_pos": answer_pos, "needle": needle,
            "needle_span": (starts[needle], starts[needle] + PATCHES_PER_IMAGE), "image_starts": starts}
