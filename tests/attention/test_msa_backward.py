"""MSA's backward against float64 autograd through the reference, on the kernel device (the
interpreter on the CPU), at tiny ragged sizes: dq, dk, dv of every impl (reference in fp32, the
torch formulas, the Triton kernels after either forward schedule), the public ``msa_attention``
under ``loss.backward()``, ``torch.autograd.gradcheck`` on every impl, and the cases a backward
gets wrong first: GQA, the local block's causal mask, ragged last blocks, rows that selected no
block, blocks nobody selected, the log-sum-exp's own gradient, non-contiguous views, batch > 1.
Then the index branch's distillation loss: its value and its gradients w.r.t. ``q_idx``/``k_idx``
(Triton kernels, no S x S scores) against float64 autograd through the dense formula."""
from __future__ import annotations

import importlib
import warnings

import pytest
import torch
import triton
from tests.support.devices import DEVICE, generator, randn, relative_error, tol
from tests.support.gpus import GPUS, fake_gpu

from minimax_lab import configs, exercises
from minimax_lab.bench import cli as bench_cli
from minimax_lab.attention import msa_attention, msa_select
from minimax_lab.attention import msa_backward_autograd, msa_backward_index_triton, msa_backward_triton
from minimax_lab.attention.msa_backward_index import NEG, index_block_logits, index_distill_loss
from minimax_lab.attention.msa_backward_index_torch import block_logits_torch
from minimax_lab.attention.msa_backward_index_triton import block_logits_triton
from minimax_lab.attention.msa_backward import msa_attention_backward, sparse_attention
from minimax_lab.attention.msa_backward_triton import block_work_list, msa_attention_backward_triton
from minimax_lab.exercises.solutions import ch04 as backward_solutions
from minimax_lab.kernelbench import harness, problem_msa_backward, problems

# (B, S, G, hpg, block_size, topk): ragged S with a real top-k, batch > 1 with 3 groups, S < Bk,
# and a 32-token block (two 16-key programs per block in the split test)
CASES = {
    "ragged": (1, 45, 2, 2, 16, 2),
    "batch_groups": (2, 37, 3, 1, 16, 2),
    "s_lt_bk": (1, 9, 2, 2, 16, 3),
    "block32": (2, 70, 1, 4, 32, 2),
}
gradcheck_module = importlib.import_module("torch.autograd.gradcheck")  # the module (the name is the function)
TRITON_TOL = tol(torch.float32)  # fp32 inputs: exact-ish in the interpreter, TF32 dots on a GPU
TORCH_TOL = tol(torch.float32, tf32=False)


