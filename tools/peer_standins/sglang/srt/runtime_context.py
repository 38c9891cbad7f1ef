"""minimax-lab stand-in for ``sglang.srt.runtime_context``: a single-GPU, non-deterministic,
no-tensor-parallel context with the platform facts the extracted kernel files ask for."""
from types import SimpleNamespace

from sglang.srt.utils import is_sm90_supported


def get_platform():
    return SimpleNamespace(is_sm90=is_sm90_supported())


def get_exec():
    return SimpleNamespace(moe=SimpleNamespace(enable_fused_moe_sum_all_reduce=False),
                           deterministic=SimpleNamespace(enable_deterministic_inference=False))


def get_parallel():
    return SimpleNamespace(tp_group=None, attn_tp_size=1)
