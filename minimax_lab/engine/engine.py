"""The engine: requests in, tokens out, one step at a time.

::

    engine = Engine(model, day_options("paged_kernels"), kv_tokens=65_536)
    rid = engine.add_request(prompt_ids, images=None, sampling=SamplingParams(max_tokens=32))
    outputs = engine.run()            # {request id: generated ids}
    engine.sequences[rid]             # timestamps, cached tokens, (recorded logits)

A step (:meth:`Engine.step`) is

1. **schedule** -- :class:`~minimax_lab.engine.scheduler.Scheduler` picks decode tokens and prompt
   chunks (and appends/allocates their pages in the block manager);
2. **prepare** -- a :class:`~minimax_lab.engine.paged_attention.StepBatch`: flat ids, positions,
   slots, block tables, image patches, and which rows need logits (each decode token, and the
   last token of a chunk that completes its prompt);
3. **run** -- the model over the batch (:meth:`M3Model.forward` with a
   :class:`~minimax_lab.engine.paged_attention.StepAttention`), or, for a decode-only step of at
   most ``max_batch`` sequences with ``cuda_graphs``, a graph replay
   (:class:`~minimax_lab.engine.graphs.DecodeGraphs`, captured at the first such step);
4. **sample** -- :func:`~minimax_lab.engine.sampling.sample`; stamp times; free finished sequences.

Timing: the engine's clock (:mod:`.clock`) stamps every event. ``arrival`` is when
:meth:`add_request` was called (or the time passed in), each token is stamped when its step ends:
on a :class:`~minimax_lab.engine.clock.WallClock` after the step's sampling (which reads the tokens
back to the host, so the GPU work is done), on a
:class:`~minimax_lab.engine.clock.SimulatedClock` at the step's start plus its price. TTFT = first
token - arrival, inter-token latency = the gaps between a request's tokens. ``step_times`` holds a
:class:`StepTime` per step.

A model on the ``meta`` device has no weights: the engine then schedules, allocates pages and
prices steps on its (simulated) clock but computes nothing, and each sampled token is a
placeholder (the forced token where one is given, else 1) -- a load sweep's timing does not
depend on the tokens' values, only on how many there are.

:meth:`Engine.abort` stops a request (waiting or running); :meth:`Engine.fork` continues one in
a second sequence sharing its pages.

Preemption (``EngineOptions.preemption``): see :mod:`.scheduler`; a swap copies pages between the
KV cache and host memory (:class:`~minimax_lab.engine.scheduler.HostSwap`).

``record_logits=True`` keeps every sampled row's fp32 logits on the sequence (for quality
comparisons between days).

FP8 (``kv_dtype``, ``expert_dtype``): the page pool is allocated in FP8 with its scales
(:class:`~minimax_lab.engine.paged_attention.PagedKVCache`), and the model's experts are quantized
when the first engine that needs them is built (:meth:`M3Model.quantize_experts`, kept on the model).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from minimax_lab.engine.clock import SimulatedClock, StepShape, WallClock, check_seconds, chunk_pairs
from minimax_lab.engine.config import M3Config
from minimax_lab.engine.graphs import DecodeGraphs
from minimax_lab.engine.model_m3 import M3Model
from minimax_lab.engine.options import EngineOptions
from minimax_lab.engine.paged_attention import PagedKVCache, PrefillSpan, StepAttention, StepBatch
from minimax_lab.engine.sampling import SamplingParams, sample
from minimax_lab.engine.scheduler import HostSwap, Plan, Scheduler
from minimax_lab.engine.sequence import Sequence, Status, image_keys
from minimax_lab.kvcache.blocks import BlockManager, token_ids
from minimax_lab.validate import check_positive_int, check_tensor


#: the token a model without weights (``meta`` device) emits where no token is forced
PLACEHOLDER_TOKEN = 1


class StepTime(NamedTuple):
    """One step: its ``seconds`` on the engine's clock and its :class:`~minimax_lab.engine.clock.StepShape`."""

    seconds: float
    shape: StepShape

    @property
    def decodes(self) -> int:
        return self.shape.decodes

    @property
    def tokens(self) -> int:
        return self.shape.tokens


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Engine:
    """Serves an :class:`~minimax_lab.engine.model_m3.M3Model` (see the module docstring).

    ``kv_tokens`` sizes the page pool (rounded up to whole pages); ``max_seq_len`` (default the
    model's) bounds one request and the CUDA graphs' block-table width; ``clock`` (default a
    :class:`~minimax_lab.engine.clock.WallClock`) stamps events. Raises ``ValueError`` for options
    the device cannot run (CUDA graphs without CUDA) and for a model without weights (``meta``)
    on a wall clock."""

    def __init__(self, model: M3Model, options: EngineOptions | None = None, *, kv_tokens: int,
                 max_seq_len: int | None = None, record_logits: bool = False, clock=None):
        if not isinstance(model, M3Model):
            raise TypeError(f"model must be an M3Model, got {type(model).__name__}")
        options = EngineOptions() if options is None else options
        if not isinstance(options, EngineOptions):
            raise TypeError(f"options must be EngineOptions, got {type(options).__name__}")
        check_positive_int(kv_tokens, "kv_tokens")
        self.model, self.options = model, options
        self.cfg: M3Config = model.cfg
        self.device = next(model.parameters()).device
        if options.cuda_graphs and self.device.type != "cuda":
            raise ValueError(f"cuda_graphs=True needs the model on a CUDA device, it is on {self.device.type}")
        self.clock = WallClock() if clock is None else clock
        if not isinstance(self.clock, (WallClock, SimulatedClock)):
            raise TypeError(f"clock must be a WallClock or SimulatedClock, got {type(self.clock).__name__}")
        self.compute = self.device.type != "meta"
        if not self.compute and not self.clock.simulated:
            raise ValueError("a model on the meta device computes nothing: give the engine a SimulatedClock")
        ps = self.cfg.block_size
        self.max_seq_len = check_positive_int(max_seq_len or self.cfg.max_seq_len, "max_seq_len")
        self.max_pages = -(-self.max_seq_len // ps)
        num_pages = -(-kv_tokens // ps)
        self.cache = PagedKVCache(self.cfg, num_pages, device=self.device, kv_dtype=options.kv_dtype)
        self.expert_fp8 = options.expert_dtype is not None
        if self.expert_fp8 and self.compute:      # once per model: later engines reuse the FP8 copies
            model.quantize_experts()
        self.blocks = BlockManager(num_pages, ps, kv=self.cache, prefix_caching=options.prefix_caching)
        self.swap = HostSwap(self.cache)
        self.scheduler = Scheduler(self.blocks, continuous_batching=options.continuous_batching,
                                   max_batch=options.max_batch, step_tokens=options.step_tokens,
                                   max_seq_len=self.max_seq_len, preemption=options.preemption, swap=self.swap)
        self.record_logits = record_logits
        self.sequences: dict[object, Sequence] = {}
        self.steps = 0
        self.step_times: list = []
        self.graphs: DecodeGraphs | None = None
        self.last_plan: Plan | None = None
        self._next_id = 0

    # ---- requests ------------------------------------------------------------------------------
    def add_request(self, prompt, *, images: torch.Tensor | None = None, sampling: SamplingParams | None = None,
                    request_id=None, arrival: float | None = None):
        """Queue a request; returns its id. ``prompt``: token ids, ``cfg.img_id`` once per image
        patch; ``images [M, 3, H, W]`` float, one per ``patches_per_image`` placeholders, in order.
        ``arrival`` (default: now) is the time on the engine's clock the request arrived.
        Raises ``TypeError``/``ValueError`` for ids outside the vocabulary, a placeholder/image
        mismatch, a duplicate id, an arrival that is not a finite time, or a request that cannot
        fit (``max_seq_len``, the page pool)."""
        cfg = self.cfg
        ids = token_ids(prompt, "prompt")
        if not ids:
            raise ValueError("prompt must hold at least one token")
        if max(ids) >= cfg.vocab_size:
            raise ValueError(f"prompt ids must lie in the vocabulary [0, {cfg.vocab_size}), got {max(ids)}")
        sampling = SamplingParams() if sampling is None else sampling
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be SamplingParams, got {type(sampling).__name__}")
        rid = request_id if request_id is not None else self._new_id()
        if rid in self.sequences:
            raise ValueError(f"request id {rid!r} is already used")
        positions = [i for i, t in enumerate(ids) if t == cfg.img_id]
        n_images = 0 if images is None else check_tensor(images, "images", ndim=4).shape[0]
        if len(positions) != n_images * cfg.patches_per_image:
            raise ValueError(f"the prompt has {len(positions)} image placeholders (id {cfg.img_id}) but "
                             f"{n_images} image(s) need {n_images * cfg.patches_per_image}")
        keys = list(ids)
        patches = None
        if n_images:
            patches = self.model.embed_images(images)
            ppi = cfg.patches_per_image
            for m in range(n_images):
                for pos, key in zip(positions[m * ppi:(m + 1) * ppi], image_keys(images[m], ppi, cfg.vocab_size)):
                    keys[pos] = key
        seq = Sequence(rid, ids, keys, sampling, patches=patches, patch_positions=positions,
                       arrival=self.clock.now() if arrival is None else check_seconds(arrival, "arrival"))
        if not sampling.greedy and sampling.forced_tokens is None and self.compute:
            seq.generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
        self.scheduler.add(seq)
        self.sequences[rid] = seq
        return rid

    def fork(self, request_id, child_id=None):
        """A new request continuing ``request_id`` (which must be decoding): it shares every page
        (``BlockManager.fork``; a shared partial page is copied on its first write), has generated
        the same tokens so far, and goes on with the parent's sampling params. Returns its id.
        Raises ``ValueError`` if the parent is not decoding, the child would run more than
        ``max_batch`` sequences at once, or the pool cannot hold it."""
        parent = self.sequences.get(request_id)
        if parent is None or parent.status is not Status.DECODE:
            raise ValueError(f"request {request_id!r} is not decoding (fork needs its first token)")
        cid = child_id if child_id is not None else self._new_id()
        if cid in self.sequences:
            raise ValueError(f"request id {cid!r} is already used")
        child = Sequence(cid, parent.prompt, parent.keys, parent.sampling, patches=parent.patches,
                         patch_positions=parent.patch_positions, status=Status.DECODE, computed=parent.computed,
                         prefill_end=parent.prefill_end,
                         output=list(parent.output), arrival=parent.arrival, first_token=parent.first_token,
                         token_times=list(parent.token_times), cached_tokens=parent.cached_tokens)
        if parent.generator is not None:
            child.generator = torch.Generator(device=self.device).set_state(parent.generator.get_state())
        self.scheduler.fork(parent, child)
        self.sequences[cid] = child
        return cid

    def abort(self, request_id) -> bool:
        """Stop request ``request_id``: it generates no token after this call and its pages go back
        (full computed ones stay cached). A request in the middle of its prompt with prefix caching
        keeps running until its prompt's full pages hold K/V (they are already named, so a later
        request may share them), then finishes without a token. Returns False if it had already
        finished; raises ``KeyError`` for an unknown id."""
        seq = self.sequences.get(request_id)
        if seq is None:
            raise KeyError(f"unknown request {request_id!r}")
        if seq.status is Status.FINISHED or seq.aborted:
            return False
        if self.scheduler.abort(seq):
            seq.finished = self.clock.now()
        return True

    def _new_id(self) -> int:
        while self._next_id in self.sequences:
            self._next_id += 1
        return self._next_id

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # ---- one step ------------------------------------------------------------------------------
    def _prepare(self, plan: Plan) -> tuple[StepBatch, list]:
        """The step's inputs on the device, and the sequences whose logits rows come back, in order."""
        ids, pos, slots, patch_rows, patch_idx, logit_rows, sampled = [], [], [], [], [], [], []
        for seq in plan.decodes:                    # the newest token: its K/V, the next logits
            logit_rows.append(len(ids))
            sampled.append(seq)
            ids.append(seq.output[-1])
            pos.append(seq.prompt_len + len(seq.output) - 1)
        slots.extend(plan.decode_slots)
        dev = self.device
        spans = []
        for seq, s, e in plan.prefills:
            offset = len(ids)
            ids.extend(seq.tokens[s:e])
            pos.extend(range(s, e))
            slots.extend(self.blocks.slots(seq.seq_id, s, e).tolist())
            for k, p in enumerate(seq.patch_positions):
                if s <= p < e:
                    patch_rows.append(offset + p - s)
                    patch_idx.append((seq, k))
            spans.append(PrefillSpan(offset, s, e - s, self.blocks.block_table([seq.seq_id], device=dev),
                                     torch.tensor([e], dtype=torch.int32, device=dev)))
            if e == seq.prefill_end:
                logit_rows.append(len(ids) - 1)
                sampled.append(seq)
        as_long = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)  # noqa: E731
        batch = StepBatch(as_long(ids), as_long(pos), as_long(slots), n_decode=len(plan.decodes),
                          logit_rows=as_long(logit_rows))
        if plan.decodes:
            seq_ids = [s.seq_id for s in plan.decodes]
            batch.decode_block_table = self.blocks.block_table(seq_ids, device=dev)
            batch.decode_seq_lens = self.blocks.seq_lens(seq_ids, device=dev)
        batch.prefills = spans
        if patch_rows:
            batch.patches = torch.stack([seq.patches[k] for seq, k in patch_idx])
            batch.patch_rows = as_long(patch_rows)
        return batch, sampled

    def _forward(self, plan: Plan, batch: StepBatch) -> torch.Tensor:
        o = self.options
        if o.cuda_graphs and not plan.prefills and len(plan.decodes) <= o.max_batch:
            if self.graphs is None:
                self.graphs = DecodeGraphs(self.model, self.cache, max_batch=o.max_batch, max_pages=self.max_pages,
                                           msa_impl=o.msa_impl, paged_impl=o.paged_impl, moe_impl=o.moe_impl,
                                           expert_fp8=self.expert_fp8)
            return self.graphs.run(batch.input_ids, batch.positions, batch.slots, batch.decode_block_table,
                                   batch.decode_seq_lens)
        attend = StepAttention(self.cfg, self.cache, batch, msa_impl=o.msa_impl, paged_impl=o.paged_impl)
        return self.model(batch, attend, moe_impl=o.moe_impl, expert_fp8=self.expert_fp8)

    def _shape(self, plan: Plan) -> StepShape:
        chunks = sum(chunk_pairs(s, e) for _, s, e in plan.prefills)
        attended = sum(s.prompt_len + len(s.output) for s in plan.decodes) + chunks
        swapped = (plan.swap_out_pages + plan.swap_in_pages) * self.cache.page_bytes()
        return StepShape(len(plan.decodes), plan.n_tokens - len(plan.decodes), attended, swapped, chunks)

    def _placeholders(self, sampled: list) -> list:
        return [s.sampling.forced_tokens[len(s.output)] if s.sampling.forced_tokens is not None
                else PLACEHOLDER_TOKEN for s in sampled]

    def step(self) -> list:
        """Run one step; returns the sequences that finished in it."""
        with torch.inference_mode():   # no autograd bookkeeping in serving
            t0 = self.clock.now()
            plan = self.scheduler.schedule()
            if not plan and plan.preempted:     # every decode was preempted: admit in a fresh plan
                again = self.scheduler.schedule()
                again.swap_out_pages += plan.swap_out_pages
                again.preempted = plan.preempted + again.preempted
                plan = again
            if not plan:
                if self.scheduler.has_work():
                    raise RuntimeError("the scheduler found nothing to run although requests are waiting")
                return []
            logits = None
            if self.compute:
                batch, sampled = self._prepare(plan)
                logits = self._forward(plan, batch)
                tokens = sample(logits, [s.sampling for s in sampled], [s.generator for s in sampled],
                                [len(s.output) for s in sampled])     # reads back: the step's GPU work is done
            else:
                sampled = list(plan.decodes) + [seq for seq, _, e in plan.prefills if e == seq.prefill_end]
                tokens = self._placeholders(sampled)
            shape = self._shape(plan)
            now = self.clock.step_done(t0, shape)
            self.last_plan = plan
            self.steps += 1
            self.step_times.append(StepTime(now - t0, shape))
            for seq, s, e in plan.prefills:
                seq.computed = e
            finished = []
            for row, (seq, tok) in enumerate(zip(sampled, tokens)):
                if seq.aborted:                 # aborted mid-prompt: its named pages are written now
                    seq.finished = now
                    self.scheduler.finish(seq)
                    continue
                if seq.status is Status.PREFILL:
                    seq.status = Status.DECODE
                    if seq.first_token is None:
                        seq.first_token = now
                seq.output.append(int(tok))
                seq.token_times.append(now)
                if self.record_logits and logits is not None:
                    seq.logits.append(logits[row].clone())
                if seq.is_done():
                    seq.finished = now
                    self.scheduler.finish(seq)
                    finished.append(seq)
            return finished

    def run(self) -> dict:
        """Step until every request has finished; ``{request id: generated ids}`` of all requests."""
        while self.has_work():
            self.step()
        return {rid: list(s.output) for rid, s in self.sequences.items()}

    def warmup(self) -> None:
        """Compile the kernels (and capture the CUDA graphs) on throwaway requests, then forget them
        and the step statistics: a prompt past MSA's dense-selection length (so the top-k branch
        runs), the same prompt extended (a prefix-cache hit, with ``prefix_caching``), and with
        ``continuous_batching`` a full batch of short requests."""
        c = self.cfg
        n = max(1, min(c.topk * c.block_size + 2 * c.block_size + 3, self.max_seq_len - 32))
        base = [1 + i % (c.vocab_size - 2) for i in range(n)]
        prompts = [base, base + [2] * 13]
        if self.options.continuous_batching:
            prompts += [[3 + i % (c.vocab_size - 4)] * 5 for i in range(self.options.max_batch)]
        ids = [self.add_request(p, sampling=SamplingParams(max_tokens=3), request_id=("warmup", i))
               for i, p in enumerate(prompts)]
        self.run()
        for rid in ids:
            del self.sequences[rid]
        self.steps, self.step_times = 0, []
        _sync(self.device)

    # ---- measurements --------------------------------------------------------------------------
    def kv_bytes(self) -> int:
        """Bytes of the KV pool (K, V, index keys, FP8 scales), allocated whole at construction."""
        return self.cache.nbytes

    def weight_bytes(self) -> int:
        """Bytes of the weights this engine serves with: the model's, the experts counted in FP8
        (weights and scales) when ``expert_dtype`` is set."""
        total = sum(p.nbytes for p in self.model.parameters())
        if self.expert_fp8:
            total += self.model.expert_bytes(fp8=True) - self.model.expert_bytes()
        return total
