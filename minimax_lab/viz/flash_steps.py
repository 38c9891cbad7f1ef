"""The steps v0 -> v6 of chapter 02: each checked here, timed live on a GPU, and set beside the
H200's records.

The ``attention`` bench suite recorded the package's kernel
(:mod:`minimax_lab.attention.dense_triton`) at each step's launch config
(:data:`minimax_lab.bench.suite_attention.STEP_CONFIGS`), in the same runs as the autotuned kernel
(v6) and the libraries, several times. A comparison between two of them is judged against the
spread of every run: each side's range runs from the lowest p20 to the highest p80 of its runs
(:func:`envelope`), and two sides whose ranges overlap are called level. This module looks the
records up, prints a step's check, record and live timing (:func:`step`), draws the launch order and
the recorded figure, and writes the sentences that compare the numbers
(:mod:`minimax_lab.notebook.words`, :mod:`minimax_lab.viz.noise`), so none can contradict them.
"""
from __future__ import annotations

import functools
import platform
from typing import Callable, Iterable, Mapping

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch
import triton

from minimax_lab import measure, runtime
from minimax_lab.attention import dense_triton
from minimax_lab.bench import suite_attention
from minimax_lab.notebook import recorded, words
from minimax_lab.viz import flash_checks, noise

#: the chapter's steps and the ``impl`` of their H200 records (v0 was not recorded; v6 is the
#: autotuned kernel, recorded as ``"triton"``)
RECORD_IMPL = {"v1": "triton_v1_small_tiles", "v2": "triton_v2_hopper_tiles", "v3": "triton_v3_128x128_tiles",
               "v4": "triton_v4_l2_order", "v5": "triton_v5_tma", "v6": "triton"}
STEPS = ["v0", *RECORD_IMPL]
#: what each step changes, for the figure's labels
STEP_LABELS = {"v0": "v0 grown in section 3", "v1": "v1 exp2, two loops, longest first",
               "v2": "v2 128×64 tiles, 8 warps", "v3": "v3 128×128 tiles", "v4": "v4 one head's tiles together",
               "v5": "v5 TMA loads", "v6": "v6 autotuned"}
#: the libraries the steps are compared with, and how the chapter names them
LIBRARIES = {"sdpa_flash": "SDPA flash (FlashAttention-2)", "flex_compiled": "FlexAttention (compiled)",
             "sdpa_cudnn": "SDPA cuDNN"}
#: the shape the steps were recorded (and are timed here) at, (B, S, H), and v4's query-tile height
STEPS_SHAPE = tuple(flash_checks.TIMED_SHAPE[n] for n in "BSH")
STEPS_BLOCK_M = 128
#: the record fields two runs must share to count as repeats of one measurement
SAME_RUN = ("triton", "torch", "dtype", "config", "shape")


@functools.lru_cache(maxsize=1)
def _attention_records() -> tuple[dict, ...]:
    """Every H200 record of the ``attention`` suite, oldest first (read once per session)."""
    return tuple(measure.load_records(recorded.H200, suite="attention", latest=False))


def steps_case() -> str | None:
    """The recorded case the steps were timed at (causal, B=4, S=16k on the H200), or None."""
    return next((r["case"] for r in _attention_records() if r["impl"].startswith("triton_v")), None)


def impl_of(name: str) -> str:
    """The record ``impl`` of a step (``"v3"``) or a library (``"sdpa_flash"``)."""
    return RECORD_IMPL.get(name, name)


def runs(name: str, case: str | None = None) -> list[dict]:
    """The H200 runs of a step or library at ``case`` (default: the steps' case) that repeat its
    newest run: same versions, dtype, shape and launch config. Empty when none was recorded."""
    case = case or steps_case()
    every = [r for r in _attention_records() if r["case"] == case and r["impl"] == impl_of(name)]
    return [r for r in every if all(r.get(k) == every[-1].get(k) for k in SAME_RUN)] if every else []


