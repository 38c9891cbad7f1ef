"""The recorded steps v1 -> v6 of chapter 02: from the 40-line FlashAttention kernel to the package's.

Each step is a fixed launch config of :func:`minimax_lab.attention.dense_triton.flash_attention`
(:data:`minimax_lab.bench.suite_attention.STEP_CONFIGS`), one change on top of the step before,
recorded on the H200 by the ``attention`` bench suite in the same run as the autotuned kernel (v6)
and the libraries. This module looks the records up, shows a step as a config diff with its
recorded number and a check here, draws the launch order and the recorded figure, and writes the
sentences that compare the numbers (:mod:`minimax_lab.notebook.words`), so none can contradict them.
"""
from __future__ import annotations

import contextlib
import difflib
import io

import matplotlib.pyplot as plt
import numpy as np

from minimax_lab import runtime
from minimax_lab.attention import dense_triton
from minimax_lab.bench import suite_attention
from minimax_lab.notebook import recorded, words
from minimax_lab.viz import live_vs_recorded, noise
from minimax_lab.viz.excerpt import excerpt as excerpt_lines
from minimax_lab.viz.source import Source, show_source

#: the steps, in order: v1..v5 fixed configs, v6 the autotuner's pick
STEPS = [*suite_attention.STEP_CONFIGS["gpu"], "v6_autotuned"]
#: the libraries the steps are compared with, and how the chapter names them
LIBRARIES = {"sdpa_flash": "SDPA flash (FlashAttention-2)", "flex_compiled": "FlexAttention (compiled)",
             "sdpa_cudnn": "SDPA cuDNN"}
#: the L2 and the SM count of the machine the steps were recorded on (an H200), for the launch-order
#: arithmetic and picture off a GPU (on a GPU, the running one's are used)
#: the shape the steps were recorded at (B, S, H) and v4's query-tile height, for the launch-order lines
STEPS_SHAPE, STEPS_BLOCK_M = (4, 16384, 16), 128


def impl_of(step: str) -> str:
    """The record's ``impl`` of a step (v6 is the autotuned kernel, recorded as ``"triton"``)."""
    return "triton" if step == "v6_autotuned" else f"triton_{step}"


def steps_case() -> str | None:
    """The recorded case the steps were timed at (causal, B=4, S=16k on the H200), or None."""
    return next((r["case"] for r in recorded.all_of("attention") if r["impl"].startswith("triton_v")), None)


def recorded_step(name: str, case: str | None = None) -> dict | None:
    """The H200 record of a step or library (``"sdpa_flash"``...) at ``case`` (default: the steps' case)."""
    case = case or steps_case()
    return recorded.one("attention", case, impl_of(name) if name in STEPS else name) if case else None


def step_config(step: str) -> dict:
    """A step's launch config; v6's is the one the autotuner picked at the steps' case, as recorded."""
    if step == "v6_autotuned":
        return dict((recorded_step(step) or {}).get("config") or {})
    return dict(suite_attention.STEP_CONFIGS["gpu"][step])


def _order(group_h) -> str:
    return {1: "one head's tiles together", 1024: "head index fastest"}.get(group_h, f"{group_h} heads per group")


def steps_table() -> str:
    """The steps as a Markdown table: tiles, warps, stages, launch order, loads, recorded TFLOP/s."""
    rows = ["| step | tiles (M×N) | warps | stages | launch order | K/V loads | recorded TFLOP/s |",
            "|---|---|---|---|---|---|---|"]
    for step in STEPS:
        c, r = step_config(step), recorded_step(step)
        rows.append(f"| {step} | {c.get('BLOCK_M')}×{c.get('BLOCK_N')} | {c.get('num_warps')} | {c.get('num_stages')} | "
                    f"{_order(c.get('GROUP_H'))} | {'TMA' if c.get('USE_TMA') else 'pointers'} | "
                    f"{r['tflops']:.0f} |" if r else f"| {step} | not recorded |||||| ")
    return f"Recorded on the H200 at `{steps_case()}` (causal, bf16):\n\n" + "\n".join(rows)


