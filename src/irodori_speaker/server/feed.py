"""The event feed over HTTP: a WebSocket (`/feed`), its Server-Sent Events fallback (`/feed/sse`)
and the clock (`/feed/clock`), serving an `EventFeed` (speaker/feed.py; docs/overlay.md).

The HTTP guards of the app (origin, Host on loopback, API key) do not see WebSocket handshakes,
so `/feed` checks the same three itself. A browser cannot set an Authorization header on a
WebSocket or an EventSource: both take the key as `?key=` too.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse

from ..speaker.feed import SCHEMA_VERSION, EventFeed, dumps
from .settings import ServerSettings, is_loopback, loopback_host, origin_allowed

__all__ = ["FeedGuard", "make_router"]

KEEPALIVE_S = 15.0  # an SSE comment this often: proxies and OBS keep an idle stream open
FELL_BEHIND = 4008  # the close code of a reader that fell behind (it reconnects from a fresh hello)


class FeedGuard:
    """The app's three checks for a WebSocket handshake: a local (or allowed) origin, a loopback
    Host name when listening on loopback, and the API key (header or `?key=`)."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings

    def refusal(self, headers: Any, query: Any) -> str | None:
        """Why a handshake with these headers and query is refused, or None."""
        s = self.settings
        origin = headers.get("origin")
        if origin and not origin_allowed(origin, s):
            return f"origin {origin} is not allowed"
        host = headers.get("host", "")
        if is_loopback(s.host) and host and not loopback_host(host):
            return f"host {host} is not this server"
        if s.api_key:
            auth = headers.get("authorization", "")
            given = auth[7:] if auth.lower().startswith("bearer ") else query.get("key", "")
            if not hmac.compare_digest(given.encode(), s.api_key.encode()):
                return "missing or wrong API key (Authorization: Bearer KEY, or ?key=KEY)"
        return None


_SSE_EVENT = {
    "type": "object",
    "properties": {"data": {"type": "string", "description": "one feed message, JSON (docs/overlay.md)"}},
    "required": ["data"],
}


def make_router(get_feed: Callable[[], EventFeed], settings: ServerSettings) -> APIRouter:
    """`/feed` (WebSocket), `/feed/sse` and `/feed/clock` of the feed `get_feed()` returns."""
    router = APIRouter(tags=["Feed"])
    guard = FeedGuard(settings)

    @router.get("/feed/clock", summary="The playback clock now")
    def clock() -> dict[str, Any]:
        """`clock`: the playback clock (seconds) at this answer; a client times the request
        to map the feed's times onto its own clock."""
        return {"v": SCHEMA_VERSION, "clock": get_feed().clock()}

    @router.get(
        "/feed/sse",
        summary="The event feed as Server-Sent Events",
        response_class=StreamingResponse,
        # each event as schemathesis and OpenAPI 3.2's `itemSchema` read a stream: its fields
        responses={200: {"content": {"text/event-stream": {"schema": _SSE_EVENT}}}},
    )
    async def sse(request: Request) -> StreamingResponse:
        """Each message of the feed as one `data:` line (docs/overlay.md); a browser's
        EventSource reconnects by itself and starts from a fresh hello."""
        reader = get_feed().subscribe()

        async def stream() -> AsyncIterator[bytes]:
            it = reader.__aiter__()
            try:
                while True:
                    try:
                        message = await asyncio.wait_for(it.__anext__(), KEEPALIVE_S)
                    except asyncio.TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    except StopAsyncIteration:
                        return
                    yield f"data: {message}\n\n".encode()
            finally:
                reader.close()

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    @router.websocket("/feed")
    async def websocket(ws: WebSocket) -> None:
        why = guard.refusal(ws.headers, ws.query_params)
        if why is not None:
            await ws.close(code=1008, reason=why[:120])
            return
        await ws.accept()
        feed = get_feed()
        reader = feed.subscribe()

        async def answer_pings() -> None:
            try:
                while True:
                    text = await ws.receive_text()
                    with contextlib.suppress(ValueError):
                        msg = json.loads(text)
                        if isinstance(msg, dict) and msg.get("type") == "ping":
                            reader.put(dumps(feed.pong(msg)))
            finally:
                reader.close()  # the client went away: the sending loop ends too

        pings = asyncio.create_task(answer_pings())  # ends with this connection, awaited below
        try:
            async for message in reader:
                await ws.send_text(message)
            if reader.lagging:
                await ws.close(code=FELL_BEHIND, reason="fell behind: reconnect")
            elif not pings.done():
                await ws.close(code=1001, reason="feed closed")
        except (WebSocketDisconnect, RuntimeError):
            pass  # the client went away mid-send
        finally:
            reader.close()
            pings.cancel()
            with contextlib.suppress(BaseException):
                await pings

    return router