def envelope(name: str, case: str | None = None) -> dict | None:
    """The newest run of a step or library with its spread widened to every repeat's: ``p20_ms`` the
    lowest p20, ``p80_ms`` the highest p80, ``n_runs`` how many runs; None when not recorded."""
    found = runs(name, case)
    if not found:
        return None
    return {**found[-1], "p20_ms": min(r["p20_ms"] for r in found), "p80_ms": max(r["p80_ms"] for r in found),
            "n_runs": len(found)}


def recorded_with(recs: Iterable[Mapping]) -> str:
    """``'NVIDIA H200, Triton 3.6.0, torch 2.11.0+cu130'``: where a set of records was measured."""
    recs = list(recs)
    if not recs:
        return "no records"
    parts = [sorted({str(r.get(k)) for r in recs}) for k in ("device", "triton", "torch")]
    return f"{' / '.join(parts[0])}, Triton {' / '.join(parts[1])}, torch {' / '.join(parts[2])}"


def shape_words(r: Mapping) -> str:
    """``'causal, B=4, S=16,384, H=16, D=128, bfloat16'``: the shape and dtype a record was timed at."""
    sh = r.get("shape") or {}
    heads = f"H={sh.get('Hq')}" if sh.get("Hq") == sh.get("Hkv") else f"Hq/Hkv={sh.get('Hq')}/{sh.get('Hkv')}"
    return (f"{'causal' if sh.get('causal') else 'not causal'}, B={sh.get('B')}, S={sh.get('S', 0):,}, {heads}, "
            f"D={sh.get('D')}, {r.get('dtype')}")


def _tflops_range(r: Mapping) -> tuple[float, float]:
    """A record's throughput at its p80 and at its p20 time (the same FLOPs in more or less time)."""
    flops = r["tflops"] * r["ms"]
    return flops / r["p80_ms"], flops / r["p20_ms"]


def moved_words(before: Mapping, after: Mapping) -> str:
    """How the throughput moved from ``before`` to ``after`` (records or :func:`envelope` s), judged
    by whether their p20-p80 ranges overlap."""
    a, b = before["tflops"], after["tflops"]
    ranges = (f"p20-p80 {before['p20_ms']:.3g}-{before['p80_ms']:.3g} ms and "
              f"{after['p20_ms']:.3g}-{after['p80_ms']:.3g} ms")
    if noise.spreads_overlap(before, after):
        return (f"moved from {a:.0f} to {b:.0f} TFLOP/s, inside the spread of the timings ({ranges}): "
                "no measurable change")
    return f"{words.change(a, b, unit='TFLOP/s', same_within=0.0)}, outside the spread of the timings ({ranges})"


def recorded_lines(name: str) -> str:
    """A step's H200 record (with its device and versions) and how far it moved from the step before."""
    now = envelope(name)
    if now is None:
        return f"{name}: not recorded on the H200 (the bench suite records the package's kernel from v1 on)"
    lines = [f"recorded on the {recorded_with([now])}, {shape_words(now)}, the package's "
             f"kernel with this step's choices: {now['tflops']:.0f} TFLOP/s ({now['ms']:.2f} ms; p20-p80 "
             f"{now['p20_ms']:.2f}-{now['p80_ms']:.2f} ms over {now['n_runs']} run{'s' * (now['n_runs'] > 1)})"]
    i = STEPS.index(name)
    before = envelope(STEPS[i - 1]) if i > 1 else None
    if before:
        lines.append(f"from {STEPS[i - 1]}, the recorded throughput {moved_words(before, now)}")
    return "\n".join(lines)


def live_lines(name: str, live: Mapping[str, dict]) -> str:
    """A step's timing here on a GPU (the cell's own kernel) and how far it moved from the step before."""
    now = live.get(name)
    if now is None:
        return ""
    if "skipped" in now:
        return f"not timed here: {now['skipped']}"
    line = (f"measured now on {now['device']} (Triton {now['triton']}, torch {now['torch']}), this cell's kernel at "
            f"the same shape: {now['tflops']:.0f} TFLOP/s ({now['ms']:.2f} ms; p20-p80 {now['p20_ms']:.2f}-"
            f"{now['p80_ms']:.2f} ms over {now['reps']} calls)")
    prev = [s for s in STEPS[:STEPS.index(name)] if "tflops" in live.get(s, {})]
    if prev:
        line += f"\nfrom {prev[-1]} measured now, the throughput {moved_words(live[prev[-1]], now)}"
    return line


