"""The FastAPI app: VOICEVOX routes, OpenAI routes, /metrics, and the guards around them.

Guards, outermost first: errors become JSON (never a traceback); CORS as the VOICEVOX
engine does it (local apps and localhost origins, plus an allow-list; other origins get
403); the Host header must name this server when it listens on loopback (DNS rebinding);
the API key (Authorization: Bearer) when one is set; a body size limit (413).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import __version__
from ..errors import Cancelled, InputError, IrodoriError
from ..text.userdict import UserDictionary
from . import onscreen, openai_api
from .config import VoiceBook, default_voice_book
from .metrics import Metrics
from .parts import ServerParts
from .service import QueueFull, ShuttingDown, SpeechService
from .settings import EXTENSION_ORIGINS, LOCAL_ORIGIN, ServerSettings, is_loopback
from .state import AppState
from .voicevox import engine_info, presets, speakers, tts
from .voicevox import user_dict as user_dict_routes

log = logging.getLogger("irodori_speaker.server")

# Our own errors are {"detail": "message"} (as the VOICEVOX engine's own are); a request
# that fails FastAPI's validation gets the list form. Both are documented for every route.
_MESSAGE = {"type": "object", "properties": {"detail": {"type": "string"}}, "required": ["detail"]}
# FastAPI's own HTTPValidationError component is left out of the document once 422 is ours:
# its shape (a list of {loc, msg, type}) is spelled out here.
_VALIDATION = {
    "type": "object",
    "properties": {
        "detail": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "loc": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}},
                    "msg": {"type": "string"},
                    "type": {"type": "string"},
                },
                "required": ["loc", "msg", "type"],
            },
        }
    },
    "required": ["detail"],
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    422: {
        "description": "Invalid input",
        "content": {"application/json": {"schema": {"anyOf": [_VALIDATION, _MESSAGE]}}},
    },
    **{
        code: {"description": why, "content": {"application/json": {"schema": _MESSAGE}}}
        for code, why in (
            (401, "API key missing or wrong"),
            (403, "Origin or Host not allowed"),
            (413, "Body too large"),
            (499, "Cancelled"),
            (503, "Queue full or shutting down"),
        )
    },
}
OPEN_PATHS = ("/version",)  # answered without the API key (a liveness probe)


def build_app(settings: ServerSettings, parts: ServerParts) -> FastAPI:
    """The server app of `settings` on loaded `parts` (`serve` and each Ray Serve replica)."""
    return create_app(parts.synth, settings, book=parts.book, cache=parts.cache, prewarm=settings.prewarm)


def create_app(
    synth: Any,
    settings: ServerSettings | None = None,
    *,
    book: VoiceBook | None = None,
    user_dict: UserDictionary | None = None,
    cache: Any = None,
    prewarm: bool = True,
) -> FastAPI:
    """The server app around a loaded Synthesizer (the model is loaded once, by the caller).

    The voice config's [readings] lie under the settings' own (the serve flags): a setting wins."""
    settings = settings or ServerSettings()
    for warning in settings.check():
        log.warning(warning)
    book = book or default_voice_book()
    readings = {**dict(book.readings), **dict(settings.readings)}
    settings = dataclasses.replace(settings, readings=tuple(readings.items()))
    metrics = Metrics()
    streams = int(settings.streams or getattr(getattr(synth, "preset", None), "max_batch", 1) or 1)
    service = SpeechService(
        synth, cache=cache, max_queue=settings.max_queue, metrics=metrics, streams=streams
    )
    if user_dict is None:
        user_dict = synth.user_dict if getattr(synth, "user_dict", None) is not None else UserDictionary()
    state = AppState(settings, book, service, user_dict, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(user_dict.openjtalk_dictionary)
        if prewarm:
            seconds = await asyncio.to_thread(synth.prewarm)
            log.info("prewarmed in %.2f s", seconds)
        service.start()
        try:
            yield
        finally:
            await service.stop(settings.shutdown_grace_s)

    app = FastAPI(
        responses=ERROR_RESPONSES,
        title="irodori-speaker",
        version=__version__,
        description="VOICEVOX-compatible and OpenAI-compatible speech server (docs/server.md)",
        lifespan=lifespan,
    )
    app.state.irodori = state
    _install_errors(app, metrics)
    # the VOICEVOX engine's API groups, then OpenAI's
    app.include_router(engine_info.make_router())
    app.include_router(speakers.make_router(book, service))
    app.include_router(presets.make_router())
    app.include_router(tts.make_router(state))
    app.include_router(user_dict_routes.make_router(user_dict))
    app.include_router(openai_api.make_router(state))
    app.include_router(onscreen.make_router(state))  # the feed, /overlay, /studio (docs/overlay.md)

    @app.get("/metrics", tags=["その他"], summary="Prometheus metrics", response_class=Response)
    def prometheus() -> Response:
        metrics.queue_length.set(service.queue_length)
        return Response(metrics.render(), media_type=metrics.content_type)

    # middlewares: the last added runs first
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
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
    app.add_middleware(RequestMetrics, metrics=metrics)
    return app


def _error(
    status: int, message: str, headers: dict[str, str] | None = None, request: Request | None = None
) -> JSONResponse:
    """{"detail": message}; on the OpenAI routes also OpenAI's {"error": {...}} (its SDK shows it)."""
    content: dict[str, Any] = {"detail": message}
    if request is not None and request.url.path.startswith("/v1/"):
        kind = "invalid_request_error" if status < 500 else "server_error"
        content["error"] = {"message": message, "type": kind, "param": None, "code": None}
    return JSONResponse(status_code=status, content=content, headers=headers)


