"""The user dictionary, in VOICEVOX's shape: GET /user_dict, words added, rewritten, deleted, imported."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from ...text.userdict import UserDictionary
from .. import schemas as S


def _wt(word_type: S.WordTypes | None) -> str | None:
    return None if word_type is None else word_type.value


def make_router(user_dict: UserDictionary) -> APIRouter:
    """Every change is compiled into OpenJTalk's dictionary at once: the next query reads it."""
    router = APIRouter()

    @router.get("/user_dict", tags=["ユーザー辞書"], summary="Get User Dict Words")
    def get_user_dict_words() -> dict[str, S.UserDictWord]:
        """ユーザー辞書に登録されている単語の一覧を返します。"""
        return {k: S.UserDictWord(**v) for k, v in user_dict.export_voicevox().items()}

    @router.post("/user_dict_word", tags=["ユーザー辞書"], summary="Add User Dict Word")
    def add_user_dict_word(
        surface: str,
        pronunciation: str,
        accent_type: int,
        word_type: S.WordTypes | None = None,
        priority: Annotated[int | None, Query(ge=0, le=10)] = None,
    ) -> str:
        word = user_dict.add(surface, pronunciation, accent_type, _wt(word_type), priority)
        user_dict.openjtalk_dictionary()
        return word.uuid

    @router.put(
        "/user_dict_word/{word_uuid}",
        status_code=204,
        tags=["ユーザー辞書"],
        summary="Rewrite User Dict Word",
    )
    def rewrite_user_dict_word(
        word_uuid: str,
        surface: str,
        pronunciation: str,
        accent_type: int,
        word_type: S.WordTypes | None = None,
        priority: Annotated[int | None, Query(ge=0, le=10)] = None,
    ) -> Response:
        user_dict.get(word_uuid)  # a 404-like 422 when absent
        user_dict.update(word_uuid, surface, pronunciation, accent_type, _wt(word_type), priority)
        user_dict.openjtalk_dictionary()
        return Response(status_code=204)

    @router.delete(
        "/user_dict_word/{word_uuid}", status_code=204, tags=["ユーザー辞書"], summary="Delete User Dict Word"
    )
    def delete_user_dict_word(word_uuid: str) -> Response:
        user_dict.remove(word_uuid)
        user_dict.openjtalk_dictionary()
        return Response(status_code=204)

    @router.post(
        "/import_user_dict", status_code=204, tags=["ユーザー辞書"], summary="Import User Dict Words"
    )
    def import_user_dict_words(import_dict_data: dict[str, S.UserDictWord], override: bool) -> Response:
        """他のユーザー辞書をインポートします。"""
        user_dict.import_voicevox({k: v.model_dump() for k, v in import_dict_data.items()}, override=override)
        user_dict.openjtalk_dictionary()
        return Response(status_code=204)

    return router
