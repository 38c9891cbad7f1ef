"""Build a notebook from a percent-format script, or export one back, for editing in a text editor.

    python tools/nb.py build  notebooks/src.py notebooks/NN_name.ipynb [--budget 300]
    python tools/nb.py export notebooks/NN_name.ipynb > /tmp/NN_name.py

Script format: cells start with ``# %%`` (code) or ``# %% [markdown]`` (markdown; every line
prefixed by ``# ``). ``# %% tags=["parameters"]`` tags a code cell for papermill. Outputs are
never stored. ``--budget`` sets the CPU-preset time budget (seconds) that the tests enforce.
The notebook's kernel is the one ``make setup`` registers, "Python (minimax_lab)".
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat

#: The Jupyter kernel `make setup` registers (ipykernel install --name minimax_lab). Colab does not
#: know it and falls back to its own Python 3 kernel, where the install cell does the setup.
KERNELSPEC = {"name": "minimax_lab", "display_name": "Python (minimax_lab)", "language": "python"}
HEADER = re.compile(r"^# %%(?P<md> \[markdown\])?(?:\s+tags=(?P<tags>\[.*\]))?\s*$")


def build(src: Path, dst: Path, budget: int | None) -> None:
    cells, kind, tags, lines = [], None, [], []

    def flush():
        if kind is None:
            return
        text = "\n".join(lines).strip("\n")
        if kind == "markdown":
            text = "\n".join(l[2:] if l.startswith("# ") else l.lstrip("#") for l in text.splitlines())
            cells.append(nbformat.v4.new_markdown_cell(text))
        else:
            cell = nbformat.v4.new_code_cell(text)
            if tags:
                cell.metadata["tags"] = tags
            cells.append(cell)

    for line in src.read_text().splitlines():
        m = HEADER.match(line)
        if m:
            flush()
            kind = "markdown" if m.group("md") else "code"
            tags = json.loads(m.group("tags")) if m.group("tags") else []
            lines = []
        else:
            lines.append(line)
    flush()
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    previous = nbformat.read(dst, as_version=4) if dst.exists() else None
    if previous is not None:  # keep the cell ids position by position, so a rebuild diffs only what changed
        for cell, before in zip(nb.cells, previous.cells):
            if "id" in before:
                cell["id"] = before["id"]
    old = previous.metadata.get("minimax_lab", {}) if previous is not None else {}
    nb.metadata["minimax_lab"] = {**old, **({"cpu_budget_s": budget} if budget else {})}
    if "cpu_budget_s" not in nb.metadata["minimax_lab"]:
        raise SystemExit("give --budget SECONDS (the notebook's CPU-preset time budget)")
    nbformat.write(nb, dst)


def export(src: Path) -> str:
    nb = nbformat.read(src, as_version=4)
    out = []
    for c in nb.cells:
        if c.cell_type == "markdown":
            out.append("# %% [markdown]\n" + "\n".join("# " + l if l else "#" for l in c.source.splitlines()))
        else:
            tags = c.metadata.get("tags")
            out.append("# %%" + (f" tags={json.dumps(tags)}" if tags else "") + "\n" + c.source)
    return "\n\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python tools/nb.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="a percent-format script -> a notebook without outputs")
    b.add_argument("src", type=Path)
    b.add_argument("dst", type=Path)
    b.add_argument("--budget", type=int, help="the CPU-preset time budget in seconds the tests enforce")
    e = sub.add_parser("export", help="a notebook -> its percent-format script, on stdout")
    e.add_argument("notebook", type=Path)
    args = parser.parse_args(argv)
    source = args.src if args.command == "build" else args.notebook
    if not source.is_file():
        parser.error(f"no such file: {source}")
    if args.command == "build":
        build(args.src, args.dst, args.budget)
    else:
        sys.stdout.write(export(args.notebook))
    return 0


if __name__ == "__main__":
    sys.exit(main())
