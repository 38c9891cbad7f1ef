"""MSA's index branch for the tiny model, trained by distillation from the main branch.

The index branch of every block (``Block.idx_q``: ``d_model -> G * d_idx``, one index query per
GQA group; ``Block.idx_k``: ``d_model -> d_idx``, one index key shared by all groups) scores the
sequence's key blocks; :func:`minimax_lab.attention.msa_select` keeps the ``topk`` best (the local
block always among them). Left untrained, those scores are noise. They get a teacher:

* **teacher** -- the main branch's own attention, detached: for query ``t`` and group ``g``
  the probability mass that the group's heads (averaged) put on each key block,
  ``P[t, g, j] = mean_h sum_{key in block j} softmax(q_h k / sqrt(D))[t, key]``.
* **student** -- the indexer's block distribution ``Q[t, g, :] = softmax_j(max-pooled index
  scores)`` over the causally visible blocks (the same max-pool the selection uses).
* **loss** -- ``KL(P || Q)`` averaged over queries that see at least two blocks, all layers
  (:mod:`minimax_lab.attention.msa_backward_index`: the formula, and its gradient w.r.t. the index
  tensors in PyTorch or in Triton -- ``DistillConfig.impl``).

The schedule follows the MSA contract of :mod:`minimax_lab.attention.msa` (and the two-stage recipe of DeepSeek's
lightning indexer, DeepSeek-V3.2-Exp report, 2025): a short **dense warm-up**, where the main
branch runs dense attention and only the indexer learns; then a **sparse stage**, where the
main branch attends only to the blocks the indexer selects (so later layers see the hidden
states of a sparse model) and the indexer keeps matching the main branch's attention at those
hidden states. The main model stays frozen throughout (we teach the indexer to imitate it; the
paper also adapts the main weights, which needs far more training than a CPU can give).

**Recall** is what we track: the fraction of the dense attention mass that the selected blocks
capture, over queries that see more than ``topk`` blocks (where selection matters), measured on a
held-out set against two references with the same FLOPs budget: the sliding window (the ``topk``
most recent blocks) and the oracle (the ``topk`` blocks with the most mass, local block forced).

**Positions.** ``Block.index_qk`` is a plain projection of the normalized hidden state; in the
first layer that state holds no position at all, so such an indexer cannot express "the blocks
just before me" -- a pattern the teacher (whose q, k carry RoPE) uses a lot. With
``index_rope=True`` (the default here) we rotate ``q_idx``/``k_idx`` by RoPE on the sequence
positions before scoring, as DeepSeek's lightning indexer does on part of its index dims
(DeepSeek-V3.2-Exp, 2025). The notebook trains both variants and compares them.

Step API used (from :mod:`minimax_lab.model.model`): ``embed``, ``qkv``, ``index_qk``, ``finish``,
``logits``; tensors ``[batch, seq, heads, head_dim]``.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
from tqdm import tqdm

from minimax_lab.attention import attention, msa_attention, msa_select
from minimax_lab.attention.msa_backward_index import (NEG, distill_loss, index_block_logits,  # noqa: F401 - re-exported
                                                      index_distill_loss, visible_blocks)
from minimax_lab.attention.msa_index_fp8 import dequantize_index_keys, quantize_index_keys
from minimax_lab.attention.msa_reference import selection_mask
from minimax_lab.attention.msa_torch import select_from_scores
from minimax_lab.data.needle import needle_batch
from minimax_lab.model.layers import apply_rope, attention_probs, rope_cos_sin
from minimax_lab.validate import IMPLS, check_choice, check_positive_int, check_tensor

MODES = ("dense", "msa", "window", "oracle")


# --------------------------------------------------------------------------- block-level quantities


def block_mass(probs: torch.Tensor, n_groups: int, block_size: int) -> torch.Tensor:
    """Teacher: attention probabilities ``[B, Hq, S, S]`` -> block mass ``[B, S, G, n_blocks]``
    (heads of a group averaged, keys of a block summed). Rows sum to 1."""
    check_tensor(probs, "probs", ndim=4)
    B, Hq, S, _ = probs.shape
    if Hq % n_groups:
        raise ValueError(f"Hq ({Hq}) must be a multiple of the number of groups ({n_groups})")
    nb = math.ceil(S / block_size)
    p = probs.float().view(B, n_groups, Hq // n_groups, S, S).mean(2)
    p = nn.functional.pad(p, (0, nb * block_size - S)).view(B, n_groups, S, nb, block_size).sum(-1)
    return p.permute(0, 2, 1, 3)


def window_selection(B: int, S: int, G: int, *, block_size: int, topk: int, device=None) -> torch.Tensor:
    """Sliding-window baseline in the selection contract's layout ``int32 [B, S, G, topk]``: the
    ``topk - 1`` blocks before the local one (nearest first) and the local block last; all
    visible blocks (ascending, ``-1`` padded) when there are at most ``topk``."""
    local = torch.arange(S, device=device) // block_size  # [S]
    slot = torch.arange(topk, device=device)
    sparse = torch.cat([local[:, None] - 1 - slot[: topk - 1], local[:, None]], dim=1)
    dense = torch.where(slot <= local[:, None], slot, -1)
    sel = torch.where((local + 1 <= topk)[:, None], dense, sparse)
    return sel.to(torch.int32)[None, :, None, :].expand(B, S, G, topk).contiguous()


def oracle_selection(mass: torch.Tensor, *, block_size: int, topk: int) -> torch.Tensor:
    """Best possible selection under the contract: the ``topk - 1`` earlier blocks with the most
    teacher mass, local last. ``mass [B, S, G, nb]`` -> ``int32 [B, S, G, topk]``."""
    S = mass.shape[1]
    pos = torch.arange(S, device=mass.device)[None, :, None]
    return select_from_scores(mass.float(), pos, block_size, topk)


def selection_recall(mass: torch.Tensor, selected: torch.Tensor, block_size: int, topk: int) -> torch.Tensor:
    """Fraction of the teacher's mass captured by ``selected`` per (b, t, g), ``[B, S', G]`` over
    the queries that see more than ``topk`` blocks (the others capture everything by rule).
    Returns an empty tensor when no query sees more than ``topk`` blocks."""
    rows = visible_blocks(mass.shape[1], block_size, mass.device) > topk
    sel = selected[:, rows].long()
    m = mass[:, rows]
    return m.gather(-1, sel.clamp_min(0)).masked_fill(sel < 0, 0).sum(-1)


def blocks_per_tile(selected: torch.Tensor, tile: int) -> dict:
    """How much neighbouring queries share their selected blocks. ``selected [B, S, G, topk]``
    (block ids, ``-1`` = none) is cut into tiles of ``tile`` consecutive tokens (the last one may
    be short); per (sequence, tile, group) it counts the distinct block ids and the selected
    slots. Returns floats ``{"distinct", "slots", "loads_saved"}``: the mean distinct blocks and
    the mean slots per tile (tiles with at least one slot), and ``1 - sum(distinct) / sum(slots)``,
    the share of K/V block loads that a kernel loading each distinct block once per tile would
    skip against one load per slot. Raises ValueError for ``tile < 1``, a selection that is not
    4-D, or one with no selected slot."""
    if selected.dim() != 4:
        raise ValueError(f"selected must be [B, S, G, topk], got shape {tuple(selected.shape)}")
    if tile < 1:
        raise ValueError(f"tile must be >= 1, got {tile}")
    B, S, G, k = selected.shape
    n_tiles = -(-S // tile)
    sel = torch.nn.functional.pad(selected.long(), (0, 0, 0, 0, 0, n_tiles * tile - S), value=-1)
    sel = sel.view(B, n_tiles, tile, G, k).permute(0, 1, 3, 2, 4).reshape(B, n_tiles, G, tile * k)
    ids = sel.sort(-1).values
    valid = ids >= 0
    new_id = torch.ones_like(valid)
    new_id[..., 1:] = ids[..., 1:] != ids[..., :-1]
    distinct = (new_id & valid).sum(-1)
    slots = valid.sum(-1)
    used = slots > 0
    if not bool(used.any()):
        raise ValueError("the selection has no selected block")
    return {"distinct": distinct[used].float().mean().item(), "slots": slots[used].float().mean().item(),
            "loads_saved": 1.0 - distinct[used].sum().item() / slots[used].sum().item()}


# --------------------------------------------------------------------------- running the model


def index_qk(blk, h, positions, *, rope: bool = True):
    """The block's index query/key ``[B, S, G, d_idx]``, ``[B, S, d_idx]``, RoPE-rotated on
    ``positions`` when ``rope`` (see the module docstring)."""
    q_idx, k_idx = blk.index_qk(h)
    if rope:
        cos, sin = rope_cos_sin(positions, q_idx.shape[-1], blk.cfg.rope_base)
        q_idx, k_idx = apply_rope(q_idx, cos, sin), apply_rope(k_idx[:, :, None], cos, sin)[:, :, 0]
    return q_idx, k_idx


def _dense(q, k, v):
    return attention(q, k, v, causal=True, impl="torch")


def run_layers(model, tokens, images=None, *, mode: str = "dense", block_size: int | None = None,
               topk: int | None = None, impl: str = "torch", index_rope: bool = True, keep=()) -> dict:
    """Run the model layer by layer with attention ``mode`` (``"dense" | "msa" | "window" | "oracle"``).

    ``"msa"`` selects with the model's index branch (``msa_select(impl=impl)``) and attends with
    ``msa_attention(impl=impl)`` (``index_rope``: see :func:`index_qk`); ``"window"`` and ``"oracle"`` feed their own selection to the same
    sparse kernel. Returns ``{"logits": [B, S, vocab], "layers": [per layer dict]}``; each layer
    dict has ``h`` (the block's input), ``q``, ``k``, ``q_idx``/``k_idx`` (None without an index
    branch) and ``selected`` (None for dense), plus ``probs`` ``[B, Hq, S, S]`` -- the attention
    probabilities under this mode's pattern -- when ``"probs" in keep``.
    """
    check_choice(mode, "mode", MODES)
    cfg = model.cfg
    block_size = block_size or cfg.msa_block_size
    topk = topk or cfg.msa_topk
    if mode == "msa" and not cfg.use_indexer:
        raise ValueError("mode='msa' needs the index branch: load the model with use_indexer=True")
    h, positions = model.embed(tokens, images)
    B, S, _ = h.shape
    layers = []
    for blk in model.blocks:
        q, k, v = blk.qkv(h, positions)
        q_idx, k_idx = index_qk(blk, h, positions, rope=index_rope) if cfg.use_indexer else (None, None)
        rec = {"h": h, "q": q, "k": k, "q_idx": q_idx, "k_idx": k_idx, "selected": None}
        if mode == "dense":
            o = _dense(q, k, v)
        else:
            if mode == "msa":
                sel = msa_select(q_idx, k_idx, block_size=block_size, topk=topk, impl=impl)
            elif mode == "window":
                sel = window_selection(B, S, cfg.n_kv_heads, block_size=block_size, topk=topk, device=h.device)
            else:
                sel = oracle_selection(block_mass(attention_probs(q, k), cfg.n_kv_heads, block_size),
                                       block_size=block_size, topk=topk)
            qi = q_idx if q_idx is not None else q.new_zeros(B, S, cfg.n_kv_heads, 1)
            ki = k_idx if k_idx is not None else q.new_zeros(B, S, 1)
            o = msa_attention(q, k, v, qi, ki, block_size=block_size, topk=topk, impl=impl, selected=sel)
            rec["selected"] = sel
        if "probs" in keep:
            p = attention_probs(q, k)
            if rec["selected"] is not None:  # renormalize over the selected tokens only
                allowed = selection_mask(rec["selected"], S, block_size).repeat_interleave(
                    cfg.n_heads // cfg.n_kv_heads, dim=1)
                p = p * allowed
                p = p / p.sum(-1, keepdim=True)
            rec["probs"] = p
        layers.append(rec)
        h = blk.finish(h, o)
    return {"logits": model.logits(h), "layers": layers}


# --------------------------------------------------------------------------- the indexer's weights


def indexer_parameters(model) -> list:
    """The index-branch parameters of every block (raises if the model has none)."""
    if not model.cfg.use_indexer:
        raise ValueError("the model has no index branch: build/load it with use_indexer=True")
    return [p for blk in model.blocks for p in (*blk.idx_q.parameters(), *blk.idx_k.parameters())]


def init_indexer(model, seed: int = 0) -> None:
    """Re-draw the index weights ``N(0, 1/d_model)`` (unit-scale scores: an untrained indexer
    ranks blocks at random instead of tying them all at ~0, which would favour low block ids)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in indexer_parameters(model):
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


