"""minimax-lab stand-in for ``sglang.kernels.ops.activation.activation`` (JIT CUDA kernels in
SGLang): ``silu_and_mul`` from ``peer_standin_kernels``; the other activations are not needed by
the bench and raise."""
from peer_standin_kernels import absent, silu_and_mul

gelu_and_mul = absent("gelu_and_mul", "no minimax-lab stand-in (only silu_and_mul)")
gelu_tanh_and_mul = absent("gelu_tanh_and_mul", "no minimax-lab stand-in (only silu_and_mul)")
silu_and_mul_with_activation_rounding = absent("silu_and_mul_with_activation_rounding", "no minimax-lab stand-in (only silu_and_mul)")
