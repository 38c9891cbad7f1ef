"""The kernel bench's problems for the three small operators of :mod:`.ops`: row softmax,
RMSNorm after a residual add, and rotary embeddings (RoPE), each with the peer a user would call
instead (``torch.softmax``, ``F.rms_norm`` after the add, a serving engine's RoPE).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from minimax_lab import runtime
from minimax_lab.kernelbench import ops
from minimax_lab.kernelbench.problem import Peer, Problem, _dev, _dtype, _gen, _nbytes, _randn


def _softmax_inputs(shape, seed, regime):
    return {"x": _randn((shape["rows"], shape["cols"]), seed, regime)}


def softmax_peer(x):
    """``torch.softmax`` in x's own dtype: one call, one fused kernel reading bf16 on a GPU."""
    return torch.softmax(x, dim=-1)


SOFTMAX = Problem(
    name="softmax",
    description="row softmax of x [rows, cols] over the last dim",
    reference=lambda x: ops.softmax_reference(x),
    make_inputs=_softmax_inputs,
    validation_shapes=lambda p: runtime.pick(p, cpu=[{"rows": 4, "cols": 64}, {"rows": 3, "cols": 1000}],
                                              gpu=[{"rows": 4096, "cols": 4096}, {"rows": 1024, "cols": 32768}]),
    draw_test_shape=lambda rng, p: runtime.pick(
        p, cpu={"rows": rng.randint(1, 9), "cols": rng.randint(1, 1500)},
        gpu={"rows": rng.randint(1, 8192), "cols": rng.randint(1, 40000)}),
    timing_shape=lambda p: runtime.pick(p, cpu={"rows": 8, "cols": 1024}, gpu={"rows": 8192, "cols": 8192}),
    regimes=("normal", "logits", "tiny"),
    best=lambda: (lambda x: ops.softmax(x, impl="triton")),
    strong_peer=lambda: Peer("torch.softmax in the input's dtype", softmax_peer,
                             note="torch.softmax(x, dim=-1) without an fp32 copy: what a user calls"),
    cost=lambda s: (5.0 * s["rows"] * s["cols"], 2.0 * s["rows"] * s["cols"] * _dtype().itemsize),
    traffic=lambda x: (5.0 * x.numel(), 2 * _nbytes(x)),  # read x, write y
)


# --------------------------------------------------------------------------- RMSNorm + residual


def _rms_inputs(shape, seed, regime):
    t, d = shape["tokens"], shape["dim"]
    return {"x": _randn((t, d), seed, regime), "residual": _randn((t, d), seed + 1, regime),
            "weight": (1 + 0.1 * torch.randn(d, generator=_gen(seed + 2))).to(_dev(), _dtype())}


def rmsnorm_residual_peer(x, residual, weight):
    """The add, then ``F.rms_norm`` (PyTorch's fused RMSNorm) in x's dtype; returns ``(y, h)``."""
    h = x + residual
    return F.rms_norm(h, (h.shape[-1],), weight, eps=1e-6), h


RMSNORM = Problem(
    name="rmsnorm_residual",
    description="h = x + residual; y = h * rsqrt(mean(h^2) + 1e-6) * weight; returns (y, h)",
    reference=lambda x, residual, weight: ops.rmsnorm_residual_reference(x, residual, weight),
    make_inputs=_rms_inputs,
    validation_shapes=lambda p: runtime.pick(p, cpu=[{"tokens": 4, "dim": 64}, {"tokens": 5, "dim": 384}],
                                              gpu=[{"tokens": 4096, "dim": 4096}, {"tokens": 16384, "dim": 6144}]),
    draw_test_shape=lambda rng, p: runtime.pick(
        p, cpu={"tokens": rng.randint(1, 9), "dim": rng.randint(1, 700)},
        gpu={"tokens": rng.randint(1, 16384), "dim": rng.randint(1, 8192)}),
    timing_shape=lambda p: runtime.pick(p, cpu={"tokens": 8, "dim": 512}, gpu={"tokens": 16384, "dim": 4096}),
    regimes=("normal", "large", "tiny", "outliers"),
    best=lambda: (lambda x, residual, weight: ops.rmsnorm_residual(x, residual, weight, impl="triton")),
    strong_peer=lambda: Peer("x + residual, then F.rms_norm", rmsnorm_residual_peer,
                             note="torch.nn.functional.rms_norm after the add, in the input's dtype (two kernels)"),
    cost=lambda s: (4.0 * s["tokens"] * s["dim"], 4.0 * s["tokens"] * s["dim"] * _dtype().itemsize),
    traffic=lambda x, residual, weight: (4.0 * x.numel(), _nbytes(x, residual, weight) + 2 * _nbytes(x)),
)


