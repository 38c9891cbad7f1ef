"""Model configuration as one dataclass, with the CPU and GPU presets."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from minimax_lab.data.tokenizer import VOCAB
from minimax_lab.kvcache.cost import LayerShape
from minimax_lab.runtime import pick
from minimax_lab.validate import IMPLS

#: the attention algorithms (``attention``) and the implementations each one comes in (``attn_impl``)
ATTENTIONS = ("dense", "msa")
ATTN_IMPLS = IMPLS
FFNS = ("dense", "moe")


@dataclass
class ModelConfig:
    """Tiny decoder-only early-fusion transformer.

    ``n_heads`` query heads share ``n_kv_heads`` key/value heads (GQA; ``n_heads % n_kv_heads == 0``).
    Images are ``image_size`` square RGB cut into ``patch_size`` patches. ``attention`` is the
    algorithm, ``"dense"`` (causal GQA, :func:`minimax_lab.attention.attention`) or ``"msa"``
    (MiniMax sparse attention, :func:`minimax_lab.attention.msa_attention`, which needs
    ``use_indexer=True``: the index projections); ``attn_impl`` the implementation it runs with,
    ``"reference" | "torch" | "triton"`` (MSA trains in all three -- its Triton kernels have a
    backward; dense attention's Triton kernel has none: it serves inference). The ``msa_*``
    fields are used when ``attention == "msa"``. ``ffn``: dense
    (SwiGLU) or MoE (``minimax_lab.moe.MoEFFN``). Raises ``ValueError`` for an unknown choice.
    """

    vocab_size: int = len(VOCAB)
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    d_ff: int = 128
    max_seq_len: int = 2048
    image_size: int = 32
    patch_size: int = 8
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    attention: str = "dense"
    attn_impl: str = "torch"
    ffn: str = "dense"
    n_experts: int = 4
    moe_top_k: int = 2
    router: str = "softmax"
    shared_expert: bool = False
    msa_block_size: int = 16
    msa_topk: int = 4
    d_idx: int = 16
    use_indexer: bool = False

    def __post_init__(self):
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size ({self.image_size}) must be a multiple of patch_size ({self.patch_size})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}")
        if self.attn_impl in ATTENTIONS:
            raise ValueError(f"attn_impl is the implementation ({', '.join(ATTN_IMPLS)}); the algorithm is "
                             f"attention={self.attn_impl!r}")
        if self.attn_impl not in ATTN_IMPLS:
            raise ValueError(f"attn_impl must be one of {ATTN_IMPLS}, got {self.attn_impl!r}")
        if self.ffn not in FFNS:
            raise ValueError(f"ffn must be one of {FFNS}, got {self.ffn!r}")

    @property
    def patches_per_image(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """Build from a dict, ignoring unknown keys (older/newer checkpoints); an older dict's
        ``attn_impl="msa"`` (when the algorithm and the implementation were one field) reads as
        ``attention="msa"`` with the PyTorch implementation."""
        names = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in names}
        if d.get("attn_impl") == "msa" and "attention" not in d:
            d.update(attention="msa", attn_impl="torch")
        return cls(**d)


def preset_config(preset: str = "auto", **overrides) -> ModelConfig:
    """CPU preset (the shipped checkpoint: d=128, 3 layers, 4 query / 2 kv heads, ~0.5 M
    parameters, trains in a few minutes on 2 cores) or a larger GPU preset; keyword overrides win."""
    base = pick(preset, cpu=dict(d_model=128, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=256),
                gpu=dict(d_model=256, n_layers=4, n_heads=8, n_kv_heads=2, head_dim=32, d_ff=768))
    return ModelConfig(**{**base, **overrides})

def tiny_model_shape(cfg=None, preset: str = "auto") -> LayerShape:
    """What a token of the workbook's tiny model costs the KV cache (``preset_config(preset)`` unless
    ``cfg`` is given): its :class:`minimax_lab.kvcache.cost.LayerShape`, dense SwiGLU FFN."""
    if cfg is None:
        cfg = preset_config(preset)
    return LayerShape(f"tiny (d={cfg.d_model}, {cfg.n_layers} layers)", cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                      ffn_flops_per_token=2 * 3 * cfg.d_model * cfg.d_ff, dtype_bytes=2,
                      source="minimax_lab.model.config.preset_config")
