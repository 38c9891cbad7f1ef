"""minimax-lab stand-in: the bench runs SGLang's MoE in bf16; its quantization kernels raise."""
from peer_standin_kernels import absent

per_token_group_quant_fp8 = absent("per_token_group_quant_fp8", "quantized MoE is not part of the minimax-lab peer")
scaled_fp8_quant = absent("scaled_fp8_quant", "quantized MoE is not part of the minimax-lab peer")
sglang_per_token_group_quant_fp8 = absent("sglang_per_token_group_quant_fp8", "quantized MoE is not part of the minimax-lab peer")
