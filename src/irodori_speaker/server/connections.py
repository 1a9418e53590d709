"""Connections: idle and half-open sockets never lock a well-behaved client out.

uvicorn's own guard (`limit_concurrency`) counts connections and answers 503 before the app
runs, so a few hundred sockets that send half a request line shut the server for everyone;
and uvicorn arms no timer before the first response, so such a socket is held for ever. Here
the HTTP protocol (uvicorn's, subclassed) adds:

- a read timeout: a request has `read_timeout_s` from its first byte (or from the connection's
  opening, if it sends nothing) to arrive whole, headers and body, else the connection is
  closed;
- a keep-alive longer than common clients' pool expiry (httpx 5 s, aiohttp 15 s): a client
  never picks up a pooled connection the server is closing that instant (the cause of the
  connection errors seen under a burst with uvicorn's 5 s, which equals httpx's);
- a per-client bound and a global cap that make room rather than refuse: at either, the
  oldest connection the app is not working for (idle keep-alive, or its request still
  arriving) is closed; only when every connection is mid-request is the new one refused with
  a 503 and `Retry-After`. A client that sends its request promptly always gets in.

Every connection closed or refused here is counted in `/metrics` (`irodori_rejected_total`).
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

Reject = Callable[[str], None]  # counts a rejection by its reason


@dataclass
class ConnectionLimits:
    """What the protocol enforces; `per_client` and `total` are connections."""

    read_timeout_s: float = 10.0
    keep_alive_s: int = 20
    per_client: int = 256
    total: int = 1024
    retry_after_s: int = 1


@dataclass
class _Book:
    """The open connections, by client address (shared by every protocol of one server)."""

    limits: ConnectionLimits
    on_reject: Reject
    by_client: dict[str, set[Any]] = field(default_factory=dict)
    count: int = 0


def fd_headroom(wanted: int) -> int:
    """Raise the soft open-file limit towards `wanted` + 64 where the hard limit allows; the
    connections the process can then hold (an accept that fails for want of a descriptor
    stops accepting for everyone for a second)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + 64
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return min(wanted, max(8, soft - 64))


def guarded_protocol(limits: ConnectionLimits, on_reject: Reject) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol with the read timeout, the per-client bound and the cap."""
    book = _Book(limits, on_reject)

    class Guarded(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._opened = time.monotonic()
            self._read_timer: asyncio.TimerHandle | None = None
            self._counted = False
            self._peer = self.client[0] if self.client else "-"
            mine = book.by_client.get(self._peer, set())
            if len(mine) >= limits.per_client and not _evict(mine, "per_client"):
                self._refuse("per_client")
                return
            if book.count >= limits.total and not _evict(
                {c for conns in book.by_client.values() for c in conns}, "total"
            ):
                self._refuse("total")
                return
            book.by_client.setdefault(self._peer, set()).add(self)
            book.count += 1
            self._counted = True
            self._arm_read_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_read_timer()
            self._count_out()
            super().connection_lost(exc)

        def _count_out(self) -> None:
            if getattr(self, "_counted", False):
                self._counted = False
                book.count -= 1
                mine = book.by_client.get(self._peer)
                if mine is not None:
                    mine.discard(self)
                    if not mine:
                        del book.by_client[self._peer]

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._busy():
                self._cancel_read_timer()  # the request is read whole: the app has it
            elif self._read_timer is None:
                self._arm_read_timer()  # the first bytes of a request: it has read_timeout_s

        # ---- state ---------------------------------------------------------------------------
        def _busy(self) -> bool:
            """A request read whole (headers and body) whose response is not finished: the
            app is working for it. A request still arriving is not busy (slow headers or a
            body that never comes hold nothing)."""
            cycle = self.cycle
            return cycle is not None and not cycle.more_body and not cycle.response_complete

        def _arm_read_timer(self) -> None:
            self._cancel_read_timer()
            self._read_timer = self.loop.call_later(limits.read_timeout_s, self._read_timed_out)

        def _cancel_read_timer(self) -> None:
            timer = getattr(self, "_read_timer", None)
            if timer is not None:
                timer.cancel()
                self._read_timer = None

        def _read_timed_out(self) -> None:
            self._read_timer = None
            if not self._busy() and not self.transport.is_closing():
                on_reject("read_timeout")
                self.transport.close()

        def _refuse(self, reason: str) -> None:
            on_reject(f"connections_{reason}")
            body = json.dumps(
                {"detail": f"too many connections ({reason.replace('_', ' ')} limit); retry shortly"}
            ).encode()
            head = (
                "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nretry-after: {limits.retry_after_s}\r\n"
                "connection: close\r\n\r\n"
            ).encode()
            self.transport.write(head + body)
            self.transport.close()

    def _evict(candidates: set[Any], reason: str) -> bool:
        """Close the oldest connection among `candidates` the app is not working for."""
        idle = [c for c in list(candidates) if not c._busy() and not c.transport.is_closing()]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c._opened)
        on_reject(f"evicted_{reason}")
        oldest._cancel_read_timer()
        oldest._count_out()  # its slot is the new one's now, before the transport reports the close
        oldest.transport.close()
        return True

    return Guarded
