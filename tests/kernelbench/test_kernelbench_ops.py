"""kernelbench's own operators match their fp32 references (on the kernel device: the GPU, or the
Triton interpreter on the CPU), and every available problem's reference runs on its validation
shapes and on drawn held-out shapes."""
import random

import pytest
import torch

import minimax_lab  # noqa: F401  (sets the interpreter before triton kernels are defined)
from tests.support.devices import DEVICE, tol
from minimax_lab import measure
from minimax_lab.kernelbench import ops, problems


@pytest.mark.parametrize("rows,cols,scale", [(1, 1, 1.0), (3, 37, 1.0), (2, 5000, 40.0)])
def test_softmax_triton_matches_reference(rows, cols, scale):
    x = torch.randn(rows, cols, device=DEVICE) * scale
    err = measure.relative_error(ops.softmax(x, impl="triton"), ops.softmax_reference(x.double()))
    assert err < tol(x.dtype, exact=1e-5, tf32=False)


@pytest.mark.parametrize("t,d", [(1, 1), (3, 37), (4, 256)])
def test_rmsnorm_residual_triton_matches_reference(t, d):
    x, r, w = (torch.randn(*s, device=DEVICE) for s in ((t, d), (t, d), (d,)))
    y, h = ops.rmsnorm_residual(x, r, w, impl="triton")
    y_ref, h_ref = ops.rmsnorm_residual_reference(x.double(), r.double(), w.double())
    assert measure.relative_error(y, y_ref) < tol(x.dtype, exact=1e-5, tf32=False)
    assert measure.relative_error(h, h_ref) < tol(x.dtype, exact=1e-6, tf32=False)


@pytest.mark.parametrize("shape", [(1, 1, 1, 2), (2, 3, 5, 6), (1, 4, 3, 64)])
def test_rope_triton_matches_reference(shape):
    x = torch.randn(shape, device=DEVICE)
    pos = torch.randint(0, 4096, shape[:2], dtype=torch.int32, device=DEVICE)
    err = measure.relative_error(ops.rope(x, pos, impl="triton"), ops.rope_reference(x.double(), pos))
    assert err < tol(x.dtype, tf32=False)


def test_ops_reject_bad_input():
    with pytest.raises(TypeError):
        ops.softmax([1.0, 2.0])
    with pytest.raises(ValueError):
        ops.softmax(torch.randn(2, 3, 4))
    with pytest.raises(ValueError):
        ops.rope(torch.randn(1, 2, 1, 3), torch.zeros(1, 2, dtype=torch.int32))
    with pytest.raises(ValueError):
        ops.rmsnorm_residual(torch.randn(2, 3), torch.randn(2, 4), torch.randn(3))


def test_wrong_kernel_fails_the_problem_tolerance():
    p = problems.SOFTMAX
    inputs = p.make_inputs(p.validation_shapes("cpu")[0], 1, "normal")
    wrong = torch.softmax(inputs["x"] * 1.01, dim=-1)
    assert measure.relative_error(wrong, p.reference(**inputs)) > measure.tolerance_for(torch.float32)


@pytest.mark.parametrize("name", sorted(problems.PROBLEMS))
def test_problem_reference_runs_on_validation_and_held_out_shapes(name):
    p = problems.get_problem(name)
    if p.available() is not None:
        pytest.skip(p.available())
    shapes = p.validation_shapes("cpu") + [p.draw_test_shape(random.Random(7), "cpu")]
    for shape in shapes:
        for regime in p.regimes:
            a, b = p.make_inputs(shape, 1, regime), p.make_inputs(shape, 2, regime)
            out = p.reference(**a)
            assert all(isinstance(o, torch.Tensor) for o in (out if isinstance(out, tuple) else (out,)))
            # fresh seeds give fresh inputs
            assert any(isinstance(v, torch.Tensor) and v.is_floating_point() and not torch.equal(v, b[k])
                       for k, v in a.items()) or name == "moe_align"


def test_get_problem_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown problem"):
        problems.get_problem("nope")
