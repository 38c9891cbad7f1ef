"""An M3-shaped decoder with random weights, built from the workbook's own parts.

Per layer (pre-norm)::

    x = RMSNorm(h)
    q, k, v (, q_idx, k_idx) = split(x @ W_qkv)        one fused projection
    q, k = RoPE(RMSNorm_head(q)), RoPE(RMSNorm_head(k))  QK-norm, rotary positions
    h = h + W_o . attention(q, k, v, q_idx, k_idx)       paged: dense or MSA (the engine's job)
    h = h + MoE(RMSNorm(h))                               sigmoid router, top-k of E SwiGLU experts

Pieces reused from the package: ``RMSNorm``, ``rope_cos_sin``/``apply_rope`` and ``PatchEmbed``
(:mod:`minimax_lab.model.layers`), the sigmoid router with its correction bias
(:func:`minimax_lab.moe.route_sigmoid_bias`) and the experts (:func:`minimax_lab.moe.moe_experts`,
whose ``impl`` the engine picks). The index branch (MSA layers only) is MSA's: one index query per
kv group and one shared index key per token, from the normed input, without RoPE.

Early fusion: the tokens of a step are one flat ``[N]`` sequence of ids; an id equal to
``cfg.img_id`` is a placeholder whose embedding is replaced by an image patch embedding
(``PatchEmbed`` of the request's images, the k-th placeholder taking the k-th patch).

:meth:`M3Model.forward` runs the layers over a flat batch of tokens from many sequences (prompt
chunks and decode tokens alike); attention, the only part that needs to know which token belongs
to which sequence, is a callable the engine passes in (:mod:`.paged_attention`).

Weights: every matrix ~ N(0, ``cfg.init_std``), norms 1, biases 0, drawn in a fixed order from a
generator seeded with ``cfg.seed`` on the model's device (same seed and device type, same model).
:meth:`M3Model.quantize_experts` adds FP8 copies of the experts' weights (the FP8 day serves with
them; the model's own weights stay for the other days).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from minimax_lab.engine.config import M3Config
from minimax_lab.model.layers import PatchEmbed, RMSNorm, apply_rope, rope_cos_sin
from minimax_lab.moe import moe_experts, route_sigmoid_bias
from minimax_lab.moe.experts import quantize_experts
from minimax_lab.validate import check_tensor


class M3Layer(nn.Module):
    """One decoder layer; ``sparse`` layers (MSA) also project the index branch."""

    def __init__(self, cfg: M3Config, index: int):
        super().__init__()
        self.cfg, self.index = cfg, index
        self.sparse = index not in cfg.dense_layers
        d, D = cfg.d_model, cfg.head_dim
        width = cfg.qkv_width + (cfg.n_kv_heads * cfg.d_idx + cfg.d_idx if self.sparse else 0)
        self.attn_norm = RMSNorm(d, cfg.norm_eps)
        self.w_qkv = nn.Linear(d, width, bias=False)
        self.q_norm = RMSNorm(D, cfg.norm_eps)
        self.k_norm = RMSNorm(D, cfg.norm_eps)
        self.w_o = nn.Linear(cfg.n_heads * D, d, bias=False)
        self.ffn_norm = RMSNorm(d, cfg.norm_eps)
        self.router = nn.Linear(d, cfg.n_experts, bias=False)
        self.register_buffer("expert_bias", torch.zeros(cfg.n_experts))
        self.w_gate_up = nn.Parameter(torch.empty(cfg.n_experts, 2 * cfg.d_expert, d))
        self.w_down = nn.Parameter(torch.empty(cfg.n_experts, d, cfg.d_expert))
        self.experts_fp8: tuple | None = None   # (w13 fp8, s13, w2 fp8, s2) after quantize_experts

    def project(self, h: torch.Tensor, positions: torch.Tensor):
        """``h [N, d]``, ``positions [N]`` -> ``q [N, Hq, D]``, ``k, v [N, Hkv, D]`` (normed, rotated)
        and, for MSA layers, ``q_idx [N, Hkv, D_idx]`` and ``k_idx [N, D_idx]`` (else ``None``)."""
        c = self.cfg
        N = h.shape[0]
        Hq, G, D, Di = c.n_heads, c.n_kv_heads, c.head_dim, c.d_idx
        out = self.w_qkv(self.attn_norm(h))
        sizes = [Hq * D, G * D, G * D] + ([G * Di, Di] if self.sparse else [])
        parts = out.split(sizes, dim=-1)
        q = self.q_norm(parts[0].view(N, Hq, D))
        k = self.k_norm(parts[1].view(N, G, D))
        v = parts[2].view(N, G, D)
        cos, sin = rope_cos_sin(positions[None], D, c.rope_base)  # [1, N, 1, D/2]
        q = apply_rope(q[None], cos, sin)[0]
        k = apply_rope(k[None], cos, sin)[0]
        if not self.sparse:
            return q, k, v, None, None
        return q, k, v, parts[3].reshape(N, G, Di), parts[4]

    def moe(self, x: torch.Tensor, impl: str, *, fp8: bool = False) -> torch.Tensor:
        """Sigmoid top-k routing, then the routed SwiGLU experts: ``[N, d] -> [N, d]``; ``fp8``: with
        the FP8 weights :meth:`quantize_experts` made (raises ``RuntimeError`` before it ran)."""
        weights, ids = route_sigmoid_bias(self.router(x), self.cfg.top_k, self.expert_bias)
        if not fp8:
            return moe_experts(x, self.w_gate_up, self.w_down, weights.to(x.dtype), ids, impl=impl, check_ids=False)
        if self.experts_fp8 is None:
            raise RuntimeError("the FP8 experts are not quantized yet: call M3Model.quantize_experts() first")
        w13, s13, w2, s2 = self.experts_fp8
        return moe_experts(x, w13, w2, weights.to(x.dtype), ids, impl=impl, check_ids=False,
                           w_gate_up_scale=s13, w_down_scale=s2)

    @torch.no_grad()
    def quantize_experts(self) -> None:
        """Store the experts' weights in FP8 beside the model's own (once; later calls do nothing):
        ``(w_gate_up fp8 [E, 2f, d], scale fp32 [E, 2f], w_down fp8 [E, d, f], scale fp32 [E, d])``,
        one power-of-two scale per output channel (:func:`minimax_lab.moe.experts.quantize_experts`)."""
        if self.experts_fp8 is None:
            self.experts_fp8 = tuple(quantize_experts(self.w_gate_up, self.w_down))


class M3Model(nn.Module):
    """The M3-shaped decoder (module docstring). Build with :meth:`create`."""

    def __init__(self, cfg: M3Config):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.patch_embed = PatchEmbed(cfg.image_size, cfg.patch_size, cfg.d_model)
        self.layers = nn.ModuleList(M3Layer(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    @classmethod
    def create(cls, cfg: M3Config, device=None) -> "M3Model":
        """The model on ``device`` in ``cfg.dtype``, weights drawn from ``cfg.seed``, in eval mode,
        without gradients; on the ``meta`` device, shapes without values."""
        device = torch.device(device) if device is not None else torch.device("cpu")
        with torch.device("meta"):
            model = cls(cfg).to(cfg.torch_dtype)
        if device.type == "meta":      # shapes only: an engine schedules and prices with it, computes nothing
            return model.eval().requires_grad_(False)
        model = model.to_empty(device=device)
        model.init_weights()
        return model.eval().requires_grad_(False)

    @torch.no_grad()
    def init_weights(self) -> None:
        """Every weight matrix and embedding ~ N(0, init_std), norm weights 1, biases 0, the router's
        correction bias 0; drawn in ``named_parameters`` order from a generator seeded with ``seed``."""
        dev = next(self.parameters()).device
        g = torch.Generator(device=dev).manual_seed(self.cfg.seed)
        for name, p in self.named_parameters():
            if p.ndim == 1:
                p.fill_(1.0 if name.endswith("norm.weight") else 0.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g, device=dev, dtype=torch.float32) * self.cfg.init_std)
        for layer in self.layers:
            layer.expert_bias.zero_()

    # ---- the pieces the engine calls -----------------------------------------------------------
    def embed_images(self, images: torch.Tensor) -> torch.Tensor:
        """``images [M, 3, H, W]`` float -> patch embeddings ``[M * patches_per_image, d]`` in the
        model's dtype (image 0's patches first, row-major). Raises ``ValueError`` for a wrong size."""
        c = self.cfg
        check_tensor(images, "images", ndim=4)
        if not images.is_floating_point() or images.shape[1] != 3 or tuple(images.shape[2:]) != (c.image_size,) * 2:
            raise ValueError(f"images must be float [M, 3, {c.image_size}, {c.image_size}], got "
                             f"{images.dtype} {list(images.shape)}")
        p = next(self.parameters())
        return self.patch_embed(images.to(p.device, p.dtype)).reshape(-1, c.d_model)

    def embed(self, input_ids: torch.Tensor, patches: torch.Tensor | None = None,
              patch_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Token embeddings ``[N, d]``; rows ``patch_rows`` (the placeholders) take ``patches``."""
        h = self.tok_emb(input_ids)
        if patches is not None and patch_rows is not None and patch_rows.numel():
            h = h.index_copy(0, patch_rows, patches.to(h.dtype))
        return h

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm and head: ``[n, d] -> [n, vocab]`` in fp32."""
        return self.head(self.norm(h)).float()

    def quantize_experts(self) -> "M3Model":
        """Quantize every layer's experts to FP8 (:meth:`M3Layer.quantize_experts`), once; the
        bf16/fp32 weights stay, so one model serves both precisions. Returns the model."""
        for layer in self.layers:
            layer.quantize_experts()
        return self

    def expert_bytes(self, fp8: bool = False) -> int:
        """Bytes of the routed experts' weights (``fp8``: the FP8 copies and their scales)."""
        if not fp8:
            return sum(l.w_gate_up.nbytes + l.w_down.nbytes for l in self.layers)  # noqa: E741
        c = self.cfg
        per_layer = 3 * c.n_experts * c.d_expert * c.d_model + 4 * c.n_experts * (2 * c.d_expert + c.d_model)
        return c.n_layers * per_layer

    def forward(self, batch, attend, *, moe_impl: str, expert_fp8=False) -> torch.Tensor:
        """Run every layer over ``batch`` (a :class:`~minimax_lab.engine.paged_attention.StepBatch`:
        ``input_ids``, ``positions``, ``patches``/``patch_rows``, ``logit_rows``) with
        ``attend(layer_index, q, k, v, q_idx, k_idx) -> [N, Hq, D]`` and the experts in FP8 when
        ``expert_fp8`` (``True``: every layer; a set of layer indices: those); returns the fp32
        logits of the rows ``batch.logit_rows`` (all rows when it is ``None``)."""
        h = self.embed(batch.input_ids, batch.patches, batch.patch_rows)
        N = h.shape[0]
        for layer in self.layers:
            q, k, v, q_idx, k_idx = layer.project(h, batch.positions)
            o = attend(layer.index, q, k, v, q_idx, k_idx)
            h = h + layer.w_o(o.reshape(N, -1))
            fp8 = expert_fp8 if isinstance(expert_fp8, bool) else layer.index in expert_fp8
            h = h + layer.moe(layer.ffn_norm(h), moe_impl, fp8=fp8)
        if batch.logit_rows is not None:
            h = h.index_select(0, batch.logit_rows)
        return self.logits(h)

