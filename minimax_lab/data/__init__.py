"""Generated image+text data for the tiny multimodal model (notebook 01).

* :mod:`.shapes` -- coloured shapes on a 4x4 grid, rendered as 32x32 RGB
* :mod:`.tokenizer` -- the closed word-level tokenizer (``TOKENIZER``)
* :mod:`.examples` -- question/answer examples, scene-disjoint splits, batching
* :mod:`.long_document` -- many images + a question about one far back (needle retrieval)
* :mod:`.needle` -- many images, one holding the asked shape (the needle documents of notebook 03)
"""
from minimax_lab.data.examples import (PATCHES_PER_IMAGE, QTYPES, SPLITS, Batch, Example, batches, collate,
                                       make_examples, sample_example)
from minimax_lab.data.long_document import long_document
from minimax_lab.data.needle import needle_batch, needle_document
from minimax_lab.data.shapes import COLOURS, GRID, IMAGE_SIZE, SHAPES, SceneObject, render
from minimax_lab.data.tokenizer import TOKENIZER, VOCAB, Tokenizer

__all__ = ["PATCHES_PER_IMAGE", "QTYPES", "SPLITS", "Batch", "Example", "batches", "collate", "make_examples",
           "sample_example", "long_document", "needle_batch", "needle_document", "COLOURS", "GRID", "IMAGE_SIZE", "SHAPES", "SceneObject", "render",
           "TOKENIZER", "VOCAB", "Tokenizer"]
