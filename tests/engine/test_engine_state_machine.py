"""The engine, its scheduler and its block manager driven through random programs (hypothesis's
rule-based state machine, derandomized like every property test here).

A program builds an engine -- recompute, swap or no preemption, prefix cache on or off, batching
on or off, ``max_batch`` 1 to 4, a pool from too small for some requests to ample -- and then
adds requests (prompts sharing prefixes), forks decoding ones, aborts any, steps, and serves
bursts of arrivals through ``serve_arrivals``. After every step it checks:

* every page is accounted for: free + used + cached == the pool, reference counts equal the block
  tables' references (``BlockManager.check_invariants``), and only running sequences hold pages;
* at most ``max_batch`` sequences run and are computed in one step;
* no token is lost or duplicated: a sequence gains exactly one token in a step that samples it and
  none otherwise (never after an abort), and one time stamp per token;
* every greedy token equals the one of a run of the same request alone with ample memory (where
  that run's top-2 logits are closer than the comparison's tolerance, the two may part ways: the
  request is then no longer compared, and such ties are counted);
* nothing raises but the documented errors (``ValueError`` for a request or fork that cannot fit,
  ``KeyError`` for an unknown id), each where the contract says.

When a program ends, the engine runs to the end: every request not aborted has all its tokens and
every page is back. ``MINIMAX_LAB_LONG_FUZZ=1`` runs thousands of programs instead of a few dozen,
in four shards (``-n 4`` runs them at once; ``-rP`` prints what each did).
"""
import math
import os
import time

import pytest
import torch
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)
from tests.support.devices import DEVICE, ON_GPU, TF32_TOL

from minimax_lab.engine import Engine, EngineOptions, M3Model, SamplingParams, m3_config
from minimax_lab.engine.arrivals import Arrival
from minimax_lab.engine.clock import SimulatedClock, StepCost
from minimax_lab.engine.load import serve_arrivals
from minimax_lab.engine.scheduler import WATERMARK
from minimax_lab.engine.sequence import Status

LONG = os.environ.get("MINIMAX_LAB_LONG_FUZZ") == "1"
#: the long run's programs are split over shards (one test each, its own fixed seed), so that
#: ``pytest -n N`` runs them in N processes
SHARDS = 4 if LONG else 1
PROGRAMS = 2000 if LONG else 25
RULES_PER_PROGRAM = 15 if LONG else 10
CFG = m3_config("cpu")
PAGE = CFG.block_size
MAX_NEW = 24                                   # the most tokens a request asks for (past a page or two)
TOL = TF32_TOL if ON_GPU else 1e-4
COST = StepCost(fixed_ms=2.0, decode_ms=0.2, prefill_token_ms=0.05, attend_ms_per_mpair=10.0, host_gbps=5.0)
#: shared beginnings of the prompts (system prompts): none, one page, and two pages and a bit
PREFIX_LENGTHS = (0, PAGE, 2 * PAGE + 5)


def _ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CFG.vocab_size - 1, (n,), generator=g).tolist()


PREFIXES = [_ids(n, 1000 + i) for i, n in enumerate(PREFIX_LENGTHS)]


def prompt_of(spec) -> list[int]:
    """A prompt from ``(prefix, suffix seed, suffix length)``: prompts share prefixes and whole pages."""
    prefix, seed, n = spec
    return PREFIXES[prefix] + _ids(n, seed)


#: few distinct prompts, so their reference runs are reused across programs; the first value of
#: each choice (where hypothesis starts) is a long one, which presses on the pool
prompt_specs = st.tuples(st.sampled_from([2, 1, 0]), st.integers(0, 1), st.sampled_from([20, 33, 7, 16, 1]))
max_tokens = st.sampled_from([MAX_NEW, 17, 9, 3, 1])

_MODEL = {}
_REFERENCE: dict = {}
#: what the programs did, reported by the long run; ``ties``: requests that parted from the
#: reference at a near tie
STATS = dict(programs=0, steps=0, requests=0, forks=0, refused=0, aborts=0, bursts=0, preempted_recompute=0,
             preempted_swap=0, ties=0)


def model() -> M3Model:
    if "m" not in _MODEL:
        _MODEL["m"] = M3Model.create(CFG, DEVICE)
    return _MODEL["m"]


