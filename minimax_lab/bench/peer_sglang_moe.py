"""SGLang's Triton fused MoE as a peer: its ``fused_experts`` with its own tuned-config lookup.

The files come from the folder ``tools/fetch_peers.py`` extracts (see :mod:`minimax_lab.bench.peers`);
nothing of SGLang is part of this package. ``fused_experts`` runs SGLang's code unchanged: config
lookup (a tuned JSON for this GPU, ``E`` and ``N = f`` when one exists, else its default), token
alignment, the gate/up GEMM kernel, SwiGLU, the down GEMM kernel (routing weights applied there)
and the sum over the k experts. Three helpers are CUDA extensions in SGLang and are minimax-lab
stand-ins here (``peer_standin_kernels`` in the peers folder): the token alignment
``moe_align_block_size`` (except for tiny batches, where SGLang uses its own Triton kernel),
``silu_and_mul`` and ``moe_sum_reduce`` (SGLang's own Triton reduction; above 32 tokens).
:func:`standin_calls` exposes each so the bench times it on its own.

Layout: the same as ours (:func:`minimax_lab.moe.experts.moe_experts`) -- ``w_gate_up [E, 2f, d]``
with gate rows then up rows (SGLang's ``w13``), ``w_down [E, d, f]`` (its ``w2``); routing
``weights [T, k]`` (fp32 in SGLang) and ``ids [T, k]`` (int32 in SGLang). Dtypes: bf16 or fp16.
"""
from __future__ import annotations

import importlib
import os

import torch
import triton

from minimax_lab.bench import peers
from minimax_lab.moe.experts import check_expert_inputs

DTYPES = (torch.bfloat16, torch.float16)


def available() -> tuple[bool, str]:
    """``(True, what)`` when SGLang's fused MoE can be imported, else ``(False, why)``."""
    return peers.importable(_mods, "SGLang fused MoE kernels")


def _mods():
    # deferred: SGLang is an optional peer, importable only once tools/fetch_peers.py has put it on the path
    peers.require()
    import peer_standin_kernels
    from sglang.kernels.ops.moe import fused_moe_triton_kernels as kernels
    from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config as config_mod
    # the package re-exports a function of the same name, so fetch the module itself
    align_mod = importlib.import_module("sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size")
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import fused_experts as sgl_fused_experts
    return dict(fused_experts=sgl_fused_experts, RunnerConfig=MoeRunnerConfig, config=config_mod, align=align_mod,
                kernels=kernels, standins=peer_standin_kernels)


def routing(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing in SGLang's dtypes: ``(weights fp32, ids int32)``; no copy when already so."""
    return weights.to(torch.float32), ids.to(torch.int32)


def fused_experts(x, w_gate_up, w_down, weights, ids, *, check: bool = True) -> torch.Tensor:
    """SGLang's ``fused_experts`` (bf16/fp16, SwiGLU, every expert local, output not in place);
    same contract as ``moe_experts``: returns ``[T, d]`` in x's dtype."""
    m = _mods()
    if check:
        check_expert_inputs(x, w_gate_up, w_down, weights, ids, check_ids=False)
        if x.dtype not in DTYPES:
            raise ValueError(f"SGLang's fused MoE runs bf16 or fp16, got {x.dtype}")
    E, k = w_gate_up.shape[0], ids.shape[1]
    w, i = routing(weights, ids)
    cfg = m["RunnerConfig"](num_experts=E, num_local_experts=E, top_k=k, inplace=False)
    return m["fused_experts"](x.contiguous(), w_gate_up, w_down, (w, i, None), cfg)


def config_for(E: int, f: int, d: int, k: int, T: int, dtype=torch.bfloat16) -> dict:
    """The launch config SGLang's lookup picks for ``T`` tokens, and where it came from:
    ``{"config": {...}, "source": "tuned: <file>" | "tuned for triton X (fallback): <file>" | "default"}``."""
    m = _mods()
    cm = m["config"]
    dtype_str = cm.get_config_dtype_str(dtype)
    config = cm.try_get_optimal_moe_config((E, 2 * f, d), (E, d, f), k, dtype_str, T)
    name = cm.get_config_file_name(E, f, dtype_str)
    root = os.path.join(os.path.dirname(cm.__file__), "configs")
    mine = f"triton_{triton.__version__.replace('.', '_')}"
    if os.path.exists(os.path.join(root, mine, name)):
        source = f"tuned: {mine}/{name}"
    else:
        others = sorted((d_ for d_ in os.listdir(root) if d_.startswith("triton_")
                         and os.path.exists(os.path.join(root, d_, name))),
                        key=lambda s: tuple(int(x) for x in s[len("triton_"):].split("_")), reverse=True)
        source = f"tuned for {others[0]} (fallback): {name}" if others else f"default (no {name})"
    return {"config": dict(config), "source": source}


def standin_calls(x, w_gate_up, w_down, weights, ids) -> dict:
    """The helpers SGLang's ``fused_experts`` calls that are not SGLang's kernels here, as
    zero-argument callables on this batch's shapes (for timing each on its own):
    ``{"align": ..., "silu_and_mul": ..., "moe_sum_reduce": ...}``. ``align`` goes through SGLang's
    ``moe_align_block_size`` wrapper, as ``fused_experts`` does (tiny batches take SGLang's own
    Triton kernel there: see :func:`align_is_standin`); ``moe_sum_reduce`` is only in the list when
    ``fused_experts`` calls it (more than 32 tokens and k > 2)."""
    m = _mods()
    T, d = x.shape
    E, two_f, _ = w_gate_up.shape
    k = ids.shape[1]
    block_m = config_for(E, two_f // 2, d, k, T, x.dtype)["config"]["BLOCK_SIZE_M"]
    _, ids32 = routing(weights, ids)
    gate_up = torch.randn(T * k, two_f, device=x.device, dtype=x.dtype)
    act_out = torch.empty(T * k, two_f // 2, device=x.device, dtype=x.dtype)
    calls = {"align": lambda: m["align"].moe_align_block_size(ids32, block_m, E),
             "silu_and_mul": lambda: m["standins"].silu_and_mul(gate_up, act_out)}
    if T > 32 and k > 2:
        per_expert = torch.randn(T, k, d, device=x.device, dtype=x.dtype)
        out = torch.empty(T, d, device=x.device, dtype=x.dtype)
        calls["moe_sum_reduce"] = lambda: m["standins"].moe_sum_reduce(per_expert, out, 1.0)
    return calls


def align_is_standin(T: int, k: int, E: int) -> bool:
    """Whether SGLang's alignment for this batch is our stand-in (False: its own small-batch Triton
    kernel, used for at most 64 slots when E + 1 > 64)."""
    m = _mods()
    align = m["align"]
    small = getattr(align, "SMALL_NUMEL_LIMIT", 0)
    return not (T * k <= small and E + 1 > align._CUDA_SMALL_BATCH_MAX_BUCKETS)
