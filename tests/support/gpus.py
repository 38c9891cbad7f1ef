"""Capability tables of the GPUs a learner has (Colab's T4, an L4, an A100) and the H100/H200 the
records come from, and a way to make the package believe it runs on one of them: compiled
kernels (no interpreter), that GPU's capabilities, and CPU tensors as the kernel device (nothing
launches: the tests record launches instead)."""
from __future__ import annotations

import torch

from minimax_lab import runtime

KB = 1024
#: name -> capabilities (shared memory: the opt-in maximum per block that CUDA reports)
GPUS: dict[str, runtime.Capabilities] = {
    "T4": runtime.gpu_capabilities("Tesla T4", 7, 5, sm_count=40, smem_per_block=64 * KB),
    "L4": runtime.gpu_capabilities("NVIDIA L4", 8, 9, sm_count=58, smem_per_block=99 * KB),
    "A100": runtime.gpu_capabilities("NVIDIA A100-SXM4-80GB", 8, 0, sm_count=108, smem_per_block=163 * KB),
    "H100": runtime.gpu_capabilities("NVIDIA H100 80GB HBM3", 9, 0, sm_count=132, smem_per_block=227 * KB),
    "H200": runtime.gpu_capabilities("NVIDIA H200", 9, 0, sm_count=132, smem_per_block=227 * KB),
}


def fake_gpu(monkeypatch, caps: runtime.Capabilities) -> None:
    """From here to the end of the test the runtime answers as on ``caps``'s GPU; kernels take CPU
    tensors (the tests record launches, nothing runs)."""
    monkeypatch.delenv("MINIMAX_LAB_CONFIG_DIR", raising=False)
    monkeypatch.setattr(runtime, "DEVICE", "cuda")
    monkeypatch.setattr(runtime, "INTERPRET", False)
    monkeypatch.setattr(runtime, "capabilities", lambda: caps)
    monkeypatch.setattr(runtime, "kernel_device", lambda: torch.device("cpu"))