def show_step(step: str, preset: str = "auto") -> None:
    """Print the step's config as a diff to the step before, its recorded throughput and how it
    changed, then check the step's config here against the fp32 reference (AssertionError if wrong)."""
    i = STEPS.index(step)
    prev = STEPS[i - 1] if i else None
    fmt = lambda cfg: [f"{k} = {cfg[k]}" for k in sorted(cfg)]  # noqa: E731
    if prev is None:
        print(f"{step}:\n" + "\n".join("  " + line for line in fmt(step_config(step))))
    else:
        diff = difflib.unified_diff(fmt(step_config(prev)), fmt(step_config(step)), prev, step, lineterm="", n=9)
        print("\n".join(diff) or f"{step}: the same config as {prev}")
    now, before = recorded_step(step), prev and recorded_step(prev)
    if now:
        print(f"\nrecorded on the H200 at {steps_case()}: {now['tflops']:.0f} TFLOP/s, {now['ms']:.2f} ms")
        if before:
            print(f"from {prev}, the throughput {noise.timing_words(before, now, lambda r: r['tflops'], unit='TFLOP/s')}")
    if step == "v6_autotuned" and now and before:
        print(autotune_pick_line(now, before))
    config = None if step == "v6_autotuned" else step_config(step)
    r = suite_attention.check_config(config, preset, name=step)
    print(f"checked here: {r.summary()}")
    if not r.passed:
        raise AssertionError(r.summary())


def _tune_label(cfg: dict) -> str:
    """A config as the autotuner's timings name it (:func:`~minimax_lab.attention.dense_triton.autotune_timings`)."""
    return (f"{cfg.get('BLOCK_M')}x{cfg.get('BLOCK_N')}_w{cfg.get('num_warps')}_s{cfg.get('num_stages')}"
            f"_g{cfg.get('GROUP_H', 1)}" + ("_tma" if cfg.get("USE_TMA") else ""))


def autotune_pick_line(v6: dict, v5: dict) -> str:
    """Why the autotuned kernel (v6) can time slower than the fixed v5: what the autotuner measured
    for its pick and for v5's config at this size, against the spread of a single timing."""
    pick, fixed = dict(v6.get("config") or {}), step_config("v5_tma")
    if pick == fixed:
        return "the autotuner picked v5's config: the two numbers are two timings of one kernel"
    tuned = v6.get("autotune_ms") or {}
    a, b = tuned.get(_tune_label(pick)), tuned.get(_tune_label(fixed))
    if not (a and b):
        return "the autotuner picked a config other than v5's (the diff above); its own timings are not recorded"
    spread = (v5["p80_ms"] - v5["p20_ms"]) / v5["ms"]
    inside = abs(a - b) / b <= spread
    return (f"the autotuner picked a config other than v5's (the diff above): in its own timing run at this size the "
            f"two took {a:.3f} ms and {b:.3f} ms, {abs(a - b) / b:.1%} apart, "
            + ("inside" if inside else "outside") + f" the p20-p80 spread of one timing of v5 ({spread:.1%}); "
            + ("a pick between equals, made by noise." if inside else "a pick the timings support."))


def excerpt(obj, start: str, stop: str) -> Source:
    """The lines of the package's ``obj`` from the first that contains ``start`` through the next
    one that contains ``stop``, with their line numbers in the file (:func:`minimax_lab.viz.excerpt.excerpt`).
    Raises ValueError when no line contains ``start``, or none after it ``stop``."""
    lines = show_source(obj).text.splitlines()
    i = next((n for n, line in enumerate(lines) if start in line), None)
    j = next((n for n in range(i, len(lines)) if stop in lines[n]), None) if i is not None else None
    if j is None:
        raise ValueError(f"no line of {getattr(obj, '__name__', obj)!r} contains {start!r} followed by {stop!r}")
    return excerpt_lines(obj, start, j - i + 1)


def _machine() -> tuple[str, int, int]:
    """Whose L2 and SMs the launch-order lines use: this GPU's, or off a GPU the H200's the steps were recorded on."""
    if runtime.device().type == "cuda":
        return "this GPU's", runtime.l2_cache_bytes(), runtime.capabilities().sm_count
    return "the H200's", runtime.RECORDED_GPU_L2_BYTES, runtime.RECORDED_GPU.sm_count


def l2_lines(B: int = STEPS_SHAPE[0], S: int = STEPS_SHAPE[1], H: int = STEPS_SHAPE[2], D: int = 128) -> str:
    """The launch-order arithmetic of v4: K/V bytes of one head, and of all heads, against the L2."""
    kv_head = 2 * S * D * 2                                 # K and V of one head, bf16
    where, l2, _ = _machine()
    return (f"at S={S}: K+V of one head = {kv_head / 2**20:.0f} MiB. Head index fastest, consecutive programs belong "
            f"to different heads, so the programs in flight read the K/V of up to all {B * H} heads: "
            f"{B * H * kv_head / 2**20:,.0f} MiB against {where} {l2 / 2**20:.0f} MiB of L2. One head's tiles "
            f"together: {kv_head / 2**20:.0f} MiB, which fits.")


