"""The package's structure: one file layout for every operator (the table below is the map; a
deviation fails), plain imports -- every public name is a static import a reader (and "go to
definition") can follow, the package's modules do not import each other in a circle -- and
``import minimax_lab`` stays cheap (it decides the runtime and nothing else)."""
from __future__ import annotations

import ast
import importlib
import pathlib
import re
import subprocess
import sys

import pytest

from minimax_lab.validate import IMPLS

ROOT = pathlib.Path(__file__).resolve().parents[2] / "minimax_lab"


def module_files() -> dict[str, pathlib.Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


MODULES = module_files()
PACKAGES = sorted(n for n, p in MODULES.items() if p.name == "__init__.py")


def _package_modules_of(node, name: str) -> set[str]:
    """The package modules one import statement names."""
    found = set()
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minimax_lab"):
        for alias in node.names:
            sub = f"{node.module}.{alias.name}"
            found.add(sub if sub in MODULES else node.module)
    elif isinstance(node, ast.Import):
        found |= {a.name for a in node.names if a.name.startswith("minimax_lab")}
    return {m for m in found if m in MODULES and m != name}


def all_imports(name: str) -> set[str]:
    """The package modules ``name`` imports anywhere: at module level and inside functions."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        found |= _package_modules_of(node, name)
    return found


def deferred_imports(name: str) -> list[tuple[int, str, bool]]:
    """Imports inside a function of ``name``: ``(line, function, has a '# deferred:' reason)``. The
    reason is a comment on the import's line, or above it in the same function."""
    text = MODULES[name].read_text()
    lines = text.splitlines()
    out = []
    for fn in ast.walk(ast.parse(text)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                above = lines[fn.lineno - 1:node.end_lineno]
                out.append((node.lineno, fn.name, any("deferred:" in ln for ln in above)))
    return out


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
    """No cycle, counting the imports inside functions too: a deferred import does not break one."""
    edges = {m: all_imports(m) for m in MODULES}
    assert import_cycles(edges) == []


def test_the_cycle_test_reads_function_bodies(tmp_path):
    """An import hidden in a function is an edge of the graph (the test can fail on it)."""
    src = "def f():\n    from minimax_lab import runtime\n"
    tree = ast.parse(src)
    found = set().union(*(_package_modules_of(n, "x") for n in ast.walk(tree)))
    assert found == {"minimax_lab.runtime"}


def test_imports_inside_functions_say_why():
    """An import inside a function is allowed only where a worker process or an optional dependency
    needs it, and then says so: a ``# deferred: <reason>`` comment on it or above it in the function."""
    silent = {f"{m}:{line} ({fn})" for m in MODULES for line, fn, why in deferred_imports(m) if not why}
    assert not silent, f"imports inside functions without a '# deferred:' reason: {sorted(silent)}"


#: the operator and serving packages: they compute, they never import the bench or its measuring core
OPERATOR_PACKAGES = ("minimax_lab.attention", "minimax_lab.moe", "minimax_lab.paged_kv", "minimax_lab.kvcache",
                     "minimax_lab.engine")
MEASURING_PACKAGES = ("minimax_lab.bench", "minimax_lab.measure")


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith(OPERATOR_PACKAGES)))
def test_operators_never_import_the_bench(module):
    """``attention/``, ``moe/``, ``paged_kv/``, ``kvcache/`` and ``engine/`` import neither the bench
    nor the measuring core (``measure``): the arrows run from the bench to them."""
    bench = sorted(m for m in all_imports(module) if m in MEASURING_PACKAGES or m.startswith(
        tuple(p + "." for p in MEASURING_PACKAGES)))
    assert not bench, f"{module} imports {bench}"


#: the operator and cache-system modules whose code must not measure (checked by what it does)
COMPUTE_MODULES = sorted(
    m for m in MODULES
    if m.startswith(("minimax_lab.attention", "minimax_lab.moe", "minimax_lab.paged_kv", "minimax_lab.kvcache"))
    or m in ("minimax_lab.fp8", "minimax_lab.triton_blocks") or m.startswith("minimax_lab.kernelbench.ops"))

