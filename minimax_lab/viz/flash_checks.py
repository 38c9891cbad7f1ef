"""Chapter 02's checks of the kernels it writes in cells, and their timing on a GPU.

Every kernel the chapter grows is checked against the fp32 reference
(:func:`minimax_lab.attention.dense_reference.attention_reference`) on random inputs drawn from
fixed seeds: batch 2, two query heads sharing one kv head (grouped-query attention), lengths that
are no multiple of any tile, ``S < Skv``, and ``q``, ``k``, ``v`` all strided views (``q`` a
transposed ``[B, H, S, D]`` tensor, ``k`` and ``v`` the two halves of one packed
``[B, Skv, 2, Hkv, D]`` tensor). On a GPU a kernel's launcher is also timed at the shape the
H200 records were taken at (:data:`TIMED_SHAPE`); in Triton's interpreter a time is not a speed,
so nothing is timed there.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch
import triton

from minimax_lab import measure, runtime
from minimax_lab.attention.dense_reference import attention_reference
from minimax_lab.bench.suite_attention import attention_flops

#: the shape of the H200 records of the steps (causal, bf16): batch, sequence, heads, head dim
TIMED_SHAPE = dict(B=4, S=16384, H=16, D=128)
#: the checks' batch, query heads and kv heads
CHECK_B, CHECK_HQ, CHECK_HKV = 2, 2, 1


def setup(preset: str = "auto") -> tuple[str, torch.device, torch.dtype]:
    """The chapter's one setup call: ``(preset, device, dtype)`` -- the preset resolved
    (:func:`minimax_lab.runtime.resolve_preset`), the device Triton kernels take their inputs on and
    the compute dtype -- after printing one line that says where the chapter runs."""
    p, dev, dtype = runtime.resolve_preset(preset), runtime.kernel_device(), runtime.compute_dtype()
    where = "in its interpreter (numpy, one program after another)" if runtime.is_interpreter() else "compiled"
    print(f"{runtime.device_name()}, preset {p}, {str(dtype).replace('torch.', '')}; Triton {triton.__version__} "
          f"{where}; torch {torch.__version__}")
    return p, dev, dtype


def check_head_dim(preset: str = "auto") -> int:
    """The head dim of the checks: 16 in the interpreter (the smallest ``tl.dot`` takes), 128 on a GPU."""
    return runtime.pick(preset, cpu=16, gpu=128)


def strided_inputs(seed: int, *, S: int, Skv: int, D: int, B: int = CHECK_B, Hq: int = CHECK_HQ,
                   Hkv: int = CHECK_HKV, dtype: torch.dtype | None = None) -> dict:
    """``{"q", "k", "v"}`` drawn from ``seed`` on the kernel device: ``q [B, S, Hq, D]`` a transposed
    view of a ``[B, Hq, S, D]`` tensor; ``k``, ``v [B, Skv, Hkv, D]`` the two halves of one packed
    ``[B, Skv, 2, Hkv, D]`` tensor (so they share strides, and neither is contiguous)."""
    dev, dtype = runtime.kernel_device(), dtype or runtime.compute_dtype()
    g = torch.Generator(device=dev).manual_seed(seed)
    q = torch.randn(B, Hq, S, D, generator=g, device=dev, dtype=dtype).transpose(1, 2)
    kv = torch.randn(B, Skv, 2, Hkv, D, generator=g, device=dev, dtype=dtype)
    return {"q": q, "k": kv[:, :, 0], "v": kv[:, :, 1]}


def case_name(S: int, Skv: int, D: int, causal: bool | None) -> str:
    mode = "" if causal is None else ("causal, " if causal else "not causal, ")
    return (f"{mode}B={CHECK_B}, S={S}, Skv={Skv}, Hq/Hkv={CHECK_HQ}/{CHECK_HKV}, D={D}, "
            "strided q/k/v")


def check(fn: Callable, preset: str = "auto", *, lengths: tuple[int, int] = (37, 45),
          causal: Iterable[bool] | None = (True, False), seed: int = 0) -> None:
    """Check ``fn(q, k, v)`` (``causal=None``) or ``fn(q, k, v, CAUSAL=c)`` for each ``c`` of
    ``causal`` against the fp32 reference on :func:`strided_inputs` with ``lengths = (S, Skv)``.
    Prints one line per case; raises ``AssertionError`` naming the case that fails."""
    S, Skv = lengths
    if not 0 < S <= Skv:
        raise ValueError(f"lengths must be (S, Skv) with 0 < S <= Skv, got {lengths!r}")
    D = check_head_dim(preset)
    for i, c in enumerate([None] if causal is None else list(causal)):
        run = (lambda q, k, v: fn(q, k, v)) if c is None else (lambda q, k, v, c=c: fn(q, k, v, CAUSAL=c))
        r = measure.check(run, lambda q, k, v, c=c: attention_reference(q, k, v, causal=bool(c)),
                          lambda s: strided_inputs(s, S=S, Skv=Skv, D=D), trials=1, seed=seed + 101 * i,
                          reference_dtype=torch.float32, name=case_name(S, Skv, D, c))
        print(r.summary())
        if not r.passed:
            raise AssertionError(r.summary())


def time_on_gpu(fn: Callable, *, reps: int = 20) -> dict | None:
    """``fn(q, k, v, CAUSAL=True)`` timed on this GPU at :data:`TIMED_SHAPE` (contiguous inputs in the
    compute dtype, rotated so no call finds them in L2): a dict with ``ms``, ``p20_ms``, ``p80_ms``,
    ``tflops``, ``reps``, ``device``, ``triton``, ``torch``; ``{"skipped": why}`` when the kernel
    does not fit this GPU; ``None`` in the interpreter, where a time is not a speed."""
    if runtime.is_interpreter():
        return None

    B, S, H, D = (TIMED_SHAPE[n] for n in "BSHD")
    dtype = runtime.compute_dtype()

    def make(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        return {n: torch.randn(B, S, H, D, device="cuda", dtype=dtype, generator=g) for n in "qkv"}
    try:
        t = measure.time_fn(lambda q, k, v: fn(q, k, v, CAUSAL=True), make, reps=reps)
    except triton.runtime.errors.OutOfResources as e:
        return {"skipped": f"does not fit this GPU ({e})"[:160]}
    info = runtime.describe()
    return {"ms": t.ms, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms, "reps": t.reps,
            "tflops": attention_flops(B, S, S, H, D, True) / (t.ms * 1e-3) / 1e12,
            "device": info["device"], "triton": info["triton"], "torch": info["torch"]}
