"""What a token of KV costs: the bytes it leaves in the cache and the FLOPs that recompute it.

:class:`LayerShape` describes a model by what the cache cares about (layers, heads, head dim, the
FFN's FLOPs per token, an optional sparse-attention budget); :func:`break_even` compares fetching a
token's KV over a link with recomputing it; :class:`PrefillCost` prices a whole prompt served from a
local cache, a shared pool and the GPU (``plan``). The shapes of three models ship:
:data:`MINIMAX_M2`, :data:`M3_LAYER` and :data:`LLAMA3_70B` (each with its source). The workbook's
tiny model has its shape in :func:`minimax_lab.model.config.tiny_model_shape`.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LayerShape:
    """What one token costs a model: KV bytes it leaves behind and prefill FLOPs to make them."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_flops_per_token: float        # per layer (active experts only for MoE)
    dtype_bytes: int = 2
    source: str = ""
    sparse_tokens: int = 0            # sparse attention: tokens each query attends (0 = all, dense)
    index_dim: int = 0                # sparse attention's index branch: one query of this width per KV head

    def _attended_sum(self, start: int, end: int) -> float:
        """Sum over positions p in [start, end) of the tokens attended: p, or min(p, sparse_tokens)."""
        def tri(a, b):                # sum of p for p in [a, b)
            return (a + b - 1) * (b - a) / 2 if b > a else 0.0
        if not self.sparse_tokens:
            return tri(start, end)
        cut = min(max(start, self.sparse_tokens), end)
        return tri(start, cut) + (end - cut) * self.sparse_tokens

    def kv_bytes_per_token(self) -> float:
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.dtype_bytes

    def prefill_flops(self, start: int, end: int) -> float:
        """FLOPs to prefill tokens ``[start, end)`` after ``start`` cached ones: each token at
        position ``p`` pays ``prefill_flops_per_token(p)`` (summed in closed form)."""
        if end <= start:
            return 0.0
        n, pos_sum = end - start, (start + end - 1) * (end - start) / 2
        attn = 2 * 2 * self.n_heads * self.head_dim * self._attended_sum(start, end)
        index = 2 * self.n_kv_heads * self.index_dim * pos_sum
        return n * self.prefill_flops_per_token(0) + self.n_layers * (attn + index)

    def prefill_flops_per_token(self, context: int) -> float:
        """Projections + attention over ``context`` earlier tokens (causal average ~context/2
        would be the mean over a prompt; we charge the token at position ``context``) + FFN."""
        d, H, G, D = self.d_model, self.n_heads, self.n_kv_heads, self.head_dim
        proj = 2 * d * (H * D + 2 * G * D) + 2 * H * D * d
        attended = min(context, self.sparse_tokens) if self.sparse_tokens else context
        attn = 2 * 2 * H * D * attended + 2 * G * self.index_dim * context
        return self.n_layers * (proj + attn + self.ffn_flops_per_token)



# MiniMax-M2 (config.json of https://huggingface.co/MiniMaxAI/MiniMax-M2): hidden_size 3072,
# num_hidden_layers 62, num_attention_heads 48, num_key_value_heads 8, head_dim 128,
# 256 local experts with intermediate_size 1536, num_experts_per_tok 8. Full attention in every layer.
MINIMAX_M2 = LayerShape("MiniMax-M2", n_layers=62, d_model=3072, n_heads=48, n_kv_heads=8, head_dim=128,
                        ffn_flops_per_token=8 * 2 * 3 * 3072 * 1536, dtype_bytes=2,
                        source="huggingface.co/MiniMaxAI/MiniMax-M2 config.json")


# The M3-shaped layer of ``engine.config.m3_config("gpu")``: GQA 64 query / 4 KV heads of 128,
# d_model 2048, 8 of 128 experts of width 768 (SwiGLU), MSA attending topk 16 blocks of 128
# tokens (2,048) plus its index branch (one 128-wide index query per KV group over the context).
M3_LAYER = LayerShape("M3-shaped layer", n_layers=1, d_model=2048, n_heads=64, n_kv_heads=4, head_dim=128,
                      ffn_flops_per_token=8 * 2 * 3 * 2048 * 768, dtype_bytes=2, sparse_tokens=16 * 128,
                      index_dim=128, source="minimax_lab.engine.config.m3_config('gpu')")

# LLaMA3-70B, the model of Mooncake's FAST'25 evaluation (320 KB of KV per token, their Table 1):
# 80 layers, d_model 8192, 64 query / 8 KV heads of 128, dense SwiGLU FFN of 28,672.
LLAMA3_70B = LayerShape("LLaMA3-70B", n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, head_dim=128,
                        ffn_flops_per_token=2 * 3 * 8192 * 28672, dtype_bytes=2,
                        source="huggingface.co/meta-llama/Meta-Llama-3-70B config.json")


def break_even(shape: LayerShape, *, link_gbps: float, gpu_tflops: float, context: int = 32_768,
               mfu: float = 0.5) -> dict:
    """Seconds per token to fetch its KV over a ``link_gbps`` link vs to recompute it at ``mfu`` of
    ``gpu_tflops``. ``fetch_wins`` when fetching is faster; ``ratio`` = recompute time / fetch time.
    Also the link bandwidth at which the two are equal (``break_even_gbps``)."""
    b = shape.kv_bytes_per_token()
    f = shape.prefill_flops_per_token(context)
    t_fetch = b / (link_gbps * 1e9)
    t_comp = f / (gpu_tflops * 1e12 * mfu)
    return dict(model=shape.name, kv_bytes_per_token=b, prefill_flops_per_token=f, t_fetch_s=t_fetch,
                t_recompute_s=t_comp, ratio=t_comp / t_fetch, fetch_wins=t_fetch < t_comp,
                break_even_gbps=b / t_comp / 1e9, context=context)


@dataclass(frozen=True)
class PrefillCost:
    """Seconds to serve a prompt's prefix from a local cache, the pool or by computing it.

    ``shape`` gives KV bytes per token and FLOPs per span (:class:`LayerShape`); ``link_gbps``
    is the pool's measured bandwidth (GB/s), ``tflops`` the device's rate and ``mfu`` the
    fraction of it a prefill reaches. Raises ``ValueError`` for a rate that is not positive."""

    shape: LayerShape
    link_gbps: float
    tflops: float
    mfu: float = 0.5

    def __post_init__(self):
        for name in ("link_gbps", "tflops", "mfu"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name} must be a positive number, got {v!r}")

    def fetch_s(self, tokens: int) -> float:
        return tokens * self.shape.kv_bytes_per_token() / (self.link_gbps * 1e9)

    def compute_s(self, start: int, end: int) -> float:
        return self.shape.prefill_flops(start, end) / (self.tflops * 1e12 * self.mfu)

    def plan(self, n_tokens: int, local: int, pool: int) -> tuple[float, int, int]:
        """(seconds, tokens fetched, tokens computed) for a prompt of ``n_tokens`` with ``local``
        tokens cached here and ``pool`` in the pool: fetch the pool's part beyond ``local`` only
        when that beats recomputing it (the break-even rule), compute the rest."""
        local = min(local, n_tokens)
        pool = min(pool, n_tokens)
        fetch = pool - local if pool > local and self.fetch_s(pool - local) < self.compute_s(local, pool) else 0
        start = local + fetch
        return self.fetch_s(fetch) + self.compute_s(start, n_tokens), fetch, n_tokens - start

