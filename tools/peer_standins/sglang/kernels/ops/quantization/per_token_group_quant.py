"""minimax-lab stand-in: the bench runs SGLang's MoE in bf16; its quantization kernels raise."""
from peer_standin_kernels import absent

per_token_group_quant = absent("per_token_group_quant", "quantized MoE is not part of the minimax-lab peer")
