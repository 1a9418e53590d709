"""Running the app on uvicorn: `irodori-speaker serve` and the tests' loopback servers."""

from __future__ import annotations

import logging
from typing import Any

from .app import create_app
from .config import ServerSettings, VoiceBook

log = logging.getLogger("irodori_speaker.server")


def uvicorn_config(app: Any, settings: ServerSettings, **kwargs: Any) -> Any:
    import uvicorn

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


def serve(
    synth: Any,
    settings: ServerSettings,
    *,
    book: VoiceBook | None = None,
    cache: Any = None,
    prewarm: bool = True,
) -> None:
    """Serve until SIGINT/SIGTERM (blocking)."""
    import uvicorn

    app = create_app(synth, settings, book=book, cache=cache, prewarm=prewarm)
    server = uvicorn.Server(uvicorn_config(app, settings))
    server.run()