#: the steps that load through TMA descriptors: Hopper and newer only
NEEDS_TMA = {"v5", "v6"}


def _label(fn) -> str:
    """The launch arguments a ``functools.partial`` candidate fixes, as ``'k=v, ...'``."""
    return ", ".join(f"{k}={v}" for k, v in getattr(fn, "keywords", {}).items() if k != "num_ctas")


def step(name: str, fn: Callable, preset: str, live: dict, *, lengths: tuple[int, int],
         candidates: Iterable[Callable] | None = None) -> None:
    """One step of the chapter: check ``fn(q, k, v, CAUSAL=...)`` against the fp32 reference
    (:func:`minimax_lab.viz.flash_checks.check`, causal and not, at ``lengths``), print its H200
    record, and on a GPU time it here (into ``live[name]``). ``candidates``: the launches an
    autotuned ``fn`` chooses among; in the interpreter, where the autotuner cannot time, each is
    checked instead (causal). On a GPU without TMA a TMA step is skipped, and a step whose tiles do
    not fit the GPU's shared memory is reported, not raised."""
    if name in NEEDS_TMA and not runtime.supports("tma"):
        print(f"{name} loads through TMA descriptors, which this GPU lacks (Hopper and newer): not run here")
        print(recorded_lines(name))
        return
    try:
        if candidates is not None and runtime.is_interpreter():
            for c in candidates:
                print(f"candidate {_label(c)}:")
                flash_checks.check(c, preset, lengths=lengths, causal=(True,))
        else:
            flash_checks.check(fn, preset, lengths=lengths)
    except triton.runtime.errors.OutOfResources as e:
        print(f"{name} does not fit this GPU ({e}): not run here")
        print(recorded_lines(name))
        return
    print(recorded_lines(name))
    timed = flash_checks.time_on_gpu(fn)
    if timed is not None:
        live[name] = timed
        print(live_lines(name, live))


# --------------------------------------------------------------------------- v4: the launch order


def _machine() -> tuple[str, int, int]:
    """Whose L2 and SMs the launch-order lines use: this GPU's, or off a GPU the H200's the steps were recorded on."""
    if runtime.device().type == "cuda":
        return "this GPU's", runtime.l2_cache_bytes(), runtime.capabilities().sm_count
    return "the H200's", runtime.RECORDED_GPU_L2_BYTES, runtime.RECORDED_GPU.sm_count


def l2_lines(B: int = STEPS_SHAPE[0], S: int = STEPS_SHAPE[1], H: int = STEPS_SHAPE[2], D: int = 128) -> str:
    """The launch-order arithmetic of v4: K/V bytes of one head, and of all heads, against the L2."""
    kv_head = 2 * S * D * 2                                 # K and V of one head, bf16
    where, l2, _ = _machine()
    return (f"at S={S}: K+V of one head = {kv_head / 2**20:.0f} MiB. Batch·head fastest, consecutive programs belong "
            f"to different heads, so the programs in flight read the K/V of up to all {B * H} heads: "
            f"{B * H * kv_head / 2**20:,.0f} MiB against {where} {l2 / 2**20:.0f} MiB of L2. One head's tiles "
            f"together: {kv_head / 2**20:.0f} MiB, which fits.")


def launch_waves(n_heads: int, tiles_m: int, heads_together: int, resident: int) -> np.ndarray:
    """``[n_heads, tiles_m]``: in which wave of ``resident`` programs each (batch·head, query tile)
    starts, when the GPU starts programs in index order (the index math of v4's first lines)."""
    wave = np.zeros((n_heads, tiles_m), dtype=np.int64)
    for pid, (h, mt) in enumerate(dense_triton.launch_order(n_heads, tiles_m, heads_together)):
        wave[h, mt] = pid // resident
    return wave


