"""The FastAPI app: VOICEVOX routes, OpenAI routes, /metrics, and the guards around them.

`build_app(settings, parts)` includes one router per API group (VOICEVOX's groups in
`voicevox/`, OpenAI's in `openai_api.py`) and wraps them in the middlewares of `guards.py`.
Errors become JSON in the client's own shape (never a traceback): VOICEVOX's {"detail": ...}
with 422 for bad input, OpenAI's {"error": {...}} with 400; 404 for an unknown speaker uuid,
413 for a body over the limit, 503 with Retry-After when the queue is full or the server stops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..engine.hardware.memory import peak_bytes
from ..errors import Cancelled, InputError, IrodoriError
from ..text.userdict import UserDictionary
from . import onscreen, openai_api
from .config import NotFound, VoiceBook, default_voice_book
from .guards import (
    BodyLimit,
    BodyTooLarge,
    JsonByDefault,
    RequestMetrics,
    error_response,
    install_access_guards,
    is_openai,
)
from .metrics import Metrics
from .parts import ServerParts
from .service import QueueFull, ShuttingDown, SpeechService
from .settings import ServerSettings
from .state import AppState
from .voicevox import engine_info, extras, presets, speakers, streaming, tts
from .voicevox import user_dict as user_dict_routes

log = logging.getLogger("irodori_speaker.server")

# Our own errors are {"detail": "message"} (as the VOICEVOX engine's own are) or, under /v1/,
# OpenAI's shape; a VOICEVOX request that fails FastAPI's validation gets the list form. All
# are documented for every route.
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
# the OpenAI routes' errors: {"error": {"message", "type", "param", "code"}}, as OpenAI's API
_OPENAI_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "code": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            },
            "required": ["message", "type"],
        }
    },
    "required": ["error"],
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    422: {
        "description": "Invalid input",
        "content": {"application/json": {"schema": {"anyOf": [_VALIDATION, _MESSAGE]}}},
    },
    **{
        code: {
            "description": why,
            "content": {"application/json": {"schema": {"anyOf": [_MESSAGE, _OPENAI_ERROR]}}},
        }
        for code, why in (
            (400, "Invalid input (OpenAI routes, in OpenAI's error shape)"),
            (401, "API key missing or wrong"),
            (403, "Origin or Host not allowed"),
            (404, "Unknown speaker uuid, preset or resource"),
            (413, "Body too large"),
            (499, "Cancelled"),
            (503, "Queue full or shutting down"),
        )
    },
}


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
    preset = getattr(synth, "preset", None)
    metrics.gpu_memory_budget.set(getattr(preset, "max_gpu_memory", None) or 0)
    device = str(getattr(synth, "device", "cpu"))
    if device.startswith("cuda"):
        metrics.gpu_peak(lambda: peak_bytes(device) or 0)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(user_dict.openjtalk_dictionary)
        if prewarm:
            seconds = await asyncio.to_thread(_prewarm, synth, book)
            shapes = (getattr(synth, "prewarm_report", None) or {}).get("batch_voice_shapes")
            batches = f", batch graphs for {shapes} voice / text shapes" if shapes else ""
            log.info("prewarmed in %.2f s%s", seconds, batches)
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
    app.include_router(speakers.make_router(state))
    app.include_router(presets.make_router(state))
    app.include_router(tts.make_router(state))
    app.include_router(streaming.make_router(state))
    app.include_router(extras.make_router(state))
    app.include_router(user_dict_routes.make_router(user_dict))
    app.include_router(openai_api.make_router(state))
    app.include_router(onscreen.make_router(state))  # the feed, /overlay, /studio (docs/overlay.md)

    @app.get("/metrics", tags=["その他"], summary="Prometheus metrics", response_class=Response)
    def prometheus() -> Response:
        metrics.queue_length.set(service.queue_length)
        return Response(metrics.render(), media_type=metrics.content_type)

    # middlewares: the last added runs first
    app.add_middleware(JsonByDefault)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, metrics=metrics)
    install_access_guards(app, settings)
    app.add_middleware(RequestMetrics, metrics=metrics)
    return app


def _install_errors(app: FastAPI, metrics: Metrics) -> None:
    rejected = metrics.rejected

    @app.exception_handler(RequestValidationError)
    async def validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        metrics.errors.labels(request.url.path, "validation").inc()
        errors = exc.errors()
        for e in errors:  # the offending input can be huge or not JSON: keep the message short
            e.pop("input", None)
            e.pop("ctx", None)
            e.pop("url", None)
        if is_openai(request.url.path):  # OpenAI answers bad input with 400 and names the field
            message = "; ".join(f"{'.'.join(map(str, e['loc'][1:] or e['loc']))}: {e['msg']}" for e in errors)
            loc = errors[0]["loc"] if errors else ()
            param = next((str(x) for x in reversed(loc) if isinstance(x, str) and x != "body"), None)
            return error_response(400, message, path=request.url.path, param=param)
        return JSONResponse(status_code=422, content={"detail": errors})

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        path = request.url.path
        if isinstance(exc.__cause__, BodyTooLarge):  # a streamed body over the limit, cut off while read
            rejected.labels("body_too_large").inc()
            return error_response(413, str(exc.__cause__), path=path)
        if exc.status_code == 400:  # a body that is not JSON: a validation error like any other
            status = 400 if is_openai(path) else 422
            return error_response(status, f"invalid request body: {exc.detail}", path=path)
        return error_response(exc.status_code, str(exc.detail), getattr(exc, "headers", None), path=path)

    @app.exception_handler(BodyTooLarge)
    async def too_large(request: Request, exc: BodyTooLarge) -> JSONResponse:
        rejected.labels("body_too_large").inc()
        return error_response(413, str(exc), path=request.url.path)

    @app.exception_handler(QueueFull)
    async def queue_full(request: Request, exc: QueueFull) -> JSONResponse:
        rejected.labels("queue_full").inc()
        return error_response(503, str(exc), {"Retry-After": str(exc.retry_after)}, path=request.url.path)

    @app.exception_handler(ShuttingDown)
    async def shutting_down(request: Request, exc: ShuttingDown) -> JSONResponse:
        rejected.labels("shutting_down").inc()
        return error_response(503, str(exc), {"Retry-After": "5"}, path=request.url.path)

    @app.exception_handler(Cancelled)
    async def cancelled(request: Request, exc: Cancelled) -> JSONResponse:
        return error_response(499, f"cancelled: {exc}", path=request.url.path)

    @app.exception_handler(NotFound)
    async def not_found(request: Request, exc: NotFound) -> JSONResponse:
        metrics.errors.labels(request.url.path, "not_found").inc()
        return error_response(404, str(exc), path=request.url.path)

    @app.exception_handler(InputError)
    async def bad_input(request: Request, exc: InputError) -> JSONResponse:
        metrics.errors.labels(request.url.path, "input").inc()
        path = request.url.path
        status = 400 if is_openai(path) else 422
        return error_response(status, str(exc), path=path, param=getattr(exc, "param", None))

    @app.exception_handler(IrodoriError)
    async def failed(request: Request, exc: IrodoriError) -> JSONResponse:
        metrics.errors.labels(request.url.path, type(exc).__name__).inc()
        log.error("%s: %s", request.url.path, exc)
        return error_response(500, f"{type(exc).__name__}: {exc}", path=request.url.path)

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        metrics.errors.labels(request.url.path, "internal").inc()
        log.exception("unexpected error on %s", request.url.path)
        return error_response(500, "internal error (logged on the server)", path=request.url.path)


def _prewarm(synth: Any, book: VoiceBook) -> float:
    """Prewarm in the default style's voice, with the graphs of every style's voice (a line of
    any of them then replays a graph instead of capturing one mid-stream, and lines of the book's
    voices batch together: docs/server.md). A style whose voice cannot be made is left out with a
    warning; its requests get its error."""
    voices = []
    for style in book.styles.values():
        try:
            voices.append((style.id, style.voice()))
        except IrodoriError as e:
            log.warning("prewarm leaves out style %d (%s): %s", style.id, style.name, e)
    default = next((v for i, v in voices if i == book.default_style), None)
    others = [v for i, v in voices if i != book.default_style]
    batched = int(getattr(getattr(synth, "preset", None), "max_batch", 1) or 1) > 1
    log.info(
        "prewarming (first-call costs, the graphs of %d style voices%s; --no-prewarm skips it)",
        len(voices),
        " with their batch graphs" if batched else "",
    )
    try:
        return float(synth.prewarm(default, batch_voices=others))
    except IrodoriError as e:  # the default style's voice cannot be read: its requests will say so
        log.warning("prewarm in the default style's voice failed (%s); prewarming without it", e)
        return float(synth.prewarm(None, batch_voices=others))
