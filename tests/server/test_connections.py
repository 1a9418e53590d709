"""Nobody can knock the server over with sockets (server/connections.py): hundreds of idle or
half-open connections, a burst at the default settings, a keep-alive a pooled client can trust.

A real server on loopback; the hostile sockets are plain sockets on 127.0.0.1, bounded in
count and time, closed by the test.
"""

from __future__ import annotations

import socket
import time

import pytest
from server_helpers import httpx, start_server

# one xdist worker runs this module, so its module-scoped server starts once (tests/server/conftest.py)
pytestmark = pytest.mark.xdist_group(__name__)

SOCKETS = 400  # more than the per-client bound (256): the bound must make room, not refuse


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    # a read timeout of 5 s, not the default 10: the sockets are still held while the client's
    # requests run, and the tests that wait for it wait half as long
    server = start_server(tmp_path_factory.mktemp("conn"), "--no-prewarm", "--read-timeout", "5")
    yield server
    assert server.stop() == 130  # Ctrl-C


def _half_open(url: str, n: int) -> list[socket.socket]:
    """`n` connections: a third send nothing, a third half a request line, a third the request
    line and some headers, and all stop there (a slowloris)."""
    host, port = url.removeprefix("http://").split(":")
    first = (b"", b"GE", b"POST /synthesis?speaker=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    socks = []
    for i in range(n):
        s = socket.create_connection((host, int(port)), timeout=5)
        if first[i % 3]:
            s.sendall(first[i % 3])
        socks.append(s)
    return socks


def _closed_by_server(s: socket.socket) -> bool:
    s.settimeout(0.05)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_hundreds_of_half_open_sockets_do_not_lock_a_client_out(srv):
    socks = _half_open(srv.url, SOCKETS)
    try:
        # a normal client still gets its answers while they are all held
        for _ in range(3):
            r = httpx.post(srv.url + "/audio_query", params={"text": "こんにちは", "speaker": 0}, timeout=30)
            assert r.status_code == 200
        assert httpx.get(srv.url + "/speakers", timeout=30).status_code == 200
        # the per-client bound made room by closing the oldest idle ones, counted
        assert srv.metric("irodori_rejected_total") >= SOCKETS - 256
        # and the read timeout (5 s here from a request's first byte) closes the rest: bounded
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(_closed_by_server(s) for s in socks[-50:]):
            time.sleep(0.5)
        assert all(_closed_by_server(s) for s in socks[-50:])
    finally:
        for s in socks:
            s.close()
    text = httpx.get(srv.url + "/metrics").text
    assert 'irodori_rejected_total{reason="read_timeout"}' in text
    assert 'irodori_rejected_total{reason="evicted_per_client"}' in text


def test_a_body_that_never_comes_is_cut_off_too(srv):
    host, port = srv.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"POST /synthesis?speaker=0 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5000\r\n\r\n{")
        s.settimeout(60)
        data = s.recv(4096)  # the server gives up on the request, whatever it says on the way
        while data:
            data = s.recv(4096)
    assert httpx.get(srv.url + "/version").status_code == 200


def test_a_pooled_connection_outlives_the_clients_idea_of_it(srv):
    """The connection errors of a burst (`--max-queue 256`, two /synthesis requests): uvicorn
    closed idle connections after 5 s, and httpx keeps a pooled one for 5 s too, so a request
    sent on a connection that idled ~5 s could meet the server's close. The server's
    keep-alive is now longer than the pool expiry of common clients: a connection idle for
    6 s is still the server's, and the next request rides on it."""
    assert httpx.Limits().keepalive_expiry is not None and httpx.Limits().keepalive_expiry < 20
    ports = []

    def remember(response: httpx.Response) -> None:
        stream = response.extensions["network_stream"]
        ports.append(stream.get_extra_info("client_addr")[1])

    limits = httpx.Limits(keepalive_expiry=15)  # a client that trusts a pooled connection longer
    with httpx.Client(limits=limits, event_hooks={"response": [remember]}) as client:
        assert client.get(srv.url + "/version").status_code == 200
        time.sleep(6)  # idle past uvicorn's old 5 s
        assert client.get(srv.url + "/version").status_code == 200
    assert ports[0] == ports[1]  # the same connection: the server had not closed it
