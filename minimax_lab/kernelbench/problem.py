"""What a problem of the bench is: what a candidate kernel must compute, on which shapes, to what
tolerance -- and the seeded draws every problem's inputs are made with.

A :class:`Problem` holds

* ``reference(**inputs)`` -- the readable answer (run in fp32/fp64 by the harness);
* ``make_inputs(shape, seed, regime)`` -- fresh seeded inputs; ``regime`` picks the value
  distribution (``"normal"``; harder ones such as ``"large"`` or ``"tiny"`` magnitudes), because a
  kernel right on N(0, 1) can be wrong where real activations live;
* ``validation_shapes(preset)`` -- the *public* shapes a submitter may tune on;
* ``draw_test_shape(rng, preset)`` -- held-out shapes. The harness calls it with a
  ``random.Random`` seeded from ``os.urandom`` inside its evaluate call, only after the candidate
  is fixed; no seed or list of test shapes is stored on a problem;
* ``tol`` (relative norm error; ``None`` = by dtype from :data:`minimax_lab.bench.TOLERANCES`,
  ``0`` = integer outputs must match exactly);
* ``best()`` -- the workbook's fastest implementation (or ``None`` for an open problem: then the
  reference is the baseline to beat);
* ``strong_peer()`` -- the :class:`Peer` a user would pick instead of writing a kernel (``torch.softmax``
  in the input's dtype, ``F.rms_norm`` after the add, a serving engine's RoPE, SDPA over a contiguous
  cache, PyTorch's vectorized MSA selection, the FP8 grouped GEMMs of ``torch._scaled_grouped_mm``).
  The harness times it beside every candidate and reports the speed-up against it first: a ratio
  to the fp32 reference alone flatters any kernel (the catalogue's family "a weak baseline");
* ``available()`` -- ``None``, or a message saying why the problem cannot be scored here;
* ``traffic(**inputs)`` -- ``(flops, bytes)`` that any correct kernel must at least execute and
  move on these inputs (read every input it needs once, write every output once); the harness
  flags a time below what the device's measured ceilings allow for them as impossible;
* ``shortcut(shape)`` -- ``None``, or why the workbook's implementation would take a path that is
  not its kernel at this shape (the harness refuses to time a problem at such a shape).

The problems themselves live in ``problem_<family>.py`` modules; :mod:`.problems` registers them.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Any, Callable, Mapping

import torch

from minimax_lab import runtime


Shape = Mapping[str, int]


@dataclasses.dataclass(frozen=True)
class Peer:
    """The implementation a user would pick instead of writing a kernel, timed beside every candidate.

    ``run(**prepare(inputs))`` is timed; ``prepare`` (untimed, like a serving engine's setup)
    builds the layout the peer reads: a contiguous KV cache, a table of cosines and sines.
    ``same_contract``: it computes the problem's answer (the harness checks it once on the timing
    inputs); False for a peer that computes a related, larger function (dense attention for a
    sparse one) -- then it is timed, not judged. ``note`` says what it is and where it comes from."""

    name: str
    run: Callable[..., Any]
    prepare: Callable[[dict], dict] = dict
    same_contract: bool = True
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Problem:
    """One operator to be implemented; see the module docstring for each field."""

    name: str
    description: str
    reference: Callable[..., Any]
    make_inputs: Callable[[Shape, int, str], dict]
    validation_shapes: Callable[[str], list[dict]]
    draw_test_shape: Callable[[random.Random, str], dict]
    timing_shape: Callable[[str], dict]
    tol: float | None = None
    regimes: tuple[str, ...] = ("normal",)
    best: Callable[[], Callable | None] = lambda: None
    strong_peer: Callable[[], Peer | None] = lambda: None
    available: Callable[[], str | None] = lambda: None
    open: bool = False
    cost: Callable[[Shape], tuple[float, float]] | None = None  # (flops, bytes) of one call
    traffic: Callable[..., tuple[float, float]] | None = None  # minimum (flops, bytes) on given inputs
    shortcut: Callable[[Shape], str | None] = lambda shape: None

    def __repr__(self) -> str:  # short: problems get printed in notebooks
        return f"Problem({self.name!r}{', open' if self.open else ''})"


def _gen(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(int(seed) % 2**63)


def _dtype() -> torch.dtype:
    return runtime.compute_dtype()


def _dev() -> torch.device:
    return runtime.kernel_device()


def _scaled(t: torch.Tensor, regime: str, seed: int = 0) -> torch.Tensor:
    """Value regimes: normal N(0,1); large (x 1e3: fp16 sums of squares overflow); tiny (x 1e-4:
    squares underflow in fp16); outliers (a few entries x 100, as in LLM activations)."""
    if regime == "large":
        return t * 1e3
    if regime == "tiny":
        return t * 1e-4
    if regime == "outliers":
        mask = torch.rand(t.shape, generator=_gen(seed + 7, t.device), device=t.device) < 0.01
        return torch.where(mask, t * 100, t)
    if regime == "logits":
        return t * 40  # sharp softmax: exp without the max trick overflows
    if regime != "normal":
        raise ValueError(f"unknown input regime {regime!r}")
    return t


def _randn(shape, seed, regime, dtype=None):
    dev = _dev()  # drawn where it is used: a GPU-size KV cache drawn on the CPU takes seconds
    t = _scaled(torch.randn(shape, generator=_gen(seed, dev), device=dev), regime, seed)
    return t.to(dtype=dtype or _dtype())


def _nbytes(*tensors: torch.Tensor) -> float:
    return float(sum(t.numel() * t.element_size() for t in tensors))
