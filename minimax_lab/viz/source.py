"""Show the package's own code in a notebook: the function or kernel, its file, line numbers and a
link to the same lines in the public repository.

    from minimax_lab.viz.source import show_source
    show_source(minimax_lab.attention.dense_triton._flash_fwd)  # a @triton.jit kernel works too
"""
from __future__ import annotations

import inspect
from pathlib import Path

#: where the package's source is published (the links point at its main branch)
REPOSITORY = "https://github.com/minimax-lab/minimax-lab"
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def _unwrap(obj):
    """The Python function behind a Triton ``JITFunction`` / ``Autotuner`` / ``Heuristics``."""
    for _ in range(8):
        inner = getattr(obj, "fn", None)
        if inner is None or inner is obj:
            break
        obj = inner
    return obj


class Source:
    """A piece of the package's source: ``path`` (relative to the repository), first line, text.
    Renders as Markdown in Jupyter and as numbered plain text elsewhere."""

    def __init__(self, obj):
        target = _unwrap(obj)
        try:
            lines, first = inspect.getsourcelines(target)
            filename = Path(inspect.getsourcefile(target)).resolve()
        except (TypeError, OSError) as e:
            raise TypeError(f"show_source needs a function, class or module of the package; got "
                            f"{type(obj).__name__} ({e})") from None
        self.name = getattr(target, "__qualname__", getattr(target, "__name__", "?"))
        self.first = max(first, 1)
        self.text = "".join(lines).rstrip("\n")
        try:
            self.path = "minimax_lab/" + filename.relative_to(_PACKAGE_ROOT).as_posix()
        except ValueError:
            self.path = filename.name
        self.last = self.first + self.text.count("\n")

    @property
    def url(self) -> str:
        return f"{REPOSITORY}/blob/main/{self.path}#L{self.first}-L{self.last}"

    def numbered(self) -> str:
        width = len(str(self.last))
        return "\n".join(f"{self.first + i:>{width}} | {line}" for i, line in enumerate(self.text.splitlines()))

    def __str__(self) -> str:
        return f"{self.path}, lines {self.first}-{self.last} ({self.name})\n{self.numbered()}"

    __repr__ = __str__

    def _repr_markdown_(self) -> str:
        return (f"`{self.name}` in **{self.path}**, lines {self.first}–{self.last} "
                f"([on GitHub]({self.url}))\n\n```python\n{self.numbered()}\n```")


def show_source(obj) -> Source:
    """The source of ``obj`` (function, class, module or Triton kernel), to display as a cell's
    value. Raises TypeError for an object without Python source (a builtin, a number)."""
    return Source(obj)