# --------------------------------------------------------------------------- RoPE


def _rope_inputs(shape, seed, regime):
    B, S, H, D = shape["batch"], shape["seq"], shape["heads"], shape["head_dim"]
    pos = torch.randint(0, shape.get("max_pos", 4096), (B, S), generator=_gen(seed + 1), dtype=torch.int32)
    return {"x": _randn((B, S, H, D), seed, regime), "positions": pos.to(_dev())}


#: the positions a serving engine's cosine/sine table covers (it is built once, for the model's context)
ROPE_MAX_POSITION = 4096


@functools.lru_cache(maxsize=8)
def _rope_cos_sin(head_dim: int, positions: int, device: str) -> torch.Tensor:
    """``[positions, head_dim]`` fp32: cosines then sines of ``pos * 1e4**(-2i/D)``, computed once."""
    inv_freq = 1e4 ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    angle = torch.arange(positions, dtype=torch.float32, device=device)[:, None] * inv_freq
    return torch.cat([angle.cos(), angle.sin()], dim=-1)


def _rope_peer_layout(inputs: dict) -> dict:
    x, positions = inputs["x"], inputs["positions"]
    n = max(ROPE_MAX_POSITION, int(positions.max()) + 1 if positions.numel() else 1)
    return {"x": x, "positions": positions, "cos_sin": _rope_cos_sin(x.shape[-1], n, str(x.device))}


def rope_serving_peer(x, positions, cos_sin):
    """RoPE as vLLM's and SGLang's ``RotaryEmbedding.forward_native`` apply it: the rows of a
    precomputed fp32 cos/sin table gathered by position, cast to x's dtype, rotate-half in x's
    dtype (their fused CUDA kernels ship in packages not installed here)."""
    cos, sin = cos_sin[positions.long()].chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


ROPE = Problem(
    name="rope",
    description="rotary embedding of x [B, S, H, D] at int positions [B, S] (rotate-half pairs, theta 1e4)",
    reference=lambda x, positions: ops.rope_reference(x, positions),
    make_inputs=_rope_inputs,
    validation_shapes=lambda p: runtime.pick(
        p, cpu=[{"batch": 1, "seq": 5, "heads": 2, "head_dim": 16}, {"batch": 2, "seq": 3, "heads": 3, "head_dim": 64}],
        gpu=[{"batch": 4, "seq": 4096, "heads": 32, "head_dim": 128}]),
    draw_test_shape=lambda rng, p: runtime.pick(
        p, cpu={"batch": rng.randint(1, 3), "seq": rng.randint(1, 9), "heads": rng.randint(1, 5),
                "head_dim": 2 * rng.randint(1, 48)},
        gpu={"batch": rng.randint(1, 8), "seq": rng.randint(1, 8192), "heads": rng.randint(1, 64),
             "head_dim": 2 * rng.randint(1, 128)}),
    timing_shape=lambda p: runtime.pick(p, cpu={"batch": 1, "seq": 8, "heads": 4, "head_dim": 64},
                                        gpu={"batch": 4, "seq": 4096, "heads": 32, "head_dim": 128}),
    regimes=("normal", "large"),
    best=lambda: (lambda x, positions: ops.rope(x, positions, impl="triton")),
    strong_peer=lambda: Peer("a serving engine's RoPE (cos/sin table, PyTorch)", rope_serving_peer,
                             prepare=_rope_peer_layout,
                             note="vLLM's and SGLang's RotaryEmbedding.forward_native: the cos/sin table is built "
                                  "once (untimed), gathered by position per call"),
    cost=lambda s: (6.0 * s["batch"] * s["seq"] * s["heads"] * s["head_dim"],
                    2.0 * s["batch"] * s["seq"] * s["heads"] * s["head_dim"] * _dtype().itemsize),
    traffic=lambda x, positions: (6.0 * x.numel(), 2 * _nbytes(x) + _nbytes(positions)),
)
