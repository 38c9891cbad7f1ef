"""Exercises of chapter 09 (Day 0 to day 14: the engine): the scheduler's rule, the sampler, the
quality check every day must pass, and day 14's FP8 quantizer written as a Triton kernel.

* 09.1 ``next_step`` -- which sequences compute how many tokens in the next step (continuous
  batching with chunked prefill), checked against :meth:`minimax_lab.engine.scheduler.Scheduler.schedule`
  run on the same state.
* 09.2 ``sample_next`` -- greedy or temperature + top-p sampling from a request's seeded generator,
  checked draw for draw against :func:`minimax_lab.engine.sampling.sample`.
* 09.3 ``logits_agreement`` -- a day's answer logits against day 0's: relative error and top-1
  agreement, checked against :func:`minimax_lab.engine.workloads.quality`.
* 09.4 ``quantize_rows_fp8`` -- FP8 (e4m3) with one power-of-two scale per row, computed by a Triton
  kernel the learner writes (``writes_triton``), checked bit for bit against
  :func:`minimax_lab.fp8.quantize_fp8` on ragged, strided, bf16 and boundary rows.

Every checker draws fresh random cases on each call and runs in about a second on a CPU (09.4 in
Triton's interpreter). An answer may not call the code it is checked against (the scheduler, the
sampler, ``quality``, ``quantize_fp8``, the checker's own ``_scheduler_plan``), in any form; 09.4's
kernel must do the work itself, on inputs on the kernel device.
"""
from __future__ import annotations

import torch

from minimax_lab.engine.sampling import SamplingParams, sample, top_p_filter
from minimax_lab.engine.scheduler import Scheduler
from minimax_lab.engine.sequence import Sequence, Status
from minimax_lab.engine.workloads import RunResult, TurnResult, quality
from minimax_lab.exercises import exercise, fresh_rng, on_kernel_device, tensor_problem
from minimax_lab.fp8 import FP8, pow2_scale, quantize_fp8
from minimax_lab.kvcache.blocks import BlockManager

# --------------------------------------------------------------------------- 09.1 the scheduler's rule


def next_step(running: list, waiting: list, step_tokens: int | None, max_batch: int) -> list:
    """One step of continuous batching with chunked prefill. `running` lists the admitted
    sequences, oldest first, as (seq_id, prompt tokens still to compute): 0 means it is decoding.
    `waiting` lists the queued requests in arrival order as (seq_id, prompt length). At most
    `max_batch` sequences run at once; `step_tokens` is the step's token budget (None: no limit);
    the KV pool always has room. Return the step's work as (seq_id, n_tokens) pairs in the order
    Scheduler.schedule plans them: every decode (one token), then prompt chunks of running
    sequences, then newly admitted requests."""
    raise NotImplementedError  # your code here


def _scheduler_plan(running, waiting, step_tokens, max_batch) -> list:
    """The package scheduler's plan for this state, as (seq_id, n_tokens) pairs."""
    page = 16
    blocks = BlockManager(1 << 12, page, prefix_caching=False)    # room for every case's pages
    sched = Scheduler(blocks, continuous_batching=True, max_batch=max_batch, step_tokens=step_tokens,
                      max_seq_len=1 << 16)
    params = SamplingParams(max_tokens=8)
    for i, (sid, remaining) in enumerate(running):
        done = (i * 37) % 90 + (0 if remaining else 1)             # prompt tokens already computed
        prompt = [7] * (done + remaining)
        seq = Sequence(sid, prompt, prompt, params, computed=done, prefill_end=len(prompt),
                       status=Status.PREFILL if remaining else Status.DECODE, output=[] if remaining else [5])
        blocks.allocate(sid, prompt)
        sched.running.append(seq)
    for sid, n in waiting:
        sched.add(Sequence(sid, [7] * n, [7] * n, params))
    plan = sched.schedule()
    return [(s.seq_id, 1) for s in plan.decodes] + [(s.seq_id, end - start) for s, start, end in plan.prefills]


