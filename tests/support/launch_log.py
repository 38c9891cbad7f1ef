"""Which tests launch a Triton kernel, found by watching the launches.

Every launch -- compiled (``JITFunction.run``) or interpreted (``InterpretedFunction.run``) --
bumps a counter; a test whose run moved the counter launched a kernel. With
``MINIMAX_LAB_LAUNCH_LOG=<file>`` each such test's node id is appended to that file (one per
line, by every xdist worker), so a second run under another Triton can take exactly those tests
(``pytest @<file>``): ``make test`` runs the kernel tests again under Triton's newest release
this way. Launches made in a subprocess (a notebook run, a replica) are not seen here.
"""
from __future__ import annotations

import os
import threading

from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

ENV = "MINIMAX_LAB_LAUNCH_LOG"

_count = 0
_lock = threading.Lock()


def _counting(original):
    def run(self, *args, **kwargs):
        global _count
        with _lock:
            _count += 1
        return original(self, *args, **kwargs)
    run.__wrapped__ = original
    return run


def install() -> None:
    """Count every launch from now on (once per process)."""
    for cls in (JITFunction, InterpretedFunction):
        if not hasattr(cls.run, "__wrapped__"):
            cls.run = _counting(cls.run)


def launches() -> int:
    """Kernel launches counted so far in this process."""
    return _count


def note(nodeid: str, before: int) -> None:
    """Append ``nodeid`` to the log when the test launched a kernel since ``before`` (and a log is asked for)."""
    path = os.environ.get(ENV)
    if path and _count > before:
        with open(path, "a") as f:  # one short line per write: the workers' lines do not interleave
            f.write(nodeid + "\n")
