"""The studio's API (`/studio/api/...`), what the `/studio` page calls: try a line with a voice
and the controls (a WAV back), a reading preview with and without the user dictionary, the
phrase cache (list, play, prebuild, remove) and the running Speaker (its queue and last lines,
a line said on stream, skip, interrupt). The dictionary itself is edited through the VOICEVOX
routes (`/user_dict`, `/user_dict_word`), which the page calls too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import APIRouter, HTTPException
from fastapi.responses import Response
from pydantic import BaseModel, Field

from ..audio.signal import SAMPLE_RATE
from ..cache import PhraseCache
from ..cache.prebuild import Phrase, prebuild
from ..errors import InputError
from ..options import SynthesisOptions, option_specs
from ..speaker.feed import EventFeed
from ..synthesis.plan import spoken_parts
from .audio_out import wav_bytes

__all__ = ["CONTROLS", "Studio", "make_router"]

#: The controls the studio shows, with their ranges from the options' own specs.
CONTROLS = ("speed", "pitch", "intonation", "volume", "pre_silence", "post_silence")
_STEPS = {"speed": 0.05, "pitch": 0.5, "intonation": 0.05, "volume": 1.0, "pre_silence": 0.05,
          "post_silence": 0.05}  # fmt: skip
_MAX_PREBUILD = 200  # lines per prebuild request: the page's form, not a batch job


@dataclass
class Studio:
    """What the studio works on. `render(text, voice, options)` gives the whole line (48 kHz);
    `options(**fields)` the options of a line with the controls in `fields`; `speaker()` the
    running Speaker or None."""

    synth: Any
    voices: list[tuple[str, str, Callable[[], Any]]]  # (id, label, its Voice when asked)
    render: Callable[[str, Any, SynthesisOptions], Awaitable[np.ndarray]]
    options: Callable[..., SynthesisOptions]
    user_dict: Any
    cache: PhraseCache | None
    feed: EventFeed
    speaker: Callable[[], Any]
    max_text_chars: int = 1000

    def voice(self, voice_id: str | None) -> Any:
        if voice_id is None or voice_id == "":
            return self.voices[0][2]() if self.voices else None
        for vid, _, voice in self.voices:
            if vid == voice_id:
                return voice()
        raise InputError(f"no voice {voice_id!r}", hint=f"one of {[v[0] for v in self.voices]}")

    def text(self, text: str) -> str:
        if len(text) > self.max_text_chars:
            raise InputError(f"text is longer than {self.max_text_chars} characters", hint="split it")
        return text


class Controls(BaseModel):
    # above 0, as VOICEVOX's speedScale: AppState.options divides by it (0 was a 500)
    speed: float = Field(1.0, gt=0)
    pitch: float = 0.0
    intonation: float = 1.0
    volume: float = 0.0
    pre_silence: float = 0.0
    post_silence: float = 0.0

    def fields(self) -> dict[str, Any]:
        """The controls alone (a body's other fields are not options)."""
        return {name: getattr(self, name) for name in CONTROLS}


class SpeakBody(Controls):
    text: str = Field(min_length=1)
    voice: str | None = None


class ReadingBody(BaseModel):
    text: str = Field(min_length=1)


class PrebuildBody(Controls):
    lines: list[str] = Field(min_length=1, max_length=_MAX_PREBUILD)
    voice: str | None = None


class SayBody(Controls):
    text: str = Field(min_length=1)
    voice: str | None = None
    lane: str = "normal"
    interrupt: bool = False


def _wav(audio: np.ndarray, rate: int = SAMPLE_RATE) -> Response:
    return Response(
        wav_bytes(np.asarray(audio, dtype=np.float32), rate),
        media_type="audio/wav",
        headers={"X-Audio-Samples": str(len(audio)), "X-Sample-Rate": str(rate), "Cache-Control": "no-store"},
    )


def make_router(studio: Studio) -> APIRouter:
    router = APIRouter(prefix="/studio/api", tags=["Studio"])

    @router.get("/info", summary="What the studio can do here")
    def info() -> dict[str, Any]:
        specs = option_specs(SynthesisOptions)
        controls = [
            {"name": n, "min": specs[n].check.lo, "max": specs[n].check.hi, "default": specs[n].default,
             "step": _STEPS[n], "unit": specs[n].check.unit, "doc": specs[n].doc}
            for n in CONTROLS
        ]  # fmt: skip
        return {
            "voices": [{"id": vid, "label": label} for vid, label, _ in studio.voices],
            "controls": controls,
            "dictionary": studio.user_dict is not None,
            "cache": studio.cache is not None,
            "speaker": studio.speaker() is not None,
            "sample_rate": SAMPLE_RATE,
        }

    @router.post("/speak", summary="Render a line to try it (WAV)", response_class=Response)
    async def speak(body: SpeakBody) -> Response:
        options = studio.options(**body.fields())
        audio = await studio.render(studio.text(body.text), studio.voice(body.voice), options)
        return _wav(audio)

    @router.post("/reading", summary="How a text is read, with and without the user dictionary")
    def reading(body: ReadingBody) -> dict[str, Any]:
        text, options = studio.text(body.text), studio.options()

        def spoken(user_dict: Any) -> str:
            return "".join(p for p in spoken_parts(text, options, user_dict) if isinstance(p, str))

        return {
            "text": text,
            "spoken": spoken(studio.user_dict),
            "spoken_without_dictionary": spoken(None),
        }

    # -- the phrase cache ------------------------------------------------------------------------

    def cache() -> PhraseCache:
        if studio.cache is None:
            raise HTTPException(404, "no phrase cache here (serve without --no-cache, Speaker(cache=...))")
        return studio.cache

    @router.get("/cache", summary="Phrase-cache entries, most recently used first")
    async def cache_list(limit: int = 200) -> dict[str, Any]:
        c = cache()
        entries = await asyncio.to_thread(c.entries, max(1, min(limit, 1000)))
        stats = await asyncio.to_thread(c.stats)
        return {
            "entries": [e.__dict__ for e in entries],
            "stats": {"entries": stats.entries, "bytes": stats.bytes, "audio_seconds": stats.audio_seconds},
        }

    @router.get("/cache/{key}/audio", summary="A cached line's audio (WAV)", response_class=Response)
    async def cache_audio(key: str) -> Response:
        line = await asyncio.to_thread(cache().get, key) if _is_key(key) else None
        if line is None:
            raise HTTPException(404, f"no cached line {key[:20]!r}")
        return _wav(line.audio, line.sample_rate)

    @router.delete("/cache/{key}", status_code=204, summary="Remove a cached line", response_class=Response)
    async def cache_remove(key: str) -> Response:
        removed = await asyncio.to_thread(cache().remove, key) if _is_key(key) else False
        if not removed:
            raise HTTPException(404, f"no cached line {key[:20]!r}")
        return Response(status_code=204)

    @router.post("/cache/prebuild", summary="Render lines into the phrase cache")
    async def cache_prebuild(body: PrebuildBody) -> dict[str, Any]:
        c = cache()
        lines = [studio.text(t) for t in body.lines if t.strip()]
        if not lines:
            raise InputError("no line to prebuild", hint="one phrase per line")
        voice, options = studio.voice(body.voice), studio.options(**body.fields())
        report = await asyncio.to_thread(
            prebuild, studio.synth, c, [Phrase(t) for t in lines], voice=voice, options=options
        )
        return {
            "summary": report.summary(),
            "results": [{"text": r.phrase.text, "status": r.status, "key": r.key, "error": r.error}
                        for r in report.results],
        }  # fmt: skip

    # -- the running Speaker ---------------------------------------------------------------------

    def speaker() -> Any:
        s = studio.speaker()
        if s is None:
            raise HTTPException(404, "no Speaker runs here (serve --play OUTPUT plays lines itself)")
        return s

    @router.get("/speaker", summary="The Speaker's queue, the line heard now and the last lines")
    async def speaker_state() -> dict[str, Any]:
        return studio.feed.snapshot()

    @router.post("/speaker/say", summary="Queue a line on the running Speaker")
    async def speaker_say(body: SayBody) -> dict[str, Any]:
        s = speaker()
        options = studio.options(**body.fields())
        utt = s.enqueue(
            studio.text(body.text), voice=studio.voice(body.voice), priority=body.lane,
            interrupt=body.interrupt, options=options,
        )  # fmt: skip
        return {"id": utt.id, "state": utt.state.value}

    @router.post("/speaker/skip", summary="Fade out the line being heard")
    async def speaker_skip() -> dict[str, Any]:
        utt = speaker().skip()
        return {"skipped": None if utt is None else utt.id}

    @router.post("/speaker/interrupt", summary="Stop talking and drop the queue")
    async def speaker_interrupt() -> dict[str, Any]:
        speaker().interrupt()
        return {"interrupted": True}

    return router


def _is_key(key: str) -> bool:
    return 16 <= len(key) <= 128 and all(c in "0123456789abcdef" for c in key)
