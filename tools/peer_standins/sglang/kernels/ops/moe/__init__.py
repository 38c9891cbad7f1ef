"""minimax-lab stand-in for ``sglang.kernels.ops.moe`` (SGLang's kernel registry): only the
token alignment, served by minimax-lab's stand-in (``peer_standin_kernels``). The extracted
Triton files ``fused_moe_triton_kernels`` and ``moe_align_small_numel`` are submodules here."""
from peer_standin_kernels import moe_align_block_size

__all__ = ["moe_align_block_size"]
