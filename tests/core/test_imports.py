"""The package's structure: one file layout for every operator (the table below is the map; a
deviation fails), plain imports -- every public name is a static import a reader (and "go to
definition") can follow, the package's modules do not import each other in a circle -- and
``import minimax_lab`` stays cheap (it decides the runtime and nothing else)."""
from __future__ import annotations

import ast
import importlib
import pathlib
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


#: the operator and serving packages: they compute, they do not time, tune, record or fetch peers
OPERATOR_PACKAGES = ("minimax_lab.attention", "minimax_lab.moe", "minimax_lab.paged_kv", "minimax_lab.kvcache",
                     "minimax_lab.engine")
#: names that belong to the bench: timing, records, tuning, peers
BENCH_NAMES = ("time_fn", "make_record", "append_records", "load_records", "bench_", "peer_", "suite_", "tune_op")


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith(OPERATOR_PACKAGES)))
def test_operators_hold_no_bench_code(module):
    """``attention/``, ``moe/``, ``kvcache/`` and ``engine/`` never import the bench (or a peer) and
    define nothing named like it."""
    tree = ast.parse(MODULES[module].read_text())
    bench = sorted(m for m in all_imports(module) if m == "minimax_lab.bench" or m.startswith("minimax_lab.bench."))
    assert not bench, f"{module} imports {bench}"
    defined = [n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))
               and any(n.name == b or n.name.startswith(b) for b in BENCH_NAMES)]
    assert not defined, f"{module} defines bench code: {defined}"
    stem = module.rsplit(".", 1)[1]
    assert not any(t in stem for t in ("bench", "tune", "peer", "measure")), f"{module}: a bench module's name"


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
