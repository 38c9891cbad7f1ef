"""The recorded steps v1 -> v6 of chapter 02: from the 40-line FlashAttention kernel to the package's.

Each step is a fixed launch config of :func:`minimax_lab.attention.dense_triton.flash_attention`
(:data:`minimax_lab.bench.suite_attention.STEP_CONFIGS`), one change on top of the step before,
recorded on the H200 by the ``attention`` bench suite in the same run as the autotuned kernel (v6)
and the libraries. This module looks the records up, shows a step as a config diff with its
recorded number and a check here, draws the launch order and the recorded figure, and writes the
sentences that compare the numbers (:mod:`minimax_lab.notebook.words`), so none can contradict them.
"""
from __future__ import annotations

import difflib

import matplotlib.pyplot as plt
import numpy as np

from minimax_lab import runtime
from minimax_lab.attention import dense_triton
from minimax_lab.bench import suite_attention
from minimax_lab.notebook import recorded, words
from minimax_lab.viz import live_vs_recorded
from minimax_lab.viz.excerpt import excerpt as excerpt_lines
from minimax_lab.viz.source import Source, show_source

#: the steps, in order: v1..v5 fixed configs, v6 the autotuner's pick
STEPS = [*suite_attention.STEP_CONFIGS["gpu"], "v6_autotuned"]
#: the libraries the steps are compared with, and how the chapter names them
LIBRARIES = {"sdpa_flash": "SDPA flash (FlashAttention-2)", "flex_compiled": "FlexAttention (compiled)",
             "sdpa_cudnn": "SDPA cuDNN"}
#: the L2 of the machine the steps were recorded on (an H200), for the launch-order arithmetic off a GPU
RECORDED_L2_BYTES = 50 * 2**20


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
        moved = f"; from {prev}, the throughput {words.change(before['tflops'], now['tflops'], unit='TFLOP/s')}" \
            if before else ""
        print(f"\nrecorded on the H200 at {steps_case()}: {now['tflops']:.0f} TFLOP/s, {now['ms']:.2f} ms{moved}")
    if step == "v6_autotuned" and now:
        same = step_config(step) == step_config(prev)
        print("the autotuner picked " + ("v5's config: the two numbers differ only by run-to-run noise" if same else
                                         "a config other than v5's (the diff above)"))
    config = None if step == "v6_autotuned" else step_config(step)
    r = suite_attention.check_config(config, preset, name=step)
    print(f"checked here: {r.summary()}")
    if not r.passed:
        raise AssertionError(r.summary())


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


def l2_lines(B: int = 4, S: int = 16384, H: int = 16, D: int = 128) -> str:
    """The launch-order arithmetic of v4: K/V bytes of one head, and of all heads, against the L2."""
    kv_head = 2 * S * D * 2                                 # K and V of one head, bf16
    l2 = runtime.l2_cache_bytes() if runtime.device().type == "cuda" else RECORDED_L2_BYTES
    where = "this GPU's" if runtime.device().type == "cuda" else "the H200's"
    return (f"at S={S}: K+V of one head = {kv_head / 2**20:.0f} MiB. Head index fastest, consecutive programs belong "
            f"to different heads, so the programs in flight read the K/V of up to all {B * H} heads: "
            f"{B * H * kv_head / 2**20:,.0f} MiB against {where} {l2 / 2**20:.0f} MiB of L2. One head's tiles "
            f"together: {kv_head / 2**20:.0f} MiB, which fits.")


def plot_launch_order(n_heads: int = 16, tiles_m: int = 32, resident: int = 40):
    """Which (head, query tile) the first ``resident`` programs own, in the two launch orders, from
    the kernel's own index math (:func:`~minimax_lab.attention.dense_triton.launch_order`)."""
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.4))
    for a, group, title in ((ax[0], 1024, "GROUP_H=1024: head index fastest (v1-v3)"),
                            (ax[1], 1, "GROUP_H=1: one head's tiles together (v4)")):
        wave = np.zeros((n_heads, tiles_m))
        for h, mt in dense_triton.launch_order(n_heads, tiles_m, group)[:resident]:
            wave[h, mt] = 1
        a.imshow(wave, cmap="Blues", aspect="auto")
        a.set(title=f"{title}\nfirst {resident} programs: {int(wave.any(1).sum())} heads' K/V in flight",
              xlabel="query tile", ylabel="(batch, head)")
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


def measured_vs_recorded(measured: list[dict]) -> str:
    """Records measured now (the suite's own case, run in the chapter) beside the H200's at the same
    shape, as a table with the ratio; a sentence instead where no recorded case matches."""
    recs = recorded.all_of("attention")
    if not measured:
        return ""
    if not any(r["case"] == m["case"] for r in recs for m in measured):
        return (f"(no H200 record at {measured[0]['case']}: the CPU preset times a tiny case; on a GPU this "
                "compares the same shape)")
    return live_vs_recorded.format_rows(measured, recs, "tflops", device_now=runtime.device_name())


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
        ax.axvline(flex["tflops"], color="tab:orange", ls="--", lw=1, label="FlexAttention's throughput")
        ax.legend(fontsize=8, loc="lower right")
    ax.invert_yaxis()
    ax.set(xlabel="TFLOP/s (higher is better)",
           title=f"recorded on the H200 at {steps_case()}: the steps (green) and the libraries")
    ax.title.set_fontsize(9)
    fig.tight_layout()
    return fig


def summary() -> str:
    """Three sentences on the recorded numbers, every comparison computed from them."""
    case, ours = steps_case(), recorded_step("v6_autotuned")
    libs = {n: recorded_step(n) for n in LIBRARIES}
    if not (ours and all(libs.values())):
        return "No H200 records of the `attention` suite with every library: `python -m minimax_lab.bench attention`."
    versus = ", ".join(f"{words.speed(ours['ms'], libs[n]['ms'])} {LIBRARIES[n]}" for n in LIBRARIES)
    first = f"At `{case}` the autotuned kernel (v6) runs at {ours['tflops']:.0f} TFLOP/s: {versus}."
    flex = libs["flex_compiled"]
    verdicts = {step: words.speed(recorded_step(step)["ms"], flex["ms"]) for step in STEPS if recorded_step(step)}
    past = next((s for s, v in verdicts.items() if "faster" in v), None)
    level = [s for s, v in verdicts.items() if v.startswith("about")]
    second = (f"The first step clearly past FlexAttention is {past} ({verdicts[past]} it)"
              + (f"; {', '.join(level)} {'is' if len(level) == 1 else 'are'} about as fast as it." if level else ".")
              if past else "No step is clearly past FlexAttention.")
    ratios = []
    for r in recorded.all_of("attention", impl="triton"):
        cudnn = recorded.one("attention", r["case"], "sdpa_cudnn")
        if cudnn:
            ratios.append(cudnn["ms"] / r["ms"])
    where = ("behind cuDNN at every recorded size" if max(ratios) < 0.97 else
             "ahead of cuDNN at every recorded size" if min(ratios) > 1.03 else "level with cuDNN at some sizes")
    third = (f"Across the {len(ratios)} recorded sizes it is {where}: {min(ratios):.2f}x to {max(ratios):.2f}x "
             f"cuDNN's throughput.")
    return " ".join([first, second, third])
