"""FP8 against bf16 on one GPU, in one command: paged decode (every FP8 variant checked, then timed
beside bf16), the FP8 experts at the engine's decode sizes, FP8 prefill and MSA's FP8 K/V decode.

    python tools/fp8_decode_sweep.py --out results/fp8_sweep_H200.jsonl              # ~6 min on an H200
    python tools/fp8_decode_sweep.py --out sweep.jsonl --budget-s 300 --parts decode moe
    python tools/fp8_decode_sweep.py --cpu-smoke --out /tmp/smoke.jsonl             # toy sizes, any device

What runs, in order, each part checked before it is timed (in this process, on this GPU):

1. **ceilings** -- :func:`minimax_lab.measure.ceilings` (device-to-device copy GB/s, read + write).
2. **decode** -- ``paged_decode(impl="triton")`` at B=32, 128k context, 32 query / 8 kv heads,
   D=128, page 16: the bf16 cache, then every FP8 config of :data:`DECODE_CONFIGS` with per-token
   scales, the three fastest also with per-page scales and with other split counts, the
   engine's layout (64 query / 4 kv heads, page 128) with the default and the best config.
   Before any timing each FP8 config is checked against the fp32 reference on the same stored
   values (ragged tables, lengths 1 to 5,000, both scale layouts, and bf16 queries past fp16's
   range on small keys). One input set per variant: at 128k it is GBs, far past the L2.
3. **moe** -- ``moe_experts(impl="triton")`` at the engine's shape (E=128, k=8, d=2048, f=768),
   T = 1, 2, 4, 16, 64: bf16 weights against FP8 (the default: quantization inside the GEMMs at
   these sizes) and FP8 with separate quantization launches, each checked against its
   reference, then timed by CUDA-graph replay over 16 rotated routings (all experts touched).
4. **prefill** -- ``paged_prefill`` (B=2, 2,048 new tokens over an 8k prefix): bf16 against FP8
   (both layouts), checked on ragged prefixes and new-token counts first.
5. **msa** -- MSA's sparse decode with bf16 against FP8 K/V pages at B=32, 128k
   (:func:`minimax_lab.bench.suite_msa_fp8kv.run_decode_fp8kv`: its own check first).
6. **decode_b64** -- part 2's bf16, default and best FP8 at B=64, if time is left.

``--budget-s`` (default 420): before each step the tool estimates it and skips what would run past
the budget (a ``skipped`` line says so); every result is appended to ``--out`` (JSON lines) as
soon as it exists, so a run cut short keeps what it measured. Exit status 0 unless a check failed
or a part raised (it is written down and the other parts still run).

Printed columns (and the JSON keys): ``ms`` -- median time (CUDA events around each call;
``graph``: per call in a replayed CUDA graph); ``GB/s`` -- the bytes the variant must read
(decode: K and V at their width, their scales, the block table; experts: the used experts'
weights and scales, x and the output) over that time; ``%copy`` -- that rate against the copy
ceiling of step 1; ``x bf16`` -- bf16's time over this one (> 1: faster than bf16), in the same
process; ``err`` -- the check's largest relative error against the fp32 reference. The last lines
suggest the fastest per-token config as the ``paged_decode_fp8`` entry of the GPU's config file.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from minimax_lab import configs, measure, runtime  # noqa: E402  (the repository root first)
from minimax_lab.attention.msa import MSA_SHAPE, MSA_SHAPE_CPU  # noqa: E402
from minimax_lab.bench import suite_kvcache as kv  # noqa: E402
from minimax_lab.bench import suite_moe, suite_msa_fp8kv  # noqa: E402
from minimax_lab.paged_kv import decode_triton  # noqa: E402
from minimax_lab.paged_kv.decode import paged_decode  # noqa: E402
from minimax_lab.paged_kv.decode_reference import paged_decode_reference  # noqa: E402
from minimax_lab.paged_kv.prefill import paged_prefill  # noqa: E402
from minimax_lab.paged_kv.prefill_reference import paged_prefill_reference  # noqa: E402
from minimax_lab.moe import moe_experts  # noqa: E402
from minimax_lab.moe.experts import quantize_experts  # noqa: E402
from minimax_lab.moe.experts_reference import experts_fp8_reference, experts_reference  # noqa: E402

PARTS = ("decode", "moe", "prefill", "msa", "decode_b64")

GPU = dict(
    decode=dict(B=32, L=131072, Hq=32, Hkv=8, D=128, page=16),
    engine=dict(B=32, L=131072, Hq=64, Hkv=4, D=128, page=128),
    b64=dict(B=64, L=131072, Hq=32, Hkv=8, D=128, page=16),
    check=dict(B=7, L=5000, Hq=32, Hkv=8, D=128, page=16),
    moe=dict(E=128, k=8, d=2048, f=768), moe_tokens=(1, 2, 4, 16, 64),
    prefill=dict(B=2, prefix=8192, S=2048, Hq=32, Hkv=8, D=128, page=16),
    msa=(32, 131072), reps=20,
)
CPU = dict(
    decode=dict(B=2, L=64, Hq=4, Hkv=2, D=16, page=16),
    engine=dict(B=2, L=64, Hq=8, Hkv=1, D=16, page=32),
    b64=dict(B=3, L=64, Hq=4, Hkv=2, D=16, page=16),
    check=dict(B=3, L=40, Hq=4, Hkv=2, D=16, page=16),
    moe=dict(E=4, k=2, d=32, f=32), moe_tokens=(2,),
    prefill=dict(B=1, prefix=20, S=16, Hq=4, Hkv=2, D=16, page=16),
    msa=(1, 2 * MSA_SHAPE_CPU["Bk"] * MSA_SHAPE_CPU["topk"]), reps=3,
)

#: FP8 decode configs (op ``paged_decode_fp8``): (BLOCK_N, num_warps, num_stages, programs_per_sm, GATHER)
DECODE_CONFIGS = [(64, 4, 2, 2, "token"), (64, 4, 3, 2, "token"), (64, 4, 2, 2, "page"), (64, 4, 3, 2, "page"),
                  (128, 4, 2, 2, "token"), (128, 4, 3, 2, "token"), (128, 8, 2, 2, "token"), (128, 8, 3, 2, "token"),
                  (128, 4, 2, 2, "page"), (128, 4, 3, 2, "page"), (128, 8, 2, 2, "page"), (128, 8, 3, 2, "page"),
                  (128, 4, 2, 1, "page"), (128, 4, 2, 3, "page"), (128, 4, 2, 4, "page"), (128, 4, 4, 2, "page"),
                  (256, 8, 2, 2, "page"), (256, 4, 2, 2, "page"), (256, 8, 2, 1, "page"), (32, 4, 3, 2, "token")]
CPU_DECODE_CONFIGS = [(16, 1, 1, 2, "token"), (32, 1, 1, 2, "page")]
#: split counts tried for the fastest config (B * Hkv programs per split; 0: the heuristic's)
SPLITS = (1, 2, 3, 4, 8)
#: rough seconds of each step on an H200 (compiles included), for the budget
ESTIMATE_S = dict(ceilings=8, setup=25, check=6, time=2, moe_T=14, prefill=30, msa=45, b64_setup=45)


def as_config(c) -> dict:
    n, w, s, p, gather = c
    return dict(BLOCK_N=n, num_warps=w, num_stages=s, programs_per_sm=p, GATHER=gather)


def label(cfg: dict) -> str:
    return f"{cfg['BLOCK_N']}/{cfg['num_warps']}w/{cfg['num_stages']}s/{cfg['programs_per_sm']}pps/{cfg['GATHER']}"


class Run:
    """The budget, the sink and the table of one run."""

    def __init__(self, out: Path, budget_s: float, smoke: bool):
        self.out, self.budget_s, self.smoke, self.t0 = out, budget_s, smoke, time.perf_counter()
        self.table: list[tuple] = []
        self.failed: list[str] = []
        self.meta = dict(device=runtime.device_name(), torch=torch.__version__, triton=_triton_version(),
                         commit=_commit(), smoke=smoke)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def fits(self, what: str, estimate_s: float) -> bool:
        """Whether ``estimate_s`` more seconds stay within the budget; writes a ``skipped`` line if not."""
        if self.elapsed() + estimate_s <= self.budget_s:
            return True
        self.write(dict(part="skipped", what=what, estimate_s=estimate_s, elapsed_s=round(self.elapsed(), 1)))
        print(f"[skip] {what}: ~{estimate_s:.0f} s would pass the budget ({self.elapsed():.0f}/{self.budget_s:.0f} s)",
              flush=True)
        return False

    def write(self, rec: dict) -> None:
        with self.out.open("a") as f:
            f.write(json.dumps({**rec, **self.meta, "t_s": round(self.elapsed(), 2)}, default=str) + "\n")

    def row(self, part, case, variant, ms, gbps=None, pct=None, vs=None, err=None):
        self.table.append((part, case, variant, ms, gbps, pct, vs, err))
        cells = [f"{ms:9.4f}", "" if gbps is None else f"{gbps:8.0f}", "" if pct is None else f"{pct:6.1f}",
                 "" if vs is None else f"{vs:6.2f}x", "" if err is None else f"{err:.1e}"]
        print(f"  {part:<8} {case:<22} {variant:<44} " + " ".join(f"{c:>9}" for c in cells), flush=True)


def _triton_version() -> str:
    import triton  # deferred: only its version, after minimax_lab chose the interpreter

    return triton.__version__


def _commit() -> str:
    if os.environ.get("MINIMAX_LAB_COMMIT"):
        return os.environ["MINIMAX_LAB_COMMIT"]
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# --------------------------------------------------------------------------- paged decode


def decode_bytes(c: dict, kind: str) -> float:
    """What a decode must read: K and V at their width, their scales, the block table."""
    n_tok = c["B"] * c["L"] * c["Hkv"]
    n_page = c["B"] * (-(-c["L"] // c["page"]))
    table = n_page * 4
    if kind == "plain":
        return 2.0 * n_tok * c["D"] * c["elem"] + table
    scales = 2.0 * (n_tok if kind == "token" else n_page * c["Hkv"]) * 4
    return 2.0 * n_tok * c["D"] + scales + table


def _adversarial_inputs(c: dict, dev, dtype, seed: int, layout: str) -> dict:
    """Ragged inputs whose queries lie past fp16's range (``3e5``) on keys scaled by ``2**-18``."""
    g = torch.Generator().manual_seed(seed)
    ins = kv.make_decode_inputs(c, dev, dtype, seed, kv.ragged_lengths(c["B"], c["L"], c["page"], g))
    ins["q"] = (ins["q"].float() * 3e5).to(dtype)
    ins["k_cache"], ins["k_scale"] = kv.quantize_cache(ins["k_cache"].float() * 2.0 ** -18, layout)
    ins["v_cache"], ins["v_scale"] = kv.quantize_cache(ins["v_cache"], layout)
    return ins


