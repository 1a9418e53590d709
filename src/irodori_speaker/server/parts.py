"""What a server process runs on, loaded once from its settings: the model, the voices, the cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..cache import PhraseCache, default_cache_dir
from ..synthesis import loading
from ..synthesis.identity import as_load_options, plan_preset
from .config import VoiceBook, load_voice_book
from .settings import ServerSettings


@dataclass
class ServerParts:
    """The loaded parts `build_app` serves: a Synthesizer, the voice book, the phrase cache (or None)."""

    synth: Any
    book: VoiceBook
    cache: PhraseCache | None = None

    @classmethod
    def load(cls, settings: ServerSettings, *, book: VoiceBook | None = None) -> ServerParts:
        """Load what `settings` name: the voice config first (a mistake in it costs no model load),
        then the model with `settings.streams` lines sampled at once, then open the cache.
        `book`: the voice config already read (`serve` reads it before anything else)."""
        book = book or load_voice_book(settings.voices)
        synth = loading.load_synthesizer(
            **settings.load, user_dict=settings.user_dict, max_batch=server_streams(settings)
        )
        cache = PhraseCache(settings.cache_dir or default_cache_dir()) if settings.cache else None
        return cls(synth, book, cache)


def server_streams(settings: ServerSettings) -> int:
    """Lines in synthesis at once: `--streams`, else the backend preset's `serve_streams` (16 on
    CUDA, 1 elsewhere), resolved as the loader will (a bad backend fails here, before loading)."""
    if settings.streams is not None:
        return int(settings.streams)
    preset, _ = plan_preset(as_load_options(None, dict(settings.load)))
    return int(preset.serve_streams)
