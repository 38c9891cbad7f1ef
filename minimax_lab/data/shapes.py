"""Procedural scenes: coloured shapes on a grid, rendered as small RGB images.

An image is ``size x size`` pixels (default 32), split into a ``grid x grid`` lattice of cells
(default 4 x 4, so one cell = one 8 x 8 patch of the model's patch embedding). Every object sits
inside one cell, which makes "the patches of the object" a well-defined set for the grounding
experiment. Rendering is pure numpy and deterministic given the objects and the jitter.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

COLOURS = {"red": (0.9, 0.1, 0.1), "green": (0.1, 0.8, 0.2), "blue": (0.15, 0.3, 0.95), "yellow": (0.95, 0.85, 0.1)}
SHAPES = ("square", "circle", "triangle")
IMAGE_SIZE = 32
GRID = 4


@dataclass(frozen=True)
class SceneObject:
    """One object: its shape, its colour name and its grid cell (row, col), 0-based."""

    shape: str
    colour: str
    row: int
    col: int


@lru_cache(maxsize=None)
def _mask(shape: str, cell: int, dy: int, dx: int) -> np.ndarray:
    """Boolean ``[cell, cell]`` mask of one shape, centred and shifted by (dy, dx) pixels."""
    yy, xx = np.mgrid[0:cell, 0:cell].astype(np.float32)
    c = (cell - 1) / 2.0
    c_y, c_x = c + dy, c + dx
    r = cell * 0.36
    if shape == "square":
        m = (np.abs(yy - c_y) <= r) & (np.abs(xx - c_x) <= r)
    elif shape == "circle":
        m = (yy - c_y) ** 2 + (xx - c_x) ** 2 <= (r + 0.5) ** 2
    elif shape == "triangle":  # apex up: width grows linearly with the row
        top, bottom = c_y - r, c_y + r
        half = (yy - top) / max(bottom - top, 1e-6) * r
        m = (yy >= top) & (yy <= bottom) & (np.abs(xx - c_x) <= half)
    else:
        raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")
    m.setflags(write=False)
    return m


def _shape_mask(shape: str, cell: int, rng: np.random.Generator | None) -> np.ndarray:
    """The mask of one shape, with a random 1-pixel jitter in each direction when ``rng`` is given."""
    dy, dx = (int(v) for v in rng.integers(-1, 2, size=2)) if rng is not None else (0, 0)
    return _mask(shape, cell, dy, dx)


def render(objects, *, size: int = IMAGE_SIZE, grid: int = GRID, rng: np.random.Generator | None = None) -> torch.Tensor:
    """Draw ``objects`` on a dark background; returns float32 ``[3, size, size]`` in [0, 1].

    Raises ValueError if ``size`` is not a multiple of ``grid`` or an object is off the grid.
    """
    if size % grid:
        raise ValueError(f"image size {size} must be a multiple of the grid {grid}")
    cell = size // grid
    img = np.full((size, size, 3), 0.05, dtype=np.float32)
    for o in objects:
        if not (0 <= o.row < grid and 0 <= o.col < grid):
            raise ValueError(f"object {o} is outside the {grid}x{grid} grid")
        if o.colour not in COLOURS:
            raise ValueError(f"unknown colour {o.colour!r}; expected one of {tuple(COLOURS)}")
        m = _shape_mask(o.shape, cell, rng)
        block = img[o.row * cell:(o.row + 1) * cell, o.col * cell:(o.col + 1) * cell]
        block[m] = COLOURS[o.colour]
    return torch.from_numpy(img).permute(2, 0, 1).contiguous()
