"""Harness integrity as a whole: whatever a candidate replaces in the namespaces the judging uses --
a function the reference computes with, one the inputs are drawn with, one the timer's statistic
goes through, a problem's field, torch's global settings -- is named after the call and put back
before anything is judged, in this process and in isolated mode; honest candidates that import,
register their own operators or use context managers pass."""
import builtins
import importlib
import statistics
import sys
import types

import pytest
import torch
from hypothesis import given, settings, strategies as st

import minimax_lab  # noqa: F401
from minimax_lab.kernelbench import catalogue, hacks, harness, integrity, problem, problem_ops, problems

SNAPSHOT = integrity.trusted()
#: (namespace label, name) for every watched name outside the integrity check's own code -- the
#: in-process limit: a candidate that rewrites the check itself is stopped only in isolated mode
WATCHED = sorted((ns.label, name) for ns in SNAPSHOT.namespaces for name in ns.expected
                 if not ns.label.startswith("minimax_lab.kernelbench.integrity") and ns.kind != "dict"
                 and not (ns.kind == "class" and name in ("__dict__", "__weakref__", "__doc__")))
_BY_LABEL = {ns.label: ns for ns in SNAPSHOT.namespaces}


def _honest(x):
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def _evaluate(candidate, **kw):
    return harness.evaluate(candidate, "softmax", preset="cpu", n_test=kw.pop("n_test", 0), time_it=False, **kw)


@pytest.mark.parametrize("name", sorted(hacks.INTEGRITY_HACKS))
def test_integrity_hack_fools_the_naive_harness_and_is_caught_in_process(name):
    c = hacks.compare(name, preset="cpu", n_test=1)
    assert c.naive.passed, c.naive.summary()
    assert c.caught and "harness integrity" in c.ours.caught_by, c.ours.summary()
    replaced = {"patch_the_reference": "torch.exp", "patch_the_inputs": "torch.randn",
                "patch_the_statistic": "statistics.median"}[name]
    assert f"replaced {replaced}" in c.ours.failures["harness integrity"][0]
    assert torch.exp is _BY_LABEL["torch"].expected["exp"]
    assert statistics.median is _BY_LABEL["statistics"].expected["median"]


@pytest.mark.parametrize("name", sorted(hacks.INTEGRITY_HACKS))
def test_integrity_hack_is_caught_isolated(name):
    c = hacks.compare(name, preset="cpu", n_test=1, isolated=True)
    assert c.ours.isolated and c.caught, c.ours.summary()


def test_integrity_hacks_stay_out_of_the_catalogue_until_catalogued():
    catalogued = {g for f in catalogue.FAMILIES for g in f.gallery}
    assert not set(hacks.INTEGRITY_HACKS) & (catalogued | set(hacks.GALLERY))
    for h in hacks.INTEGRITY_HACKS.values():
        assert h.caught_by in harness.CHECKS and h.sources, h.name


@settings(max_examples=30, deadline=None)
@given(target=st.sampled_from(WATCHED), delete=st.booleans())
def test_any_watched_name_replaced_or_deleted_in_a_call_is_named_and_put_back(target, delete):
    """The property: pick any watched name (any of ~5,000); a candidate that answers right and then
    replaces (or deletes) it fails 'harness integrity' naming it, and the original is back."""
    label, name = target
    ns = _BY_LABEL[label]
    original = ns.expected[name]

    def sentinel(*args, **kwargs):
        raise AssertionError(f"{label}.{name}: the harness ran a replaced function before putting it back")

    def tampers(x):
        y = _honest(x)
        if delete:
            ns.table.pop(name, None)
        else:
            ns.table[name] = sentinel
        return y
    rep = _evaluate(tampers)
    assert "harness integrity" in rep.caught_by, rep.summary()
    assert f"{label}.{name}" in rep.failures["harness integrity"][0]
    assert ns.table[name] is original


