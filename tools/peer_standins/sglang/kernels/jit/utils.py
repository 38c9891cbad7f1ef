"""minimax-lab stand-in for ``sglang.kernels.jit.utils``: SGLang's rule for programmatic dependent
launch (PDL) -- a CUDA device of compute capability 9 or newer; never under the interpreter.
``MINIMAX_LAB_PEER_PDL=0`` switches it off (for a Triton that lacks ``launch_pdl``)."""
import os

import torch


def is_arch_support_pdl() -> bool:
    if os.environ.get("MINIMAX_LAB_PEER_PDL", "1") == "0":
        return False
    if os.environ.get("TRITON_INTERPRET", "0") == "1" or torch.version.hip is not None:
        return False
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
