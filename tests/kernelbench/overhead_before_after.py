"""Per-call in-process overhead of the harness: another version of ``harness.py`` (e.g. main's)
against this one, interleaved in one process, on the CPU.

    git show main:minimax_lab/kernelbench/harness.py > /tmp/harness_before.py
    OMP_NUM_THREADS=1 python tests/kernelbench/overhead_before_after.py /tmp/harness_before.py [ROUNDS]

Each round evaluates an honest ``torch.softmax`` candidate (``time_it=False``, ``n_test=4``: 15
calls) once with each harness -- and once more with this harness comparing every namespace name by
name (no dict versions), the path other interpreters take -- alternating the order; it prints the
median time per call of each. The candidate's own work is the same in all, so the differences are
the harnesses' per-call overhead. Not a test (pytest does not collect it): a measurement to rerun.
"""
import importlib.util
import statistics
import sys
import time

import torch

from minimax_lab.kernelbench import harness, integrity


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


CALLS = [0]


def honest(x):
    CALLS[0] += 1
    return torch.softmax(x.float(), -1).to(x.dtype)


def us_per_call(h, versions: bool = True) -> float:
    snap = integrity.trusted()
    saved = [(ns.version, ns.seen) for ns in snap.namespaces], snap._tags
    if not versions:
        snap._tags = None
        for ns in snap.namespaces:
            ns.version = ns.seen = None
    try:
        CALLS[0] = 0
        t0 = time.perf_counter()
        rep = h.evaluate(honest, "softmax", preset="cpu", n_test=4, time_it=False)
        dt = time.perf_counter() - t0
    finally:
        for ns, (version, seen) in zip(snap.namespaces, saved[0]):
            ns.version, ns.seen = version, seen
        snap._tags = saved[1]
    assert rep.status == "pass", rep.summary()
    return dt * 1e6 / CALLS[0]


def main() -> None:
    before = load(sys.argv[1], "harness_before")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    runs = {"before": lambda: us_per_call(before), "after": lambda: us_per_call(harness),
            "after, name by name": lambda: us_per_call(harness, versions=False)}
    for run in runs.values():
        run()  # warm up
    got: dict[str, list[float]] = {k: [] for k in runs}
    for i in range(rounds):
        order = list(runs) if i % 2 == 0 else list(reversed(runs))
        for k in order:
            got[k].append(runs[k]())
    base = statistics.median(got["before"])
    for k, v in got.items():
        v = sorted(v)
        print(f"{k:22s} median {statistics.median(v):7.1f} us/call (p20 {v[len(v) // 5]:6.1f}, "
              f"p80 {v[4 * len(v) // 5]:6.1f}); {statistics.median(v) / base:.3f} x before")


if __name__ == "__main__":
    main()
