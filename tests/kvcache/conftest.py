"""A real Mooncake Store for the store tests: one master, metadata server and pool node on
127.0.0.1 per test session (free ports, logs in a temporary folder), stopped in teardown even when
a test fails. Where the store cannot start, its tests are skipped with the reason -- except in CI
(``CI`` set), where they fail with it: CI must run them."""
from __future__ import annotations

import os

import pytest

from minimax_lab.kvcache import store as mc


def _require_store() -> None:
    reason = mc.store_unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Mooncake Store tests: {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="session")
def mooncake(tmp_path_factory):
    """A running ``StoreServer`` (its master may be killed and restarted by fault tests; each
    such test restarts it before it ends)."""
    _require_store()
    server = mc.StoreServer(pool_bytes=128 << 20, log_dir=tmp_path_factory.mktemp("mooncake"))
    try:
        server.start()
    except mc.StoreUnavailable as e:
        server.stop()
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Mooncake Store tests: {e}")
        pytest.skip(str(e))
    try:
        yield server
    finally:
        server.stop()
