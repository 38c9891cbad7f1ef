"""minimax-lab: the inference stack of a modern agentic model, rebuilt to be read and measured.

``import minimax_lab`` decides the runtime (device, dtype, Triton interpreter or not; see
:mod:`minimax_lab.runtime`) before anything imports Triton, and nothing else; each sub-package is
imported by name::

    from minimax_lab import runtime
    runtime.DEVICE                                   # "cuda" or "cpu"
    from minimax_lab.attention import attention, msa_attention
    from minimax_lab.paged_kv import paged_decode, write_kv
    from minimax_lab.moe import moe_experts
"""
from __future__ import annotations

from minimax_lab import runtime  # noqa: F401  (must come first: sets TRITON_INTERPRET)

__version__ = "0.1.0"
