"""The VOICEVOX engine's utilities: POST /validate_kana, POST /connect_waves."""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

import numpy as np
import soundfile as sf  # type: ignore[import-untyped,unused-ignore]
from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from ...errors import InputError
from ...text import prosody
from .. import schemas as S
from ..audio_out import wav_bytes
from ..state import AppState
from .common import WAV_RESPONSE

MAX_WAVES = 256


def make_router(state: AppState) -> APIRouter:
    router = APIRouter()

    @router.post(
        "/validate_kana",
        tags=["その他"],
        summary="テキストがAquesTalk 風記法に従っているか判定する",
        responses={400: {"model": S.ParseKanaError, "description": "テキストが不正です"}},
    )
    def validate_kana(text: str = Query(description="判定する対象の文字列")) -> Any:
        """従っていれば true、従っていなければ 400 ParseKanaBadRequest (as the engine)."""
        if len(text) > state.settings.max_text_chars:
            raise InputError(f"text is longer than {state.settings.max_text_chars} characters")
        try:
            prosody.parse_aquestalk(text)
        except prosody.KanaParseError as e:
            body = S.ParseKanaBadRequest(text=str(e), error_name=e.code, error_args={"text": e.text})
            return JSONResponse(status_code=400, content={"detail": body.model_dump()})
        return True

    @router.post(
        "/connect_waves",
        response_class=Response,
        responses=WAV_RESPONSE,
        tags=["その他"],
        summary="wav を結合する",
    )
    def connect_waves(waves: list[str]) -> Response:
        """base64 の WAV をつなげて一つの WAV にします (every wave at the first one's rate and
        channels; a different one is a 422, as the engine answers)."""
        if not waves:
            raise InputError("no waves given")
        if len(waves) > MAX_WAVES:
            raise InputError(f"at most {MAX_WAVES} waves, got {len(waves)}")
        parts: list[np.ndarray] = []
        rate = channels = 0
        for i, b64 in enumerate(waves):
            try:
                audio, r = sf.read(io.BytesIO(base64.b64decode(b64, validate=True)), always_2d=True)
            except (binascii.Error, ValueError, RuntimeError, sf.LibsndfileError) as e:
                raise InputError(f"wave {i} is not a base64 WAV: {e}") from None
            if i == 0:
                rate, channels = r, audio.shape[1]
            elif (r, audio.shape[1]) != (rate, channels):
                raise InputError(
                    f"wave {i} is {r} Hz x {audio.shape[1]} channels; the first is {rate} Hz x {channels}"
                )
            parts.append(audio.astype(np.float32))
        audio = np.concatenate(parts)
        return Response(wav_bytes(audio if channels > 1 else audio[:, 0], rate), media_type="audio/wav")

    return router
