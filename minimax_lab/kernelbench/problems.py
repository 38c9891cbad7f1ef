"""The bench's problems: what a candidate kernel must compute, on which shapes, to what tolerance.

A :class:`Problem` holds

* ``reference(**inputs)`` -- the readable answer (run in fp32/fp64 by the harness);
* ``make_inputs(shape, seed, regime)`` -- fresh seeded inputs; ``regime`` picks the value
  distribution (``"normal"``; harder ones such as ``"large"`` or ``"tiny"`` magnitudes), because a
  kernel right on N(0, 1) can be wrong where real activations live;
* ``validation_shapes(preset)`` -- the *public* shapes a submitter may tune on;
* ``draw_test_shape(rng, preset)`` -- held-out shapes. The harness calls it with a
  ``random.Random`` seeded from ``os.urandom`` inside its evaluate call, only after the candidate
  is fixed; no seed or list of test shapes is stored on a problem;
* ``tol`` (relative norm error; ``None`` = by dtype from :data:`minimax_lab.bench.TOLERANCES`,
  ``0`` = integer outputs must match exactly);
* ``best()`` -- the workbook's fastest implementation (or ``None`` for an open problem: then the
  reference is the baseline to beat);
* ``strong_peer()`` -- the :class:`Peer` a user would pick instead of writing a kernel (``torch.softmax``
  in the input's dtype, ``F.rms_norm`` after the add, a serving engine's RoPE, SDPA over a contiguous
  cache, PyTorch's vectorized MSA selection, the FP8 grouped GEMMs of ``torch._scaled_grouped_mm``).
  The harness times it beside every candidate and reports the speed-up against it first: a ratio
  to the fp32 reference alone flatters any kernel (the catalogue's family "a weak baseline");
* ``available()`` -- ``None``, or a message saying why the problem cannot be scored here;
* ``traffic(**inputs)`` -- ``(flops, bytes)`` that any correct kernel must at least execute and
  move on these inputs (read every input it needs once, write every output once); the harness
  flags a time below what the device's measured ceilings allow for them as impossible;
* ``shortcut(shape)`` -- ``None``, or why the workbook's implementation would take a path that is
  not its kernel at this shape (the harness refuses to time a problem at such a shape).

:data:`PROBLEMS` maps names to problems; :func:`get_problem` looks one up.
"""
from __future__ import annotations

import dataclasses
import functools
import random
import warnings
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F

from minimax_lab import runtime
from minimax_lab.attention.msa import msa_select
from minimax_lab.fp8 import quantize_fp8
from minimax_lab.kernelbench import ops, problem_msa_backward
from minimax_lab.paged_kv.decode import paged_decode
from minimax_lab.moe import align as moe_align
from minimax_lab.moe import moe_experts
from minimax_lab.moe.experts_reference import experts_fp8_reference
from minimax_lab.moe.experts_torch import experts_fp8_torch

Shape = Mapping[str, int]


@dataclasses.dataclass(frozen=True)
class Peer:
    """The implementation a user would pick instead of writing a kernel, timed beside every candidate.

    ``run(**prepare(inputs))`` is timed; ``prepare`` (untimed, like a serving engine's setup)
    builds the layout the peer reads: a contiguous KV cache, a table of cosines and sines.
    ``same_contract``: it computes the problem's answer (the harness checks it once on the timing
    inputs); False for a peer that computes a related, larger function (dense attention for a
    sparse one) -- then it is timed, not judged. ``note`` says what it is and where it comes from."""

    name: str
    run: Callable[..., Any]
    prepare: Callable[[dict], dict] = dict
    same_contract: bool = True
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Problem:
    """One operator to be implemented; see the module docstring for each field."""

    name: str
    description: str
    reference: Callable[..., Any]
    make_inputs: Callable[[Shape, int, str], dict]
    validation_shapes: Callable[[str], list[dict]]
    draw_test_shape: Callable[[random.Random, str], dict]
    timing_shape: Callable[[str], dict]
    tol: float | None = None
    regimes: tuple[str, ...] = ("normal",)
    best: Callable[[], Callable | None] = lambda: None
    strong_peer: Callable[[], Peer | None] = lambda: None
    available: Callable[[], str | None] = lambda: None
    open: bool = False
    cost: Callable[[Shape], tuple[float, float]] | None = None  # (flops, bytes) of one call
    traffic: Callable[..., tuple[float, float]] | None = None  # minimum (flops, bytes) on given inputs
    shortcut: Callable[[Shape], str | None] = lambda shape: None

    def __repr__(self) -> str:  # short: problems get printed in notebooks
        return f"Problem({self.name!r}{', open' if self.open else ''})"


