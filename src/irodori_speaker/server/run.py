"""Running the app on uvicorn: `irodori-speaker serve` and the tests' loopback servers."""

from __future__ import annotations

from typing import Any

import uvicorn

from .app import build_app
from .connections import ConnectionLimits, fd_headroom, guarded_protocol
from .parts import ServerParts
from .settings import ServerSettings


def uvicorn_config(app: Any, settings: ServerSettings, **kwargs: Any) -> uvicorn.Config:
    """uvicorn's config for `app`: no `limit_concurrency` (it counts idle sockets and refuses
    everyone once they are many: the app's queue bounds the work, `connections.py` the sockets)."""
    state = getattr(getattr(app, "state", None), "irodori", None)
    metrics = getattr(state, "metrics", None)

    def on_reject(reason: str) -> None:
        if metrics is not None:
            metrics.rejected.labels(reason).inc()

    limits = ConnectionLimits(
        read_timeout_s=settings.read_timeout_s,
        keep_alive_s=settings.keep_alive_s,
        per_client=settings.max_client_connections,
        total=fd_headroom(settings.max_connections),
    )
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=kwargs.pop("log_level", "info"),
        http=guarded_protocol(limits, on_reject),
        timeout_keep_alive=settings.keep_alive_s,
        # in-flight requests get the grace period, then uvicorn cancels them; the app's
        # lifespan then cancels whatever lines are left (service.stop)
        timeout_graceful_shutdown=max(1, round(settings.shutdown_grace_s)),
        server_header=False,
        **kwargs,
    )


def serve(settings: ServerSettings, parts: ServerParts) -> None:
    """Serve `build_app(settings, parts)` until SIGINT/SIGTERM (blocking)."""
    server = uvicorn.Server(uvicorn_config(build_app(settings, parts), settings))
    server.run()
