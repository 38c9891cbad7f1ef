"""minimax-lab stand-in for the ``sgl_kernel`` extension: only ``moe_sum_reduce``, served by
``peer_standin_kernels`` (SGLang's own Triton kernel of the same contract)."""
from peer_standin_kernels import moe_sum_reduce

__all__ = ["moe_sum_reduce"]