def _gen(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(int(seed) % 2**63)


def _dtype() -> torch.dtype:
    return runtime.compute_dtype()


def _dev() -> torch.device:
    return runtime.kernel_device()


def _scaled(t: torch.Tensor, regime: str, seed: int = 0) -> torch.Tensor:
    """Value regimes: normal N(0,1); large (x 1e3: fp16 sums of squares overflow); tiny (x 1e-4:
    squares underflow in fp16); outliers (a few entries x 100, as in LLM activations)."""
    if regime == "large":
        return t * 1e3
    if regime == "tiny":
        return t * 1e-4
    if regime == "outliers":
        mask = torch.rand(t.shape, generator=_gen(seed + 7, t.device), device=t.device) < 0.01
        return torch.where(mask, t * 100, t)
    if regime == "logits":
        return t * 40  # sharp softmax: exp without the max trick overflows
    if regime != "normal":
        raise ValueError(f"unknown input regime {regime!r}")
    return t


def _randn(shape, seed, regime, dtype=None):
    dev = _dev()  # drawn where it is used: a GPU-size KV cache drawn on the CPU takes seconds
    t = _scaled(torch.randn(shape, generator=_gen(seed, dev), device=dev), regime, seed)
    return t.to(dtype=dtype or _dtype())


def _nbytes(*tensors: torch.Tensor) -> float:
    return float(sum(t.numel() * t.element_size() for t in tensors))


# --------------------------------------------------------------------------- row softmax


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


# --------------------------------------------------------------------------- MSA top-k selection


MSA_SELECT_BLOCK, MSA_SELECT_TOPK = 16, 4


def _msa_inputs(shape, seed, regime):
    B, S, G, Di = shape["batch"], shape["seq"], shape["groups"], shape["d_idx"]
    # fp32 index scores: near-ties between blocks are then vanishingly rare, so exact ids are fair
    return {"q_idx": _randn((B, S, G, Di), seed, regime, torch.float32),
            "k_idx": _randn((B, S, Di), seed + 1, regime, torch.float32)}


def _msa_select_reference(q_idx, k_idx):
    """The MSA chapter's readable reference on the CPU; on a GPU its vectorized ``torch`` impl
    (tested equal to the reference by the MSA tests): the readable one sorts every row in Python,
    which takes minutes at GPU sizes."""
    impl = "reference" if q_idx.device.type == "cpu" else "torch"
    return msa_select(q_idx, k_idx, block_size=MSA_SELECT_BLOCK, topk=MSA_SELECT_TOPK, impl=impl)


def msa_select_workbook(q_idx, k_idx):
    """The MSA chapter's Triton selection kernel at this problem's block size and top-k."""
    return msa_select(q_idx, k_idx, block_size=MSA_SELECT_BLOCK, topk=MSA_SELECT_TOPK, impl="triton")


def msa_select_torch_peer(q_idx, k_idx):
    """The MSA chapter's vectorized PyTorch selection (chunked scores, ``torch.topk`` on int64 keys)."""
    return msa_select(q_idx, k_idx, block_size=MSA_SELECT_BLOCK, topk=MSA_SELECT_TOPK, impl="torch")


def _msa_select_traffic(q_idx, k_idx):
    """Every query scores every causally visible key (S^2 / 2 dot products of length D_idx per
    group), reads both index tensors and writes ``topk`` int32 ids per (query, group)."""
    B, S, G, Di = q_idx.shape
    return float(B * G * S * S * Di), _nbytes(q_idx, k_idx) + 4.0 * B * S * G * MSA_SELECT_TOPK


def _msa_select_shortcut(shape):
    if shape["seq"] <= MSA_SELECT_TOPK * MSA_SELECT_BLOCK:
        return (f"seq {shape['seq']} <= topk * block_size = {MSA_SELECT_TOPK * MSA_SELECT_BLOCK}: every query "
                "keeps all its visible blocks, so the selection returns without ranking anything")
    return None


MSA_SELECT = Problem(
    name="msa_select",
    description="MSA top-k block selection (the MSA chapter's contract), block_size 16, topk 4; int32 ids exact",
    reference=lambda q_idx, k_idx: _msa_select_reference(q_idx, k_idx),
    make_inputs=_msa_inputs,
    validation_shapes=lambda p: runtime.pick(p, cpu=[{"batch": 1, "seq": 80, "groups": 2, "d_idx": 16}],
                                              gpu=[{"batch": 2, "seq": 4096, "groups": 4, "d_idx": 128}]),
    draw_test_shape=lambda rng, p: runtime.pick(
        p, cpu={"batch": rng.randint(1, 2), "seq": rng.randint(1, 100), "groups": rng.randint(1, 3), "d_idx": 16},
        gpu={"batch": rng.randint(1, 4), "seq": rng.randint(1, 8192), "groups": rng.randint(1, 8), "d_idx": 128}),
    # seq must exceed topk * block_size (64), or the timed call never reaches the kernel
    timing_shape=lambda p: runtime.pick(p, cpu={"batch": 1, "seq": 96, "groups": 2, "d_idx": 16},
                                        gpu={"batch": 2, "seq": 4096, "groups": 4, "d_idx": 128}),
    tol=0.0,
    best=lambda: msa_select_workbook,
    strong_peer=lambda: Peer("msa_select(impl='torch'), vectorized PyTorch", msa_select_torch_peer,
                             note="the exact selection in a few vectorized PyTorch ops; SGLang's Triton indexer "
                                  "(where fetched) takes bf16 scores and breaks ties in another order, so it answers "
                                  "a different contract"),
    traffic=_msa_select_traffic,
    shortcut=_msa_select_shortcut,
)


# --------------------------------------------------------------------------- paged decode


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


# --------------------------------------------------------------------------- MoE token alignment


def _distinct_experts(T: int, E: int, k: int, g: torch.Generator) -> torch.Tensor:
    """``[T, k]`` int64: k distinct random experts per token (top-k of random keys, vectorized)."""
    return torch.rand(T, E, generator=g).argsort(dim=1)[:, :k]


def _align_inputs(shape, seed, regime):
    g = _gen(seed)
    T, k, E = shape["tokens"], shape["top_k"], shape["experts"]
    ids = _distinct_experts(T, E, k, g)
    return {"topk_ids": ids.to(torch.int32).to(_dev()), "n_experts": E}


def moe_align_reference(topk_ids, n_experts):
    """Group the (token, slot) pairs by expert: returns ``(order int64 [T*k], counts int64 [E])``
    where ``order`` lists flat slot indices ``t * k + j`` expert by expert, in token order within an
    expert (a stable sort), and ``counts[e]`` is expert e's number of rows."""
    flat = topk_ids.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices
    return order, torch.bincount(flat, minlength=n_experts)


MOE_ALIGN = Problem(
    name="moe_align",
    description="MoE token alignment: stable order of (token, slot) pairs by expert, and per-expert counts",
    reference=moe_align_reference,
    make_inputs=_align_inputs,
    validation_shapes=lambda p: runtime.pick(p, cpu=[{"tokens": 16, "top_k": 2, "experts": 8}],
                                              gpu=[{"tokens": 8192, "top_k": 8, "experts": 128}]),
    draw_test_shape=lambda rng, p: runtime.pick(
        p, cpu={"tokens": rng.randint(1, 40), "top_k": rng.randint(1, 3), "experts": rng.randint(4, 12)},
        gpu={"tokens": rng.randint(1, 16384), "top_k": rng.choice([1, 2, 4, 8]), "experts": rng.choice([8, 64, 128, 256])}),
    timing_shape=lambda p: runtime.pick(p, cpu={"tokens": 32, "top_k": 2, "experts": 8},
                                        gpu={"tokens": 8192, "top_k": 8, "experts": 128}),
    tol=0.0,
    best=lambda: moe_align_workbook,
    strong_peer=lambda: Peer("torch.sort(stable=True) + torch.bincount", moe_align_reference,
                             note="the reference's two PyTorch calls are what a user writes (SGLang's "
                                  "moe_align_block_size pads per block and is not stable within an expert)"),
    # read the ids, write the int64 order and the counts
    traffic=lambda topk_ids, n_experts: (0.0, _nbytes(topk_ids) + 8.0 * topk_ids.numel() + 8.0 * n_experts),
)

def moe_align_workbook(topk_ids, n_experts):
    """The MoE chapter's ``align_tokens`` (block-padded layout) adapted to this contract: with
    ``block_m = 1`` nothing is padded, so the first ``T*k`` rows of ``sorted_ids`` are the stable
    expert order. The one-launch Triton version is used where it applies (``T*k`` up to
    ``TRITON_ALIGN_MAX_SLOTS``)."""
    n = topk_ids.numel()
    align = moe_align.align_tokens_triton if n <= moe_align.TRITON_ALIGN_MAX_SLOTS else moe_align.align_tokens_unchecked
    a = align(topk_ids, n_experts, 1)
    return a.sorted_ids[:n], a.counts


# --------------------------------------------------------------------------- MSA backward


def _dense_backward_layout(inputs: dict) -> dict:
    q, k, v = (inputs[n].detach().transpose(1, 2).requires_grad_(True) for n in ("q", "k", "v"))
    return {"q": q, "k": k, "v": v, "grad_out": inputs["grad_out"].transpose(1, 2)}


def dense_attention_backward_peer(q, k, v, grad_out):
    """Dense causal attention's forward and backward through ``F.scaled_dot_product_attention``
    (``[B, H, S, D]`` leaves): the gradients of *all* causal pairs, the work a sparse backward skips."""
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
    return tuple(g.transpose(1, 2) for g in torch.autograd.grad(out, (q, k, v), grad_out))


MSA_BACKWARD = Problem(
    **problem_msa_backward.FIELDS,
    strong_peer=lambda: Peer("dense causal SDPA, forward + backward", dense_attention_backward_peer,
                             prepare=_dense_backward_layout, same_contract=False,
                             note="F.scaled_dot_product_attention(is_causal=True, enable_gqa) and autograd: every "
                                  "causal pair, not only the selected blocks -- what a sparse backward has to beat"),
)


def _fp8_moe_inputs(shape, seed, regime):
    T, d, f, E, k = shape["tokens"], shape["d_model"], shape["d_ff"], shape["experts"], shape["top_k"]
    g = _gen(seed)
    w13 = torch.randn(E, 2 * f, d, generator=g) / d**0.5
    w2 = torch.randn(E, d, f, generator=g) / f**0.5
    w13, s13 = quantize_fp8(w13)  # one power-of-two scale per output channel
    w2, s2 = quantize_fp8(w2)
    ids = _distinct_experts(T, E, k, g)
    weights = torch.softmax(torch.randn(T, k, generator=g), dim=-1)
    dev = _dev()
    return {"x": _randn((T, d), seed + 1, regime, torch.float32),
            "w13": w13.to(dev), "w13_scale": s13.to(dev), "w2": w2.to(dev), "w2_scale": s2.to(dev),
            "topk_ids": ids.to(torch.int32).to(dev), "topk_weights": weights.to(dev)}


def fp8_moe_reference(x, w13, w13_scale, w2, w2_scale, topk_ids, topk_weights):
    """SwiGLU experts with fp8 (e4m3) weights and per-output-channel scales, activations quantized
    per token with power-of-two scales (:mod:`minimax_lab.moe.experts_reference` spells out the five
    steps): ``out[t] = sum_j w[t,j] * W2_e q(bf16(silu(G_e q(x)) * U_e q(x)))`` with
    e = topk_ids[t, j] and ``q`` the per-row FP8 round trip of :func:`minimax_lab.fp8.quantize_fp8`."""
    # the harness hands references fp32 copies of every float input: fp8 values come back exactly
    w13, w2 = (w if w.dtype == torch.float8_e4m3fn else w.to(torch.float8_e4m3fn) for w in (w13, w2))
    return experts_fp8_reference(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids)


def fp8_fused_moe_workbook(x, w13, w13_scale, w2, w2_scale, topk_ids, topk_weights):
    """The MoE chapter's fused Triton experts with FP8 weights."""
    return moe_experts(x, w13, w2, topk_weights, topk_ids, impl="triton", check_ids=False,
                       w_gate_up_scale=w13_scale, w_down_scale=w2_scale)


def fp8_grouped_gemm_peer(x, w13, w13_scale, w2, w2_scale, topk_ids, topk_weights):
    """The MoE chapter's PyTorch FP8 experts: ``torch._scaled_grouped_mm`` on Hopper-class GPUs
    (``torch._scaled_mm`` per expert on other FP8 GPUs, dequantized grouped GEMMs elsewhere)."""
    return experts_fp8_torch(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids)


def _fp8_moe_traffic(x, w13, w13_scale, w2, w2_scale, topk_ids, topk_weights):
    """Only the experts some token picked need their weights read (fp8: 3 f d bytes each); 6 T k d f
    flops (gate and up: 4 d f per routed token, down: 2 d f); x read, the output written."""
    used = topk_ids.unique()
    f, d = w2.shape[-1], w2.shape[1]
    weights = float(used.numel()) * (3 * f * d * w13.element_size() + 3 * f * w13_scale.element_size())
    return 6.0 * topk_ids.numel() * d * f, weights + 2 * _nbytes(x) + _nbytes(topk_ids, topk_weights)


FP8_MOE = Problem(
    name="fp8_fused_moe",
    description="fused MoE (SwiGLU experts) with fp8 (e4m3) weights, one fp32 scale per output channel, "
                "activations quantized per token",
    reference=fp8_moe_reference,
    make_inputs=_fp8_moe_inputs,
    validation_shapes=lambda p: runtime.pick(p, cpu=[{"tokens": 12, "d_model": 32, "d_ff": 48, "experts": 4, "top_k": 2}],
                                              gpu=[{"tokens": 4096, "d_model": 4096, "d_ff": 1536, "experts": 64, "top_k": 8}]),
    draw_test_shape=lambda rng, p: runtime.pick(
        p, cpu={"tokens": rng.randint(1, 20), "d_model": 8 * rng.randint(1, 6), "d_ff": 8 * rng.randint(1, 8),
                "experts": rng.randint(2, 6), "top_k": 2},
        gpu={"tokens": rng.randint(1, 8192), "d_model": 4096, "d_ff": 1536, "experts": 64, "top_k": 8}),
    timing_shape=lambda p: runtime.pick(p, cpu={"tokens": 16, "d_model": 32, "d_ff": 48, "experts": 4, "top_k": 2},
                                        gpu={"tokens": 4096, "d_model": 4096, "d_ff": 1536, "experts": 64, "top_k": 8}),
    tol=2e-2,  # the reference quantizes as a kernel must: what is left is summation order and rounding ties
    best=lambda: fp8_fused_moe_workbook,
    strong_peer=lambda: Peer("torch._scaled_grouped_mm (FP8 grouped GEMMs)", fp8_grouped_gemm_peer,
                             note="sorted routed rows through PyTorch's FP8 grouped GEMM where the GPU runs it; "
                                  "SGLang's fused MoE (where fetched) takes bf16/fp16 weights, not this contract"),
    traffic=_fp8_moe_traffic,
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

PROBLEMS: dict[str, Problem] = {p.name: p for p in (SOFTMAX, RMSNORM, ROPE, MSA_SELECT, PAGED_DECODE, MOE_ALIGN,
                                                    MSA_BACKWARD, FP8_MOE, FP8_PAGED_DECODE)}


def get_problem(name: str | Problem) -> Problem:
    """A problem by name (or the problem itself); ``ValueError`` listing the names otherwise."""
    if isinstance(name, Problem):
        return name
    if name not in PROBLEMS:
        raise ValueError(f"unknown problem {name!r}; choose from {sorted(PROBLEMS)}")
    return PROBLEMS[name]