def indexer_state(model) -> dict:
    """Just the index-branch tensors (``blocks.i.idx_q.weight`` ...), for saving."""
    indexer_parameters(model)
    return {k: v.detach().clone() for k, v in model.state_dict().items() if ".idx_" in k}


def load_indexer_state(model, state: dict) -> None:
    """Load tensors from :func:`indexer_state`; raises ValueError on a missing or extra key."""
    want = set(indexer_state(model))
    if set(state) != want:
        raise ValueError(f"indexer state keys {sorted(state)} do not match the model's {sorted(want)}")
    model.load_state_dict(state, strict=False)


# --------------------------------------------------------------------------- distillation


@dataclass
class DistillConfig:
    """Distillation run. ``warmup_steps`` of the ``steps`` use the dense main branch; the rest the
    sparse one. Training documents are needle documents (:mod:`.needle`) of ``n_images`` images
    (``S = 16 * n_images + 7``), a pool of ``n_train`` reused across steps; ``n_eval`` held-out
    documents measure recall every ``eval_every`` steps. ``impl`` computes the loss and its
    gradient (:func:`minimax_lab.attention.msa_backward_index.index_distill_loss`)."""

    steps: int = 200
    warmup_steps: int = 60
    batch_size: int = 8
    lr: float = 1e-2
    n_images: int = 12
    n_train: int = 64
    n_eval: int = 16
    eval_every: int = 20
    block_size: int | None = None  # default: model.cfg.msa_block_size
    topk: int | None = None  # default: model.cfg.msa_topk
    index_rope: bool = True
    seed: int = 0
    impl: str = "torch"  # the loss and its gradient: "torch" (dense scores, autograd) or "triton"


