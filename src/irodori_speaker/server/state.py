"""What every route shares: settings, voices, the speech service, the user dictionary."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from ..text.userdict import UserDictionary
from .config import ServerSettings, VoiceBook
from .metrics import Metrics
from .service import SpeechService


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

    def spoken_text(self, text: str) -> str:
        return self.synth.spoken_text(text)

    def options(self, **fields: Any) -> Any:
        """SynthesisOptions for a request: the server's seed and steps plus `fields`.

        The one place request fields meet the options pipeline (speed -> duration_scale today)."""
        from ..synthesizer import SynthesisOptions

        base = SynthesisOptions(seed=self.settings.seed, steps=self.settings.steps)
        return dataclasses.replace(base, **fields)

    def client_key(self, request: Request) -> str:
        """The fair queue's lane: the client's address and (hashed) credentials."""
        auth = request.headers.get("authorization") or ""
        host = request.client.host if request.client else "-"
        return f"{host}|{hashlib.sha256(auth.encode()).hexdigest()[:8]}"