def make(name, *, dtype=torch.float32, empty_rows=True):
    """Inputs of a case, the selection (``msa_select`` of random index tensors, then one row of every
    group emptied, one slot of another row dropped), and upstream gradients ``do``, ``dlse``."""
    B, S, G, hpg, bs, topk = CASES[name]
    g = generator()
    D = 16
    ins = dict(q=randn(B, S, G * hpg, D, gen=g, dtype=dtype), k=randn(B, S, G, D, gen=g, dtype=dtype),
               v=randn(B, S, G, D, gen=g, dtype=dtype))
    q_idx, k_idx = randn(B, S, G, 16, gen=g), randn(B, S, 16, gen=g)
    sel = msa_select(q_idx, k_idx, block_size=bs, topk=topk)
    if empty_rows:
        sel[0, S // 2] = -1  # a row that attends to nothing
        sel[B - 1, S - 1, G - 1, 0] = -1  # a row missing its first pick (still valid)
    grads = dict(do=randn(B, S, G * hpg, D, gen=g, dtype=dtype), dlse=randn(B, G * hpg, S, gen=g, dtype=dtype))
    return ins, sel, grads, dict(block_size=bs), (q_idx, k_idx)


def float64_grads(ins, sel, grads, kw, with_lse=True):
    """The ground truth: autograd in float64 through the reference forward."""
    leaves = {n: t.detach().double().requires_grad_() for n, t in ins.items()}
    o, lse = sparse_attention(**leaves, selected=sel, forward="reference", backward="reference", **kw)
    outs, gs = [o], [grads["do"].double()]
    if with_lse:
        outs.append(lse.masked_fill(torch.isinf(lse), 0.0))
        gs.append(grads["dlse"].double())
    return torch.autograd.grad(outs, list(leaves.values()), gs)


def forward_of(ins, sel, kw, impl="reference", schedule="kv"):
    """``msa_attention(..., return_lse=True)`` over the given selection (the index tensors are
    then only checked: placeholders)."""
    B, S, G, _ = sel.shape
    unused = dict(q_idx=torch.zeros(B, S, G, 1, device=DEVICE), k_idx=torch.zeros(B, S, 1, device=DEVICE))
    return msa_attention(**ins, **unused, impl=impl, selected=sel, return_lse=True, schedule=schedule,
                         topk=sel.shape[-1], **kw)


# every impl on the ragged case with the lse's gradient; the others on a few (case, impl) pairs
BACKWARD_RUNS = [("ragged", impl, sched, True) for impl, sched in (("reference", "kv"), ("torch", "kv"),
                                                                   ("triton", "kv"), ("triton", "query"))] + [
    ("batch_groups", "torch", "kv", False), ("batch_groups", "triton", "kv", False),
    ("batch_groups", "triton", "query", True), ("s_lt_bk", "triton", "kv", True), ("s_lt_bk", "reference", "kv", False)]


@pytest.mark.parametrize("name,impl,schedule,with_lse", BACKWARD_RUNS)
def test_backward_matches_float64_autograd(name, impl, schedule, with_lse):
    ins, sel, grads, kw, _ = make(name)
    want = float64_grads(ins, sel, grads, kw, with_lse)
    o, lse = forward_of(ins, sel, kw, impl="triton" if impl == "triton" else "torch", schedule=schedule)
    got = msa_attention_backward(**ins, o=o, lse=lse, do=grads["do"], selected=sel, dlse=grads["dlse"] if with_lse
                                 else None, impl=impl, **kw)
    bound = TRITON_TOL if impl == "triton" else TORCH_TOL
    for n, a, b in zip("qkv", got, want):
        assert a.dtype == ins[n].dtype and a.shape == ins[n].shape
        assert relative_error(a, b) < bound, (n, relative_error(a, b))


def test_rows_with_no_block_and_blocks_nobody_selected_get_zero_gradients():
    ins, sel, grads, kw, _ = make("ragged")
    S, bs = sel.shape[1], kw["block_size"]
    sel[:, :, 1] = torch.where(sel[:, :, 1] == 1, -1, sel[:, :, 1])  # group 1 never selects block 1
    o, lse = forward_of(ins, sel, kw, impl="triton")
    assert torch.isinf(lse[0, :, S // 2]).all() and (o[0, S // 2] == 0).all()
    for impl in ("torch", "triton"):
        dq, dk, dv = msa_attention_backward(**ins, o=o, lse=lse, do=grads["do"], dlse=grads["dlse"], selected=sel,
                                            impl=impl, **kw)
        assert (dq[0, S // 2] == 0).all()
        assert (dk[0, bs:2 * bs, 1] == 0).all() and (dv[0, bs:2 * bs, 1] == 0).all()
        assert dk[0, bs:2 * bs, 0].abs().sum() > 0  # group 0 did select it


def test_non_contiguous_views_give_the_contiguous_answer():
    ins, sel, grads, kw, _ = make("batch_groups", empty_rows=False)
    B, S, Hq, D = ins["q"].shape
    q = ins["q"].transpose(1, 2).contiguous().transpose(1, 2)  # [B, Hq, S, D] memory
    k = torch.cat([ins["k"], ins["k"]], dim=-1)[..., :D]  # a slice of a wider buffer
    v = torch.stack([ins["v"], ins["v"]], dim=-1)[..., 0]  # stride 2 along head_dim
    do = grads["do"].transpose(1, 2).contiguous().transpose(1, 2)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous() or do.is_contiguous())
    want = float64_grads(ins, sel, grads, kw, with_lse=False)
    o, lse = forward_of(ins, sel, kw, impl="triton")
    for impl in ("torch", "triton"):
        got = msa_attention_backward(q, k, v, o, lse, do, sel, impl=impl, **kw)
        assert all(relative_error(a, b) < TRITON_TOL for a, b in zip(got, want))


@pytest.mark.parametrize("impl,schedule", [("reference", "kv"), ("torch", "kv"), ("triton", "kv"),
                                           ("triton", "query")])
def test_msa_attention_trains_through_every_impl(impl, schedule):
    """``loss.backward()`` on the public entry point, selection made inside (index tensors get no
    gradient), loss using both the output and the log-sum-exp."""
    ins, _, grads, kw, (q_idx, k_idx) = make("batch_groups")
    leaves = {n: t.clone().requires_grad_() for n, t in ins.items()}
    qi, ki = q_idx.clone().requires_grad_(), k_idx.clone().requires_grad_()
    o, lse = msa_attention(**leaves, q_idx=qi, k_idx=ki, impl=impl, schedule=schedule, return_lse=True, topk=2, **kw)
    ((o * grads["do"]).sum() + (lse * grads["dlse"]).sum()).backward()
    sel = msa_select(q_idx, k_idx, topk=2, **kw)
    want = float64_grads(ins, sel, grads, kw)
    for n, w in zip("qkv", want):
        assert relative_error(leaves[n].grad, w) < (TRITON_TOL if impl == "triton" else TORCH_TOL), n
    assert qi.grad is None and ki.grad is None  # the selection is not differentiable


def test_half_precision_triton_backward_within_dtype_tolerance():
    ins, sel, grads, kw, _ = make("ragged", dtype=torch.float16)
    want = float64_grads(ins, sel, grads, kw)
    o, lse = forward_of(ins, sel, kw, impl="triton")
    got = msa_attention_backward_triton(**ins, o=o, lse=lse, do=grads["do"], selected=sel, dlse=grads["dlse"], **kw)
    for n, a, b in zip("qkv", got, want):
        assert a.dtype == torch.float16 and relative_error(a, b) < tol(torch.float16), n


@pytest.mark.parametrize("config", [{"BLOCK_KN": 16}, {"BLOCK_M": 64}])
def test_split_kv_blocks_and_wider_row_tiles_give_the_same_gradients(config):
    # a 32-token block cut into two 16-key programs, or 64 query rows per step: same sums
    ins, sel, grads, kw, _ = make("block32")
    o, lse = forward_of(ins, sel, kw, impl="torch")
    base = msa_attention_backward_triton(**ins, o=o, lse=lse, do=grads["do"], selected=sel, **kw)
    got = msa_attention_backward_triton(**ins, o=o, lse=lse, do=grads["do"], selected=sel, config=config, **kw)
    want = float64_grads(ins, sel, grads, kw, with_lse=False)
    for a, b, w in zip(got, base, want):
        assert relative_error(a, w) < TRITON_TOL and relative_error(a, b) < TRITON_TOL
    with pytest.raises(ValueError, match=r"msa_backward: unknown config keys \['BLOCKM'\]"):
        msa_attention_backward_triton(**ins, o=o, lse=lse, do=grads["do"], selected=sel, config={"BLOCKM": 1}, **kw)


def test_block_work_list_gives_each_block_all_of_its_entries_heaviest_first():
    _, sel, _, kw, _ = make("batch_groups")
    B, S, G, topk = sel.shape
    nb = -(-S // kw["block_size"])
    entries, gk, start, length = block_work_list(sel, nb)
    assert len(set(gk.tolist())) == gk.numel()  # one program per (batch, group, block)
    assert (length[:-1] >= length[1:]).all()  # heaviest first
    flat = sel.reshape(-1).long()
    seen = []
    for i in range(gk.numel()):
        run = entries[start[i]:start[i] + length[i]].long()
        b, g, blk = int(gk[i]) // (G * nb), int(gk[i]) // nb % G, int(gk[i]) % nb
        assert (flat[run] == blk).all() and (run // (S * G * topk) == b).all() and (run // topk % G == g).all()
        seen += run.tolist()
    assert sorted(seen) == (flat >= 0).nonzero().flatten().tolist()  # every selected slot exactly once


def _fails_gradcheck(fn, inputs, monkeypatch, **kw) -> bool:
    """Whether fast-mode gradcheck rejects ``fn``, without the full-Jacobian report a failure
    would otherwise compute (one forward per input element: minutes in the interpreter)."""
    monkeypatch.setattr(gradcheck_module, "_run_slow_mode_and_get_error", lambda *a, **k: "report skipped")
    return not _gradcheck(fn, inputs, raise_exception=False, **kw)


def finite(o, lse):
    """``(o, lse)`` with an empty row's ``-inf`` lse read as 0: finite differences of a constant
    ``-inf`` are NaN, and no gradient flows through it."""
    return o, lse.masked_fill(torch.isinf(lse), 0.0)


def _gradcheck(fn, inputs, **kw):
    """Fast-mode gradcheck (random projections: a few forward calls, not one per input element).
    On a GPU the PyTorch backward adds into its gradients with atomics, in any order: two runs may
    differ in the last bits, so gradcheck's reentrancy check gets a tolerance there."""
    on_gpu = any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs)
    kw.setdefault("nondet_tol", 1e-10 if on_gpu else 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # fp32 inputs: gradcheck warns, the tolerances say why
        return torch.autograd.gradcheck(fn, inputs, fast_mode=True, **kw)


@pytest.mark.parametrize("forward,backward", [("reference", "reference"), ("torch", "torch"),
                                              ("reference", "torch"), ("reference", "triton")])
def test_gradcheck_float64(forward, backward, monkeypatch):
    """Every backward impl is the exact derivative of the forward, in float64 (the Triton kernels
    accumulate in fp64 for fp64 inputs; the reference forward gives them an fp64 ``lse``). The
    same check fails a backward that forgets the log-sum-exp's gradient."""
    ins, sel, _, kw, _ = make("s_lt_bk", dtype=torch.float64)
    leaves = tuple(t.requires_grad_() for t in ins.values())
    if forward == backward:  # the public entry point, differentiated by autograd through its own ops
        def fn(q, k, v):
            return finite(*forward_of(dict(q=q, k=k, v=v), sel, kw, impl=forward))
    else:
        def fn(q, k, v):
            return finite(*sparse_attention(q, k, v, sel, forward=forward, backward=backward, **kw))
    assert _gradcheck(fn, leaves)
    if forward != backward:
        forgetful = msa_backward_autograd.backward_of
        monkeypatch.setattr(msa_backward_autograd, "backward_of", lambda *a, dlse=None, **k: forgetful(*a, **k))
        assert _fails_gradcheck(fn, leaves, monkeypatch)


def test_gradcheck_triton_forward_and_backward_in_float32(monkeypatch):
    """The whole Triton path (forward kernels saving lse, backward kernels) under gradcheck: fp32
    kernels, so central differences with a wide step and tolerances fp32 rounding cannot reach.
    The same check fails a backward whose dk and dv trade places."""
    ins, sel, _, kw, _ = make("s_lt_bk")
    leaves = tuple(t.requires_grad_() for t in ins.values())
    loose = dict(eps=1e-2, atol=2e-3, rtol=2e-2)

    def fn(q, k, v):
        return finite(*forward_of(dict(q=q, k=k, v=v), sel, kw, impl="triton"))
    assert _gradcheck(fn, leaves, **loose)
    right = msa_backward_autograd.backward_of
    monkeypatch.setattr(msa_backward_autograd, "backward_of", lambda *a, **k: (lambda dq, dk, dv: (dq, dv, dk))(
        *right(*a, **k)))
    assert _fails_gradcheck(fn, leaves, monkeypatch, check_undefined_grad=False, **loose)


def test_backward_refuses_bad_selections_and_shapes():
    ins, sel, grads, kw, _ = make("ragged")
    o, lse = forward_of(ins, sel, kw)
    args = dict(**ins, o=o, lse=lse, do=grads["do"], **kw)
    bad = sel.clone()
    bad[0, 3, 0, 0] = 2  # token 3 cannot see block 2
    with pytest.raises(ValueError, match="causal"):
        msa_attention_backward(**args, selected=bad, impl="triton")
    dup = sel.clone()
    dup[0, 40, 0] = torch.tensor([1, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="duplicate"):
        msa_attention_backward(**args, selected=dup, impl="torch")
    with pytest.raises(ValueError, match="lse"):
        msa_attention_backward(**{**args, "lse": lse[:, :, 1:]}, selected=sel, impl="triton")
    with pytest.raises(ValueError, match="impl"):
        msa_attention_backward(**args, selected=sel, impl="cuda")
    with pytest.raises(ValueError, match="selected"):
        msa_attention_backward(**args, selected=sel.long(), impl="torch")


# --------------------------------------------------------------------------- the index branch's loss


def index_inputs(B=2, S=45, G=2, Didx=16, block_size=16, dtype=torch.float32):
    """Index tensors (the keys a non-contiguous view) and a teacher: random block distributions over
    each row's visible blocks."""
    g = generator()
    q_idx = randn(B, S, G, Didx, gen=g, dtype=dtype)
    k_idx = randn(B, S, 2 * Didx, gen=g, dtype=dtype)[..., ::2]  # stride 2 along D_idx
    nb = -(-S // block_size)
    visible = torch.arange(nb, device=DEVICE)[None, :] <= (torch.arange(S, device=DEVICE) // block_size)[:, None]
    mass = torch.rand(B, S, G, nb, generator=g).to(DEVICE) * visible[None, :, None]
    return q_idx, k_idx, mass / mass.sum(-1, keepdim=True)


def index_float64_grads(q_idx, k_idx, mass, block_size):
    leaves = [t.detach().double().requires_grad_() for t in (q_idx, k_idx)]
    loss = index_distill_loss(*leaves, mass.double(), block_size=block_size, impl="reference")
    return (loss, *torch.autograd.grad(loss, leaves))  # the dense formula, autograd through it


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_index_loss_and_its_gradients_match_float64_autograd(impl):
    q_idx, k_idx, mass = index_inputs()
    assert not k_idx.is_contiguous()
    want = index_float64_grads(q_idx, k_idx, mass, 16)
    qi, ki = q_idx.clone().requires_grad_(), k_idx.detach().clone().requires_grad_()
    loss = index_distill_loss(qi, ki, mass, block_size=16, impl=impl)
    loss.backward()
    assert loss.dtype == torch.float32 and abs(loss.item() - want[0].item()) < 1e-5 * abs(want[0].item())
    for got, w in zip((qi.grad, ki.grad), want[1:]):
        assert got.dtype == torch.float32 and relative_error(got, w) < TRITON_TOL


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_index_logits_and_the_winning_tokens(impl):
    q_idx, k_idx, _ = index_inputs(B=1, S=37, G=3)
    logits, arg = (block_logits_triton(q_idx, k_idx, 16) if impl == "triton"
                   else block_logits_torch(q_idx, k_idx, 16, chunk=7))  # ragged chunks of queries
    want = index_block_logits(q_idx, k_idx, 16)
    assert relative_error(logits, want) < TRITON_TOL and (logits == NEG).equal(want == NEG)
    # arg: the visible token of the block whose score is the block's logit
    t = torch.arange(37, device=DEVICE)[None, :, None, None]
    ok = arg >= 0
    assert ok.equal(logits > NEG) and (arg[ok] // 16 == torch.arange(3, device=DEVICE).expand_as(arg)[ok]).all()
    assert (arg.long() <= t)[ok].all()
    scores = torch.einsum("btgd,bjd->btgj", q_idx, k_idx) / 4.0
    won = scores.gather(-1, arg.long().clamp(min=0))
    assert torch.allclose(won[ok], logits[ok], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_index_loss_tie_goes_to_the_lowest_token(impl):
    # tokens 16 and 17 carry the same key: block 1's max is tied between them for every query
    q_idx, k_idx, mass = index_inputs(B=1, S=40, G=1)
    k_idx = k_idx.contiguous()
    k_idx[0, 17] = k_idx[0, 16]
    ki = k_idx.clone().requires_grad_()
    index_distill_loss(q_idx, ki, mass, block_size=16, impl=impl).backward()
    assert ki.grad[0, 17].abs().max() == 0 and ki.grad[0, 16].abs().max() > 0
    kr = k_idx.clone().requires_grad_()
    index_distill_loss(q_idx, kr, mass, block_size=16, impl="reference").backward()  # autograd splits a tie
    torch.testing.assert_close(ki.grad[0, 16], kr.grad[0, 16] + kr.grad[0, 17], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("impl", ["reference", "torch", "triton"])
def test_index_loss_gradcheck_float64(impl, monkeypatch):
    q_idx, k_idx, mass = index_inputs(B=1, S=40, G=2, Didx=8, dtype=torch.float64)
    leaves = (q_idx.requires_grad_(), k_idx.detach().requires_grad_())

    def fn(qi, ki):
        return index_distill_loss(qi, ki, mass.double(), block_size=16, impl=impl)
    assert _gradcheck(fn, leaves)
    if impl == "triton":  # and a gradient that misses the keys' share is caught
        right = msa_backward_index_triton.index_grads_triton
        monkeypatch.setattr(msa_backward_index_triton, "index_grads_triton",
                            lambda *a, **k: (lambda dq, dk: (dq, dk * 0.5))(*right(*a, **k)))
        assert _fails_gradcheck(fn, leaves, monkeypatch)


def test_index_loss_refuses_bad_inputs():
    q_idx, k_idx, mass = index_inputs(B=1, S=40, G=2)
    with pytest.raises(ValueError, match="single block"):
        index_distill_loss(q_idx[:, :16], k_idx[:, :16], mass[:, :16, :, :1], block_size=16, impl="triton")
    with pytest.raises(ValueError, match="mass"):
        index_distill_loss(q_idx, k_idx, mass[..., :2], block_size=16)
    with pytest.raises(ValueError, match="block_size"):
        index_distill_loss(q_idx, k_idx, mass[..., :1].expand(1, 40, 2, 5).contiguous(), block_size=8, impl="triton")
    with pytest.raises(ValueError, match="k_idx"):
        index_distill_loss(q_idx, k_idx.double(), mass, block_size=16)
    with pytest.raises(ValueError, match="impl"):
        index_distill_loss(q_idx, k_idx, mass, block_size=16, impl="cuda")


# --------------------------------------------------------------------------- the chapter's exercise


@triton.jit
def _noop_kernel(X):
    pass


def test_block_backward_exercise_checker():
    """04.9: the Triton solution passes; the same numbers from PyTorch alone are refused (no kernel
    ran); the untouched stub and a kernel with a wrong dk are reported in the learner's terms."""
    ex = exercises.get("04.9")
    assert ex.writes_triton
    assert exercises.verdict("04.9", backward_solutions.block_backward).passed
    assert exercises.verdict("04.9", backward_solutions.block_backward_torch).problems == [exercises.NO_TRITON]
    assert "not written yet" in exercises.verdict("04.9", ex.stub).problems[0]

    def wrong_dk(*args, **kw):
        dq, dk, dv = backward_solutions.block_backward(*args, **kw)
        return dq, dk * 2, dv
    problems = exercises.verdict("04.9", wrong_dk).problems
    assert len(problems) == 1 and "dk is off" in problems[0] and "transpose" in problems[0]

    def torch_behind_a_kernel(**kw):  # a kernel ran, but the answer is PyTorch's
        _noop_kernel[(1,)](kw["q"])
        return backward_solutions.block_backward_torch(**kw)
    assert exercises.verdict("04.9", torch_behind_a_kernel).problems == [exercises.NOT_BY_TRITON]


# --------------------------------------------------------------------------- ready to time


def test_bench_backward_group_checks_and_times_at_the_cpu_preset():
    """``python -m minimax_lab.bench msa --cases backward`` at preset cpu: the forward + backward of
    ours and of the torch impl, each checked against float64 autograd before it is timed."""
    recs = bench_cli.run_suite("msa", "cpu", cases=["backward"])
    assert sorted(r["impl"] for r in recs) == ["torch_fwd_bwd", "triton_fwd_bwd"]
    assert all(r["suite"] == "msa" and r["case"] == "backward_s40" and r["ms"] > 0 for r in recs)
    assert all(r["check_rel_err"] < TRITON_TOL for r in recs)


def test_kernel_bench_problem_is_solved_by_the_workbook_kernels():
    """The kernel bench's ``msa_backward`` problem (its fields here, registered by the bench): the
    workbook's Triton forward + backward pass the harness's checks, held-out shapes included; the
    reference off by 5% does not."""
    problem = problems.Problem(**problem_msa_backward.FIELDS)
    rep = harness.evaluate(problem.best(), problem, preset="cpu", n_test=1, time_it=False)
    assert rep.passed, rep.summary()

    def slightly_wrong(**inputs):
        return tuple(o * 1.05 for o in problem.reference(**inputs))
    assert "validation shapes" in harness.evaluate(slightly_wrong, problem, preset="cpu", n_test=1,
                                                   time_it=False).caught_by
    ids = problem_msa_backward.random_selection(2, 70, 3, 3, 16, generator(1))
    x = torch.zeros(2, 70, 3, 16, device=DEVICE)
    msa_attention_backward(x, x, x, x, torch.zeros(2, 3, 70, device=DEVICE), x, ids.to(DEVICE),
                           block_size=16)  # a valid selection: the entry point's check passes


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_kv_outer_programs_fit_the_gpus_shared_memory_and_registers(gpu, monkeypatch):
    """MSA's shape (Bk = D = 128, fp16/bf16, 16 heads per group): each GPU's config holds at most
    64 keys per KV-outer program -- their dK and dV in fp32 registers, ``2 * keys * D`` values over
    ``32 * num_warps`` threads, stay within 128 per thread -- and the program fits the GPU's shared
    memory. The estimate is the kernel's tiles."""
    fake_gpu(monkeypatch, GPUS[gpu])
    cfg = configs.launch_config(msa_backward_triton.LAUNCH)
    rows = max(cfg["BLOCK_M"], 16)
    got = msa_backward_triton.kv_block_keys(cfg, 128, rows, 128, 2)
    assert configs.shared_memory_fits(msa_backward_triton.dkdv_smem(got, rows, 128, 2, cfg["num_stages"]))
    assert 2 * got * 128 // (32 * cfg["num_warps"]) <= 128, (gpu, cfg)


def test_keys_per_kv_outer_program():
    """``BLOCK_KN``: at most that many keys (0: the whole block), never more than the block, halved
    until the program fits the shared memory; not a power of two raises."""
    cfg = {"BLOCK_KN": 0, "num_stages": 1}
    assert msa_backward_triton.kv_block_keys(cfg, 128, 32, 128, 2) == 128
    assert msa_backward_triton.kv_block_keys({**cfg, "BLOCK_KN": 32}, 128, 32, 128, 2) == 32
    assert msa_backward_triton.kv_block_keys({**cfg, "BLOCK_KN": 64}, 16, 32, 128, 2) == 16
    with pytest.raises(ValueError, match="power of two"):
        msa_backward_triton.kv_block_keys({**cfg, "BLOCK_KN": 48}, 128, 32, 128, 2)


def test_kv_outer_program_keys_halve_to_fit_a_small_gpu(monkeypatch):
    """A 64 KB Turing cannot hold a whole 128-key block of head dim 128 with 2 stages of 32-row
    tiles: the program takes half of it."""
    fake_gpu(monkeypatch, GPUS["T4"])
    cfg = {"BLOCK_KN": 0, "num_stages": 2}
    assert not configs.shared_memory_fits(msa_backward_triton.dkdv_smem(128, 32, 128, 2, 2))
    got = msa_backward_triton.kv_block_keys(cfg, 128, 32, 128, 2)
    assert got == 64 and configs.shared_memory_fits(msa_backward_triton.dkdv_smem(got, 32, 128, 2, 2))