def reference(prompt: list[int]) -> tuple[list[int], list[bool]]:
    """The greedy tokens of ``prompt`` served alone with ample memory (``MAX_NEW`` of them; a
    shorter request's are a prefix), and per token whether its top-2 logits are clearly apart."""
    key = tuple(prompt)
    if key not in _REFERENCE:
        eng = Engine(model(), EngineOptions(), kv_tokens=4096, record_logits=True)
        rid = eng.add_request(prompt, sampling=SamplingParams(max_tokens=MAX_NEW))
        eng.run()
        logits = torch.stack(eng.sequences[rid].logits).float().cpu()
        top2 = logits.topk(2, dim=-1).values
        clear = ((top2[:, 0] - top2[:, 1]) > 4 * TOL * logits.abs().amax(-1)).tolist()
        _REFERENCE[key] = (eng.sequences[rid].output, clear)
    return _REFERENCE[key]


class EngineMachine(RuleBasedStateMachine):
    """One program: an engine, its requests and what each must produce (module docstring)."""

    @initialize(preemption=st.sampled_from(["swap", "recompute", None]), prefix_caching=st.booleans(),
                batching=st.sampled_from([True, True, True, False]), max_batch=st.sampled_from([3, 2, 4, 1]),
                chunk=st.sampled_from([None, 3, 17, 40]), pages=st.integers(4, 12),
                first=st.lists(st.tuples(prompt_specs, max_tokens), max_size=4))
    def build(self, preemption, prefix_caching, batching, max_batch, chunk, pages, first=()):
        step_tokens = None if chunk is None else max_batch + chunk
        opts = EngineOptions(continuous_batching=batching, max_batch=max_batch, step_tokens=step_tokens,
                             prefix_caching=prefix_caching, preemption=preemption)
        self.eng = Engine(model(), opts, kv_tokens=pages * PAGE, clock=SimulatedClock(COST))
        for t in (self.eng.cache.pages.k, self.eng.cache.pages.v, self.eng.cache.index_keys):
            t.fill_(100.0)               # a slot read before any step wrote it changes the logits
        self.max_batch = max_batch if batching else 1
        self.watermark = max(1, math.ceil(WATERMARK * pages)) if preemption else 0
        self.want: dict = {}             # request id -> (reference tokens, clear margins)
        self.seen: dict = {}             # request id -> tokens it had after the last check
        self.parted: set = set()         # requests that left the reference at a near tie
        self.steps = 0
        self.bursts = 0
        STATS["programs"] += 1
        for spec, n in first:             # the requests a program starts with
            self.add(spec, n)

    # ---- what each request must produce -----------------------------------------------------------
    def _fits(self, prompt, n) -> bool:
        return math.ceil((len(prompt) + n - 1) / PAGE) + self.watermark <= self.eng.blocks.num_pages

    def _learn_new_requests(self) -> None:
        for rid, seq in self.eng.sequences.items():
            if rid not in self.want:                     # added by serve_arrivals
                self.want[rid] = reference(seq.prompt)
                self.seen[rid] = 0

    def _check_tokens(self, rid, seq) -> None:
        tokens, clear = self.want[rid]
        if rid in self.parted:
            return
        for k, tok in enumerate(seq.output):
            if tok != tokens[k]:
                assert not clear[k], (f"request {rid!r}: token {k} is {tok}, the reference's is {tokens[k]} "
                                      f"(its top-2 logits are clearly apart)")
                self.parted.add(rid)
                STATS["ties"] += 1
                return

    def after_step(self, eng=None) -> None:
        """The checks after every step (module docstring)."""
        eng = self.eng
        ran = eng.steps != self.steps
        self.steps = eng.steps
        self._learn_new_requests()
        sampled = set()
        if ran:
            plan = eng.last_plan
            computed = {s.seq_id for s in plan.decodes} | {s.seq_id for s, _, _ in plan.prefills}
            assert len(computed) <= self.max_batch, f"{len(computed)} sequences in one step, max_batch={self.max_batch}"
            sampled = {s.seq_id for s in plan.decodes} | {s.seq_id for s, _, e in plan.prefills if e == s.prefill_end}
        for rid, seq in eng.sequences.items():
            gained = len(seq.output) - self.seen[rid]
            should = int(rid in sampled)
            if seq.aborted:
                assert gained == 0, f"aborted request {rid!r} gained {gained} tokens"
            else:
                assert gained == should, f"request {rid!r} gained {gained} tokens, sampled {should} times"
            assert len(seq.token_times) == len(seq.output)
            self.seen[rid] = len(seq.output)
            self._check_tokens(rid, seq)
        self.check_pages()
        assert len(eng.scheduler.running) <= self.max_batch

    def check_pages(self) -> None:
        blocks = self.eng.blocks
        blocks.check_invariants()
        free = set(blocks.free_pages)
        used = {p for p in range(blocks.num_pages) if blocks.refcount[p] > 0}
        cached = {p for p in range(blocks.num_pages) if blocks.refcount[p] == 0 and blocks.page_hash[p] is not None}
        assert not (free & used or free & cached or used & cached), "a page is in two states"
        assert len(free) + len(used) + len(cached) == blocks.num_pages, "a page is neither free, used nor cached"
        holders = {s.seq_id for s in self.eng.scheduler.running}
        assert set(blocks.seqs) == holders, "a sequence that is not running holds pages"
        for seq in self.eng.scheduler.waiting:
            assert seq.status is Status.WAITING and (seq.swapped is None or self.eng.options.preemption == "swap")

    # ---- the program's moves ----------------------------------------------------------------------
    @rule(spec=prompt_specs, n=max_tokens)
    def add(self, spec, n):
        prompt = prompt_of(spec)
        if not self._fits(prompt, n):
            with pytest.raises(ValueError, match="pages"):
                self.eng.add_request(prompt, sampling=SamplingParams(max_tokens=n))
            return
        rid = self.eng.add_request(prompt, sampling=SamplingParams(max_tokens=n))
        self.want[rid], self.seen[rid] = reference(prompt), 0
        STATS["requests"] += 1

    @precondition(lambda self: self.eng.scheduler.running)
    @rule(k=st.integers(0, 10**6))
    def fork(self, k):
        for _ in range(8):                        # step until something decodes (a fork needs its first token)
            decoding = [s for s in self.eng.scheduler.running if s.status is Status.DECODE]
            if decoding or not self.eng.has_work():
                break
            self.eng.step()
            self.after_step()
        if not decoding:
            return
        parent = decoding[k % len(decoding)]
        running = len(self.eng.scheduler.running)
        try:
            child = self.eng.fork(parent.seq_id)
        except ValueError as e:
            STATS["refused"] += 1
            full = running >= self.max_batch
            assert full or (self.eng.options.preemption is None and "KV pool cannot hold" in str(e)), e
            assert len(self.eng.scheduler.running) == running
            self.check_pages()
            return
        assert running < self.max_batch, "a fork ran more than max_batch sequences"
        STATS["forks"] += 1
        self.want[child], self.seen[child] = self.want[parent.seq_id], len(parent.output)
        if parent.seq_id in self.parted:
            self.parted.add(child)
        self.check_pages()

    @precondition(lambda self: self.eng.has_work())
    @rule(k=st.integers(0, 10**6))
    def abort(self, k):
        ids = list(self.eng.sequences)
        if not ids:
            with pytest.raises(KeyError):
                self.eng.abort(("nobody",))
            return
        rid = ids[k % len(ids)]
        seq = self.eng.sequences[rid]
        done = seq.status is Status.FINISHED or seq.aborted
        assert self.eng.abort(rid) is (not done)
        STATS["aborts"] += not done
        assert seq.aborted or (done and seq.status is Status.FINISHED)
        self.check_pages()

    @precondition(lambda self: self.eng.has_work())
    @rule(n=st.integers(1, 6))
    def step(self, n):
        for _ in range(n):
            if not self.eng.has_work():
                return
            self.eng.step()
            self.after_step()

    @precondition(lambda self: self.bursts < 2)      # a burst is served to the end: few per program
    @rule(burst=st.lists(st.tuples(st.floats(0.0, 0.02), prompt_specs, max_tokens), min_size=1, max_size=3))
    def arrivals(self, burst):
        t, arrivals = 0.0, []
        for gap, spec, n in burst:
            t += gap
            prompt = prompt_of(spec)
            if self._fits(prompt, n):
                arrivals.append(Arrival(t, tuple(prompt), n))
        self.bursts += 1
        STATS["bursts"] += 1
        STATS["requests"] += len(arrivals)
        res = serve_arrivals(self.eng, arrivals, tag=("burst", self.bursts), on_step=self.after_step)
        self.after_step()
        assert not self.eng.has_work() and len(res.sequences) == len(arrivals)

    @invariant()
    def pages_add_up(self):
        if hasattr(self, "eng"):
            self.check_pages()

    def teardown(self):
        if not hasattr(self, "eng"):
            return
        for _ in range(3000):                      # every program ends: no request is starved forever
            if not self.eng.has_work():
                break
            self.eng.step()
            self.after_step()
        assert not self.eng.has_work(), "the engine still has work after 3000 steps"
        for rid, seq in self.eng.sequences.items():
            assert seq.status is Status.FINISHED
            if not seq.aborted:
                assert len(seq.output) == seq.sampling.max_tokens, f"request {rid!r} is short of tokens"
        blocks = self.eng.blocks
        assert not blocks.seqs and len(blocks.free_pages) + len(blocks.cached) == blocks.num_pages
        STATS["steps"] += self.eng.steps
        STATS[f"preempted_{self.eng.options.preemption}"] = (STATS.get(f"preempted_{self.eng.options.preemption}", 0)
                                                            + self.eng.scheduler.preemptions)


