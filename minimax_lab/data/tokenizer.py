"""A closed word-level tokenizer for the generated data (part of the package, no downloads).

Text is split on whitespace; every word must be in :data:`VOCAB` or :meth:`Tokenizer.encode`
raises ``ValueError`` naming it. ``<img>`` is the placeholder that the model replaces with one
image patch embedding each (``patches_per_image`` of them per image).
"""
from __future__ import annotations

from minimax_lab.data.shapes import COLOURS, SHAPES

SPECIALS = ("<pad>", "<bos>", "<eos>", "<img>")
WORDS = (
    list(COLOURS) + list(SHAPES) + [s + "s" for s in SHAPES]
    + "what colour is the how many left of right above below yes no and a at row col scene ; , . ? in image there half".split()
    + [str(i) for i in range(100)]
)
VOCAB = tuple(SPECIALS) + tuple(dict.fromkeys(WORDS))


class Tokenizer:
    """Maps words to ids and back. ``pad_id=0``, ``bos_id``, ``eos_id``, ``img_id`` are attributes."""

    def __init__(self, vocab=VOCAB):
        self.vocab = tuple(vocab)
        self.index = {w: i for i, w in enumerate(self.vocab)}
        if len(self.index) != len(self.vocab):
            raise ValueError("vocabulary has duplicate words")
        self.pad_id, self.bos_id, self.eos_id, self.img_id = (self.index[s] for s in SPECIALS)

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text) -> list[int]:
        """``text``: a string (split on whitespace) or a list of words -> list of ids.
        Raises ValueError on a word outside the vocabulary."""
        words = text.split() if isinstance(text, str) else list(text)
        ids = []
        for w in words:
            if w not in self.index:
                raise ValueError(f"unknown token {w!r}: not in the {len(self)}-word vocabulary "
                                 f"(see minimax_lab.data.tokenizer.VOCAB)")
            ids.append(self.index[w])
        return ids

    def decode(self, ids) -> str:
        """Ids -> space-joined words. Raises ValueError on an id outside ``[0, len(self))``."""
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self):
                raise ValueError(f"token id {i} outside the vocabulary [0, {len(self)})")
            out.append(self.vocab[i])
        return " ".join(out)


TOKENIZER = Tokenizer()
