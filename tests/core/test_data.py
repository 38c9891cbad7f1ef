"""Generated image+text data: determinism, disjoint splits, balanced answers, tokenizer errors,
the long-document variant. Data is generated on the CPU (numpy); batches are checked after the
move to the kernel device, where the model consumes them."""
from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.devices import DEVICE

from minimax_lab.data import (COLOURS, GRID, IMAGE_SIZE, PATCHES_PER_IMAGE, QTYPES, SHAPES, TOKENIZER, SceneObject,
                              collate, long_document, make_examples, render)
from minimax_lab.data.examples import balanced_scene, scene_split


def _key(e):
    return tuple(sorted((o.shape, o.colour, o.row, o.col) for o in e.objects))


def test_same_seed_same_data_other_seed_other_data():
    a, b, c = make_examples("train", 40, 3), make_examples("train", 40, 3), make_examples("train", 40, 4)
    assert [(_key(e), e.question, e.answer) for e in a] == [(_key(e), e.question, e.answer) for e in b]
    assert all(torch.equal(x.image, y.image) for x, y in zip(a, b))
    assert [_key(e) for e in a] != [_key(e) for e in c]


def test_splits_share_no_scene():
    sets = {s: {_key(e) for e in make_examples(s, 300, 0)} for s in ("train", "val", "test")}
    assert not sets["train"] & sets["test"] and not sets["train"] & sets["val"] and not sets["val"] & sets["test"]
    for s, keys in sets.items():
        assert all(scene_split([SceneObject(*k) for k in key]) == s for key in keys)


def test_answers_are_balanced_and_consistent_with_the_scene():
    ex = make_examples("train", 1200, 0)
    for qt, n_answers in (("colour", len(COLOURS)), ("count", 4), ("left", 2)):
        counts = collections.Counter(e.answer for e in ex if e.qtype == qt)
        assert len(counts) == n_answers, (qt, counts)
        total = sum(counts.values())
        assert min(counts.values()) > 0.6 * total / n_answers, (qt, counts)
    for e in ex:  # the answer is true of the scene
        if e.qtype == "colour":
            shape = e.question[-2]
            (obj,) = [o for o in e.objects if o.shape == shape]
            assert obj.colour == e.answer and e.focus == [obj.row * GRID + obj.col]
        elif e.qtype == "count":
            shape = e.question[2][:-1]
            assert int(e.answer) == sum(o.shape == shape for o in e.objects) == len(e.focus)
        else:
            (a,) = [o for o in e.objects if (o.colour, o.shape) == (e.question[2], e.question[3])]
            assert (e.answer == "yes") == (a.col < GRID // 2) and e.focus == [a.row * GRID + a.col]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), qtype=st.sampled_from(QTYPES))
def test_scenes_are_valid(seed, qtype):
    objects, q, answer, focus = balanced_scene(qtype, np.random.default_rng(seed))
    assert 2 <= len(objects) <= 4
    assert len({(o.row, o.col) for o in objects}) == len(objects)  # distinct cells
    assert len({(o.shape, o.colour) for o in objects}) == len(objects)  # distinct kinds
    assert all(0 <= c < PATCHES_PER_IMAGE for c in focus)
    TOKENIZER.encode(q + [answer])  # every word is in the vocabulary


def test_render_puts_each_object_in_its_cell():
    objs = [SceneObject("square", "red", 0, 0), SceneObject("circle", "blue", 3, 2)]
    img = render(objs)
    assert img.shape == (3, IMAGE_SIZE, IMAGE_SIZE) and img.dtype == torch.float32
    cell = IMAGE_SIZE // GRID
    assert img[0, :cell, :cell].max() > 0.8  # red square top-left
    assert img[2, 3 * cell:, 2 * cell:3 * cell].max() > 0.9  # blue circle
    assert img[:, cell:2 * cell, cell:2 * cell].max() < 0.1  # an empty cell is background
    with pytest.raises(ValueError, match="outside"):
        render([SceneObject("square", "red", 4, 0)])
    with pytest.raises(ValueError, match="colour"):
        render([SceneObject("square", "pink", 0, 0)])
    with pytest.raises(ValueError, match="multiple"):
        render(objs, size=30)


def test_tokenizer_roundtrip_and_errors():
    words = "what colour is the triangle ?".split()
    assert TOKENIZER.decode(TOKENIZER.encode(words)) == " ".join(words)
    with pytest.raises(ValueError, match="unknown token 'octagon'"):
        TOKENIZER.encode("what colour is the octagon ?")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        TOKENIZER.decode([len(TOKENIZER)])


def test_collate_layout():
    ex = make_examples("val", 6, 0)
    cpu = collate(ex)
    b = cpu.to(DEVICE)
    tensors = [f for f in vars(b).values() if isinstance(f, torch.Tensor)]
    assert len(tensors) == 8 and all(t.device.type == DEVICE.type for t in tensors)
    assert all(torch.equal(t.cpu(), c) for t, c in zip(tensors, (f for f in vars(cpu).values()
                                                                 if isinstance(f, torch.Tensor))))
    assert b.images.shape == (6, 1, 3, IMAGE_SIZE, IMAGE_SIZE)
    assert (b.tokens[:, 1:1 + PATCHES_PER_IMAGE] == TOKENIZER.img_id).all()
    assert TOKENIZER.decode(b.tokens[torch.arange(6, device=DEVICE), b.answer_pos]) == " ".join(["?"] * 6)
    assert [TOKENIZER.vocab[i] for i in b.answer_id] == [e.answer for e in ex]
    assert not b.loss_mask[:, :PATCHES_PER_IMAGE].any()  # no loss on predicting placeholders
    text = make_examples("val", 3, 0, with_image=False)
    assert collate(text).to(DEVICE).images is None and text[0].question[0] == "scene"
    with pytest.raises(ValueError, match="mix"):
        collate(ex[:1] + text[:1])
    with pytest.raises(ValueError, match="split"):
        make_examples("dev", 1, 0)


def test_long_document_needle():
    doc = long_document(12, needle=2, seed=5)
    toks = doc["tokens"][0]
    assert doc["images"].shape == (1, 12, 3, IMAGE_SIZE, IMAGE_SIZE)
    assert int((toks == TOKENIZER.img_id).sum()) == 12 * PATCHES_PER_IMAGE
    s0, s1 = doc["needle_span"]
    assert (toks[s0:s1] == TOKENIZER.img_id).all() and s0 == doc["image_starts"][2]
    assert TOKENIZER.vocab[int(toks[doc["answer_pos"]])] == "?" and int(toks[doc["answer_pos"] + 1]) == doc["answer_id"]
    assert doc["answer"] in COLOURS
    assert torch.equal(long_document(12, needle=2, seed=5)["tokens"], doc["tokens"])
    with pytest.raises(ValueError):
        long_document(0)
    with pytest.raises(ValueError):
        long_document(4, needle=4)
