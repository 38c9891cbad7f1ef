"""The engine's switches, and the days that turn them on one by one.

Day 0 is about being correct: every operator in its plain PyTorch implementation, eager, no
prefix cache, one request at a time. Each later day flips one switch and keeps the earlier ones
(:data:`DAYS`, :func:`day_options`):

====  =======================  ================================================================
day   switch                   what changes
====  =======================  ================================================================
0     ``day0``                 ``impl="torch"`` everywhere: MSA (gather-based), MoE (sorted
                               tokens + grouped GEMM), paged attention (gather + SDPA), KV writes
                               (``index_copy_``); eager; no prefix cache; no batching
1     ``triton_msa``           MSA prefill, index branch and paged sparse decode in Triton
2     ``fused_moe``            the fused Triton MoE kernels
3     ``paged_kernels``        Triton ``write_kv``, ``paged_prefill`` and ``paged_decode``
4     ``cuda_graphs``          decode steps replay a CUDA graph captured per batch-size bucket
5     ``prefix_caching``       full KV pages are named by content and reused across requests
6     ``continuous_batching``  requests join and leave the running batch at every step; long
                               prompts are prefilled in chunks beside the running decodes
7     ``fp8``                  "day 14": the KV cache (K, V and MSA's index keys) and the routed
                               experts' weights stored in FP8 (e4m3) with fp32 power-of-two
                               scales (:mod:`minimax_lab.fp8`): half the bytes per token and
                               per expert
====  =======================  ================================================================

The first column is the switch's place in :data:`DAYS` (``day_options(7)``); :data:`DAY_LABELS`
holds the story's calendar, where the first six switches take a day each and FP8 -- a quantizer,
FP8 paths in two kernels and a quality check against day 0 -- takes the second week, landing on
day 14.

``kv_dtype="fp8_e4m3"`` runs the paged kernels' FP8 path (``write_kv`` / ``paged_decode`` /
``paged_prefill`` / ``msa_decode_paged`` with ``k_scale``, ``v_scale``), ``expert_dtype="fp8_e4m3"``
the FP8 experts (:func:`minimax_lab.moe.experts.quantize_experts`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from minimax_lab.engine.scheduler import PREEMPTION_MODES
from minimax_lab.validate import IMPLS, check_choice, check_positive_int

MOE_IMPLS = ("reference", "loop", "torch", "triton")
#: the FP8 formats ``kv_dtype`` and ``expert_dtype`` take (e4m3: 4 exponent bits, 3 mantissa bits)
FP8_DTYPES = ("fp8_e4m3",)


@dataclass(frozen=True)
class EngineOptions:
    """How the engine computes and schedules; see the module docstring for the days.

    * ``msa_impl`` -- MSA selection, prefill and paged decode (``msa_select``, ``msa_attention``,
      ``msa_decode_paged``): ``"reference" | "torch" | "triton"``;
    * ``moe_impl`` -- the routed experts (``moe_experts``): ``"reference" | "loop" | "torch" | "triton"``;
    * ``paged_impl`` -- ``write_kv``, ``paged_prefill``, ``paged_decode`` (the dense layers):
      ``"reference" | "torch" | "triton"``;
    * ``cuda_graphs`` -- decode-only steps replay CUDA graphs (needs a CUDA device and
      ``impl="triton"`` for MSA, MoE and paged attention: the PyTorch paths read lengths back to
      the host, which a graph cannot do);
    * ``prefix_caching`` -- reuse KV pages of equal prefixes (``BlockManager(prefix_caching=True)``);
    * ``continuous_batching`` -- up to ``max_batch`` requests in flight; each step decodes all of
      them and fills the rest of ``step_tokens`` with prompt chunks (chunked prefill). Off: one
      request at a time, its prompt prefilled whole;
    * ``max_batch`` -- the most sequences decoding at once (and the largest CUDA graph);
    * ``step_tokens`` -- the token budget of one step (decodes + prompt chunks: chunked prefill);
      ``None`` = no limit (whole prompts). With continuous batching it must exceed ``max_batch``;
    * ``kv_dtype`` -- ``None`` (the model's dtype) or ``"fp8_e4m3"``: K and V pages stored in FP8
      with an fp32 scale per token and head, MSA's index keys with one per token;
    * ``expert_dtype`` -- ``None`` or ``"fp8_e4m3"``: the routed experts' weights in FP8 with an fp32
      scale per output channel (quantized once per model, :meth:`M3Model.quantize_experts`);
    * ``preemption`` -- ``None``: admission reserves every page a request's ``max_tokens`` will
      need; ``"recompute"`` / ``"swap"``: admission takes only the prompt's pages, and when the
      pool runs out the newest decoding sequence is preempted, its K/V recomputed later or its
      pages swapped to host memory and back (:mod:`minimax_lab.engine.scheduler`). Not a day's
      switch: the load sweep compares the three.

    Raises ``TypeError``/``ValueError`` for a wrong type or value, ``NotImplementedError`` for an
    FP8 option whose kernels this installation lacks.
    """

    msa_impl: str = "torch"
    moe_impl: str = "torch"
    paged_impl: str = "torch"
    cuda_graphs: bool = False
    prefix_caching: bool = False
    continuous_batching: bool = False
    max_batch: int = 32
    step_tokens: int | None = None
    kv_dtype: str | None = None
    expert_dtype: str | None = None
    preemption: str | None = None

    def __post_init__(self):
        check_choice(self.msa_impl, "msa_impl", IMPLS)
        check_choice(self.moe_impl, "moe_impl", MOE_IMPLS)
        check_choice(self.paged_impl, "paged_impl", IMPLS)
        for name in ("cuda_graphs", "prefix_caching", "continuous_batching"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        check_positive_int(self.max_batch, "max_batch")
        if self.step_tokens is not None:
            check_positive_int(self.step_tokens, "step_tokens")
            if self.continuous_batching and self.step_tokens <= self.max_batch:
                raise ValueError(f"step_tokens ({self.step_tokens}) must exceed max_batch ({self.max_batch}): "
                                 f"every step decodes up to max_batch tokens and needs room for a prompt chunk")
        if self.cuda_graphs:
            slow = {n: getattr(self, n) for n in ("msa_impl", "moe_impl", "paged_impl") if getattr(self, n) != "triton"}
            if slow:
                raise ValueError(f"cuda_graphs=True needs impl='triton' for msa, moe and paged attention (the PyTorch "
                                 f"paths read lengths back to the host, which a CUDA graph cannot), got {slow}")
        if self.preemption not in PREEMPTION_MODES:
            raise ValueError(f"preemption must be one of {PREEMPTION_MODES}, got {self.preemption!r}")
        for name in ("kv_dtype", "expert_dtype"):
            value = getattr(self, name)
            if value is None:
                continue
            if value not in FP8_DTYPES:
                raise ValueError(f"{name} must be None (the model's dtype) or one of {FP8_DTYPES}, got {value!r}")

    def to_dict(self) -> dict:
        return asdict(self)


#: The waterfall: (name, the switch it flips), in order; each day keeps the earlier switches.
DAYS: tuple = (
    ("day0", {}),
    ("triton_msa", {"msa_impl": "triton"}),
    ("fused_moe", {"moe_impl": "triton"}),
    ("paged_kernels", {"paged_impl": "triton"}),
    ("cuda_graphs", {"cuda_graphs": True}),
    ("prefix_caching", {"prefix_caching": True}),
    ("continuous_batching", {"continuous_batching": True}),
    ("fp8", {"kv_dtype": "fp8_e4m3", "expert_dtype": "fp8_e4m3"}),
)
DAY_NAMES = tuple(name for name, _ in DAYS)
#: The story's calendar, one label per entry of :data:`DAYS` (for tables and plots).
DAY_LABELS: tuple = (
    "day 0: correct (PyTorch)",
    "day 1: Triton MSA",
    "day 2: fused MoE",
    "day 3: paged kernels",
    "day 4: CUDA graphs",
    "day 5: prefix caching",
    "day 6: continuous batching",
    "day 14: FP8 KV cache + FP8 experts",
)


#: the stores the FP8 day may put in FP8, and the option each sets
FP8_STORES = {"kv": "kv_dtype", "experts": "expert_dtype"}


def fp8_choice(times: dict, *, pool_fills: bool = False) -> dict:
    """The FP8 day's stores: only those that pay. ``times`` maps a candidate -- a tuple of
    :data:`FP8_STORES` keys in FP8, ``()`` for none (day 6) -- to the time the workload's steps
    take with it; the fastest candidate wins (a candidate ``times`` lacks is not one). With
    ``pool_fills`` (the workload's KV does not fit the pool in the model's dtype) FP8 KV pays by the
    tokens it makes room for, whatever its steps cost: only candidates with ``"kv"`` compete.
    Returns the options to set, e.g. ``{"kv_dtype": "fp8_e4m3", "expert_dtype": None}``; raises
    ``ValueError`` for no candidate or an unknown store."""
    for cand in times:
        if not isinstance(cand, tuple) or any(c not in FP8_STORES for c in cand):
            raise ValueError(f"a candidate is a tuple of {tuple(FP8_STORES)}, got {cand!r}")
    pool = {c: t for c, t in times.items() if "kv" in c} if pool_fills else dict(times)
    if not pool:
        raise ValueError(f"no candidate to choose from (times {times!r}, pool_fills={pool_fills})")
    best = min(pool, key=lambda c: (pool[c], len(c)))      # a tie keeps the model's own dtype
    return {opt: ("fp8_e4m3" if store in best else None) for store, opt in FP8_STORES.items()}


def day_index(day) -> int:
    """The day's number from its number or name; raises ``ValueError`` for anything else."""
    if isinstance(day, str):
        check_choice(day, "day", DAY_NAMES)
        return DAY_NAMES.index(day)
    if isinstance(day, bool) or not isinstance(day, int) or not 0 <= day < len(DAYS):
        raise ValueError(f"day must be a name in {DAY_NAMES} or a number in [0, {len(DAYS)}), got {day!r}")
    return day


def day_options(day, *, cuda_graphs_available: bool = True, **overrides) -> EngineOptions:
    """The options of ``day`` (a number or a name): every switch up to it turned on.
    ``cuda_graphs_available=False`` (no CUDA device) leaves the graph switch off; ``overrides``
    (e.g. ``max_batch``, ``step_tokens``) apply last."""
    n = day_index(day)
    switches = {}
    for _, flips in DAYS[:n + 1]:
        switches.update(flips)
    if not cuda_graphs_available:
        switches["cuda_graphs"] = False
    return replace(EngineOptions(), **{**switches, **overrides})
