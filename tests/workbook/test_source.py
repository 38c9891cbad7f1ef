"""show_source: the package's code with its file, line numbers and a link, for notebooks."""
import pytest

from minimax_lab import measure
from minimax_lab.viz.source import REPOSITORY, show_source


def test_shows_a_function_with_numbered_lines_and_a_link():
    src = show_source(measure.check)
    assert src.path == "minimax_lab/measure/check.py" and src.first > 1 and src.last > src.first
    text = str(src)
    assert "def check(" in text and f"{src.first} | " in text
    assert src.url.startswith(f"{REPOSITORY}/blob/main/minimax_lab/measure/check.py#L{src.first}-L{src.last}")
    assert src.url in src._repr_markdown_()


def test_shows_a_triton_kernel():
    from minimax_lab.attention import dense_triton

    src = show_source(dense_triton._tile_update)
    assert "@triton.jit" in src.text and "def _tile_update" in src.text


def test_refuses_what_has_no_source():
    with pytest.raises(TypeError, match="show_source needs"):
        show_source(42)
