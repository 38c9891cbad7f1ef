"""Bench suite ``ceilings``: the device's measured copy bandwidth and matrix-multiply rate
(:func:`minimax_lab.measure.ceilings`) as records -- case groups ``copy`` and ``gemm``."""
from __future__ import annotations

from minimax_lab import measure

#: the suite's case groups (both by default)
CASES = ("copy", "gemm")


def run(preset: str = "auto", cases=None) -> list[dict]:
    """Records of the ceilings in ``cases`` (default both); measured once per process."""
    chosen = measure.select_cases(cases, CASES)
    c = measure.ceilings()
    recs = []
    if "copy" in chosen:
        recs.append(measure.make_record("ceilings", "copy", "torch.copy_", 1.0,
                                        extra={"gbps": c.copy_gbps, "method": c.method}))
    if "gemm" in chosen:
        recs.append(measure.make_record("ceilings", f"gemm_{c.gemm_dtype}", "torch.matmul", 1.0,
                                        extra={"tflops": c.gemm_tflops, "method": c.method}))
    return recs