@torch.no_grad()
def _teacher(model, batch, mode, block_size, topk, rope):
    """Per layer: (block input h, positions, teacher block mass) under the main-branch ``mode``."""
    r = run_layers(model, batch["tokens"], batch["images"], mode=mode, block_size=block_size, topk=topk,
                   index_rope=rope)
    G = model.cfg.n_kv_heads
    pos = torch.arange(batch["tokens"].shape[1]).expand(batch["tokens"].shape[0], -1)
    return [(L["h"], pos, block_mass(attention_probs(L["q"], L["k"]), G, block_size)) for L in r["layers"]]


@torch.no_grad()
def evaluate_recall(model, batch, *, block_size: int, topk: int, index_rope: bool = True) -> dict:
    """Mean recall of the dense attention mass on ``batch`` (a :func:`~.needle.needle_batch`) for
    the model's indexer (``"msa"``), the sliding window and the oracle; per layer and ``"all"``."""
    G = model.cfg.n_kv_heads
    out = {"msa": [], "window": [], "oracle": []}
    for L, mass in _dense_layers(model, batch, block_size, topk, index_rope):
        B, S = mass.shape[:2]
        sels = {"msa": msa_select(L["q_idx"], L["k_idx"], block_size=block_size, topk=topk, impl="torch"),
                "window": window_selection(B, S, G, block_size=block_size, topk=topk),
                "oracle": oracle_selection(mass, block_size=block_size, topk=topk)}
        for name, sel in sels.items():
            out[name].append(selection_recall(mass, sel, block_size, topk).mean().item())
    return _per_layer_and_all(out)


