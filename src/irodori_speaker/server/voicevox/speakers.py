"""The configured voices: GET /speakers, /speaker_info, /singers, /singer_info, the resources their
images point at, and the voices' initialisation (the reference encoded once)."""

from __future__ import annotations

import base64
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ... import __version__
from .. import schemas as S
from ..config import NotFound
from ..state import AppState
from .common import PNG_1X1, StyleId, binary_response

PLACEHOLDER = "placeholder.png"  # the one image (a 1x1 PNG) every icon and portrait is


def make_router(state: AppState) -> APIRouter:
    router = APIRouter()
    book, service = state.book, state.service

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
        speaker_uuid: str,
        request: Request,
        resource_format: Literal["base64", "url"] = "base64",
        core_version: str | None = None,
    ) -> S.SpeakerInfo:
        """画像は base64 か、resource_format=url なら /_resources/ の URL。未知の uuid は 404。"""
        sp = book.speaker(speaker_uuid)
        image = PNG_1X1 if resource_format == "base64" else f"{request.base_url}_resources/{PLACEHOLDER}"
        return S.SpeakerInfo(
            policy=sp.policy,
            portrait=image,
            style_infos=[S.StyleInfo(id=st.id, icon=image, voice_samples=[]) for st in sp.styles],
        )

    @router.get("/singers", tags=["その他"], summary="Singers")
    def singers(core_version: str | None = None) -> list[S.Speaker]:
        """歌手はいません (this model only talks): an empty list."""
        return []

    @router.get("/singer_info", tags=["その他"], summary="Singer Info")
    def singer_info(speaker_uuid: str, core_version: str | None = None) -> S.SpeakerInfo:
        raise NotFound(f"no singer with uuid {speaker_uuid}", hint="this server has no singers")

    @router.get(
        "/_resources/{resource_hash}",
        tags=["その他"],
        summary="Resource",
        response_class=Response,
        responses=binary_response("image/png"),
    )
    def resource(resource_hash: str) -> Response:
        """/speaker_info?resource_format=url の画像。"""
        if resource_hash != PLACEHOLDER:
            raise NotFound(f"no resource {resource_hash}")
        return Response(base64.b64decode(PNG_1X1), media_type="image/png")

    @router.post("/initialize_speaker", status_code=204, tags=["その他"], summary="Initialize Speaker")
    async def initialize_speaker(
        style_id: StyleId, skip_reinit: bool = False, core_version: str | None = None
    ) -> Response:
        """指定されたスタイルを初期化します (the voice's reference is encoded once)."""
        voice = state.voice(style_id)
        if not (skip_reinit and style_id in service.initialized):
            await service.initialize(style_id, voice)
        return Response(status_code=204)

    @router.get("/is_initialized_speaker", tags=["その他"], summary="Is Initialized Speaker")
    def is_initialized_speaker(style_id: StyleId, core_version: str | None = None) -> bool:
        state.style(style_id)  # with --strict-speakers an unknown style id is a 422
        return style_id in service.initialized

    return router
