"""The workbook's notebook conventions, as one function the tests apply to every notebook."""
from __future__ import annotations

import json
import re
from pathlib import Path

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
PRESET_LINE = re.compile(r"^\s*preset\s*=\s*[\"']auto[\"']", re.M)
#: The Jupyter kernel `make setup` registers (`ipykernel install --name minimax_lab`); tools/nb.py writes it.
KERNEL_NAME, KERNEL_DISPLAY_NAME = "minimax_lab", "Python (minimax_lab)"


def notebooks() -> list[Path]:
    """Every notebook of the workbook (papermill outputs excluded)."""
    return sorted(p for p in NOTEBOOK_DIR.glob("*.ipynb") if not p.name.endswith(".out.ipynb"))


def budget_seconds(nb: dict) -> int | None:
    """The notebook's CPU-preset time budget from its metadata, or None."""
    value = nb.get("metadata", {}).get("minimax_lab", {}).get("cpu_budget_s")
    return value if isinstance(value, int) and value > 0 else None


def notebook_problems(nb: dict) -> list[str]:
    """What a notebook breaks of the conventions (empty list = fine).

    A parameters-tagged cell setting ``preset = "auto"``; a Colab install cell; no stored
    outputs or execution counts; a positive ``cpu_budget_s`` in the metadata; the registered
    "Python (minimax_lab)" kernel; some prose.
    """
    problems = []
    cells = nb.get("cells", [])
    code = [c for c in cells if c.get("cell_type") == "code"]
    src = lambda c: "".join(c.get("source", "")) if isinstance(c.get("source"), list) else c.get("source", "")  # noqa: E731
    if any(c.get("outputs") for c in code):
        problems.append("has stored outputs")
    if any(c.get("execution_count") is not None for c in code):
        problems.append("has stored execution counts")
    params = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(params) != 1:
        problems.append(f"needs exactly one cell tagged 'parameters', has {len(params)}")
    elif not PRESET_LINE.search(src(params[0])):
        problems.append("parameters cell must set preset = \"auto\"")
    if not any("google.colab" in src(c) for c in code[:3]):
        problems.append("no Colab install cell among the first code cells")
    spec = nb.get("metadata", {}).get("kernelspec", {})
    if spec.get("name") != KERNEL_NAME or spec.get("display_name") != KERNEL_DISPLAY_NAME:
        problems.append(f"kernelspec must be {KERNEL_NAME!r} ({KERNEL_DISPLAY_NAME!r}), got {spec.get('name')!r}")
    if budget_seconds(nb) is None:
        problems.append("metadata.minimax_lab.cpu_budget_s (a positive int) is missing")
    if sum(c.get("cell_type") == "markdown" for c in cells) < 2:
        problems.append("teaches with too little prose (fewer than 2 markdown cells)")
    return problems


def load(path: Path) -> dict:
    return json.loads(path.read_text())
