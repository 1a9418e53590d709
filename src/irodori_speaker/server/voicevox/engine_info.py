"""The engine's information: GET /version, /core_versions, /engine_manifest, /supported_devices."""

from __future__ import annotations

from fastapi import APIRouter

from ... import __version__
from ...audio.controls import pitch_available
from ...audio.signal import SAMPLE_RATE
from .. import schemas as S
from .common import PNG_1X1

ENGINE_UUID = "3b5f4c38-8d4c-4d3e-9a86-6a3a2c1e0f51"


def make_router() -> APIRouter:
    router = APIRouter()

    @router.get("/version", tags=["その他"], summary="Version")
    def version() -> str:
        """エンジンのバージョンを取得します。"""
        return __version__

    @router.get("/core_versions", tags=["その他"], summary="Core Versions")
    def core_versions() -> list[str]:
        return [__version__]

    @router.get("/engine_manifest", tags=["その他"], summary="Engine Manifest")
    def engine_manifest() -> S.EngineManifest:
        return S.EngineManifest(
            manifest_version="0.13.1",
            name="irodori-speaker",
            brand_name="Irodori",
            uuid=ENGINE_UUID,
            url="https://github.com/irodori-speaker/irodori-speaker",
            icon=PNG_1X1,
            default_sampling_rate=SAMPLE_RATE,
            frame_rate=25.0,
            terms_of_service="Use the voices only as their owners allow.",
            update_infos=[],
            dependency_licenses=[],
            supported_features=S.SupportedFeatures(
                streaming_synthesis=True,  # POST /streaming_synthesis (voicevox/streaming.py)
                adjust_mora_pitch=False,
                adjust_phoneme_length=True,
                adjust_speed_scale=True,
                adjust_pitch_scale=pitch_available(),
                adjust_intonation_scale=pitch_available(),
                adjust_volume_scale=True,
                adjust_pause_length=True,
                interrogative_upspeak=False,
                synthesis_morphing=False,
                sing=False,
                manage_library=False,
                return_resource_url=True,
                apply_katakana_english=False,
            ),
        )

    @router.get("/supported_devices", tags=["その他"], summary="Supported Devices")
    def supported_devices(core_version: str | None = None) -> S.SupportedDevicesInfo:
        # the model has imported torch by now; the app's modules do not (the Ray driver
        # imports them and loads no model)
        import torch

        return S.SupportedDevicesInfo(cpu=True, cuda=torch.cuda.is_available(), dml=False)

    return router
