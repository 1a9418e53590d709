"""Running the app on uvicorn: `irodori-speaker serve` and the tests' loopback servers."""

from __future__ import annotations

from typing import Any

import uvicorn

from .app import build_app
from .parts import ServerParts
from .settings import ServerSettings


def uvicorn_config(app: Any, settings: ServerSettings, **kwargs: Any) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=kwargs.pop("log_level", "info"),
        # in-flight requests get the grace period, then uvicorn cancels them; the app's
        # lifespan then cancels whatever lines are left (service.stop)
        timeout_graceful_shutdown=max(1, round(settings.shutdown_grace_s)),
        limit_concurrency=kwargs.pop("limit_concurrency", settings.max_queue * 4 + 16),
        server_header=False,
        **kwargs,
    )


def serve(settings: ServerSettings, parts: ServerParts) -> None:
    """Serve `build_app(settings, parts)` until SIGINT/SIGTERM (blocking)."""
    server = uvicorn.Server(uvicorn_config(build_app(settings, parts), settings))
    server.run()