#: what measuring code uses, by the qualified name a use resolves to through the module's imports
#: (a name that starts with a key counts: ``argparse.ArgumentParser``), and what that use does
MEASURING_USES = {
    "argparse": "parses arguments", "optparse": "parses arguments", "getopt": "parses arguments",
    "sys.argv": "reads the command line",
    "torch.cuda.Event": "creates CUDA events", "torch.Event": "creates events",
    "time.perf_counter": "times with a timer", "time.perf_counter_ns": "times with a timer",
    "time.time": "times with a timer", "time.time_ns": "times with a timer",
    "time.process_time": "times with a timer", "timeit": "times with a timer",
    "minimax_lab.resources.user_results_dir": "writes records",
    "minimax_lab.measure": "uses the measuring core", "minimax_lab.bench": "uses the bench",
}
#: a path with a ``results`` component (``results``, ``results/x.json``, ``./results``)
RESULTS_PATH = re.compile(r"(?:^|[/\\])results(?:[/\\]|$)")


def _import_aliases(tree: ast.AST, module: str, is_package: bool) -> dict[str, str]:
    """Each name an import binds in ``module`` (anywhere in it) -> the qualified name it stands for."""
    package = module if is_package else module.rpartition(".")[0]
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for a in node.names:
                aliases[a.asname or a.name] = f"{base}.{a.name}"
    return aliases


def _qualified(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """``torch.cuda.Event`` for ``torch.cuda.Event`` (``import torch``) or ``Event`` (``from torch.cuda
    import Event``); None for anything but a name or an attribute chain on one."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _qualified(node.value, aliases)
        return f"{base}.{node.attr}" if base else None
    return None


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (text about the code, not code)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def measuring_code(source: str, module: str = "minimax_lab.x", is_package: bool = False) -> list[str]:
    """What ``source`` does that belongs to a benchmark or a command line, as ``"line N: what (use)"``:
    a ``__main__`` block, parsing arguments, CUDA events, wall-clock timers, writing records or
    anything under ``results/``. Read from the code (imports, calls, attribute uses, path strings),
    whatever the module's own functions are called; comments and docstrings do not count."""
    tree = ast.parse(source)
    aliases = _import_aliases(tree, module, is_package)
    docstrings = _docstrings(tree)
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}  # read whole chains only
    found = set()

    def flag(node, what, use):
        found.add((node.lineno, f"line {node.lineno}: {what} ({use})"))

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if (any(isinstance(n, ast.Name) and n.id == "__name__" for n in sides)
                    and any(isinstance(n, ast.Constant) and n.value == "__main__" for n in sides)):
                flag(node, "runs as a script", "if __name__ == '__main__'")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if RESULTS_PATH.search(node.value):
                flag(node, "writes under results/", repr(node.value))
        uses = []
        if isinstance(node, (ast.Name, ast.Attribute)) and id(node) not in inner:
            uses = [_qualified(node, aliases)]
        elif isinstance(node, ast.Import):
            uses = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            uses = [aliases.get(a.asname or a.name) for a in node.names]
        for use in uses:
            for key, what in MEASURING_USES.items():
                if use and (use == key or use.startswith(key + ".")):
                    flag(node, what, use)
    return [text for _, text in sorted(found)]


