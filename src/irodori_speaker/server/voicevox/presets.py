"""GET /presets: VOICEVOX clients read it; this server keeps none."""

from __future__ import annotations

from fastapi import APIRouter


def make_router() -> APIRouter:
    router = APIRouter()

    @router.get("/presets", tags=["その他"], summary="Presets")
    def presets() -> list[dict]:
        return []

    return router