def _install_errors(app: FastAPI, metrics: Metrics) -> None:
    @app.exception_handler(RequestValidationError)
    async def validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        metrics.errors.labels(request.url.path, "validation").inc()
        errors = exc.errors()
        for e in errors:  # the offending input can be huge or not JSON: keep the message short
            e.pop("input", None)
            e.pop("ctx", None)
            e.pop("url", None)
        content: dict[str, Any] = {"detail": errors}
        if request.url.path.startswith("/v1/"):
            message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors)
            content["error"] = {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        return JSONResponse(status_code=422, content=content)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # a body that is not JSON: a validation error like any other
            return _error(422, f"invalid request body: {exc.detail}", None, request)
        return _error(exc.status_code, str(exc.detail), getattr(exc, "headers", None), request)

    @app.exception_handler(QueueFull)
    async def queue_full(request: Request, exc: QueueFull) -> JSONResponse:
        metrics.errors.labels(request.url.path, "queue_full").inc()
        return _error(503, str(exc), {"Retry-After": str(exc.retry_after)}, request)

    @app.exception_handler(ShuttingDown)
    async def shutting_down(request: Request, exc: ShuttingDown) -> JSONResponse:
        return _error(503, str(exc), {"Retry-After": "5"}, request)

    @app.exception_handler(Cancelled)
    async def cancelled(request: Request, exc: Cancelled) -> JSONResponse:
        return _error(499, f"cancelled: {exc}", None, request)

    @app.exception_handler(InputError)
    async def bad_input(request: Request, exc: InputError) -> JSONResponse:
        metrics.errors.labels(request.url.path, "input").inc()
        return _error(422, str(exc), None, request)

    @app.exception_handler(IrodoriError)
    async def failed(request: Request, exc: IrodoriError) -> JSONResponse:
        metrics.errors.labels(request.url.path, type(exc).__name__).inc()
        log.error("%s: %s", request.url.path, exc)
        return _error(500, f"{type(exc).__name__}: {exc}", None, request)

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        metrics.errors.labels(request.url.path, "internal").inc()
        log.exception("unexpected error on %s", request.url.path)
        return _error(500, "internal error (logged on the server)", None, request)


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
                    await _error(403, f"origin {o} is not allowed (--allow-origin adds it)")(
                        scope, receive, send
                    )
                    return
        await self.app(scope, receive, send)


class LoopbackHost(_Middleware):
    """On loopback, the Host header must be a loopback name (stops DNS-rebinding pages)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if host and not (name in ("localhost", "testserver") or is_loopback(name.strip("[]"))):
                await _error(403, f"host {host} is not this server")(scope, receive, send)
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
                await _error(
                    401,
                    "missing or wrong API key (Authorization: Bearer KEY, or ?key=KEY)",
                    {"WWW-Authenticate": "Bearer"},
                )(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimit(_Middleware):
    """413 for bodies over `max_bytes` (declared or streamed)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await _error(413, f"body over {self.max_bytes} bytes")(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise InputError(f"body over {self.max_bytes} bytes")
            return message

        await self.app(scope, limited, send)


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