def test_the_measuring_code_finder_reads_what_code_does():
    """It finds each kind of measuring code however it is imported or named, and nothing in code
    that only computes, waits or mentions results in prose."""
    measuring = """
import argparse, sys, time as clock
import torch
from torch.cuda import Event as Ev
from time import perf_counter
from ..measure import time_fn
from minimax_lab import resources
from pathlib import Path

def helper(x):
    start = Ev(enable_timing=True)
    t0 = perf_counter(); t1 = clock.time()
    e = torch.cuda.Event(enable_timing=True)
    args = argparse.ArgumentParser().parse_args(sys.argv[1:])
    Path("results") / "replay.json"
    open(f"results/{x}.json", "w")
    resources.user_results_dir()

if __name__ == "__main__":
    helper(1)
"""
    found = "\n".join(measuring_code(measuring, "minimax_lab.kvcache.sim"))
    for what in ("parses arguments (argparse)", "reads the command line (sys.argv)", "creates CUDA events (torch.cuda.Event)",
                 "times with a timer (time.perf_counter)", "times with a timer (time.time)",
                 "uses the measuring core (minimax_lab.measure.time_fn)", "writes under results/ ('results')",
                 "writes under results/ ('results/')", "writes records (minimax_lab.resources.user_results_dir)",
                 "runs as a script"):
        assert what in found, f"not found: {what}\n{found}"
    assert "line 11: creates CUDA events (torch.cuda.Event)" in found  # the aliased import, where it is used
    computing = '''
"""Results of the kernels; see results/notes.md."""
import time
import torch
from minimax_lab.resources import results_dirs

def timed_out(deadline, results):  # a name is not a behaviour
    """Waits; the partial results merge below (results/ is not written)."""
    time.sleep(0.01)
    torch.cuda.synchronize()
    return time.monotonic() > deadline, {"partial": results}
'''
    assert measuring_code(computing) == []


@pytest.mark.parametrize("module", COMPUTE_MODULES)
def test_operators_and_the_cache_system_hold_no_measuring_code(module):
    """No operator or cache-system module (``attention/``, ``moe/``, ``paged_kv/``, ``kvcache/``,
    ``fp8.py``, ``triton_blocks.py``, ``kernelbench/ops*.py``) runs as a script, parses arguments,
    creates CUDA events, times with ``time.perf_counter``/``time.time``, or writes records or
    anything under ``results/``: timing, records and command lines live in ``bench/``."""
    path = MODULES[module]
    assert path.name != "__main__.py", f"{module} runs as a script"
    found = measuring_code(path.read_text(), module, path.name == "__init__.py")
    assert not found, f"{module} holds measuring code:\n  " + "\n  ".join(found)


def test_suites_are_registered_by_import():
    """The bench's registry holds modules (imported at its top), not strings resolved at run time."""
    import types

    from minimax_lab.bench import cli
    assert cli.SUITES and all(isinstance(m, types.ModuleType) for m in cli.SUITES.values())
    assert all(m.__name__.startswith("minimax_lab.bench.suite_") for m in cli.SUITES.values())


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


#: Every operator with an ``impl=`` switch: its entry point ``package.op:function`` and, per
#: ``impl``, the module and function that implement it. The layout: ``op.py`` (contract, checks,
#: the switch) beside ``op_reference.py``, ``op_torch.py`` and ``op_triton.py`` (``op_triton_<part>.py``
#: where one family has several kernels); the default ``impl`` is ``"torch"``.
def _standard(package: str, op: str, entry: str, triton: str | None = None) -> dict:
    """``<package>.<op>_<impl>:<entry>_<impl>`` for each impl (the Triton module named if it differs)."""
    out = {impl: f"{package}.{op}_{impl}:{entry}_{impl}" for impl in ("reference", "torch", "triton")}
    if triton:
        out["triton"] = f"{package}.{triton}:{entry}_triton"
    return out


