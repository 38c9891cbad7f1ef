"""The workbook's notebook conventions, as one function the tests apply to every notebook."""
from __future__ import annotations

import json
import re
from pathlib import Path

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
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


# --------------------------------------------------------------------------- what a learner reads

#: a commit-hash-like token: 7 to 40 hex digits with at least one digit and one letter (git's short
#: and full names), unless a hash or digest of content is what the text is about (the word before it
#: says so: "hash a3f9c1d2", "digest=...", "page name ...")
COMMIT_HASH = re.compile(r"(?<![\w-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?!\w|-(?!dirty\b)\w)")
CONTENT_HASH_CONTEXT = re.compile(r"(?:hash|digest|checksum|name)\W{0,3}$", re.I)
#: the project talking about itself, or pointing at files a pip or Colab user does not have
PROJECT_TALK = re.compile(
    r"\bour (?:targets?|aim|goal)s?\b|\btargets?:\s*[≥>]|results/notes_|\btests/|\btools/"
    r"|\bresults/[\w.]+\.(?:json|md)|\.\./shared|\bDESIGN\.md\b|\bARCHITECTURE\.md\b|\bissues?\s+#?\d+",
    re.I)
#: "session" is the project's word for a stretch of its own work, and the serving word for one user's
#: or agent's conversation: the second is subject matter, recognised by its neighbours
SESSION = re.compile(r"\bsessions?\b", re.I)
SERVING_CONTEXT = re.compile(r"agent|turn|chat|user|request|conversation|replica|client|serv|prompt|prefix|cache|rout", re.I)
#: code that puts commit hashes into what the learner sees (a title, a legend, a printed line)
COMMIT_LABEL_CALL = re.compile(r"\bcommits?_label\(|\[\s*[\"']commit[\"']\s*\]")
#: the reading budget of one chapter
MAX_PROSE_WORDS, MAX_CODE_LINES, MAX_PLUMBING_CELL_LINES = 3000, 450, 25


def _src(cell: dict) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def is_kernel_or_exercise(cell_source: str) -> bool:
    """A cell the length limit does not apply to: a Triton kernel, an exercise stub or its checker."""
    return ("@triton.jit" in cell_source or "exercises.check" in cell_source
            or "raise NotImplementedError" in cell_source)


def _commit_hashes(text: str) -> list[str]:
    return [m.group(0) for m in COMMIT_HASH.finditer(text)
            if not CONTENT_HASH_CONTEXT.search(text[max(0, m.start() - 16):m.start()])]


def _project_sessions(text: str) -> list[str]:
    return [m.group(0) for m in SESSION.finditer(text)
            if not SERVING_CONTEXT.search(text[max(0, m.start() - 80):m.end() + 80])]


def talk_problems(text: str, where: str) -> list[str]:
    """Commit hashes and project talk in ``text`` (a markdown cell, a title, a printed output)."""
    found = [f"{where}: commit-hash-like {h!r}" for h in _commit_hashes(text)]
    found += [f"{where}: speaks of the project, not the subject: {m.group(0)!r}" for m in PROJECT_TALK.finditer(text)]
    found += [f"{where}: speaks of the project, not the subject: {w!r}" for w in _project_sessions(text)]
    return found


def reading_problems(nb: dict) -> list[str]:
    """What a learner should not have to read: project talk and hashes in the prose and in titles
    set by code, plumbing cells over :data:`MAX_PLUMBING_CELL_LINES` lines, and a chapter over the
    reading budget (:data:`MAX_PROSE_WORDS` words of prose, :data:`MAX_CODE_LINES` lines of code)."""
    problems, words, lines = [], 0, 0
    for i, cell in enumerate(nb.get("cells", [])):
        text = _src(cell)
        if cell.get("cell_type") == "markdown":
            words += len(re.sub(r"\(https?://[^)]*\)|`[^`]*`", " ", text).split())
            problems += talk_problems(text, f"markdown cell {i}")
            continue
        code = [ln for ln in text.strip().splitlines() if ln.strip()]
        lines += len(code)
        if len(code) > MAX_PLUMBING_CELL_LINES and not is_kernel_or_exercise(text):
            problems.append(f"code cell {i} has {len(code)} lines (non-kernel cells: at most {MAX_PLUMBING_CELL_LINES})")
        titles = re.findall(r"""(?:title|suptitle|set_title|xlabel|ylabel|label)\s*[(=]\s*f?["']([^"']*)["']""", text)
        problems += talk_problems("\n".join(titles), f"code cell {i} (plot text)")
        if COMMIT_LABEL_CALL.search(text):
            problems.append(f"code cell {i} shows a record's commit to the learner (a title, label or printed line): "
                            "provenance belongs in the bench report")
        problems += [p for p in talk_problems("\n".join(re.findall(r"#[^\n]*", text)), f"code cell {i} (comment)")
                     if "commit-hash" not in p]
    if words > MAX_PROSE_WORDS:
        problems.append(f"{words} words of prose (budget {MAX_PROSE_WORDS})")
    if lines > MAX_CODE_LINES:
        problems.append(f"{lines} lines of code (budget {MAX_CODE_LINES})")
    return problems


def output_problems(executed: dict) -> list[str]:
    """Project talk and hashes in what an executed notebook printed or displayed."""
    problems = []
    for i, cell in enumerate(executed.get("cells", [])):
        for out in cell.get("outputs", []):
            texts = [out.get("text", "")] + [out.get("data", {}).get(k, "") for k in ("text/plain", "text/markdown")]
            text = "\n".join("".join(t) if isinstance(t, list) else str(t) for t in texts)
            problems += talk_problems(text, f"output of cell {i}")
    return problems


# --------------------------------------------------------------------------- what a chapter draws

#: a seed taken from the clock or the operating system: a chapter that asserts something on such
#: inputs passes or fails by the run, and a learner cannot repeat what they saw
CLOCK_SEED = re.compile(r"seed[^\n]*(?:time\.time|time_ns|perf_counter|os\.urandom|SystemRandom|datetime\.)"
                        r"|(?:random|np\.random)\.seed\(\s*\)")


def seed_problems(nb: dict) -> list[str]:
    """Code that seeds from the clock or the operating system (a fixed seed makes a chapter repeat)."""
    return [f"code cell {i} seeds from the clock or the OS: {m.group(0)[:60]!r}"
            for i, cell in enumerate(nb.get("cells", [])) if cell.get("cell_type") == "code"
            for line in _src(cell).splitlines() if not line.lstrip().startswith("#")
            for m in [CLOCK_SEED.search(line)] if m]