def _fp8_reference(q, k_cache, v_cache, block_table, seq_lens, k_scale, v_scale, **_):
    """The fp32 reference on the stored values (``measure.check`` hands it fp32 copies of the fp8 caches)."""
    ps = k_cache.shape[1]
    deq = lambda x, s: x * (s if s.ndim == 3 else s[:, None, :].expand(-1, ps, -1))[..., None]  # noqa: E731
    return paged_decode_reference(q, deq(k_cache, k_scale), deq(v_cache, v_scale), block_table, seq_lens)


def check_decode_config(run: Run, cfg: dict, dev, dtype, sizes: dict) -> float:
    """Both layouts, ragged random inputs and the adversarial ones: the largest relative error
    (raises ``AssertionError`` on a failed check)."""
    c = sizes["check"]
    worst = 0.0
    fn = lambda **kw: paged_decode(**kw, impl="triton", config=cfg)  # noqa: E731
    for layout in kv.FP8_LAYOUTS:
        makers = {"ragged": lambda seed, layout=layout: kv.make_fp8_decode_inputs(
                      c, dev, dtype, seed, layout, kv.ragged_lengths(c["B"], c["L"], c["page"],
                                                                     torch.Generator().manual_seed(seed))),
                  "queries_past_fp16": lambda seed, layout=layout: _adversarial_inputs(c, dev, dtype, seed, layout)}
        for kind, mk in makers.items():
            res = measure.check(fn, _fp8_reference, mk, name=f"fp8 decode {label(cfg)} {layout} {kind}", trials=1,
                                seed=11, reference_dtype=torch.float32)
            if not res.passed:
                raise AssertionError(res.summary())
            worst = max(worst, res.max_error)
    return worst


