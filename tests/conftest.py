"""What every test shares: where kernels run (:mod:`tests.support.devices`), fixed seeds, and a
checkout the run leaves as it found it.

* **Seeds.** Before each test, :func:`tests.support.devices.start_test` resets the seeds to ones
  fixed by the test's name, and the autouse fixture :func:`global_generators_seeded_by_name`
  seeds torch's global generator (CPU and CUDA), ``random`` and numpy's from the name too, so a
  test draws the same numbers whatever ran before it (another order, ``-n 2``, ``-k``). Fixtures
  wider than one test are seeded by their own name before they are built. Property tests draw from
  hypothesis's own generator, derandomized. A failing test's report gains a section naming the
  seeds it drew. Set ``MINIMAX_LAB_TEST_SEED`` to draw other (still repeatable) inputs.
* **Nothing written into the checkout.** Hypothesis keeps its files in a temporary folder, pytest's
  cache is off (``pyproject.toml``), and a run that leaves a new untracked file in the checkout
  fails, naming it (:mod:`tests.support.checkout`). ``MINIMAX_LAB_CHECKOUT_CHECK=off`` skips the
  check: for a pytest run a test starts inside this checkout (the outer run's check covers it), or
  while people add files to the tree during the run.
* **Which tests launch which Triton kernels** is watched (:mod:`tests.support.launch_log`): with
  ``MINIMAX_LAB_LAUNCH_LOG=<file>`` each such test's node id, kernels and seconds are written there,
  and ``make test`` runs again, under Triton's newest release, a set of them that launches every
  kernel.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import configuration, settings

from tests.support import checkout, devices, launch_log

# hypothesis writes its caches (and, if asked, its example database) into ./.hypothesis of the
# working directory unless told otherwise: here, a folder of the system's temporary directory
HYPOTHESIS_HOME = Path(tempfile.gettempdir()) / "minimax_lab-hypothesis"
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(HYPOTHESIS_HOME))
configuration.set_hypothesis_home_dir(os.environ["HYPOTHESIS_STORAGE_DIRECTORY"])

# property tests draw from hypothesis's own generator: derandomized, they repeat run to run too
settings.register_profile("fixed", derandomize=True, database=None)
settings.load_profile("fixed")


def pytest_runtest_setup(item):
    devices.start_test(item.nodeid)


launch_log.install()


@pytest.fixture(autouse=True)
def launches_noted(request):
    """The test's node id, kernels and seconds go to the launch log when it launched a Triton kernel."""
    started = launch_log.start()
    yield
    launch_log.note(request.node.nodeid, started)


@pytest.fixture(autouse=True)
def global_generators_seeded_by_name(request):
    """torch's global generator (CPU and every CUDA device), ``random`` and numpy's start each test
    from a seed fixed by the test's name."""
    return devices.seed_global_generators(request.node.nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef, request):
    """A fixture shared by several tests is built once, by whichever of them comes first: it is
    seeded by its own name, not by that test's. (Returns None: pytest then builds the fixture.)"""
    if fixturedef.scope != "function":
        devices.seed_global_generators(f"{fixturedef.baseid}::{fixturedef.argname}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        drawn = devices.seeds_drawn()
        report.sections.append(("seeds", f"seeds drawn by {item.nodeid}: {drawn or 'none'}; global generators "
                                          f"seeded with {devices.global_seed_of_test()} (fixed by its name; "
                                          "MINIMAX_LAB_TEST_SEED offsets them)"))


# --------------------------------------------------------------------------- the checkout stays clean


FILES_BEFORE = pytest.StashKey[set]()


def _checks_the_checkout(config) -> bool:
    """The check runs once per run: in the process that runs the session (not in xdist's workers)."""
    return not hasattr(config, "workerinput") and os.environ.get("MINIMAX_LAB_CHECKOUT_CHECK", "on") != "off"


def pytest_sessionstart(session):
    if _checks_the_checkout(session.config):
        session.config.stash[FILES_BEFORE] = checkout.files_in()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    before = session.config.stash.get(FILES_BEFORE, None)
    if before is None:
        return
    written = checkout.written_by_run(before, checkout.files_in(), checkout.tracked_files())
    if not written:
        return
    shown = "\n  ".join(written[:20]) + (f"\n  ... and {len(written) - 20} more" if len(written) > 20 else "")
    message = (f"this test run wrote {len(written)} new file(s) into the checkout {checkout.ROOT} (tests write "
               f"under tmp_path):\n  {shown}\nIf a person created them while the tests ran, this is no test's "
               "doing: MINIMAX_LAB_CHECKOUT_CHECK=off skips the check while others edit the tree.")
    report = pytest.CollectReport("tests/conftest.py::checkout", "failed", message, [])
    session.config.hook.pytest_collectreport(report=report)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
