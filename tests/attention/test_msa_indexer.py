"""MSA index branch: distillation, selection baselines, the needle documents, selection pictures.

The block-level functions (teacher mass, student logits, the KL, window/oracle selections, recall,
mass concentration) are checked on the kernel device. The tiny model's distillation, needle
harness and pictures run on the CPU on every machine: the shipped checkpoint is a CPU model and
those pipelines build their batches there (as the notebook does at every preset)."""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from tests.support.devices import DEVICE, generator, randn  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402

from minimax_lab.attention.msa_reference import block_scores_reference  # noqa: E402
from minimax_lab.attention.msa_torch import select_from_scores  # noqa: E402
from minimax_lab.model import load_pretrained  # noqa: E402
from minimax_lab.model import msa_indexer as mi  # noqa: E402
from minimax_lab.model.layers import attention_probs  # noqa: E402
from minimax_lab.model.needle import needle_batch, needle_document  # noqa: E402
from minimax_lab.data.tokenizer import TOKENIZER  # noqa: E402
from minimax_lab.viz import selection as vsel  # noqa: E402


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m, _ = load_pretrained(use_indexer=True)
    return m


# --------------------------------------------------------------------------- distillation


def test_distillation_improves_recall_over_untrained(model):
    dc = mi.DistillConfig(steps=24, warmup_steps=12, batch_size=8, n_images=8, n_train=16, n_eval=8, eval_every=12,
                          block_size=16, topk=4)
    h = mi.distill_indexer(model, dc, progress=False)
    assert h["eval_step"] == [0, 12, 24]
    assert all(math.isfinite(x) for x in h["loss"]) and h["phase"][:12] == ["dense"] * 12 and h["phase"][-1] == "sparse"
    assert h["loss"][-1] < h["loss"][0]
    untrained, trained = h["recall"][0], h["recall"][-1]
    assert trained > untrained + 0.03, (untrained, trained)
    # nothing beats the oracle (the best top-k under the same contract) on the same documents
    assert trained <= h["oracle"] + 1e-6 and h["window"] <= h["oracle"] + 1e-6
    # the main model stayed frozen, and trainable again afterwards
    assert all(p.requires_grad for p in model.parameters())


def test_fp8_index_recall_compares_the_stored_keys(model, monkeypatch):
    """The FP8 figures come from the keys FP8 stores: equal to the model-precision ones when the
    quantizer is an identity, different when it destroys the keys."""
    batch = needle_batch(8, 4, seed=3)
    kw = dict(block_size=16, topk=4)
    r = mi.fp8_index_recall(model, batch, **kw)
    assert set(r) == {"recall", "recall_fp8", "rows_equal"}
    assert len(r["recall"]["layers"]) == model.cfg.n_layers
    assert 0 < r["recall_fp8"]["all"] <= 1 and 0 <= r["rows_equal"]["all"] <= 1
    base = mi.evaluate_recall(model, batch, **kw)["msa"]["all"]
    assert r["recall"]["all"] == pytest.approx(base)
    monkeypatch.setattr(mi, "dequantize_index_keys", lambda k8, scale, dtype=torch.float32: k8.to(dtype) * scale[..., None])
    monkeypatch.setattr(mi, "quantize_index_keys", lambda k: (k, torch.ones(k.shape[:-1])))   # identity
    same = mi.fp8_index_recall(model, batch, **kw)
    assert same["rows_equal"]["all"] == 1.0 and same["recall_fp8"]["all"] == pytest.approx(same["recall"]["all"])
    monkeypatch.setattr(mi, "quantize_index_keys", lambda k: (-k, torch.ones(k.shape[:-1])))  # sign flipped
    assert mi.fp8_index_recall(model, batch, **kw)["rows_equal"]["all"] < 0.9


