"""What the property tests of every operator share: the impls and dtypes they sweep, hypothesis's
settings, the strategies they draw layouts, dtypes and seeds from, and the checks of an impl's
outputs against the reference's. The properties themselves live beside each operator's tests
(``tests/<area>/test_<op>_properties.py``); ``tests/core/test_properties.py`` keeps the contracts
several operators share.

What every property checks, for every impl:

* **layout**: non-contiguous views (strided in the last dim, stored transposed, sliced out of a
  NaN-poisoned buffer) give the answer of contiguous copies -- each impl on the views is checked
  against the reference on contiguous inputs;
* **dtype**: every dtype the contract accepts gives the reference's answer within the tolerance
  of the dtype computed in (:func:`devices.tol`), or a clear error (float64 in the Triton kernels);
* **empty**: empty batches and zero-length sequences give the contract's empty or zero outputs,
  the same in every impl;
* **out of range**: indices out of range raise ``ValueError``.
"""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests.support.devices import ON_GPU, relative_error, tol
from tests.support.operator_inputs import LAYOUTS, relayout

IMPLS = ("reference", "torch", "triton")
MOE_IMPLS = ("reference", "loop", "torch", "triton")
FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
#: examples per property: a few on the CPU (the interpreter is slow), a few more on a GPU (there
#: each new shape/dtype compiles, and dense attention autotunes per length bucket); the environment
#: variable MINIMAX_LAB_PROPERTY_EXAMPLES overrides both (a longer hunt)
EXAMPLES = int(os.environ.get("MINIMAX_LAB_PROPERTY_EXAMPLES", 8 if ON_GPU else 5))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

layouts = st.sampled_from(LAYOUTS)
dtypes = st.sampled_from(FLOATS)
seeds = st.integers(0, 2**31 - 1)


def relayout_all(data, tensors: dict) -> dict:
    """Each tensor in a layout drawn for it."""
    return {name: relayout(t, data.draw(layouts, label=f"layout of {name}")) for name, t in tensors.items()}


def impl_outputs(impls, dtype, run):
    """``(impl, run(impl))`` for each impl whose contract takes ``dtype``; on the way, checks that
    the Triton kernels (fp16/bf16/fp32) refuse float64 with a clear error."""
    for impl in impls:
        if impl == "triton" and dtype == torch.float64:
            with pytest.raises(ValueError, match="float64"):
                run(impl)
            continue
        yield impl, run(impl)


def assert_close(got, want, dtype, what):
    """``got`` within the tolerance of ``dtype`` of ``want``; ``what`` names it in the failure."""
    err = relative_error(got, want)
    assert err <= tol(dtype), f"{what}: relative error {err:.3g} > {tol(dtype):.3g}"


def assert_same_lse(got, want, dtype, what):
    """lse rows: -inf in the same places, the finite ones close."""
    inf = torch.isinf(want)
    assert torch.equal(torch.isinf(got), inf), f"{what}: -inf rows differ"
    if (~inf).any():
        assert_close(got[~inf].to(want.dtype), want[~inf], dtype, what)