def plot_launch_order(B: int = STEPS_SHAPE[0], S: int = STEPS_SHAPE[1], H: int = STEPS_SHAPE[2],
                      block_m: int = STEPS_BLOCK_M, resident: int | None = None):
    """Which wave of ``resident`` programs (default: one per SM of the machine of :func:`l2_lines`)
    runs each (batch·head, query tile) in the two launch orders, at the recorded shape: batch·head
    fastest (v1-v3) against one head's tiles together (v4). The first wave is outlined in red."""
    where, _, sms = _machine()
    resident = resident or sms
    n_heads, tiles_m = B * H, -(-S // block_m)
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.6), gridspec_kw={"width_ratios": [1, 1, 0.04]})
    for ax, together, title in ((axes[0], n_heads, "v1-v3: batch·head fastest"),
                                (axes[1], 1, "v4: one head's query tiles together")):
        wave = launch_waves(n_heads, tiles_m, together, resident)
        im = ax.imshow(wave, cmap="viridis", aspect="auto", interpolation="nearest")
        first = np.ma.masked_where(wave != 0, np.ones_like(wave))
        ax.imshow(first, cmap=ListedColormap(["red"]), aspect="auto", interpolation="nearest")
        per_head = int(np.median([len(set(row)) for row in wave]))
        ax.set_title(f"{title}\neach head's K/V is read by programs of {per_head} different waves", fontsize=10)
        ax.set(xlabel=f"query tile ({block_m} rows; the last, longest ones start first)", ylabel="(batch, head)")
    fig.colorbar(im, cax=axes[2], label=f"wave: which {resident} programs start together")
    fig.legend(handles=[Patch(color="red", label=f"wave 0: the first {resident} programs, one per SM of "
                              f"{where.replace(chr(39) + 's', '')}")], loc="lower center", fontsize=9, frameon=False)
    fig.suptitle(f"The order programs start in, B={B}, S={S:,}, H={H}: {n_heads} (batch, head) rows × {tiles_m} "
                 "query tiles", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


# --------------------------------------------------------------------------- v5 and v6


def tma_line() -> str:
    """v5's arithmetic: the K/V bytes per second its recorded throughput implies, beside the copy ceiling."""
    v5, copy = envelope("v5"), recorded.one("ceilings", "copy", "torch.copy_")
    if not (v5 and copy):
        return "(v5 or the copy ceiling is not recorded)"
    tiles_tbps, copy_tbps = v5["tflops"] / 128, copy["gbps"] / 1000
    return (f"{v5['tflops']:.0f} TFLOP/s / 128 FLOP/byte = {tiles_tbps:.2f} TB/s of K/V tiles: "
            f"{words.more_or_less(tiles_tbps, copy_tbps, same='about as much as')} the H200's recorded copy "
            f"bandwidth ({copy_tbps:.2f} TB/s)")


def _tune_label(cfg: dict) -> str:
    """A config as the autotuner's timings name it (:func:`minimax_lab.bench.suite_attention.autotune_timings`)."""
    return (f"{cfg.get('BLOCK_M')}x{cfg.get('BLOCK_N')}_w{cfg.get('num_warps')}_s{cfg.get('num_stages')}"
            f"_g{cfg.get('GROUP_H', 1)}" + ("_tma" if cfg.get("USE_TMA") else ""))


def _order(group_h) -> str:
    return "batch·head fastest" if group_h and group_h >= 64 else f"{group_h} head(s) together"


def autotune_pick_line(v6: dict, v5: dict) -> str:
    """What the autotuned kernel (v6) picked at the steps' case, and whether its own timings tell
    that pick apart from v5's config, against the p20-p80 spread of one timing of v5."""
    pick, fixed = dict(v6.get("config") or {}), dict(suite_attention.STEP_CONFIGS["gpu"]["v5_tma"])
    said = (f"{pick.get('BLOCK_M')}×{pick.get('BLOCK_N')} tiles, {pick.get('num_warps')} warps, "
            f"{pick.get('num_stages')} stages, {_order(pick.get('GROUP_H'))}, "
            f"{'TMA' if pick.get('USE_TMA') else 'pointer'} loads")
    if pick == fixed:
        return f"the autotuner picked {said}: v5's config, so v5 and v6 are two timings of one kernel"
    tuned = v6.get("autotune_ms") or {}
    a, b = tuned.get(_tune_label(pick)), tuned.get(_tune_label(fixed))
    if not (a and b):
        return f"the autotuner picked {said}; its own timings of the candidates are not recorded"
    spread = (v5["p80_ms"] - v5["p20_ms"]) / v5["ms"]
    inside = abs(a - b) / b <= spread
    return (f"the autotuner picked {said}: in its own timing run at this size that config and v5's took {a:.3f} ms "
            f"and {b:.3f} ms, {abs(a - b) / b:.1%} apart, " + ("inside" if inside else "outside")
            + f" the p20-p80 spread of one timing of v5 ({spread:.1%}); "
            + ("a pick between equals, made by noise." if inside else "a pick the timings support."))


def autotune_line() -> str:
    """:func:`autotune_pick_line` for the recorded v6 and v5 ('' when either is missing)."""
    v6, v5 = envelope("v6"), envelope("v5")
    return autotune_pick_line(v6, v5) if v6 and v5 else ""


# --------------------------------------------------------------------------- the recorded figure


def plot_recorded(live: Mapping[str, dict] | None = None):
    """The steps (green) and the libraries (grey) as recorded on the H200 at the steps' case, error
    bars spanning every run's p20-p80, with a line at FlexAttention's throughput; beside them, when
    ``live`` holds timings made here on a GPU, the chapter's own kernels (blue). None when nothing
    is recorded."""
    got = [(STEP_LABELS[s], envelope(s), "tab:green") for s in RECORD_IMPL]
    got += [(LIBRARIES[n], envelope(n), "tab:gray") for n in LIBRARIES]
    got = [(label, r, c) for label, r, c in got if r]
    here = [(STEP_LABELS[s] + " (here)", live[s], "tab:blue") for s in STEPS if "tflops" in (live or {}).get(s, {})]
    if not got:
        return None
    rows = got + here
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(rows) + 2.2))
    for y, (label, r, color) in enumerate(rows):
        lo, hi = _tflops_range(r)
        ax.barh(y, r["tflops"], color=color, xerr=[[r["tflops"] - lo], [hi - r["tflops"]]], capsize=3)
        ax.annotate(f"{r['tflops']:.0f}", (hi, y), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [label for label, _, _ in rows])
    flex = envelope("flex_compiled")
    if flex:
        ax.axvline(flex["tflops"], color="tab:orange", ls="--", lw=1)
    handles = [Patch(color="tab:green", label="the package's kernel at each step's config"),
               Patch(color="tab:gray", label="libraries, timed in the same runs")]
    if here:
        handles.append(Patch(color="tab:blue", label=f"this chapter's kernels, measured now on {here[0][1]['device']}"))
    handles += [plt.Line2D([], [], color="tab:orange", ls="--", label="FlexAttention's throughput")] if flex else []
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    ax.invert_yaxis()
    ax.set(xlabel="TFLOP/s (higher is better; error bars: p20-p80, over every run where recorded)")
    ax.set_title(f"{shape_words(got[0][1])}\nrecorded on the {recorded_with([r for _, r, _ in got])}",
                 fontsize=9)
    fig.tight_layout()
    return fig


