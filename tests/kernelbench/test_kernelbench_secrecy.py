"""Held-out shapes cannot be read by a candidate: a spy that scans everything it can reach while
it runs (every caller frame's locals, the harness and problem modules, every ``random.Random``
the garbage collector knows) finds no shape before the call that uses it, and no generator that
predicts one."""
import gc
import random
import secrets
import sys

import torch

import minimax_lab  # noqa: F401
from minimax_lab.kernelbench import harness, problems


def _walk(obj, found, depth=0, seen=None):
    """Collect every dict of ints (a shape) and every random.Random reachable from obj."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 4 or isinstance(obj, torch.Tensor):
        return
    seen.add(id(obj))
    if isinstance(obj, random.Random) and not isinstance(obj, random.SystemRandom):
        found["rngs"].append(obj)
    elif isinstance(obj, dict):
        if obj and all(isinstance(k, str) for k in obj) and all(type(v) is int for v in obj.values()):
            found["shapes"].append(dict(obj))
        for v in list(obj.values()):
            _walk(v, found, depth + 1, seen)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in list(obj):
            _walk(v, found, depth + 1, seen)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type(sys)):
        _walk(vars(obj), found, depth + 1, seen)


class Spy:
    """An honest softmax that, on every call, records everything it can reach."""

    def __init__(self):
        self.calls = []  # (shape of this call's x, shapes seen, rngs seen)

    def __call__(self, x):
        found = {"shapes": [], "rngs": []}
        f = sys._getframe(1)
        while f is not None:
            _walk(dict(f.f_locals), found)
            f = f.f_back
        for mod in (harness, problems):
            _walk({k: v for k, v in vars(mod).items() if not k.startswith("__")}, found)
        found["rngs"] += [o for o in gc.get_objects() if isinstance(o, random.Random)
                          and not isinstance(o, random.SystemRandom)]  # os.urandom: no state to copy
        found["rngs"].append(random._inst)
        states = {id(r): r.getstate() for r in found["rngs"]}  # the generators, frozen as they were now
        self.calls.append((tuple(x.shape), found["shapes"], list(states.values())))
        return torch.softmax(x, -1)


def _leaks(spy, held_out):
    """Every way the spy could have known a held-out shape before the call that used it."""
    first_use = {}
    for i, (xshape, _, _) in enumerate(spy.calls):
        for h in held_out:
            if (h["rows"], h["cols"]) == xshape:
                first_use.setdefault(tuple(h.items()), i)
    assert len(first_use) == len({tuple(h.items()) for h in held_out})
    # the scan works: during its own call the spy does see the current shape
    assert any(dict(k) in spy.calls[i][1] for k, i in first_use.items())
    # Shapes in use order; a generator "predicts" them only if it draws at least two of the held-out
    # shapes still to come, in order (one small shape is hit by chance now and then: the CPU shape
    # space is small and gc finds other libraries' generators too; a generator the harness drew from
    # would predict the whole rest). Public validation shapes are no secret.
    order = sorted(first_use, key=first_use.get)
    public = problems.SOFTMAX.validation_shapes("cpu")
    leaks = []
    for i, (_, _, states) in enumerate(spy.calls):
        upcoming = [dict(k) for k in order if first_use[k] > i]
        if len(upcoming) < 2:
            continue
        rng = random.Random()
        for state in {repr(st): st for st in states}.values():
            rng.setstate(state)
            draws = [problems.SOFTMAX.draw_test_shape(rng, "cpu") for _ in range(8 + len(upcoming))]
            if any(draws[j:j + len(upcoming)] == upcoming for j in range(9)):
                leaks.append(f"a random.Random reachable at call {i} predicts the coming shapes {upcoming}")
    for key, use in first_use.items():
        h = dict(key)
        for i in range(use):
            if h in spy.calls[i][1] and h not in public:
                leaks.append(f"held-out shape {h} was visible at call {i}, before its use at call {use}")
    return leaks


def test_spy_finds_no_held_out_shape_before_its_call():
    spy = Spy()
    rep = harness.evaluate(spy, "softmax", preset="cpu", n_test=5, time_it=False)
    assert "no introspection" in rep.caught_by  # the spying itself is noticed ...
    assert len(rep.held_out_shapes) == 5
    assert _leaks(spy, rep.held_out_shapes) == []  # ... and it learned nothing


def test_the_spy_would_catch_a_leaky_harness(monkeypatch):
    """Control: a harness that drew its shapes up front (a list on the module) is caught."""
    upcoming = [problems.SOFTMAX.draw_test_shape(random.Random(secrets.randbits(64)), "cpu") for _ in range(4)]
    def leaky_draw(problem, preset):
        return harness._upcoming.pop(0)
    monkeypatch.setattr(harness, "_upcoming", list(upcoming), raising=False)
    monkeypatch.setattr(harness, "_draw_held_out", leaky_draw)  # trusted code: taken as the state to keep
    spy = Spy()
    rep = harness.evaluate(spy, "softmax", preset="cpu", n_test=4, time_it=False)
    assert rep.held_out_shapes == upcoming
    assert _leaks(spy, rep.held_out_shapes)


def test_held_out_shapes_ignore_every_seedable_generator():
    """Seeding Python's and torch's global generators identically does not repeat the draw."""
    draws = []
    for _ in range(2):
        random.seed(0)
        torch.manual_seed(0)
        rep = harness.evaluate(lambda x: torch.softmax(x, -1), "softmax", preset="cpu", n_test=4, time_it=False)
        draws.append(rep.held_out_shapes)
    assert draws[0] != draws[1]


def test_harness_and_problems_keep_no_shapes_between_calls():
    """After an evaluation, neither module nor any problem holds the shapes that were drawn."""
    rep = harness.evaluate(lambda x: torch.softmax(x, -1), "softmax", preset="cpu", n_test=4, time_it=False)
    found = {"shapes": [], "rngs": []}
    for mod in (harness, problems):
        _walk({k: v for k, v in vars(mod).items() if not k.startswith("__")}, found)
    for h in rep.held_out_shapes:
        assert h not in found["shapes"]