def plot_launch_order(B: int = STEPS_SHAPE[0], S: int = STEPS_SHAPE[1], H: int = STEPS_SHAPE[2],
                      block_m: int = STEPS_BLOCK_M, resident: int | None = None):
    """Which (batch·head, query tile) the first ``resident`` programs own (default: one per SM of the
    machine of :func:`l2_lines`), in the two launch orders, at the recorded shape, from the kernel's
    own index math (:func:`~minimax_lab.attention.dense_triton.launch_order`)."""
    where, _, sms = _machine()
    resident = resident or sms
    n_heads, tiles_m = B * H, -(-S // block_m)
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
    for a, group, title in ((ax[0], 1024, "GROUP_H=1024: head index fastest (v1-v3)"),
                            (ax[1], 1, "GROUP_H=1: one head's tiles together (v4)")):
        wave = np.zeros((n_heads, tiles_m))
        for h, mt in dense_triton.launch_order(n_heads, tiles_m, group)[:resident]:
            wave[h, mt] = 1
        a.imshow(wave, cmap="Blues", aspect="auto", interpolation="nearest")
        a.set(title=f"{title}\nfirst {resident} programs: {int(wave.any(1).sum())} heads' K/V in flight",
              xlabel=f"query tile ({block_m} rows each)", ylabel="(batch, head)")
        a.title.set_fontsize(9)
    fig.suptitle(f"B={B}, S={S:,}, H={H}: {n_heads} (batch, head) rows × {tiles_m} query tiles; "
                 f"{resident} programs = one per SM of {where.replace(chr(39) + 's', '')}", fontsize=9)
    fig.tight_layout()
    return fig


def tma_line() -> str:
    """v5's arithmetic: the K/V bytes per second its recorded throughput implies, beside the copy ceiling."""
    v5, copy = recorded_step("v5_tma"), recorded.one("ceilings", "copy", "torch.copy_")
    if not (v5 and copy):
        return "(v5 or the copy ceiling is not recorded)"
    tiles_tbps, copy_tbps = v5["tflops"] / 128, copy["gbps"] / 1000
    return (f"{v5['tflops']:.0f} TFLOP/s / 128 FLOP/byte = {tiles_tbps:.2f} TB/s of K/V tiles: "
            f"{words.more_or_less(tiles_tbps, copy_tbps, same='about as much as')} the H200's recorded copy "
            f"bandwidth ({copy_tbps:.2f} TB/s)")


def autotune_table() -> str:
    """What the autotuner picked at each recorded size, as a Markdown table."""
    rows = ["| case | picked config | TFLOP/s |", "|---|---|---|"]
    for r in sorted(recorded.all_of("attention", impl="triton"), key=lambda r: r["shape"]["S"]):
        c = r.get("config") or {}
        rows.append(f"| {r['case']} | {c.get('BLOCK_M')}×{c.get('BLOCK_N')}, {c.get('num_warps')} warps, "
                    f"{c.get('num_stages')} stages, GROUP_H={c.get('GROUP_H')}, "
                    f"{'TMA' if c.get('USE_TMA') else 'pointers'} | {r['tflops']:.0f} |")
    return "\n".join(rows)


def time_here(preset: str, reps: int) -> list[dict]:
    """Run the bench suite's first case here (:func:`~minimax_lab.bench.suite_attention.run_case`: the
    autotuned kernel and the steps this device runs, checked, then timed with the peers) and return its
    records. Its check lines are printed; its own table is left out, since :func:`measured_vs_recorded`
    prints the records with each impl named for what ran on this machine."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        measured = suite_attention.run_case(suite_attention.cases(preset)[0], reps=reps,
                                            configs=suite_attention.steps_for(preset))
    table = {(r["case"], r["impl"]) for r in measured}
    for line in out.getvalue().splitlines():
        if tuple(line.split()[:2]) not in table:
            print(line)
    return measured


#: what a measured impl is when it ran on a CPU: the names of the GPU run would mislead there
CPU_NAMES = {"sdpa_flash": "SDPA, flash backend: PyTorch's CPU kernel (not FlashAttention-2)"}


def measured_vs_recorded(measured: list[dict]) -> str:
    """Records measured now (the suite's own case, run in the chapter) beside the H200's at the same
    shape, as a table with the ratio; where no recorded case matches (the CPU preset's tiny case),
    the times measured here alone, each impl named for what ran on this machine."""
    recs = recorded.all_of("attention")
    if not measured:
        return ""
    if any(r["case"] == m["case"] for r in recs for m in measured):
        return live_vs_recorded.format_rows(measured, recs, "tflops", device_now=runtime.device_name())
    interp = runtime.is_interpreter()
    name = lambda impl: CPU_NAMES.get(impl, impl) if interp else impl  # noqa: E731
    rows = [(name(m["impl"]) + (" (Triton interpreter)" if interp and m["impl"].startswith("triton") else ""), m["ms"])
            for m in measured]
    width = max(len(n) for n, _ in rows)
    lines = [f"measured now on {runtime.device_name()} at {measured[0]['case']}, ms per call (wall clock); "
             "no H200 record at this shape"]
    lines += [f"  {n:{width}s} {ms:10.3f}" for n, ms in rows]
    if interp:
        lines.append("These are the interpreter's times (numpy per program) beside a compiled CPU kernel: "
                     "they show the harness at work, not how fast any of them runs on a GPU.")
    return "\n".join(lines)


def plot_recorded():
    """The recorded figure: the steps (green) and the libraries (grey) at the steps' case, with a
    line at FlexAttention's throughput; None when the steps are not recorded."""
    got = [(step, recorded_step(step)) for step in STEPS] + [(LIBRARIES[n], recorded_step(n)) for n in LIBRARIES]
    got = [(name, r["tflops"]) for name, r in got if r]
    if not got:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(got) + 1.4))
    ax.barh([n for n, _ in got], [t for _, t in got], color=["tab:green" if n in STEPS else "tab:gray" for n, _ in got])
    for y, (_, t) in enumerate(got):
        ax.annotate(f"{t:.0f}", (t, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    flex = recorded_step("flex_compiled")
    if flex:
        ax.axvline(flex["tflops"], color="tab:orange", ls="--", lw=1)
        ax.annotate("FlexAttention's throughput", (flex["tflops"], 1.0), xycoords=("data", "axes fraction"),
                    xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=7,
                    color="tab:orange")
    ax.invert_yaxis()
    ax.set(xlabel="TFLOP/s (higher is better)")
    ax.set_title(f"recorded on the H200 at {steps_case()}: the steps (green) and the libraries", fontsize=9, pad=14)
    fig.tight_layout()
    return fig


def summary() -> str:
    """Three sentences on the recorded numbers, every comparison computed from them and judged by
    whether the two timings' p20-p80 spreads overlap (:func:`minimax_lab.viz.noise.speed_words`)."""
    case, ours = steps_case(), recorded_step("v6_autotuned")
    libs = {n: recorded_step(n) for n in LIBRARIES}
    if not (ours and all(libs.values())):
        return "No H200 records of the `attention` suite with every library: `python -m minimax_lab.bench attention`."
    said = {n: noise.speed_words(ours, libs[n]) for n in LIBRARIES}
    how = ("level where the p20-p80 spreads of the two timings overlap" if "level with" in said.values()
           else "each gap outside the p20-p80 spreads of both timings")
    first = (f"At `{case}` the autotuned kernel (v6) runs at {ours['tflops']:.0f} TFLOP/s: "
             + ", ".join(f"{said[n]} {LIBRARIES[n]}" for n in LIBRARIES) + f" ({how}).")
    flex = libs["flex_compiled"]
    verdicts = {step: noise.speed_words(recorded_step(step), flex) for step in STEPS if recorded_step(step)}
    past = next((s for s, v in verdicts.items() if "faster" in v), None)
    level = [s for s, v in verdicts.items() if v == "level with"]
    second = (f"The first step measurably past FlexAttention is {past} ({verdicts[past]} it)"
              + (f"; {', '.join(level)} {'is' if len(level) == 1 else 'are'} level with it." if level else ".")
              if past else "No step is measurably past FlexAttention.")
    sides = []
    for r in recorded.all_of("attention", impl="triton"):
        cudnn = recorded.one("attention", r["case"], "sdpa_cudnn")
        if cudnn:
            word = noise.speed_words(r, cudnn)
            sides.append(("level" if word == "level with" else "behind" if "slower" in word else "ahead",
                          cudnn["ms"] / r["ms"]))
    phrase = {"ahead": "ahead of cuDNN", "level": "level with cuDNN", "behind": "behind cuDNN"}
    kinds = [k for k in phrase if any(kk == k for kk, _ in sides)]
    where = (f"{phrase[kinds[0]]} at every recorded size" if len(kinds) == 1 else
             ", ".join(f"{phrase[k]} at {sum(kk == k for kk, _ in sides)}" for k in kinds) + " of them")
    ratios = [x for _, x in sides]
    third = (f"Across the {len(sides)} recorded sizes it is {where}: {min(ratios):.2f}x to {max(ratios):.2f}x "
             f"cuDNN's throughput.")
    return " ".join([first, second, third])