def summary() -> str:
    """Three sentences on the recorded numbers, every comparison computed from them and judged by
    whether the two sides' ranges over every run (:func:`envelope`) overlap."""
    case, ours = steps_case(), envelope("v6")
    libs = {n: envelope(n) for n in LIBRARIES}
    if not (ours and all(libs.values())):
        return "No H200 records of the `attention` suite with every library: `python -m minimax_lab.bench attention`."
    said = {n: noise.speed_words(ours, libs[n]) for n in LIBRARIES}
    how = ("level where the ranges of their runs overlap" if "level with" in said.values()
           else "each gap outside the p20-p80 range of every run of both")
    first = (f"At `{case}` on the {recorded_with([ours])}, the autotuned kernel (v6) runs at {ours['tflops']:.0f} "
             "TFLOP/s: " + ", ".join(f"{said[n]} {LIBRARIES[n]}" for n in LIBRARIES) + f" ({how}).")
    flex = libs["flex_compiled"]
    verdicts = {s: noise.speed_words(envelope(s), flex) for s in RECORD_IMPL if envelope(s)}
    past = next((s for s, v in verdicts.items() if "faster" in v), None)
    level = [s for s, v in verdicts.items() if v == "level with"]
    second = (f"The first step measurably past FlexAttention is {past} ({verdicts[past]} it)"
              + (f"; {', '.join(level)} {'is' if len(level) == 1 else 'are'} level with it." if level else ".")
              if past else "No step is measurably past FlexAttention.")
    sides = []
    for r in recorded.all_of("attention", impl="triton"):
        mine, cudnn = envelope("v6", r["case"]), envelope("sdpa_cudnn", r["case"])
        if mine and cudnn:
            word = noise.speed_words(mine, cudnn)
            sides.append(("level" if word == "level with" else "behind" if "slower" in word else "ahead",
                          cudnn["ms"] / mine["ms"]))
    if not sides:
        return " ".join([first, second])
    phrase = {"ahead": "ahead of cuDNN", "level": "level with cuDNN", "behind": "behind cuDNN"}
    kinds = [k for k in phrase if any(kk == k for kk, _ in sides)]
    where = (f"{phrase[kinds[0]]} at every recorded size" if len(kinds) == 1 else
             ", ".join(f"{phrase[k]} at {sum(kk == k for kk, _ in sides)}" for k in kinds) + " of them")
    ratios = [x for _, x in sides]
    third = (f"Across the {len(sides)} recorded sizes it is {where}: {min(ratios):.2f}x to {max(ratios):.2f}x "
             f"cuDNN's throughput.")
    return " ".join([first, second, third])


