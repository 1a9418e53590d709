"""The middlewares around every route, and the one error shape per API.

Outermost first (app.py adds them): request metrics; CORS as the VOICEVOX engine does it
(local apps and localhost origins, plus an allow-list; other origins get 403); the Host header
must name this server when it listens on loopback (DNS rebinding); the API key (Authorization:
Bearer) when one is set; a body size limit (413, declared or streamed); a JSON body sent
without a Content-Type is read as JSON, as the VOICEVOX engine reads it (voicevox-py posts
/synthesis that way).

Errors: the VOICEVOX routes answer {"detail": message} (as the engine does); the OpenAI routes
answer OpenAI's {"error": {"message", "type", "param", "code"}}. Every 503 carries Retry-After.
"""

from __future__ import annotations

import hmac
import time
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import IrodoriError
from .metrics import Metrics
from .settings import EXTENSION_ORIGINS, LOCAL_ORIGIN, is_loopback

OPEN_PATHS = ("/version",)  # answered without the API key (a liveness probe)
OPENAI_PREFIX = "/v1/"
_OPENAI_TYPES = {401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error"}


class BodyTooLarge(IrodoriError):
    """A request body over the server's limit (413)."""


def is_openai(path: str) -> bool:
    return path.startswith(OPENAI_PREFIX)


def error_response(
    status: int,
    message: str,
    headers: dict[str, str] | None = None,
    *,
    path: str = "",
    param: str | None = None,
) -> JSONResponse:
    """The error of `path`'s API: OpenAI's shape under /v1/, else VOICEVOX's {"detail": ...}.
    A 503 always says when to retry."""
    headers = dict(headers or {})
    if status == 503:
        headers.setdefault("Retry-After", "1")
    content: dict[str, Any]
    if is_openai(path):
        kind = _OPENAI_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        content = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    else:
        content = {"detail": message}
    return JSONResponse(status_code=status, content=content, headers=headers)


class _Middleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app


class OriginGuard(_Middleware):
    """403 for browser requests from origins CORS does not allow (a web page cannot make
    this server speak, nor read the user dictionary)."""

    def __init__(self, app: ASGIApp, allow_all: bool, origins: tuple[str, ...]) -> None:
        super().__init__(app)
        self.allow_all, self.origins = allow_all, ("app://.", *origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.allow_all:
            origin = dict(scope["headers"]).get(b"origin")
            if origin is not None:
                o = origin.decode("latin-1")
                ok = o in self.origins or LOCAL_ORIGIN.fullmatch(o) or o.startswith(EXTENSION_ORIGINS)
                if not ok:
                    message = f"origin {o} is not allowed (--allow-origin adds it)"
                    await error_response(403, message, path=scope["path"])(scope, receive, send)
                    return
        await self.app(scope, receive, send)


class LoopbackHost(_Middleware):
    """On loopback, the Host header must be a loopback name (stops DNS-rebinding pages)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if host and not (name in ("localhost", "testserver") or is_loopback(name.strip("[]"))):
                message = f"host {host} is not this server"
                await error_response(403, message, path=scope["path"])(scope, receive, send)
                return
        await self.app(scope, receive, send)


class ApiKey(_Middleware):
    def __init__(self, app: ASGIApp, key: str | None) -> None:
        super().__init__(app)
        self.key = key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        open_path = scope.get("path") in OPEN_PATHS
        if scope["type"] == "http" and self.key and scope["method"] != "OPTIONS" and not open_path:
            auth = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            # ?key=: what a browser source (OBS) or an EventSource can send (docs/overlay.md)
            query = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("key", [""])
            given = auth[7:] if auth.lower().startswith("bearer ") else query[0]
            if not hmac.compare_digest(given.encode(), self.key.encode()):
                await error_response(
                    401,
                    "missing or wrong API key (Authorization: Bearer KEY, or ?key=KEY)",
                    {"WWW-Authenticate": "Bearer"},
                    path=scope["path"],
                )(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimit(_Middleware):
    """413 for bodies over `max_bytes`: declared (Content-Length) or streamed (chunked; the
    reader raises BodyTooLarge, which app.py's handlers answer with 413)."""

    def __init__(self, app: ASGIApp, max_bytes: int, metrics: Metrics) -> None:
        super().__init__(app)
        self.max_bytes, self.metrics = max_bytes, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            self.metrics.rejected.labels("body_too_large").inc()
            message = f"body over {self.max_bytes} bytes"
            await error_response(413, message, path=scope["path"])(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(f"body over {self.max_bytes} bytes")
            return message

        await self.app(scope, limited, send)


class JsonByDefault(_Middleware):
    """A body without a Content-Type is read as JSON (the VOICEVOX engine's FastAPI does; a
    newer FastAPI refuses it with 422, and voicevox-py then saves that error as its WAV)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "PATCH"):
            headers = scope["headers"]
            if not any(name == b"content-type" for name, _ in headers):
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


class RequestMetrics(_Middleware):
    """Counts every answer by route and status; time to first byte and total per route."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        super().__init__(app)
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        route = scope["path"]  # replaced by the route's template once routed (bounded label values)
        status = 500
        first = True

        async def timed(message: Message) -> None:
            nonlocal status, first
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and first and route != "/v1/audio/speech":
                first = False
                name = getattr(scope.get("route"), "path", None) or "unmatched"
                self.metrics.ttfb.labels(name).observe(time.perf_counter() - t0)
            await send(message)

        try:
            await self.app(scope, receive, timed)
        finally:
            matched = scope.get("route")
            route = getattr(matched, "path", None) or "unmatched"
            self.metrics.requests.labels(route, str(status)).inc()
            if route != "/v1/audio/speech":
                self.metrics.total.labels(route).observe(time.perf_counter() - t0)


def install_access_guards(app: FastAPI, settings: Any) -> None:
    """The guards of who may call the app, outermost last: the API key, the Host on loopback, the
    origin of a browser request, CORS. `serve`'s app and a bot's `EventsServer` share them."""
    app.add_middleware(ApiKey, key=settings.api_key)
    if is_loopback(settings.host):
        app.add_middleware(LoopbackHost)
    app.add_middleware(OriginGuard, allow_all=settings.cors_policy == "all", origins=settings.allow_origins)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=["*"] if settings.cors_policy == "all" else ["app://.", *settings.allow_origins],
        allow_origin_regex=None if settings.cors_policy == "all" else LOCAL_ORIGIN.pattern,
        allow_credentials=settings.cors_policy != "all",
        allow_methods=["*"],
        allow_headers=["*"],
    )
