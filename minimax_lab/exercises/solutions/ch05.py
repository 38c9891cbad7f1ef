"""Solutions of chapter 05's exercises (``minimax_lab.exercises.ch05``)."""
from __future__ import annotations

from collections import OrderedDict

import torch

from minimax_lab.kvcache.blocks import page_hash
from minimax_lab.kvcache.eviction import EvictionPolicy


def page_and_offset(block_table: torch.Tensor, positions: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The i-th page of the sequence holds tokens [i * page_size, (i + 1) * page_size): the block
    table says which page of the pool that is."""
    positions = positions.long()
    page_ids = block_table.long()[positions // page_size]
    return page_ids, positions % page_size


def cached_prefix_pages(tokens: list[int], page_size: int, cached: dict) -> list[int]:
    """Walk the full pages in order, naming each from its parent's name; stop at the first miss
    (a hit must be a prefix: a later page's K/V was computed after every earlier token)."""
    pages, name = [], None
    for i in range(len(tokens) // page_size):
        name = page_hash(name, tokens[i * page_size:(i + 1) * page_size])
        if name not in cached:
            break
        pages.append(cached[name])
    return pages


class MyPolicy(EvictionPolicy):
    """Segmented LRU (Karedla et al. 1994): a block enters *probation*; a hit promotes it to the
    *protected* segment. Victims come from probation (its least recently used block) while the
    protected segment holds at most two thirds of the blocks, so a burst of one-off blocks (a
    fresh document, a long tool output) flushes other one-off blocks, not the prefixes that were
    reused."""

    name = "slru"

    def __init__(self, protected_share: float = 2 / 3):
        self.probation: OrderedDict = OrderedDict()
        self.protected: OrderedDict = OrderedDict()
        self.share = protected_share

    def insert(self, key, t, parent=None):
        if key not in self.protected:
            self.probation[key] = t
            self.probation.move_to_end(key)

    def touch(self, key, t):
        self.probation.pop(key, None)
        self.protected[key] = t
        self.protected.move_to_end(key)

    def remove(self, key):
        self.probation.pop(key, None)
        self.protected.pop(key, None)

    def evict(self):
        total = len(self.probation) + len(self.protected)
        if not total:
            raise KeyError("nothing to evict")
        if self.probation and (len(self.protected) <= self.share * total or not self.protected):
            return self.probation.popitem(last=False)[0]
        return self.protected.popitem(last=False)[0]

    def __len__(self):
        return len(self.probation) + len(self.protected)

    def __contains__(self, key):
        return key in self.probation or key in self.protected
