"""Chapter 06 builds a small block manager in cells; this module checks its books against the
package's :class:`minimax_lab.kvcache.BlockManager` after the same operations.

:func:`same_books` compares what a learner can see of both: the sequences and their tokens, each
block table (page for page, up to how the two number their pages), the reference count of every
page a table names, how many pages are free, used, shared and cached, and the copy-on-write count.
The learner's manager is read through the attributes chapter 06 gives it: ``tables`` and
``tokens`` (per sequence), ``refcount`` and ``name`` (per page) and ``cow_copies``.

:func:`replay` runs a list of operations on both managers, printing each one's answers and the
books' summary; :func:`page_states` gives the learner's pages the states ``BlockManager`` uses.
"""
from __future__ import annotations

from collections import Counter


class BooksDiffer(AssertionError):
    """The two managers disagree; the message says where."""


def _page_map(ours: dict, theirs: dict) -> dict[int, int]:
    """Our page -> their page, read off the two sets of block tables; raises where one of our pages
    stands for two of theirs, or two of ours for one of theirs."""
    mapping: dict[int, int] = {}
    for seq in ours:
        if len(ours[seq]) != len(theirs[seq]):
            raise BooksDiffer(f"sequence {seq!r}: {len(ours[seq])} pages here, {len(theirs[seq])} in BlockManager")
        for i, (a, b) in enumerate(zip(ours[seq], theirs[seq])):
            if mapping.setdefault(a, b) != b:
                raise BooksDiffer(f"sequence {seq!r}, page {i}: our page {a} is shared differently in BlockManager")
    if len(set(mapping.values())) != len(mapping):
        raise BooksDiffer("two of our pages are one page in BlockManager: a prefix is shared there and not here")
    return mapping


def page_states(ours) -> list[str]:
    """Per page of the learner's manager: ``"free"`` (no reference, no name), ``"used"`` (one
    reference), ``"shared"`` (several) or ``"cached"`` (no reference, named)."""
    return ["shared" if r > 1 else "used" if r else "cached" if n is not None else "free"
            for r, n in zip(ours.refcount, ours.name)]


def same_books(ours, theirs) -> str:
    """Check that ``ours`` (the chapter's manager) keeps the same books as ``theirs`` (a
    ``BlockManager``) and return a one-line summary of them; raises :class:`BooksDiffer` naming the
    first difference."""
    if set(ours.tables) != set(theirs.seqs):
        raise BooksDiffer(f"sequences differ: {sorted(map(str, ours.tables))} here, "
                          f"{sorted(map(str, theirs.seqs))} in BlockManager")
    for seq in ours.tables:
        if list(ours.tokens[seq]) != list(theirs.seqs[seq].tokens):
            raise BooksDiffer(f"sequence {seq!r} holds other tokens here than in BlockManager")
    mapping = _page_map(ours.tables, {s: theirs.seqs[s].pages for s in ours.tables})
    for a, b in mapping.items():
        if ours.refcount[a] != theirs.refcount[b]:
            raise BooksDiffer(f"our page {a} has {ours.refcount[a]} references, its twin {b} in BlockManager "
                              f"{theirs.refcount[b]}")
    states, their_states = Counter(page_states(ours)), Counter(theirs.page_states())
    their_states["cached"] += their_states.pop("pinned", 0)   # ours has no pins: a pinned page is a cached one
    if +states != +their_states:
        raise BooksDiffer(f"page states differ: {dict(states)} here, {dict(their_states)} in BlockManager")
    if ours.cow_copies != theirs.stats["cow_copies"]:
        raise BooksDiffer(f"{ours.cow_copies} copies on write here, {theirs.stats['cow_copies']} in BlockManager")
    counts = ", ".join(f"{n} {s}" for s, n in sorted(states.items()) if s != "free")
    n = len(ours.tables)
    return f"same books: {n} sequence{'' if n == 1 else 's'}, pages {counts or 'none in use'}"


def replay(ours, theirs, ops) -> None:
    """Run ``ops`` -- ``(method, sequence, *args)``, e.g. ``("allocate", "user1", tokens)`` -- on both
    managers in turn; after each, print what both returned and :func:`same_books` (which raises at
    the first difference). Raises ``AssertionError`` when the two return different answers (the
    tokens found cached; the slot of an appended token, up to how the two number their pages)."""
    for op, seq, *args in ops:
        got, want = getattr(ours, op)(seq, *args), getattr(theirs, op)(seq, *args)
        books = same_books(ours, theirs)
        if op == "append":
            ps = ours.page_size
            mapping = _page_map(ours.tables, {s: theirs.seqs[s].pages for s in ours.tables})
            same = mapping.get(got // ps) == want // ps and got % ps == want % ps
        else:
            same = got == want
        if not same:
            raise BooksDiffer(f"{op} {seq!r}: ours returned {got!r}, BlockManager {want!r}")
        said = "" if got is None else f" -> {got}"
        print(f"{op} {seq}{said}: {books}")
