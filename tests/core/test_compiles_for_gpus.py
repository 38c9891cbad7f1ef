"""Every Triton kernel the package launches compiles for the GPUs a learner has -- checked on the CPU.

The interpreter runs kernels as Python: it accepts code the GPU compiler refuses (a ``@triton.jit``
helper returning tiles of two shapes from the branches of a compile-time ``if`` ran under the
interpreter and failed to compile for every GPU). :mod:`tests.support.compile_for_gpu` calls every
operator with the runtime answering as on each GPU of :data:`tests.support.gpus.GPUS` and runs
Triton's whole compiler, down to the GPU's binary, on each launch instead of launching it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

from tests.support.gpus import GPUS

REPO = Path(__file__).resolve().parents[2]


def compile_for(gpu: str, *operators: str) -> dict:
    """The sweep's summary line for ``gpu`` (all operators unless named)."""
    env = dict(os.environ, MINIMAX_LAB_INTERPRET="0", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-m", "tests.support.compile_for_gpu", gpu, *operators], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=1200)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines and lines[-1].get("done"), proc.stderr[-3000:]
    failures = [f"{e['kernel']}: {e['error']}" for e in lines[:-1] if not e["ok"]]
    return {**lines[-1], "failures": failures}


@pytest.mark.skipif(not triton.__version__.startswith("3.6"),
                    reason="the sweep drives the pinned Triton's launch-time binder (JITFunction internals)")
@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_every_kernel_compiles_for_the_gpu(gpu):
    got = compile_for(gpu)
    assert got["compiled"] > 10, got
    assert not got["failed_calls"], "\n".join(got["failed_calls"])
    assert not got["failures"], "\n\n".join(got["failures"])
