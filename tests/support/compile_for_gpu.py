"""Compile every Triton kernel the package launches for a GPU it does not have, on the CPU.

    MINIMAX_LAB_INTERPRET=0 python -m tests.support.compile_for_gpu H100 [operator ...]

Run in a process of its own with the interpreter off (``MINIMAX_LAB_INTERPRET=0``: ``@triton.jit``
then builds real ``JITFunction`` objects). The runtime is made to answer as on the named GPU
(:func:`tests.support.gpus.fake_gpu`), each operator of :data:`tests.core.test_capabilities.OPERATORS`
(and MSA's backward, and the exercises' Triton solutions) is called on CPU tensors of production-like shapes, and every launch is
compiled -- Triton's whole pipeline down to the GPU's binary (``ptxas`` ships with Triton) -- for
that GPU's compute capability instead of being launched. Nothing runs on a device. What a kernel
the interpreter accepts can still fail to do on a real GPU -- a type the compiler refuses, a
tuple argument, a layout, too many registers for the shared memory -- fails here.

Prints one JSON line per distinct compiled kernel (``kernel``, ``ok``, ``error``, ``seconds``) and
a last line ``{"done": ...}``. It uses Triton's own launch-time binder (``JITFunction`` internals of
the pinned Triton), so a newer Triton may need this file to follow.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

if os.environ.get("MINIMAX_LAB_INTERPRET") != "0":
    raise SystemExit("run with MINIMAX_LAB_INTERPRET=0 (compiled kernels, no interpreter)")

import torch  # noqa: E402
from _pytest.monkeypatch import MonkeyPatch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.compiler import compile as triton_compile  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

from minimax_lab import runtime  # noqa: E402
from tests.support.gpus import GPUS, fake_gpu  # noqa: E402

SEEN: dict[str, dict] = {}


def compiling_run(target: GPUTarget):
    backend = make_backend(target)

    def run(self, *args, grid, warmup, **kwargs):
        binder = create_function_from_signature(self.signature, self.params, backend)
        bound_args, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound_args, specialization, options)
        key = repr((self.fn.__name__, signature, sorted(constexprs.items(), key=repr), repr(options)))
        if key in SEEN:
            return None
        t0 = time.perf_counter()
        entry = {"kernel": f"{self.fn.__module__}.{self.fn.__name__}", "ok": True, "error": None}
        try:
            triton_compile(ASTSource(self, signature, constexprs, attrs), target=target, options=options.__dict__)
        except Exception as e:  # noqa: BLE001 - every failure is reported, the sweep goes on
            entry.update(ok=False, error=f"{type(e).__name__}: {str(e)[-1500:]}")
        entry["seconds"] = round(time.perf_counter() - t0, 2)
        SEEN[key] = entry
        print(json.dumps(entry), flush=True)
        return None
    return run


def msa_backward(dtype, fp8=False):
    """MSA's backward kernels (dQ, dK/dV, the index loss's block maxima and gradients) at MSA's
    head layout, on a short sequence (the kernels do not change with the length)."""
    from minimax_lab.attention import msa_backward_index_triton as idx_triton
    from minimax_lab.attention import msa_backward_triton as bwd_triton

    S, Hq, G, D, Bk, topk = 512, 64, 4, 128, 128, 4
    q = torch.zeros(1, S, Hq, D, dtype=dtype)
    k = torch.zeros(1, S, G, D, dtype=dtype)
    lse = torch.zeros(1, Hq, S)
    sel = torch.full((1, S, G, topk), -1, dtype=torch.int32)
    sel[:, :, :, 0] = (torch.arange(S) // Bk).view(1, S, 1).to(torch.int32)
    bwd_triton.msa_attention_backward_triton(q, k, k, q, lse, q, sel, block_size=Bk)
    q_idx, k_idx = torch.zeros(1, S, G, D, dtype=dtype), torch.zeros(1, S, D, dtype=dtype)
    logits, arg = idx_triton.block_logits_triton(q_idx, k_idx, Bk)
    idx_triton.index_grads_triton(q_idx, k_idx, arg, torch.zeros_like(logits), Bk)


def paged_prefill_tile_steps(dtype, fp8=False):
    """The FP8 paged prefill's other tile steps (the default one is part of ``paged_prefill``)."""
    if not fp8:
        return
    from minimax_lab.paged_kv import prefill_triton
    from tests.core.test_capabilities import _paged

    k, v, table, scales = _paged(1, 16, 16, 8, 128, dtype, fp8)
    q = torch.zeros(1, 64, 32, 128, dtype=dtype)
    for step in prefill_triton.TILE_STEPS:
        prefill_triton.paged_prefill_triton(q, k, v, table, torch.tensor([256], dtype=torch.int32),
                                            config={"TILE_STEP": step}, **scales)


def exercise_solutions(dtype, fp8=False):
    """The kernels of the exercises that ask for Triton: each shipped solution and each second
    honest solution (``tests/workbook/exercise_honest.py``), run through its checker (whose verdict
    is meaningless here: nothing is launched). A learner compares their kernel with these, and the
    interpreter accepts things a GPU compiler refuses (a plain float global read in a kernel)."""
    from minimax_lab import exercises
    from tests.workbook.exercise_honest import SECOND_SOLUTIONS

    for ex in exercises.all_exercises():
        if ex.writes_triton:
            exercises.verdict(ex.key, ex.solution())
    for key, fn in sorted(SECOND_SOLUTIONS.items()):
        exercises.verdict(key, fn)


def main(argv: list[str]) -> int:
    from tests.core.test_capabilities import OPERATORS, FP8_OPERATORS

    gpu, wanted = argv[0], argv[1:]
    caps = GPUS[gpu]
    target = GPUTarget("cuda", caps.major * 10 + caps.minor, 32)
    patch = MonkeyPatch()
    fake_gpu(patch, caps)
    patch.setattr(JITFunction, "run", compiling_run(target))
    operators = {**OPERATORS, "msa_backward": msa_backward, "paged_prefill_tile_steps": paged_prefill_tile_steps,
                 "exercise_solutions": exercise_solutions}
    failed_calls = []
    for name, op in operators.items():
        if wanted and name not in wanted:
            continue
        fp8_ops = (*FP8_OPERATORS, "paged_prefill_tile_steps")
        variants = [False] + ([True] if caps.fp8 and name in fp8_ops else [])
        for fp8 in variants:
            try:
                op(runtime.compute_dtype(), fp8=fp8)
            except Exception as e:  # noqa: BLE001 - a launcher that raised is a failure too
                failed_calls.append(f"{name} (fp8={fp8}): {type(e).__name__}: {e}")
                traceback.print_exc()
    print(json.dumps({"done": True, "gpu": gpu, "compiled": len(SEEN),
                      "failed": [e["kernel"] for e in SEEN.values() if not e["ok"]], "failed_calls": failed_calls}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
