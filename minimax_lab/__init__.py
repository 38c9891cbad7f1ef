"""minimax-lab: the inference stack of a modern agentic model, rebuilt to be read and measured.

``import minimax_lab`` first decides the runtime (device, dtype, Triton interpreter or not;
see :mod:`minimax_lab.runtime`); the sub-packages load on first use::

    import minimax_lab as mx
    mx.runtime.DEVICE             # "cuda" or "cpu"
    mx.attention.attention(...)   # loads minimax_lab.attention now
"""
from __future__ import annotations

import importlib

from minimax_lab import runtime  # noqa: F401  (must come first: sets TRITON_INTERPRET)

__version__ = "0.1.0"
_SUBMODULES = ("bench", "viz", "data", "model", "attention", "moe", "kvcache", "kernelbench", "validate")


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"minimax_lab.{name}")
    raise AttributeError(f"module 'minimax_lab' has no attribute {name!r}")
