"""The VOICEVOX engine API on our model (docs/server.md has the compatibility table).

An AudioQuery is built from pyopenjtalk's accent phrases with estimated lengths. At
synthesis the model reads the query's `kana` (the original text, as AivisSpeech does)
when its moras are the ones that text gives, else the moras' own reading (a client that
edited readings is heard). Edited lengths scale the length the model is asked for by
(query's speech length / our estimate). The scales are the options pipeline's controls
(`plan_query`): speedScale -> speed, pitchScale -> pitch, intonationScale -> intonation,
volumeScale -> volume, pre/postPhonemeLength -> pre/post_silence; pauseLength /
pauseLengthScale become pause markup (`text/pauses.py`), so the line is split there into
pieces joined by exact silence.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import re
import zipfile
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response

from .. import __version__
from ..audio.controls import pitch_available
from ..errors import InputError
from ..text import prosody
from ..text.length import MORAE_PER_SECOND, PAUSE_S
from . import schemas as S
from .audio_out import SOURCE_RATE, PostProcess, wav_bytes
from .readings import reading_query
from .state import AppState

ENGINE_UUID = "3b5f4c38-8d4c-4d3e-9a86-6a3a2c1e0f51"
# A 1x1 transparent PNG: VOICEVOX clients expect an icon and portraits to decode.
PNG_1X1 = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d4944415478da63f8ffff3f0005fe02fea7d6a5d50000000049454e44ae426082"
    )
).decode()
_PAUSE_SPLIT = re.compile(r"(?<=[、。，．,.!?！？…])")

StyleId = Annotated[int, Query(alias="speaker", description="style id (GET /speakers)")]
Readings = Annotated[dict[str, Any], Depends(reading_query)]  # the request's readings options


@dataclasses.dataclass
class Plan:
    """What one AudioQuery asks for: the text (with pause markup where the query's pauses are
    exact), the SynthesisOptions (speed, pitch, volume, silences) and the output format."""

    text: str
    options: Any
    post: PostProcess


def _phrase_moras(phrases: list[Any]) -> list[tuple[tuple[str, ...], bool]]:
    return [(tuple(m.text for m in p.moras), p.pause_mora is not None) for p in phrases]


def plan_query(state: AppState, q: S.AudioQuery, readings: dict[str, Any] | None = None) -> Plan:
    """Map an AudioQuery onto the options pipeline (raises InputError on what we cannot honour).

    speedScale -> speed, pitchScale -> pitch (semitones, `controls.pitch_from_voicevox`),
    intonationScale -> intonation (the same scale of log f0 about its median),
    volumeScale -> volume (dB), pre/postPhonemeLength (divided by speedScale, as VOICEVOX
    does) -> pre/post_silence, pauseLength / pauseLengthScale -> pause markup between the pieces.
    `readings`: the request's readings options (server/readings.py)."""
    from ..audio.controls import pitch_from_voicevox, volume_from_scale
    from ..text.pauses import canonical

    speed = q.speedScale
    post = PostProcess(rate=q.outputSamplingRate, stereo=q.outputStereo)
    controls = {
        "pitch": pitch_from_voicevox(q.pitchScale),
        "intonation": q.intonationScale,  # the same scale: deviation of log f0 from its centre
        "volume": volume_from_scale(q.volumeScale),
        "pre_silence": q.prePhonemeLength / speed,
        "post_silence": q.postPhonemeLength / speed,
    }
    readings = dict(readings or {})
    strip_client_markup = not state.options(**readings).pause_markup
    controls.update(readings, pause_markup=True)  # the plan spells the query's own pauses as markup
    moras = [m for p in q.accent_phrases for m in p.moras]
    if not moras:  # nothing to say: only the silences
        return Plan(canonical(0.0), state.options(speed=speed, **controls), post)
    reading_groups: list[str] = []  # the query's reading, one entry per pause group
    silences: list[float] = []
    current = ""
    for p in q.accent_phrases:
        current += "".join(m.text for m in p.moras) + ("？" if p.is_interrogative else "")
        if p.pause_mora is not None:
            reading_groups.append(current + "、")
            length = q.pauseLength if q.pauseLength is not None else p.pause_mora.vowel_length
            silences.append(length * q.pauseLengthScale / speed)
            current = ""
    if current:
        reading_groups.append(current)
    silences += [0.0] * (len(reading_groups) - len(silences))

    text = q.kana.strip() if q.kana else ""
    if strip_client_markup:  # the client's markup goes; the query's own pauses stay
        from ..text.pauses import strip_markup

        text = strip_markup(text)
    if len(text) > state.settings.max_text_chars:
        raise InputError(f"kana is longer than {state.settings.max_text_chars} characters")
    from_text = bool(text) and _same_moras(state, text, q.accent_phrases, readings)
    default_pauses = q.pauseLength is None and q.pauseLengthScale == 1.0
    default_pauses = default_pauses and all(
        p.pause_mora is None or abs(p.pause_mora.vowel_length - PAUSE_S) < 1e-6 for p in q.accent_phrases
    )
    if default_pauses:  # one piece: the model places its own pauses
        line = text if from_text else "".join(reading_groups)
    else:
        groups = [g for g in _PAUSE_SPLIT.split(text) if g.strip()] if from_text else []
        if len(groups) != len(reading_groups):
            groups = reading_groups  # the text's punctuation does not line up with the pauses
        line = "".join(g + (canonical(s) if s > 0 else "") for g, s in zip(groups, silences))
    speech_s = sum(m.seconds for m in moras)
    ratio = speech_s / (len(moras) / MORAE_PER_SECOND)
    if ratio <= 0:
        raise InputError("the query's mora lengths add up to zero")
    return Plan(line, state.options(speed=speed, duration_scale=ratio, **controls), post)