def provenance(preset: str, seconds: float, live: Mapping[str, dict] | None = None) -> str:
    """Markdown for the chapter's last, collapsed cell: this run, the records drawn and how they were
    timed, how comparisons are judged, and the checks' inputs."""
    info = runtime.describe()
    used = [r for s in [*RECORD_IMPL, *LIBRARIES] for r in runs(s)]
    dates = sorted({str(r.get("when", ""))[:10] for r in used if r.get("when")})
    rows = [f"- this run: preset `{preset}`, {info['device']}, Python {info['python']}, torch {info['torch']}, "
            f"Triton {info['triton']}{' (interpreter)' if info['interpreter'] else ''}, {platform.system()}; "
            f"{seconds:.0f} s from the setup cell to here"]
    if used:
        rows.append(f"- the H200 numbers: {len(used)} records of the `attention` bench suite "
                    f"(`python -m minimax_lab.bench attention`) on the {recorded_with(used)}, recorded "
                    f"{dates[0]} to {dates[-1]}; each a median over {sorted({r['reps'] for r in used})[-1]} calls "
                    f"timed with CUDA events on rotating inputs (no call finds its inputs in L2); the steps are the "
                    f"package's kernel at fixed configs, v6 its autotuned kernel")
    rows.append("- comparison words: a difference is called one only when the two sides' p20-p80 ranges, widened "
                "over every recorded run that repeats the same versions, shape and config, do not overlap; "
                "error bars show those ranges")
    if live:
        timed = [v for v in live.values() if "tflops" in v]
        if timed:
            rows.append(f"- measured here: the chapter's own kernels at the same shape, {timed[0]['reps']} calls each "
                        f"with CUDA events on rotating inputs, on {timed[0]['device']}")
    rows.append(f"- the checks: fp32 reference, batch {flash_checks.CHECK_B}, {flash_checks.CHECK_HQ} query heads "
                f"sharing {flash_checks.CHECK_HKV} kv head, head dim {flash_checks.check_head_dim(preset)}, strided "
                "views, inputs drawn from fixed seeds (`flash_checks.strided_inputs`), tolerance by dtype "
                "(`measure.check`)")
    return ("<details><summary><b>Where these numbers come from</b> (click to open)</summary>\n\n"
            + "\n".join(rows) + "\n\n</details>")
