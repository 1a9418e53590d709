"""Presets, as the VOICEVOX engine keeps them: GET /presets, POST /add_preset, /update_preset,
/delete_preset (POST /audio_query_from_preset reads them: tts.py).

Kept in memory, and in a JSON file when the server has one (`ServerSettings.presets`, `serve
--presets FILE`): a preset added survives a restart there. Errors as the engine's: an unknown
id is a 422.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import Response

from ...errors import InputError
from .. import schemas as S
from ..config import NotFound
from ..state import AppState

MAX_PRESETS = 1000


class PresetStore:
    """The presets by id; written through to `path` (atomically) when one is given."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._presets: dict[int, S.Preset] = {}
        if self.path is not None and self.path.exists():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
                self._presets = {p["id"]: S.Preset(**p) for p in data}
            except (OSError, ValueError, TypeError, KeyError) as e:
                raise InputError(f"cannot read the presets file {self.path}: {e}") from None

    def all(self) -> list[S.Preset]:
        with self._lock:
            return list(self._presets.values())

    def get(self, preset_id: int) -> S.Preset:
        with self._lock:
            if preset_id not in self._presets:
                raise NotFound(f"no preset with id {preset_id}", hint="GET /presets lists them")
            return self._presets[preset_id]

    def add(self, preset: S.Preset) -> int:
        """Store `preset`; an id already taken gets the next free one (as VOICEVOX does)."""
        with self._lock:
            if len(self._presets) >= MAX_PRESETS:
                raise InputError(f"at most {MAX_PRESETS} presets", hint="delete some with /delete_preset")
            pid = preset.id if preset.id not in self._presets else max(self._presets) + 1
            self._presets[pid] = preset.model_copy(update={"id": pid})
            self._save()
            return pid

    def update(self, preset: S.Preset) -> int:
        with self._lock:
            if preset.id not in self._presets:
                raise InputError(f"no preset with id {preset.id} to update")
            self._presets[preset.id] = preset
            self._save()
            return preset.id

    def delete(self, preset_id: int) -> None:
        with self._lock:
            if self._presets.pop(preset_id, None) is None:
                raise InputError(f"no preset with id {preset_id} to delete")
            self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        data = [p.model_dump() for p in self._presets.values()]
        tmp.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
        os.replace(tmp, self.path)


def make_router(state: AppState) -> APIRouter:
    router = APIRouter()
    store = state.presets = PresetStore(state.settings.presets)

    def checked(preset: S.Preset) -> S.Preset:
        state.book.speaker(preset.speaker_uuid)  # an unknown speaker: 404, as /speaker_info
        state.style(preset.style_id)
        return preset

    @router.get("/presets", tags=["その他"], summary="Get Presets")
    def presets() -> list[S.Preset]:
        """エンジンが保持しているプリセットの設定を返します。"""
        return store.all()

    @router.post("/add_preset", tags=["その他"], summary="Add Preset")
    def add_preset(preset: S.Preset) -> int:
        """新しいプリセットを追加します (an id already taken gets the next free one)."""
        return store.add(checked(preset))

    @router.post("/update_preset", tags=["その他"], summary="Update Preset")
    def update_preset(preset: S.Preset) -> int:
        """既存のプリセットを更新します。"""
        return store.update(checked(preset))

    @router.post("/delete_preset", status_code=204, tags=["その他"], summary="Delete Preset")
    def delete_preset(id: int) -> Response:
        """既存のプリセットを削除します。"""
        store.delete(id)
        return Response(status_code=204)

    return router