def _same_moras(state: AppState, text: str, phrases: list[S.AccentPhrase], readings: dict[str, Any]) -> bool:
    try:
        reference = prosody.accent_phrases(state.spoken_text(text, **readings))
    except InputError:
        return False
    return _phrase_moras(reference) == _phrase_moras(phrases)


def _wt(word_type: S.WordTypes | None) -> str | None:
    return None if word_type is None else word_type.value


def build_router(state: AppState) -> APIRouter:
    router = APIRouter()
    book = state.book

    def check_text(text: str) -> str:
        if len(text) > state.settings.max_text_chars:
            raise InputError(
                f"text is longer than {state.settings.max_text_chars} characters",
                hint="split it, or start the server with a larger --max-text-chars",
            )
        return text

    def phrases_of(text: str, readings: dict[str, Any]) -> list[S.AccentPhrase]:
        spoken = state.spoken_text(check_text(text), **readings) if text.strip() else ""
        return [S.AccentPhrase.of(p) for p in prosody.accent_phrases(spoken)]

    async def synthesize_query(
        q: S.AudioQuery, style_id: int, request: Request, route: str, readings: dict[str, Any]
    ):
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
        state.metrics.audio_seconds.inc(len(audio) / SOURCE_RATE)
        return plan.post.apply(audio), plan.post.rate

    # ---- information --------------------------------------------------------------------------
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
            default_sampling_rate=SOURCE_RATE,
            frame_rate=25.0,
            terms_of_service="Use the voices only as their owners allow.",
            update_infos=[],
            dependency_licenses=[],
            supported_features=S.SupportedFeatures(
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
                return_resource_url=False,
                apply_katakana_english=False,
            ),
        )

    @router.get("/supported_devices", tags=["その他"], summary="Supported Devices")
    def supported_devices(core_version: str | None = None) -> S.SupportedDevicesInfo:
        import torch

        return S.SupportedDevicesInfo(cpu=True, cuda=torch.cuda.is_available(), dml=False)

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

    @router.get("/presets", tags=["その他"], summary="Presets")
    def presets() -> list[dict]:
        return []

    @router.post("/initialize_speaker", status_code=204, tags=["その他"], summary="Initialize Speaker")
    async def initialize_speaker(
        style_id: StyleId, skip_reinit: bool = False, core_version: str | None = None
    ) -> Response:
        """指定されたスタイルを初期化します (the voice's reference is encoded once)."""
        voice = state.voice(style_id)
        if not (skip_reinit and style_id in state.service.initialized):
            await state.service.initialize(style_id, voice)
        return Response(status_code=204)

    @router.get("/is_initialized_speaker", tags=["その他"], summary="Is Initialized Speaker")
    def is_initialized_speaker(style_id: StyleId, core_version: str | None = None) -> bool:
        state.voice(style_id)
        return style_id in state.service.initialized

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
        state.voice(style_id)
        return S.AudioQuery(
            accent_phrases=phrases_of(text, readings),
            speedScale=1.0,
            pitchScale=0.0,
            intonationScale=1.0,
            volumeScale=1.0,
            prePhonemeLength=0.1,
            postPhonemeLength=0.1,
            pauseLength=None,
            pauseLengthScale=1.0,
            outputSamplingRate=SOURCE_RATE,
            outputStereo=False,
            kana=text,
        )

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
        state.voice(style_id)
        if not is_kana:
            return phrases_of(text, readings)
        try:
            return [S.AccentPhrase.of(p) for p in prosody.parse_aquestalk(check_text(text))]
        except prosody.KanaParseError as e:
            body = S.ParseKanaBadRequest(text=str(e), error_name=e.code, error_args={"text": e.text})
            return JSONResponse(status_code=400, content={"detail": body.model_dump()})

    def re_estimate(phrases: list[S.AccentPhrase], lengths: bool, pitches: bool) -> list[S.AccentPhrase]:
        out = []
        for p in phrases:
            highs = prosody.accent_pitches(len(p.moras), p.accent)
            moras = []
            for m, high in zip(p.moras, highs):
                fresh = prosody.make_mora(m.text, m.consonant or "", m.vowel, high)
                moras.append(
                    m.model_copy(
                        update={
                            **(
                                {
                                    "consonant_length": fresh.consonant_length,
                                    "vowel_length": fresh.vowel_length,
                                }
                                if lengths
                                else {}
                            ),
                            **({"pitch": fresh.pitch} if pitches else {}),
                        }
                    )
                )
            pause = p.pause_mora
            if pause is not None and lengths:
                pause = pause.model_copy(update={"vowel_length": PAUSE_S})
            out.append(p.model_copy(update={"moras": moras, "pause_mora": pause}))
        return out

    @router.post("/mora_data", tags=["クエリ編集"], summary="アクセント句から音素の長さと音高を得る")
    def mora_data(
        accent_phrases: list[S.AccentPhrase], style_id: StyleId, core_version: str | None = None
    ) -> list[S.AccentPhrase]:
        state.voice(style_id)
        return re_estimate(accent_phrases, lengths=True, pitches=True)

    @router.post("/mora_length", tags=["クエリ編集"], summary="アクセント句から音素の長さを得る")
    def mora_length(
        accent_phrases: list[S.AccentPhrase], style_id: StyleId, core_version: str | None = None
    ) -> list[S.AccentPhrase]:
        state.voice(style_id)
        return re_estimate(accent_phrases, lengths=True, pitches=False)

    @router.post("/mora_pitch", tags=["クエリ編集"], summary="アクセント句から音高を得る")
    def mora_pitch(
        accent_phrases: list[S.AccentPhrase], style_id: StyleId, core_version: str | None = None
    ) -> list[S.AccentPhrase]:
        state.voice(style_id)
        return re_estimate(accent_phrases, lengths=False, pitches=True)

    # ---- synthesis ----------------------------------------------------------------------------
    wav_response: dict[int | str, dict[str, Any]] = {
        200: {"content": {"audio/wav": {"schema": {"type": "string", "format": "binary"}}}}
    }

    @router.post(
        "/synthesis",
        response_class=Response,
        responses=wav_response,
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
        audio, rate = await synthesize_query(query, style_id, request, "synthesis", readings)
        return Response(wav_bytes(audio, rate), media_type="audio/wav")

    @router.post(
        "/cancellable_synthesis",
        response_class=Response,
        responses=wav_response,
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
        audio, rate = await synthesize_query(query, style_id, request, "cancellable_synthesis", readings)
        return Response(wav_bytes(audio, rate), media_type="audio/wav")

    @router.post(
        "/multi_synthesis",
        response_class=Response,
        responses={200: {"content": {"application/zip": {"schema": {"type": "string", "format": "binary"}}}}},
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
        for q in queries:
            plan_query(state, q, readings)  # every error before any synthesis
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            for i, q in enumerate(queries):
                audio, _ = await synthesize_query(q, style_id, request, "multi_synthesis", readings)
                zf.writestr(f"{i + 1:03d}.wav", wav_bytes(audio, rate))
        return Response(buf.getvalue(), media_type="application/zip")

    # ---- the user dictionary ------------------------------------------------------------------
    @router.get("/user_dict", tags=["ユーザー辞書"], summary="Get User Dict Words")
    def get_user_dict_words() -> dict[str, S.UserDictWord]:
        """ユーザー辞書に登録されている単語の一覧を返します。"""
        return {k: S.UserDictWord(**v) for k, v in state.user_dict.export_voicevox().items()}

    @router.post("/user_dict_word", tags=["ユーザー辞書"], summary="Add User Dict Word")
    def add_user_dict_word(
        surface: str,
        pronunciation: str,
        accent_type: int,
        word_type: S.WordTypes | None = None,
        priority: Annotated[int | None, Query(ge=0, le=10)] = None,
    ) -> str:
        word = state.user_dict.add(surface, pronunciation, accent_type, _wt(word_type), priority)
        state.user_dict.openjtalk_dictionary()
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
        state.user_dict.get(word_uuid)  # a 404-like 422 when absent
        state.user_dict.update(word_uuid, surface, pronunciation, accent_type, _wt(word_type), priority)
        state.user_dict.openjtalk_dictionary()
        return Response(status_code=204)

    @router.delete(
        "/user_dict_word/{word_uuid}", status_code=204, tags=["ユーザー辞書"], summary="Delete User Dict Word"
    )
    def delete_user_dict_word(word_uuid: str) -> Response:
        state.user_dict.remove(word_uuid)
        state.user_dict.openjtalk_dictionary()
        return Response(status_code=204)

    @router.post(
        "/import_user_dict", status_code=204, tags=["ユーザー辞書"], summary="Import User Dict Words"
    )
    def import_user_dict_words(import_dict_data: dict[str, S.UserDictWord], override: bool) -> Response:
        """他のユーザー辞書をインポートします。"""
        state.user_dict.import_voicevox(
            {k: v.model_dump() for k, v in import_dict_data.items()}, override=override
        )
        state.user_dict.openjtalk_dictionary()
        return Response(status_code=204)

    return router
