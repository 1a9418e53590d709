"""`EventsServer`: a bot's running Speaker on a port, for OBS and other tools.

    from irodori_speaker.server.events_server import EventsServer

    async with Speaker(output="null") as s, EventsServer(s) as events:
        print(events.url + "/overlay")        # an OBS browser source
        await s.say("こんにちは！")

or `Speaker(..., events_server=EventsServer())`, which starts it with the Speaker and stops it
before the Speaker closes. It serves the feed (`/feed`, `/feed/sse`, `/feed/clock`), `/overlay`,
`/studio` and the studio's API over the Speaker's own model, dictionary and phrase cache, on
uvicorn inside the bot's own event loop (no thread, no process). Loopback by default; any other
address needs an API key, as `serve` does. Needs the `serve` extra; importing
`irodori_speaker` does not load this module.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ..errors import InputError, IrodoriError
from ..options import SynthesisOptions
from ..speaker.feed import EventFeed, voice_label
from ..speaker.tasks import TaskScope
from ..text.userdict import UserDictionary
from . import onscreen, studio
from .guards import install_access_guards
from .settings import DEFAULT_HOST, ServerSettings, check_port
from .voicevox import user_dict as user_dict_routes

__all__ = ["DEFAULT_EVENTS_PORT", "EventsServer"]

DEFAULT_EVENTS_PORT = 50022  # next to serve's 50021: an OBS source URL that stays the same


class _InLoop(uvicorn.Server):
    """uvicorn inside someone else's event loop: the bot keeps its own Ctrl-C."""

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        return None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class EventsServer:
    """Serves a running Speaker's events, `/overlay` and `/studio` on `host`:`port`.

    `api_key`: required beyond loopback; clients send `Authorization: Bearer KEY` or `?key=KEY`.
    `overlay_dir`: the user's overlay CSS and fonts (`/overlay/user/NAME`). `mouth_hz`: the
    rate of the feed's mouth messages. `port=0` takes a free port (`url` says which)."""

    def __init__(
        self,
        speaker: Any = None,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_EVENTS_PORT,
        api_key: str | None = None,
        overlay_dir: str | None = None,
        cors_policy: str = "localapps",
        allow_origins: tuple[str, ...] = (),
        mouth_hz: float = 30.0,
        log_level: str = "warning",
    ) -> None:
        self.settings = ServerSettings(
            host=host, port=port, api_key=api_key, cors_policy=cors_policy, allow_origins=tuple(allow_origins)
        )
        self.settings.check()  # beyond loopback without a key: an InputError now
        if port:
            check_port(host, port)
        self.speaker = speaker
        self.overlay_dir = overlay_dir
        self.mouth_hz = mouth_hz
        self.log_level = log_level
        self.feed: EventFeed | None = None
        self._server: _InLoop | None = None
        self._scope: TaskScope | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """http://host:port of the running server."""
        if self._server is None or not self._server.servers:
            raise InputError("the events server is not running", hint="await events.start(speaker)")
        port = self._server.servers[0].sockets[0].getsockname()[1]
        host = self.settings.host
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    async def __aenter__(self) -> EventsServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, speaker: Any = None) -> str:
        """Serve `speaker` (or the one given when made); returns the URL. The Speaker must be open."""
        if self._task is not None:
            raise InputError("the events server is running already")
        speaker = speaker if speaker is not None else self.speaker
        if speaker is None or getattr(speaker, "synthesizer", None) is None:
            raise InputError("the events server needs an open Speaker", hint="async with Speaker(...) as s:")
        self.speaker = speaker
        self.feed = EventFeed(speaker, mouth_hz=self.mouth_hz)
        config = uvicorn.Config(
            self._app(speaker, self.feed),
            host=self.settings.host,
            port=self.settings.port,
            log_level=self.log_level,
            lifespan="off",
            server_header=False,
            timeout_graceful_shutdown=2,
        )
        self._server = _InLoop(config)
        self._scope = TaskScope("irodori-speaker:events-server")
        self._task = self._scope.spawn(self._server.serve(), "uvicorn")
        while not self._server.started:
            if self._task.done():  # it could not start (the port taken meanwhile): say why
                self._task.result()
                raise InputError(f"the events server did not start on port {self.settings.port}")
            await asyncio.sleep(0.01)
        return self.url

    async def stop(self) -> None:
        """End every reader, then stop the server (an overlay page reconnects when it is back)."""
        if self.feed is not None:
            self.feed.close()
        if self._server is not None:
            self._server.should_exit = True
        if self._scope is not None:
            await self._scope.drain(5.0)
        self._server = self._task = self._scope = None

    # -- the app -----------------------------------------------------------------------------------

    def _app(self, speaker: Any, feed: EventFeed) -> FastAPI:
        synth = speaker.synthesizer
        user_dict = getattr(synth, "user_dict", None)
        base = speaker.options or SynthesisOptions()

        def options(**fields: Any) -> SynthesisOptions:
            return base.replace(**fields)

        async def render(text: str, voice: Any, opts: SynthesisOptions) -> np.ndarray:
            result = await asyncio.to_thread(synth.synthesize, text, voice, opts)
            return np.asarray(result.audio, dtype=np.float32)

        parts = studio.Studio(
            synth=synth,
            voices=[("speaker", voice_label(speaker.voice) or "the Speaker's voice", lambda: speaker.voice)],
            render=render,
            options=options,
            user_dict=user_dict,
            cache=speaker.cache,
            feed=feed,
            speaker=lambda: speaker,
        )
        app = FastAPI(title="irodori-speaker events", docs_url=None, redoc_url=None)
        for router in onscreen.routers(lambda: feed, self.settings, parts, self.overlay_dir):
            app.include_router(router)
        if isinstance(user_dict, UserDictionary):
            app.include_router(user_dict_routes.make_router(user_dict))

        @app.exception_handler(IrodoriError)
        async def refused(request: Request, exc: IrodoriError) -> JSONResponse:
            status = 422 if isinstance(exc, InputError) else 500
            return JSONResponse(status_code=status, content={"detail": str(exc)})

        install_access_guards(app, self.settings)  # the same guards as serve's
        return app
