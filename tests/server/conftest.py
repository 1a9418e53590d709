"""A real server per test module (server_helpers.start_server); its graceful stop is checked.

A module with a module-scoped server (or browser) is its own xdist group (`pytestmark =
pytest.mark.xdist_group(__name__)`): `--dist loadgroup` hands ungrouped tests out one by one,
so such a module was split between the workers and each started its own server (test_guards.py
started four, ~5 s each)."""

from __future__ import annotations

import pytest
from server_helpers import start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("srv"))
    yield srv
    code = srv.stop()
    assert code == 130, srv.log.read_text()[-2000:]  # graceful shutdown on Ctrl-C: 130, as serve's help says
