"""The tiny early-fusion multimodal transformer and its step API.

One interleaved sequence from step zero: text tokens through a token embedding, and at every
``<img>`` placeholder one image patch embedding (with its 2-D position), in order. Then
``n_layers`` pre-norm blocks (GQA attention with RoPE on 1-D sequence positions, SwiGLU or MoE
FFN) and a tied-free output head.

Step API (so an engine, e.g. the KV cache, can run the layers itself)::

    h, positions = model.embed(tokens, images)        # [B,S,d], [B,S] int64
    q, k, v = model.blocks[i].qkv(h, positions)        # normed, RoPE applied
    q_idx, k_idx = model.blocks[i].index_qk(h)         # when cfg.use_indexer
    h = model.blocks[i].finish(h, attn_out)            # out-proj, residual, FFN
    logits = model.logits(h)

``model(tokens, images, capture=True)`` returns ``(logits, capture)`` where ``capture`` holds
per-layer lists ``attn`` (``[B,Hq,S,S]`` fp32, materialized dense softmax), ``q``, ``k``, and
``q_idx``/``k_idx`` when the indexer is on.

``model(tokens, images, index_loss=True)`` (``attention="msa"``) also leaves the index branch's
distillation loss in ``model.index_loss``: per layer
:func:`minimax_lab.attention.msa_backward_index.index_distill_loss` of the layer's ``q_idx``,
``k_idx`` against its own dense attention's block mass (detached: the teacher; materialized,
``[B, Hq, S, S]``, as the tiny model's sequences are short), in the layer's ``attn_impl``,
averaged over layers -- so training with it teaches the indexer while the main branch runs MSA.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from minimax_lab.attention import attention, msa_attention
from minimax_lab.attention.msa_backward_index import index_distill_loss
from minimax_lab.data.tokenizer import TOKENIZER
from minimax_lab.model.config import ModelConfig
from minimax_lab.model.layers import PatchEmbed, RMSNorm, SwiGLU, apply_rope, attention_probs, rope_cos_sin
from minimax_lab.model.msa_indexer import block_mass
from minimax_lab.moe import MoEFFN


def _make_ffn(cfg: ModelConfig) -> nn.Module:
    if cfg.ffn == "dense":
        return SwiGLU(cfg.d_model, cfg.d_ff)
    return MoEFFN(cfg.d_model, cfg.d_ff, cfg.n_experts, cfg.moe_top_k, router=cfg.router,
                  shared_expert=cfg.shared_expert)


def run_attention(cfg: ModelConfig, q, k, v, q_idx=None, k_idx=None):
    """Causal GQA attention, the configured algorithm (``cfg.attention``) in the configured
    implementation (``cfg.attn_impl``): ``[B,S,Hq,D] -> [B,S,Hq,D]``. MSA needs the index
    branch's ``q_idx``/``k_idx`` (``use_indexer=True``), else ``ValueError``."""
    if cfg.attention == "msa":
        if q_idx is None:
            raise ValueError("attention='msa' needs the indexer: set use_indexer=True")
        return msa_attention(q, k, v, q_idx, k_idx, block_size=cfg.msa_block_size, topk=cfg.msa_topk,
                             impl=cfg.attn_impl)
    return attention(q, k, v, causal=True, impl=cfg.attn_impl)


def layer_index_loss(cfg: ModelConfig, q, k, q_idx, k_idx) -> torch.Tensor:
    """The index branch's distillation loss of one layer (module docstring): student ``q_idx``,
    ``k_idx``, teacher the block mass of the layer's dense attention ``softmax(q k^T)`` (detached).
    0 when every token sees a single block (``S <= msa_block_size``)."""
    S = q.shape[1]
    if S <= cfg.msa_block_size:
        return q.new_zeros((), dtype=torch.float32)
    with torch.no_grad():
        mass = block_mass(attention_probs(q, k), cfg.n_kv_heads, cfg.msa_block_size)
    return index_distill_loss(q_idx, k_idx, mass, block_size=cfg.msa_block_size, impl=cfg.attn_impl)


