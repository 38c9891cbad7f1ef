"""The kernel bench's paged-decode problems: one decode step of GQA attention over a paged KV cache
(``paged_decode``), and the same over an FP8 (e4m3) cache with one scale per page and KV head
(``fp8_paged_decode``), each against SDPA over a contiguous cache.
"""
from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F

from minimax_lab import runtime
from minimax_lab.fp8 import quantize_fp8
from minimax_lab.kernelbench.problem import Peer, Problem, _dev, _gen, _nbytes, _randn
from minimax_lab.paged_kv.decode import paged_decode


def _paged_inputs(shape, seed, regime):
    B, Hq, Hkv, D, P = shape["batch"], shape["heads"], shape["kv_heads"], shape["head_dim"], shape["page_size"]
    g = _gen(seed)
    seq_lens = torch.randint(1, shape["max_len"] + 1, (B,), generator=g, dtype=torch.int32)
    pages_per_seq = int((seq_lens.max() + P - 1) // P)
    num_pages = B * pages_per_seq + 3
    perm = torch.randperm(num_pages, generator=g).to(torch.int32)  # pages scattered through the pool
    table = torch.full((B, pages_per_seq), -1, dtype=torch.int32)
    used = 0
    for b in range(B):
        n = int((seq_lens[b] + P - 1) // P)
        table[b, :n] = perm[used:used + n]
        used += n
    return {"q": _randn((B, Hq, D), seed + 1, regime), "k_cache": _randn((num_pages, P, Hkv, D), seed + 2, regime),
            "v_cache": _randn((num_pages, P, Hkv, D), seed + 3, regime),
            "block_table": table.to(_dev()), "seq_lens": seq_lens.to(_dev())}


def _paged_traffic(q, k_cache, v_cache, seq_lens, extra_bytes: float = 0.0):
    """Each sequence's own tokens of K and V are read once (nothing else of the pool), q is read
    and the output written; 4 flops per (token, query head, dim): q.k and p.v."""
    n = float(seq_lens.sum())
    Hq, D = q.shape[1], q.shape[2]
    Hkv = k_cache.shape[2]
    kv = 2 * n * Hkv * D * k_cache.element_size()
    return 4.0 * n * Hq * D, kv + 2 * _nbytes(q) + extra_bytes


def paged_decode_gather_loop(q, k_cache, v_cache, block_table, seq_lens):
    """Gather each sequence's tokens page by page, then plain softmax attention (GQA)."""
    B, Hq, D = q.shape
    P, Hkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    for b in range(B):
        n = int(seq_lens[b])
        pages = block_table[b, : (n + P - 1) // P].long()
        k = k_cache[pages].reshape(-1, Hkv, D)[:n].repeat_interleave(Hq // Hkv, dim=1)  # [n, Hq, D]
        v = v_cache[pages].reshape(-1, Hkv, D)[:n].repeat_interleave(Hq // Hkv, dim=1)
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[b], k) / D**0.5, dim=-1)
        out[b] = torch.einsum("hn,nhd->hd", p, v)
    return out


def _sequence_kv(k_cache, v_cache, block_table, seq_lens) -> tuple[list, list]:
    """Each sequence's own tokens of K and V copied out of the pages: two lists of ``[n_b, Hkv, D]``."""
    P = k_cache.shape[1]
    lens = seq_lens.long().tolist()
    rows = [block_table[b, : (n + P - 1) // P].long() for b, n in enumerate(lens)]
    return ([k_cache[r].flatten(0, 1)[:n] for r, n in zip(rows, lens)],
            [v_cache[r].flatten(0, 1)[:n] for r, n in zip(rows, lens)])


def _sdpa_layout(q, ks: list, vs: list) -> dict:
    """Nested (jagged) tensors for SDPA: each sequence's G = Hq / Hkv query heads of a kv head as G
    query rows against that head's keys (``ks``, ``vs``: one ``[n_b, Hkv, D]`` per sequence) --
    grouped-query attention with the cache read once, no padding."""
    B, Hq, D = q.shape
    Hkv = ks[0].shape[1]
    q_rows = q.view(B, Hkv, Hq // Hkv, D).transpose(1, 2)  # [B, G, Hkv, D]
    jagged = functools.partial(torch.nested.as_nested_tensor, layout=torch.jagged)
    return {"q": jagged(list(q_rows)), "k": jagged(ks), "v": jagged(vs), "heads": Hq}


def _paged_decode_peer_layout(inputs: dict) -> dict:
    ks, vs = _sequence_kv(inputs["k_cache"], inputs["v_cache"], inputs["block_table"], inputs["seq_lens"])
    return _sdpa_layout(inputs["q"], ks, vs)


def sdpa_contiguous_peer(q, k, v, heads):
    """``F.scaled_dot_product_attention`` over a contiguous KV cache, one call for the ragged batch
    (nested tensors: FlashAttention's variable-length kernel on a CUDA GPU); returns ``[B, Hq, D]``."""
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if q.is_cuda:
        out = F.scaled_dot_product_attention(q, k, v)
    else:
        with warnings.catch_warnings():  # the CPU's math path builds strided nested tensors, a prototype that warns
            warnings.simplefilter("ignore", UserWarning)
            out = F.scaled_dot_product_attention(q, k, v)
    rows = out.transpose(1, 2).values()  # [B * G, Hkv, D]
    B, D = q.size(0), rows.shape[-1]
    return rows.view(B, -1, rows.shape[1], D).transpose(1, 2).reshape(B, heads, D)


_SDPA_NOTE = ("F.scaled_dot_product_attention on each sequence's own tokens copied out of the pages before the call "
              "(untimed): the contiguous cache a user without paging has")


def paged_decode_workbook(q, k_cache, v_cache, block_table, seq_lens):
    """The paged KV cache chapter's Triton decode kernel."""
    return paged_decode(q, k_cache, v_cache, block_table, seq_lens, impl="triton")


PAGED_DECODE = Problem(
    name="paged_decode",
    description="one decode step of GQA attention over a paged KV cache (the shared paged layout)",
    reference=paged_decode_gather_loop,
    make_inputs=_paged_inputs,
    validation_shapes=lambda p: runtime.pick(
        p, cpu=[{"batch": 2, "heads": 4, "kv_heads": 2, "head_dim": 16, "page_size": 16, "max_len": 40}],
        gpu=[{"batch": 32, "heads": 32, "kv_heads": 8, "head_dim": 128, "page_size": 64, "max_len": 8192}]),
    draw_test_shape=lambda rng, p: (lambda kv, g: runtime.pick(
        p, cpu={"batch": rng.randint(1, 3), "heads": kv * g, "kv_heads": kv, "head_dim": 16, "page_size": 16,
                "max_len": rng.randint(1, 70)},
        gpu={"batch": rng.randint(1, 64), "heads": kv * g, "kv_heads": kv, "head_dim": 128, "page_size": 64,
             "max_len": rng.randint(1, 16384)}))(rng.randint(1, 4), rng.choice([1, 2, 4])),
    timing_shape=lambda p: runtime.pick(
        p, cpu={"batch": 2, "heads": 4, "kv_heads": 2, "head_dim": 16, "page_size": 16, "max_len": 64},
        gpu={"batch": 32, "heads": 32, "kv_heads": 8, "head_dim": 128, "page_size": 64, "max_len": 8192}),
    best=lambda: paged_decode_workbook,
    strong_peer=lambda: Peer("SDPA over a contiguous KV cache", sdpa_contiguous_peer,
                             prepare=_paged_decode_peer_layout, note=_SDPA_NOTE),
    traffic=lambda q, k_cache, v_cache, block_table, seq_lens: _paged_traffic(q, k_cache, v_cache, seq_lens),
)


def quantize_pages_e4m3(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``cache [num_pages, P, Hkv, D]`` -> ``(float8_e4m3fn cache, float32 scale [num_pages, Hkv])``
    with one power-of-two scale per (page, kv head): ``cache ~= fp8.float() * scale[:, None, :, None]``."""
    return quantize_fp8(cache, dims=(1, 3))


def _fp8_paged_inputs(shape, seed, regime):
    base = _paged_inputs(shape, seed, regime)
    k8, k_scale = quantize_pages_e4m3(base["k_cache"])
    v8, v_scale = quantize_pages_e4m3(base["v_cache"])
    return {"q": base["q"], "k_cache": k8, "v_cache": v8, "k_scale": k_scale, "v_scale": v_scale,
            "block_table": base["block_table"], "seq_lens": base["seq_lens"]}


def fp8_paged_decode_reference(q, k_cache, v_cache, k_scale, v_scale, block_table, seq_lens):
    """Dequantize the fp8 pages to fp32 (``value * scale`` of its page and kv head), then
    :func:`paged_decode_gather_loop`; returns q's dtype."""
    k = k_cache.float() * k_scale.float()[:, None, :, None]
    v = v_cache.float() * v_scale.float()[:, None, :, None]
    return paged_decode_gather_loop(q.float(), k, v, block_table, seq_lens).to(q.dtype)


def fp8_paged_decode_workbook(q, k_cache, v_cache, k_scale, v_scale, block_table, seq_lens):
    """The paged decode kernel reading the fp8 pages and their per-(page, kv head) scales."""
    return paged_decode(q, k_cache, v_cache, block_table, seq_lens, k_scale=k_scale, v_scale=v_scale, impl="triton")


def _fp8_paged_decode_peer_layout(inputs: dict) -> dict:
    """The fp8 pages dequantized to the query's dtype, then laid out as :func:`_paged_decode_peer_layout`."""
    dt = inputs["q"].dtype
    k = (inputs["k_cache"].float() * inputs["k_scale"].float()[:, None, :, None]).to(dt)
    v = (inputs["v_cache"].float() * inputs["v_scale"].float()[:, None, :, None]).to(dt)
    ks, vs = _sequence_kv(k, v, inputs["block_table"], inputs["seq_lens"])
    return _sdpa_layout(inputs["q"], ks, vs)


FP8_PAGED_DECODE = Problem(
    name="fp8_paged_decode",
    description="paged GQA decode over an fp8 (e4m3) KV cache with one fp32 scale per (page, kv head)",
    reference=fp8_paged_decode_reference,
    make_inputs=_fp8_paged_inputs,
    validation_shapes=PAGED_DECODE.validation_shapes,
    draw_test_shape=PAGED_DECODE.draw_test_shape,
    timing_shape=PAGED_DECODE.timing_shape,
    regimes=("normal", "outliers"),  # outliers: a few large entries set a page's scale
    best=lambda: fp8_paged_decode_workbook,
    strong_peer=lambda: Peer("SDPA over a contiguous cache in the query's dtype", sdpa_contiguous_peer,
                             prepare=_fp8_paged_decode_peer_layout,
                             note="the fp8 pages dequantized to the query's dtype and copied out of the pages "
                                  "before the call (untimed), then F.scaled_dot_product_attention on each "
                                  "sequence's own tokens"),
    traffic=lambda q, k_cache, v_cache, k_scale, v_scale, block_table, seq_lens: _paged_traffic(
        q, k_cache, v_cache, seq_lens, extra_bytes=_nbytes(k_scale, v_scale)),
)
