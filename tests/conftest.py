"""What every test shares: where kernels run (:mod:`tests.support.devices`) and fixed seeds.

Before each test, :func:`tests.support.devices.start_test` resets the seeds to ones fixed by the
test's name (property tests: hypothesis derandomized); a failing test's report gains a section naming the seeds it drew. Set
``MINIMAX_LAB_TEST_SEED`` to draw other (still repeatable) inputs.
"""
from __future__ import annotations

import pytest
from hypothesis import settings

from tests.support import devices

# property tests draw from hypothesis's own generator: derandomized, they repeat run to run too
settings.register_profile("fixed", derandomize=True, database=None)
settings.load_profile("fixed")


def pytest_runtest_setup(item):
    devices.start_test(item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        drawn = devices.seeds_drawn()
        report.sections.append(("seeds", f"seeds drawn by {item.nodeid}: {drawn or 'none'} "
                                          "(fixed by its name; MINIMAX_LAB_TEST_SEED offsets them)"))