def run_program(config: dict, moves: list) -> EngineMachine:
    """One program written out: ``build(**config)``, then each move ``(rule name, arguments)``,
    then the end of the program (the engine runs to the end and is checked)."""
    machine = EngineMachine()
    machine.build(**config)
    for name, kw in moves:
        getattr(machine, name)(**kw)
        machine.check_pages()
    machine.teardown()
    return machine


LONG_PROMPT = (2, 0, 1)          # 38 tokens: two full pages and a partial one
BATCH = dict(prefix_caching=False, batching=True, max_batch=4, chunk=40)


@pytest.mark.parametrize("policy", ["swap", "recompute"])
def test_two_long_requests_on_a_small_pool_preempt_and_finish(policy):
    """The shape that crashed swap: the last running sequence finishes while the only waiting one
    is swapped out."""
    m = run_program(dict(BATCH, preemption=policy, pages=7),
                    [("add", dict(spec=LONG_PROMPT, n=24)), ("add", dict(spec=(1, 1, 20), n=24)), ("step", dict(n=6))])
    assert m.eng.scheduler.preemptions >= 1
    assert (m.eng.swap.bytes_in > 0) == (policy == "swap")


def test_a_written_program_forks_aborts_and_serves_arrivals():
    burst = [(0.0, (1, 0, 7), 5), (0.01, (1, 1, 7), 9), (0.0, (0, 0, 33), 3)]
    for prefix_caching in (False, True):
        m = run_program(dict(BATCH, prefix_caching=prefix_caching, preemption="recompute", chunk=3, pages=9),
                        [("add", dict(spec=(2, 1, 20), n=12)), ("add", dict(spec=(1, 0, 16), n=20)),
                         ("step", dict(n=6)), ("abort", dict(k=0)),                # mid-prompt
                         ("fork", dict(k=0)), ("step", dict(n=4)), ("fork", dict(k=1)),
                         ("add", dict(spec=(2, 1, 20), n=12)), ("abort", dict(k=1)), ("arrivals", dict(burst=burst)),
                         ("add", dict(spec=LONG_PROMPT, n=24))])
        assert STATS["forks"] and any(s.aborted for s in m.eng.sequences.values())


