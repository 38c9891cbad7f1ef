"""Plain imports: every public name is a static import a reader (and "go to definition") can
follow, the package's modules do not import each other in a circle, and ``import minimax_lab``
stays cheap (it decides the runtime and nothing else)."""
from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "minimax_lab"


def module_files() -> dict[str, pathlib.Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


MODULES = module_files()
PACKAGES = sorted(n for n, p in MODULES.items() if p.name == "__init__.py")


def top_level_imports(name: str) -> set[str]:
    """The package modules ``name`` imports at module level (not inside functions)."""
    found = set()
    for node in ast.parse(MODULES[name].read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minimax_lab"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("minimax_lab")}
    return {m for m in found if m in MODULES and m != name}


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Cycles in the module graph; a package importing its own sub-modules (and they it) is not one."""
    related = lambda a, b: a.startswith(b + ".") or b.startswith(a + ".")  # noqa: E731
    state, stack, cycles = {}, [], []

    def visit(u):
        state[u] = "open"
        stack.append(u)
        for v in sorted(edges.get(u, ())):
            if related(u, v):
                continue
            if state.get(v) == "open":
                cycles.append(stack[stack.index(v):] + [v])
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = "done"

    for m in sorted(edges):
        if m not in state:
            visit(m)
    return cycles


def test_the_cycle_finder_finds_a_cycle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert import_cycles({"p": {"p.x"}, "p.x": {"p"}}) == []


def test_no_import_cycles_between_the_package_modules():
    edges = {m: top_level_imports(m) for m in MODULES}
    assert import_cycles(edges) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_export_statically(package):
    """No lazy ``__getattr__`` exports: what a package offers is imported where it is named, and
    every name in ``__all__`` is there."""
    tree = ast.parse(MODULES[package].read_text())
    lazy = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("__getattr__", "__dir__")]
    assert not lazy, f"{package} defines {lazy}: import the names instead"
    mod = importlib.import_module(package)
    missing = [n for n in getattr(mod, "__all__", ()) if not hasattr(mod, n)]
    assert not missing, f"{package}.__all__ names what it does not have: {missing}"


def test_import_minimax_lab_loads_only_the_runtime():
    """``import minimax_lab`` imports its runtime module and no kernel library: Triton (and the
    choice of its interpreter) comes with the first sub-package that needs it."""
    code = ("import sys, minimax_lab; "
            "print(sorted(m for m in sys.modules if m.startswith('minimax_lab')), 'triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "['minimax_lab', 'minimax_lab.runtime'] False", out
