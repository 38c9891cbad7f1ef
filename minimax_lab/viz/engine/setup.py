"""Chapter 09's one setup call (:func:`setup`): the preset and device, the M3-shaped model at the
preset's size, the step prices the sweeps charge, and every recorded engine record.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from minimax_lab import measure, runtime
from minimax_lab.bench.suite_engine_prices import Prices, gpu_prices
from minimax_lab.engine.config import M3Config, m3_config, param_count
from minimax_lab.engine.model_m3 import M3Model


@dataclass
class Chapter:
    """What chapter 09 runs with: ``preset`` (``"cpu"`` or ``"gpu"``), the kernels' ``device``, the
    model's ``cfg`` and ``model``, the GPU-size model's step ``prices`` (recorded, else modelled),
    the recorded engine ``records`` of every device, and the chapter's start time ``t0``."""

    preset: str
    device: object
    cfg: M3Config
    model: M3Model
    prices: Prices | None
    records: list = field(default_factory=list)
    t0: float = 0.0

    def summary(self) -> str:
        """One line: the device, the preset, the model's size and dtype, what prices the sweeps."""
        n = param_count(self.cfg)
        size = f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n:,}"
        prices = self.prices.label() if self.prices else "no step prices (no engine records found)"
        return (f"{runtime.device_name()}, preset {self.preset}: the M3-shaped model here has {size} parameters "
                f"({self.cfg.dtype}); the load sweeps price the GPU-size model's steps by {prices}")


def setup(preset: str = "auto") -> Chapter:
    """Resolve ``preset``, build the model at its size (random weights, seed 0) on the kernels'
    device, and load the step prices (:func:`~minimax_lab.bench.suite_engine_prices.gpu_prices`) and
    the recorded engine records."""
    t0 = time.perf_counter()
    P = runtime.resolve_preset(preset)
    dev = runtime.kernel_device()
    cfg = m3_config(P)
    return Chapter(P, dev, cfg, M3Model.create(cfg, dev), gpu_prices(), measure.load_records(None, suite="engine"), t0)
