"""Queries and synthesis: POST /audio_query, /audio_query_from_preset, /accent_phrases, /mora_*,
/synthesis, /cancellable_synthesis, /multi_synthesis (the VOICEVOX engine's tts pipeline;
/streaming_synthesis: streaming.py).

An accent phrase longer than `MAX_PHRASE_MORAS` (pyopenjtalk makes one of 600 moras from
"草" * 300) is split into phrases of at most that many, so every query we make is one we take."""

from __future__ import annotations

import io
import zipfile
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ...audio.signal import SAMPLE_RATE
from ...errors import InputError
from ...text import prosody
from .. import schemas as S
from ..audio_out import wav_bytes
from ..config import NotFound
from ..state import AppState
from .common import WAV_RESPONSE, Readings, StyleId, binary_response
from .query import Plan, plan_query, re_estimate, warning_headers

_ZIP = binary_response("application/zip")


def make_router(state: AppState) -> APIRouter:
    """The routes read the server's options, voices and limits and render on its service: the
    whole AppState."""
    router = APIRouter()

    def check_text(text: str) -> str:
        if len(text) > state.settings.max_text_chars:
            raise InputError(
                f"text is longer than {state.settings.max_text_chars} characters",
                hint="split it, or start the server with a larger --max-text-chars",
            )
        return text

    def phrases_of(text: str, readings: dict[str, Any]) -> list[S.AccentPhrase]:
        spoken = state.spoken_text(check_text(text), **readings) if text.strip() else ""
        return [S.AccentPhrase.of(p) for p in split_long(prosody.accent_phrases(spoken))]

    def query_of(text: str, readings: dict[str, Any], **scales: Any) -> S.AudioQuery:
        fields: dict[str, Any] = {
            "speedScale": 1.0,
            "pitchScale": 0.0,
            "intonationScale": 1.0,
            "volumeScale": 1.0,
            "prePhonemeLength": 0.1,
            "postPhonemeLength": 0.1,
            "pauseLength": None,
            "pauseLengthScale": 1.0,
            **scales,
        }
        return S.AudioQuery(
            accent_phrases=phrases_of(text, readings),
            outputSamplingRate=SAMPLE_RATE,
            outputStereo=False,
            kana=text,
            **fields,
        )

    async def synthesize_query(
        q: S.AudioQuery, style_id: int, request: Request, route: str, readings: dict[str, Any]
    ) -> tuple[np.ndarray, int, Plan]:
        voice = state.voice(style_id)
        plan = plan_query(state, q, readings)
        audio = await state.service.render(
            plan.text,
            voice,
            plan.options,
            client=state.client_key(request),
            route=route,
            is_disconnected=request.is_disconnected,
        )
        state.metrics.audio_seconds.inc(len(audio) / SAMPLE_RATE)
        return plan.post.apply(audio), plan.post.rate, plan

    # ---- queries ------------------------------------------------------------------------------
    @router.post("/audio_query", tags=["クエリ作成"], summary="音声合成用のクエリを作成する")
    def audio_query(
        text: str,
        style_id: StyleId,
        readings: Readings,
        enable_katakana_english: bool = True,
        core_version: str | None = None,
    ) -> S.AudioQuery:
        """音声合成用のクエリの初期値を得ます。`kana` には読み上げるテキストが入ります。"""
        state.style(style_id)
        return query_of(text, readings)

    @router.post(
        "/audio_query_from_preset",
        tags=["クエリ作成"],
        summary="音声合成用のクエリをプリセットを用いて作成する",
    )
    def audio_query_from_preset(
        text: str,
        preset_id: int,
        readings: Readings,
        enable_katakana_english: bool = True,
        core_version: str | None = None,
    ) -> S.AudioQuery:
        """プリセットの値を持つクエリ (an unknown preset id is a 422, as VOICEVOX answers)."""
        try:
            preset = state.presets.get(preset_id)
        except NotFound as e:
            raise InputError(str(e)) from None
        state.style(preset.style_id)
        scales = preset.model_dump(exclude={"id", "name", "speaker_uuid", "style_id"})
        return query_of(text, readings, **scales)

    @router.post(
        "/accent_phrases",
        tags=["クエリ編集"],
        summary="テキストからアクセント句を得る",
        responses={400: {"model": S.ParseKanaError, "description": "読み仮名のパースに失敗"}},
    )
    def accent_phrases(
        text: str,
        style_id: StyleId,
        readings: Readings,
        is_kana: bool = False,
        enable_katakana_english: bool = True,
        core_version: str | None = None,
    ) -> Any:
        state.style(style_id)
        if not is_kana:
            return phrases_of(text, readings)
        try:
            return [S.AccentPhrase.of(p) for p in split_long(prosody.parse_aquestalk(check_text(text)))]
        except prosody.KanaParseError as e:
            body = S.ParseKanaBadRequest(text=str(e), error_name=e.code, error_args={"text": e.text})
            return JSONResponse(status_code=400, content={"detail": body.model_dump()})

    @router.post("/mora_data", tags=["クエリ編集"], summary="アクセント句から音素の長さと音高を得る")
    def mora_data(
        accent_phrases: list[S.AccentPhrase], style_id: StyleId, core_version: str | None = None
    ) -> list[S.AccentPhrase]:
        state.style(style_id)
        return re_estimate(accent_phrases, lengths=True, pitches=True)

    @router.post("/mora_length", tags=["クエリ編集"], summary="アクセント句から音素の長さを得る")
    def mora_length(
        accent_phrases: list[S.AccentPhrase], style_id: StyleId, core_version: str | None = None
    ) -> list[S.AccentPhrase]:
        state.style(style_id)
        return re_estimate(accent_phrases, lengths=True, pitches=False)

    @router.post("/mora_pitch", tags=["クエリ編集"], summary="アクセント句から音高を得る")
    def mora_pitch(
        accent_phrases: list[S.AccentPhrase], style_id: StyleId, core_version: str | None = None
    ) -> list[S.AccentPhrase]:
        state.style(style_id)
        return re_estimate(accent_phrases, lengths=False, pitches=True)

    # ---- synthesis ----------------------------------------------------------------------------
    @router.post(
        "/synthesis",
        response_class=Response,
        responses=WAV_RESPONSE,
        tags=["音声合成"],
        summary="音声合成する",
    )
    async def synthesis(
        query: S.AudioQuery,
        style_id: StyleId,
        request: Request,
        readings: Readings,
        enable_interrogative_upspeak: bool = True,
        core_version: str | None = None,
    ) -> Response:
        audio, rate, plan = await synthesize_query(query, style_id, request, "synthesis", readings)
        return Response(wav_bytes(audio, rate), media_type="audio/wav", headers=plan.headers())

    @router.post(
        "/cancellable_synthesis",
        response_class=Response,
        responses=WAV_RESPONSE,
        tags=["音声合成"],
        summary="音声合成する（キャンセル可能）",
    )
    async def cancellable_synthesis(
        query: S.AudioQuery,
        style_id: StyleId,
        request: Request,
        readings: Readings,
        enable_interrogative_upspeak: bool = True,
        core_version: str | None = None,
    ) -> Response:
        """Every synthesis here is cancellable: a client that disconnects stops its line."""
        audio, rate, plan = await synthesize_query(
            query, style_id, request, "cancellable_synthesis", readings
        )
        return Response(wav_bytes(audio, rate), media_type="audio/wav", headers=plan.headers())

    @router.post(
        "/multi_synthesis",
        response_class=Response,
        responses=_ZIP,
        tags=["音声合成"],
        summary="複数まとめて音声合成する",
    )
    async def multi_synthesis(
        queries: list[S.AudioQuery],
        style_id: StyleId,
        request: Request,
        readings: Readings,
        enable_interrogative_upspeak: bool = True,
        core_version: str | None = None,
    ) -> Response:
        if not queries:
            raise InputError("no queries given")
        if len(queries) > state.settings.max_batch:
            raise InputError(f"at most {state.settings.max_batch} queries per request, got {len(queries)}")
        rate = queries[0].outputSamplingRate
        if any(q.outputSamplingRate != rate for q in queries):
            raise InputError("every query must have the same outputSamplingRate")
        warnings = [w for q in queries for w in plan_query(state, q, readings).warnings]  # errors first
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            for i, q in enumerate(queries):
                audio, _, _ = await synthesize_query(q, style_id, request, "multi_synthesis", readings)
                zf.writestr(f"{i + 1:03d}.wav", wav_bytes(audio, rate))
        return Response(buf.getvalue(), media_type="application/zip", headers=warning_headers(warnings))

    return router


def split_long(phrases: list[prosody.AccentPhrase]) -> list[prosody.AccentPhrase]:
    """Phrases of at most `MAX_PHRASE_MORAS` moras: a longer one becomes several, the accent
    kept in the piece that holds it (the others take their last mora; the model reads no
    accent), the pause and the question mark on the last piece."""
    out: list[prosody.AccentPhrase] = []
    n = S.MAX_PHRASE_MORAS
    for p in phrases:
        if len(p.moras) <= n:
            out.append(p)
            continue
        starts = range(0, len(p.moras), n)
        for k, start in enumerate(starts):
            moras = p.moras[start : start + n]
            last = k == len(starts) - 1
            accent = p.accent - start if start < p.accent <= start + len(moras) else len(moras)
            out.append(
                prosody.AccentPhrase(
                    moras,
                    accent,
                    p.pause_mora if last else None,
                    p.is_interrogative if last else False,
                    list(p.words) if k == 0 else [],
                )
            )
    return out
