"""Interactive pickers that show exactly one picture, with or without a widget frontend.

``explore(draw, layer=range(4), head=range(8))`` calls ``draw(layer=0, head=0)`` once, turns the
one matplotlib figure it drew into a PNG and displays it as a single output. In a Jupyter kernel
with ipywidgets (unless ``MINIMAX_LAB_STATIC=1``) that same output also carries sliders and
dropdowns with the picture below them: a frontend with ipywidgets support, such as JupyterLab,
shows the controls and redraws on each change; anything without one (papermill, nbconvert, a
notebook viewer) shows the PNG. Nothing waits for a frontend, so a cell never hangs, and each
picture is drawn once.

Why not ``ipywidgets.interact``: it draws through the inline backend and then also displays the
value ``draw`` returns (the same figure twice, three times with a static copy), returns the
function itself (a stray ``<function draw ...>`` line as the cell's result), and prints into an
Output widget while the cell runs. A notebook runner without a frontend (nbclient, under
papermill) answers every such print with a message on the kernel's shell channel and then
sometimes misses the cell's reply until its execution timeout
(https://github.com/jupyter/nbclient/issues/312). Here the picture goes into the Output widget
as its state, so no runner ever has to answer anything.
"""
from __future__ import annotations

import base64
import contextlib
import io
import os
import traceback
from typing import Any, Callable, Iterator, Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

#: The mime type under which Jupyter frontends look for a widget to render.
WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"


def _in_kernel() -> bool:
    """True when this code runs inside an IPython kernel (Jupyter, Colab, VS Code, papermill)."""
    try:
        from IPython import get_ipython   # deferred: optional dependency (the notebooks extra)
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def widgets_available() -> bool:
    """True when :func:`explore` attaches controls: an IPython kernel runs this code, ipywidgets
    imports, and ``MINIMAX_LAB_STATIC`` is not ``"1"``. Whether a frontend will render them does
    not matter: the PNG travels in the same output for those that cannot."""
    if os.environ.get("MINIMAX_LAB_STATIC") == "1" or not _in_kernel():
        return False
    try:
        import ipywidgets  # noqa: F401  # deferred: optional dependency (the notebooks extra)
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def _plt_show_disabled() -> Iterator[None]:
    """Inside, ``plt.show()`` does nothing: the figure ``draw`` made is shown once, by explore,
    rather than a second time by the inline backend."""
    show = plt.show
    plt.show = lambda *args, **kwargs: None
    try:
        yield
    finally:
        plt.show = show


def render_png(draw: Callable[..., Any], picked: Mapping[str, Any]) -> bytes:
    """Call ``draw(**picked)`` and return the one matplotlib figure it drew as PNG bytes.

    ``draw`` may call ``plt.show()`` and may return its figure; either way the figure is rendered
    here and closed, so nothing else shows it. Raises ValueError unless exactly one figure was
    drawn (no figure, or several, would break "one picture per choice")."""
    before = set(plt.get_fignums())
    with _plt_show_disabled():
        result = draw(**picked)
    figures = [plt.figure(n) for n in plt.get_fignums() if n not in before]
    if isinstance(result, Figure) and result not in figures:
        figures.append(result)
    try:
        if len(figures) != 1:
            name = getattr(draw, "__name__", repr(draw))
            raise ValueError(f"{name}({_call_args(picked)}) must draw exactly one matplotlib figure, "
                             f"drew {len(figures)}")
        buffer = io.BytesIO()
        figures[0].savefig(buffer, format="png", bbox_inches="tight")
        return buffer.getvalue()
    finally:
        for fig in figures:
            plt.close(fig)


def _call_args(picked: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in picked.items())


def _label(draw: Callable[..., Any], picked: Mapping[str, Any]) -> str:
    """The picture's text form (what a text-only frontend shows): ``draw_name(a=1, b='x')``."""
    return f"{getattr(draw, '__name__', 'draw')}({_call_args(picked)})"


def _png_output(png: bytes, text: str) -> dict:
    """A display_data output (the nbformat shape an Output widget holds) showing ``png``."""
    return {"output_type": "display_data", "metadata": {},
            "data": {"image/png": base64.b64encode(png).decode("ascii"), "text/plain": text}}


