"""A real server per test module (server_helpers.start_server); its graceful stop is checked."""

from __future__ import annotations

import pytest
from server_helpers import start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("srv"))
    yield srv
    code = srv.stop()
    assert code == 130, srv.log.read_text()[-2000:]  # graceful shutdown on Ctrl-C: 130, as serve's help says