class Block(nn.Module):
    """Pre-norm transformer block; see the module docstring for the step API."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d, H, G, D = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.attn_norm = RMSNorm(d, cfg.norm_eps)
        self.wq = nn.Linear(d, H * D, bias=False)
        self.wk = nn.Linear(d, G * D, bias=False)
        self.wv = nn.Linear(d, G * D, bias=False)
        self.wo = nn.Linear(H * D, d, bias=False)
        self.q_norm = RMSNorm(D, cfg.norm_eps)
        self.k_norm = RMSNorm(D, cfg.norm_eps)
        if cfg.use_indexer:
            self.idx_q = nn.Linear(d, G * cfg.d_idx, bias=False)
            self.idx_k = nn.Linear(d, cfg.d_idx, bias=False)
        self.ffn_norm = RMSNorm(d, cfg.norm_eps)
        self.ffn = _make_ffn(cfg)

    def qkv(self, h, positions):
        """h ``[B,S,d]``, positions ``[B,S]`` -> q ``[B,S,Hq,D]``, k, v ``[B,S,Hkv,D]``."""
        B, S, _ = h.shape
        c = self.cfg
        x = self.attn_norm(h)
        q = self.q_norm(self.wq(x).view(B, S, c.n_heads, c.head_dim))
        k = self.k_norm(self.wk(x).view(B, S, c.n_kv_heads, c.head_dim))
        v = self.wv(x).view(B, S, c.n_kv_heads, c.head_dim)
        cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_base)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def index_qk(self, h):
        """h ``[B,S,d]`` -> q_idx ``[B,S,G,d_idx]``, k_idx ``[B,S,d_idx]`` (needs ``use_indexer``)."""
        if not self.cfg.use_indexer:
            raise ValueError("index_qk needs ModelConfig(use_indexer=True)")
        B, S, _ = h.shape
        x = self.attn_norm(h)
        return self.idx_q(x).view(B, S, self.cfg.n_kv_heads, self.cfg.d_idx), self.idx_k(x)

    def finish(self, h, attn_out):
        """Output projection + residual, then FFN + residual. attn_out ``[B,S,Hq,D]``."""
        B, S = attn_out.shape[:2]
        h = h + self.wo(attn_out.reshape(B, S, -1))
        return h + self.ffn(self.ffn_norm(h))

    def forward(self, h, positions, capture: dict | None = None, index_loss: bool = False):
        q, k, v = self.qkv(h, positions)
        q_idx = k_idx = None
        if self.cfg.use_indexer:
            q_idx, k_idx = self.index_qk(h)
        o = run_attention(self.cfg, q, k, v, q_idx, k_idx)
        if index_loss:
            self.index_loss = layer_index_loss(self.cfg, q, k, q_idx, k_idx)
        if capture is not None:
            capture["attn"].append(attention_probs(q, k).detach())
            capture["q"].append(q.detach())
            capture["k"].append(k.detach())
            if q_idx is not None:
                capture["q_idx"].append(q_idx.detach())
                capture["k_idx"].append(k_idx.detach())
        return self.finish(h, o)


class TinyMultimodalModel(nn.Module):
    """Decoder-only early-fusion transformer; ``forward(tokens [B,S], images=None, capture=False,
    index_loss=False)`` -> logits ``[B,S,vocab]`` (and a capture dict when ``capture``). After a
    forward ``aux_loss`` holds the sum of the MoE layers' auxiliary losses (0 for dense) and
    ``index_loss`` the index branch's distillation loss when asked for (module docstring; else 0).
    ``index_loss=True`` needs ``attention="msa"`` (ValueError otherwise)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.img_id = TOKENIZER.img_id
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.patch_embed = PatchEmbed(cfg.image_size, cfg.patch_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.aux_loss = torch.zeros(())
        self.index_loss = torch.zeros(())
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def embed(self, tokens, images=None):
        """tokens int ``[B,S]``; images ``[B,M,3,H,W]`` or ``[B,3,H,W]`` float (or None) ->
        ``(h [B,S,d_model], positions [B,S] int64)``. Each row must hold exactly
        ``M * patches_per_image`` ``<img>`` tokens; the k-th of them gets the k-th patch.

        Raises TypeError/ValueError on a non-integer token tensor, an id outside the vocabulary,
        a sequence longer than ``max_seq_len``, a wrong image size or a placeholder/image mismatch."""
        c = self.cfg
        if not isinstance(tokens, torch.Tensor) or tokens.dtype not in (torch.int32, torch.int64) or tokens.dim() != 2:
            raise TypeError(f"tokens must be an int32/int64 tensor [B, S], got "
                            f"{getattr(tokens, 'dtype', type(tokens))} {tuple(getattr(tokens, 'shape', ()))}")
        B, S = tokens.shape
        if S > c.max_seq_len:
            raise ValueError(f"sequence of {S} tokens is longer than max_seq_len={c.max_seq_len}")
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= c.vocab_size):
            raise ValueError(f"token ids must be in [0, {c.vocab_size}), got [{int(tokens.min())}, {int(tokens.max())}]")
        tokens = tokens.long()
        h = self.tok_emb(tokens)
        is_img = tokens == self.img_id
        n_img = is_img.sum(1)
        if images is None:
            if n_img.any():
                raise ValueError("tokens contain <img> placeholders but no images were given")
        else:
            if not isinstance(images, torch.Tensor) or not images.is_floating_point():
                raise TypeError("images must be a float tensor [B, M, 3, H, W] or [B, 3, H, W]")
            if images.dim() == 4:
                images = images[:, None]
            if images.dim() != 5 or images.shape[0] != B or images.shape[2] != 3:
                raise ValueError(f"images must be [B={B}, M, 3, H, W], got {tuple(images.shape)}")
            if tuple(images.shape[-2:]) != (c.image_size, c.image_size):
                raise ValueError(f"images must be {c.image_size}x{c.image_size}, got {tuple(images.shape[-2:])}")
            M = images.shape[1]
            want = M * c.patches_per_image
            if (n_img != want).any():
                raise ValueError(f"each row needs {want} <img> tokens for {M} image(s), got {n_img.tolist()}")
            patches = self.patch_embed(images.reshape(B * M, *images.shape[2:]).to(h.dtype))
            h = h.masked_scatter(is_img[..., None], patches.reshape(B, want, -1))
        positions = torch.arange(S, device=tokens.device).expand(B, S)
        return h, positions

    def logits(self, h):
        """h ``[B,S,d]`` -> logits ``[B,S,vocab]``."""
        return self.head(self.norm(h))

    def forward(self, tokens, images=None, capture: bool = False, index_loss: bool = False):
        if index_loss and self.cfg.attention != "msa":
            raise ValueError("index_loss=True trains MSA's index branch: it needs attention='msa'")
        h, positions = self.embed(tokens, images)
        cap = {"attn": [], "q": [], "k": [], "q_idx": [], "k_idx": []} if capture else None
        for blk in self.blocks:
            h = blk(h, positions, cap, index_loss=index_loss)
        aux = [blk.ffn.aux_loss for blk in self.blocks if getattr(blk.ffn, "aux_loss", None) is not None]
        self.aux_loss = sum(aux) if aux else torch.zeros((), device=h.device)
        self.index_loss = (sum(blk.index_loss for blk in self.blocks) / len(self.blocks) if index_loss
                           else torch.zeros((), device=h.device))
        out = self.logits(h)
        return (out, cap) if capture else out
