"""Bench suite ``engine``: what one engine step costs on each day -- the prices a simulated clock charges.

A day's step price (:class:`~minimax_lab.engine.clock.StepCost`: a fixed cost, per decoding
sequence, per prompt token, per million context tokens a decode row reads, per million query-key
pairs a prompt chunk computes) comes from one of three places, and every sweep says which
(:class:`Prices`):

* **measured** (:func:`measure_prices`, the ``prices`` case): the day's own engine times decode
  steps of each of ``batches`` sequences at each of ``contexts`` tokens (forks of one prompt, so
  they share its pages), and prompts prefilled as the day prefills them (whole, or in chunks of
  its step budget), on the wall clock. A day without continuous batching still decodes the
  batches here: its kernels are what is priced, not its scheduler. The engine serves it all once
  untimed first (the *first call*: compiling, graph capture), then ``repeats`` times, each pass
  with prompts of its own and fitted to a price of its own.
* **recorded** (:func:`recorded_prices`): the measured prices of a GPU run, from its ``step_cost``
  records, with the device and versions they were measured on.
* **modelled** (:func:`modelled_prices`), until a GPU run has recorded them: a model of the
  GPU-size model's steps built from the H200's recorded day-by-day times. A decode step reads its
  bytes (:func:`~minimax_lab.engine.traffic.decode_step_bytes`) at one bandwidth after one fixed
  cost, both fitted to the recorded decode times of the days that run the same kernels (one
  sequence, or the chat's and agent's few, at their contexts; 32 sequences at 131k tokens); a
  prompt computes its FLOPs (:func:`~minimax_lab.engine.traffic.prefill_flops`) at the rate the
  recorded 131k-token first turns reached. Days that change only the scheduler (prefix caching,
  continuous batching) run their kernels' day's price: what they buy is left to the scheduler.
"""
from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field

import numpy as np
import torch

from minimax_lab import measure, runtime
from minimax_lab.engine.clock import StepCost, StepShape, chunk_pairs
from minimax_lab.engine.config import GPU, M3Config
from minimax_lab.engine.model_m3 import M3Model
from minimax_lab.engine.options import DAYS, day_options
from minimax_lab.engine.sampling import SamplingParams
from minimax_lab.engine.traffic import decode_step_bytes, prefill_flops
from minimax_lab.bench.suite_kvcache_tiers import measure_host_device_bandwidth
from minimax_lab.bench.suite_engine_days import (SUITE, _base_extra, _engine, _free, _impl, _options, _record,
                                                 _rehearses)

#: the device whose recorded day-by-day times :func:`modelled_prices` models
MODEL_DEVICE = "NVIDIA H200"
#: FP8 stores switched on alone on top of day 6, priced beside the FP8 day (``fp8_choice`` compares them)
VARIANTS = {"fp8_kv": {"kv_dtype": "fp8_e4m3"}, "fp8_experts": {"expert_dtype": "fp8_e4m3"}}


@dataclass
class Prices:
    """Step prices of the days: ``by_day[day]`` one :class:`StepCost` per repeat; ``variants``
    the same for the FP8 stores alone (:data:`VARIANTS`). ``kind`` is ``"measured"`` (this run),
    ``"recorded"`` or ``"modelled"``; ``device`` and ``versions`` say where they come from; ``cfg``
    is the model they price."""

    by_day: dict
    kind: str
    device: str
    versions: str
    cfg: M3Config = GPU
    variants: dict = field(default_factory=dict)

    def label(self) -> str:
        """What priced the steps, in a few words, device and versions included."""
        what = {"modelled": f"a model of {self.device} steps (fitted to its recorded day-by-day times)",
                "recorded": f"each day's steps measured on the {self.device}",
                "measured": f"each day's steps measured now on the {self.device}"}[self.kind]
        return f"{what}, {self.versions}" if self.versions else what

    def repeats(self) -> int:
        return max((len(v) for v in self.by_day.values()), default=0)


