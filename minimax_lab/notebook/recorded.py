"""The recorded GPU benchmark records a chapter draws, looked up by suite, case and implementation.

Records are those :func:`minimax_lab.measure.load_records` reads: the ones shipped with the package
(measured on an H200) and the learner's own. A chapter asks for what it draws by name and gets
``None`` where nothing was recorded, so it can say so instead of failing::

    r = recorded.one("msa", "prefill_s131072", "triton_kv")
    if r: print(f"{r['ms']:.1f} ms on the H200")
"""
from __future__ import annotations

from minimax_lab import measure

#: the GPU every shipped record was measured on
H200 = "NVIDIA H200"


def all_of(suite: str, *, case: str | None = None, impl: str | None = None, device: str = H200) -> list[dict]:
    """The newest record of each case and impl of ``suite`` on ``device``, filtered by ``case`` and
    ``impl`` where given."""
    return [r for r in measure.load_records(device, suite=suite)
            if (case is None or r.get("case") == case) and (impl is None or r.get("impl") == impl)]


def one(suite: str, case: str, impl: str, *, device: str = H200) -> dict | None:
    """The newest record of (``suite``, ``case``, ``impl``) on ``device``, or None."""
    found = all_of(suite, case=case, impl=impl, device=device)
    return found[-1] if found else None
