"""What every route shares: settings, voices, the speech service, the user dictionary."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from ..options import SynthesisOptions, option_specs
from ..text.userdict import UserDictionary
from .config import VoiceBook
from .metrics import Metrics
from .service import SpeechService
from .settings import ServerSettings

SPEED = option_specs(SynthesisOptions)["speed"].check
log = logging.getLogger("irodori_speaker.server")


@dataclass
class AppState:
    settings: ServerSettings
    book: VoiceBook
    service: SpeechService
    user_dict: UserDictionary
    metrics: Metrics
    presets: Any = None  # voicevox/presets.py's PresetStore (set by its router)
    _unknown_ids: set[int] = field(default_factory=set)  # style ids already logged as unknown

    @property
    def synth(self) -> Any:
        return self.service.synth

    def style(self, style_id: int) -> Any:
        """The Style of a VOICEVOX style id. An unknown id is the default style (every VOICEVOX
        client has its own default id: 46, 2, 1, 888753760...), logged once per id; with
        `strict_speakers` an InputError (422)."""
        if style_id in self.book.styles or self.settings.strict_speakers:
            return self.book.style(style_id)
        if style_id not in self._unknown_ids:
            self._unknown_ids.add(style_id)
            log.warning(
                "style id %d is not configured: speaking it with the default style %d "
                "(map it in the voice config, docs/server.md; --strict-speakers refuses it)",
                style_id,
                self.book.default_style,
            )
        return self.book.styles[self.book.default_style]

    def voice(self, style_id: int) -> Any:
        """The Voice of a style id (`style`: an unknown id speaks the default voice)."""
        return self.style(style_id).voice()

    def spoken_text(self, text: str, **fields: Any) -> str:
        """What the model reads for `text` with the server's options and `fields` (a request's)."""
        return self.synth.spoken_text(text, self.options(**fields))

    def options(self, speed: float = 1.0, **fields: Any) -> Any:
        """SynthesisOptions for a request: the server's seed, steps and readings plus `fields`
        (a request's own, e.g. its readings options: server/readings.py).

        The one place request fields meet the options pipeline. `speed` is the `speed`
        option; the APIs allow `options.API_SPEED`, and beyond the option's range the rest
        scales the length the same way through `duration_scale`."""
        kept = SPEED.clamp(speed)
        fields["duration_scale"] = fields.get("duration_scale", 1.0) * kept / speed
        base = SynthesisOptions(
            seed=self.settings.seed, steps=self.settings.steps, **dict(getattr(self.settings, "readings", ()))
        )
        return base.replace(speed=kept, **fields)

    def client_key(self, request: Request) -> str:
        """The fair queue's lane: the client's address and (hashed) credentials."""
        auth = request.headers.get("authorization") or ""
        host = request.client.host if request.client else "-"
        return f"{host}|{hashlib.sha256(auth.encode()).hexdigest()[:8]}"