def test_distill_loss_is_a_kl():
    g = generator(0)
    S, Bk = 40, 8
    logits = randn(2, S, 2, 5, gen=g)
    nb = torch.arange(5, device=DEVICE)
    visible = nb[None, :] <= (torch.arange(S, device=DEVICE) // Bk)[:, None]  # [S, nb]
    logits = logits.masked_fill(~visible[None, :, None], mi.NEG)
    p = torch.softmax(logits, -1)
    assert mi.distill_loss(p, logits, Bk).abs().item() < 1e-5  # KL(P || P) = 0
    other = randn(2, S, 2, 5, gen=g).masked_fill(~visible[None, :, None], mi.NEG).requires_grad_()
    loss = mi.distill_loss(p, other, Bk)
    assert loss.item() > 1e-3
    loss.backward()
    with torch.no_grad():  # a gradient step must move the student towards the teacher
        assert mi.distill_loss(p, other - 0.5 * other.grad, Bk).item() < loss.item()


def test_block_mass_and_index_logits_match_the_contract():
    g = generator(1)
    B, S, Hq, G, Bk = 2, 37, 4, 2, 8
    probs = torch.softmax(randn(B, Hq, S, S, gen=g).masked_fill(
        torch.ones(S, S, dtype=torch.bool, device=DEVICE).triu(1), float("-inf")), -1)
    mass = mi.block_mass(probs, G, Bk)
    assert mass.shape == (B, S, G, math.ceil(S / Bk)) and mass.device.type == DEVICE.type
    torch.testing.assert_close(mass.sum(-1), torch.ones(B, S, G, device=DEVICE))
    qi, ki = randn(B, S, G, 16, gen=g), randn(B, S, 16, gen=g)
    ref = block_scores_reference(qi, ki, Bk)
    got = mi.index_block_logits(qi, ki, Bk)
    seen = torch.isfinite(ref)
    torch.testing.assert_close(got[seen], ref[seen])
    assert (got[~seen] == mi.NEG).all()


@settings(max_examples=25, deadline=None)
@given(S=st.integers(1, 90), bk=st.sampled_from([4, 8, 16]), topk=st.integers(1, 6))
def test_window_is_the_contract_rule_with_recency_scores(S, bk, topk):
    nb = math.ceil(S / bk)
    scores = torch.arange(nb, dtype=torch.float32, device=DEVICE).expand(1, S, 1, nb)  # newer block = higher score
    want = select_from_scores(scores, torch.arange(S, device=DEVICE)[None, :, None], bk, topk)
    got = mi.window_selection(1, S, 1, block_size=bk, topk=topk, device=DEVICE)
    assert torch.equal(got, want)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), S=st.integers(20, 70), topk=st.integers(1, 5))
