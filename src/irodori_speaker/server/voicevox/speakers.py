"""The configured voices: GET /speakers, /speaker_info; their initialisation (the reference encoded once)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from ... import __version__
from .. import schemas as S
from ..config import VoiceBook
from ..service import SpeechService
from .common import PNG_1X1, StyleId


def make_router(book: VoiceBook, service: SpeechService) -> APIRouter:
    router = APIRouter()

    @router.get("/speakers", tags=["その他"], summary="Speakers")
    def speakers(core_version: str | None = None) -> list[S.Speaker]:
        return [
            S.Speaker(
                name=sp.name,
                speaker_uuid=sp.uuid,
                styles=[S.SpeakerStyle(name=st.name, id=st.id) for st in sp.styles],
                version=__version__,
            )
            for sp in book.speakers
        ]

    @router.get("/speaker_info", tags=["その他"], summary="Speaker Info")
    def speaker_info(
        speaker_uuid: str, resource_format: str = "base64", core_version: str | None = None
    ) -> S.SpeakerInfo:
        sp = book.speaker(speaker_uuid)
        return S.SpeakerInfo(
            policy=sp.policy,
            portrait=PNG_1X1,
            style_infos=[S.StyleInfo(id=st.id, icon=PNG_1X1, voice_samples=[]) for st in sp.styles],
        )

    @router.post("/initialize_speaker", status_code=204, tags=["その他"], summary="Initialize Speaker")
    async def initialize_speaker(
        style_id: StyleId, skip_reinit: bool = False, core_version: str | None = None
    ) -> Response:
        """指定されたスタイルを初期化します (the voice's reference is encoded once)."""
        voice = book.style(style_id).voice()
        if not (skip_reinit and style_id in service.initialized):
            await service.initialize(style_id, voice)
        return Response(status_code=204)

    @router.get("/is_initialized_speaker", tags=["その他"], summary="Is Initialized Speaker")
    def is_initialized_speaker(style_id: StyleId, core_version: str | None = None) -> bool:
        book.style(style_id).voice()  # an unknown style id is a 422
        return style_id in service.initialized

    return router
