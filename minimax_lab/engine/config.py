"""The M3-shaped model's configuration: one dataclass, a GPU size and a CPU size.

The shape follows the architecture the workbook rebuilds: early fusion (image patches and text
in one sequence), GQA attention with ``Hq = 64`` query heads over ``Hkv = 4`` key/value heads of
``D = 128``, MiniMax Sparse Attention (MSA: an index branch with ``D_idx = 128``, blocks of
``Bk = 128`` tokens, ``topk = 16`` blocks per query and group), and a Mixture-of-Experts FFN
(top-8 of 128 SwiGLU experts). The layers listed in ``dense_layers`` attend densely over the
whole cache (one full-attention layer, as hybrid sparse models keep some; the rest are MSA
layers). The KV page size is the MSA block size (block = page), so a sparse decode reads whole
pages.

**GPU size** (:func:`m3_config` ``("gpu")``): bf16, 4 layers, ``d_model = 2048``, expert width
768 (the MoE shape chapter 05 benchmarks), vocabulary 50,048 (the workloads' 50,000 text ids and
specials). :func:`param_count` gives its parameters (over a billion; those one token reads with
``activated=True``), :func:`kv_bytes_per_token` its cache per token. The size is chosen so that a
decode step moves real bytes (expert weights and a long dense KV) while every day of the bench,
day 0's PyTorch prefill of a 128k-token context included, fits one H200 and a few minutes.

**CPU size** (``"cpu"``): fp32, 2 layers (one dense, one MSA), ``d_model = 32``, 4 query / 2 kv
heads of 16, blocks of 16 tokens with ``topk = 2`` (so prompts of a few dozen tokens are already
sparse), 4 experts top-2 of width 16, vocabulary 256: small enough for Triton's interpreter, which
pays per kernel program whatever the size, to serve the scaled-down workloads.

Weights are random (nothing is downloaded): :class:`minimax_lab.engine.model_m3.M3Model` draws
them from ``seed``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from minimax_lab.runtime import resolve_preset
from minimax_lab.validate import check_positive_int, check_power_of_two

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class M3Config:
    """An M3-shaped decoder (see the module docstring). ``img_id`` (the last id) is the image-patch
    placeholder; text ids lie in ``[0, vocab_size - 1)``."""

    vocab_size: int = 50_048
    d_model: int = 2048
    n_layers: int = 4
    dense_layers: tuple = (0,)
    n_heads: int = 64
    n_kv_heads: int = 4
    head_dim: int = 128
    d_idx: int = 128
    block_size: int = 128
    topk: int = 16
    n_experts: int = 128
    top_k: int = 8
    d_expert: int = 768
    image_size: int = 32
    patch_size: int = 8
    rope_base: float = 1_000_000.0
    norm_eps: float = 1e-6
    max_seq_len: int = 135_168
    dtype: str = "bfloat16"
    seed: int = 0
    init_std: float = field(default=0.02)

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_idx", "topk",
                     "n_experts", "top_k", "d_expert", "image_size", "patch_size", "max_seq_len"):
            check_positive_int(getattr(self, name), name)
        check_power_of_two(self.block_size, "block_size", minimum=16, maximum=128)
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2 (text ids + the image placeholder), got {self.vocab_size}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) must be <= n_experts ({self.n_experts})")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size ({self.image_size}) must be a multiple of patch_size ({self.patch_size})")
        if not isinstance(self.dense_layers, tuple) or any(
                isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.n_layers for i in self.dense_layers):
            raise ValueError(f"dense_layers must be a tuple of layer indices in [0, {self.n_layers}), "
                             f"got {self.dense_layers!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")

    @property
    def img_id(self) -> int:
        """The placeholder id: each image takes ``patches_per_image`` of them, in order."""
        return self.vocab_size - 1

    @property
    def patches_per_image(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def sparse_layers(self) -> tuple:
        """Indices of the MSA layers (every layer not in ``dense_layers``)."""
        return tuple(i for i in range(self.n_layers) if i not in self.dense_layers)

    @property
    def qkv_width(self) -> int:
        """Output width of a layer's fused projection: q, k, v, and (MSA layers) q_idx and k_idx."""
        return (self.n_heads + 2 * self.n_kv_heads) * self.head_dim


def param_count(cfg: M3Config, *, activated: bool = False) -> int:
    """Parameters of the model (``activated=True``: those one token reads -- ``top_k`` of the
    experts, no embedding table rows beyond one)."""
    d, f, E = cfg.d_model, cfg.d_expert, cfg.n_experts
    attn = d * cfg.qkv_width + cfg.n_heads * cfg.head_dim * d + 2 * d + 2 * cfg.head_dim
    index = d * (cfg.n_kv_heads * cfg.d_idx + cfg.d_idx)
    experts_used = cfg.top_k if activated else E
    moe = d * E + experts_used * 3 * d * f
    per_layer = attn + moe
    total = cfg.n_layers * per_layer + len(cfg.sparse_layers) * index
    p = cfg.patch_size
    patch = 3 * p * p * d + d + 2 * (cfg.image_size // p) * d
    embed = d if activated else cfg.vocab_size * d
    return total + embed + cfg.vocab_size * d + d + (0 if activated else patch)


def kv_bytes_per_token(cfg: M3Config, kv_dtype: str | None = None) -> int:
    """Bytes the KV cache holds per token: K and V of every layer, the index key of each MSA layer;
    with ``kv_dtype="fp8_e4m3"`` one byte per value plus an fp32 scale per K and V head and per index key."""
    if kv_dtype is None:
        elt = torch.empty((), dtype=cfg.torch_dtype).element_size()
        return elt * (2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim + len(cfg.sparse_layers) * cfg.d_idx)
    if kv_dtype != "fp8_e4m3":
        raise ValueError(f"kv_dtype must be None or 'fp8_e4m3', got {kv_dtype!r}")
    return 2 * cfg.n_layers * cfg.n_kv_heads * (cfg.head_dim + 4) + len(cfg.sparse_layers) * (cfg.d_idx + 4)


GPU = M3Config()
CPU = M3Config(vocab_size=256, d_model=32, n_layers=2, dense_layers=(0,), n_heads=4, n_kv_heads=2, head_dim=16,
               d_idx=16, block_size=16, topk=2, n_experts=4, top_k=2, d_expert=16, image_size=32, patch_size=16,
               max_seq_len=4096, dtype="float32")


def m3_config(preset: str = "auto", **overrides) -> M3Config:
    """The GPU or CPU size (see the module docstring); keyword overrides win."""
    base = GPU if resolve_preset(preset) == "gpu" else CPU
    return replace(base, **overrides)
