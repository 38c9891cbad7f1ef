"""explore() shows exactly one picture per call and never waits for a frontend.

In-process tests cover the picture, the controls and bad input; kernel tests execute a small
notebook with nbclient (what papermill runs: an IPython kernel with no frontend attached) under
the inline backend and under Agg, with ipywidgets importable or not and with MINIMAX_LAB_STATIC
set or not, and check each explore cell's outputs and wall time.
"""
from __future__ import annotations

import base64
import time
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from minimax_lab.viz import widgets  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def draw_and_show(a=0, b="x"):
    """Like notebook 02's draw_schedule: draws, calls plt.show(), returns None."""
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, a + 1])
    ax.set_title(b)
    plt.show()


def draw_and_return(a=0, b="x"):
    """Like explore_attention's draw: returns the figure."""
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.bar([0], [a + 1])
    return fig


# ---- in-process ---------------------------------------------------------------------------------

@pytest.mark.parametrize("draw", [draw_and_show, draw_and_return])
def test_render_png_returns_the_one_figure_and_closes_it(draw):
    open_before = plt.get_fignums()
    png = widgets.render_png(draw, {"a": 1, "b": "y"})
    assert png.startswith(PNG_SIGNATURE) and len(png) > 1000
    assert plt.get_fignums() == open_before, "the drawn figure must be closed, or the inline backend shows it again"


def test_render_png_needs_exactly_one_figure():
    def nothing(a):
        pass

    def two(a):
        plt.figure()
        plt.figure()

    open_before = plt.get_fignums()  # another test in this worker may have left one open
    with pytest.raises(ValueError, match="exactly one matplotlib figure, drew 0"):
        widgets.render_png(nothing, {"a": 1})
    with pytest.raises(ValueError, match="drew 2"):
        widgets.render_png(two, {"a": 1})
    assert plt.get_fignums() == open_before


def test_explore_rejects_bad_choices_and_defaults():
    with pytest.raises(ValueError, match="choice 'a' has no values"):
        widgets.explore(draw_and_show, a=[])
    with pytest.raises(ValueError, match=r"defaults name no choice: \['c'\]"):
        widgets.explore(draw_and_show, defaults={"c": 1}, a=range(3))
    with pytest.raises(ValueError, match="default a=7 is not one of the choices"):
        widgets.explore(draw_and_show, defaults={"a": 7}, a=range(3))
    with pytest.raises(TypeError, match="choice 'b' must be a sequence"):
        widgets.explore(draw_and_show, a=range(3), b="xy")


def test_explore_outside_a_kernel_calls_draw_once_and_returns_none():
    calls = []

    def draw(a, b):
        calls.append((a, b))
        plt.figure()

    assert not widgets.widgets_available()  # pytest runs no kernel
    assert widgets.explore(draw, defaults={"b": "y"}, a=range(2, 5), b=["x", "y"]) is None
    assert calls == [(2, "y")]
    plt.close("all")


def test_controls_redraw_the_picture_in_place():
    pytest.importorskip("ipywidgets")
    first = widgets.render_png(draw_and_show, {"a": 0, "b": "x"})
    box = widgets.explorer_box(draw_and_show, {"a": range(3), "b": ["x", "y"]}, {"a": 0, "b": "x"}, first)
    (slider, dropdown), picture = box.children[0].children, box.children[1]
    assert type(slider).__name__ == "IntSlider" and (slider.min, slider.max, slider.value) == (0, 2, 0)
    assert type(dropdown).__name__ == "Dropdown" and dropdown.options == ("x", "y")
    assert _pngs(picture.outputs) == [first]

    slider.value = 2
    (redrawn,) = _pngs(picture.outputs)
    assert redrawn != first and redrawn == widgets.render_png(draw_and_show, {"a": 2, "b": "x"})
    assert plt.get_fignums() == []


def test_a_failing_redraw_shows_its_traceback_instead_of_the_picture():
    pytest.importorskip("ipywidgets")

    def draw(a):
        if a == 1:
            raise RuntimeError("no picture for a=1")
        plt.figure()

    box = widgets.explorer_box(draw, {"a": [0, 1]}, {"a": 0}, widgets.render_png(draw, {"a": 0}))
    box.children[0].children[0].value = 1
    (out,) = box.children[1].outputs
    assert out["name"] == "stderr" and "no picture for a=1" in out["text"]


def _pngs(outputs) -> list[bytes]:
    return [base64.b64decode(o["data"]["image/png"]) for o in outputs if "image/png" in o.get("data", {})]


# ---- under an IPython kernel without a frontend (nbclient, what papermill runs) -----------------