def versions_of(info: dict) -> str:
    """``"torch 2.11, Triton 3.6"`` from a record (or :func:`runtime.describe`)."""
    t, tr = str(info.get("torch", "?")).split("+")[0], info.get("triton", "?")
    return f"torch {'.'.join(t.split('.')[:2])}, Triton {'.'.join(str(tr).split('.')[:2])}"


# ----------------------------------------------------------------------------------------- measured


def host_bandwidth_gbps(device) -> float:
    """The measured bandwidth of copying pages to and from the host: pinned host <-> GPU on a GPU,
    a host memory copy (read + write) on the CPU."""
    if device.type == "cuda":
        bw = measure_host_device_bandwidth(device=device)
        return min(bw["h2d_pinned"], bw["d2h_pinned"])
    src = torch.randn(16 * 2**20)
    dst = torch.empty_like(src)
    t = measure.time_fn(lambda a, b: b.copy_(a), inputs={"a": src, "b": dst}, reps=10, rotate=False)
    return src.nbytes / (t.ms * 1e-3) / 1e9


def fit_load_steps(step_times: list, *, host_gbps: float | None = None, source: str = "") -> StepCost:
    """The :class:`StepCost` that fits an engine's measured ``step_times`` (a wall-clock load sweep's)."""
    return StepCost.fit([(st.shape, st.seconds * 1e3) for st in step_times], host_gbps=host_gbps, source=source)


def _price_options(model: M3Model, day: int, sizes: dict, **overrides):
    """``day``'s kernels, scheduled so that ``batches`` sequences decode in one step."""
    w = sizes["prices"]
    opts = _options(model, day, sizes, **overrides)
    if not opts.continuous_batching:
        return dataclasses.replace(opts, continuous_batching=True, step_tokens=None, max_batch=max(w["batches"]))
    return dataclasses.replace(opts, max_batch=max(opts.max_batch, max(w["batches"])))


def _prompt(cfg: M3Config, n: int, key: int) -> list[int]:
    rng = np.random.default_rng([key, n])
    return rng.integers(0, cfg.vocab_size - 1, n).tolist()


def _kv_tokens(cfg: M3Config, w: dict) -> int:
    steps = len(w["batches"]) * w["decode_steps"] + 1
    return (sum(w["contexts"]) + sum(w["prompts"]) + max(w["batches"]) * (steps + 2 * cfg.block_size)
            + 8 * cfg.block_size)