@exercise("09.1", "one scheduler step",
          "Say which sequences compute how many tokens in the next step: decodes, prompt chunks, admissions.",
          next_step, answers=(_scheduler_plan, Scheduler))
def _check_next_step(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    cases = []
    for kind in ("no limit", "tight budget", "batch full", "random", "random", "random", "random", "nothing running"):
        max_batch = rng.randint(2, 8)
        n_run = {"batch full": max_batch, "nothing running": 0}.get(kind, rng.randint(0, max_batch - 1))
        running = [(f"r{i}", 0 if rng.random() < 0.6 else rng.randint(1, 150)) for i in range(n_run)]
        waiting = [(f"w{i}", rng.randint(1, 200)) for i in range(rng.randint(1 if kind != "random" else 0, 5))]
        if kind == "no limit":   # more requests than free batch slots
            step_tokens = None
            waiting = [(f"w{i}", rng.randint(1, 200)) for i in range(max_batch - n_run + rng.randint(1, 3))]
        elif kind == "batch full":   # budget left, but no slot for a new request
            running = [(sid, 0) for sid, _ in running[:-1]] + [(running[-1][0], rng.randint(1, 20))]
            step_tokens = 400
        elif kind == "tight budget":   # the decodes and a chunk or two use it all
            step_tokens = max(max_batch + 1, n_run + rng.randint(1, 20))
        else:
            step_tokens = rng.randint(max_batch + 1, 400)
        cases.append((kind, running, waiting, step_tokens, max_batch))
    for kind, running, waiting, step_tokens, max_batch in cases:
        want = _scheduler_plan(running, waiting, step_tokens, max_batch)
        got = fn(list(running), list(waiting), step_tokens, max_batch)
        try:
            got = [(sid, int(n)) for sid, n in got]
        except (TypeError, ValueError):
            return [f"expected a list of (seq_id, n_tokens) pairs, got {got!r:.80}"]
        if got != want:
            problems.append(f"{kind}: running {running}, waiting {waiting}, step_tokens={step_tokens}, "
                            f"max_batch={max_batch}: expected {want}, got {got}")
    return problems


# --------------------------------------------------------------------------- 09.2 the sampler


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> int:
    """The next token id from one row of fp32 `logits` [V]. temperature == 0: greedy (argmax).
    Otherwise: probs = softmax(logits / temperature); keep the smallest set of most likely tokens
    whose probability reaches top_p (always at least the most likely one), zero the rest and
    renormalise, keeping the vocabulary's order; then draw with
    torch.multinomial(probs, 1, generator=generator) so a seeded request draws the same tokens.
    Do not modify `logits`."""
    raise NotImplementedError  # your code here


@exercise("09.2", "temperature and top-p sampling",
          "Draw the next token greedily or from the top-p nucleus, reproducibly from a seeded generator.",
          sample_next, answers=(sample, top_p_filter))
def _check_sample_next(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    cases = [(0.0, 1.0), (0.0, 0.5), (1.0, 1.0), (0.7, 0.9), (1.5, 0.5), (0.3, 0.05), (2.0, 0.99)]
    for temperature, top_p in cases:
        vocab, seed = rng.randint(5, 300), rng.randrange(1 << 31)
        params = SamplingParams(max_tokens=1, temperature=temperature, top_p=top_p, seed=seed)
        g_want, g_got = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        for step in range(12):   # a request's successive tokens: one generator for all of them
            logits = torch.randn(vocab, generator=torch.Generator().manual_seed(rng.randrange(1 << 31))) * 3
            want = sample(logits[None].clone(), [params], [g_want], [0])[0]
            before = logits.clone()
            got = fn(logits, temperature, top_p, g_got)
            what = f"temperature {temperature}, top_p {top_p}, vocabulary {vocab}, draw {step + 1}"
            if not torch.equal(logits, before):
                return [f"{what}: your function changed the logits in place"]
            try:
                got = int(got)
            except (TypeError, ValueError, RuntimeError):
                return [f"{what}: expected a token id (an int), got {type(got).__name__}"]
            if got == want:
                continue
            if temperature == 0:
                problems.append(f"{what}: greedy should pick the argmax, token {want}; got {got}")
                break
            nucleus = top_p_filter(torch.softmax(logits / temperature, dim=-1), top_p)
            if not 0 <= got < vocab or nucleus[got] == 0:
                inside = int((nucleus > 0).sum())
                problems.append(f"{what}: token {got} is outside the nucleus (the {inside} most likely tokens "
                                f"reach top_p); drew {want} with the same seed")
            else:
                problems.append(f"{what}: token {got} is in the nucleus, but the seeded draw is {want}: keep the "
                                "token whose probability makes the mass reach top_p, renormalise, and draw once per "
                                "call with torch.multinomial(probs, 1, generator=generator), where probs covers the "
                                "whole vocabulary in its order (zeros outside the nucleus)")
            break
    if problems:
        return problems
    for _ in range(2):   # the nucleus itself: which tokens a few hundred draws can reach
        vocab, temperature = rng.randint(4, 7), rng.choice((0.5, 1.0, 2.0))
        probs = torch.tensor([rng.uniform(1, 3) for _ in range(vocab)]).sort(descending=True).values
        probs /= probs.sum()
        last = rng.randint(1, vocab - 2)                 # the nucleus: the `last + 1` most likely tokens
        cum = probs.cumsum(0)
        top_p = float(cum[last - 1] + probs[last] / 2)   # reached inside the last kept token's mass
        perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(rng.randrange(1 << 31)))
        logits = torch.empty(vocab)
        logits[perm] = temperature * probs.log()         # softmax(logits / temperature) = probs, shuffled
        nucleus = set(perm[:last + 1].tolist())
        g = torch.Generator().manual_seed(rng.randrange(1 << 31))
        drawn = {int(fn(logits.clone(), temperature, top_p, g)) for _ in range(300)}
        what = (f"probabilities {[round(float(p), 3) for p in logits.div(temperature).softmax(-1)]}, "
                f"temperature {temperature}, top_p {top_p:.3f}")
        if drawn != nucleus:
            problems.append(f"{what}: the nucleus is tokens {sorted(nucleus)} (the smallest set whose mass "
                            f"reaches top_p); 300 draws gave tokens {sorted(drawn)}")
    return problems


# --------------------------------------------------------------------------- 09.3 the quality check


def logits_agreement(logits: list, reference: list) -> dict:
    """`logits` and `reference` hold one fp32 tensor [n_i, V] per answered turn (the same turns,
    the same contexts): a day's answer logits and day 0's. Return {"logits_rel_err":
    ||all logits - all reference|| / ||all reference|| (norms over every turn's logits together),
    "top1_agreement": the share of answer tokens whose argmax ids agree, "compared_tokens": the
    number of answer tokens}."""
    raise NotImplementedError  # your code here


def _run(logits: list):
    return RunResult(turns=[TurnResult(0, i, i, 1, 0, [], 0.0, [], logits=x) for i, x in enumerate(logits)])


@exercise("09.3", "did the answers change?",
          "Compare a day's answer logits with day 0's: relative error and top-1 agreement.", logits_agreement,
          answers=(quality,))
def _check_logits_agreement(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    g = torch.Generator().manual_seed(rng.randrange(1 << 31))
    for what, noise in (("rounding noise (days 1-6)", 1e-6), ("FP8 (day 14)", 0.05), ("a broken day", 2.0)):
        vocab = rng.randint(8, 200)
        # turns of ragged lengths and very different scales: averaging per turn or per row is wrong
        ref = [torch.randn(rng.randint(1, 9), vocab, generator=g) * 10 ** rng.uniform(-1, 2) for _ in range(rng.randint(2, 5))]
        day = [r + noise * r.abs().mean() * rng.uniform(0.1, 10) * torch.randn(r.shape, generator=g) for r in ref]
        want = {k: v for k, v in quality(_run(day), _run(ref)).items()
                if k in ("logits_rel_err", "top1_agreement", "compared_tokens")}
        got = fn([d.clone() for d in day], [r.clone() for r in ref])
        if not isinstance(got, dict):
            return [f"expected a dict with logits_rel_err, top1_agreement and compared_tokens, got {type(got).__name__}"]
        missing = [k for k in want if k not in got]
        if missing:
            return [f"the dict lacks {missing}"]
        err, top1, n = (float(got[k]) for k in ("logits_rel_err", "top1_agreement", "compared_tokens"))
        case = f"{what}, {len(ref)} turns of {[r.shape[0] for r in ref]} tokens"
        if abs(err - want["logits_rel_err"]) > 1e-4 * want["logits_rel_err"] + 1e-12:
            problems.append(f"{case}: logits_rel_err should be {want['logits_rel_err']:.6g}, got {err:.6g} "
                            "(one norm over all turns' logits, not an average per turn or per token)")
        if abs(top1 - want["top1_agreement"]) > 1e-6:   # shares of < 50 tokens: apart by >= 0.02
            problems.append(f"{case}: top1_agreement should be {want['top1_agreement']:.4f}, got {top1:.4f}")
        if n != want["compared_tokens"]:
            problems.append(f"{case}: compared_tokens should be {want['compared_tokens']}, got {n:g}")
    return problems


# --------------------------------------------------------------------------- 09.4 the FP8 quantizer, in Triton


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 (e4m3) storage of a float tensor x [..., D] with one fp32 scale per row (per slice
    along the last dim), computed by a Triton kernel you write and launch here: scale is the
    smallest power of two with max|row| / scale <= 448 (1 for an all-zero row), and x8 =
    x / scale cast to torch.float8_e4m3fn. Rows may be any length and x any view (strided,
    bf16). Return (x8 shaped like x, scale of shape x.shape[:-1]). Do not modify x."""
    raise NotImplementedError  # your code here


def _fp8_cases(rng) -> list:
    """(what, x) pairs: ragged rows of very different magnitudes and the boundary rows, a strided
    view, a batch of rows, bf16."""
    g = torch.Generator().manual_seed(rng.randrange(1 << 31))
    rows, cols = rng.randint(6, 10), rng.randint(3, 200)
    x = torch.randn(rows, cols, generator=g) * torch.exp2(torch.empty(rows, 1).uniform_(-20, 20, generator=g))
    k = rng.randint(-12, 12)
    edge = 448.0 * 2.0 ** k
    x[0] = 0.0                                                          # all zero: scale 1
    x[1].clamp_(-edge / 2, edge / 2)[rng.randrange(cols)] = edge        # max exactly 448 * 2**k: scale 2**k
    # max one ulp above 448 * 2**j: scale 2**(j + 1). With |j| >= 4, an fp32 log2(max / 448) rounds to j
    for row in (2, 5):
        j = rng.choice((-1, 1)) * rng.randint(4, 12)
        above = float(torch.nextafter(torch.tensor(448.0 * 2.0 ** j), torch.tensor(1e30)))
        x[row].clamp_(-above / 2, above / 2)[rng.randrange(cols)] = -above if row == 2 else above
    x[3] = x[3].abs()
    x[3, rng.randrange(cols)] = -3 * x[3].max()                         # the largest magnitude is negative
    x[4].clamp_(-2.0 ** k, 2.0 ** k)[rng.randrange(cols)] = 2.0 ** k    # max an exact power of two
    wide = torch.randn(rng.randint(2, 5), 2 * rng.randint(17, 60), generator=g) * 10 ** rng.uniform(-3, 3)
    a, b = rng.randint(1, 3), rng.randint(1, 4)
    y = torch.randn(a, b, rng.randint(1, 40), generator=g) * 10 ** rng.uniform(-3, 3)
    return [(f"a {rows}x{cols} fp32 tensor", x), (f"every other column of a {tuple(wide.shape)} tensor (a strided "
                                                  "view)", wide[:, ::2]),
            (f"a {tuple(y.shape)} tensor", y), (f"a {tuple(y.shape)} bf16 tensor", y.bfloat16())]


def _scale_hint(row: torch.Tensor, want: float, got: float) -> str:
    """Why a row's scale came out ``got`` instead of ``want``, in the kernel's terms."""
    amax = float(row.abs().max())
    if amax == 0:
        return "an all-zero row gets scale 1 (log2(0) is -inf: keep it out of the formula)"
    block = 16
    while block < row.numel():            # a block shorter than the row sees only its first columns
        if float(pow2_scale(row[:block].abs().max())) == got:
            return (f"that is the scale of the row's first {block} values only: the block must cover the whole row "
                    f"of {row.numel()} (triton.next_power_of_2(D)), with the loads masked")
        block *= 2
    if got < want:
        return (f"with your scale the row's largest value becomes {amax / got:.9g} > 448 and saturates: check "
                "amax / scale <= 448 exactly after computing the scale (a log2 in fp32 can round down)")
    return (f"{want:.9g} already fits (amax / scale = {amax / want:.9g} <= 448): take the smallest power of two "
            "that fits, not the next one up")


@exercise("09.4", "FP8 quantize-on-write in Triton",
          "Write the Triton kernel that stores rows in FP8 (e4m3) with one power-of-two fp32 scale each, bit for "
          "bit as the engine's FP8 cache does.", quantize_rows_fp8, writes_triton=True,
          answers=(quantize_fp8, pow2_scale))
def _check_quantize_rows_fp8(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    for what, x in _fp8_cases(rng):
        want8, want_scale = quantize_fp8(x, dims=(-1,))
        before = x.clone()
        x_dev = on_kernel_device(x)
        try:
            got = fn(x_dev)
        except RuntimeError as e:
            if "outside of the scope of a kernel" not in str(e):
                raise
            return [f"Triton ran your kernel as plain Python ({e}): on a machine without a GPU, import minimax_lab "
                    "before triton, so that Triton's interpreter is switched on before the first @triton.jit"]
        if not torch.equal(x_dev.cpu(), before):
            return [f"{what}: your function changed x in place"]
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            return [f"expected a pair (x8, scale), got {type(got).__name__}"]
        got8, got_scale = got
        wrong = (tensor_problem(got_scale, "scale", tuple(x.shape[:-1]), torch.float32)
                 or tensor_problem(got8, "x8", tuple(x.shape), FP8))
        if wrong:
            problems.append(f"{what}: {wrong}")
            continue
        got8, got_scale = got8.detach().cpu(), got_scale.detach().cpu()
        rows_x = x.float().reshape(-1, x.shape[-1])
        bad = (got_scale.reshape(-1) != want_scale.reshape(-1)).nonzero().flatten().tolist()
        if bad:
            r = bad[0]
            want, have = float(want_scale.reshape(-1)[r]), float(got_scale.reshape(-1)[r])
            problems.append(f"{what}: row {r} (max |x| = {float(rows_x[r].abs().max()):.9g}) needs scale {want:.9g}, "
                            f"got {have:.9g} ({len(bad)} of {want_scale.numel()} scales wrong): "
                            f"{_scale_hint(rows_x[r], want, have)}")
            continue
        diff = (got8.view(torch.uint8) != want8.view(torch.uint8)).reshape(-1, x.shape[-1])
        if diff.any():
            cols = diff.nonzero()[:, 1]
            i = int(diff.reshape(-1).nonzero()[0])
            hint = ""
            if int(cols.min()) > 0 and float(diff[:, int(cols.min()):].float().mean()) > 0.9:
                hint = (f": every value from column {int(cols.min())} on is wrong -- the block must cover the whole "
                        "row (triton.next_power_of_2(D)), with the loads and stores masked")
            elif not x.is_contiguous():
                hint = ": x is a strided view here -- pass its strides to the kernel (or make it contiguous first)"
            problems.append(f"{what}: element {i} (x = {float(x.reshape(-1)[i]):.9g}) should be stored as "
                            f"{float(want8.reshape(-1)[i].float()):g}, got {float(got8.reshape(-1)[i].float()):g} "
                            f"({int(diff.sum())} of {x.numel()} values wrong){hint}")
    return problems
