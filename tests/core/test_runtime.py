"""Runtime selection: device, interpreter switch, dtype and presets."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from tests.support.devices import DEVICE, ON_GPU, cpu_only, gpu_only

from minimax_lab import runtime

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _probe(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "MINIMAX_LAB_DEVICE", "MINIMAX_LAB_INTERPRET")}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=120)


@cpu_only("checks what the runtime picks without a GPU; test_gpu_means_compiled_kernels_and_bf16 is its GPU twin")
def test_no_gpu_means_interpreter_and_fp32():
    assert runtime.DEVICE == "cpu"
    assert runtime.INTERPRET is True
    assert os.environ.get("TRITON_INTERPRET") == "1"
    assert runtime.compute_dtype() == torch.float32
    assert runtime.kernel_device().type == "cpu"


@gpu_only
def test_gpu_means_compiled_kernels_and_bf16():
    assert runtime.DEVICE == "cuda" and runtime.INTERPRET is False
    assert os.environ.get("TRITON_INTERPRET", "0") != "1"
    assert runtime.kernel_device().type == "cuda" and runtime.resolve_preset("auto") == "gpu"
    major, _ = torch.cuda.get_device_capability()
    assert runtime.compute_dtype() == (torch.bfloat16 if major >= 8 else torch.float16)
    info = runtime.describe()
    assert info["device_kind"] == "cuda" and info["interpreter"] is False and info["sm_count"] > 0
    assert runtime.l2_cache_bytes() > 0


def test_tests_compute_where_the_kernels_take_their_inputs():
    """The tests' device (tests/devices.py) is the runtime's kernel device, and a GPU run is one."""
    assert DEVICE == runtime.kernel_device()
    assert ON_GPU == (not runtime.is_interpreter() and torch.cuda.is_available())


def test_interpreter_is_switched_on_before_kernels_are_defined():
    """A Triton kernel defined after `import minimax_lab` runs (interpreted) on CPU tensors."""
    code = (
        "import minimax_lab, os, torch, triton, triton.language as tl\n"
        "@triton.jit\n"
        "def add(x, y, o, n, B: tl.constexpr):\n"
        "    i = tl.program_id(0) * B + tl.arange(0, B)\n"
        "    m = i < n\n"
        "    tl.store(o + i, tl.load(x + i, mask=m) + tl.load(y + i, mask=m), mask=m)\n"
        "x, y = torch.randn(100), torch.randn(100); o = torch.empty(100)\n"
        "add[(4,)](x, y, o, 100, B=32)\n"
        "assert torch.allclose(o, x + y); print(os.environ['TRITON_INTERPRET'])\n"
    )
    r = _probe(code, MINIMAX_LAB_DEVICE="cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"


@gpu_only
def test_without_overrides_a_gpu_compiles_kernels_defined_after_import(tmp_path):
    """No TRITON_INTERPRET on a GPU: a kernel defined after `import minimax_lab` is compiled and
    runs on CUDA tensors (compiled @triton.jit needs its source in a file, not `python -c`)."""
    code = (
        "import minimax_lab, os, torch, triton, triton.language as tl\n"
        "@triton.jit\n"
        "def add(x, y, o, n, B: tl.constexpr):\n"
        "    i = tl.program_id(0) * B + tl.arange(0, B)\n"
        "    m = i < n\n"
        "    tl.store(o + i, tl.load(x + i, mask=m) + tl.load(y + i, mask=m), mask=m)\n"
        "x, y = torch.randn(100, device='cuda'), torch.randn(100, device='cuda'); o = torch.empty_like(x)\n"
        "add[(4,)](x, y, o, 100, B=32)\n"
        "assert torch.allclose(o, x + y); print(os.environ.get('TRITON_INTERPRET', 'unset'))\n"
    )
    script = tmp_path / "kernel_after_import.py"
    script.write_text(code)
    r = _probe(f"exec(compile(open({str(script)!r}).read(), {str(script)!r}, 'exec'))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "unset"


def test_overrides_are_read_and_checked():
    r = _probe("from minimax_lab import runtime as r; print(r.DEVICE, r.INTERPRET)", MINIMAX_LAB_DEVICE="cpu", MINIMAX_LAB_INTERPRET="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["cpu", "False"]
    bad = _probe("import minimax_lab", MINIMAX_LAB_DEVICE="tpu")
    assert bad.returncode != 0 and "MINIMAX_LAB_DEVICE" in bad.stderr
    if not torch.cuda.is_available():
        no_gpu = _probe("import minimax_lab", MINIMAX_LAB_DEVICE="cuda")
        assert no_gpu.returncode != 0 and "no CUDA" in no_gpu.stderr


def test_presets():
    assert runtime.resolve_preset("cpu") == "cpu"
    assert runtime.resolve_preset("auto") == ("gpu" if runtime.DEVICE == "cuda" else "cpu")
    assert runtime.pick("cpu", cpu=1, gpu=2) == 1
    with pytest.raises(ValueError, match="preset must be one of"):
        runtime.resolve_preset("huge")
    if runtime.DEVICE == "cpu":
        with pytest.raises(ValueError, match="needs a CUDA GPU"):
            runtime.resolve_preset("gpu")


def test_describe_names_versions():
    info = runtime.describe()
    assert info["torch"] == torch.__version__
    assert info["triton"] and info["device"]


def test_the_triton_this_run_asked_for_is_the_one_imported():
    """`make test` runs the kernel tests a second time under Triton's newest release; this proves
    that pass really imported it (MINIMAX_LAB_EXPECT_TRITON names the version it installed)."""
    import triton

    expected = os.environ.get("MINIMAX_LAB_EXPECT_TRITON")
    if expected:
        assert triton.__version__ == expected, f"expected triton {expected}, imported {triton.__version__}"
    else:
        assert triton.__version__  # the pinned pass: any installed version


def test_interpreter_problem_names_the_measured_trap(monkeypatch):
    import numpy
    import triton

    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(numpy, "__version__", "2.4.1")
    assert "numpy 2.4.1" in runtime.interpreter_problem()
    monkeypatch.setattr(numpy, "__version__", "2.2.6")
    assert runtime.interpreter_problem() is None
    monkeypatch.setattr(triton, "__version__", "3.9.0")
    monkeypatch.setattr(numpy, "__version__", "2.4.1")
    assert runtime.interpreter_problem() is None


def test_cache_bytes_reads_the_largest_cache_linux_reports(tmp_path, monkeypatch):
    """The CPU cache sizes come from sysfs (K/M suffixes, the largest wins); without a report the
    32 MiB stand-in, named as a guess. On a GPU it is the L2."""
    for i, (size, level) in enumerate([("48K", 1), ("2048K", 2), ("16M", 3)]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "size").write_text(size + "\n")
        (d / "level").write_text(f"{level}\n")
    assert runtime._cpu_cache_bytes(str(tmp_path)) == (16 * 2**20, "L3")
    assert runtime._cpu_cache_bytes(str(tmp_path / "none")) is None
    n, name = runtime.cache_bytes()
    assert n > 0 and (name == "GPU L2") == (runtime.DEVICE == "cuda")
    if runtime.DEVICE != "cuda":
        monkeypatch.setattr(runtime, "_cpu_cache_bytes", lambda: None)
        assert runtime.cache_bytes() == (32 * 2**20, "CPU cache (size not reported: a 32 MiB guess)")


def test_capabilities_say_what_the_kernels_may_use(monkeypatch):
    """The CPU entry under the interpreter (which emulates every feature); a GPU's features follow
    from its compute capability; require() names what is missing; the compute dtype follows bf16."""
    if runtime.is_interpreter():
        assert runtime.capabilities() == runtime.CPU
        assert not (runtime.CPU.fp8 or runtime.CPU.tma or runtime.CPU.bf16)
        assert all(runtime.supports(f) for f in ("bf16", "fp8", "tma"))
    t4 = runtime.gpu_capabilities("Tesla T4", 7, 5, sm_count=40, smem_per_block=65536)
    l4 = runtime.gpu_capabilities("NVIDIA L4", 8, 9, sm_count=58, smem_per_block=101376)
    assert (t4.bf16, t4.fp8, t4.tma, t4.arch) == (False, False, False, "sm_75")
    assert (l4.bf16, l4.fp8, l4.tma, l4.arch) == (True, True, False, "sm_89")
    with pytest.raises(ValueError, match="feature must be one of"):
        runtime.supports("fp4")
    monkeypatch.setattr(runtime, "DEVICE", "cuda")
    monkeypatch.setattr(runtime, "INTERPRET", False)
    monkeypatch.setattr(runtime, "capabilities", lambda: t4)
    assert runtime.compute_dtype() == torch.float16 and not runtime.supports("bf16")
    with pytest.raises(runtime.UnsupportedOnDevice, match="the demo needs TMA descriptors: compute capability 9.0 "
                                                          "or newer; this Tesla T4 is sm_75"):
        runtime.require("tma", "the demo")
    monkeypatch.setattr(runtime, "capabilities", lambda: l4)
    assert runtime.compute_dtype() == torch.bfloat16 and runtime.supports("fp8") and not runtime.supports("tma")


@gpu_only
def test_the_gpus_capabilities_are_its_properties():
    caps = runtime.capabilities()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert (caps.name, caps.major, caps.minor, caps.sm_count) == (props.name, props.major, props.minor,
                                                                  props.multi_processor_count)
    assert caps.smem_per_block >= 48 * 1024 and caps.bf16 == (props.major >= 8)