def _time(fn, ins, reps: int, graph: bool = False) -> measure.Timing:
    return measure.time_fn(fn, inputs=ins, reps=reps, warmup=3, rotate=False, cuda_graph=graph)


def run_decode(run: Run, dev, dtype, sizes: dict, copy_gbps: float, *, shape: str = "decode",
               configs_to_try=None, full: bool = True, checked: dict | None = None) -> dict | None:
    """Part 2 (and 6, ``full=False``: no split counts, only the fastest with per-page scales):
    ``checked``: ``{label: (config, error)}`` of configs checked before (not checked again).
    Returns ``{"best", "default", "best_ms", "bf16_ms", "checked"}`` for the later parts."""
    c = {**sizes[shape], "elem": torch.empty(0, dtype=dtype).element_size()}
    case = f"B{c['B']} L{c['L']} {c['Hq']}/{c['Hkv']} p{c['page']}"
    reps = sizes["reps"]
    default = configs.launch_config(decode_triton.FP8_LAUNCH)
    tries = [default] + [as_config(x) for x in (configs_to_try or [])]
    tries = [cfg for i, cfg in enumerate(tries) if cfg not in tries[:i]]
    # checks first: every config on both layouts
    checked = dict(checked or {})
    for cfg in tries:
        if label(cfg) in checked:
            continue
        if not run.fits(f"check {label(cfg)}", ESTIMATE_S["check"] * (0.2 if run.smoke else 1)):
            break
        try:
            checked[label(cfg)] = (cfg, check_decode_config(run, cfg, dev, dtype, sizes))
            run.write(dict(part="decode_check", case=case, config=cfg, max_rel_err=checked[label(cfg)][1]))
        except AssertionError as e:
            run.failed.append(f"decode check {label(cfg)}")
            run.write(dict(part="decode_check", case=case, config=cfg, failed=str(e)[:400]))
            print(f"[FAIL] {e}", flush=True)
        except Exception as e:  # noqa: BLE001 - a config that does not compile here: noted, the others go on
            run.write(dict(part="decode_check", case=case, config=cfg, error=f"{type(e).__name__}: {str(e)[:300]}"))
            print(f"[error] {label(cfg)}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    if not checked or not run.fits(f"decode inputs {case}", ESTIMATE_S["setup"] * (0.1 if run.smoke else 1)):
        return None
    plain = kv.make_decode_inputs(c, dev, dtype, 0)
    per_layout = {layout: {**plain, **dict(zip(("k_cache", "k_scale"), kv.quantize_cache(plain["k_cache"], layout))),
                           **dict(zip(("v_cache", "v_scale"), kv.quantize_cache(plain["v_cache"], layout)))}
                  for layout in kv.FP8_LAYOUTS}
    hot = lambda config=None, splits=None: lambda **kw: paged_decode(  # noqa: E731
        **kw, impl="triton", check_values=False, config=config, num_splits=splits)

    def record(variant, t, kind, *, cfg=None, splits=None, base_ms=None, err=None, graph=False):
        nbytes = decode_bytes(c, kind)
        gbps = nbytes / (t.ms * 1e-3) / 1e9
        pct = 100.0 * gbps / copy_gbps if copy_gbps else None
        vs = base_ms / t.ms if base_ms else None
        run.write(dict(part="decode", case=case, shape=c, variant=variant, scale_layout=kind, config=cfg,
                       num_splits=splits, ms=t.ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms, timing=t.method,
                       bytes=nbytes, gbps=gbps, pct_of_copy=pct, vs_bf16=vs, check_max_rel_err=err))
        run.row("decode", case, variant + (" graph" if graph else ""), t.ms, gbps, pct, vs, err)
        return t.ms

    bf16 = _time(hot(), plain, reps)
    base_ms = record("bf16" if dtype == torch.bfloat16 else str(dtype).replace("torch.", ""), bf16, "plain")
    results = {}
    for name in [label(cfg) for cfg in tries if label(cfg) in checked]:
        cfg, err = checked[name]
        if not run.fits(f"time {name}", ESTIMATE_S["time"]):
            break
        try:
            t = _time(hot(cfg), per_layout["token"], reps)
            results[name] = record(f"fp8 token {name}", t, "token", cfg=cfg, base_ms=base_ms, err=err)
        except Exception as e:  # noqa: BLE001
            run.write(dict(part="decode", case=case, config=cfg, error=f"{type(e).__name__}: {str(e)[:300]}"))
    if not results:
        return None
    ranked = sorted(results, key=results.get)
    for name in ranked[:3 if full and not run.smoke else 1]:  # the fastest with per-page scales too
        if run.fits(f"time {name} page", ESTIMATE_S["time"]):
            cfg, err = checked[name]
            record(f"fp8 page {name}", _time(hot(cfg), per_layout["page"], reps), "page", cfg=cfg, base_ms=base_ms,
                   err=err)
    best_cfg, best_err = checked[ranked[0]]
    auto = decode_triton.choose_num_splits(c["B"], c["Hkv"], c["L"], sms=decode_triton.sm_count(),
                                           block_n=best_cfg["BLOCK_N"], programs_per_sm=best_cfg["programs_per_sm"])
    for s in (SPLITS if full and not run.smoke else SPLITS[1:2] if full else ()):
        if s != auto and run.fits(f"splits {s}", ESTIMATE_S["time"]):
            record(f"fp8 token {ranked[0]} splits={s}", _time(hot(best_cfg, s), per_layout["token"], reps), "token",
                   cfg=best_cfg, splits=s, base_ms=base_ms, err=best_err)
    if dev.type == "cuda" and run.fits("graph replays", 3 * ESTIMATE_S["time"]):
        gb = _time(hot(), plain, reps, graph=True)
        record("bf16", gb, "plain", graph=True)
        for layout in kv.FP8_LAYOUTS:
            record(f"fp8 {layout} {ranked[0]}", _time(hot(best_cfg), per_layout[layout], reps, graph=True), layout,
                   cfg=best_cfg, base_ms=gb.ms, err=best_err, graph=True)
    del plain, per_layout
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {"best": best_cfg, "default": default, "best_ms": results[ranked[0]], "bf16_ms": base_ms,
            "checked": checked}


def run_engine_layout(run: Run, dev, dtype, sizes: dict, copy_gbps: float, picked: dict) -> None:
    """The engine's layout (64/4 heads, page 128: every tile inside one page), default and best config."""
    c = {**sizes["engine"], "elem": torch.empty(0, dtype=dtype).element_size()}
    case = f"B{c['B']} L{c['L']} {c['Hq']}/{c['Hkv']} p{c['page']}"
    if not run.fits(f"decode {case}", ESTIMATE_S["setup"] + 6 * ESTIMATE_S["time"]):
        return
    ins = kv.make_decode_inputs(c, dev, dtype, 1)
    t_plain = _time(lambda **kw: paged_decode(**kw, impl="triton", check_values=False), ins, sizes["reps"])
    nb = decode_bytes(c, "plain")
    run.row("decode", case, "bf16 (engine layout)", t_plain.ms, nb / t_plain.ms / 1e6,
            100 * nb / t_plain.ms / 1e6 / copy_gbps if copy_gbps else None)
    run.write(dict(part="decode", case=case, shape=c, variant="bf16", ms=t_plain.ms, bytes=nb, timing=t_plain.method))
    for layout in kv.FP8_LAYOUTS:
        q8 = {**ins, **dict(zip(("k_cache", "k_scale"), kv.quantize_cache(ins["k_cache"], layout))),
              **dict(zip(("v_cache", "v_scale"), kv.quantize_cache(ins["v_cache"], layout)))}
        for name, cfg in (("default", picked["default"]), ("best", picked["best"]))[1 if run.smoke else 0:]:
            t = _time(lambda **kw: paged_decode(**kw, impl="triton", check_values=False, config=cfg), q8, sizes["reps"])
            nb = decode_bytes(c, layout)
            gbps = nb / t.ms / 1e6
            run.row("decode", case, f"fp8 {layout} {name} {label(cfg)}", t.ms, gbps,
                    100 * gbps / copy_gbps if copy_gbps else None, t_plain.ms / t.ms)
            run.write(dict(part="decode", case=case, shape=c, variant=f"fp8 {layout} {name}", config=cfg, ms=t.ms,
                           bytes=nb, gbps=gbps, vs_bf16=t_plain.ms / t.ms, timing=t.method))
        del q8
    del ins
    if dev.type == "cuda":
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- MoE experts


def run_moe(run: Run, dev, dtype, sizes: dict, copy_gbps: float) -> None:
    s = sizes["moe"]
    w_gate_up, w_down = suite_moe.make_weights(s, dev, dtype)
    w13, s13, w2, s2 = quantize_experts(w_gate_up, w_down)
    elem = torch.empty(0, dtype=dtype).element_size()
    graph = dev.type == "cuda"
    for T in sizes["moe_tokens"]:
        if not run.fits(f"moe T={T}", ESTIMATE_S["moe_T"] * (0.2 if run.smoke else 1)):
            return
        case = f"E{s['E']} k{s['k']} T{T}"
        # the GPU bound of the bench's FP8 check, at least the output dtype's rounding
        fp8_tol = max(suite_moe.fp8_check_tolerance(True, T, dev), measure.TOLERANCES[dtype])
        fns = {
            "bf16": (lambda **a: moe_experts(**a, w_gate_up=w_gate_up, w_down=w_down, impl="triton", check_ids=False),
                     lambda x, weights, ids: experts_reference(x, w_gate_up, w_down, weights, ids), None),
            "fp8": (lambda **a: moe_experts(**a, w_gate_up=w13, w_down=w2, impl="triton", check_ids=False,
                                            w_gate_up_scale=s13, w_down_scale=s2),
                    lambda x, weights, ids: experts_fp8_reference(x, w13, s13, w2, s2, weights, ids),
                    fp8_tol),
            "fp8 separate quantize": (
                lambda **a: moe_experts(**a, w_gate_up=w13, w_down=w2, impl="triton", check_ids=False,
                                        w_gate_up_scale=s13, w_down_scale=s2,
                                        config={"FUSE_QUANT": False, "SLOT_BLOCKS_MAX": 0}),
                lambda x, weights, ids: experts_fp8_reference(x, w13, s13, w2, s2, weights, ids), fp8_tol),
        }
        mk = lambda seed, T=T: suite_moe.make_tokens(s, T, dev, dtype, seed)  # noqa: E731
        ids0 = mk(0)["ids"]
        times = {}
        for name, (fn, ref, tol) in fns.items():
            try:
                res = measure.check(fn, ref, mk, name=f"moe {name} T{T}", trials=1 if run.smoke else 2, seed=5, tol=tol,
                                    reference_dtype=torch.float32)
                if not res.passed:
                    run.failed.append(f"moe {name} T{T}")
                    print(f"[FAIL] {res.summary()}", flush=True)
                    continue
                t = measure.time_fn(fn, mk, reps=sizes["reps"], warmup=3, cuda_graph=graph)
            except Exception as e:  # noqa: BLE001
                run.write(dict(part="moe", case=case, variant=name, error=f"{type(e).__name__}: {str(e)[:300]}"))
                print(f"[error] moe {name} T{T}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            times[name] = t
            nb = suite_moe.moe_bytes(s, T, ids0, elem) if name == "bf16" else suite_moe.fp8_bytes(s, T, ids0, elem)
            gbps = nb / t.ms / 1e6
            vs = times["bf16"].ms / t.ms if "bf16" in times and name != "bf16" else None
            run.write(dict(part="moe", case=case, shape={**s, "T": T}, variant=name, ms=t.ms, p20_ms=t.p20_ms,
                           p80_ms=t.p80_ms, timing=t.method, bytes=nb, gbps=gbps,
                           pct_of_copy=100 * gbps / copy_gbps if copy_gbps else None, vs_bf16=vs,
                           check_max_rel_err=res.max_error))
            run.row("moe", case, name + (" graph" if graph else ""), t.ms, gbps,
                    100 * gbps / copy_gbps if copy_gbps else None, vs, res.max_error)
    del w_gate_up, w_down, w13, w2
    if dev.type == "cuda":
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- prefill and MSA


def run_prefill(run: Run, dev, dtype, sizes: dict) -> None:
    c = sizes["prefill"]
    case = f"B{c['B']} prefix{c['prefix']} S{c['S']}"
    if not run.fits("prefill", ESTIMATE_S["prefill"] * (0.2 if run.smoke else 1)):
        return
    flops = kv.prefill_flops(c)
    lay = dict(B=c["B"] + 1, Hq=c["Hq"], Hkv=c["Hkv"], D=c["D"], page=c["page"])
    S = min(c["S"], 300)

    def ragged(seed, layout):  # ragged prefixes (one empty) and new-token counts, FP8 pages
        g = torch.Generator().manual_seed(seed)
        lens = [S] + [S + int(x) for x in torch.randint(0, c["prefix"] + 1, (lay["B"] - 1,), generator=g)]
        ins = kv.make_decode_inputs({**lay, "L": max(lens)}, dev, dtype, seed, lens)
        ins["q"] = torch.randn(lay["B"], S, c["Hq"], c["D"], generator=g).to(dev, dtype)
        ins["q_lens"] = torch.tensor([S, 1] + torch.randint(0, S + 1, (lay["B"] - 2,), generator=g).tolist(),
                                     dtype=torch.int32, device=dev)
        ins["k_cache"], ins["k_scale"] = kv.quantize_cache(ins["k_cache"], layout)
        ins["v_cache"], ins["v_scale"] = kv.quantize_cache(ins["v_cache"], layout)
        return ins

    def reference(q, k_cache, v_cache, block_table, seq_lens, q_lens, k_scale, v_scale):
        ps = k_cache.shape[1]
        deq = lambda x, s: x * (s if s.ndim == 3 else s[:, None, :].expand(-1, ps, -1))[..., None]  # noqa: E731
        return paged_prefill_reference(q, deq(k_cache, k_scale), deq(v_cache, v_scale), block_table, seq_lens,
                                       q_lens=q_lens)

    errs = {}
    for layout in kv.FP8_LAYOUTS:
        res = measure.check(lambda **kw: paged_prefill(**kw, impl="triton"), reference,
                            lambda seed, layout=layout: ragged(seed, layout), name=f"fp8 prefill {layout}", trials=1,
                            seed=3, reference_dtype=torch.float32)
        if not res.passed:
            run.failed.append(f"prefill {layout}")
            print(f"[FAIL] {res.summary()}", flush=True)
            return
        errs[layout] = res.max_error
    ins = kv.make_prefill_inputs(c, dev, dtype, 0)
    fn = lambda **kw: paged_prefill(**kw, impl="triton", check_values=False)  # noqa: E731
    t_plain = _time(fn, ins, max(3, sizes["reps"] // 2))
    run.row("prefill", case, "bf16", t_plain.ms, None, None, None)
    run.write(dict(part="prefill", case=case, shape=c, variant="bf16", ms=t_plain.ms, tflops=flops / t_plain.ms / 1e9,
                   timing=t_plain.method))
    for layout in kv.FP8_LAYOUTS:
        q8 = {**ins, **dict(zip(("k_cache", "k_scale"), kv.quantize_cache(ins["k_cache"], layout))),
              **dict(zip(("v_cache", "v_scale"), kv.quantize_cache(ins["v_cache"], layout)))}
        t = _time(fn, q8, max(3, sizes["reps"] // 2))
        run.row("prefill", case, f"fp8 {layout} ({flops / t.ms / 1e9:.0f} TFLOP/s)", t.ms, None, None,
                t_plain.ms / t.ms, errs[layout])
        run.write(dict(part="prefill", case=case, shape=c, variant=f"fp8 {layout}", ms=t.ms,
                       tflops=flops / t.ms / 1e9, vs_bf16=t_plain.ms / t.ms, check_max_rel_err=errs[layout],
                       timing=t.method))
    del ins
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def run_msa(run: Run, dev, dtype, sizes: dict, copy_gbps: float) -> None:
    if not run.fits("msa fp8 K/V decode", ESTIMATE_S["msa"] * (0.2 if run.smoke else 1)):
        return
    B, L = sizes["msa"]
    shape = MSA_SHAPE_CPU if run.smoke else MSA_SHAPE
    try:
        recs = suite_msa_fp8kv.run_decode_fp8kv(shape, B, L, dev, dtype, reps=sizes["reps"])
    except AssertionError as e:
        run.failed.append("msa fp8 K/V check")
        print(f"[FAIL] {e}", flush=True)
        return
    for r in recs:
        base = "triton_bf16kv" + ("_cudagraph" if r["impl"].endswith("_cudagraph") else "")
        mine = next((x for x in recs if x["impl"] == base), None)
        vs = mine["ms"] / r["ms"] if mine and r["impl"] != base else None
        run.row("msa", f"B{B} L{L}", r["impl"], r["ms"], r.get("gbps"), r.get("pct_of_ceiling"), vs)
        run.write(dict(part="msa", case=r["case"], variant=r["impl"], ms=r["ms"], gbps=r.get("gbps"),
                       pct_of_copy=r.get("pct_of_ceiling"), vs_bf16=vs, record=r))


# --------------------------------------------------------------------------- main


def _summary_rows(table: list[tuple]) -> list[tuple]:
    """The rows worth a second look: everything but the decode sweep, and of each decode case's
    sweep the default config, the fastest per-token and per-page configs and the best split count."""
    keep, best = [], {}
    for i, row in enumerate(table):
        part, case, variant, ms = row[:4]
        kind = next((k for k in ("splits=", "fp8 token ", "fp8 page ") if k in variant), None) \
            if part == "decode" and not variant.endswith(" graph") else None
        if kind is None:
            keep.append((i, row))
        elif (case, kind) not in best or ms < best[case, kind][1][3]:
            best[case, kind] = (i, row)
        if kind == "fp8 token " and label(configs.launch_config(decode_triton.FP8_LAUNCH)) in variant:
            keep.append((i, row))
    return [row for _, row in sorted(dict(keep + list(best.values())).items())]


def summary(run: Run, picked: dict | None) -> None:
    print("\n== summary (ms; GB/s of the bytes each must read; % of the copy ceiling; x bf16 = bf16 ms / this ms) ==")
    print(f"  {'part':<8} {'case':<22} {'variant':<44} {'ms':>9} {'GB/s':>9} {'%copy':>9} {'x bf16':>9} {'err':>9}")
    for part, case, variant, ms, gbps, pct, vs, err in _summary_rows(run.table):
        cells = [f"{ms:9.4f}", "" if gbps is None else f"{gbps:8.0f}", "" if pct is None else f"{pct:6.1f}",
                 "" if vs is None else f"{vs:6.2f}x", "" if err is None else f"{err:.1e}"]
        print(f"  {part:<8} {case:<22} {variant[:44]:<44} " + " ".join(f"{c:>9}" for c in cells))
    if picked:
        entry = {"paged_decode_fp8": {"source": "hand sweep on " + run.meta["device"] + " (tools/fp8_decode_sweep.py)",
                                      "config": picked["best"]}}
        run.write(dict(part="suggestion", op="paged_decode_fp8", config=picked["best"], best_ms=picked["best_ms"],
                       bf16_ms=picked["bf16_ms"]))
        print(f"\n  fastest per-token config: {label(picked['best'])}  "
              f"({picked['bf16_ms'] / picked['best_ms']:.2f}x bf16); config-file entry:\n  {json.dumps(entry)}")
    print(f"\n  {run.elapsed():.0f} s; " + (f"FAILED: {', '.join(run.failed)}" if run.failed else "every check passed"))


def _part(run: Run, name: str, fn):
    """``fn()``, or ``None`` after writing an ``error`` line when it raises (out of memory on a
    smaller GPU, a compile failure): the later parts and the summary still run."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - one part's failure must not lose the others' results
        run.write(dict(part="error", what=name, error=f"{type(e).__name__}: {str(e)[:400]}"))
        run.failed.append(f"{name} raised {type(e).__name__}")
        print(f"[error] {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return None


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2: no usage block
        self.exit(2, f"fp8_decode_sweep: {message}\n")


def main(argv=None) -> int:
    p = _Parser(description="FP8 vs bf16 on one GPU: paged decode sweep, MoE experts, prefill, MSA decode.")
    p.add_argument("--out", required=True, type=Path, help="JSON-lines file the results are appended to")
    p.add_argument("--budget-s", type=float, default=420.0, help="skip what would run past this many seconds")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="which parts to run")
    p.add_argument("--cpu-smoke", action="store_true", help="toy sizes (seconds on the CPU interpreter)")
    a = p.parse_args(argv)
    if a.budget_s <= 0:
        p.error(f"--budget-s must be > 0, got {a.budget_s}")
    dev = runtime.kernel_device()
    if dev.type != "cuda" and not a.cpu_smoke:
        print("fp8_decode_sweep: no CUDA GPU here; run with --cpu-smoke for the toy sizes", file=sys.stderr)
        return 2
    if dev.type == "cuda" and not runtime.supports("fp8"):
        print(f"fp8_decode_sweep: {runtime.device_name()} has no FP8 (needs sm_89 or newer)", file=sys.stderr)
        return 2
    try:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.touch()
    except (OSError, ValueError) as e:
        print(f"fp8_decode_sweep: cannot write {a.out}: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
        return 2
    sizes = CPU if a.cpu_smoke else GPU
    dtype = runtime.compute_dtype() if dev.type == "cuda" else torch.bfloat16
    run = Run(a.out, a.budget_s, a.cpu_smoke)
    print(f"fp8_decode_sweep on {run.meta['device']} ({dtype}); budget {a.budget_s:.0f} s; results -> {a.out}",
          flush=True)
    copy_gbps = None
    if run.fits("ceilings", ESTIMATE_S["ceilings"] * (0.2 if a.cpu_smoke else 1)):
        ceil = measure.ceilings()
        copy_gbps = ceil.copy_gbps
        run.write(dict(part="ceilings", copy_gbps=ceil.copy_gbps, gemm_tflops=ceil.gemm_tflops, method=ceil.method))
        print(f"  copy ceiling {copy_gbps:.0f} GB/s (read + write)", flush=True)
    picked = None
    if "decode" in a.parts:
        picked = _part(run, "decode", lambda: run_decode(
            run, dev, dtype, sizes, copy_gbps, configs_to_try=CPU_DECODE_CONFIGS if a.cpu_smoke else DECODE_CONFIGS))
        if picked:
            _part(run, "decode (engine layout)", lambda: run_engine_layout(run, dev, dtype, sizes, copy_gbps, picked))
    if "moe" in a.parts:
        _part(run, "moe", lambda: run_moe(run, dev, dtype, sizes, copy_gbps))
    if "prefill" in a.parts:
        _part(run, "prefill", lambda: run_prefill(run, dev, dtype, sizes))
    if "msa" in a.parts:
        _part(run, "msa", lambda: run_msa(run, dev, dtype, sizes, copy_gbps))
    if "decode_b64" in a.parts and run.fits("decode B=64", ESTIMATE_S["b64_setup"] * (0.1 if a.cpu_smoke else 1)):
        tries = [] if picked is None else [tuple(picked["best"][k] for k in ("BLOCK_N", "num_warps", "num_stages",
                                                                             "programs_per_sm", "GATHER"))]
        _part(run, "decode B=64", lambda: run_decode(run, dev, dtype, sizes, copy_gbps, shape="b64",
                                                     configs_to_try=tries, full=False,
                                                     checked=picked["checked"] if picked else None))
    summary(run, picked)
    return 1 if run.failed else 0


if __name__ == "__main__":
    sys.exit(main())