def _dense_layers(model, batch, block_size: int, topk: int, index_rope: bool):
    """``(layer capture, teacher block mass [B, S, G, nb])`` per layer of a dense run on ``batch``."""
    r = run_layers(model, batch["tokens"], batch["images"], mode="dense", block_size=block_size, topk=topk,
                   index_rope=index_rope)
    for L in r["layers"]:
        yield L, block_mass(attention_probs(L["q"], L["k"]), model.cfg.n_kv_heads, block_size)


def _per_layer_and_all(out: dict) -> dict:
    return {name: {"layers": v, "all": sum(v) / len(v)} for name, v in out.items()}


@torch.no_grad()
def fp8_index_recall(model, batch, *, block_size: int, topk: int, index_rope: bool = True) -> dict:
    """What storing MSA's index keys in FP8 (e4m3, one power-of-two scale per token, as the paged
    decode's FP8 index cache does: :mod:`minimax_lab.attention.msa_index_fp8`) costs the trained
    indexer on ``batch``: the recall of the dense attention mass with the keys as the model computes
    them (``"recall"``) and with the keys FP8 would store (``"recall_fp8"``), and the share of the
    selections that are equal as sets (``"rows_equal"``), over the queries that see more than
    ``topk`` blocks (the others select every block either way); per layer (``"layers"``) and
    averaged (``"all"``)."""
    out = {"recall": [], "recall_fp8": [], "rows_equal": []}
    for L, mass in _dense_layers(model, batch, block_size, topk, index_rope):
        k_fp8 = dequantize_index_keys(*quantize_index_keys(L["k_idx"]), dtype=L["k_idx"].dtype)
        sel = msa_select(L["q_idx"], L["k_idx"], block_size=block_size, topk=topk, impl="torch")
        sel8 = msa_select(L["q_idx"], k_fp8, block_size=block_size, topk=topk, impl="torch")
        out["recall"].append(selection_recall(mass, sel, block_size, topk).mean().item())
        out["recall_fp8"].append(selection_recall(mass, sel8, block_size, topk).mean().item())
        chosen = visible_blocks(mass.shape[1], block_size, mass.device) > topk
        same = (sel.sort(-1).values == sel8.sort(-1).values).all(-1)[:, chosen]
        out["rows_equal"].append(same.float().mean().item() if same.numel() else 1.0)
    return _per_layer_and_all(out)


