"""What every route shares: settings, voices, the speech service, the user dictionary."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from ..options import SynthesisOptions, option_specs
from ..text.userdict import UserDictionary
from .config import VoiceBook
from .metrics import Metrics
from .service import SpeechService
from .settings import ServerSettings

SPEED = option_specs(SynthesisOptions)["speed"].check


@dataclass
class AppState:
    settings: ServerSettings
    book: VoiceBook
    service: SpeechService
    user_dict: UserDictionary
    metrics: Metrics

    @property
    def synth(self) -> Any:
        return self.service.synth

    def voice(self, style_id: int) -> Any:
        """The Voice of a configured style id (InputError -> 422 for an unknown one)."""
        return self.book.style(style_id).voice()

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
