"""Which case groups a suite runs (shared by every ``suite_*`` module and the command line)."""
from __future__ import annotations

from typing import Sequence

def select_cases(cases, valid: Sequence[str], default: Sequence[str] | None = None) -> list[str]:
    """The case groups a suite runs, in the order of ``valid``: ``default`` (all of ``valid`` when
    it is None) for ``cases=None``, else ``cases`` -- a list of names or one name. Raises
    ``ValueError`` naming the valid groups for an unknown name or an empty list."""
    if cases is None:
        chosen = list(valid if default is None else default)
    else:
        chosen = [cases] if isinstance(cases, str) else list(cases)
        unknown = [c for c in chosen if c not in valid]
        if unknown or not chosen:
            what = f"unknown case group(s) {unknown}" if unknown else "no case group given"
            raise ValueError(f"{what}; choose from {list(valid)}")
    return [c for c in valid if c in chosen]
