"""minimax-lab stand-in for ``sglang.srt.layers.moe.moe_runner``: the runner-config fields that
``fused_experts`` reads, with SGLang's defaults (SwiGLU ``silu``, gated, gate rows then up rows)."""
from dataclasses import dataclass
from typing import Optional


@dataclass
class MoeRunnerConfig:
    num_experts: Optional[int] = None
    num_local_experts: Optional[int] = None
    top_k: Optional[int] = None
    activation: str = "silu"
    is_gated: bool = True
    apply_router_weight_on_input: bool = False
    inplace: bool = True
    no_combine: bool = False
    no_combine_keep_router_weight: bool = False
    routed_scaling_factor: Optional[float] = None
    gemm1_alpha: Optional[float] = None
    gemm1_clamp_limit: Optional[float] = None
    swiglu_limit: Optional[float] = None
    gate_up_interleaved: bool = True