def test_oracle_recall_is_an_upper_bound(seed, S, topk):
    g = generator(seed)
    Bk, G = 8, 2
    nb = math.ceil(S / Bk)
    vis = torch.arange(nb, device=DEVICE)[None, :] <= (torch.arange(S, device=DEVICE) // Bk)[:, None]
    mass = torch.rand(1, S, G, nb, generator=g).to(DEVICE) * vis[None, :, None]
    mass = mass / mass.sum(-1, keepdim=True)
    oracle = mi.selection_recall(mass, mi.oracle_selection(mass, block_size=Bk, topk=topk), Bk, topk)
    window = mi.selection_recall(mass, mi.window_selection(1, S, G, block_size=Bk, topk=topk, device=DEVICE), Bk,
                                 topk)
    rand = select_from_scores(torch.rand(1, S, G, nb, generator=g).to(DEVICE),
                              torch.arange(S, device=DEVICE)[None, :, None], Bk, topk)
    other = mi.selection_recall(mass, rand, Bk, topk)
    assert (oracle >= window - 1e-6).all() and (oracle >= other - 1e-6).all()
    assert (oracle <= 1 + 1e-6).all()


def test_blocks_per_tile_counts_shared_blocks():
    # two tokens per tile, one group, topk 2: tile 0 selects {0, 1} in 4 slots, tile 1 {1, 2, 3}
    # in 3 slots (a -1 slot); a third, short tile: {4} in 1 slot
    sel = torch.tensor([[0, 1], [1, 0], [1, -1], [2, 3], [4, -1]], dtype=torch.int32)[None, :, None, :]
    got = mi.blocks_per_tile(sel.to(DEVICE), 2)
    assert got["distinct"] == pytest.approx(2.0) and got["slots"] == pytest.approx(8 / 3)
    assert got["loads_saved"] == pytest.approx(1 - 6 / 8)
    assert mi.blocks_per_tile(sel, 1)["loads_saved"] == pytest.approx(0.0)  # no sharing within a token
    whole = mi.blocks_per_tile(sel, 5)  # one tile: 5 distinct blocks in 8 slots
    assert (whole["distinct"], whole["slots"]) == (5.0, 8.0)
    # groups are separate tiles: the same ids in another group are loaded again
    two = torch.cat([sel, sel], dim=2)
    assert mi.blocks_per_tile(two, 2) == got
    for bad, tile in ((sel[0], 2), (sel, 0), (torch.full((1, 3, 1, 2), -1), 2)):
        with pytest.raises(ValueError):
            mi.blocks_per_tile(bad, tile)


def test_mass_concentration_limits():
    S = 32
    uniform = torch.tril(torch.ones(S, S, device=DEVICE))
    uniform = (uniform / uniform.sum(-1, keepdim=True))[None, None]
    c = mi.mass_concentration(uniform, [0.25, 0.5, 1.0], min_pos=S - 1)
    torch.testing.assert_close(c, torch.tensor([0.25, 0.5, 1.0], device=DEVICE))
    onehot = torch.eye(S, device=DEVICE)[None, None]
    assert torch.allclose(mi.mass_concentration(onehot, [0.01, 0.5]), torch.ones(2, device=DEVICE))
    blocks = mi.mass_concentration(uniform, [0.5, 1.0], block_size=8, min_pos=S - 1)  # 4 blocks of 8 keys
    torch.testing.assert_close(blocks, torch.tensor([0.5, 1.0], device=DEVICE))


def test_indexer_state_round_trip_and_errors(model):
    state = mi.indexer_state(model)
    assert state and all(".idx_" in k for k in state)
    mi.load_indexer_state(model, state)
    with pytest.raises(ValueError, match="do not match"):
        mi.load_indexer_state(model, {"blocks.0.idx_q.weight": next(iter(state.values()))})
    plain, _ = load_pretrained()
    with pytest.raises(ValueError, match="use_indexer"):
        mi.run_layers(plain, torch.zeros(1, 4, dtype=torch.long), mode="msa")
    with pytest.raises(ValueError, match="mode"):
        mi.run_layers(model, torch.zeros(1, 4, dtype=torch.long), mode="sparse")


# --------------------------------------------------------------------------- needle harness


def test_needle_document_layout():
    for n in (1, 5):
        d = needle_document(n, seed=3)
        toks = d["tokens"]
        assert toks.shape == (1 + 16 * n + 6,)
        assert int((toks == TOKENIZER.img_id).sum()) == 16 * n
        assert TOKENIZER.decode(toks[-6:]).startswith("what colour is the")
        assert int(toks[d["answer_pos"]]) == TOKENIZER.encode(["?"])[0]
        s0, s1 = d["needle_span"]
        assert s0 <= d["focus_pos"] < s1 and d["image_starts"][d["needle"]] == s0
    b = needle_batch(4, 3, seed=1)
    assert b["tokens"].shape == (3, 71) and b["images"].shape == (3, 4, 3, 32, 32)
    with pytest.raises(ValueError):
        needle_document(3, needle=3)


# --------------------------------------------------------------------------- pictures


def test_selection_pictures_run(model):
    d = needle_document(6, seed=2)
    with torch.no_grad():
        r = mi.run_layers(model, d["tokens"][None], d["images"][None], mode="msa")
    L = r["layers"][-1]
    mass = mi.block_mass(attention_probs(L["q"], L["k"]), 2, 16)
    spans = [(s, s + 16) for s in d["image_starts"]]
    figs = [vsel.selection_map(L["selected"][0, :, 0], block_size=16, image_spans=spans, needle_span=d["needle_span"],
                               query_rows=[d["answer_pos"]]),
            vsel.selection_map(L["selected"][0, :, 1], block_size=16, mass=mass[0, :, 1], image_spans=spans),
            vsel.concentration_plot([0.1, 1.0], {"x": [0.5, 1.0]})]
    h = {"eval_step": [0, 2], "recall": [0.4, 0.5], "window": 0.45, "oracle": 0.6, "config": {"warmup_steps": 1}}
    figs.append(vsel.recall_plot({"a": h}))
    assert all(f.axes for f in figs)
    plt.close("all")
    with pytest.raises(ValueError, match="selected"):
        vsel.selection_map(torch.zeros(5, dtype=torch.int32), block_size=16)
    with pytest.raises(ValueError, match="mass"):
        vsel.selection_map(L["selected"][0, :, 0], block_size=16, mass=torch.zeros(3, 3))