SETUP = """
import os, sys
import matplotlib.pyplot as plt
from minimax_lab.viz.widgets import explore

def draw_and_show(a=0, b="x"):
    fig, ax = plt.subplots(figsize=(2, 2)); ax.plot([0, a + 1]); ax.set_title(b); plt.show()

def draw_and_return(a=0, b="x"):
    fig, ax = plt.subplots(figsize=(2, 2)); ax.bar([0], [a + 1]); return fig
"""
#: (name, cell source, whether the output must carry the widget view). The no-ipywidgets case
#: runs first, before anything imports ipywidgets in the kernel.
CASES = [
    ("no ipywidgets", 'sys.modules["ipywidgets"] = None\n'
                      'explore(draw_and_show, a=range(3), b=["x", "y"])\n'
                      'del sys.modules["ipywidgets"]', False),
    ("widgets, draw shows", 'explore(draw_and_show, a=range(3), b=["x", "y"])', True),
    ("widgets, draw returns", 'explore(draw_and_return, defaults={"a": 2}, a=range(3), b=["x", "y"])', True),
    ("MINIMAX_LAB_STATIC=1", 'os.environ["MINIMAX_LAB_STATIC"] = "1"\n'
                             'explore(draw_and_return, a=range(3), b=["x", "y"])\n'
                             'del os.environ["MINIMAX_LAB_STATIC"]', False),
    ("widgets again", 'explore(draw_and_show, defaults={"b": "y"}, a=range(3), b=["x", "y"])', True),
]
#: What the checker must catch: ipywidgets.interact's way, a figure shown by plt.show() and then
#: displayed again as the cell's value (without an Output widget, so it cannot stall the runner).
DRAWN_TWICE = "fig = draw_and_return()\nplt.show()\nfig"
#: A cell slower than this (seconds) waited on something; every explore cell here takes < 2 s.
SLOW_CELL_S = 20


def picture_problems(outputs: list[dict], *, widget: bool) -> list[str]:
    """What is wrong with an explore cell's outputs (empty list = one picture, nothing else)."""
    problems = []
    if len(outputs) != 1:
        problems.append(f"{len(outputs)} outputs instead of one: "
                        f"{[o.get('output_type') for o in outputs]}")
    for o in outputs:
        data = o.get("data", {})
        if o.get("output_type") != "display_data":
            problems.append(f"a {o.get('output_type')} output: {o.get('text') or data.get('text/plain')!r}")
        if "image/png" not in data or not base64.b64decode(data["image/png"]).startswith(PNG_SIGNATURE):
            problems.append(f"an output without a PNG: {sorted(data)}")
        if (WIDGET_VIEW in data) != widget:
            problems.append(f"widget view {'missing' if widget else 'present'}: {sorted(data)}")
    return problems


def test_picture_checker_catches_extra_outputs():
    png = {"image/png": base64.b64encode(PNG_SIGNATURE + b"x").decode(), "text/plain": "f()"}
    one = {"output_type": "display_data", "data": png, "metadata": {}}
    assert picture_problems([one], widget=False) == []
    assert picture_problems([one, one], widget=False)
    assert picture_problems([{**one, "output_type": "execute_result"}], widget=False)
    stray = {"output_type": "execute_result", "data": {"text/plain": "<function draw_schedule at 0x7f>"}}
    assert any("draw_schedule" in p for p in picture_problems([one, stray], widget=False))
    assert picture_problems([one], widget=True)
    assert picture_problems([{**one, "data": {"text/plain": "f()"}}], widget=False)


@pytest.mark.parametrize("backend", ["inline", "Agg"])
def test_explore_under_a_kernel_without_frontend(backend, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.delenv("MINIMAX_LAB_STATIC", raising=False)
    if backend == "inline":
        monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's default: inline
    else:
        monkeypatch.setenv("MPLBACKEND", backend)
    sources = [SETUP] + [src for _, src, _ in CASES] + [DRAWN_TWICE]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    client = nbclient.NotebookClient(nb, timeout=2 * SLOW_CELL_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}})
    # The cause of papermill's stalls: an Output widget capturing prints while the cell runs makes
    # nbclient register an output hook and answer each print on the shell channel. Record any.
    hooks, register = [], client.register_output_hook
    client.register_output_hook = lambda msg_id, hook: (hooks.append(msg_id), register(msg_id, hook))
    seconds = []
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            t0 = time.perf_counter()
            client.execute_cell(cell, index)
            seconds.append(time.perf_counter() - t0)

    problems = {name: picture_problems(cell.outputs, widget=widget)
                for (name, _, widget), cell in zip(CASES, nb.cells[1:])}
    assert all(not p for p in problems.values()), problems
    slow = {name: round(s, 1) for (name, _, _), s in zip(CASES, seconds[1:]) if s > SLOW_CELL_S}
    assert not slow, f"explore cells waited (s): {slow}"
    assert hooks == [], "explore captured output into an Output widget while the cell ran"
    assert picture_problems(nb.cells[-1].outputs, widget=False), "the checker missed a figure drawn twice"

    # The widget outputs hold real controls above the same picture, as widget state.
    state = client.widget_state  # model id -> the state the kernel sent
    model = lambda ref: state[ref.removeprefix("IPY_MODEL_")]  # noqa: E731
    for (name, _, widget), cell in zip(CASES, nb.cells[1:]):
        if widget:
            data = cell.outputs[0]["data"]
            controls, picture = map(model, state[data[WIDGET_VIEW]["model_id"]]["children"])
            kinds = [model(ref)["_model_name"] for ref in controls["children"]]
            assert kinds == ["IntSliderModel", "DropdownModel"], (name, kinds)
            (shown,) = picture["outputs"]
            assert shown["data"]["image/png"] == data["image/png"], name