def test_a_fork_under_swap_preemption_is_taken_when_the_pool_is_below_its_watermark():
    """The program the long fuzz found: with preemption the fork shares its parent's pages and needs
    none now, so a pool whose free pages are below the watermark must still take it (it was refused
    as "needs 0 more pages, -1 are free")."""
    refused = STATS["refused"]
    burst = [(0.0, (2, 0, 20), 24)]
    m = run_program(dict(preemption="swap", batching=True, chunk=None, pages=6, max_batch=3, prefix_caching=False),
                    [("arrivals", dict(burst=burst)), ("arrivals", dict(burst=burst)),
                     ("add", dict(n=24, spec=(0, 0, 33))), ("add", dict(n=24, spec=(2, 0, 20))),
                     ("step", dict(n=4)), ("fork", dict(k=0)), ("step", dict(n=6)), ("fork", dict(k=0)),
                     ("step", dict(n=6)), ("step", dict(n=1)), ("fork", dict(k=0))])
    assert STATS["refused"] == refused and not m.eng.has_work()


def test_a_pool_too_small_refuses_requests_and_forks_that_cannot_fit():
    refused = STATS["refused"]
    m = run_program(dict(BATCH, preemption=None, max_batch=3, pages=4),
                    [("add", dict(spec=(2, 0, 33), n=24)),                          # 6 pages: refused
                     ("add", dict(spec=(2, 0, 16), n=12)),                          # 53 + 12 tokens: the 4 pages
                     ("step", dict(n=2)), ("fork", dict(k=0))])                     # its copy-on-write page: refused
    assert STATS["refused"] == refused + 1 and len(m.eng.sequences) == 1


@pytest.mark.parametrize("shard", range(SHARDS))
def test_the_engine_survives_random_programs(shard):
    machine = EngineMachine
    if LONG:                     # each shard its own programs, the same ones every run
        machine = seed(shard)(type(f"EngineMachineShard{shard}", (EngineMachine,), {}))
    t0 = time.perf_counter()
    run_state_machine_as_test(machine, settings=settings(
        max_examples=PROGRAMS // SHARDS, stateful_step_count=RULES_PER_PROGRAM, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
    if LONG:
        done = ", ".join(f"{k} {v}" for k, v in STATS.items())
        print(f"long fuzz, shard {shard}: {time.perf_counter() - t0:.0f} s, {done}")
