"""A few lines of the package's own code, shown like :func:`minimax_lab.viz.source.show_source`
(file, line numbers, a link to the same lines): the step a chapter talks about, not the whole
kernel around it::

    from minimax_lab.viz.excerpt import excerpt
    excerpt(minimax_lab.moe.experts_triton._gate_up_kernel, "if USE_TMA:", 4)
"""
from __future__ import annotations

import copy

from minimax_lab.viz.source import Source


def excerpt(obj, first: str, n_lines: int) -> Source:
    """The ``n_lines`` lines of ``obj``'s source (a function, class or Triton kernel of the
    package) from the first line that contains ``first``. Raises ValueError when no line contains
    ``first`` or ``n_lines`` < 1, TypeError (from :class:`Source`) for an object without source."""
    if n_lines < 1:
        raise ValueError(f"n_lines must be >= 1, got {n_lines}")
    whole = Source(obj)
    lines = whole.text.splitlines()
    start = next((i for i, line in enumerate(lines) if first in line), None)
    if start is None:
        raise ValueError(f"no line of {whole.name} contains {first!r}")
    part = copy.copy(whole)
    part.text = "\n".join(lines[start:start + n_lines])
    part.first = whole.first + start
    part.last = part.first + part.text.count("\n")
    return part