def _one_pass(eng, w: dict, key: int) -> dict:
    """Serve the price workload once on ``eng`` (module docstring): ``{"samples": [(shape, ms)],
    "decode_ms": {"<context>x<batch>": median ms}}``."""
    cfg = eng.cfg
    samples, decode = [], {}
    steps = w["decode_steps"]

    def prefill(n: int, max_tokens: int):
        rid = eng.add_request(_prompt(cfg, n, key), sampling=SamplingParams(max_tokens=max_tokens),
                              request_id=("price", key, n))
        seq, n0 = eng.sequences[rid], len(eng.step_times)
        while seq.first_token is None:
            eng.step()
        samples.extend((st.shape, st.seconds * 1e3) for st in eng.step_times[n0:])
        return rid

    for n in w["prompts"]:
        prefill(n, 1)
    for context in w["contexts"]:
        rid = prefill(context, 1 + len(w["batches"]) * steps)
        live = 1
        for batch in w["batches"]:
            while live < batch:
                eng.fork(rid, ("price", key, context, live))
                live += 1
            n0 = len(eng.step_times)
            for _ in range(steps):
                eng.step()
            phase = eng.step_times[n0:]
            ms = statistics.median(st.seconds * 1e3 for st in phase)
            samples.append((phase[len(phase) // 2].shape, ms))
            decode[f"{context}x{batch}"] = ms
        eng.run()
    return {"samples": samples, "decode_ms": decode}


def _shape_row(shape: StepShape, ms: float) -> list:
    return [shape.decodes, shape.prefill_tokens, shape.attended, shape.prefill_pairs, round(ms, 5)]


def measure_prices(model: M3Model, day: int, sizes: dict, *, repeats: int = 3, rehearse: bool | None = None,
                   host_gbps: float | None = None, variant: str | None = None) -> list[dict]:
    """The ``prices`` case on one day (module docstring), or on one of :data:`VARIANTS` (the FP8
    store alone on top of day 6): one ``step_cost`` record whose ``ms`` is the median over the
    repeats of the decode step at the largest context and batch, with per repeat its fitted price
    (``step_costs``), its median decode steps (``decode_ms``) and its samples, and the untimed first
    pass's decode steps as ``first_call_decode_ms``."""
    w = sizes["prices"]
    overrides = VARIANTS[variant] if variant else {}
    eng = _engine(model, 6 if variant else day, sizes, kv_tokens=_kv_tokens(model.cfg, w), record_logits=False,
                  options=_price_options(model, 6 if variant else day, sizes, **overrides))
    first = _one_pass(eng, w, key=1000 + day) if _rehearses(model, rehearse) else None
    host_gbps = host_bandwidth_gbps(eng.device) if host_gbps is None else host_gbps
    source = f"{runtime.device_name()}: day {day}'s steps" + (f" ({variant})" if variant else "")
    runs = []
    for r in range(repeats):
        eng.blocks.evict(len(eng.blocks.policy))           # each pass starts from an empty prefix cache
        one = _one_pass(eng, w, key=r)
        cost = StepCost.fit(one["samples"], host_gbps=host_gbps, source=source)
        runs.append({"step_cost": cost.to_dict(), "decode_ms": one["decode_ms"],
                     "samples": [_shape_row(s, ms) for s, ms in one["samples"]]})
    top = f"{max(w['contexts'])}x{max(w['batches'])}"
    tops = [run["decode_ms"][top] for run in runs]
    extra = {**_base_extra(model, day, eng, w, first is not None), "options": eng.options.to_dict(),
             "variant": variant, "repeats": runs, "step_costs": [run["step_cost"] for run in runs],
             "decode_context": max(w["contexts"]), "decode_batch": max(w["batches"]),
             "decode_tok_s": max(w["batches"]) / (statistics.median(tops) * 1e-3),
             "decode_tok_s_repeats": [max(w["batches"]) / (t * 1e-3) for t in tops], "host_gbps": host_gbps}
    if first is not None:
        extra["first_call_decode_ms"] = first["decode_ms"]
        extra["first_call_prefill_ms"] = [round(ms, 5) for s, ms in first["samples"] if not s.decodes]
    dev = eng.device
    del eng
    _free(dev)
    return _record("step_cost", _impl(day, f"_{variant}" if variant else ""), statistics.median(tops), extra,
                   model.cfg.torch_dtype)


def prices_from_records(records: list, *, kind: str = "measured", cfg: M3Config = GPU) -> Prices | None:
    """:class:`Prices` from ``step_cost`` records (those of this run, or recorded ones of one device);
    None when there are none."""
    recs = [r for r in records if r.get("suite") == SUITE and r.get("case") == "step_cost" and r.get("step_costs")]
    if not recs:
        return None
    by_day, variants = {}, {}
    for r in recs:
        costs = [StepCost.from_dict({**c, "source": c.get("source") or f"{r.get('device')}: day {r['day']}'s steps"})
                 for c in r["step_costs"]]
        (variants.setdefault(r["variant"], []) if r.get("variant") else by_day.setdefault(r["day"], [])).extend(costs)
    return Prices(by_day, kind, recs[0].get("device", "?"), versions_of(recs[0]), cfg, variants)


def recorded_prices() -> Prices | None:
    """The measured prices of the recorded GPU run with the most days priced (the newest on a
    tie), or None where no run recorded any (:func:`minimax_lab.measure.load_records`)."""
    by_device: dict = {}
    for r in measure.load_records(None, suite=SUITE):
        if r.get("case") == "step_cost" and r.get("step_costs") and not r.get("interpreter"):
            by_device.setdefault(r.get("device"), []).append(r)
    if not by_device:
        return None
    best = max(by_device.values(), key=lambda rs: (len({r["day"] for r in rs}), max(r.get("when", "") for r in rs)))
    return prices_from_records(best, kind="recorded")


# ----------------------------------------------------------------------------------------- modelled


def _decode_points(recs: dict, cfg: M3Config) -> list:
    """``(batch, context, ms)`` of one day's recorded decode steps (module docstring)."""
    out = []
    for case, field_ in (("chat.e2e", "users"), ("agent.e2e", "sessions")):
        r = recs.get(case)
        if not r or not r.get("itl_p50_ms") or not r.get("prompt_tokens"):
            continue
        w = r.get("workload") or {}
        turns = max(1, w.get(field_, 1) * w.get("turns", 1))
        batching = (r.get("options") or {}).get("continuous_batching")
        batch = 1
        if batching and r.get("decode_tok_s"):          # tokens per second x one step's time: sequences per step
            batch = int(min(w.get(field_, 1), max(1, round(r["decode_tok_s"] * r["itl_p50_ms"] / 1e3))))
        out.append((batch, r["prompt_tokens"] / turns + w.get("max_tokens", 0) / 2, r["itl_p50_ms"]))
    for case in ("agent_long.decode", "agent_long.decode_b32"):
        r = recs.get(case)
        if r and r.get("decode_batch"):
            w = r.get("workload") or {}
            out.append((r["decode_batch"], w.get("context_tokens", 0) + w.get("max_tokens", 0) / 2, r["ms"]))
            break
    return out


def _kernel_key(options: dict) -> tuple:
    """What a day's kernels are (days that change only the scheduler share it)."""
    return tuple(options.get(k) for k in ("msa_impl", "moe_impl", "paged_impl", "cuda_graphs", "kv_dtype",
                                          "expert_dtype"))


def _first_turn(r: dict, launch_ms: float, cfg: M3Config) -> tuple:
    """``(ms per FLOP, chunked)`` of a recorded first turn: its time, less one launch per step, over
    its FLOPs."""
    opts = r.get("options") or {}
    n = (r.get("workload") or {}).get("context_tokens") or 131_072
    chunked = bool(opts.get("continuous_batching") and opts.get("step_tokens"))
    steps = -(-n // opts["step_tokens"]) if chunked else 1
    flops = prefill_flops(cfg, tokens=n, pairs=chunk_pairs(0, n))["total"]
    return max(r["ms"] - steps * launch_ms, 1e-3) / flops, chunked


def modelled_prices(records: list | None = None) -> Prices | None:
    """The model of the GPU-size model's step prices (module docstring) from ``records`` (default:
    the recorded :data:`MODEL_DEVICE` engine records); None where they hold too little.

    Days that run the same kernels (a scheduling switch changes none) share one price, fitted to
    all their decode records. The prompt rate comes from the first turns prefilled whole; a kernel
    set whose days recorded only first turns prefilled in chunks takes the rate of the set before it,
    scaled by how the two compare prefilled the same way."""
    cfg = GPU
    recs = measure.load_records(MODEL_DEVICE, suite=SUITE) if records is None else records
    per_day: dict = {}
    for r in recs:
        if r.get("suite") == SUITE and isinstance(r.get("day"), int) and r.get("impl") == _impl(r["day"]):
            per_day.setdefault(r["day"], {})[r["case"]] = r
    groups: dict = {}
    for day in sorted(per_day):
        opts = next((r["options"] for r in per_day[day].values() if r.get("options")), day_options(day).to_dict())
        groups.setdefault(_kernel_key(opts), []).append(day)
    by_day, rates = {}, {}          # rates: day -> (ms per FLOP, chunked)
    for key, days in groups.items():
        kv, ex = key[4], key[5]
        points = [p for d in days for p in _decode_points(per_day[d], cfg)]
        if len(points) < 2:
            continue
        nbytes = lambda b, c: decode_step_bytes(cfg, batch=b, context=max(1, int(c)), kv_dtype=kv,  # noqa: E731
                                                expert_dtype=ex)["total"]
        X = np.array([[1.0, nbytes(b, c)] for b, c, _ in points])
        launch, ms_per_byte = (float(v) for v in np.linalg.lstsq(X, np.array([ms for *_, ms in points]), rcond=None)[0])
        if not ms_per_byte > 0:
            continue
        launch = max(launch, 0.0)
        for d in days:
            if per_day[d].get("agent_long.ttft_first"):
                rates[d] = _first_turn(per_day[d]["agent_long.ttft_first"], launch, cfg)
        whole = [rates[d][0] for d in days if d in rates and not rates[d][1]]
        if whole:
            ms_per_flop = float(np.median(whole))
        else:                        # only chunked first turns: relative to the last earlier chunked day
            mine = [rates[d][0] for d in days if d in rates]
            before = [d for d in sorted(rates) if d < min(days) and rates[d][1]]
            ref = next((by_day[d][0] for d in reversed(before) if d in by_day), None)
            if not mine or ref is None:
                continue
            ms_per_flop = ref.prefill_token_ms / prefill_flops(cfg, tokens=1, pairs=0)["per_token"]
            ms_per_flop *= mine[0] / rates[before[-1]][0]
        base = nbytes(1, 1)
        flops = prefill_flops(cfg, tokens=1, pairs=1)
        cost = StepCost(fixed_ms=launch + base * ms_per_byte, decode_ms=(nbytes(32, 1) - base) / 31 * ms_per_byte,
                        prefill_token_ms=flops["per_token"] * ms_per_flop,
                        attend_ms_per_mpair=(nbytes(1, 1_000_001) - base) * ms_per_byte,
                        prefill_attend_ms_per_mpair=flops["per_pair"] * 1e6 * ms_per_flop)
        for d in days:
            by_day[d] = [dataclasses.replace(cost, source=f"model of {MODEL_DEVICE} steps, day {d}")]
    if not by_day:
        return None
    host = [r["gbps"] for r in measure.load_records(MODEL_DEVICE, suite="kvcache")
            if r.get("case") in ("h2d_pinned", "d2h_pinned") and r.get("gbps")] if records is None else []
    if host:                          # swaps priced at the recorded pinned host link
        by_day = {d: [dataclasses.replace(c, host_gbps=min(host)) for c in cs] for d, cs in by_day.items()}
    sample = next(r for d in per_day.values() for r in d.values())
    return Prices(dict(sorted(by_day.items())), "modelled", MODEL_DEVICE, versions_of(sample), cfg)


def gpu_prices() -> Prices | None:
    """The prices of the GPU-size model's days a simulated sweep uses: recorded where a GPU run
    recorded them, else modelled (module docstring)."""
    return recorded_prices() or modelled_prices()


def one_at_a_time_rate(cost: StepCost, arrivals: list) -> float:
    """Requests per second one-at-a-time serving sustains at ``cost``: one over a request's mean
    time alone (its prompt in one step, then a decode step per further token)."""
    total = 0.0
    for a in arrivals:
        n = len(a.prompt)
        pairs = chunk_pairs(0, n)
        t = cost.ms(StepShape(prefill_tokens=n, attended=pairs, prefill_pairs=pairs))
        t += sum(cost.ms(StepShape(decodes=1, attended=n + i)) for i in range(1, a.max_tokens))
        total += t
    return len(arrivals) / (total / 1e3)
