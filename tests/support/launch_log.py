"""Which tests launch which Triton kernels, found by watching the launches; and a small set of
tests that launches all of them again.

Every launch -- compiled (``JITFunction.run``) or interpreted (``InterpretedFunction.run``) -- is
noted by its *kernel key*: the kernel's module and name, the values of its flag-like
``tl.constexpr`` arguments (booleans, strings, ``None``, dtypes; not integers, which are mostly
block sizes) and the dtypes of the tensors it was given. With ``MINIMAX_LAB_LAUNCH_LOG=<file>`` every test that launched a kernel appends
one JSON line there (by every xdist worker): its node id, the keys it launched and its seconds.

:func:`select` then picks, cheapest first, tests that together launch every key of the log
(a greedy set cover), and ``python -m tests.support.launch_log select LOG OUT`` writes their node
ids to ``OUT`` for ``pytest @OUT``: ``make test`` runs them again under Triton's newest release, so
every kernel, with every flag combination the pinned run launched, runs under both releases.
Launches made in a subprocess (a notebook run, a replica) are not seen here.
"""
from __future__ import annotations

import inspect
import json
import os
import sys
import threading
import time

from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

ENV = "MINIMAX_LAB_LAUNCH_LOG"

_lock = threading.Lock()
_count = 0
_keys: set[str] = set()           # kernel keys launched since the current test started
_flag_names: dict[object, tuple[inspect.Signature, tuple[str, ...]]] = {}


def _is_flag(value) -> bool:
    return value is None or isinstance(value, (bool, str)) or (
        not isinstance(value, (int, float)) and type(value).__module__.startswith("triton"))


def kernel_key(fn, args: tuple, kwargs: dict) -> str:
    """``module.name`` of the Python function ``fn`` behind a kernel, plus ``[NAME=value, ...]``
    for its flag-like constexpr arguments, sorted by name, and ``{dtype, ...}``: the dtypes of its
    tensor arguments."""
    if fn not in _flag_names:
        sig = inspect.signature(fn)
        flags = tuple(n for n, p in sig.parameters.items() if "constexpr" in str(p.annotation))
        _flag_names[fn] = (sig, flags)
    sig, flags = _flag_names[fn]
    try:
        bound = sig.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters}).arguments
    except TypeError:
        bound = {}
    shown = [f"{n}={bound[n]!r}" for n in sorted(flags) if n in bound and _is_flag(bound[n])]
    dtypes = sorted({str(v.dtype).removeprefix("torch.") for v in (*args, *kwargs.values())
                     if hasattr(v, "dtype") and hasattr(v, "data_ptr")})
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    return name + (f"[{', '.join(shown)}]" if shown else "") + (f"{{{', '.join(dtypes)}}}" if dtypes else "")


def _counting(original):
    def run(self, *args, **kwargs):
        global _count
        key = kernel_key(self.fn, args, kwargs)
        with _lock:
            _count += 1
            _keys.add(key)
        return original(self, *args, **kwargs)
    run.__wrapped__ = original
    return run


def install() -> None:
    """Watch every launch from now on (once per process)."""
    for cls in (JITFunction, InterpretedFunction):
        if not hasattr(cls.run, "__wrapped__"):
            cls.run = _counting(cls.run)


def launches() -> int:
    """Kernel launches counted so far in this process."""
    return _count


def start() -> tuple[int, float]:
    """Call as a test starts: forgets the keys seen so far; returns what :func:`note` takes."""
    with _lock:
        _keys.clear()
    return _count, time.perf_counter()


def note(nodeid: str, started: tuple[int, float]) -> None:
    """Append ``nodeid``'s line to the log when the test launched a kernel since ``started`` (and a
    log is asked for)."""
    path = os.environ.get(ENV)
    before, t0 = started
    if path and _count > before:
        with _lock:
            keys = sorted(_keys)
        line = json.dumps({"test": nodeid, "kernels": keys, "seconds": round(time.perf_counter() - t0, 3)})
        with open(path, "a") as f:  # one line per write: the workers' lines do not interleave
            f.write(line + "\n")


def read(path) -> list[dict]:
    """The log's lines; ValueError naming the line that is not a test's JSON record."""
    out = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                out.append({"test": str(rec["test"]), "kernels": list(rec["kernels"]),
                            "seconds": float(rec["seconds"])})
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"{path}:{i} is not a launch-log line: {line[:80]!r}") from None
    return out


def select(records: list[dict]) -> list[str]:
    """Node ids of tests that together launched every kernel key of ``records``: repeatedly the
    test with the most not-yet-covered keys per second (ties: the earlier node id), then, slowest
    first, every chosen test whose keys the others cover is dropped again. A test that appears in
    several lines (a rerun) counts with all its keys and its longest time."""
    tests: dict[str, tuple[set[str], float]] = {}
    for r in records:
        keys, secs = tests.get(r["test"], (set(), 0.0))
        tests[r["test"]] = (keys | set(r["kernels"]), max(secs, r["seconds"]))
    uncovered = set().union(*(k for k, _ in tests.values())) if tests else set()
    chosen: dict[str, tuple[set[str], float]] = {}
    while uncovered:
        best = min(tests, key=lambda t: (-len(tests[t][0] & uncovered) / max(tests[t][1], 0.01), t))
        chosen[best] = tests.pop(best)
        uncovered -= chosen[best][0]
    for t in sorted(chosen, key=lambda t: (-chosen[t][1], t)):
        others = set().union(*(k for u, (k, _) in chosen.items() if u != t))
        if chosen[t][0] <= others:
            del chosen[t]
    return sorted(chosen)


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "select":
        print("usage: python -m tests.support.launch_log select LOG OUT", file=sys.stderr)
        return 2
    try:
        records = read(argv[1])
    except (OSError, ValueError) as e:
        print(f"launch_log: {e}", file=sys.stderr)
        return 2
    chosen = select(records)
    with open(argv[2], "w") as f:
        f.write("".join(t + "\n" for t in chosen))
    keys = set().union(*(set(r["kernels"]) for r in records)) if records else set()
    secs = {r["test"]: r["seconds"] for r in records}
    print(f"launch_log: {len(chosen)} of {len(secs)} kernel-launching tests launch all {len(keys)} kernel keys "
          f"({sum(secs[t] for t in chosen):.0f} s of {sum(secs.values()):.0f} s in the pinned run)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
