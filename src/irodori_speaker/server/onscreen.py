"""What `serve` shows on screen: the event feed, `/overlay`, `/studio` and the studio's API.

With `serve --play OUTPUT` the server runs a Speaker of its own on the loaded model (lines
from the studio's "say on stream", `POST /studio/api/speaker/say`), opened after the app's
warm-up and closed before its shutdown; the feed follows it. Without it the feed is quiet and
the studio's Speaker panel says so. A bot serves its own Speaker with `EventsServer`
(server/events_server.py), from the same routers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
from fastapi import APIRouter, FastAPI

from ..options import SynthesisOptions
from ..speaker import Speaker
from ..speaker.feed import EventFeed
from . import feed as feed_routes
from . import pages, studio
from .settings import ServerSettings
from .state import AppState

__all__ = ["make_router", "routers"]


def routers(
    get_feed: Any, settings: ServerSettings, parts: studio.Studio, overlay_dir: str | None
) -> list[APIRouter]:
    """The feed, the pages and the studio's API, as both `serve` and `EventsServer` serve them."""
    return [
        feed_routes.make_router(get_feed, settings),
        pages.make_router(overlay_dir),
        studio.make_router(parts),
    ]


def make_router(state: AppState) -> APIRouter:
    """`serve`'s on-screen routes over the app's own parts (and its Speaker with `--play`)."""
    settings = state.settings
    feed = EventFeed()
    own: dict[str, Speaker | None] = {}

    def voices() -> list[tuple[str, str, Any]]:
        return [
            (str(style.id), f"{style.speaker_name} ({style.name})", style.voice)
            for style in state.book.styles.values()
        ]

    async def render(text: str, voice: Any, options: SynthesisOptions) -> np.ndarray:
        return await state.service.render(text, voice, options, client="studio", route="studio")

    parts = studio.Studio(
        synth=state.synth,
        voices=voices(),
        render=render,
        options=state.options,
        user_dict=state.user_dict,
        cache=state.service.cache,
        feed=feed,
        speaker=lambda: own.get("speaker"),
        max_text_chars=settings.max_text_chars,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        play = settings.play
        if play:
            voice = state.book.style(state.book.default_style).voice()
            speaker = Speaker(state.synth, output=play, voice=voice, prewarm=False, drain_on_exit=False)
            await speaker.open()
            own["speaker"] = speaker
            feed.attach(speaker)
        try:
            yield
        finally:
            feed.close()
            running = own.pop("speaker", None)
            if running is not None:
                await running.aclose()

    router = APIRouter(lifespan=lifespan)
    for r in routers(lambda: feed, settings, parts, settings.overlay_dir):
        router.include_router(r)
    return router
