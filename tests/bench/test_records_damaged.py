"""No record lost, no notebook broken by a damaged results file -- property tests over damaged files
of every kind: truncated, not JSON, not a list, a list with non-records, unreadable.

``append_records`` never drops the records it was given and never overwrites bytes it could not
read (the damaged file is kept aside, a warning says where); ``load_records`` skips a damaged file
with one warning naming it, and the shipped records still load."""
from __future__ import annotations

import contextlib
import errno
import json
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from minimax_lab import measure
from minimax_lab.measure import records as records_mod
from minimax_lab.measure.records import RecordsNotSaved, RecordsWarning

KINDS = ("truncated", "not JSON", "not a list", "non-records", "unreadable")


def _record(i: int, tag: str) -> dict:
    return measure.make_record("demo", f"case{i}", tag, 1.0 + i)


_junk = st.one_of(st.none(), st.integers(), st.text(max_size=8), st.lists(st.integers(), max_size=3),
                  st.dictionaries(st.sampled_from(["suite", "case", "x"]), st.integers(), max_size=2))


@st.composite
def damaged(draw, kind: str):
    """``(bytes to write, or None for an unreadable path; the records a reader can still use)``."""
    good = [_record(i, "old") for i in range(draw(st.integers(1, 4)))]
    text = json.dumps(good, indent=1)
    if kind == "truncated":  # a copy cut short, a full disk: every prefix of a JSON list is not JSON
        return text[: draw(st.integers(1, len(text) - 1))].encode(), []
    if kind == "not JSON":
        blob = draw(st.one_of(st.binary(min_size=1, max_size=64), st.text(min_size=1, max_size=40).map(str.encode)))
        with contextlib.suppress(ValueError):
            json.loads(blob)
            blob = b"\xff" + blob  # it happened to be JSON: make it not
        return blob, []
    if kind == "not a list":
        value = draw(st.one_of(st.dictionaries(st.text(max_size=5), st.integers(), max_size=3), st.integers(),
                               st.text(max_size=10), st.none()))
        return json.dumps(value).encode(), []
    if kind == "non-records":
        mixed = list(good)
        for _ in range(draw(st.integers(1, 3))):
            mixed.insert(draw(st.integers(0, len(mixed))), draw(_junk))
        return json.dumps(mixed).encode(), good
    return None, []  # unreadable


def _place(path: Path, content: bytes | None) -> None:
    if content is None:
        path.mkdir()  # a folder where the file should be: reading it fails (even as root)
        (path / "inside").write_text("kept")
    else:
        path.write_bytes(content)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), kind=st.sampled_from(KINDS), n_new=st.integers(1, 5))
def test_append_never_drops_records_or_overwrites_what_it_could_not_read(data, kind, n_new):
    content, readable = data.draw(damaged(kind))
    new = [_record(i, "new") for i in range(n_new)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "Some_GPU.json"
        _place(path, content)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = measure.append_records(new, path)
        assert out == path
        stored = json.loads(path.read_text())
        kept_new = [r["case"] for r in stored if records_mod.is_record(r) and r["impl"] == "new"]
        assert kept_new == [r["case"] for r in new]  # none dropped
        aside = sorted(Path(tmp).glob("Some_GPU.json.damaged-*"))
        if kind == "non-records":  # readable: nothing is moved, every old entry is kept as it was
            assert not aside and stored[: len(stored) - n_new] == json.loads(content)
        else:
            assert len(aside) == 1, [p.name for p in Path(tmp).iterdir()]
            if content is None:
                assert (aside[0] / "inside").read_text() == "kept"
            else:
                assert aside[0].read_bytes() == content  # the bytes it could not read, untouched
            said = [str(w.message) for w in caught if issubclass(w.category, RecordsWarning)]
            assert len(said) == 1 and str(aside[0]) in said[0], said


@settings(max_examples=30, deadline=None)
@given(data=st.data(), kind=st.sampled_from(KINDS))
def test_load_skips_a_damaged_file_with_one_warning_and_the_shipped_records_still_load(data, kind):
    content, readable = data.draw(damaged(kind))
    shipped = measure.load_records("NVIDIA H200")
    assert shipped, "the package ships H200 records"
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINIMAX_LAB_RESULTS", tmp)
        path = Path(tmp) / "NVIDIA_H200.json"
        _place(path, content)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = measure.load_records("NVIDIA H200")
            everything = measure.load_records(None)
    said = [str(w.message) for w in caught if issubclass(w.category, RecordsWarning)]
    assert len(said) == (1 if kind == "not a list" else 2) and all(str(path) in s for s in said), said
    keys = lambda recs: {(r["suite"], r["case"], r["impl"]) for r in recs}  # noqa: E731
    assert keys(shipped) <= keys(got) and keys(got) - keys(shipped) == keys(readable)
    assert keys(shipped) <= keys(everything)


def test_a_healthy_file_gets_the_records_appended():
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.json"
        measure.append_records([_record(0, "a")], path)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing to say about a healthy file
            measure.append_records([_record(1, "b")], path)
        assert [r["impl"] for r in json.loads(path.read_text())] == ["a", "b"]
        assert [p.name for p in Path(tmp).iterdir()] == ["x.json", "x.json.lock"]  # no temporary file left


def _failing_write(fail_for):
    real = records_mod._write_json

    def write(path, data):
        if fail_for(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)
    return write


def test_a_full_disk_sends_the_records_elsewhere_and_keeps_the_old_file(monkeypatch, tmp_path):
    path = tmp_path / "x.json"
    measure.append_records([_record(0, "old")], path)
    before = path.read_bytes()
    monkeypatch.setattr(records_mod, "_write_json", _failing_write(lambda p: p == path))
    with pytest.warns(RecordsWarning, match="No space left") as said:
        out = measure.append_records([_record(1, "new")], path)
    assert path.read_bytes() == before and out != path and out.name.startswith("x.unsaved-")
    assert [r["impl"] for r in json.loads(out.read_text())] == ["new"] and str(out) in str(said[0].message)


def test_records_that_cannot_be_written_anywhere_travel_in_the_error(monkeypatch, tmp_path):
    monkeypatch.setattr(records_mod, "_write_json", _failing_write(lambda p: True))
    new = [_record(0, "new")]
    with pytest.raises(RecordsNotSaved) as e:
        measure.append_records(new, tmp_path / "x.json")
    assert [r["case"] for r in e.value.records] == ["case0"] and "not saved" in str(e.value)


@pytest.mark.parametrize("kind", KINDS)
def test_read_records_names_each_kind_of_damage(kind, tmp_path):
    content, _ = {"truncated": (b'[{"suite": "a"', None), "not JSON": (b"\xff\xfe", None),
                  "not a list": (b'{"a": 1}', None), "non-records": (b'[1, {"suite": "s", "case": "c", "impl": "i"}]',
                                                                    None), "unreadable": (None, None)}[kind]
    path = tmp_path / "r.json"
    _place(path, content)
    stored, problem = records_mod.read_records(path)
    want = {"truncated": "not JSON", "not JSON": "not JSON", "not a list": "not a list", "non-records": "1 of 2",
            "unreadable": "unreadable"}[kind]
    assert problem is not None and problem.startswith(want), problem
    assert (stored is not None) == (kind == "non-records")
    assert records_mod.read_records(tmp_path / "missing.json") == (None, "no such file")