def distill_indexer(model, dc: DistillConfig = DistillConfig(), *, progress: bool = True, init: bool = True) -> dict:
    """Train the model's index branch in place by KL distillation (module docstring); the rest
    of the model is frozen. Returns the history: ``step``, ``loss``, ``phase`` per step; at
    ``eval_step``: ``recall`` (indexer), ``recall_layers``; constant references ``window``,
    ``oracle`` (per layer and mean); ``config``, ``seconds``. ``init`` re-draws the indexer first
    (:func:`init_indexer`), so the curve starts from an untrained indexer."""
    params = indexer_parameters(model)
    check_positive_int(dc.steps, "steps")
    check_choice(dc.impl, "impl", IMPLS)
    if not 0 <= dc.warmup_steps <= dc.steps:
        raise ValueError(f"warmup_steps must be in [0, steps={dc.steps}], got {dc.warmup_steps}")
    block_size = dc.block_size or model.cfg.msa_block_size
    topk = dc.topk or model.cfg.msa_topk
    S = 16 * dc.n_images + 7
    if S <= topk * block_size:
        raise ValueError(f"documents of {S} tokens fit in topk * block_size = {topk * block_size}: "
                         f"nothing to select; raise n_images")
    if init:
        init_indexer(model, dc.seed)
    frozen = [p for p in model.parameters() if all(p is not q for q in params)]
    was = [p.requires_grad for p in frozen]
    for p in frozen:
        p.requires_grad_(False)
    model.eval()
    torch.manual_seed(dc.seed)
    train = needle_batch(dc.n_images, dc.n_train, seed=10_000 + dc.seed)
    held = needle_batch(dc.n_images, dc.n_eval, seed=20_000 + dc.seed)
    n_batches = max(1, dc.n_train // dc.batch_size)
    take = lambda i: {k: v[i * dc.batch_size:(i + 1) * dc.batch_size] for k, v in train.items()}  # noqa: E731
    dense_cache = {}
    opt = torch.optim.Adam(params, lr=dc.lr)
    hist = {"step": [], "loss": [], "phase": [], "eval_step": [], "recall": [], "recall_layers": [],
            "config": {**asdict(dc), "block_size": block_size, "topk": topk, "seq_len": S}}
    ref = evaluate_recall(model, held, block_size=block_size, topk=topk, index_rope=dc.index_rope)
    for name in ("window", "oracle"):
        hist[name], hist[name + "_layers"] = ref[name]["all"], ref[name]["layers"]
    hist["eval_step"].append(0)
    hist["recall"].append(ref["msa"]["all"])
    hist["recall_layers"].append(ref["msa"]["layers"])
    t0 = time.perf_counter()
    it = tqdm(range(dc.steps), desc="distill indexer", disable=not progress)
    try:
        for step in it:
            phase = "dense" if step < dc.warmup_steps else "sparse"
            bi = step % n_batches
            if phase == "dense":  # the dense teacher does not depend on the indexer: cache it
                if bi not in dense_cache:
                    dense_cache[bi] = _teacher(model, take(bi), "dense", block_size, topk, dc.index_rope)
                targets = dense_cache[bi]
            else:
                targets = _teacher(model, take(bi), "msa", block_size, topk, dc.index_rope)
            loss = sum(index_distill_loss(*index_qk(blk, h, pos, rope=dc.index_rope), mass, block_size=block_size,
                                          impl=dc.impl)
                       for blk, (h, pos, mass) in zip(model.blocks, targets)) / len(model.blocks)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            hist["step"].append(step)
            hist["loss"].append(loss.item())
            hist["phase"].append(phase)
            if (step + 1) % dc.eval_every == 0 or step + 1 == dc.steps:
                rec = evaluate_recall(model, held, block_size=block_size, topk=topk, index_rope=dc.index_rope)["msa"]
                hist["eval_step"].append(step + 1)
                hist["recall"].append(rec["all"])
                hist["recall_layers"].append(rec["layers"])
                if hasattr(it, "set_postfix"):
                    it.set_postfix(phase=phase, kl=f"{loss.item():.3f}", recall=f"{rec['all']:.3f}",
                                   window=f"{hist['window']:.3f}")
    finally:
        for p, w in zip(frozen, was):
            p.requires_grad_(w)
    hist["seconds"] = time.perf_counter() - t0
    return hist


# --------------------------------------------------------------------------- measurements for the notebook


@torch.no_grad()
def mass_concentration(probs: torch.Tensor, fractions, *, block_size: int | None = None,
                       min_pos: int = 0) -> torch.Tensor:
    """How concentrated attention is: for each query row ``t >= min_pos`` of ``probs
    [B, H, S, S]``, keep the top ``ceil(f * n_t)`` of its ``n_t`` visible keys (or key blocks of
    ``block_size`` when given) by mass, and return the mean mass kept, ``[len(fractions)]``."""
    check_tensor(probs, "probs", ndim=4)
    B, H, S, _ = probs.shape
    if not 0 <= min_pos < S:
        raise ValueError(f"min_pos must be in [0, {S}), got {min_pos}")
    p = probs.float()
    t = torch.arange(S, device=probs.device)
    n = t + 1
    if block_size:
        nb = math.ceil(S / block_size)
        p = nn.functional.pad(p, (0, nb * block_size - S)).view(B, H, S, nb, block_size).sum(-1)
        n = t // block_size + 1
    p, n = p[:, :, min_pos:], n[min_pos:]
    csum = p.sort(-1, descending=True).values.cumsum(-1)  # [B, H, S', K]
    out = []
    for f in fractions:
        k = torch.clamp(torch.ceil(f * n.float()).long(), 1) - 1  # [S']
        out.append(csum.gather(-1, k.view(1, 1, -1, 1).expand(B, H, -1, 1)).mean())
    return torch.stack(out)


@torch.no_grad()
def recall_vs_length(model, n_images_list, *, n_docs: int = 8, block_size: int | None = None,
                     topk: int | None = None, index_rope: bool = True, seed: int = 3) -> dict:
    """Recall of the dense attention mass (indexer, window, oracle; mean over layers) on held-out
    needle documents of each size: ``{"n_images", "seq_len", "msa", "window", "oracle"}``."""
    block_size = block_size or model.cfg.msa_block_size
    topk = topk or model.cfg.msa_topk
    out = {"n_images": list(n_images_list), "seq_len": [], "msa": [], "window": [], "oracle": []}
    for n in n_images_list:
        batch = needle_batch(n, n_docs, seed=seed)
        out["seq_len"].append(int(batch["tokens"].shape[1]))
        if out["seq_len"][-1] <= topk * block_size:
            raise ValueError(f"{n} images ({out['seq_len'][-1]} tokens) fit in topk * block_size; use more images")
        r = evaluate_recall(model, batch, block_size=block_size, topk=topk, index_rope=index_rope)
        for name in ("msa", "window", "oracle"):
            out[name].append(r[name]["all"])
    return out