def _new_name_cases():
    """(what, add, remove): a new name that hides something the harness reaches."""
    return [
        ("a builtin hidden in a judging module", lambda: setattr(harness, "len", lambda x: 0),
         lambda: vars(harness).pop("len", None)),
        ("a TensorBase method hidden on torch.Tensor", lambda: setattr(torch.Tensor, "isfinite", lambda t: t),
         lambda: vars(torch.Tensor).get("isfinite") and delattr(torch.Tensor, "isfinite")),
    ]


@pytest.mark.parametrize("what, add, remove", _new_name_cases(), ids=[c[0] for c in _new_name_cases()])
def test_a_new_name_that_hides_something_is_removed(what, add, remove):
    def adds(x):
        y = _honest(x)
        add()
        return y
    try:
        rep = _evaluate(adds)
    finally:
        remove()
    assert "harness integrity" in rep.caught_by and "added, hiding" in rep.failures["harness integrity"][0], what
    assert "len" not in vars(harness) and "isfinite" not in vars(torch.Tensor)


def _tamper_cases():
    """(what, tamper, words in the failure): changes outside plain attribute assignment."""
    softmax = problems.PROBLEMS["softmax"]

    def problem_field():
        object.__setattr__(softmax, "reference", lambda x: torch.full_like(x, 1.0 / x.shape[-1]))

    def problem_entry():
        problems.PROBLEMS["softmax"] = problem.dataclasses.replace(softmax, tol=1.0)

    def code_rewrite():
        problem_ops._softmax_inputs.__code__ = problem_ops._softmax_inputs.__code__.replace()

    def function_mode():
        torch.overrides.TorchFunctionMode().__enter__()  # entered, never left

    class PassThrough(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def dispatch_mode():
        PassThrough().__enter__()

    return [
        ("a problem's field", problem_field, "PROBLEMS['softmax'].reference"),
        ("a problem replaced in PROBLEMS", problem_entry, "problems.PROBLEMS.softmax"),
        ("a function's code rewritten", code_rewrite, "rewrote _softmax_inputs.__code__"),
        ("a __torch_function__ mode left on", function_mode, "torch function modes"),
        ("a __torch_dispatch__ mode left on", dispatch_mode, "torch dispatch modes"),
        ("the default dtype", lambda: torch.set_default_dtype(torch.float64), "torch default dtype"),
        ("the thread count", lambda: torch.set_num_threads(max(1, torch.get_num_threads() + 1)), "torch threads"),
        ("grad mode switched off", lambda: torch.set_grad_enabled(False), "torch grad mode"),
        ("the float32 matmul precision", lambda: torch.set_float32_matmul_precision("medium"),
         "torch float32 matmul precision"),
    ] + ([("an SDPA backend switched off", lambda: torch.backends.cuda.enable_math_sdp(False), "SDPA math backend")]
         if "SDPA math backend" in integrity._SETTINGS else [])  # a CUDA setting: watched where a GPU is


@pytest.mark.parametrize("what, tamper, says", _tamper_cases(), ids=[c[0] for c in _tamper_cases()])
def test_changes_beyond_assignment_are_caught_and_put_back(what, tamper, says):
    before = integrity.Settings.capture().values
    softmax = problems.PROBLEMS["softmax"]
    fields = dict(vars(softmax))

    def tampers(x):
        y = _honest(x)
        tamper()
        return y
    rep = _evaluate(tampers)
    assert "harness integrity" in rep.caught_by, (what, rep.summary())
    assert says in " ".join(rep.failures["harness integrity"]), rep.failures["harness integrity"]
    assert integrity.Settings.capture().values == before
    assert problems.PROBLEMS["softmax"] is softmax and vars(softmax) == fields
    assert _evaluate(_honest).passed  # and the next evaluation finds everything as it was


def test_an_aten_kernel_registered_through_torch_library_is_caught_and_dropped():
    x = torch.randn(3, 5)
    expected = torch.exp(x)
    kept = []

    def overrides_exp(x):
        y = _honest(x)
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("exp", lambda t: torch.zeros_like(t), "CPU")  # every torch.exp on the CPU now gives zeros
        kept.append(lib)
        return y
    rep = _evaluate(overrides_exp)
    assert "harness integrity" in rep.caught_by and "aten/exp" in rep.failures["harness integrity"][0]
    assert torch.equal(torch.exp(x), expected)  # the registration is gone


#: dispatch keys a kernel of a built-in operator can be registered for; a CPU-only torch registers
#: for the CUDA keys as well (the dispatcher does not need the device to hold the kernel)
KERNEL_KEYS = ("CPU", "CUDA", "AutogradCPU", "AutogradCUDA", "Autograd", "CompositeImplicitAutograd")


@pytest.mark.parametrize("already", [False, True], ids=["a new key", "a key already registered"])
@pytest.mark.parametrize("key", KERNEL_KEYS)
def test_a_kernel_registered_for_any_dispatch_key_is_caught_and_dropped(key, already):
    """A kernel for ``aten::sinh`` registered in a call, on the CPU, CUDA or Autograd keys, is named
    and dropped -- also when trusted code had registered the same key before (torch's set of
    registered keys does not grow then; the dispatcher runs the newest kernel all the same)."""
    zeros = lambda t: torch.zeros_like(t)  # noqa: E731
    trusted_lib = None
    if already:
        trusted_lib = torch.library.Library("aten", "IMPL")
        trusted_lib.impl("sinh", lambda t: torch.full_like(t, 7.0), key)
    kept = []

    def registers(x):
        y = _honest(x)
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("sinh", zeros, key)
        kept.append(lib)
        return y
    try:
        rep = _evaluate(registers)
        if already and not kept and "already a kernel registered from python" in rep.summary():
            # some torch releases (2.11) refuse a second Python kernel for one key: the cheat raises
            # in every call, so it fails every check and is never scored
            assert not rep.passed and rep.caught_by and "harness integrity" not in rep.caught_by, rep.summary()
        else:
            assert "harness integrity" in rep.caught_by, rep.summary()
            assert f"aten/sinh/{key}" in rep.failures["harness integrity"][0], rep.failures["harness integrity"]
            assert kept and all(lib.m is None for lib in kept)  # the candidate's registrations are gone ...
        if already:  # ... and the trusted one is still there
            assert trusted_lib.m is not None
            if key == "CPU":
                assert torch.equal(torch.sinh(torch.ones(3)), torch.full((3,), 7.0))
        assert _evaluate(_honest).passed
    finally:
        if trusted_lib is not None:
            trusted_lib._destroy()
    assert torch.equal(torch.sinh(torch.ones(3)), torch.full((3,), 1.0).sinh())


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
def test_a_kernel_registered_when_the_candidate_is_imported_is_caught(isolate):
    module = "tests.kernelbench.candidate_registers_on_import"
    sys.modules.pop(module, None)
    rep = _evaluate(f"{module}:softmax", isolate=isolate)
    assert "harness integrity" in rep.caught_by, rep.summary()
    first = rep.failures["harness integrity"][0]
    assert "importing the candidate replaced torch.library kernels for aten/sinh/CPU" in first, first
    assert torch.equal(torch.sinh(torch.ones(3)), torch.full((3,), 1.0).sinh())


def test_the_standard_library_reading_a_frame_for_itself_is_not_introspection():
    """``logging`` finds the line of a log call and ``namedtuple`` its caller's module through
    ``sys._getframe``: the candidate looked at nothing. ``inspect`` and ``logging.currentframe``
    hand it a frame: that is looking."""
    import collections
    import inspect
    import logging

    def logs(x):
        logging.getLogger("kbench.test").warning("rows %d", x.shape[0])
        collections.namedtuple("Pair", "a b")
        return _honest(x)

    def looks(get_frame):
        def candidate(x):
            get_frame()
            return _honest(x)
        return candidate
    rep = _evaluate(logs)
    assert rep.passed, rep.summary()
    for get_frame in (inspect.currentframe, inspect.stack, logging.currentframe):
        rep = _evaluate(looks(get_frame))
        assert "no introspection" in rep.caught_by, (get_frame, rep.summary())


def test_honest_candidates_that_import_register_their_own_ops_and_use_contexts_pass():
    calls = []

    def busy_but_honest(x):
        calls.append(1)
        if len(calls) == 1:
            fresh = next((m for m in ("numpy.polynomial", "numpy.ma", "numpy.matlib") if m not in sys.modules), None)
            if fresh is not None:
                importlib.import_module(fresh)  # a submodule imported during a call: a new name in numpy
            lib = torch.library.Library("kbench_honest", "DEF")  # an operator of its own
            lib.define("twice(Tensor x) -> Tensor")
            lib.impl("twice", lambda t: t * 2, "CompositeExplicitAutograd")
            calls.append(lib)
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            return _honest(x)
    rep = _evaluate(busy_but_honest, n_test=2)
    assert rep.passed, rep.summary()


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
def test_a_candidate_module_that_patches_when_imported_is_caught(isolate):
    """The harness imports a "module:function" candidate (here, or in the candidate's process);
    what the import replaced is named and put back before the first call."""
    module = "tests.kernelbench.candidate_patches_on_import"
    sys.modules.pop(module, None)
    median = statistics.median
    rep = _evaluate(f"{module}:softmax", isolate=isolate)
    assert statistics.median is median
    assert "harness integrity" in rep.caught_by, rep.summary()
    assert "importing the candidate replaced statistics.median" in rep.failures["harness integrity"][0]


def test_what_trusted_code_changed_before_a_call_is_kept():
    """A module imported on first use that wraps a torch function (torch._dynamo wraps
    torch.manual_seed), a notebook cell, a test's monkeypatch: the state right before each call is
    the one to keep, so an honest candidate is not blamed and the change is not undone."""
    original = torch.manual_seed

    def wrapped(seed):
        return original(seed)
    torch.manual_seed = wrapped
    try:
        rep = _evaluate(_honest, n_test=1)
        assert rep.passed, rep.summary()
        assert torch.manual_seed is wrapped
    finally:
        torch.manual_seed = original
    assert _evaluate(_honest).passed


@pytest.mark.parametrize("versions", [True, False], ids=["dict versions", "name by name"])
def test_both_ways_of_comparing_find_the_same_changes(versions):
    """With dict versions (CPython 3.8-3.13) and without (every other interpreter): same answers."""
    snap = integrity.Snapshot.capture(problems.PROBLEMS)
    if not versions:
        snap._tags = None
        for ns in snap.namespaces:
            ns.version = ns.seen = None
    elif integrity._VERSION is None:
        pytest.skip("this interpreter has no dict versions")
    assert snap.restore() == []
    original_median, original_floor = statistics.median, harness.FLOOR_SLACK
    statistics.median, harness.FLOOR_SLACK = min, 0.0
    builtins.sorted, real_sorted = (lambda *a, **k: []), builtins.sorted
    try:
        changed = snap.restore()
    finally:
        builtins.sorted = real_sorted
    assert sorted(changed) == ["builtins.sorted", "minimax_lab.kernelbench.harness.FLOOR_SLACK", "statistics.median"]
    assert statistics.median is original_median and harness.FLOOR_SLACK == original_floor
    assert snap.restore() == []


def test_the_snapshot_watches_what_the_issue_names():
    labels = {ns.label for ns in SNAPSHOT.namespaces}
    want = {"builtins", "torch", "torch.nn.functional", "torch.linalg", "math", "statistics", "time", "random",
            "numpy", "secrets", "os", "torch.Tensor", "minimax_lab.kernelbench.harness",
            "minimax_lab.kernelbench.problems", "minimax_lab.kernelbench.problem.Problem",
            "problems.PROBLEMS['softmax']", "minimax_lab.measure.check"}
    assert want <= labels, want - labels
    assert len(SNAPSHOT) > 4000
    mods = {ns.owner for ns in SNAPSHOT.namespaces if isinstance(ns.owner, types.ModuleType)}
    assert all(m.__name__.startswith(("minimax_lab", "torch", "numpy")) or m in integrity.STANDARD_MODULES
               for m in mods)
