"""Interactive pickers that degrade to a static picture when no widget frontend is there.

``explore(draw, layer=range(4), head=range(8))`` shows sliders/dropdowns in JupyterLab or
Colab and calls ``draw(layer=..., head=...)`` on each change. Under papermill, in CI, or
without ipywidgets (or with ``MINIMAX_LAB_STATIC=1``), it draws once with the first value
of each choice (or the ``defaults`` given), so the notebook still shows a picture.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Sequence


def widgets_available() -> bool:
    """True when ipywidgets imports and static mode was not asked for."""
    if os.environ.get("MINIMAX_LAB_STATIC") == "1":
        return False
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def explore(draw: Callable[..., Any], defaults: Mapping[str, Any] | None = None, **choices: Sequence) -> Any:
    """Call ``draw(**picked)`` interactively, or once statically; returns the widget or the
    static result. Each choice must be a non-empty sequence of allowed values."""
    for name, values in choices.items():
        if len(values) == 0:
            raise ValueError(f"choice {name!r} has no values")
    picked = {name: (defaults or {}).get(name, values[0]) for name, values in choices.items()}
    if not widgets_available():
        return draw(**picked)
    import ipywidgets as w

    controls = {}
    for name, values in choices.items():
        values = list(values)
        if all(isinstance(v, int) for v in values) and values == list(range(values[0], values[-1] + 1)):
            controls[name] = w.IntSlider(value=picked[name], min=values[0], max=values[-1], description=name)
        else:
            controls[name] = w.Dropdown(options=values, value=picked[name], description=name)
    return w.interact(draw, **controls)