def _picked_values(defaults: Mapping[str, Any] | None, choices: Mapping[str, Sequence]) -> dict:
    """The first value of each choice, or its default; checks both."""
    defaults = dict(defaults or {})
    unknown = sorted(set(defaults) - set(choices))
    if unknown:
        raise ValueError(f"defaults name no choice: {unknown}; the choices are {sorted(choices)}")
    picked = {}
    for name, values in choices.items():
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise TypeError(f"choice {name!r} must be a sequence of values (a list or range), "
                            f"got {type(values).__name__}")
        values = list(values)
        if len(values) == 0:
            raise ValueError(f"choice {name!r} has no values")
        picked[name] = defaults.get(name, values[0])
        if picked[name] not in values:
            raise ValueError(f"default {name}={picked[name]!r} is not one of the choices {list(values)!r}")
    return picked


def _control(name: str, values: Sequence, value: Any):
    """An IntSlider for a run of consecutive ints, else a Dropdown; redraws on release only."""
    import ipywidgets as w   # deferred: optional dependency (the notebooks extra)
    values = list(values)
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    if ints and values == list(range(values[0], values[0] + len(values))):
        return w.IntSlider(value=value, min=values[0], max=values[-1], description=name,
                           continuous_update=False)
    return w.Dropdown(options=values, value=value, description=name)


def explore(draw: Callable[..., Any], defaults: Mapping[str, Any] | None = None, **choices: Sequence) -> None:
    """Show ``draw(**picked)`` once, with one control per choice where widgets work.

    ``choices`` maps each keyword of ``draw`` to a non-empty sequence of allowed values (a run of
    consecutive ints becomes a slider, anything else a dropdown); the first picture uses
    ``defaults`` or the first value of each. ``draw`` draws one matplotlib figure (see
    :func:`render_png`). Returns None, so a cell ending in ``explore(...)`` shows nothing more.

    In a kernel: one output whose PNG is the picture, plus the controls and the same PNG as a
    widget when :func:`widgets_available`; a change of a control re-runs ``draw`` and replaces the
    picture (an error shows its traceback in place of the picture). Outside a kernel (a script, a
    terminal) ``draw`` is simply called once. Raises TypeError/ValueError for malformed choices or
    defaults, and whatever ``draw`` raises for the first picture.
    """
    picked = _picked_values(defaults, choices)
    if not _in_kernel():
        draw(**picked)
        return None
    from IPython.display import display   # deferred: optional dependency (the notebooks extra)

    png = render_png(draw, picked)
    bundle = _png_output(png, _label(draw, picked))["data"]
    if widgets_available():
        box = explorer_box(draw, choices, picked, png)
        bundle[WIDGET_VIEW_MIME] = box._repr_mimebundle_()[WIDGET_VIEW_MIME]
    display(bundle, raw=True)
    return None


def explorer_box(draw: Callable[..., Any], choices: Mapping[str, Sequence], picked: Mapping[str, Any],
                 png: bytes):
    """The widget part of explore's output: a VBox of the controls (an HBox) above an Output
    widget holding ``png``, the picture of ``picked``; a change of a control redraws into it."""
    import ipywidgets as w   # deferred: optional dependency (the notebooks extra)

    controls = {name: _control(name, values, picked[name]) for name, values in choices.items()}
    picture = w.Output(outputs=(_png_output(png, _label(draw, picked)),))

    def redraw(_change=None):
        now = {name: control.value for name, control in controls.items()}
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                outputs = [_png_output(render_png(draw, now), _label(draw, now))]
        except Exception:  # shown where the picture was: a callback has no cell to raise into
            outputs = [{"output_type": "stream", "name": "stderr", "text": traceback.format_exc()}]
        if printed.getvalue():
            outputs.insert(0, {"output_type": "stream", "name": "stdout", "text": printed.getvalue()})
        picture.outputs = tuple(outputs)

    for control in controls.values():
        control.observe(redraw, names="value")
    return w.VBox([w.HBox(list(controls.values()), layout=w.Layout(flex_flow="row wrap")), picture])