OPERATORS = {
    "attention.dense:attention": {**_standard("attention", "dense", "attention"),
                                  "triton": "attention.dense_triton:flash_attention"},
    "attention.msa:msa_select": _standard("attention", "msa", "msa_select", triton="msa_triton_select"),
    "attention.msa:msa_attention": _standard("attention", "msa", "msa_attention", triton="msa_triton_prefill"),
    "attention.msa:msa_decode_paged": _standard("attention", "msa", "msa_decode_paged", triton="msa_triton_decode"),
    "attention.msa_backward:msa_attention_backward": _standard("attention", "msa_backward", "msa_attention_backward"),
    "attention.msa_backward_index:index_distill_loss": _standard("attention", "msa_backward_index",
                                                                  "index_distill_loss"),
    "moe.experts:moe_experts": {**_standard("moe", "experts", "experts"), "loop": "moe.experts_reference:experts_loop"},
    "paged_kv.decode:paged_decode": _standard("paged_kv", "decode", "paged_decode"),
    "paged_kv.prefill:paged_prefill": _standard("paged_kv", "prefill", "paged_prefill"),
    "paged_kv.write:write_kv": _standard("paged_kv", "write", "write_kv"),
    "kernelbench.ops:softmax": _standard("kernelbench", "ops", "softmax"),
    "kernelbench.ops:rmsnorm_residual": _standard("kernelbench", "ops", "rmsnorm_residual"),
    "kernelbench.ops:rope": _standard("kernelbench", "ops", "rope"),
}


def _resolve(spec: str):
    module, _, name = spec.partition(":")
    return importlib.import_module("minimax_lab." + module), name


@pytest.mark.parametrize("entry", sorted(OPERATORS))
def test_every_operator_follows_the_layout(entry):
    """The entry point takes ``impl`` with the default ``"torch"``, accepts exactly the listed
    implementations, each of which lives where the table says (``<op>_<impl>``), and the entry
    module imports each one at its top (no import inside a function)."""
    import inspect
    module, name = _resolve(entry)
    fn = getattr(module, name)
    param = inspect.signature(fn).parameters.get("impl")
    assert param is not None and param.default == "torch", f"{entry}: impl must default to 'torch'"
    impls = OPERATORS[entry]
    accepted = set(getattr(module, "IMPLS"))
    assert accepted == set(impls), f"{entry} accepts {sorted(accepted)}, the layout lists {sorted(impls)}"
    assert set(IMPLS) <= accepted
    op = module.__name__.rsplit(".", 1)[1]
    for impl, spec in impls.items():
        impl_module, impl_name = _resolve(spec)
        stem = impl_module.__name__.rsplit(".", 1)[1]
        file_impl = {"loop": "reference"}.get(impl, impl)  # the per-expert loop is a second reference
        assert stem == f"{op}_{file_impl}" or stem.startswith(f"{op}_{file_impl}_"), f"{spec}: not in {op}_{file_impl}.py"
        assert callable(getattr(impl_module, impl_name, None)), f"{spec} does not exist"
        assert getattr(module, impl_name, None) is getattr(impl_module, impl_name), (
            f"{module.__name__} does not import {impl_name} at its top")
    inner = [n for n in ast.walk(ast.parse(MODULES[module.__name__].read_text()))
             if isinstance(n, ast.FunctionDef) for n in ast.walk(n) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not inner, f"{module.__name__} imports inside a function"


def test_no_implementation_file_outside_the_table():
    """Every ``*_reference.py`` / ``*_torch.py`` / ``*_triton*.py`` of an operator package belongs to an
    operator of the table (or is named here with the reason it is not one)."""
    listed = {_resolve(spec)[0].__name__ for impls in OPERATORS.values() for spec in impls.values()}
    not_switched = {
        "minimax_lab.moe.align_torch": "token alignment: the PyTorch chain is the reference; the Triton "
                                       "versions have narrower contracts and are called directly",
        "minimax_lab.moe.align_triton": "as align_torch",
    }
    found = {n for n in MODULES if n.count(".") == 2 and n.split(".")[1] in ("attention", "moe", "paged_kv", "kernelbench")
             and any(t in n.rsplit(".", 1)[1] for t in ("_reference", "_torch", "_triton"))}
    assert found - listed - set(not_switched) == set()
    assert set(not_switched) <= found
